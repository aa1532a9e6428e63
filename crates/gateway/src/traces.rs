//! OpenTelemetry traces of the request path, opt-in with `tracing:` in the config: a server span
//! per request, with child spans for the queue, each upstream attempt, the wait for the first
//! token and the stream, and W3C trace context carried from the caller to the replica.
//!
//! A request only notes instants. Its spans are built, batched and posted (OTLP/HTTP, protobuf) on
//! an exporter thread of their own, behind a bounded queue: a slow or absent collector costs
//! dropped spans, counted in `spillway_trace_spans_dropped_total`, never a slower request.

use crate::config::TracingConfig;
use axum::http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceContextExt, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Spans are sent at least this often while requests finish.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// The exporter looks at its queue this often.
const REST: Duration = Duration::from_millis(10);
/// Or as soon as this many are waiting.
const BATCH_SPANS: usize = 512;
/// Finish reasons kept per request (one per choice).
const MAX_FINISH_REASONS: usize = 8;

/// The W3C headers for a replica: this gateway's span as the parent of the replica's.
#[derive(Debug, Clone)]
pub(crate) struct TraceHeaders {
    pub(crate) traceparent: HeaderValue,
    pub(crate) tracestate: Option<HeaderValue>,
}

/// What a request does about tracing.
#[derive(Default)]
pub(crate) enum Trace {
    /// No tracing and no caller context.
    #[default]
    Off,
    /// Not recorded here: the context is passed on as it came (or, when this gateway decided
    /// not to sample, a new unsampled one), so that the replica follows the same decision.
    Forward(TraceHeaders),
    /// Recorded: its spans go to the exporter when the request ends.
    Record(Box<Recording>),
}

/// The instants and facts of one sampled request, until it ends.
pub(crate) struct Recording {
    tracer: Arc<Tracer>,
    trace_id: TraceId,
    span_id: SpanId,
    parent: Option<SpanId>,
    trace_state: TraceState,
    /// The wall clock at `arrival`: every instant becomes a time since the epoch through it.
    wall: SystemTime,
    arrival: Instant,
    operation: &'static str,
    /// The endpoint's path, for `url.path`.
    path: &'static str,
    model: String,
    max_tokens: Option<u32>,
    stream: bool,
    admit_start: Option<Instant>,
    attempts: Vec<Attempt>,
    finish_reasons: Vec<String>,
    /// How it ended, once it has.
    summary: Option<Summary>,
}

struct Attempt {
    span_id: SpanId,
    start: Instant,
    end: Option<Instant>,
    replica: String,
    status: Option<u16>,
    error: Option<&'static str>,
}

/// How the request ended, as the ledger knows it when it is dropped.
pub(crate) struct Summary {
    pub(crate) id: String,
    pub(crate) route: Arc<str>,
    pub(crate) class: Arc<str>,
    pub(crate) team: Arc<str>,
    pub(crate) status: u16,
    /// How it was cut short, if it was.
    pub(crate) cut: Option<crate::error::Cut>,
    pub(crate) outcome: &'static str,
    /// The gateway's refusal or failure code, when it refused or failed the request.
    pub(crate) error: Option<&'static str>,
    pub(crate) retries: u32,
    pub(crate) tokens_in: Option<u32>,
    pub(crate) tokens_out: Option<u32>,
    pub(crate) queue_wait: Option<Duration>,
    pub(crate) upstream_start: Option<Instant>,
    pub(crate) first_token: Option<Instant>,
    pub(crate) chunks: u32,
    pub(crate) end: Instant,
}

enum Message {
    /// A request's recording, its summary filled in.
    Finished(Box<Recording>),
    Flush(std::sync::mpsc::Sender<()>),
}

/// The gateway's tracer: the sampling decision, IDs, and the queue to the exporter thread.
pub(crate) struct Tracer {
    sampler: Sampler,
    ids: RandomIdGenerator,
    propagator: TraceContextPropagator,
    tx: SyncSender<Message>,
    dropped_full: IntCounter,
}

