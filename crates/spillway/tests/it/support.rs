//! Running the binary as a user does: free ports, polling, killing what a test started. Engines
//! and gateways as child processes come from testkit ([`testkit::Process`]), given this binary.

pub(crate) use testkit::spawn::{PORTS, free_port_pair, try_get, wait_until};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_spillway");

pub(crate) fn get(port: u16, path: &str) -> String {
    try_get(port, path).unwrap()
}

/// A child process killed (and waited for) when dropped.
pub(crate) struct Kill(pub(crate) std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
