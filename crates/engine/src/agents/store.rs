//! vLLM's response store (`VLLM_ENABLE_RESPONSES_API_STORE=1`), bounded: vLLM keeps every
//! response, its conversation and a background stream's events in dicts that are never emptied
//! ("may cause a memory leak", it warns). Here the oldest ended responses go first once the
//! kept bytes pass a limit; a background response still generating is never evicted (their
//! number is bounded by the engine's queue).

use super::Message;
use super::answer::{Answer, Status};
use crate::scheduler::Progress;
use protocol::ApiError;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{oneshot, watch};

/// The responses one replica answered, by id.
#[derive(Debug)]
pub(crate) struct ResponseStore {
    max_bytes: usize,
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    by_id: HashMap<String, Stored>,
    /// Ids oldest first, for eviction.
    order: VecDeque<String>,
    bytes: usize,
}

#[derive(Debug)]
struct Stored {
    /// The object `GET /v1/responses/{id}` answers.
    response: Value,
    /// The conversation it answered (vLLM's `msg_store`), for a later `previous_response_id`.
    conversation: Vec<Message>,
    /// What the entry costs against the limit: its JSON and its conversation's text.
    bytes: usize,
    /// A background response still generating: how to cancel it.
    cancel: Option<oneshot::Sender<()>>,
    /// A background stream's progress and answer, for `GET …?stream=true` (vLLM keeps the events
    /// of background streams only).
    events: Option<(Answer, watch::Receiver<Progress>)>,
}

/// What a later turn takes from a stored response.
pub(crate) struct History {
    pub(crate) messages: Vec<Message>,
    /// The text of each output part: each becomes an assistant turn.
    pub(crate) output: Vec<String>,
}

/// What `GET /v1/responses/{id}?stream=true` can replay.
pub(crate) enum Replay {
    Events(Answer, watch::Receiver<Progress>),
    /// A response that was not a background stream: vLLM answers 200 and no events.
    Nothing,
}

/// vLLM's answer for an id it does not hold.
pub(crate) fn not_found(id: &str) -> ApiError {
    ApiError::vllm(
        404,
        "invalid_request_error",
        format!("Response with id '{id}' not found."),
        Some("response_id"),
    )
}

fn lock(m: &Mutex<Kept>) -> MutexGuard<'_, Kept> {
    // A panic while holding the lock is a bug elsewhere; the map stays consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn size(response: &Value, conversation: &[Message]) -> usize {
    let json = serde_json::to_vec(response).map_or(0, |v| v.len());
    json + conversation.iter().map(|(r, t)| r.len() + t.len()).sum::<usize>()
}

impl ResponseStore {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// Keeps `response` (replacing one of the same id), then evicts the oldest ended ones
    /// while over the limit.
    fn put(&self, id: &str, entry: Stored) {
        let mut k = lock(&self.kept);
        k.bytes += entry.bytes;
        if let Some(old) = k.by_id.insert(id.to_owned(), entry) {
            k.bytes -= old.bytes;
        } else {
            k.order.push_back(id.to_owned());
        }
        let mut scanned = 0;
        while k.bytes > self.max_bytes && scanned < k.order.len() {
            let Some(oldest) = k.order.pop_front() else { break };
            let running = k.by_id.get(&oldest).is_some_and(|s| s.cancel.is_some());
            if running || oldest == id {
                k.order.push_back(oldest);
                scanned += 1;
            } else if let Some(gone) = k.by_id.remove(&oldest) {
                k.bytes -= gone.bytes;
            }
        }
    }

    /// An answered response, with the conversation it answered.
    pub(crate) fn keep(&self, response: Value, conversation: Vec<Message>) {
        let Some(id) = response["id"].as_str().map(str::to_owned) else {
            return;
        };
        let bytes = size(&response, &conversation);
        // vLLM does not overwrite a response cancelled while it generated.
        let cancelled = self
            .get(&id)
            .is_some_and(|r| r["status"] == Status::Cancelled.word());
        if !cancelled {
            self.put(
                &id,
                Stored {
                    response,
                    conversation,
                    bytes,
                    cancel: None,
                    events: None,
                },
            );
        }
    }

    /// A background response as it starts (`queued`), with its way to be cancelled and, for a
    /// background stream, its progress for readers.
    pub(crate) fn start(
        &self,
        response: Value,
        conversation: Vec<Message>,
        cancel: oneshot::Sender<()>,
        events: Option<(Answer, watch::Receiver<Progress>)>,
    ) {
        let Some(id) = response["id"].as_str().map(str::to_owned) else {
            return;
        };
        let bytes = size(&response, &conversation);
        let cancel = Some(cancel);
        self.put(
            &id,
            Stored {
                response,
                conversation,
                bytes,
                cancel,
                events,
            },
        );
    }

