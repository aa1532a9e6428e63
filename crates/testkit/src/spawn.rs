//! Engines and gateways for tests, in-process or as `spillway` child processes, each on a loopback
//! port of its own, ready when returned (its `/health` answered 200) and stopped when dropped.
//!
//! In-process starts ([`Engine::start`], [`Gateway::start`]) are what most tests want: the same
//! code `spillway engine` and `spillway serve` run, without a binary to find, on the test's own
//! runtime (and clock). [`Process`] runs the binary itself, for the `spillway` crate's tests, which
//! alone know its path (`env!("CARGO_BIN_EXE_spillway")`) and test the command as a user runs it.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// How long a server may take to answer its first `/health`: generous, for a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// The status of `GET path` from the server at `url` (`http://host:port`), or `None` when nothing
/// answers there (yet). No client timeout: it reads on the runtime's own terms, so a test on a
/// paused clock can call it.
pub async fn status(url: &str, path: &str) -> Option<u16> {
    let addr = url.strip_prefix("http://")?.trim_end_matches('/');
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.ok()?;
    parse_status(&answer)
}

fn parse_status(answer: &[u8]) -> Option<u16> {
    let line = answer.strip_prefix(b"HTTP/1.1 ")?;
    std::str::from_utf8(line.get(..3)?).ok()?.parse().ok()
}

/// Waits until `GET path` at `url` answers 200; panics naming `what` when it never does.
pub async fn wait_ready(url: &str, path: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    while status(url, path).await != Some(200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} at {url} did not answer {path} with 200 within {READY_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The simulated engine in-process on an ephemeral loopback port; it stops when dropped. It derefs
/// to [`engine::RunningEngine`] for the engine's own handle (`.engine`) and address.
pub struct Engine(engine::RunningEngine);

impl Engine {
    /// Starts `config` and waits for its `/health`.
    pub async fn start(config: engine::EngineConfig) -> Engine {
        let running = engine::spawn_local(config).await.expect("the engine starts");
        wait_ready(&running.url(), "/health", "the engine").await;
        Engine(running)
    }

    /// The running engine, for what takes it by value.
    pub fn into_inner(self) -> engine::RunningEngine {
        self.0
    }
}

impl std::ops::Deref for Engine {
    type Target = engine::RunningEngine;

    fn deref(&self) -> &engine::RunningEngine {
        &self.0
    }
}

/// `yaml` with `{E0}`, `{E1}`… replaced by `replicas[0]`, `replicas[1]`…
pub fn fill(yaml: &str, replicas: &[String]) -> String {
    let mut text = yaml.to_owned();
    for (i, url) in replicas.iter().enumerate() {
        text = text.replace(&format!("{{E{i}}}"), url);
    }
    text
}

/// A gateway in-process, serving a configuration given as YAML, on an ephemeral loopback port
/// (its `listen:` is not used). Its access log is kept in memory for the test to read. Dropping it
/// stops the server at once; [`Gateway::shutdown`] drains it as SIGTERM does.
pub struct Gateway {
    pub url: String,
    pub gateway: Arc<gateway::Gateway>,
    pub log: Arc<Mutex<Vec<gateway::access_log::AccessRecord>>>,
    /// The server task, for a test that waits for it to end after [`Gateway::shutdown`].
    pub server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    stop: Option<oneshot::Sender<()>>,
}

/// What a [`Gateway`] is started with besides its YAML.
#[derive(Default)]
pub struct GatewayOptions {
    /// Stand for `{E0}`, `{E1}`… in the YAML.
    pub replicas: Vec<String>,
    /// The environment the gateway reads secrets from (tests cannot set the process's own).
    pub env: Vec<(String, String)>,
    /// Returned before the first `/health` (for a test of what happens before it).
    pub no_wait: bool,
}

impl Gateway {
    /// Serves `yaml`, in which `{E0}`, `{E1}`… stand for `replicas`, and waits for its `/health`.
    pub async fn start(yaml: &str, replicas: &[String]) -> Gateway {
        Gateway::start_with(
            yaml,
            GatewayOptions {
                replicas: replicas.to_vec(),
                ..GatewayOptions::default()
            },
        )
        .await
    }

    /// [`Gateway::start`] with more options.
    pub async fn start_with(yaml: &str, options: GatewayOptions) -> Gateway {
        let yaml = fill(yaml, &options.replicas);
        let config = gateway::Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config: {e}\n{yaml}"));
        let (access, log) = gateway::access_log::AccessLog::memory();
        let env = options.env;
        let lookup = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        // A TLS listener's certificate is the test's own: it waits on what it trusts itself.
        let tls = config.server.tls.is_some();
        let gateway = gateway::Gateway::with_env(config, access, &lookup).expect("the gateway builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(gateway::run(listener, gateway.clone(), async move {
            let _ = stopped.await;
        }));
        if !options.no_wait && !tls {
            wait_ready(&url, "/health", "the gateway").await;
        }
        Gateway {
            url,
            gateway,
            log,
            server: Some(server),
            stop: Some(stop),
        }
    }

    /// Sends the shutdown signal (as SIGTERM does): the gateway drains, then its server ends.
    pub fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// The access log's records so far (each written when its request ends).
    pub fn records(&self) -> Vec<gateway::access_log::AccessRecord> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.abort();
        }
    }
}

