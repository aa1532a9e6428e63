//! One request through Envoy, as one `ext_proc` stream in full-duplex mode: the request's headers
//! and body come in, the same stages as the proxy's run on them, and the answer is an endpoint
//! list (the body sent back, rewritten as the proxy would send it) or an immediate refusal; then
//! the response passes through, read as the proxy's relay reads it, and its end (or the stream's
//! reset, when the client leaves) settles the request's ledger, which gives back its slot.

use super::Picker;
use super::envoy;
use crate::error::{Cut, GatewayError, Invalid};
use crate::event::{EarlyError, EventKind, Reader};
use crate::path::ledger::{Ending, Ledger};
use crate::path::prepare::{self, Api};
use crate::path::relay::{DONE_GRACE, MAX_EVENT, pass_on, too_large_message};
use crate::path::respond::{inserting, request_fields, server_timing};
use crate::path::upstream;
use crate::route::{Observation, Route, busy_retry_after};
use crate::state::Gateway;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use protocol::sse::EventSplitter;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Status, Streaming};

pub(super) type Out = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// What came in on the stream, and where answers go.
struct Stream {
    inbound: Streaming<ProcessingRequest>,
    out: Out,
}

impl Stream {
    /// The next message; `None` once Envoy has closed or reset the stream.
    async fn next(&mut self) -> Option<ProcessingRequest> {
        self.inbound.message().await.ok().flatten()
    }

    /// False once Envoy no longer listens.
    async fn send(&self, r: ProcessingResponse) -> bool {
        self.out.send(Ok(r)).await.is_ok()
    }

    async fn send_all(&self, rs: Vec<ProcessingResponse>) -> bool {
        for r in rs {
            if !self.send(r).await {
                return false;
            }
        }
        true
    }
}

/// Serves one `ext_proc` stream to its end.
pub(super) async fn run(
    g: Arc<Gateway>,
    picker: Arc<Picker>,
    inbound: Streaming<ProcessingRequest>,
    out: Out,
) {
    let mut s = Stream { inbound, out };
    let Some(first) = s.next().await else { return };
    let Some(Msg::RequestHeaders(h)) = &first.request else {
        let _ = s
            .out
            .send(Err(Status::invalid_argument(
                "the first message of a stream must be the request's headers",
            )))
            .await;
        return;
    };
    let path = envoy::pseudo(h, ":path").unwrap_or("/");
    let path = path.split('?').next().unwrap_or(path);
    let method = envoy::pseudo(h, ":method").unwrap_or("GET");
    let api = match (method, path) {
        ("POST", "/v1/chat/completions") => Some(Api::Chat),
        ("POST", "/v1/completions") => Some(Api::Completions),
        ("POST", "/v1/embeddings") => Some(Api::Embeddings),
        _ => None,
    };
    let subset = envoy::subset(&first);
    let headers = envoy::headers(h);
    let ends = h.end_of_stream;
    match (api, method, path) {
        (Some(api), ..) => inference(&g, &picker, &mut s, api, headers, subset, ends).await,
        (None, "GET", "/v1/models") => {
            // Answered here, as the proxy answers it: the public names, for the caller's key.
            let reply = match crate::serve::router::model_list(&g, &headers) {
                Ok(list) => {
                    let body = serde_json::to_vec(&list).unwrap_or_default();
                    picker.requests("answered");
                    envoy::immediate(StatusCode::OK, &json(), &body, "spillway_models")
                }
                Err(e) => {
                    picker.requests("refused");
                    refusal(&e, None)
                }
            };
            let _ = s.send(reply).await;
        }
        // Nothing else reaches a replica through the picker: as on the proxy's port, an unknown
        // path (a `%`-encoded one among them) is a 404, never passed on unadmitted.
        _ => {
            picker.requests("refused");
            let e = GatewayError::NotFound(crate::serve::router::UNKNOWN_PATH.into());
            let _ = s.send(refusal(&e, None)).await;
        }
    }
}

