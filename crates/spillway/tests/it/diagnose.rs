//! `spillway diagnose` run as a user runs it: against `spillway engine` replicas and their DCGM
//! listener, with the exit code carrying the verdict.

use std::net::TcpStream;
use std::process::{Command, Output};

use crate::support::{BIN, wait_until};
use testkit::Process;

fn diagnose(args: &[&str]) -> Output {
    Command::new(BIN).arg("diagnose").args(args).output().unwrap()
}

#[test]
fn exit_codes_follow_the_verdict_across_three_endpoints() {
    let dcgm_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dcgm_listen = format!("127.0.0.1:{dcgm_port}");
    // Two replicas, on testkit's port and the next, both up when it returns.
    let engine = Process::engine(BIN, &["--replicas", "2", "--dcgm-listen", &dcgm_listen]);
    let port = engine.port;
    assert!(
        wait_until(1000, || TcpStream::connect(("127.0.0.1", dcgm_port)).is_ok()),
        "the DCGM listener on {dcgm_port} is not up"
    );
    let targets = [
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{}/metrics", port + 1),
        format!("127.0.0.1:{dcgm_port}"),
    ];
    let mut args: Vec<&str> = vec!["--interval", "300ms", "--json", "--scrape"];
    args.extend(targets.iter().map(String::as_str));

    // Idle (no request sent): exit 0, nothing judged, every layer but the gateway found.
    let out = diagnose(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "idle", "{}", v["summary"]);
    assert!(v["summary"].as_str().unwrap().contains("nothing to judge"));
    assert_eq!(v["rows"]["infrastructure"]["targets_up"], 3);
    let found = |name: &str| {
        v["discovery"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == name)
    };
    assert!(found("DCGM_FI_DEV_XID_ERRORS") && found("vllm:kv_cache_usage_perc"));
    assert!(v["blind_spots"].to_string().contains("no gateway"));

    // An XID on the second replica's GPU: exit 1, the GPU named first, in words on a terminal.
    let patch = r#"{"xid": 79}"#;
    let req = format!(
        "POST /admin/faults HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{patch}",
        patch.len()
    );
    {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(("127.0.0.1", port + 1)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let text_args: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    let out = diagnose(&text_args);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("INCIDENT"), "{text}");
    assert!(text.contains("1. GPU, driver or runtime fault"), "{text}");
    assert!(!text.contains("\x1b["), "no colour when stdout is not a terminal");

    // Nothing answering: exit 2, the missing source named.
    let closed = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let out = diagnose(&["--interval", "100ms", "--scrape", &closed]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("could not diagnose"));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&closed));

    // No source at all is a usage error.
    let out = diagnose(&[]);
    assert_eq!(out.status.code(), Some(2));
}