impl Tracer {
    /// Starts the exporter thread; its counters go into `registry`.
    pub(crate) fn start(config: &TracingConfig, registry: &Registry) -> std::io::Result<Arc<Tracer>> {
        let exported = IntCounter::new(
            "spillway_trace_spans_exported_total",
            "Spans the OTLP collector accepted.",
        )
        .expect("valid metric");
        let dropped = IntCounterVec::new(
            Opts::new(
                "spillway_trace_spans_dropped_total",
                "Spans dropped: the exporter's queue was full, or the collector failed or was too slow.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(exported.clone()));
        let _ = registry.register(Box::new(dropped.clone()));
        let dropped_full = dropped.with_label_values(&["queue_full"]);
        let exporter = Exporter {
            url: config.traces_url(),
            timeout: config.export_timeout,
            resource: resource(&config.service_name),
            exported,
            failed: dropped.with_label_values(&["export_failed"]),
            failing: false,
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(config.max_queued);
        std::thread::Builder::new()
            .name("spillway-otlp".into())
            .spawn(move || exporter.run(rx))?;
        Ok(Arc::new(Tracer {
            sampler: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))),
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
            tx,
            dropped_full,
        }))
    }

    /// Waits (at most `timeout`) until every span queued so far has been offered to the collector.
    pub(crate) fn flush(&self, timeout: Duration) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.tx.send(Message::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(timeout);
        }
    }

    fn send(&self, finished: Box<Recording>) {
        match self.tx.try_send(Message::Finished(finished)) {
            Ok(()) => {}
            Err(
                TrySendError::Full(Message::Finished(f)) | TrySendError::Disconnected(Message::Finished(f)),
            ) => {
                self.dropped_full.inc_by(f.span_count());
            }
            Err(_) => {}
        }
    }
}

/// Reads W3C headers out of a request head.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

// Made at compile time: a lookup by string checks and lowers the name's bytes on every request.
/// The W3C trace-context request headers the gateway reads.
pub(crate) const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];
const TRACEPARENT: axum::http::HeaderName = axum::http::HeaderName::from_static(TRACE_HEADERS[0]);
const TRACESTATE: axum::http::HeaderName = axum::http::HeaderName::from_static(TRACE_HEADERS[1]);

impl Trace {
    /// The request's tracing, from the caller's headers and this gateway's tracer (if any).
    pub(crate) fn start(tracer: Option<&Arc<Tracer>>, headers: &HeaderMap, arrival: Instant) -> Trace {
        let Some(tracer) = tracer else {
            return match headers.get(&TRACEPARENT) {
                Some(tp) => Trace::Forward(TraceHeaders {
                    traceparent: tp.clone(),
                    tracestate: headers.get(&TRACESTATE).cloned(),
                }),
                None => Trace::Off,
            };
        };
        let caller = tracer.propagator.extract(&Headers(headers));
        let remote = caller.span().span_context().clone();
        let (trace_id, parent) = if remote.is_valid() {
            (remote.trace_id(), Some(remote.span_id()))
        } else {
            (tracer.ids.new_trace_id(), None)
        };
        let decision = tracer
            .sampler
            .should_sample(
                parent.map(|_| &caller),
                trace_id,
                "request",
                &SpanKind::Server,
                &[],
                &[],
            )
            .decision;
        if decision != SamplingDecision::RecordAndSample {
            let context = SpanContext::new(
                trace_id,
                parent.unwrap_or_else(|| tracer.ids.new_span_id()),
                opentelemetry::trace::TraceFlags::default(),
                false,
                remote.trace_state().clone(),
            );
            return Trace::Forward(headers_for(&tracer.propagator, context));
        }
        Trace::Record(Box::new(Recording {
            tracer: tracer.clone(),
            trace_id,
            span_id: tracer.ids.new_span_id(),
            parent,
            trace_state: remote.trace_state().clone(),
            wall: SystemTime::now(),
            arrival,
            operation: "chat",
            path: "/v1/chat/completions",
            model: String::new(),
            max_tokens: None,
            stream: false,
            admit_start: None,
            attempts: Vec::new(),
            finish_reasons: Vec::new(),
            summary: None,
        }))
    }

    fn recording(&mut self) -> Option<&mut Recording> {
        match self {
            Trace::Record(r) => Some(r),
            _ => None,
        }
    }

