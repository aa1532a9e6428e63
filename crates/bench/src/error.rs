//! Why a run could not start or go on: the one error every part of the bench returns.

/// Why a run could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Setup(String),
    /// `--url` cannot be used.
    #[error("--url {url:?}: {reason}")]
    Url { url: String, reason: String },
    /// `--ca-cert` cannot be read or holds no certificate.
    #[error("--ca-cert {path}: {reason}")]
    CaCert { path: String, reason: String },
    /// `--dataset` cannot be read or has no usable prompt.
    #[error("--dataset {path}: {reason}")]
    Dataset { path: String, reason: String },
    /// `--phases` names a phase that does not exist.
    #[error("--phases: {0}")]
    Phases(String),
    /// A chart of the HTML report could not be drawn.
    #[error("cannot draw the report: {0}")]
    Chart(String),
    /// `--metrics-url` cannot be read or has no queue series.
    #[error("--metrics-url {url}: {reason}")]
    Metrics { url: String, reason: String },
    /// A tenant's options or its first request.
    #[error("tenant {name}: {error}")]
    Tenant { name: String, error: Box<BenchError> },
    #[error("target {url} is unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("target {url} refused the first request ({status}): {message}")]
    Rejected {
        url: String,
        status: u16,
        message: String,
    },
}