/// Held from choosing ports until the server on them is up: tests of one binary run in parallel,
/// and two that chose at the same moment would get the same free ports.
pub static PORTS: Mutex<()> = Mutex::new(());

/// A free loopback port and the next one (a server with replicas takes consecutive ports; a test
/// may want one where nothing listens). Hold [`PORTS`] until the server on them is up.
pub fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two consecutive free ports");
}

/// `GET path` on the loopback `port`, the whole answer; an error when nothing answers (yet).
pub fn try_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// Polls `cond` every 20 ms, up to `tries` times: for blocking tests, which have no runtime clock.
pub fn wait_until(tries: u32, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..tries {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// A `spillway` command running as a child process on a loopback port of its own: killed (and
/// waited for) when dropped, its configuration file, if it has one, removed.
pub struct Process {
    pub port: u16,
    pub child: Child,
    /// Where its stderr goes (and its stdout, unless the caller took it).
    pub dir: PathBuf,
}

impl Process {
    /// `bin engine --listen 127.0.0.1:PORT ARGS`, once its `/health` answers 200 (each replica's,
    /// with `--replicas N`: on PORT and the ports after it). PORT + 1 was free when chosen: a second
    /// replica's, or, with one, a port where nothing listens for a test that wants one.
    pub fn engine(bin: &str, args: &[&str]) -> Process {
        Process::engine_with(bin, args, |_| {})
    }

    /// [`Process::engine`], with `adjust` changing the command before it starts (its environment).
    pub fn engine_with(bin: &str, args: &[&str], adjust: impl FnOnce(&mut Command)) -> Process {
        let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
        let port = free_port_pair();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(bin);
        cmd.args(["engine", "--listen", &listen]).args(args);
        let p = Process::start(cmd, port, "engine", None, adjust);
        // With `--replicas N`, the others on the ports after it, all up before the lock goes.
        let replicas: u16 = args
            .iter()
            .position(|a| *a == "--replicas")
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(1);
        for other in port + 1..port + replicas {
            let up = wait_until(1000, || {
                try_get(other, "/health").is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
            });
            assert!(
                up,
                "the engine's replica on port {other} did not start:\n{}",
                p.stderr()
            );
        }
        p
    }

    /// `bin serve --config FILE` with `yaml` in the file, once its `/health` answers 200. In `yaml`,
    /// `{E0}`, `{E1}`… stand for `replicas`, `{PORT}` for the port chosen for it and `{PORT1}` for
    /// the next one (free when chosen: an admin listener's); without a `listen:` line of its own,
    /// `listen: 127.0.0.1:{PORT}` is put before it. Its stdout (the access log) and stderr go to
    /// files ([`Process::stdout`], [`Process::stderr`]); `adjust` may change the command before it
    /// starts (its environment, where its stdout goes).
    pub fn gateway(bin: &str, yaml: &str, replicas: &[String], adjust: impl FnOnce(&mut Command)) -> Process {
        let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
        let port = free_port_pair();
        let dir = temp_dir("gateway");
        let config = dir.join("spillway.yaml");
        let mut text = fill(yaml, replicas);
        if !text.lines().any(|l| l.starts_with("listen:")) {
            text = format!("listen: 127.0.0.1:{{PORT}}\n{text}");
        }
        let text = text
            .replace("{PORT}", &port.to_string())
            .replace("{PORT1}", &(port + 1).to_string());
        std::fs::write(&config, &text).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--config", config.to_str().unwrap()]);
        Process::start(cmd, port, "gateway", Some(dir), adjust)
    }

    fn start(
        mut cmd: Command,
        port: u16,
        what: &str,
        dir: Option<PathBuf>,
        adjust: impl FnOnce(&mut Command),
    ) -> Process {
        let dir = dir.unwrap_or_else(|| temp_dir(what));
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
        adjust(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("the {what} does not start: {e}"));
        let mut p = Process { port, child, dir };
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        while !try_get(port, "/health").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
            let exited = p.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && tokio::time::Instant::now() < deadline,
                "the {what} on port {port} was not ready ({exited:?}); its stderr:\n{}",
                p.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it wrote to stdout so far (a gateway's access log).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout")).unwrap_or_default()
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// SIGKILL, and waits for the process to end: a crash, with no drain.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new folder under the system's temp dir, unique to this process and call.
fn temp_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("spillway-test-{tag}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_status_of_an_answer() {
        assert_eq!(
            super::parse_status(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(super::parse_status(b"SSH-2.0"), None);
    }
}