    /// What was asked: the operation and the endpoint's path, the model by the name the caller
    /// used, the output cap.
    pub(crate) fn request(
        &mut self,
        (operation, path): (&'static str, &'static str),
        model: &str,
        max_tokens: Option<u32>,
        stream: bool,
    ) {
        if let Some(r) = self.recording() {
            r.operation = operation;
            r.path = path;
            r.model = model.to_owned();
            r.max_tokens = max_tokens;
            r.stream = stream;
        }
    }

    /// The request starts to ask for a slot (the queue span starts here).
    pub(crate) fn admitting(&mut self) {
        if let Some(r) = self.recording() {
            r.admit_start = Some(Instant::now());
        }
    }

    /// An upstream attempt starts: the headers that make the replica's spans its children.
    pub(crate) fn attempt(&mut self, replica: &str) -> Option<TraceHeaders> {
        match self {
            Trace::Off => None,
            Trace::Forward(h) => Some(h.clone()),
            Trace::Record(r) => {
                let span_id = r.tracer.ids.new_span_id();
                r.attempts.push(Attempt {
                    span_id,
                    start: Instant::now(),
                    end: None,
                    replica: replica.to_owned(),
                    status: None,
                    error: None,
                });
                let context = SpanContext::new(
                    r.trace_id,
                    span_id,
                    opentelemetry::trace::TraceFlags::SAMPLED,
                    false,
                    r.trace_state.clone(),
                );
                Some(headers_for(&r.tracer.propagator, context))
            }
        }
    }

    /// The attempt answered `status` (its span lasts until the request ends), or failed with
    /// `error` (its span ends now).
    pub(crate) fn attempt_done(&mut self, result: Result<u16, (&'static str, u16)>) {
        let Some(a) = self.recording().and_then(|r| r.attempts.last_mut()) else {
            return;
        };
        match result {
            Ok(status) => a.status = Some(status),
            Err((error, status)) => {
                a.end = Some(Instant::now());
                a.error = Some(error);
                a.status = Some(status);
            }
        }
    }

    /// Notes the `finish_reason`s an answer or SSE event carries.
    pub(crate) fn finish_reasons(&mut self, json: &[u8]) {
        if let Some(r) = self.recording() {
            for reason in finish_reasons(json) {
                if r.finish_reasons.len() < MAX_FINISH_REASONS {
                    r.finish_reasons.push(reason);
                }
            }
        }
    }

    /// The request ended: its spans go to the exporter (or are counted as dropped).
    pub(crate) fn finish(self, summary: impl FnOnce() -> Summary) {
        if let Trace::Record(mut recording) = self {
            recording.summary = Some(summary());
            let tracer = recording.tracer.clone();
            tracer.send(recording);
        }
    }
}

fn headers_for(propagator: &TraceContextPropagator, context: SpanContext) -> TraceHeaders {
    let mut out = std::collections::HashMap::new();
    propagator.inject_context(&Context::new().with_remote_span_context(context), &mut out);
    let value = |name: &str| {
        out.get(name)
            .filter(|v| !v.is_empty())
            .and_then(|v| HeaderValue::from_str(v).ok())
    };
    TraceHeaders {
        traceparent: value("traceparent").unwrap_or_else(|| HeaderValue::from_static("")),
        tracestate: value("tracestate"),
    }
}

/// The string values of `finish_reason` in the choices of `json` (an SSE event's data or a whole
/// answer), as a parse reads them; `null` ones are not strings and are skipped. Only a traced
/// request pays for this parse.
fn finish_reasons(json: &[u8]) -> impl Iterator<Item = String> + use<> {
    let choices = serde_json::from_slice::<serde_json::Value>(json)
        .ok()
        .and_then(|mut v| match v.get_mut("choices").map(serde_json::Value::take) {
            Some(serde_json::Value::Array(choices)) => Some(choices),
            _ => None,
        })
        .unwrap_or_default();
    choices.into_iter().filter_map(
        |mut c| match c.get_mut("finish_reason").map(serde_json::Value::take) {
            Some(serde_json::Value::String(s)) => Some(s),
            _ => None,
        },
    )
}

impl Recording {
    fn span_count(&self) -> u64 {
        // The request, the queue, the attempts, and a stream's first token and body.
        2 + self.attempts.len() as u64 + if self.stream { 2 } else { 0 }
    }

