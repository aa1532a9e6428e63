//! The agents' APIs as vLLM 0.32 serves them: Anthropic's Messages (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`) and OpenAI's Responses (`POST /v1/responses`), streamed and
//! whole, with the events, ids, usage and errors vLLM writes (`tests/fixtures/vllm-0.32/` holds
//! its own answers). vLLM's response store is off unless `VLLM_ENABLE_RESPONSES_API_STORE=1`, and
//! the simulator has none: `previous_response_id` is answered not found and `background` refused,
//! as vLLM answers them without the store.

use crate::engine::{Engine, Generation};
use crate::scheduler::FinishReason;
use crate::text;
use axum::body::Body;
use bytes::Bytes;
use protocol::ApiError;
use serde::Deserialize;
use serde_json::{Value, json};
use std::borrow::Cow;

/// Which of the two APIs a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Agent {
    Messages,
    Responses,
}

/// Message content: a string, or blocks of which the text ones count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct Block {
    #[serde(default)]
    text: Option<String>,
}

impl Content {
    fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Text(t) => Cow::Borrowed(t),
            Content::Blocks(b) => Cow::Owned(b.iter().filter_map(|b| b.text.as_deref()).collect()),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct Turn {
    #[serde(default = "user")]
    role: String,
    content: Content,
}

fn user() -> String {
    "user".into()
}

/// `POST /v1/messages` (and `count_tokens`): what the simulator reads of it.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagesRequest {
    model: String,
    max_tokens: Option<u32>,
    messages: Vec<Turn>,
    #[serde(default)]
    system: Option<Content>,
    #[serde(default)]
    stream: bool,
    /// vLLM's extension, as on its OpenAI routes: generate to `max_tokens`.
    #[serde(default)]
    ignore_eos: bool,
}

/// The input of `POST /v1/responses`: a string, or items with a role and content.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    Text(String),
    Items(Vec<Turn>),
}

/// `POST /v1/responses`: what the simulator reads of it.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponsesRequest {
    model: String,
    input: Input,
    #[serde(default)]
    instructions: Option<String>,
    max_output_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    ignore_eos: bool,
}

/// What the server needs of either API's request: its checks, its prompt and limits, and the
/// answer it gets once its generation has an id.
pub(crate) trait AgentRequest: serde::de::DeserializeOwned {
    fn model(&self) -> &str;
    /// What vLLM refuses of it before generating.
    fn check(&self) -> Result<(), ApiError>;
    /// The prompt's text through the chat template, the system prompt first.
    fn prompt(&self) -> String;
    fn max_tokens(&self) -> Option<u32>;
    fn ignore_eos(&self) -> bool;
    fn stream(&self) -> bool;
    fn answer(self, generation: &Generation, created: u64) -> Answer;
}

impl AgentRequest for MessagesRequest {
    fn model(&self) -> &str {
        &self.model
    }

    fn max_tokens(&self) -> Option<u32> {
        self.max_tokens
    }

    fn ignore_eos(&self) -> bool {
        self.ignore_eos
    }

    fn stream(&self) -> bool {
        self.stream
    }

    fn answer(self, generation: &Generation, created: u64) -> Answer {
        Answer::new(Agent::Messages, generation, created, self.model)
    }

    fn prompt(&self) -> String {
        let system = self.system.as_ref().map(|s| ("system", s.text()));
        let turns = self.messages.iter().map(|m| (m.role.as_str(), m.content.text()));
        tokenize::chat_prompt(system.into_iter().chain(turns))
    }