    /// A background response that ended: its final object, unless it was cancelled.
    pub(crate) fn finish(&self, id: &str, response: Option<Value>) {
        let mut k = lock(&self.kept);
        let Some(s) = k.by_id.get_mut(id) else { return };
        s.cancel = None;
        if s.response["status"] == Status::Cancelled.word() {
            return;
        }
        match response {
            Some(r) => {
                let bytes = size(&r, &s.conversation);
                let old = std::mem::replace(&mut s.bytes, bytes);
                s.response = r;
                k.bytes = k.bytes + bytes - old;
            }
            // vLLM's word for a background generation that failed.
            None => s.response["status"] = Status::Failed.word().into(),
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Value> {
        lock(&self.kept).by_id.get(id).map(|s| s.response.clone())
    }

    /// The conversation and output a `previous_response_id` continues from.
    pub(crate) fn history(&self, id: &str) -> Option<History> {
        let k = lock(&self.kept);
        let s = k.by_id.get(id)?;
        let output = s.response["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|item| item["type"] == "message")
            .flat_map(|item| item["content"].as_array().into_iter().flatten())
            .filter_map(|part| part["text"].as_str().map(str::to_owned))
            .collect();
        Some(History {
            messages: s.conversation.clone(),
            output,
        })
    }

    pub(crate) fn replay(&self, id: &str) -> Option<Replay> {
        let k = lock(&self.kept);
        let s = k.by_id.get(id)?;
        Some(match &s.events {
            Some((answer, progress)) => Replay::Events(answer.clone(), progress.clone()),
            None => Replay::Nothing,
        })
    }

    /// vLLM's cancel: a `queued` (background, generating) response becomes `cancelled` and its
    /// generation is aborted; anything else is refused with 400, an unknown id 404.
    pub(crate) fn cancel(&self, id: &str) -> Result<Value, ApiError> {
        let mut k = lock(&self.kept);
        let s = k.by_id.get_mut(id).ok_or_else(|| not_found(id))?;
        let status = s.response["status"].as_str().unwrap_or_default();
        if status != Status::Queued.word() && status != Status::InProgress.word() {
            return Err(ApiError::vllm(
                400,
                "invalid_request_error",
                "Cannot cancel a synchronous response.",
                Some("response_id"),
            ));
        }
        s.response["status"] = Status::Cancelled.word().into();
        if let Some(cancel) = s.cancel.take() {
            // The background task drops its generation: the scheduler aborts the sequence.
            let _ = cancel.send(());
        }
        Ok(s.response.clone())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.kept).by_id.len()
    }
}

/// Where an answer goes once it is whole: the store, with the conversation it answered.
pub(crate) struct Keep {
    pub(crate) store: Arc<ResponseStore>,
    pub(crate) conversation: Vec<Message>,
}

impl Keep {
    pub(crate) fn keep(self, response: Value) {
        self.store.keep(response, self.conversation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn response(id: &str, status: &str, text: &str) -> Value {
        json!({"id": id, "status": status, "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]})
    }

    fn turn(text: &str) -> Vec<Message> {
        vec![("user".to_owned(), text.to_owned())]
    }

    #[test]
    fn the_oldest_ended_responses_go_first_past_the_limit() {
        let one = size(&response("resp_1", "completed", "x"), &turn("hello"));
        let store = ResponseStore::new(one * 2);
        store.keep(response("resp_1", "completed", "x"), turn("hello"));
        let (cancel, _rx) = oneshot::channel();
        store.start(response("resp_2", "queued", "x"), turn("hello"), cancel, None);
        store.keep(response("resp_3", "completed", "x"), turn("hello"));
        assert!(store.get("resp_1").is_none(), "the oldest went");
        assert!(store.get("resp_2").is_some() && store.get("resp_3").is_some());
        // resp_2 still generates: never evicted, so resp_3 goes for resp_4.
        store.keep(response("resp_4", "completed", "x"), turn("hello"));
        assert!(store.get("resp_2").is_some() && store.get("resp_3").is_none());
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn cancel_aborts_a_queued_response_and_refuses_an_ended_one() {
        let store = ResponseStore::new(1 << 20);
        let (cancel, mut rx) = oneshot::channel();
        store.start(response("resp_b", "queued", ""), turn("hi"), cancel, None);
        let r = store.cancel("resp_b").unwrap();
        assert_eq!(r["status"], "cancelled");
        assert!(rx.try_recv().is_ok(), "the generation was told to stop");
        // Its generation's end does not overwrite the cancellation.
        store.finish("resp_b", Some(response("resp_b", "completed", "late")));
        assert_eq!(store.get("resp_b").unwrap()["status"], "cancelled");
        let again = store.cancel("resp_b").unwrap_err();
        assert_eq!(
            (again.status, again.body.error.message.as_str()),
            (400, "Cannot cancel a synchronous response.")
        );
        assert_eq!(store.cancel("resp_x").unwrap_err().status, 404);
    }

    #[test]
    fn history_is_the_conversation_and_the_output_text() {
        let store = ResponseStore::new(1 << 20);
        store.keep(response("resp_a", "completed", "out"), turn("in"));
        let h = store.history("resp_a").unwrap();
        assert_eq!(h.messages, turn("in"));
        assert_eq!(h.output, vec!["out".to_owned()]);
    }
}
