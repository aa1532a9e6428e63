//! A streamed answer's events as vLLM writes them (`event:` then `data:`), from a generation's
//! progress: live for the client that asked, or replayed for a background response's readers.

use super::Agent;
use super::answer::{Answer, Status};
use super::store::Keep;
use crate::engine::Generation;
use crate::scheduler::{FinishReason, Progress};
use crate::text;
use axum::body::Body;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::watch;

struct Events {
    answer: Answer,
    out: Vec<u8>,
    sequence: u64,
    /// Events numbered up to this one are not written: a reader that asked to start after it.
    skip_through: Option<u64>,
}

impl Events {
    fn event(&mut self, name: &str, mut data: Value) {
        if self.answer.agent == Agent::Responses {
            let n = self.sequence;
            self.sequence += 1;
            if self.skip_through.is_some_and(|s| n <= s) {
                return;
            }
            data["sequence_number"] = json!(n);
            data["type"] = json!(name);
        }
        self.out.extend_from_slice(b"event: ");
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\ndata: ");
        self.out
            .extend_from_slice(&serde_json::to_vec(&data).unwrap_or_default());
        self.out.extend_from_slice(b"\n\n");
    }

    fn start(&mut self) {
        let a = &self.answer;
        match a.agent {
            Agent::Messages => {
                let message = json!({
                    "id": a.id, "type": "message", "role": "assistant", "content": [], "model": a.model,
                    "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": a.prompt_tokens, "output_tokens": 0},
                });
                self.event(
                    "message_start",
                    json!({"type": "message_start", "message": message}),
                );
                let block = json!({"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0});
                self.event("content_block_start", block);
            }
            Agent::Responses => {
                let response = a.response(Status::InProgress, 0);
                let item = a.message_item("in_progress", "");
                let part = json!({"annotations": [], "text": "", "type": "output_text", "logprobs": []});
                let id = a.item.clone();
                self.event("response.created", json!({"response": response.clone()}));
                self.event("response.in_progress", json!({"response": response}));
                self.event(
                    "response.output_item.added",
                    json!({"item": item, "output_index": 0}),
                );
                self.event(
                    "response.content_part.added",
                    json!({"content_index": 0, "item_id": id, "output_index": 0, "part": part}),
                );
            }
        }
    }

    fn token(&mut self, word: &str) {
        match self.answer.agent {
            Agent::Messages => self.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": word}, "index": 0}),
            ),
            Agent::Responses => {
                let id = self.answer.item.clone();
                self.event(
                    "response.output_text.delta",
                    json!({"content_index": 0, "delta": word, "item_id": id, "logprobs": [], "output_index": 0}),
                );
            }
        }
    }

    /// The closing events; for Responses, the final object they carry (what the store keeps).
    fn end(&mut self, tokens: u32, finish: FinishReason) -> Option<Value> {
        let a = &self.answer;
        match a.agent {
            Agent::Messages => {
                let usage = json!({"input_tokens": a.prompt_tokens, "output_tokens": tokens});
                let reason = Answer::stop_reason(finish);
                self.event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                );
                self.event(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": usage}),
                );
                self.event("message_stop", json!({"type": "message_stop"}));
                None
            }
            Agent::Responses => {
                let (id, text) = (a.item.clone(), a.text(tokens));
                let part = json!({"annotations": [], "text": text, "type": "output_text", "logprobs": null});
                let item = a.message_item("completed", &text);
                let response = a.response(Status::of(finish), tokens);
                self.event(
                    "response.output_text.done",
                    json!({"content_index": 0, "item_id": id, "logprobs": [], "output_index": 0, "text": text}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"content_index": 0, "item_id": id, "output_index": 0, "part": part}),
                );
                self.event(
                    "response.output_item.done",
                    json!({"item": item, "output_index": 0}),
                );
                // vLLM ends with `response.completed` whatever the status (`incomplete` at a cap).
                self.event("response.completed", json!({"response": response.clone()}));
                Some(response)
            }
        }
    }

    fn take(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.out))
    }
}

/// The streamed answer's body: each new token as its event; dropping it (the client left) drops
/// the generation, which aborts the sequence. With `keep`, the final object goes into the store.
pub(crate) fn stream(generation: Generation, answer: Answer, keep: Option<Keep>) -> Body {
    let progress = generation.choices[0].clone();
    body(Streaming::new(progress, Some(generation), answer, keep, None))
}

/// A background response's events for a reader that does not own its generation (the client
/// that asked, or a `GET …?stream=true`): leaving stops the reading, not the generation. Events
/// numbered up to `starting_after` are left out, as vLLM's replay does.
pub(crate) fn replay(
    progress: watch::Receiver<Progress>,
    answer: Answer,
    starting_after: Option<u64>,
) -> Body {
    body(Streaming::new(progress, None, answer, None, starting_after))
}

fn body(state: Streaming) -> Body {
    let stream = futures::stream::unfold(state, |mut s| async move { s.next().await.map(|item| (item, s)) });
    Body::from_stream(stream)
}

struct Streaming {
    progress: watch::Receiver<Progress>,
    /// The generation, when this stream owns it: dropped with the stream, it aborts.
    _generation: Option<Generation>,
    events: Events,
    keep: Option<Keep>,
    started: bool,
    sent: u32,
    done: bool,
}

impl Streaming {
    fn new(
        mut progress: watch::Receiver<Progress>,
        generation: Option<Generation>,
        answer: Answer,
        keep: Option<Keep>,
        skip_through: Option<u64>,
    ) -> Self {
        // A replay starts from the first token whatever a clone has seen.
        progress.mark_changed();
        Streaming {
            progress,
            _generation: generation,
            events: Events {
                answer,
                out: Vec::new(),
                sequence: 0,
                skip_through,
            },
            keep,
            started: false,
            sent: 0,
            done: false,
        }
    }

    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            self.events.start();
        }
        loop {
            let p = *self.progress.borrow_and_update();
            for t in self.sent..p.tokens {
                self.events.token(text::token(self.events.answer.seed, t));
            }
            self.sent = self.sent.max(p.tokens);
            match p.finish {
                Some(FinishReason::Error | FinishReason::Abort) => {
                    // Cut as a dying server would: no closing events.
                    self.done = true;
                    return Some(Err(std::io::Error::other("engine failed during generation")));
                }
                Some(finish) => {
                    let last = self.events.end(self.sent, finish);
                    if let (Some(keep), Some(response)) = (self.keep.take(), last) {
                        keep.keep(response);
                    }
                    self.done = true;
                }
                None => {}
            }
            if !self.events.out.is_empty() {
                return Some(Ok(self.events.take()));
            }
            if self.progress.changed().await.is_err() {
                self.done = true;
                return Some(Err(std::io::Error::other("engine dropped the request")));
            }
        }
    }
}
