//! The HTTP side of a replica: vLLM's OpenAI routes, `/health`, `/metrics`, the admin endpoint,
//! and an accept loop that can refuse connections or die on command.

use crate::agents;
use crate::agents::store::ResponseStore;
use crate::clock::unix_now;
use crate::engine::{Engine, GenerateParams, Generation, ListenerState};
use crate::faults::FaultPatch;
use crate::reply::{check_model, error_response};
use crate::scheduler::{FinishReason, Progress};
use crate::stream::{Render, RenderKind, TokenStream};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRef, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use protocol::ApiError;
use protocol::error::parse_json;
use protocol::openai::{
    ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ModelCard, ModelList, Prompt, StreamOptions,
};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokenize::chat_prompt;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Request bodies above this are refused with 413, long before they could hold a valid prompt.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// What the routes share: the engine, and the response store when it is on (one per replica,
/// as vLLM's lives in its API server).
#[derive(Clone)]
struct App {
    engine: Engine,
    store: Option<Arc<ResponseStore>>,
}

impl FromRef<App> for Engine {
    fn from_ref(app: &App) -> Engine {
        app.engine.clone()
    }
}

/// The router of one replica.
pub fn router(engine: Engine) -> Router {
    let store = engine
        .config()
        .responses_store
        .map(|limit| Arc::new(ResponseStore::new(limit.max_bytes)));
    let app = App { engine, store };
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(retrieve_response))
        .route("/v1/responses/{id}/cancel", post(cancel_response))
        .route("/metrics", get(metrics))
        .route("/admin/faults", get(get_faults).post(post_faults))
        .route("/admin/state", get(state))
        .route("/admin/lateness/reset", post(reset_lateness))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app)
}

/// Serves `engine` on `listener` until `shutdown` resolves, following the engine's listener state:
/// refusing closes the socket (and idle connections), crashing also cuts every open connection.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let app = router(engine.clone());
    let mut listener = Some(listener);
    let mut state = engine.listener_state();
    let (conn_cmd, _) = watch::channel(ListenerState::Serving);
    tokio::pin!(shutdown);
    loop {
        let now = *state.borrow_and_update();
        match now {
            ListenerState::Serving if listener.is_none() => listener = Some(rebind(addr).await?),
            ListenerState::Serving => {}
            ListenerState::Refusing | ListenerState::Crashed => listener = None,
        }
        conn_cmd.send_replace(now);
        tokio::select! {
            _ = &mut shutdown => break,
            changed = state.changed() => if changed.is_err() { break },
            accepted = accept(listener.as_ref()) => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(stream, app.clone(), conn_cmd.subscribe()));
            }
        }
    }
    conn_cmd.send_replace(ListenerState::Refusing);
    Ok(())
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Connections held for the accept loop, handshake done (capped by `net.core.somaxconn`), as
/// the gateway's listener holds them (`gateway::bind`): `TcpListener::bind`'s 128 drops a burst
/// of new clients' handshakes past it, to be retried a second later.
const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `addr` as `TcpListener::bind` does (address reuse), with a backlog of
/// 4,096 (`LISTEN_BACKLOG`). The gateway has its own: it does not depend on the engine.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds the same address again after a refusal; the port may take a moment to be free.
async fn rebind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let mut last = None;
    for _ in 0..50 {
        match listen(addr) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("rebind failed")))
}

async fn connection(stream: tokio::net::TcpStream, app: Router, mut cmd: watch::Receiver<ListenerState>) {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            changed = cmd.changed() => {
                let state = if changed.is_err() { ListenerState::Refusing } else { *cmd.borrow_and_update() };
                match state {
                    ListenerState::Crashed => return,
                    ListenerState::Refusing if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ => {}
                }
                if changed.is_err() {
                    // The server is gone: finish what this connection has in flight, then stop.
                    let _ = conn.as_mut().await;
                    return;
                }
            }
        }
    }
}

fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::vllm(
            413,
            "RequestEntityTooLarge",
            format!("request body exceeds the {MAX_BODY}-byte limit"),
            None,
        )
    } else {
        ApiError::bad_request(format!("cannot read request body: {rejection}"), None)
    }
}

async fn health(State(engine): State<Engine>) -> StatusCode {
    if engine.healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(engine): State<Engine>) -> Response {
    let list = ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: engine.model().to_owned(),
            object: "model".into(),
            created: unix_now(),
            owned_by: "vllm".into(),
            max_model_len: Some(engine.config().max_model_len),
        }],
    };
    axum::Json(list).into_response()
}

/// Serves the GPUs of `engines` (GPU `i` is `engines[i]`) on `/metrics`, shaped like
/// dcgm-exporter: a listener of its own, up whatever the engines do, until `shutdown` resolves.
pub async fn serve_dcgm(
    listener: TcpListener,
    engines: Vec<Engine>,
    hostname: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(dcgm_metrics))
        .with_state(std::sync::Arc::new((engines, hostname)));
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

