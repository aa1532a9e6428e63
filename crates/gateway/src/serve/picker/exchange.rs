//! One request through Envoy, as one `ext_proc` stream in full-duplex mode: the request's headers
//! and body come in, the same stages as the proxy's run on them, and the answer is an endpoint
//! list (the body sent back, rewritten as the proxy would send it) or an immediate refusal; then
//! the response passes through, read as the proxy's relay reads it, and its end (or the stream's
//! reset, when the client leaves) settles the request's ledger, which gives back its slot.

use super::Picker;
use super::envoy;
use crate::error::{Cut, GatewayError, Invalid};
use crate::event::EarlyError;
use crate::path::api::Api;
use crate::path::ledger::{Ending, Ledger};
use crate::path::relay::{Events, Opening, Rang, Whole};
use crate::path::respond::{inserting, request_fields, server_timing};
use crate::path::upstream;
use crate::path::verdict::judge;
use crate::path::{BodySource, read_body};
use crate::route::{Observation, Route};
use crate::state::Gateway;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
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
    let api = (method == "POST").then(|| Api::at(path)).flatten();
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
        // A stored response, asked of the replica that made it by the picker itself, as the
        // proxy asks it: Envoy gets the replica's answer as an immediate one.
        (None, method, path) if let Some((ask, id)) = crate::path::stored::asked(method, path) => {
            let request_id = crate::path::hints::request_id(&headers);
            let reply = match crate::path::stored::reply(&g, ask, id, &headers, request_id).await {
                Ok((status, body)) => {
                    picker.requests("answered");
                    envoy::immediate(status, &json(), &body, "spillway_stored_response")
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
    let id = crate::path::hints::request_id(&headers);
    let mut ex = Ledger::new(g.metrics.clone(), g.access.clone(), id);
    ex.start_trace(g.tracer.as_ref(), &headers);
    crate::path::came_in(g, api, &mut ex);
    let mut trailers = false;
    let picked = if g.is_draining() {
        Err(GatewayError::Draining)
    } else {
        let mut source = EnvoyBody {
            s,
            ended: ends,
            trailers: false,
            gone: false,
        };
        let read = read_body(&mut source, &g.config.server).await;
        trailers = source.trailers;
        if source.gone {
            return;
        }
        match read {
            Ok(body) => {
                // While it waits in the queue, a reset (the client left) ends it: dropping the
                // stages gives its queue place back.
                let stages = pick(g, picker, api, &headers, &body, subset.as_deref(), &mut ex);
                tokio::select! {
                    r = stages => r,
                    () = gone(s, &mut trailers) => return,
                }
            }
            Err(e) => Err(e),
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
            (crate::path::hints::REQUEST_ID_HEADER, ex.id().as_bytes()),
            (header::CONTENT_LENGTH.as_str(), length.as_bytes()),
        ],
        &[header::AUTHORIZATION.as_str(), crate::path::hints::API_KEY_HEADER],
    );
    let mut replies = vec![envoy::destination(&endpoints, mutation)];
    envoy::body(true, &body, !trailers, &mut replies);
    if trailers {
        replies.push(envoy::trailers(true));
    }
    ex.calling(Instant::now());
    if !s.send_all(replies).await {
        return;
    }
    let events = Events::new(
        ex.dialect(),
        route.rename.clone(),
        strip_usage,
        &budgets,
        route.config.timeouts.stream_idle,
        Instant::now(),
    );
    let relay = Response {
        g,
        picker,
        route: &route,
        mode: Mode::Head,
        events,
        stream,
        budgets,
        held: None,
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
    if prepared.background {
        // The picker's ledger ends with Envoy's answer: it cannot hold the slot after it.
        return Err(GatewayError::bad_request(
            crate::error::Invalid::Request,
            "'background' requests are held only on the gateway's own port (agents.background: hold); through Envoy they are refused",
            Some("background"),
        ));
    }
    let pool = &route.classes[prepared.class].pool;
    let (endpoints, guard) = picker
        .endpoints(
            &route,
            pool,
            prepared.prefix_key,
            prepared.pinned.is_some(),
            subset,
            |tried| upstream::pick(&route, &prepared, tried, Instant::now(), ex),
        )
        .map_err(|e| e.unwrap_or_else(|| GatewayError::NoHealthyReplica(route.config.model.clone())))?;
    ex.picked(guard);
    Ok(Picked {
        endpoints,
        body: prepared.body,
        strip_usage: !prepared.client_wants_usage,
        stream: prepared.stream,
        budgets: admitted.budgets,
        route,
    })
}

/// The request's body as Envoy's messages bring it, for the request path's one reader
/// ([`read_body`]).
struct EnvoyBody<'a> {
    s: &'a mut Stream,
    /// The body ended (with the headers, its last message, or trailers).
    ended: bool,
    /// Trailers followed it.
    trailers: bool,
    /// Envoy closed or reset the stream before the body ended.
    gone: bool,
}

impl BodySource for EnvoyBody<'_> {
    async fn next(&mut self) -> Result<Option<Bytes>, GatewayError> {
        if self.ended {
            return Ok(None);
        }
        let Some(m) = self.s.next().await else {
            self.gone = true;
            return Ok(None);
        };
        match m.request {
            Some(Msg::RequestBody(b)) => {
                self.ended = b.end_of_stream;
                Ok(Some(Bytes::from(b.body)))
            }
            Some(Msg::RequestTrailers(_)) => {
                self.ended = true;
                self.trailers = true;
                Ok(None)
            }
            _ => Err(GatewayError::bad_request(
                Invalid::Request,
                "the request's body did not end before its response began",
                None,
            )),
        }
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
    let shape = ex.map(|(_, ex)| ex.shape()).unwrap_or_default();
    let (status, mut headers, body) = e.render_as(shape);
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
    /// A stream of SSE events, fed to the relay's [`Events`] as the proxy's relay feeds them.
    Events,
    /// A whole answer, held until its end to read its usage and rename its model, within
    /// `server.max_response_bytes`, as the proxy holds it.
    Whole(Whole),
    /// Passed on unchanged: the replica's error answer.
    Plain,
    /// Ended by the gateway: nothing more is passed on.
    Cut,
}

/// What woke the response's loop: a message (`None`: Envoy ended the stream), the timer, or the
/// drain running out.
// Lives for one `match` on the stack, as the message itself would.
#[allow(clippy::large_enum_variant)]
enum Woke {
    Message(Option<ProcessingRequest>),
    Timer,
    Drain,
}

struct Response<'a> {
    g: &'a Gateway,
    picker: &'a Picker,
    route: &'a Route,
    mode: Mode,
    /// The stream's events and clocks (the first token's budget runs before its head comes).
    events: Events,
    stream: bool,
    /// The route's budgets, which the picker keeps as the proxy does: Envoy's own timeouts may
    /// be longer, or none, and a stalled replica would hold its slot until they end.
    budgets: upstream::Budgets,
    /// The response's head and its status, held until the answer may begin: a stream's first
    /// token, a whole answer's end.
    held: Option<(ProcessingResponse, StatusCode)>,
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
            let woke = tokio::select! {
                m = s.next() => Woke::Message(m),
                () = &mut timer => Woke::Timer,
                _ = stop.wait_for(|stop| *stop) => Woke::Drain,
            };
            let m = match woke {
                Woke::Message(Some(m)) => m,
                Woke::Message(None) => break,
                Woke::Timer if self.rang(s, &mut ex).await => return,
                Woke::Timer => {
                    armed = self.due();
                    timer.as_mut().reset(armed);
                    continue;
                }
                Woke::Drain => {
                    self.cut(s, &mut ex, Cut::Drain).await;
                    return;
                }
            };
            let mut replies = Vec::new();
            let over = match m.request {
                Some(Msg::ResponseHeaders(ref h)) => {
                    let status = envoy::pseudo(h, ":status")
                        .and_then(|s| s.parse::<u16>().ok())
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .unwrap_or(StatusCode::BAD_GATEWAY);
                    let served = envoy::served(&m);
                    let headers = envoy::headers(h);
                    let head = self.head(&mut ex, status, served.as_deref(), &headers);
                    if matches!(self.mode, Mode::Events | Mode::Whole(_)) && !h.end_of_stream {
                        // As the proxy does, the head waits for a stream's first token (so that
                        // a replica that never sends one still gets the client a clean 504), and
                        // for a whole answer's end.
                        self.held = Some((head, status));
                    } else {
                        ex.answering(status);
                        replies.push(head);
                    }
                    if h.end_of_stream {
                        self.finish(&mut ex);
                    }
                    h.end_of_stream
                }
                Some(Msg::ResponseBody(ref b)) => {
                    self.chunk(&mut ex, &b.body, b.end_of_stream, false, &mut replies);
                    b.end_of_stream || matches!(self.mode, Mode::Cut)
                }
                Some(Msg::ResponseTrailers(_)) => {
                    // The body's end came with the trailers rather than its last chunk.
                    self.chunk(&mut ex, &[], true, true, &mut replies);
                    if !matches!(self.mode, Mode::Cut) {
                        replies.push(envoy::trailers(false));
                    }
                    true
                }
                Some(Msg::RequestTrailers(_)) => {
                    replies.push(envoy::trailers(true));
                    false
                }
                _ => false,
            };
            if !s.send_all(replies).await || over {
                return;
            }
        }
        // Envoy reset the stream before the response ended: the client left (the ledger's
        // default ending, 499), or Envoy gave up on the replica.
    }

    /// When the next budget runs out: a stream's, by its [`Events`] (the first token's, then
    /// `stream_idle` since the last data, never past the total); a whole answer's total.
    fn due(&self) -> Instant {
        if self.stream {
            self.events.due()
        } else {
            self.budgets.deadline
        }
    }

    /// The timer rang: true if it ended the request.
    async fn rang(&mut self, s: &mut Stream, ex: &mut Ledger) -> bool {
        let now = Instant::now();
        if !matches!(self.mode, Mode::Events) {
            if now < self.due() {
                return false;
            }
            let cut = if now >= self.budgets.deadline || !self.stream {
                Cut::Deadline
            } else {
                Cut::FirstToken
            };
            self.cut(s, ex, cut).await;
            return true;
        }
        match self.events.rang(ex, now) {
            Rang::NotYet(_) => false,
            Rang::Late(e) => {
                self.timed_out(ex);
                let _ = s.send(self.refuse(ex, &e)).await;
                true
            }
            Rang::Ended(cut) => {
                if cut.is_some() {
                    self.timed_out(ex);
                }
                // Cut, or `[DONE]` came and the replica's body has not ended since: the client
                // has its whole stream, whose body ends here as if the replica's had, and Envoy
                // closes the replica's request.
                let mut replies = Vec::new();
                envoy::body(false, &self.events.take_out(), true, &mut replies);
                self.mode = Mode::Cut;
                let _ = s.send_all(replies).await;
                true
            }
        }
    }

    /// The replica did not answer in time.
    fn timed_out(&self, ex: &Ledger) {
        if let Some(r) = ex.replica() {
            self.route.observe(&r.replica, Observation::TimedOut);
        }
    }

    /// Ends the request as the proxy would at `cut` (the drain, or a budget before a stream's
    /// events): before the response's head, a 504 (or 503 in the drain) in Envoy's place; in a
    /// stream, an SSE error event that ends its body; in an error answer whose head went out, a
    /// failed gRPC stream, which makes Envoy reset it. Envoy then closes the replica's request.
    async fn cut(&mut self, s: &mut Stream, ex: &mut Ledger, cut: Cut) {
        if cut != Cut::Drain {
            self.timed_out(ex);
        }
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
        } else if matches!(self.mode, Mode::Events) {
            self.events.drained(ex);
            let mut replies = Vec::new();
            envoy::body(false, &self.events.take_out(), true, &mut replies);
            let _ = s.send_all(replies).await;
        } else {
            ex.end(Ending::Cut(cut), StatusCode::OK);
            let message = match cut {
                Cut::FirstToken => "no first token within the first_token budget",
                Cut::Deadline => "the request's total time budget ran out",
                _ => "the gateway is shutting down and its drain time ran out",
            };
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
        ex.first_byte(Instant::now());
        if let Some(served) = served.and_then(|s| s.parse::<SocketAddr>().ok()) {
            self.moved_to(ex, served);
        }
        let event_stream = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if let Some(r) = ex.replica() {
            let seen = if status.is_success() {
                // A stream works once its first token comes.
                (!event_stream).then_some(Observation::Served)
            } else {
                Some(judge(Some(status), retry_after(headers)).observation())
            };
            if let Some(seen) = seen {
                self.route.observe(&r.replica, seen);
            }
        }
        self.mode = if !status.is_success() {
            Mode::Plain
        } else if event_stream {
            Mode::Events
        } else {
            Mode::Whole(Whole::new(self.g.config.server.max_response_bytes))
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
        let Some(r) = ex.replica() else { return };
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
        ex.moved(self.route.replicas[index].hold(index));
    }

    /// The held head goes out, with the body's first bytes.
    fn release(&mut self, ex: &mut Ledger, replies: &mut Vec<ProcessingResponse>) {
        if let Some((head, status)) = self.held.take() {
            ex.answering(status);
            replies.push(head);
        }
    }

    /// One chunk of the response's body (the last if `end`, then with `trailers` to follow); the
    /// mode turns `Cut` when the picker answered in Envoy's place or ended the body, and the
    /// stream is over for it.
    fn chunk(
        &mut self,
        ex: &mut Ledger,
        data: &[u8],
        end: bool,
        trailers: bool,
        replies: &mut Vec<ProcessingResponse>,
    ) {
        let out = match &mut self.mode {
            Mode::Events => {
                if !data.is_empty() {
                    self.events.feed(ex, data, Instant::now());
                }
                if self.held.is_some() {
                    let opened = match self.events.opening(ex) {
                        Ok(Opening::Hold) if !end => return,
                        Ok(Opening::Hold) => Err(Events::closed_before_first_token()),
                        Ok(Opening::Stream) => Ok(()),
                        Ok(Opening::Error(early)) => {
                            self.held = None;
                            self.mode = Mode::Cut;
                            replies.push(self.early_error(ex, early));
                            return;
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = opened {
                        self.observe(ex, Observation::Failed);
                        replies.push(self.refuse(ex, &e));
                        return;
                    }
                    // Its first event with tokens: the replica works.
                    self.observe(ex, Observation::Served);
                    self.release(ex, replies);
                } else {
                    self.events.streamed(ex);
                }
                if end && !self.events.is_done() {
                    self.events.ended(ex);
                }
                self.events.take_out()
            }
            Mode::Whole(whole) => {
                if let Err(e) = whole.feed(data) {
                    replies.push(self.refuse(ex, &e));
                    return;
                }
                if !end {
                    return;
                }
                let Mode::Whole(whole) = std::mem::replace(&mut self.mode, Mode::Plain) else {
                    return;
                };
                self.release(ex, replies);
                whole.finish(ex, self.route.rename.as_deref())
            }
            Mode::Plain | Mode::Head => Bytes::copy_from_slice(data),
            // The client has had the stream's error event: what follows it is not passed on.
            Mode::Cut => return,
        };
        let done = self.events.is_done();
        if end {
            self.finish(ex);
        }
        envoy::body(false, &out, (end && !trailers) || done, replies);
        if done {
            self.mode = Mode::Cut;
        }
    }

    /// What the replica's health learns, of the replica that answered.
    fn observe(&self, ex: &Ledger, seen: Observation) {
        if let Some(r) = ex.replica() {
            self.route.observe(&r.replica, seen);
        }
    }

    /// The request fails with `e` before its head went out: the gateway answers in Envoy's place.
    fn refuse(&mut self, ex: &mut Ledger, e: &GatewayError) -> ProcessingResponse {
        self.held = None;
        self.mode = Mode::Cut;
        ex.fail(e);
        let timing = server_timing(ex);
        refusal(e, Some((&timing, ex)))
    }

    /// The answer to an error event that came before the first token, judged as the proxy judges
    /// it ([`judge`]): a busy replica's becomes the gateway's 503 with `Retry-After` (the proxy
    /// would have tried another replica; here Envoy has sent the request already), the replica's
    /// other 4xx goes to the client as it was, anything else is a 502.
    fn early_error(&mut self, ex: &mut Ledger, early: EarlyError) -> ProcessingResponse {
        let verdict = judge(early.status, None);
        self.observe(ex, verdict.observation());
        let index = ex.replica().map_or(0, |r| r.index);
        let how = " in its stream before the first token";
        match verdict.into_result(&self.route.config.model, index, how) {
            Ok(status) => {
                ex.end(Ending::UpstreamRejected, status);
                let timing = server_timing(ex);
                let mut headers = json();
                request_fields(&timing, ex, &mut inserting(&mut headers));
                envoy::immediate(status, &headers, &early.body, "upstream_rejected")
            }
            Err(e) => self.refuse(ex, &e),
        }
    }

    /// The response ended: how, for the ledger, if its body has not said already; a replica's
    /// error answer as the proxy judges it ([`judge`]).
    fn finish(&mut self, ex: &mut Ledger) {
        if ex.ended() {
            return;
        }
        let Some(status) = ex.status() else { return };
        if status.is_success() {
            // An answer without a body.
            ex.end(Ending::Finished, status);
            return;
        }
        let index = ex.replica().map_or(0, |r| r.index);
        match judge(Some(status), None).into_result(&self.route.config.model, index, "") {
            Ok(status) => ex.end(Ending::UpstreamRejected, status),
            Err(e) => ex.end(Ending::Failed(e.reason()), status),
        }
    }
}

/// A busy replica's `Retry-After`, as the proxy's client reads it: whole seconds.
fn retry_after(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}
