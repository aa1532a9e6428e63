//! https:// targets: a TLS front (self-signed, as a private deployment would have) before an engine.

use std::sync::Arc;
use std::time::Duration;

use bench::spec::Phase;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer};

use crate::support::{concurrency, fixed_step_engine, options};

/// Terminates TLS for `127.0.0.1` with a fresh self-signed certificate and passes the bytes on to
/// `upstream`; returns its address and the certificate as PEM.
async fn tls_front(upstream: std::net::SocketAddr) -> (std::net::SocketAddr, String) {
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let pem = key.cert.pem();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![key.cert.der().clone()],
            PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_with_a_private_ca() {
    let engine = testkit::Engine::start(fixed_step_engine(16, Duration::from_millis(2))).await;
    let (front, pem) = tls_front(engine.addr).await;
    let dir = std::env::temp_dir().join(format!("spillway-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, pem).unwrap();
    let url = format!("https://127.0.0.1:{}", front.port());

    let mut opts = options(&url, 16, 4, "ttft_p95=1s");
    opts.phases = vec![Phase::Staircase];
    opts.loads = concurrency(&[4]);
    opts.stop = bench::load::Stop::Requests(40);
    opts.metrics_urls = vec![format!("{url}/metrics")];
    opts.target.ca_cert = Some(ca.clone());
    let report = bench::run(opts.clone()).await.unwrap();
    let level = &report.levels[0];
    assert_eq!(level.stats.ok, 40, "{}", bench::report::table(&report));
    // The run began by reading https://…/metrics too (a failure there stops it).
    assert!(level.stats.ttft.is_some());

    // Without the private CA the server is not trusted, and the run says why at once.
    opts.target.ca_cert = None;
    let err = bench::run(opts).await.unwrap_err().to_string();
    assert!(
        err.contains("unreachable") && err.contains("certificate"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
