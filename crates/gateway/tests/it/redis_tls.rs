//! Shared limits over TLS: a real `redis-server` listening on `--tls-port` only, asking for a
//! client certificate and a password; the gateway trusts a private CA from a file and reads the
//! password from the environment.

use crate::support::{chat, engine, http, read_stream, tiny};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::process::Command;

/// A CA, and a server and a client certificate it signed, written as PEM files into `dir`.
fn certificates(dir: &Path) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    // Names of their own: a leaf named as its issuer looks self-signed to OpenSSL.
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "spillway test CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    let issuer = rcgen::Issuer::new(ca, &ca_key);
    for (name, names) in [
        ("server", vec!["localhost".to_string(), "127.0.0.1".to_string()]),
        ("client", vec!["spillway-gateway".to_string()]),
    ] {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("spillway test {name}"));
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_limits_over_tls_with_a_client_certificate_and_a_password_from_the_environment() {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "scripts/test.sh installs redis-server"
        );
        eprintln!("skipped: redis-server is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = |f: &str| dir.path().join(f).display().to_string();
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            &path("server.crt"),
            "--tls-key-file",
            &path("server.key"),
        ])
        .args(["--tls-ca-cert-file", &path("ca.crt"), "--tls-auth-clients", "yes"])
        .args(["--requirepass", "s3cret", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server starts");
    let engine = engine(tiny()).await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
redis:
  gateways: 1
  namespace: tls
  password_env: REDIS_PASSWORD
  tls: {{ ca_file: "{}", cert_file: "{}", key_file: "{}" }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}]
    classes:
      - {{ name: interactive, concurrency: 2, queue: 4, queue_wait: 1s }}
"#,
        path("ca.crt"),
        path("client.crt"),
        path("client.key")
    );
    let options = testkit::GatewayOptions {
        replicas: vec![engine.url()],
        env: vec![
            ("SPILLWAY_REDIS_URL".into(), format!("rediss://127.0.0.1:{port}/")),
            ("REDIS_PASSWORD".into(), "s3cret".into()),
        ],
        ..testkit::GatewayOptions::default()
    };
    let gw = testkit::Gateway::start_with(&yaml, options).await;
    assert!(
        crate::support::eventually(Duration::from_secs(10), || gw.gateway.limits_shared()
            == Some(true))
        .await,
        "the gateway reaches Redis over TLS"
    );
    let r = http()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("chat", 8, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = read_stream(r).await;
    // The request's lease went through Redis: its admission and release are counted there.
    let metrics = http()
        .get(format!("{}/metrics", gw.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("spillway_redis_calls_total{op=\"acquire\",outcome=\"ok\"} 1")),
        "one admission through Redis: {metrics}"
    );
    let _ = server.kill().await;
}
