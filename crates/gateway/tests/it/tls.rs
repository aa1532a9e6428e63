//! TLS: the public listener with real clients (reqwest over HTTP/1.1 and h2, the handshake's
//! ALPN, curl, the official `openai` client), and `https://` replicas behind a TLS front.

use crate::support::{Stack, chat, engine, read_stream, tiny};
use axum::http::Version;
use testkit::tls::Cert;

const LISTENER: &str = r#"
listen: 127.0.0.1:0
server:
  tls: { cert: "{CERT}", key: "{KEY}" }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
"#;

/// A client trusting only `cert`; HTTP/1.1 only, or h2 when the server offers it.
fn client(cert: &Cert, http1_only: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert_pem.as_bytes()).unwrap())
        .timeout(std::time::Duration::from_secs(30));
    if http1_only {
        b = b.http1_only();
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_serves_http1_and_h2_over_tls_as_alpn_settles() {
    let dir = tempfile::tempdir().unwrap();
    let cert = Cert::new();
    let (crt, key) = cert.write(dir.path(), "gateway");
    let yaml = LISTENER
        .replace("{CERT}", crt.to_str().unwrap())
        .replace("{KEY}", key.to_str().unwrap());
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    assert!(stack.url.starts_with("https://"), "{}", stack.url);
    for (http1_only, version) in [(true, Version::HTTP_11), (false, Version::HTTP_2)] {
        let http = client(&cert, http1_only);
        let r = http
            .post(format!("{}/v1/chat/completions", stack.url))
            .json(&chat("chat", 8, true))
            .send()
            .await
            .unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, version));
        let (body, _, clean) = read_stream(r).await;
        assert!(clean && body.contains("data: [DONE]"), "{body}");
        let r = http
            .post(format!("{}/v1/completions", stack.url))
            .json(&serde_json::json!({"model": "chat", "prompt": "once", "max_tokens": 3}))
            .send()
            .await
            .unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, version));
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
        let r = http.get(format!("{}/v1/models", stack.url)).send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, version));
    }
    // ALPN as the handshake settles it: h2 when offered, HTTP/1.1 otherwise.
    let addr: std::net::SocketAddr = stack.url.trim_start_matches("https://").parse().unwrap();
    // What the client offers, and what the server picks.
    type Alpn<'a> = (&'a [&'a [u8]], Option<&'a [u8]>);
    let cases: [Alpn; 3] = [
        (&[b"h2", b"http/1.1"], Some(b"h2")),
        (&[b"http/1.1"], Some(b"http/1.1")),
        (&[], None),
    ];
    for (offered, chosen) in cases {
        let tls = testkit::tls::connect(addr, &cert, offered).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), chosen, "offered {offered:?}");
    }
    // A client that does not trust the certificate gets no further than the handshake, and one
    // that speaks plain HTTP to the TLS port gets nginx's 400, not a TLS alert it would read as
    // an HTTP/0.9 body.
    assert!(testkit::tls::connect(addr, &Cert::new(), &[]).await.is_err());
    for path in ["/health", "/v1/chat/completions"] {
        let plain = testkit::http()
            .post(format!("http://{addr}{path}"))
            .json(&chat("chat", 8, false))
            .send()
            .await
            .unwrap();
        assert_eq!(plain.status().as_u16(), 400, "{path}");
        let text = plain.text().await.unwrap();
        assert!(
            text.starts_with("The plain HTTP request was sent to HTTPS port"),
            "{text}"
        );
    }
    // Every request over TLS was recorded as any other.
    let served = stack.records().iter().filter(|r| r.status == 200).count();
    assert_eq!(served, 4);

    // curl, as the docs show it.
    let out = tokio::process::Command::new(testkit::tool("curl"))
        .args(["-sS", "-v", "--cacert", crt.to_str().unwrap()])
        .args(["-H", "content-type: application/json"])
        .args([
            "-d",
            r#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#,
        ])
        .arg(format!("{}/v1/chat/completions", stack.url))
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("\"chat.completion\""), "{stdout}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("ALPN") && l.contains("accepted") && l.contains("h2")),
        "{stderr}"
    );

    // The official openai client, trusting the certificate's file.
    let report = testkit::run_python(
        "openai_tls.py",
        &[&format!("{}/v1", stack.url), crt.to_str().unwrap()],
    )
    .await;
    assert!(report.contains("ok: TLS"), "{report}");
}