    fn nanos(&self, at: Instant) -> u64 {
        let since = self.wall + at.saturating_duration_since(self.arrival);
        since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// A span of this trace; a child of the request's span unless it is the request's own.
    fn span(&self, id: SpanId, name: String, kind: span::SpanKind, start: Instant, end: Instant) -> Span {
        // OTLP's span flags: the W3C flags (sampled), and whether the parent is remote.
        const HAS_IS_REMOTE: u32 = 0x100;
        const IS_REMOTE: u32 = 0x200;
        let (parent, flags) = if id == self.span_id {
            let remote = if self.parent.is_some() { IS_REMOTE } else { 0 };
            (self.parent, 0x1 | HAS_IS_REMOTE | remote)
        } else {
            (Some(self.span_id), 0x1 | HAS_IS_REMOTE)
        };
        Span {
            trace_id: self.trace_id.to_bytes().to_vec(),
            span_id: id.to_bytes().to_vec(),
            trace_state: self.trace_state.header(),
            parent_span_id: parent.map(|p| p.to_bytes().to_vec()).unwrap_or_default(),
            flags,
            name,
            kind: kind as i32,
            start_time_unix_nano: self.nanos(start),
            end_time_unix_nano: self.nanos(end.max(start)),
            ..Span::default()
        }
    }
}

impl Recording {
    /// The request's span tree, in OTLP's shape (empty before the request has ended).
    fn spans(mut self: Box<Self>) -> Vec<Span> {
        let Some(s) = self.summary.take() else {
            return Vec::new();
        };
        let r = self;
        let mut spans = Vec::with_capacity(r.span_count() as usize);
        let mut root = r.span(
            r.span_id,
            if r.model.is_empty() {
                r.operation.to_owned()
            } else {
                format!("{} {}", r.operation, r.model)
            },
            span::SpanKind::Server,
            r.arrival,
            s.end,
        );
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", r.operation),
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("url.path", r.path),
            KeyValue::new("http.response.status_code", i64::from(s.status)),
            KeyValue::new("spillway.request_id", s.id),
            KeyValue::new("spillway.route", s.route),
            KeyValue::new("spillway.class", s.class.clone()),
            KeyValue::new("spillway.team", s.team),
            KeyValue::new("spillway.outcome", s.outcome),
            KeyValue::new("spillway.retries", i64::from(s.retries)),
            KeyValue::new("gen_ai.request.stream", r.stream),
        ];
        if !r.model.is_empty() {
            attrs.push(KeyValue::new("gen_ai.request.model", r.model.clone()));
        }
        if let Some(m) = r.max_tokens {
            attrs.push(KeyValue::new("gen_ai.request.max_tokens", i64::from(m)));
        }
        if let Some(t) = s.tokens_in {
            attrs.push(KeyValue::new("gen_ai.usage.input_tokens", i64::from(t)));
        }
        if let Some(t) = s.tokens_out {
            attrs.push(KeyValue::new("gen_ai.usage.output_tokens", i64::from(t)));
        }
        if !r.finish_reasons.is_empty() {
            let reasons: Vec<opentelemetry::StringValue> =
                r.finish_reasons.iter().cloned().map(Into::into).collect();
            attrs.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(reasons.into()),
            ));
        }
        if let Some(e) = s.error {
            attrs.push(KeyValue::new("error.type", e));
            if s.outcome == e {
                attrs.push(KeyValue::new("spillway.rejection_reason", e));
            }
        }
        // A server span is an error for a 5xx or a stream cut short on the server's side (a
        // client that left is not the server's failure).
        let cut = s.cut.is_some_and(|c| c != crate::error::Cut::Client);
        if s.status >= 500 || cut {
            root.status = Some(Status {
                code: status::StatusCode::Error as i32,
                message: s.outcome.to_owned(),
            });
            if s.error.is_none() {
                attrs.push(KeyValue::new("error.type", s.outcome));
            }
        }
        root.attributes = proto(attrs);
        spans.push(root);

