//! A real vLLM 0.32 (its CPU build, the tiny dummy-weight model `scripts/vllm.sh` installs), as a
//! process group of its own: started ready, stopped with its engine core when dropped. Tests that
//! need it skip with a printed reason where it is not installed, unless `CI` is set or
//! `SPILLWAY_VLLM_REQUIRED=1`, where a missing install fails (it never passes silently).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

use crate::spawn::try_get;

/// The model name `scripts/vllm.sh serve` gives the tiny model.
pub const MODEL: &str = "tiny";

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether a missing install is a failure rather than a skip.
pub fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
        || std::env::var("SPILLWAY_VLLM_REQUIRED").is_ok_and(|v| v == "1")
}

/// Whether the install is there; when it is not, panics if it is required, else says why the
/// caller is skipped.
pub fn installed() -> bool {
    let root = repo_root();
    let missing: Vec<&str> = [
        "target/vllm-venv/bin/vllm",
        "target/vllm-model/tiny-llama/config.json",
        "target/vllm-model/tiny-llama-think/config.json",
    ]
    .into_iter()
    .filter(|p| !root.join(p).exists())
    .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "no real vLLM ({} missing): run scripts/vllm.sh install",
        missing.join(", ")
    );
    assert!(
        !required(),
        "{why} (required here: CI or SPILLWAY_VLLM_REQUIRED=1)"
    );
    eprintln!("skipped: {why}");
    false
}

/// A running `scripts/vllm.sh serve`, in a process group of its own.
pub struct Vllm {
    pub port: u16,
    pub log: PathBuf,
    pgid: u32,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        stop_group(self.pgid);
    }
}

/// SIGTERM to the group (the script, vLLM's API server, its engine core), SIGKILL 15 s later.
fn stop_group(pgid: u32) {
    let group = format!("-{pgid}");
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    let alive = || {
        Command::new("kill")
            .args(["-0", "--", &group])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let until = Instant::now() + Duration::from_secs(15);
    while alive() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
}

impl Vllm {
    /// Starts `scripts/vllm.sh serve PORT [--think] ARGS` and waits for `/health`; its log goes
    /// to `target/vllm-logs/NAME-PORT.log`.
    pub fn start(name: &str, think: bool, args: &[&str]) -> Result<Vllm, String> {
        Vllm::start_with_env(name, think, args, &[])
    }

    /// [`Vllm::start`] with variables added to its environment (e.g.
    /// `VLLM_ENABLE_RESPONSES_API_STORE=1`, which vLLM reads at start).
    pub fn start_with_env(
        name: &str,
        think: bool,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Vllm, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let logs = repo_root().join("target/vllm-logs");
        std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
        let log = logs.join(format!("{name}-{port}.log"));
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("scripts/vllm.sh"))
            .args(["serve", &port.to_string()]);
        if think {
            cmd.arg("--think");
        }
        use std::os::unix::process::CommandExt;
        let mut child = cmd
            .args(args)
            .env("SPILLWAY_VLLM_EXIT_WITH", std::process::id().to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("scripts/vllm.sh: {e}"))?;
        let server = Vllm {
            port,
            log,
            pgid: child.id(),
        };
        let until = Instant::now() + Duration::from_secs(600);
        loop {
            if try_get(port, "/health").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                return Ok(server);
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "vLLM ({name}) exited with {status} before it was ready; its log, {}:\n{}",
                    server.log.display(),
                    tail(&server.log, 40)
                ));
            }
            if Instant::now() > until {
                return Err(format!("vLLM ({name}) not ready after 600 s"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process group: the script, the API server and the engine core.
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// `/metrics` now (empty when it does not answer).
    pub fn metrics(&self) -> String {
        let raw = try_get(self.port, "/metrics").unwrap_or_default();
        let Some((head, body)) = raw.split_once("\r\n\r\n") else {
            return String::new();
        };
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_owned()
        }
    }

    /// The value of `name` (the first series whose line starts with it) in `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        metric_in(&self.metrics(), name).unwrap_or_else(|| panic!("{name} not in vLLM's /metrics"))
    }

    /// vLLM's own log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The value of the first series of `exposition` whose line starts with `name`.
pub fn metric_in(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A chunked body's bytes, as far as its chunks are whole.
pub fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    body
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
