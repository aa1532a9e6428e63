//! An agent request from its body to its answer: checked, admitted, submitted; answered whole or
//! as events; kept in the store; or generated in the background with no client connected.

use super::answer::{Answer, Status};
use super::events;
use super::store::{Keep, Replay, ResponseStore};
use super::{AgentRequest, prompt};
use crate::clock::unix_now;
use crate::engine::{Engine, GenerateParams, Generation};
use crate::reply::{check_model, error_response, json};
use crate::scheduler::{FinishReason, Progress};
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use protocol::ApiError;
use protocol::error::parse_json;
use std::sync::Arc;
use tokio::sync::{oneshot, watch};

/// Either agent API's request: read and checked, admitted, submitted, answered.
pub(crate) async fn create<R: AgentRequest>(
    engine: &Engine,
    store: Option<&Arc<ResponseStore>>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let req: R = parse_json(body)?;
    req.validate()?;
    check_model(engine, req.model())?;
    let plain = store.map(Arc::as_ref);
    req.check(plain)?;
    let conversation = req.conversation(plain)?;
    let params = GenerateParams {
        prompt: engine.tokenize(&prompt(&conversation)),
        max_tokens: req.max_tokens(),
        n: 1,
        ignore_eos: req.ignore_eos(),
    };
    let (stream, background) = (req.stream(), req.background());
    let keep = store.filter(|_| req.stored(plain)).map(|s| Keep {
        store: s.clone(),
        conversation,
    });
    engine.frontend_admit().await;
    let generation = engine.submit(params)?;
    let answer = req.answer(&generation, unix_now(), engine.config().max_model_len);
    match keep {
        // `check` refused a background request the store could not keep.
        Some(keep) if background => Ok(in_background(generation, answer, keep, stream)),
        keep => Ok(answer_now(generation, answer, stream, keep).await),
    }
}

fn event_stream(body: Body) -> Response {
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

/// An agent API's answer to the client waiting: its events as they come, or the whole answer at
/// the end; either kept with `keep` once whole.
async fn answer_now(
    mut generation: Generation,
    answer: Answer,
    stream: bool,
    keep: Option<Keep>,
) -> Response {
    if stream {
        return event_stream(events::stream(generation, answer, keep));
    }
    let done = generation.choices[0]
        .wait_for(|p| p.finish.is_some())
        .await
        .map(|p| *p);
    match done {
        Ok(p) if !matches!(p.finish, Some(FinishReason::Error | FinishReason::Abort)) => {
            let whole = answer.whole(p.tokens, p.finish.unwrap_or(FinishReason::Stop));
            let body = serde_json::to_vec(&whole).unwrap_or_default();
            if let Some(keep) = keep {
                keep.keep(whole);
            }
            json(body)
        }
        _ => error_response(&ApiError::vllm(
            500,
            "InternalServerError",
            "the engine failed during generation",
            None,
        )),
    }
}

/// vLLM's `background: true`: stored `queued` at once and answered (the object, or with `stream`
/// the events as they come, read without owning the generation); a task holds the generation,
/// so its sequence keeps its slot in the scheduler with no client, until it ends or is cancelled.
fn in_background(generation: Generation, answer: Answer, keep: Keep, stream: bool) -> Response {
    let queued = answer.response(Status::Queued, 0);
    let (cancel, cancelled) = oneshot::channel();
    let (relay, progress) = watch::channel(Progress {
        tokens: 0,
        finish: None,
    });
    let events = stream.then(|| (answer.clone(), progress.clone()));
    let store = keep.store;
    store.start(queued.clone(), keep.conversation, cancel, events);
    let reader = stream.then(|| events::replay(progress, answer.clone(), None));
    tokio::spawn(generate(generation, answer, store, relay, cancelled));
    match reader {
        Some(body) => event_stream(body),
        None => json(serde_json::to_vec(&queued).unwrap_or_default()),
    }
}

/// A background generation to its end, its progress relayed to readers (who hold no receiver of
/// the scheduler's, so that only this task keeps the sequence alive); cancelled, it drops the
/// generation and the scheduler aborts the sequence.
async fn generate(
    mut generation: Generation,
    answer: Answer,
    store: Arc<ResponseStore>,
    relay: watch::Sender<Progress>,
    mut cancelled: oneshot::Receiver<()>,
) {
    let progress = &mut generation.choices[0];
    loop {
        let p = *progress.borrow_and_update();
        relay.send_replace(p);
        match p.finish {
            Some(FinishReason::Error | FinishReason::Abort) => return store.finish(&answer.id, None),
            Some(finish) => {
                let done = answer.response(Status::of(finish), p.tokens);
                return store.finish(&answer.id, Some(done));
            }
            None => {}
        }
        tokio::select! {
            changed = progress.changed() => if changed.is_err() {
                return store.finish(&answer.id, None);
            },
            _ = &mut cancelled => return,
        }
    }
}

/// `GET /v1/responses/{id}`: the stored object; with `stream=true`, a background stream's events
/// (after `starting_after`), as vLLM replays them.
pub(crate) fn retrieve(
    store: Option<&ResponseStore>,
    id: &str,
    stream: bool,
    starting_after: Option<u64>,
) -> Result<Response, ApiError> {
    let store = store.ok_or_else(|| super::store::not_found(id))?;
    if !stream {
        let response = store.get(id).ok_or_else(|| super::store::not_found(id))?;
        return Ok(json(serde_json::to_vec(&response).unwrap_or_default()));
    }
    match store.replay(id).ok_or_else(|| super::store::not_found(id))? {
        Replay::Events(answer, progress) => {
            Ok(event_stream(events::replay(progress, answer, starting_after)))
        }
        // vLLM fails inside its stream, after the 200: the client reads no event.
        Replay::Nothing => Ok(event_stream(Body::empty())),
    }
}

/// `POST /v1/responses/{id}/cancel`.
pub(crate) fn cancel(store: Option<&ResponseStore>, id: &str) -> Result<Response, ApiError> {
    let store = store.ok_or_else(|| super::store::not_found(id))?;
    let response = store.cancel(id)?;
    Ok(json(serde_json::to_vec(&response).unwrap_or_default()))
}