        if let (Some(start), Some(wait)) = (r.admit_start, s.queue_wait) {
            let mut queue = r.span(
                r.tracer.ids.new_span_id(),
                "queue".into(),
                span::SpanKind::Internal,
                start,
                start + wait,
            );
            queue.attributes = proto(vec![
                KeyValue::new("spillway.class", s.class.clone()),
                KeyValue::new("spillway.queue.admitted", s.upstream_start.is_some()),
            ]);
            spans.push(queue);
        }
        for (n, a) in r.attempts.iter().enumerate() {
            let mut attempt = r.span(
                a.span_id,
                "upstream".into(),
                span::SpanKind::Client,
                a.start,
                a.end.unwrap_or(s.end),
            );
            let mut attrs = vec![
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("url.full", a.replica.clone()),
                KeyValue::new("http.request.resend_count", n as i64),
            ];
            if let Some(host) = a
                .replica
                .parse::<hyper::Uri>()
                .ok()
                .and_then(|u| u.host().map(str::to_owned))
            {
                attrs.push(KeyValue::new("server.address", host));
            }
            if let Some(status) = a.status {
                attrs.push(KeyValue::new("http.response.status_code", i64::from(status)));
            }
            if let Some(e) = a.error {
                attrs.push(KeyValue::new("error.type", e));
                attempt.status = Some(Status {
                    code: status::StatusCode::Error as i32,
                    message: e.to_owned(),
                });
            }
            attempt.attributes = proto(attrs);
            spans.push(attempt);
        }
        if r.stream
            && let (Some(start), Some(first)) = (s.upstream_start, s.first_token)
        {
            spans.push(r.span(
                r.tracer.ids.new_span_id(),
                "first_token".into(),
                span::SpanKind::Internal,
                start,
                first,
            ));
            let mut stream = r.span(
                r.tracer.ids.new_span_id(),
                "stream".into(),
                span::SpanKind::Internal,
                first,
                s.end,
            );
            stream.attributes = proto(vec![
                KeyValue::new("spillway.stream.chunks", i64::from(s.chunks)),
                KeyValue::new("spillway.outcome", s.outcome),
            ]);
            spans.push(stream);
        }
        spans
    }
}

/// Attributes in OTLP's shape.
fn proto(attributes: Vec<KeyValue>) -> Vec<opentelemetry_proto::tonic::common::v1::KeyValue> {
    opentelemetry_proto::transform::common::tonic::Attributes::from(attributes).0
}