async fn dcgm_metrics(State(state): State<std::sync::Arc<(Vec<Engine>, String)>>) -> Response {
    let (engines, hostname) = &*state;
    let readings: Vec<_> = engines.iter().map(|e| e.gpu_reading()).collect();
    let gpus: Vec<(&str, crate::metrics::GpuReading)> = engines
        .iter()
        .zip(readings)
        .map(|(e, r)| (e.config().gpu.name.as_str(), r))
        .collect();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        crate::metrics::dcgm_exposition(hostname, &gpus),
    )
        .into_response()
}

async fn metrics(State(engine): State<Engine>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        engine.metrics_text(),
    )
        .into_response()
}

async fn get_faults(State(engine): State<Engine>) -> Response {
    axum::Json(engine.faults()).into_response()
}

async fn post_faults(State(engine): State<Engine>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = body
        .map_err(body_error)
        .and_then(|b| parse_json::<FaultPatch>(&b))
        .and_then(|patch| {
            engine
                .apply_faults(&patch)
                .map_err(|e| ApiError::bad_request(e.to_string(), None))
        });
    match result {
        Ok(faults) => axum::Json(faults).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn state(State(engine): State<Engine>) -> Response {
    let s = engine.snapshot();
    let l = engine.lateness();
    axum::Json(serde_json::json!({
        "model": engine.model(),
        "preset": engine.config().preset.name(),
        "healthy": engine.healthy(),
        "running": s.running,
        "waiting": s.waiting,
        "max_running": s.max_running,
        "steps": s.steps,
        "aborts": s.aborts,
        "preemptions": s.preemptions,
        "generated_tokens": s.generated_tokens,
        "kv_cache_usage": s.kv_usage,
        "kv_blocks_total": s.kv_blocks_total,
        "kv_blocks_free": s.kv_blocks_free,
        "step_lateness_us": { "p50": l.p50_us, "p99": l.p99_us, "max": l.max_us },
    }))
    .into_response()
}

async fn reset_lateness(State(engine): State<Engine>) -> StatusCode {
    engine.reset_lateness();
    StatusCode::NO_CONTENT
}

async fn not_found() -> Response {
    error_response(&ApiError::vllm(404, "NotFoundError", "Not Found", None))
}

async fn chat(
    State(engine): State<Engine>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let body = body.map_err(body_error)?;
        let req: ChatCompletionRequest = parse_json(&body)?;
        check_model(&engine, &req.model)?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        let text = chat_prompt(req.messages.iter().map(|m| {
            (
                m.role.as_str(),
                m.content.as_ref().map(|c| c.text()).unwrap_or_default(),
            )
        }));
        let params = GenerateParams {
            prompt: engine.tokenize(&text),
            max_tokens: req.requested_max_tokens(),
            n: req.n.unwrap_or(1),
            ignore_eos: req.ignore_eos.unwrap_or(false),
        };
        let include_usage = StreamOptions::wants_usage(req.stream_options.as_ref());
        Ok((params, req.stream.unwrap_or(false), include_usage, req.model))
    })();
    respond(&engine, &headers, RenderKind::Chat, prepared).await
}

async fn completions(
    State(engine): State<Engine>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let body = body.map_err(body_error)?;
        let req: CompletionRequest = parse_json(&body)?;
        check_model(&engine, &req.model)?;
        let prompt = match req.prompt {
            Prompt::Text(t) => engine.tokenize(&t),
            Prompt::Tokens(ids) => ids,
            Prompt::Texts(mut v) if v.len() == 1 => engine.tokenize(&v.remove(0)),
            Prompt::TokenBatches(mut v) if v.len() == 1 => v.remove(0),
            Prompt::Texts(_) | Prompt::TokenBatches(_) => {
                return Err(ApiError::bad_request(
                    "spillway engine serves one prompt per request; send a batch as separate requests",
                    Some("prompt"),
                ));
            }
        };
        let params = GenerateParams {
            prompt,
            max_tokens: req.max_tokens.or(Some(16)),
            n: req.n.unwrap_or(1),
            ignore_eos: req.ignore_eos.unwrap_or(false),
        };
        let include_usage = StreamOptions::wants_usage(req.stream_options.as_ref());
        Ok((params, req.stream.unwrap_or(false), include_usage, req.model))
    })();
    respond(&engine, &headers, RenderKind::Completion, prepared).await
}

/// `POST /v1/messages`: Anthropic's Messages API as vLLM serves it, its errors in Anthropic's
/// envelope (vLLM's own validation errors stay OpenAI-shaped, as vLLM's do).
async fn messages(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = match body.map_err(body_error) {
        Ok(b) => agents::serve::create::<agents::MessagesRequest>(&app.engine, None, &b).await,
        Err(e) => Err(e),
    };
    let response = match answer {
        Ok(r) => r,
        Err(e) if e.status == 400 && e.body.error.kind == "BadRequestError" => error_response(&e),
        Err(e) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                agents::messages_error(&e),
            )
                .into_response()
        }
    };
    with_request_id(response, &headers)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, no generation.
