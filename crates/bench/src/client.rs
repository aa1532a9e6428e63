//! One streamed request sent and what it measured: its status, `Retry-After` and `Server-Timing`,
//! and, its stream read by [`crate::stream`], TTFT, every inter-token gap, tokens and how it ended
//! (success, a status counted by code, a transport error, a broken stream).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyDataStream, BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::error::BenchError;
pub use crate::request::{Api, Outcome, Record, Target};
use crate::workload::Prompt;

/// Reads `queue;dur=…` and `upstream;dur=…` (milliseconds) out of a `Server-Timing` header.
pub fn server_timing(value: &str) -> (Option<Duration>, Option<Duration>) {
    let mut queue = None;
    let mut upstream = None;
    for metric in value.split(',') {
        let mut params = metric.split(';').map(str::trim);
        let name = params.next().unwrap_or_default();
        let dur = params
            .filter_map(|p| p.strip_prefix("dur="))
            .find_map(|d| d.trim_matches('"').parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .map(|ms| Duration::from_secs_f64(ms / 1e3));
        match name {
            "queue" => queue = dur,
            "upstream" => upstream = dur,
            _ => {}
        }
    }
    (queue, upstream)
}

/// HTTP, or HTTPS with rustls.
pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Plain HTTP and HTTPS (rustls, TLS 1.2 and 1.3) trusting the Mozilla roots plus `ca_cert`'s
/// certificates, if given.
pub fn connector(ca_cert: Option<&std::path::Path>) -> Result<Connector, BenchError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_cert {
        let bad = |reason: String| BenchError::CaCert {
            path: path.display().to_string(),
            reason,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in the file".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BenchError::Setup(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// A pooled HTTP/1.1 client shared by every load task.
#[derive(Clone)]
pub struct Client {
    http: HyperClient<Connector, Full<Bytes>>,
    target: std::sync::Arc<Target>,
    uri: hyper::Uri,
    honor_retry_after: bool,
    tenant: Option<std::sync::Arc<str>>,
    /// Objective classes each request of a load draws from (`--slo-mix`).
    slo_mix: Option<std::sync::Arc<crate::slo_mix::SloMix>>,
}

impl Client {
    pub fn new(target: Target) -> Result<Client, BenchError> {
        let path = target.api.path();
        let bad = |reason: String| BenchError::Url {
            url: target.url.clone(),
            reason,
        };
        if !target.url.contains("://") {
            return Err(bad(format!(
                "the scheme is missing; write http://{} (or https://)",
                target.url
            )));
        }
        let base = target.url.trim_end_matches('/').trim_end_matches("/v1");
        let uri: hyper::Uri = format!("{base}{path}").parse().map_err(|e| bad(format!("{e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(bad("expected an http:// or https:// URL".into()));
        }
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector(target.ca_cert.as_deref())?);
        Ok(Client {
            http,
            target: std::sync::Arc::new(target),
            uri,
            honor_retry_after: false,
            tenant: None,
            slo_mix: None,
        })
    }

    /// A client that, in a closed loop, waits what a refusal's `Retry-After` says before sending
    /// again (see [`crate::load`]).
    pub fn honoring_retry_after(mut self, honor: bool) -> Client {
        self.honor_retry_after = honor;
        self
    }

    /// A client whose load draws each request's objectives from `mix` (see [`crate::load`]).
    pub fn with_slo_mix(mut self, mix: Option<crate::slo_mix::SloMix>) -> Client {
        self.slo_mix = mix.map(std::sync::Arc::new);
        self
    }

    /// The objective classes a load draws from, if any.
    pub fn slo_mix(&self) -> Option<&crate::slo_mix::SloMix> {
        self.slo_mix.as_deref()
    }

    /// The same connections, sending as `tenant` with its key, its records tagged with its name.
    pub fn for_tenant(&self, tenant: &str, api_key: &str) -> Client {
        let mut target = (*self.target).clone();
        target.api_key = Some(api_key.to_owned());
        Client {
            target: std::sync::Arc::new(target),
            tenant: Some(crate::tenants::tag(tenant)),
            ..self.clone()
        }
    }

    pub fn honors_retry_after(&self) -> bool {
        self.honor_retry_after
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The model ids `GET /v1/models` lists, to name the right one when a request named a wrong one.
    pub async fn models(&self) -> Option<Vec<String>> {
        Some(self.model_cards().await?.into_iter().map(|(id, _)| id).collect())
    }

    /// The context length (`max_model_len`, as vLLM and `spillway engine` publish it in
    /// `/v1/models`) of the target's model; `None` when the server does not say.
    pub async fn max_model_len(&self) -> Option<u32> {
        self.model_cards()
            .await?
            .into_iter()
            .find(|(id, _)| *id == self.target.model)
            .and_then(|(_, len)| len)
    }

    /// Every model `GET /v1/models` lists, with its `max_model_len` when given.
    async fn model_cards(&self) -> Option<Vec<(String, Option<u32>)>> {
        let base = self.target.url.trim_end_matches('/').trim_end_matches("/v1");
        let mut req = hyper::Request::get(format!("{base}/v1/models"));
        if let Some(key) = &self.target.api_key {
            req = req.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let resp = tokio::time::timeout(
            Duration::from_secs(5),
            self.http.request(req.body(Full::default()).ok()?),
        )
        .await
        .ok()?
        .ok()?;
        let body = Limited::new(resp.into_body(), 1 << 20)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        Some(
            v.get("data")?
                .as_array()?
                .iter()
                .filter_map(|m| {
                    let id = m.get("id")?.as_str()?.to_owned();
                    let len = m
                        .get("max_model_len")
                        .and_then(serde_json::Value::as_u64)
                        .and_then(|v| u32::try_from(v).ok());
                    Some((id, len))
                })
                .collect(),
        )
    }

    /// Sends `prompt` now and measures it; `scheduled` is when it should have gone, `epoch` the start
    /// of its level.
    pub async fn send(&self, prompt: &Prompt, scheduled: Instant, epoch: Instant) -> Record {
        self.send_as(prompt, None, scheduled, epoch).await
    }

    /// [`Client::send`], the request carrying `class`'s objectives in its headers and its record
    /// tagged with the class.
    pub async fn send_as(
        &self,
        prompt: &Prompt,
        class: Option<&crate::slo_mix::SloClass>,
        scheduled: Instant,
        epoch: Instant,
    ) -> Record {
        let body = crate::body::body(&self.target, prompt);
        let sent = Instant::now();
        let mut req = hyper::Request::post(self.uri.clone()).header(CONTENT_TYPE, "application/json");
        for (name, value) in crate::body::headers(self.target.api, self.target.api_key.as_deref()) {
            req = req.header(name, value);
        }
        for (name, value) in class.map(crate::slo_mix::SloClass::headers).unwrap_or_default() {
            req = req.header(name, value);
        }
        let mut rec = Record::unanswered(
            scheduled.saturating_duration_since(epoch),
            sent.saturating_duration_since(scheduled),
            prompt.long,
        );
        rec.asked_input_tokens = prompt.input_tokens;
        rec.tenant = self.tenant.clone();
        rec.slo_class = class.map(|c| c.name.clone());
        let req = match req.body(Full::new(body)) {
            Ok(r) => r,
            Err(e) => {
                rec.error = Some(e.to_string());
                return rec;
            }
        };
        let exchange = async {
            let resp = match self.http.request(req).await {
                Ok(r) => r,
                Err(e) => {
                    rec.error = Some(error_chain(&e));
                    return;
                }
            };
            let status = resp.status();
            if let Some(v) = resp.headers().get("server-timing").and_then(|v| v.to_str().ok()) {
                (rec.gateway_queue, rec.upstream_first_byte) = server_timing(v);
            }
            if status != hyper::StatusCode::OK {
                rec.outcome = Outcome::Status {
                    code: status.as_u16(),
                };
                rec.retry_after = resp
                    .headers()
                    .get(hyper::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(retry_after);
                let body = Limited::new(resp.into_body(), 64 << 10).collect().await;
                rec.error = Some(match body {
                    Ok(b) => {
                        let b = b.to_bytes();
                        rec.error_code = error_code(&b);
                        error_message(&b)
                    }
                    Err(_) => status.to_string(),
                });
                return;
            }
            let body = BodyDataStream::new(resp.into_body());
            crate::stream::read_stream(self.target.api, body, sent, &mut rec).await;
        };
        if tokio::time::timeout(self.target.timeout, exchange).await.is_err() {
            rec.outcome = Outcome::Timeout;
            rec.error = Some(format!(
                "no complete answer within {}",
                humantime::format_duration(self.target.timeout)
            ));
        }
        if rec.e2e.is_zero() {
            rec.e2e = sent.elapsed();
        }
        rec
    }
}

/// `Retry-After` in delta-seconds, the form servers answering overload send (an HTTP date, which
/// would need the two clocks to agree, is not read).
pub fn retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// `{"error":{"message":..}}` (OpenAI), `{"detail":..}` / `{"message":..}` (others), else the text.
pub fn error_message(body: &[u8]) -> String {
    let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let msg = v.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .and_then(|m| m.as_str().map(str::to_owned))
    });
    msg.unwrap_or_else(|| {
        String::from_utf8_lossy(&body[..body.len().min(300)])
            .trim()
            .to_owned()
    })
}

/// An OpenAI-shaped error's `error.code` when it is a short string (the gateway's
/// `slo_unattainable`, `queue_full`, …); numbers and long text are no code to count by.
pub fn error_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let code = v.pointer("/error/code")?.as_str()?;
    (!code.is_empty() && code.len() <= 64).then(|| code.to_owned())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod server_timing_tests {
    use super::*;

    #[test]
    fn server_timing_is_read_in_milliseconds_and_unknown_metrics_are_ignored() {
        let (q, u) = server_timing("queue;dur=12.5, upstream;dur=80.0, retry;desc=1");
        assert_eq!(q, Some(Duration::from_micros(12_500)));
        assert_eq!(u, Some(Duration::from_millis(80)));
        assert_eq!(server_timing("cdn-cache;desc=HIT, edge;dur=3"), (None, None));
        assert_eq!(server_timing("queue;dur=-1, upstream;dur=x").0, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_bucketed_with_the_overload_codes_apart() {
        let kinds: Vec<_> = [400, 404, 429, 500, 502, 503, 504]
            .map(|code| Outcome::Status { code }.kind())
            .to_vec();
        assert_eq!(
            kinds,
            [
                "http_4xx", "http_4xx", "http_429", "http_5xx", "http_5xx", "http_503", "http_504"
            ]
        );
        assert_eq!(
            error_message(br#"{"error":{"message":"The model `x` does not exist.","type":"NotFoundError"}}"#),
            "The model `x` does not exist."
        );
        assert_eq!(error_message(b"upstream connect error"), "upstream connect error");
        // Anthropic's body (and vLLM's on /v1/messages, with its own type names).
        assert_eq!(
            error_message(br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            "Overloaded"
        );
        let refused =
            br#"{"error":{"message":"cannot meet","type":"rate_limit_error","code":"slo_unattainable"}}"#;
        assert_eq!(error_code(refused).as_deref(), Some("slo_unattainable"));
        assert_eq!(error_code(br#"{"error":{"message":"busy","code":503}}"#), None);
        assert_eq!(error_code(b"upstream connect error"), None);
    }
}