/// An inference request: stages 1–6 and a replica, as on the proxy's path, then its response.
async fn inference(
    g: &Gateway,
    picker: &Picker,
    s: &mut Stream,
    api: Api,
    headers: HeaderMap,
    subset: Option<Vec<String>>,
    ends: bool,
) {
    let id = prepare::request_id(&headers);
    let mut ex = Ledger::new(g.metrics.clone(), g.access.clone(), id);
    ex.trace = crate::traces::Trace::start(g.tracer.as_ref(), &headers, ex.arrival);
    let mut trailers = false;
    let picked = if g.is_draining() {
        Err(GatewayError::Draining)
    } else {
        match read_body(g, s, ends, &mut trailers).await {
            Some(Ok(body)) => {
                // While it waits in the queue, a reset (the client left) ends it: dropping the
                // stages gives its queue place back.
                let stages = pick(g, picker, api, &headers, &body, subset.as_deref(), &mut ex);
                tokio::select! {
                    r = stages => r,
                    () = gone(s, &mut trailers) => return,
                }
            }
            Some(Err(e)) => Err(e),
            None => return,
        }
    };
    let picked = match picked {
        Ok(p) => p,
        Err(e) => {
            picker.requests("refused");
            ex.fail(&e);
            let timing = server_timing(&ex);
            let _ = s.send(refusal(&e, Some((&timing, &ex)))).await;
            return;
        }
    };
    picker.requests("picked");
    let Picked {
        route,
        endpoints,
        body,
        strip_usage,
        stream,
        budgets,
    } = picked;
    let length = body.len().to_string();
    // The tenant's key is Spillway's, not the replica's: the proxy does not pass it on either.
    let mutation = envoy::mutation(
        &[
            (prepare::REQUEST_ID_HEADER, ex.record.id.as_bytes()),
            (header::CONTENT_LENGTH.as_str(), length.as_bytes()),
        ],
        &[header::AUTHORIZATION.as_str()],
    );
    let mut replies = vec![envoy::destination(&endpoints, mutation)];
    envoy::body(true, &body, !trailers, &mut replies);
    if trailers {
        replies.push(envoy::trailers(true));
    }
    ex.upstream_start = Some(Instant::now());
    if !s.send_all(replies).await {
        return;
    }
    let relay = Response {
        g,
        picker,
        route: &route,
        strip_usage,
        mode: Mode::Head,
        served: false,
        stream,
        budgets,
        last_data: Instant::now(),
        held: None,
        done_by: None,
    };
    relay.run(s, ex).await;
}

/// What the stages decided for a request that goes on.
struct Picked {
    route: Arc<Route>,
    /// `ip:port`, the first picked, then the fallbacks, comma-separated.
    endpoints: String,
    body: Bytes,
    strip_usage: bool,
    stream: bool,
    budgets: upstream::Budgets,
}

async fn pick(
    g: &Gateway,
    picker: &Picker,
    api: Api,
    headers: &HeaderMap,
    body: &Bytes,
    subset: Option<&[String]>,
    ex: &mut Ledger,
) -> Result<Picked, GatewayError> {
    let admitted = crate::path::admitted(g, None, api, headers, body, ex).await?;
    let route = admitted.route;
    let prepared = admitted.prepared;
    let pool = &route.classes[prepared.class].pool;
    let (endpoints, guard) = picker
        .endpoints(&route, pool, prepared.prefix_key, subset, |tried| {
            upstream::pick(&route, &prepared, tried, Instant::now(), ex)
        })
        .map_err(|e| e.unwrap_or_else(|| GatewayError::NoHealthyReplica(route.config.model.clone())))?;
    ex.replica = Some(guard);
    Ok(Picked {
        endpoints,
        body: prepared.body,
        strip_usage: !prepared.client_wants_usage,
        stream: prepared.stream,
        budgets: admitted.budgets,
        route,
    })
}