fn resource(service_name: &str) -> Resource {
    Resource {
        attributes: proto(vec![
            KeyValue::new("service.name", service_name.to_owned()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("telemetry.sdk.language", "rust"),
            KeyValue::new("telemetry.sdk.name", "spillway"),
        ]),
        ..Resource::default()
    }
}

/// The exporter thread: batches spans and posts them to the collector.
struct Exporter {
    url: String,
    timeout: Duration,
    resource: Resource,
    exported: IntCounter,
    failed: IntCounter,
    /// Whether the last export failed: a failure is logged when it starts, not once per batch.
    failing: bool,
}

impl Exporter {
    fn run(mut self, rx: Receiver<Message>) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the trace exporter; spans will be dropped");
                return;
            }
        };
        let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let mut batch: Vec<Span> = Vec::new();
        let mut due = Instant::now() + EXPORT_EVERY;
        loop {
            // Everything queued since the last look, then a rest: the exporter is never parked
            // on the queue, so a request handing over its spans never has to wake it.
            loop {
                match rx.try_recv() {
                    Ok(Message::Finished(f)) => {
                        batch.extend(f.spans());
                        if batch.len() >= BATCH_SPANS {
                            runtime.block_on(self.export(&client, std::mem::take(&mut batch)));
                        }
                    }
                    Ok(Message::Flush(done)) => {
                        runtime.block_on(self.export(&client, std::mem::take(&mut batch)));
                        let _ = done.send(());
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        runtime.block_on(self.export(&client, std::mem::take(&mut batch)));
                        return;
                    }
                }
            }
            if Instant::now() >= due {
                runtime.block_on(self.export(&client, std::mem::take(&mut batch)));
                due = Instant::now() + EXPORT_EVERY;
            }
            std::thread::sleep(REST);
        }
    }

    async fn export<C>(
        &mut self,
        client: &hyper_util::client::legacy::Client<C, http_body_util::Full<bytes::Bytes>>,
        spans: Vec<Span>,
    ) where
        C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
    {
        if spans.is_empty() {
            return;
        }
        let n = spans.len() as u64;
        let body = prost::Message::encode_to_vec(&ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "spillway-gateway".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..InstrumentationScope::default()
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        });
        let request = hyper::Request::post(&self.url)
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)));
        let result = match request {
            Ok(request) => match tokio::time::timeout(self.timeout, client.request(request)).await {
                Ok(Ok(r)) if r.status().is_success() => Ok(()),
                Ok(Ok(r)) => Err(format!("the collector answered {}", r.status())),
                Ok(Err(e)) => Err(format!("cannot reach the collector: {e}")),
                Err(_) => Err(format!("no answer from the collector within {:?}", self.timeout)),
            },
            Err(e) => Err(format!("cannot build the export request: {e}")),
        };
        match result {
            Ok(()) => {
                self.exported.inc_by(n);
                if self.failing {
                    tracing::info!(url = %self.url, "the trace collector accepts spans again");
                }
                self.failing = false;
            }
            Err(e) => {
                self.failed.inc_by(n);
                if !self.failing {
                    tracing::warn!(url = %self.url, error = %e, "trace export failed; spans are dropped until the collector answers");
                }
                self.failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_are_read_from_events_and_bodies() {
        // As the relay hands it over: the event's data, here in json.dumps' style.
        let event = br#"{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}"#;
        assert_eq!(finish_reasons(event).collect::<Vec<_>>(), ["length"]);
        let body = br#"{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}"#;
        assert_eq!(finish_reasons(body).collect::<Vec<_>>(), ["stop", "length"]);
        let none = br#"{"choices":[{"delta":{"content":"x"},"finish_reason":null}]}"#;
        assert_eq!(finish_reasons(none).count(), 0);
    }

    #[test]
    fn without_a_tracer_the_callers_context_is_passed_on_as_it_came() {
        let mut headers = HeaderMap::new();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        headers.insert("traceparent", HeaderValue::from_static(tp));
        headers.insert("tracestate", HeaderValue::from_static("vendor=x"));
        let mut t = Trace::start(None, &headers, Instant::now());
        let h = t.attempt("http://replica:8000").expect("forwarded");
        assert_eq!(h.traceparent, tp);
        assert_eq!(h.tracestate.unwrap(), "vendor=x");
        assert!(matches!(
            Trace::start(None, &HeaderMap::new(), Instant::now()),
            Trace::Off
        ));
    }

    #[test]
    fn the_callers_sampled_flag_wins_over_the_ratio() {
        let config = TracingConfig {
            otlp_endpoint: "http://127.0.0.1:9".into(),
            sample_ratio: 0.0,
            service_name: "t".into(),
            max_queued: 4,
            export_timeout: Duration::from_secs(1),
        };
        let tracer = Tracer::start(&config, &Registry::new()).unwrap();
        // No caller context, ratio 0: not recorded, and the replica is told so.
        let mut t = Trace::start(Some(&tracer), &HeaderMap::new(), Instant::now());
        assert!(matches!(t, Trace::Forward(_)));
        let tp = t.attempt("http://r").unwrap().traceparent;
        let tp = tp.to_str().unwrap();
        assert!(
            tp.starts_with("00-") && tp.ends_with("-00") && tp.len() == 55,
            "{tp}"
        );
        // A sampled caller: recorded whatever the ratio, under the caller's trace ID.
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let mut t = Trace::start(Some(&tracer), &headers, Instant::now());
        let tp = t.attempt("http://r").unwrap().traceparent;
        assert!(matches!(t, Trace::Record(_)));
        let tp = tp.to_str().unwrap();
        assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp.ends_with("-01"));
        assert!(
            !tp.contains("00f067aa0ba902b7"),
            "the attempt's own span is the parent: {tp}"
        );
    }
}
