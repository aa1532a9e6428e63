//! The record of one request as it passes through the gateway, finished exactly once: when it is
//! dropped, whatever ended it (an answer, an error, a client that left, a deadline).

use crate::access_log::{AccessLog, AccessRecord};
use crate::admission::Permit;
use crate::config::Slo;
use crate::metrics::{ClassSeries, Metrics, NO_CLASS, UNKNOWN_ROUTE};
use crate::route::ReplicaGuard;
use std::sync::Arc;
use tokio::time::Instant;

/// How a request that reached a replica ended, if not by finishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    ClientDisconnect,
    StreamIdle,
    Deadline,
    Upstream,
}

impl Cut {
    pub fn reason(self) -> &'static str {
        match self {
            Cut::ClientDisconnect => "client_disconnect",
            Cut::StreamIdle => "stream_idle_timeout",
            Cut::Deadline => "deadline",
            Cut::Upstream => "upstream_error",
        }
    }
}

/// Everything known about one request; its `Drop` writes the metrics and the access-log line.
pub struct Exchange {
    pub metrics: Arc<Metrics>,
    pub access: AccessLog,
    pub arrival: Instant,
    pub record: AccessRecord,
    pub series: Option<ClassSeries>,
    pub slo: Option<Slo>,
    /// The admission slot, released when this is dropped (the end of the response body).
    pub permit: Option<Permit>,
    pub replica: Option<ReplicaGuard>,
    /// Set once a response head has gone to the client.
    pub answered: bool,
    pub finished: bool,
    pub cut: Option<Cut>,
    pub rejection: Option<&'static str>,
    pub first_chunk: Option<Instant>,
    pub last_chunk: Option<Instant>,
    pub chunks: u32,
    pub usage: Option<(u32, u32)>,
}

impl Exchange {
    pub fn new(metrics: Arc<Metrics>, access: AccessLog, id: String, stream: bool) -> Exchange {
        Exchange {
            metrics,
            access,
            arrival: Instant::now(),
            record: AccessRecord {
                id,
                route: UNKNOWN_ROUTE.into(),
                class: NO_CLASS.into(),
                stream,
                ..AccessRecord::default()
            },
            series: None,
            slo: None,
            permit: None,
            replica: None,
            answered: false,
            finished: false,
            cut: None,
            rejection: None,
            first_chunk: None,
            last_chunk: None,
            chunks: 0,
            usage: None,
        }
    }

    /// A relayed chunk carrying tokens, at `now`: the first sets TTFT, the rest are ITL gaps.
    pub fn token_chunk(&mut self, now: Instant) {
        match self.last_chunk {
            None => {
                self.first_chunk = Some(now);
                if let Some(p) = &self.permit {
                    p.first_token(now);
                }
                if let Some(s) = &self.series {
                    s.ttft.observe((now - self.arrival).as_secs_f64());
                }
            }
            Some(prev) => {
                if let Some(s) = &self.series {
                    s.itl.observe((now - prev).as_secs_f64());
                }
            }
        }
        self.last_chunk = Some(now);
        self.chunks += 1;
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let now = Instant::now();
        let m = &self.metrics;
        let (route, class) = (self.record.route.clone(), self.record.class.clone());
        let (route, class) = (route.as_str(), class.as_str());
        if self.answered && !self.finished && self.cut.is_none() {
            // The response body was dropped before the stream ended: the client went away.
            self.cut = Some(Cut::ClientDisconnect);
        }
        if self.permit.is_some() && !self.answered && self.cut.is_none() && self.record.status == 0 {
            // Admitted, then the handler was dropped while waiting on the replica.
            self.cut = Some(Cut::ClientDisconnect);
        }
        let (tokens_in, tokens_out) = match self.usage {
            Some((p, c)) => (Some(p), Some(c)),
            None => (None, (self.chunks > 0).then_some(self.chunks)),
        };
        if let Some(cut) = self.cut {
            m.cancellations
                .with_label_values(&[route, class, cut.reason()])
                .inc();
            let wasted = u64::from(tokens_out.unwrap_or(0));
            if wasted > 0 {
                m.wasted_tokens
                    .with_label_values(&[route, class, cut.reason()])
                    .inc_by(wasted);
            }
            self.record.outcome = cut.reason().into();
            if self.record.status == 0 {
                // The client left before any answer: nginx's convention for "client closed request".
                self.record.status = 499;
            }
        } else if let Some(reason) = self.rejection {
            m.rejections.with_label_values(&[route, class, reason]).inc();
            self.record.outcome = reason.into();
        } else if self.record.outcome.is_empty() {
            self.record.outcome = "ok".into();
        }
        m.requests
            .with_label_values(&[route, class, status_label(self.record.status)])
            .inc();
        let duration = now - self.arrival;
        if let Some(s) = &self.series {
            s.duration.observe(duration.as_secs_f64());
            if self.finished && self.cut.is_none() {
                if let Some((p, c)) = self.usage {
                    s.prompt_tokens.inc_by(u64::from(p));
                    s.completion_tokens.inc_by(u64::from(c));
                }
                s.slo_requests.inc();
                if self.met_slo() {
                    s.goodput.inc();
                }
            }
        }
        if let Some(p) = &self.permit {
            self.record.queue_ms = Some(p.queue_wait.as_secs_f64() * 1e3);
        }
        self.record.ttft_ms = self.first_chunk.map(|t| (t - self.arrival).as_secs_f64() * 1e3);
        self.record.duration_ms = duration.as_secs_f64() * 1e3;
        self.record.tokens_in = tokens_in;
        self.record.tokens_out = tokens_out;
        if let Some(r) = &self.replica {
            self.record.replica = Some(r.replica.url.clone());
        }
        self.access.write(&self.record);
    }
}

impl Exchange {
    /// TTFT within the class's objective, and the mean gap between chunks within its ITL objective.
    fn met_slo(&self) -> bool {
        let Some(slo) = self.slo else { return true };
        let ttft_ok = match (slo.ttft, self.first_chunk) {
            (Some(limit), Some(first)) => first - self.arrival <= limit,
            (Some(limit), None) => self.last_chunk.unwrap_or_else(Instant::now) - self.arrival <= limit,
            (None, _) => true,
        };
        let itl_ok = match (slo.itl, self.first_chunk, self.last_chunk) {
            (Some(limit), Some(first), Some(last)) if self.chunks > 1 => {
                (last - first) / (self.chunks - 1) <= limit
            }
            _ => true,
        };
        ttft_ok && itl_ok
    }
}

/// Status codes as bounded label values.
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        413 => "413",
        429 => "429",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        s if s < 300 => "2xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}
