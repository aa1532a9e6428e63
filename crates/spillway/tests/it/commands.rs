//! `spillway engine` and `spillway check`: replicas on consecutive ports, clear errors for bad flags
//! and bad configurations, clean shutdown.

use std::net::TcpStream;
use std::process::{Command, Stdio};

use crate::support::{BIN, get, wait_until};
use std::time::Duration;
use testkit::Process;

#[test]
fn replicas_listen_on_consecutive_ports_and_stop_on_sigterm() {
    // testkit's port and the next, free when it chose them.
    let mut engine = Process::engine(BIN, &["--replicas", "2", "--model", "m"]);
    let port = engine.port;
    for p in [port, port + 1] {
        let up = wait_until(1000, || TcpStream::connect(("127.0.0.1", p)).is_ok());
        assert!(up, "replica on {p} did not start");
        assert!(get(p, "/health").starts_with("HTTP/1.1 200"));
        assert!(get(p, "/v1/models").contains("\"id\":\"m\""));
    }
    let status = Command::new("kill")
        .args(["-TERM", &engine.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exit = None;
    let exited = wait_until(500, || {
        exit = engine.child.try_wait().unwrap();
        exit.is_some()
    });
    assert!(exited, "did not exit on SIGTERM");
    assert!(exit.unwrap().success(), "exit status {exit:?}");
}

#[test]
fn bad_flags_are_named_with_exit_code_2() {
    for (args, needle) in [
        (vec!["engine", "--preset", "gpt5"], "unknown preset 'gpt5'"),
        (
            vec!["engine", "--max-num-seqs", "0"],
            "--max-num-seqs must be at least 1",
        ),
        (
            vec!["engine", "--fault-fail-every", "3:200"],
            "status must be 400",
        ),
        (
            vec!["engine", "--output-len", "uniform:9,1"],
            "bad length distribution",
        ),
        (
            vec!["engine", "--kv-cache-tokens", "10"],
            "--kv-cache-tokens (10)",
        ),
        (
            vec!["engine", "--listen", "127.0.0.1:1", "--replicas", "0"],
            "--replicas must be at least 1",
        ),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn help_explains_each_command() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("engine") && text.contains("simulated vLLM"),
        "{text}"
    );
    let out = Command::new(BIN).args(["engine", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--kv-cache-tokens",
        "--enable-prefix-caching",
        "--tokenizer",
        "--fault-never-first-token",
    ] {
        assert!(text.contains(flag), "{flag} missing from engine --help");
    }
}

#[test]
fn check_accepts_the_shipped_example_and_names_the_bad_field() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/spillway.yaml");
    let out = Command::new(BIN).args(["check", example]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("class interactive: C = 24, Q = 12, Wq = 2s, fairness fifo"),
        "{stdout}"
    );
    assert!(stdout.contains("balance least_outstanding"), "{stdout}");

    let dir = std::env::temp_dir().join(format!("spillway-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    let text = std::fs::read_to_string(example)
        .unwrap()
        .replace("first_token: 8s", "first_token: 500ms");
    std::fs::write(&bad, text).unwrap();
    let out = Command::new(BIN)
        .args(["check", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("routes[0].timeouts: connect (1s) must be less than first_token (500ms)"),
        "{stderr}"
    );
    let out = Command::new(BIN)
        .args(["check", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent.yaml"));
    // Teams: the weights fair share divides a contended class by, and the default fairness.
    let teams = dir.join("teams.yaml");
    let text = std::fs::read_to_string(example).unwrap()
        + "tenants:\n  - { team: search, key_sha256: [ \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\" ], weight: 3 }\n  - { team: batch, key_sha256: [ \"580843d03d2216ff1a275d0991bad66e4d1af871171d929e9de604b7959f9bca\" ], priority: sheddable }\n";
    std::fs::write(&teams, text).unwrap();
    let out = Command::new(BIN)
        .args(["check", teams.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "fairness teams",
        "team search: weight 3, priority standard",
        "team batch: weight 1, priority sheddable",
    ] {
        assert!(stdout.contains(line), "{line:?} missing:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_validates_the_admin_section_and_names_allowed_values() {
    let dir = std::env::temp_dir().join(format!("spillway-check-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let route = "routes:\n  - model: m\n    replicas: [http://127.0.0.1:9]\n";
    let admin = write(
        "admin.yaml",
        &format!(
            "listen: 127.0.0.1:8080\nadmin: {{ listen: 127.0.0.1:8081, token_env: SPILLWAY_CHECK_TOKEN }}\n{route}"
        ),
    );
    let check = |path: &std::path::Path, token: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["check", path.to_str().unwrap()]);
        cmd.env_remove("SPILLWAY_CHECK_TOKEN");
        if let Some(t) = token {
            cmd.env("SPILLWAY_CHECK_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, text) = check(&admin, None);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("SPILLWAY_CHECK_TOKEN holding the admin token is not set"),
        "{text}"
    );
    let (code, text) = check(&admin, Some("short"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("use at least 16"), "{text}");
    let (code, text) = check(&admin, Some("a-long-enough-admin-token"));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("admin API on 127.0.0.1:8081"), "{text}");
    let same = write(
        "same.yaml",
        &format!("listen: 127.0.0.1:8080\nadmin: {{ listen: 127.0.0.1:8080, token_env: X }}\n{route}"),
    );
    let (code, text) = check(&same, None);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("admin.listen: 127.0.0.1:8080 is also the public listener"),
        "{text}"
    );
    let zero = write(
        "zero.yaml",
        "listen: 127.0.0.1:8080\nroutes:\n  - model: m\n    replicas: [http://127.0.0.1:9]\n    classes:\n      - { name: a, concurrency: 0, queue: 1, queue_wait: 1s }\n",
    );
    let (code, text) = check(&zero, None);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("0 is not allowed: use a number of requests from 1 up"),
        "{text}"
    );
    assert_eq!(
        text.matches("routes[0].classes[0].concurrency").count(),
        1,
        "the path is said once: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Standard output into a pipe that nobody reads fills after a few hundred access-log lines; the
/// gateway must go on serving (the log drops lines instead of blocking a worker).
#[test]
fn a_stuck_access_log_reader_does_not_stop_the_gateway() {
    use std::io::{Read, Write};
    let engine = Process::engine(BIN, &["--preset", "zero", "--model", "m"]);
    // stdout is a pipe this test never reads.
    let gateway = Process::gateway(
        BIN,
        "routes:\n  - model: m\n    replicas: [{E0}]\n    health: { enabled: false }\n",
        &[engine.url()],
        |cmd| {
            cmd.stdout(Stdio::piped());
        },
    );
    let gateway_port = gateway.port;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
    for i in 0..2000 {
        let mut s = TcpStream::connect(("127.0.0.1", gateway_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        let read = s.read_to_string(&mut answer);
        assert!(
            read.is_ok() && answer.starts_with("HTTP/1.1 200"),
            "request {i} was not served ({read:?}): {answer}"
        );
    }
    drop(gateway);
}

#[test]
fn key_makes_a_key_once_and_hashes_one_from_stdin() {
    use std::io::Write;
    let out = Command::new(BIN).arg("key").output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("{name} missing: {stdout}"))
    };
    let (key, hash) = (field("key:"), field("key_sha256:"));
    assert!(key.starts_with("sk-spw-") && key.len() == 71, "{key}");
    let mut child = Command::new(BIN)
        .args(["key", "--hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{key}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        hash,
        "the same hash as printed"
    );
    let again = Command::new(BIN).arg("key").output().unwrap();
    assert!(
        !String::from_utf8_lossy(&again.stdout).contains(&key),
        "a new key each time"
    );
}

#[test]
fn completions_cover_every_command_and_a_flag() {
    let out = Command::new(BIN).args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "bench", "plan", "demo", "--wait-budget", "completions"] {
        assert!(script.contains(word), "{word} missing from the bash completions");
    }
    let zsh = Command::new(BIN).args(["completions", "zsh"]).output().unwrap();
    assert!(String::from_utf8_lossy(&zsh.stdout).starts_with("#compdef spillway"));
    let bad = Command::new(BIN).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    // A reader that has gone (`| head`) ends the script quietly, not with a panic.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let gone = Command::new(BIN)
        .args(["completions", "bash"])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(
        gone.status.success() && stderr.is_empty(),
        "{:?}: {stderr}",
        gone.status
    );
}

/// `spillway check … | head`: a reader that has gone before the output is written ends every
/// command quietly with status 0, as `completions` does, instead of a broken-pipe panic (101).
#[test]
fn a_reader_that_has_gone_ends_a_command_quietly() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/spillway.yaml");
    for args in [
        vec!["check", config],
        vec!["key"],
        vec!["--help"],
        vec!["completions", "zsh"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(BIN).args(&args).stdout(writer).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(0) && !stderr.contains("panicked"),
            "{args:?}: {:?}: {stderr}",
            out.status
        );
    }
}

/// `--responses-store` (or vLLM's `VLLM_ENABLE_RESPONSES_API_STORE=1`) keeps Responses answers for
/// `GET /v1/responses/{id}`; without either, as in vLLM, nothing is kept (404).
#[test]
fn the_response_store_is_off_unless_asked() {
    use std::io::{Read, Write};
    let ask = |port: u16, method: &str, path: &str, body: &str| {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    };
    let kept = |engine: &Process| {
        let answer = ask(
            engine.port,
            "POST",
            "/v1/responses",
            r#"{"model":"m","input":"hi","max_output_tokens":2}"#,
        );
        let id = answer
            .split("\"id\":\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap();
        ask(engine.port, "GET", &format!("/v1/responses/{id}"), "")
    };
    let flag = Process::engine(BIN, &["--model", "m", "--responses-store"]);
    assert!(kept(&flag).starts_with("HTTP/1.1 200"), "--responses-store");
    let env = Process::engine_with(BIN, &["--model", "m"], |c| {
        c.env("VLLM_ENABLE_RESPONSES_API_STORE", "1");
    });
    assert!(
        kept(&env).starts_with("HTTP/1.1 200"),
        "VLLM_ENABLE_RESPONSES_API_STORE=1"
    );
    let off = Process::engine_with(BIN, &["--model", "m"], |c| {
        c.env_remove("VLLM_ENABLE_RESPONSES_API_STORE");
    });
    assert!(kept(&off).starts_with("HTTP/1.1 404"), "off by default");
}