    fn check(&self) -> Result<(), ApiError> {
        if self.max_tokens.is_none() {
            // vLLM's own answer: its validation error, OpenAI-shaped even on this route.
            return Err(ApiError::bad_request(
                "1 validation error:\n  {'type': 'missing', 'loc': 'body.max_tokens', 'msg': 'Field required'}",
                Some("body.max_tokens"),
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        Ok(())
    }
}

impl AgentRequest for ResponsesRequest {
    fn model(&self) -> &str {
        &self.model
    }

    fn max_tokens(&self) -> Option<u32> {
        self.max_output_tokens
    }

    fn ignore_eos(&self) -> bool {
        self.ignore_eos
    }

    fn stream(&self) -> bool {
        self.stream
    }

    fn answer(self, generation: &Generation, created: u64) -> Answer {
        let mut answer = Answer::new(Agent::Responses, generation, created, self.model);
        answer.max_output_tokens = self.max_output_tokens;
        answer.instructions = self.instructions;
        answer
    }

    fn prompt(&self) -> String {
        let system = self.instructions.as_deref().map(|s| ("system", Cow::Borrowed(s)));
        let turns: Vec<(&str, Cow<'_, str>)> = match &self.input {
            Input::Text(t) => vec![("user", Cow::Borrowed(t.as_str()))],
            Input::Items(items) => items
                .iter()
                .map(|m| (m.role.as_str(), m.content.text()))
                .collect(),
        };
        tokenize::chat_prompt(system.into_iter().chain(turns))
    }

    /// What vLLM refuses without its response store.
    fn check(&self) -> Result<(), ApiError> {
        if let Some(id) = &self.previous_response_id {
            return Err(ApiError::vllm(
                404,
                "invalid_request_error",
                format!("Response with id '{id}' not found."),
                Some("response_id"),
            ));
        }
        if self.background {
            return Err(ApiError::vllm(
                400,
                "invalid_request_error",
                "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                Some("background"),
            ));
        }
        Ok(())
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, as vLLM answers it.
pub(crate) fn count_tokens(engine: &Engine, req: &MessagesRequest) -> Vec<u8> {
    let n = engine.tokenize(&req.prompt()).len();
    serde_json::to_vec(&json!({"input_tokens": n, "context_management": {"original_input_tokens": n}}))
        .unwrap_or_default()
}

/// An error on the Messages route as vLLM writes it: Anthropic's envelope, vLLM's own type
/// names (`NotFoundError`, not `not_found_error`).
pub(crate) fn messages_error(err: &ApiError) -> Vec<u8> {
    let body =
        json!({"type": "error", "error": {"type": err.body.error.kind, "message": err.body.error.message}});
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Everything one answer's events share.
pub(crate) struct Answer {
    agent: Agent,
    id: String,
    item: String,
    created: u64,
    model: String,
    seed: u64,
    prompt_tokens: u32,
    max_output_tokens: Option<u32>,
    instructions: Option<String>,
}

impl Answer {
    fn new(agent: Agent, generation: &Generation, created: u64, model: String) -> Self {
        let seq = generation.id;
        let id = match agent {
            // vLLM answers Messages with its chat completion's id.
            Agent::Messages => format!("chatcmpl-{seq:016x}"),
            // Random, as vLLM's are: ids of two replicas never collide.
            Agent::Responses => format!("resp_{:016x}", rand::random::<u64>()),
        };
        Self {
            agent,
            id,
            item: format!("msg_{:016x}", seq.rotate_left(17)),
            created,
            model,
            seed: seq,
            prompt_tokens: generation.prompt_tokens,
            max_output_tokens: None,
            instructions: None,
        }
    }

    fn text(&self, tokens: u32) -> String {
        (0..tokens).map(|i| text::token(self.seed, i)).collect()
    }

    fn stop_reason(finish: FinishReason) -> &'static str {
        match finish {
            FinishReason::Length => "max_tokens",
            _ => "end_turn",
        }
    }

    /// The Responses object, `output` holding the message so far (none while in progress).
    fn response(&self, status: &str, tokens: u32, finish: Option<FinishReason>) -> Value {
        let output = if status == "in_progress" {
            json!([])
        } else {
            json!([self.message_item("completed", &self.text(tokens))])
        };
        let incomplete = finish
            .filter(|f| *f == FinishReason::Length)
            .map(|_| json!({"reason": "max_output_tokens"}));
        let usage = (status != "in_progress").then(|| {
            json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
                "output_tokens": tokens,
                "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
                "total_tokens": self.prompt_tokens + tokens,
            })
        });
        json!({
            "id": self.id, "created_at": self.created, "incomplete_details": incomplete,
            "instructions": self.instructions, "metadata": null, "model": self.model,
            "object": "response", "output": output, "parallel_tool_calls": true,
            "temperature": 1.0, "tool_choice": "none", "tools": [], "top_p": 1.0,
            "background": false, "max_output_tokens": self.max_output_tokens, "max_tool_calls": null,
            "previous_response_id": null, "prompt": null, "reasoning": null, "service_tier": "auto",
            "status": status, "text": null, "top_logprobs": null, "truncation": "disabled",
            "usage": usage, "user": null, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "kv_transfer_params": null, "ec_transfer_params": null, "input_messages": null,
            "output_messages": null,
        })
    }

    fn message_item(&self, status: &str, text: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"annotations": [], "text": text, "type": "output_text", "logprobs": null}])
        };
        json!({"id": self.item, "content": content, "role": "assistant", "status": status, "type": "message", "phase": null})
    }

    /// The whole answer, once the generation finished with `tokens` and `finish`.
    pub(crate) fn whole(&self, tokens: u32, finish: FinishReason) -> Vec<u8> {
        let body = match self.agent {
            Agent::Messages => json!({
                "id": self.id, "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": self.text(tokens)}],
                "model": self.model, "stop_reason": Self::stop_reason(finish),
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": tokens},
            }),
            Agent::Responses => {
                let status = if finish == FinishReason::Length {
                    "incomplete"
                } else {
                    "completed"
                };
                self.response(status, tokens, Some(finish))
            }
        };
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// A streamed answer's events, written as vLLM writes them (`event:` then `data:`).
struct Events {
    answer: Answer,
    out: Vec<u8>,
    sequence: u64,
}

