//! A gateway that dies holding slots of limits shared through Redis: killed with SIGKILL, it
//! cannot give them back, and they are free again within `lease_ttl`.

use crate::support::{BIN, Kill, PORTS, free_port_pair, try_get, wait_until};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::Process;
use tokio::time::Instant;

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Slots whose lease has not expired, by Redis's clock (expired ones are swept by the next
/// admission, not at once).
fn slots_held(redis_port: u16) -> u32 {
    let time = redis_cli(redis_port, &["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap_or(0));
    let (secs, micros) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let now_ms = secs * 1000 + micros / 1000;
    redis_cli(
        redis_port,
        &[
            "ZCOUNT",
            "spillway:{killed}:slots:m:default",
            &now_ms.to_string(),
            "+inf",
        ],
    )
    .parse()
    .unwrap_or(u32::MAX)
}

/// Starts a gateway on `yaml` in front of `engine`, sharing limits through the Redis on
/// `redis_port`, once it has reached Redis.
fn gateway(yaml: &str, engine: &Process, redis_port: u16) -> Process {
    let redis = format!("redis://127.0.0.1:{redis_port}/");
    let gw = Process::gateway(BIN, yaml, &[engine.url()], |cmd| {
        cmd.env("SPILLWAY_REDIS_URL", &redis);
    });
    let up = wait_until(1000, || {
        try_get(gw.port, "/metrics").is_ok_and(|r| r.contains("spillway_limits_mode{mode=\"shared\"} 1"))
    });
    assert!(up, "the gateway reaches Redis");
    gw
}

/// Opens a streamed request and leaves it running (the connection is returned, unread).
fn open_stream(port: u16) -> TcpStream {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}"#;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

#[test]
fn slots_of_a_killed_gateway_are_free_again_within_the_lease_ttl() {
    if Command::new("redis-server").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "scripts/test.sh installs redis-server"
        );
        eprintln!("skipped: redis-server is not installed (scripts/test.sh installs it)");
        return;
    }
    let ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let redis_port = free_port_pair();
    let _redis = Kill(
        Command::new("redis-server")
            .args(["--port", &redis_port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_until(500, || redis_cli(redis_port, &["PING"]) == "PONG"),
        "redis-server starts"
    );
    drop(ports);
    let engine = Process::engine(
        BIN,
        &["--preset", "tiny", "--model", "m", "--fault-stall-after", "2"],
    );
    let yaml = "redis: { gateways: 2, lease_ttl: 2s, namespace: killed }
routes:
  - model: m
    replicas: [{E0}]
    health: { enabled: false }
    timeouts: { connect: 1s, first_token: 10s, stream_idle: 60s, total: 120s }
    classes:
      - { name: default, concurrency: 3, queue: 0, queue_wait: 1s }
";
    let mut first = gateway(yaml, &engine, redis_port);
    let gateway_port = first.port;
    let streams: Vec<TcpStream> = (0..3).map(|_| open_stream(gateway_port)).collect();
    assert!(
        wait_until(500, || slots_held(redis_port) == 3),
        "three slots taken"
    );
    // SIGKILL: no drain, no release.
    first.kill();
    let killed = Instant::now();
    drop(streams);
    assert_eq!(
        slots_held(redis_port),
        3,
        "a dead gateway gives nothing back itself"
    );
    assert!(
        wait_until(500, || slots_held(redis_port) == 0),
        "the slots expire with their leases"
    );
    let freed = killed.elapsed();
    eprintln!("slots of the killed gateway free again after {freed:?} (lease_ttl 2s)");
    assert!(
        freed <= Duration::from_millis(2000 + 1000),
        "freed after {freed:?}"
    );
    // A new gateway gets the whole C again.
    let second = gateway(yaml, &engine, redis_port);
    let gateway_port = second.port;
    let again: Vec<TcpStream> = (0..3).map(|_| open_stream(gateway_port)).collect();
    assert!(wait_until(500, || slots_held(redis_port) == 3));
    let mut refused = open_stream(gateway_port);
    refused.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = [0u8; 12];
    refused.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 503", "C = 3 is full: the fourth is refused");
    drop(again);
}
