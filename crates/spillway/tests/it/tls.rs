//! `spillway serve` with `server.tls`: SIGHUP reads the certificate again without dropping open
//! connections, and a pair that cannot be used leaves the one in force, saying why.

use crate::support::{BIN, Kill, PORTS, free_port_pair, wait_until};
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::tls::{Cert, connect};
/// Polls `cond` every 20 ms for up to 10 s.
async fn within_10s<F: std::future::Future<Output = bool>>(mut cond: impl FnMut() -> F) -> bool {
    for _ in 0..500 {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_keeps_open_connections() {
    let dir = std::env::temp_dir().join(format!("spillway-tls-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (first, second) = (Cert::new(), Cert::new());
    let (crt, key) = first.write(&dir, "gateway");
    let log = dir.join("stderr.log");
    let ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let port = free_port_pair();
    let config = dir.join("gw.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\nserver:\n  tls: {{ cert: \"{}\", key: \"{}\" }}\nroutes:\n  - model: m\n    replicas: [http://127.0.0.1:1]\n    health: {{ enabled: false }}\n",
            crt.display(),
            key.display()
        ),
    )
    .unwrap();
    let gateway = Kill(
        Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // The port is the gateway's once it accepts; the lock is not held across an await.
    let listening = wait_until(1000, || std::net::TcpStream::connect(addr).is_ok());
    drop(ports);
    assert!(listening, "the gateway listens");
    let up = within_10s(|| async { connect(addr, &first, &[]).await.is_ok() }).await;
    assert!(up, "the gateway serves TLS with the first certificate");
    let mut open = connect(addr, &first, &[b"http/1.1"]).await.unwrap();
    assert_eq!(testkit::tls::health(&mut open).await, "HTTP/1.1 200 OK");

    let hup = || {
        let status = Command::new("kill")
            .args(["-HUP", &gateway.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let logged = |what: &'static str| {
        let log = log.clone();
        move || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let found = text
                .lines()
                .any(|l| l.contains("certificate_reload") && l.contains("by=\"SIGHUP\"") && l.contains(what));
            async move { found }
        }
    };
    second.write(&dir, "gateway");
    hup();
    assert!(
        within_10s(logged("TLS certificate reloaded")).await,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    // New connections get the second certificate; the one opened before goes on with the first.
    assert!(connect(addr, &second, &[]).await.is_ok());
    assert!(connect(addr, &first, &[]).await.is_err());
    assert_eq!(testkit::tls::health(&mut open).await, "HTTP/1.1 200 OK");

    // A key that cannot be used: the second pair stays, and the log says why.
    std::fs::write(&key, "not a key\n").unwrap();
    hup();
    assert!(
        within_10s(logged("server.tls.key")).await,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("the TLS certificate in force stays"), "{text}");
    assert!(connect(addr, &second, &[]).await.is_ok());
    drop(gateway);
    let _ = std::fs::remove_dir_all(&dir);
}