impl Events {
    fn event(&mut self, name: &str, mut data: Value) {
        if self.answer.agent == Agent::Responses {
            data["sequence_number"] = json!(self.sequence);
            data["type"] = json!(name);
            self.sequence += 1;
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
                let response = a.response("in_progress", 0, None);
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

    fn end(&mut self, tokens: u32, finish: FinishReason) {
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
            }
            Agent::Responses => {
                let (id, text) = (a.item.clone(), a.text(tokens));
                let part = json!({"annotations": [], "text": text, "type": "output_text", "logprobs": null});
                let item = a.message_item("completed", &text);
                let status = if finish == FinishReason::Length {
                    "incomplete"
                } else {
                    "completed"
                };
                let response = a.response(status, tokens, Some(finish));
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
                self.event("response.completed", json!({"response": response}));
            }
        }
    }

    fn take(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.out))
    }
}

/// The streamed answer's body: each new token as its event; dropping it (the client left) drops
/// the generation, which aborts the sequence.
pub(crate) fn stream(generation: Generation, answer: Answer) -> Body {
    let state = Streaming {
        generation,
        events: Events {
            answer,
            out: Vec::new(),
            sequence: 0,
        },
        started: false,
        sent: 0,
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut s| async move { s.next().await.map(|item| (item, s)) });
    Body::from_stream(stream)
}

struct Streaming {
    generation: Generation,
    events: Events,
    started: bool,
    sent: u32,
    done: bool,
}

impl Streaming {
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            self.events.start();
        }
        loop {
            let p = *self.generation.choices[0].borrow_and_update();
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
                    self.events.end(self.sent, finish);
                    self.done = true;
                }
                None => {}
            }
            if !self.events.out.is_empty() {
                return Some(Ok(self.events.take()));
            }
            if self.generation.choices[0].changed().await.is_err() {
                self.done = true;
                return Some(Err(std::io::Error::other("engine dropped the request")));
            }
        }
    }
}
