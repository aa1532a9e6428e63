//! Running the binary as a user does: free ports, polling, killing what a test started.

use std::net::TcpStream;
use std::time::Duration;

/// Polls `cond` every 20 ms, up to `tries` times (a blocking test: no runtime clock to use).
pub(crate) fn wait_until(tries: u32, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..tries {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// Held from choosing ports until the server on them is up: tests run in parallel, and two that
/// chose at the same moment would get the same free ports.
pub(crate) static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Two consecutive free ports (a port and the next one); hold [`PORTS`] until they are taken.
pub(crate) fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two consecutive free ports");
}

pub(crate) fn get(port: u16, path: &str) -> String {
    try_get(port, path).unwrap()
}

/// `GET path`, or the error; for polling a server that may not be up yet.
pub(crate) fn try_get(port: u16, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

pub(crate) struct Kill(pub(crate) std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