/// The request's body, whole, within `server.max_body_bytes` (413) and `server.body_timeout`
/// (408); `None` if the stream ended first. `trailers` learns whether trailers followed it.
async fn read_body(
    g: &Gateway,
    s: &mut Stream,
    ends: bool,
    trailers: &mut bool,
) -> Option<Result<Bytes, GatewayError>> {
    if ends {
        return Some(Ok(Bytes::new()));
    }
    let server = &g.config.server;
    let limit = server.max_body_bytes;
    let mut body = BytesMut::new();
    let reading = async {
        loop {
            match s.next().await?.request {
                Some(Msg::RequestBody(b)) => {
                    if body.len() + b.body.len() > limit {
                        return Some(Err(GatewayError::BodyTooLarge { limit }));
                    }
                    body.extend_from_slice(&b.body);
                    if b.end_of_stream {
                        return Some(Ok(()));
                    }
                }
                Some(Msg::RequestTrailers(_)) => {
                    *trailers = true;
                    return Some(Ok(()));
                }
                _ => {
                    return Some(Err(GatewayError::bad_request(
                        Invalid::Request,
                        "the request's body did not end before its response began",
                        None,
                    )));
                }
            }
        }
    };
    match tokio::time::timeout(server.body_timeout, reading).await {
        Ok(Some(Ok(()))) => Some(Ok(body.freeze())),
        Ok(Some(Err(e))) => Some(Err(e)),
        Ok(None) => None,
        Err(_) => Some(Err(GatewayError::BodyTimeout(server.body_timeout))),
    }
}

/// Resolves once Envoy closes or resets the stream; notes request trailers that come meanwhile.
async fn gone(s: &mut Stream, trailers: &mut bool) {
    while let Some(m) = s.next().await {
        if matches!(m.request, Some(Msg::RequestTrailers(_))) {
            *trailers = true;
        }
    }
}

/// The gateway's refusal as Envoy's immediate answer: the status, the OpenAI-shaped body and
/// every header the proxy would send with it (`Retry-After`, the rate limits, the request ID).
fn refusal(e: &GatewayError, ex: Option<(&str, &Ledger)>) -> ProcessingResponse {
    let (status, mut headers, body) = e.render();
    if let Some((timing, ex)) = ex {
        request_fields(timing, ex, &mut inserting(&mut headers));
    }
    envoy::immediate(status, &headers, &body, e.code())
}

/// Headers of a JSON answer the picker makes itself.
fn json() -> HeaderMap {
    HeaderMap::from_iter([(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    )])
}

/// How the response's body is read.
enum Mode {
    /// Its headers have not come yet.
    Head,
    /// A stream of SSE events: each timed, its usage read (and dropped if the client did not ask
    /// for it), the model renamed back.
    Events(EventSplitter, Reader),
    /// A whole answer, held until its end to read its usage and rename its model, within
    /// `server.max_response_bytes`; past it, passed on as it comes.
    Whole(BytesMut),
    /// Passed on unchanged: an error, or an answer too large to hold.
    Plain,
    /// Ended by the gateway (an event too large): nothing more is passed on.
    Cut,
}

struct Response<'a> {
    g: &'a Gateway,
    picker: &'a Picker,
    route: &'a Route,
    strip_usage: bool,
    mode: Mode,
    /// The replica's first token came (and was counted as its working).
    served: bool,
    stream: bool,
    /// The route's budgets, which the picker keeps as the proxy does: Envoy's own timeouts may
    /// be longer, or none, and a stalled replica would hold its slot until they end.
    budgets: upstream::Budgets,
    /// When the replica last sent anything (`stream_idle` counts from it).
    last_data: Instant,
    /// A stream's head, and the events before its first token, until that token.
    held: Option<(ProcessingResponse, BytesMut)>,
    /// Once `[DONE]` has come, when the replica's body must have ended (the relay's grace).
    done_by: Option<Instant>,
}