/// `https://` replicas: trusted through the route's `ca_file` on the request path and by the
/// health checks (which learn the context length over TLS); without it, the Mozilla roots do
/// not trust a private certificate and the call fails to connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_replicas_are_trusted_through_the_routes_ca_file() {
    let engine = engine(tiny()).await;
    let dir = tempfile::tempdir().unwrap();
    let cert = Cert::new();
    let (ca, _) = cert.write(dir.path(), "replica");
    let front = testkit::tls::front(engine.addr, &cert).await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
routes:
  - model: chat
    upstream_model: sim
    replicas: [https://127.0.0.1:{port}]
    ca_file: "{ca}"
    health: {{ interval: 200ms, timeout: 200ms }}
  - model: untrusted
    upstream_model: sim
    replicas: [https://127.0.0.1:{port}]
    retry: {{ attempts: 1 }}
    health: {{ enabled: false }}
"#,
        port = front.port(),
        ca = ca.display()
    );
    let stack = Stack::start(vec![], &yaml).await;
    let r = stack.stream("chat", 8).await;
    assert_eq!(r.status(), 200);
    let (body, _, clean) = read_stream(r).await;
    assert!(clean && body.contains("data: [DONE]"), "{body}");
    let r = testkit::http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .json(&chat("chat", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    // The health checks reach the replica over TLS too: they read its /v1/models.
    let learned = async {
        loop {
            let models: serde_json::Value = testkit::http()
                .get(format!("{}/v1/models", stack.url))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if models["data"][0]["max_model_len"].is_u64() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), learned)
        .await
        .expect("the health check read the replica's context length over TLS");

    let r = testkit::http()
        .post(format!("{}/v1/chat/completions", stack.url))
        .json(&chat("untrusted", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_connect", "{v}");
}
/// `POST /admin/reload` reads the certificate again: a key that cannot be used is refused with
/// the reason (400, and `drift` says so) while the pair in force keeps serving; a good pair then
/// serves new connections, and a connection opened before goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_reload_rereads_the_certificate_and_keeps_it_when_the_key_is_bad() {
    use crate::operations::{TOKEN, admin_url};
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (Cert::new(), Cert::new());
    let (crt, key) = first.write(dir.path(), "gateway");
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0, token_env: SPILLWAY_TEST_ADMIN_TOKEN }}\n{}",
        LISTENER
            .replace("{CERT}", crt.to_str().unwrap())
            .replace("{KEY}", key.to_str().unwrap())
    );
    let stack = Stack::start(vec![engine(tiny()).await], &yaml).await;
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, stack.fill(&yaml)).unwrap();
    stack.gateway.set_config_path(path);
    let admin = admin_url(&stack).await;
    let addr: std::net::SocketAddr = stack.url.trim_start_matches("https://").parse().unwrap();
    let mut open = testkit::tls::connect(addr, &first, &[b"http/1.1"]).await.unwrap();
    assert_eq!(testkit::tls::health(&mut open).await, "HTTP/1.1 200 OK");
    let reload = || async {
        testkit::http()
            .post(format!("{admin}/admin/reload"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
    };
    let drift = || async {
        let state: serde_json::Value = testkit::http()
            .get(format!("{admin}/admin/state"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        state["drift"].clone()
    };

    std::fs::write(&key, "not a key\n").unwrap();
    let r = reload().await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    testkit::assert_error_mentions(&v, "server.tls.key");
    testkit::assert_error_mentions(&v, "the TLS certificate in force stays");
    let d = drift().await;
    assert_eq!(d[0]["what"], "tls_certificate", "{d}");
    assert!(
        d[0]["file"].as_str().unwrap().contains("holds no private key"),
        "{d}"
    );
    assert!(
        testkit::tls::connect(addr, &first, &[]).await.is_ok(),
        "the first pair still serves"
    );

    second.write(dir.path(), "gateway");
    let r = reload().await;
    assert_eq!(r.status(), 200);
    assert_eq!(drift().await, serde_json::json!([]));
    assert!(testkit::tls::connect(addr, &second, &[]).await.is_ok());
    assert!(testkit::tls::connect(addr, &first, &[]).await.is_err());
    assert_eq!(
        testkit::tls::health(&mut open).await,
        "HTTP/1.1 200 OK",
        "the connection opened before goes on"
    );
}
