//! The machine a run ran on, for the reports: a number means little without it.

use serde::Serialize;

/// Host name, cores and processor, operating system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    pub host: String,
    /// The cores this process may use (a container's or `taskset`'s share, not the host's count).
    pub cpus: usize,
    /// The processor's name as the kernel reports it (`None` where it does not).
    pub cpu_model: Option<String>,
    pub os: &'static str,
    pub arch: &'static str,
}

impl Machine {
    /// This machine, read from the standard library and Linux's `/proc` (left out elsewhere).
    pub fn this() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        Machine {
            host: read("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model: read("/proc/cpuinfo").and_then(|info| cpu_model(&info)),
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
        }
    }

    /// `host, 2 cores (AMD EPYC 7B13), linux x86_64`.
    pub fn describe(&self) -> String {
        let model = self
            .cpu_model
            .as_ref()
            .map_or(String::new(), |m| format!(" ({m})"));
        format!(
            "{}, {} core{}{model}, {} {}",
            self.host,
            self.cpus,
            if self.cpus == 1 { "" } else { "s" },
            self.os,
            self.arch
        )
    }
}

/// The first `model name` line of `/proc/cpuinfo`.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "model name").then(|| value.split_whitespace().collect::<Vec<_>>().join(" "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_processor_is_named_from_cpuinfo() {
        let info =
            "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  7B13 64-Core Processor\n";
        assert_eq!(
            cpu_model(info).as_deref(),
            Some("AMD EPYC 7B13 64-Core Processor")
        );
        assert_eq!(cpu_model("processor : 0\n"), None);
        let m = Machine {
            host: "box".into(),
            cpus: 2,
            cpu_model: Some("X".into()),
            os: "linux",
            arch: "x86_64",
        };
        assert_eq!(m.describe(), "box, 2 cores (X), linux x86_64");
    }
}