impl Response<'_> {
    /// Follows the response to its end or the stream's; the ledger settles when dropped here.
    async fn run(mut self, s: &mut Stream, mut ex: Ledger) {
        let mut stop = self.g.stop.subscribe();
        // One timer for the stream, moved only when it rings early (data came since it was set)
        // or the budget moved earlier: not re-armed for every chunk.
        let mut armed = self.due();
        let timer = tokio::time::sleep_until(armed);
        tokio::pin!(timer);
        loop {
            let due = self.due();
            if due < armed {
                armed = due;
                timer.as_mut().reset(due);
            }
            let cut = tokio::select! {
                m = s.next() => match m {
                    Some(m) => Ok(m),
                    None => break,
                },
                () = &mut timer => {
                    if Instant::now() < due {
                        armed = due;
                        timer.as_mut().reset(due);
                        continue;
                    }
                    if self.done_by.is_some() {
                        Err(None)
                    } else {
                        Err(Some(self.expired()))
                    }
                }
                _ = stop.wait_for(|stop| *stop) => Err(Some(Cut::Drain)),
            };
            let m = match cut {
                Ok(m) => m,
                Err(Some(cut)) => {
                    self.cut(s, &mut ex, cut).await;
                    return;
                }
                Err(None) => {
                    // `[DONE]` came and the replica's body has not ended since: the client has
                    // its whole stream, whose body ends here as if the replica's had, and Envoy
                    // closes the replica's request.
                    ex.record.note = Some("upstream_body_not_ended");
                    self.mode = Mode::Cut;
                    let mut replies = Vec::new();
                    envoy::body(false, &[], true, &mut replies);
                    let _ = s.send_all(replies).await;
                    return;
                }
            };
            if !matches!(m.request, Some(Msg::RequestTrailers(_))) {
                self.last_data = Instant::now();
            }
            let mut replies = Vec::new();
            let end = match m.request {
                Some(Msg::ResponseHeaders(ref h)) => {
                    let status = envoy::pseudo(h, ":status")
                        .and_then(|s| s.parse::<u16>().ok())
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .unwrap_or(StatusCode::BAD_GATEWAY);
                    let served = envoy::served(&m);
                    let headers = envoy::headers(h);
                    let head = self.head(&mut ex, status, served.as_deref(), &headers);
                    if matches!(self.mode, Mode::Events(..)) && !h.end_of_stream {
                        // As the proxy does, a stream's head waits for its first token, so that
                        // a replica that never sends one still gets the client a clean 504.
                        self.held = Some((head, BytesMut::new()));
                    } else {
                        replies.push(head);
                    }
                    if h.end_of_stream {
                        self.finish(&mut ex);
                    }
                    h.end_of_stream
                }
                Some(Msg::ResponseBody(ref b)) => {
                    let answered = self.chunk(&mut ex, &b.body, b.end_of_stream, &mut replies);
                    b.end_of_stream || answered
                }
                Some(Msg::ResponseTrailers(_)) => {
                    // The body's end came with the trailers rather than its last chunk.
                    if let Some((head, body)) = self.held.take() {
                        replies.push(head);
                        envoy::body(false, &body, false, &mut replies);
                    }
                    let rest = self.tail(&mut ex);
                    if !rest.is_empty() {
                        envoy::body(false, &rest, false, &mut replies);
                    }
                    self.finish(&mut ex);
                    replies.push(envoy::trailers(false));
                    true
                }
                Some(Msg::RequestTrailers(_)) => {
                    replies.push(envoy::trailers(true));
                    false
                }
                _ => false,
            };
            if !s.send_all(replies).await || end {
                return;
            }
        }
        // Envoy reset the stream before the response ended: the client left (the ledger's
        // default ending, 499), or Envoy gave up on the replica.
    }

    /// When the next budget runs out: the first token's (or a whole answer's total) until the
    /// first token, then `stream_idle` since the last data, never past the total.
    fn due(&self) -> Instant {
        let b = &self.budgets;
        if let Some(by) = self.done_by {
            return by.min(b.deadline);
        }
        if !self.served && self.stream {
            return b.first_token_deadline;
        }
        if !self.stream {
            return b.deadline;
        }
        (self.last_data + self.route.config.timeouts.stream_idle).min(b.deadline)
    }

    /// Which budget [`Response::due`] was.
    fn expired(&self) -> Cut {
        let now = Instant::now();
        if now >= self.budgets.deadline {
            Cut::Deadline
        } else if self.stream && !self.served {
            Cut::FirstToken
        } else {
            Cut::Idle
        }
    }

    /// Ends the request as the proxy would: before the response's head, a 504 (or 503 in the
    /// drain) in Envoy's place; in a stream, an SSE error event that ends its body; in a whole
    /// answer whose head went out, a failed gRPC stream, which makes Envoy reset it. Envoy then
    /// closes the replica's request.
    async fn cut(&mut self, s: &mut Stream, ex: &mut Ledger, cut: Cut) {
        if let Some(r) = &ex.replica
            && matches!(cut, Cut::FirstToken | Cut::Idle | Cut::Deadline)
        {
            self.route.observe(&r.replica, Observation::TimedOut);
        }
        let message = match cut {
            Cut::FirstToken => format!(
                "no first token within {:?} (first_token)",
                self.budgets.first_token
            ),
            Cut::Idle => format!(
                "no chunk from the replica for {:?} (stream_idle)",
                self.route.config.timeouts.stream_idle
            ),
            Cut::Deadline => "the request's total time budget ran out".to_owned(),
            _ => "the gateway is shutting down and its drain time ran out".to_owned(),
        };
        let before_head = self.held.take().is_some() || matches!(self.mode, Mode::Head);
        if before_head {
            let e = match cut {
                Cut::FirstToken => GatewayError::FirstTokenTimeout(self.budgets.first_token),
                Cut::Deadline => GatewayError::DeadlineExceeded(self.budgets.total),
                _ => GatewayError::Draining,
            };
            ex.end(Ending::Cut(cut), e.status());
            let timing = server_timing(ex);
            let _ = s.send(refusal(&e, Some((&timing, ex)))).await;
        } else if matches!(self.mode, Mode::Events(..)) {
            ex.end(Ending::Cut(cut), StatusCode::OK);
            let mut replies = Vec::new();
            envoy::body(false, &GatewayError::stream_cut(cut, message), true, &mut replies);
            let _ = s.send_all(replies).await;
        } else {
            ex.end(Ending::Cut(cut), StatusCode::OK);
            let _ = s.out.send(Err(Status::deadline_exceeded(message))).await;
        }
        self.mode = Mode::Cut;
    }

    /// The response's head: which replica served it (Envoy may have retried down the list), what
    /// its status says of that replica, and how its body will be read.
    fn head(
        &mut self,
        ex: &mut Ledger,
        status: StatusCode,
        served: Option<&str>,
        headers: &HeaderMap,
    ) -> ProcessingResponse {
        ex.upstream_first_byte = Some(Instant::now());
        ex.answering(status);
        if let Some(served) = served.and_then(|s| s.parse::<SocketAddr>().ok()) {
            self.moved_to(ex, served);
        }
        let event_stream = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if let Some(r) = &ex.replica {
            let seen = match status {
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Some(Observation::Busy {
                    retry_after: retry_after(headers),
                }),
                s if s.is_server_error() => Some(Observation::Failed),
                s if s.is_client_error() => Some(Observation::ClientError),
                // A stream works once its first token comes.
                _ if event_stream => None,
                _ => Some(Observation::Served),
            };
            if let Some(seen) = seen {
                self.route.observe(&r.replica, seen);
            }
        }
        self.mode = if !status.is_success() {
            Mode::Plain
        } else if event_stream {
            Mode::Events(EventSplitter::default(), Reader::default())
        } else {
            Mode::Whole(BytesMut::new())
        };
        let timing = server_timing(ex);
        let mut fields = HeaderMap::new();
        request_fields(&timing, ex, &mut inserting(&mut fields));
        // A body the picker changes (a model renamed, usage dropped) is no longer that long.
        let remove: &[&str] = if status.is_success() {
            &["content-length"]
        } else {
            &[]
        };
        envoy::response_headers(envoy::mutation_of(&fields, remove))
    }

    /// Envoy served the request from another endpoint of the list than the first: the request's
    /// in-flight count moves to that replica. Why Envoy moved on (a refused connection, or a 503
    /// that is only backpressure) is not known here, so the first is not marked failed: its
    /// health checks judge it.
    fn moved_to(&self, ex: &mut Ledger, served: SocketAddr) {
        let Some(r) = &ex.replica else { return };
        if self.picker.address(&r.replica.url) == Some(served) {
            return;
        }
        let Some(index) = self
            .route
            .replicas
            .iter()
            .position(|x| self.picker.address(&x.url) == Some(served))
        else {
            return;
        };
        ex.record.retries += 1;
        ex.slo_sample = None;
        ex.replica = Some(self.route.replicas[index].hold(index));
    }

    /// One chunk of the response's body; true when the picker answered in Envoy's place and the
    /// stream is over for it.
    fn chunk(
        &mut self,
        ex: &mut Ledger,
        data: &[u8],
        end: bool,
        replies: &mut Vec<ProcessingResponse>,
    ) -> bool {
        let limit = self.g.config.server.max_response_bytes;
        let mut out = BytesMut::new();
        match &mut self.mode {
            Mode::Events(splitter, reader) => {
                let now = Instant::now();
                let rename = self.route.rename.as_deref();
                let strip = self.strip_usage;
                let mut tokens = false;
                let mut first = false;
                let holding = self.held.is_some();
                let mut early = None;
                splitter.feed_slices(data, |e| {
                    if early.is_some() {
                        return;
                    }
                    let e = reader.read(e);
                    // An error in place of the first token is answered as the status it names,
                    // as the proxy answers it: the head has not gone out.
                    if holding && !first && e.kind() == EventKind::Error {
                        early = Some(e.early_error());
                        return;
                    }
                    let kind = pass_on(ex, &e, now, rename, strip, &mut out);
                    tokens |= kind == EventKind::Tokens;
                    first |= kind != EventKind::Other;
                });
                if let Some(early) = early {
                    self.held = None;
                    self.mode = Mode::Cut;
                    replies.push(self.early_error(ex, early));
                    return true;
                }
                if let Some((_, body)) = &mut self.held
                    && !first
                    && !end
                    && splitter.held() <= MAX_EVENT
                {
                    // Still before the first token: held with the head.
                    body.extend_from_slice(&out);
                    return false;
                }
                if let Some((head, body)) = self.held.take() {
                    replies.push(head);
                    let mut all = body;
                    all.extend_from_slice(&out);
                    out = all;
                }
                if tokens
                    && !self.served
                    && let Some(r) = &ex.replica
                {
                    // Its first event with tokens: the replica works.
                    self.served = true;
                    self.route.observe(&r.replica, Observation::Served);
                }
                if ex.ended() && self.done_by.is_none() {
                    // `[DONE]` has come: the body's end should follow at once.
                    self.done_by = Some(now + DONE_GRACE);
                }
                if splitter.held() > MAX_EVENT {
                    out.extend_from_slice(&splitter.rest());
                    ex.end(Ending::Cut(Cut::Upstream), StatusCode::OK);
                    out.extend_from_slice(&GatewayError::stream_cut(Cut::Upstream, too_large_message()));
                    self.mode = Mode::Cut;
                }
            }
            Mode::Whole(held) => {
                if held.len() + data.len() > limit {
                    // Too large to hold: what is held, and the rest, goes on as it is.
                    out.extend_from_slice(held);
                    out.extend_from_slice(data);
                    ex.record.note = Some("response_not_read");
                    self.mode = Mode::Plain;
                } else {
                    held.extend_from_slice(data);
                }
            }
            Mode::Plain | Mode::Head => out.extend_from_slice(data),
            // The client has had the stream's error event: what follows it is not passed on.
            Mode::Cut => {}
        }
        if end {
            out.extend_from_slice(&self.tail(ex));
            self.finish(ex);
        }
        envoy::body(false, &out, end, replies);
        false
    }

    /// The answer to an error event that came before the first token: a busy replica's 429/503
    /// becomes the gateway's 503 with `Retry-After` (the proxy would have tried another replica;
    /// here Envoy has sent the request already), the replica's other 4xx goes to the client as it
    /// was, anything else is a 502.
    fn early_error(&self, ex: &mut Ledger, early: EarlyError) -> ProcessingResponse {
        let replica = ex.replica.as_ref().map(|r| (r.replica.clone(), r.index));
        let observe = |seen| {
            if let Some((r, _)) = &replica {
                self.route.observe(r, seen);
            }
        };
        let timing = server_timing(ex);
        match early.status {
            Some(status @ (StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE)) => {
                let retry_after = busy_retry_after(None);
                observe(Observation::Busy { retry_after });
                let e = GatewayError::UpstreamBusy {
                    route: self.route.config.model.clone(),
                    replica: replica.map_or(0, |(_, i)| i),
                    status,
                    retry_after,
                };
                ex.fail(&e);
                refusal(&e, Some((&timing, ex)))
            }
            Some(status) if status.is_client_error() => {
                observe(Observation::ClientError);
                ex.end(Ending::UpstreamRejected, status);
                let mut headers = json();
                request_fields(&timing, ex, &mut inserting(&mut headers));
                envoy::immediate(status, &headers, &early.body, "upstream_rejected")
            }
            status => {
                observe(Observation::Failed);
                let named = status.map_or_else(|| "an error".to_owned(), |s| s.to_string());
                let e = GatewayError::upstream(format!(
                    "route '{}' replica answered {named} in its stream before the first token",
                    self.route.config.model
                ));
                ex.fail(&e);
                refusal(&e, Some((&timing, ex)))
            }
        }
    }

    /// What goes out at the body's end besides what came: a whole answer held till now (usage
    /// read, model renamed), or a stream's error event if it ended before `[DONE]`.
    fn tail(&mut self, ex: &mut Ledger) -> Bytes {
        match std::mem::replace(&mut self.mode, Mode::Plain) {
            Mode::Whole(held) => {
                let (body, usage) = crate::event::read_whole(held.freeze(), self.route.rename.as_deref());
                ex.trace.finish_reasons(&body);
                ex.whole_answer(Instant::now(), usage);
                ex.end(Ending::Finished, StatusCode::OK);
                body
            }
            Mode::Events(mut splitter, _) => {
                let mut out = BytesMut::new();
                let rest = splitter.rest();
                crate::path::relay::last_event(
                    ex,
                    &rest,
                    self.route.rename.as_deref(),
                    self.strip_usage,
                    &mut out,
                );
                if !ex.ended() {
                    if !out.is_empty() && !out.ends_with(b"\n\n") {
                        out.extend_from_slice(b"\n\n");
                    }
                    ex.end(Ending::Cut(Cut::Upstream), StatusCode::OK);
                    out.extend_from_slice(&GatewayError::stream_cut(
                        Cut::Upstream,
                        "the replica ended the stream early",
                    ));
                }
                out.freeze()
            }
            Mode::Plain | Mode::Head | Mode::Cut => Bytes::new(),
        }
    }

    /// The response ended: how, for the ledger, if its body has not said already.
    fn finish(&mut self, ex: &mut Ledger) {
        if ex.ended() {
            return;
        }
        let Some(status) = ex.status() else { return };
        if status.is_success() {
            // A whole answer too large to read, or one without a body.
            ex.end(Ending::Finished, status);
            return;
        }
        let e = if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            GatewayError::UpstreamBusy {
                route: self.route.config.model.clone(),
                replica: ex.replica.as_ref().map_or(0, |r| r.index),
                status,
                retry_after: busy_retry_after(None),
            }
        } else if status.is_client_error() {
            ex.end(Ending::UpstreamRejected, status);
            return;
        } else {
            GatewayError::upstream(format!("the replica answered {status}"))
        };
        ex.end(Ending::Failed(e.reason()), status);
    }
}

/// A busy replica's `Retry-After`, as the proxy reads it: whole seconds.
fn retry_after(headers: &HeaderMap) -> std::time::Duration {
    busy_retry_after(
        headers
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok()),
    )
}