async fn count_tokens(State(engine): State<Engine>, body: Result<Bytes, BytesRejection>) -> Response {
    let counted = body.map_err(body_error).and_then(|b| {
        let req: agents::MessagesRequest = parse_json(&b)?;
        check_model(&engine, agents::AgentRequest::model(&req))?;
        Ok(agents::count_tokens(&engine, &req))
    });
    match counted {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/responses`: OpenAI's Responses API as vLLM serves it, with its store when on.
async fn responses(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let answer = match body.map_err(body_error) {
        Ok(b) => agents::serve::create::<agents::ResponsesRequest>(&app.engine, app.store.as_ref(), &b).await,
        Err(e) => Err(e),
    };
    with_request_id(answer.unwrap_or_else(|e| error_response(&e)), &headers)
}

/// `GET /v1/responses/{id}`'s query as vLLM reads it: `stream` (true/false) and
/// `starting_after` (an event's number); other keys are ignored.
fn retrieve_query(query: Option<&str>) -> (bool, Option<u64>) {
    let mut out = (false, None);
    for (k, v) in query
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
    {
        match k {
            "stream" => out.0 = v.eq_ignore_ascii_case("true") || v == "1",
            "starting_after" => out.1 = v.parse().ok(),
            _ => {}
        }
    }
    out
}

/// `GET /v1/responses/{id}`: a stored response (404 without the store, as vLLM's empty one).
async fn retrieve_response(
    State(app): State<App>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let (stream, starting_after) = retrieve_query(query.as_deref());
    agents::serve::retrieve(app.store.as_deref(), &id, stream, starting_after)
        .unwrap_or_else(|e| error_response(&e))
}

/// `POST /v1/responses/{id}/cancel`: a background response stopped.
async fn cancel_response(State(app): State<App>, Path(id): Path<String>) -> Response {
    agents::serve::cancel(app.store.as_deref(), &id).unwrap_or_else(|e| error_response(&e))
}

fn with_request_id(mut response: Response, headers: &HeaderMap) -> Response {
    if let Some(id) = headers.get("x-request-id").cloned() {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

/// `POST /v1/embeddings`: never streamed; the whole list once every input is pooled.
async fn embeddings(
    State(engine): State<Engine>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let prepared = (|| {
        let body = body.map_err(body_error)?;
        let req: EmbeddingRequest = parse_json(&body)?;
        check_model(&engine, &req.model)?;
        let inputs = crate::embed::inputs(&engine, &req)?;
        Ok((req, inputs))
    })();
    let answer = match prepared {
        Ok((req, inputs)) => {
            engine.frontend_admit().await;
            crate::embed::embed(&engine, &req, inputs).await
        }
        Err(e) => Err(e),
    };
    let mut response = match answer {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => error_response(&e),
    };
    if let Some(id) = headers.get("x-request-id").cloned() {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

async fn respond(
    engine: &Engine,
    headers: &HeaderMap,
    kind: RenderKind,
    prepared: Result<(GenerateParams, bool, bool, String), ApiError>,
) -> Response {
    let request_id = headers.get("x-request-id").cloned();
    if prepared.is_ok() {
        engine.frontend_admit().await;
    }
    let stream = prepared.as_ref().is_ok_and(|p| p.1);
    let mut response = match prepared
        .and_then(|(params, stream, usage, model)| engine.submit(params).map(|g| (g, stream, usage, model)))
    {
        Err(e) if stream && crate::engine::is_queue_full(&e) => {
            in_stream_error(&e, engine.config().sse_style)
        }
        Err(e) => error_response(&e),
        Ok((generation, stream, include_usage, model)) => {
            let mut render = Render::new(kind, generation.id, unix_now(), model);
            render.style = engine.config().sse_style;
            if stream {
                let body = TokenStream::new(generation, render, include_usage).into_body();
                (
                    [
                        (
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("text/event-stream; charset=utf-8"),
                        ),
                        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                    ],
                    Body::new(body),
                )
                    .into_response()
            } else {
                complete(generation, render).await
            }
        }
    };
    if let Some(id) = request_id {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

/// A refusal as vLLM 0.32 sends it to a streamed request: a 200 stream of one error event (the
/// body's `error`, its `code` an integer) and `[DONE]`.
fn in_stream_error(err: &ApiError, style: protocol::sse::Style) -> Response {
    let mut body = Vec::from(&b"data: "[..]);
    body.extend_from_slice(&err.to_json());
    body.extend_from_slice(b"\n\ndata: [DONE]\n\n");
    let body = style.restyle(&body);
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// Waits for every choice to finish, then answers with the whole completion.
async fn complete(mut generation: Generation, render: Render) -> Response {
    let mut finals: Vec<Progress> = Vec::with_capacity(generation.choices.len());
    for rx in &mut generation.choices {
        let done = rx.wait_for(|p| p.finish.is_some()).await.map(|p| *p);
        match done {
            Ok(p) => finals.push(p),
            Err(_) => finals.push(Progress {
                tokens: 0,
                finish: Some(FinishReason::Error),
            }),
        }
    }
    if finals.iter().any(|p| p.finish == Some(FinishReason::Error)) {
        return error_response(&ApiError::vllm(
            500,
            "InternalServerError",
            "the engine failed during generation",
            None,
        ));
    }
    let body = render.full_response(generation.prompt_tokens, &finals);
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
