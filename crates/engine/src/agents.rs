//! The agents' APIs as vLLM 0.32 serves them: Anthropic's Messages (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`) and OpenAI's Responses (`POST /v1/responses`, and with the
//! response store `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`), streamed and
//! whole, with the events, ids, usage and errors vLLM writes (`tests/fixtures/vllm-0.32/` holds
//! its own answers).
//!
//! - this file: what the simulator reads of each request, and the prompt it makes of it;
//! - `answer`: the answer's bodies (a Message, a Responses object in each status);
//! - `events`: a streamed answer's events, live or replayed;
//! - `store`: vLLM's response store (off unless `VLLM_ENABLE_RESPONSES_API_STORE=1` or
//!   `--responses-store`), bounded where vLLM's grows without limit;
//! - `serve`: a request from its body to its answer: admitted, submitted, kept, in the background.

mod answer;
mod events;
pub(crate) mod serve;
pub(crate) mod store;

pub(crate) use answer::Answer;

use crate::engine::{Engine, Generation};
use protocol::ApiError;
use serde::Deserialize;
use serde_json::json;
use std::borrow::Cow;
use store::{History, ResponseStore};

/// Which of the two APIs a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Agent {
    Messages,
    Responses,
}

/// One turn of a conversation as the chat template sees it: (role, text).
pub(crate) type Message = (String, String);

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

impl Turn {
    fn message(&self) -> Message {
        (self.role.clone(), self.content.text().into_owned())
    }
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
    /// OpenAI's default is to store; vLLM stores only with its store switched on.
    #[serde(default = "yes")]
    store: bool,
    #[serde(default)]
    ignore_eos: bool,
}

fn yes() -> bool {
    true
}

/// What the server needs of either API's request: its checks, its conversation and limits, and
/// the answer it gets once its generation has an id.
pub(crate) trait AgentRequest: serde::de::DeserializeOwned {
    fn model(&self) -> &str;
    /// What vLLM's request model refuses, before it looks at the model's name.
    fn validate(&self) -> Result<(), ApiError> {
        Ok(())
    }
    /// What vLLM refuses of it before generating, the store (or its absence) considered.
    fn check(&self, store: Option<&ResponseStore>) -> Result<(), ApiError>;
    /// The conversation the prompt is made of, the system prompt first (for a Responses request
    /// naming a previous one: that one's conversation and output before the new input).
    fn conversation(&self, store: Option<&ResponseStore>) -> Result<Vec<Message>, ApiError>;
    fn max_tokens(&self) -> Option<u32>;
    fn ignore_eos(&self) -> bool;
    fn stream(&self) -> bool;
    /// Whether the answer goes into the store (only Responses, only with the store on).
    fn stored(&self, store: Option<&ResponseStore>) -> bool;
    /// Whether it generates with no client waiting (Responses' `background`).
    fn background(&self) -> bool;
    fn answer(self, generation: &Generation, created: u64, max_model_len: u32) -> Answer;
}

/// The prompt's text through the chat template.
pub(crate) fn prompt(conversation: &[Message]) -> String {
    tokenize::chat_prompt(
        conversation
            .iter()
            .map(|(role, text)| (role.as_str(), Cow::Borrowed(text.as_str()))),
    )
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

    fn stored(&self, _: Option<&ResponseStore>) -> bool {
        false
    }

    fn background(&self) -> bool {
        false
    }

    fn answer(self, generation: &Generation, created: u64, _: u32) -> Answer {
        Answer::new(Agent::Messages, generation, created, self.model)
    }

    fn conversation(&self, _: Option<&ResponseStore>) -> Result<Vec<Message>, ApiError> {
        let system = self
            .system
            .as_ref()
            .map(|s| ("system".to_owned(), s.text().into_owned()));
        Ok(system
            .into_iter()
            .chain(self.messages.iter().map(Turn::message))
            .collect())
    }

    fn check(&self, _: Option<&ResponseStore>) -> Result<(), ApiError> {
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

    fn stored(&self, store: Option<&ResponseStore>) -> bool {
        store.is_some() && self.store
    }

    fn background(&self) -> bool {
        self.background
    }

    fn answer(self, generation: &Generation, created: u64, max_model_len: u32) -> Answer {
        let mut answer = Answer::new(Agent::Responses, generation, created, self.model);
        // vLLM shows the limit it sampled with: the one asked, within what the context leaves.
        let room = max_model_len.saturating_sub(generation.prompt_tokens);
        answer.max_output_tokens = Some(self.max_output_tokens.map_or(room, |m| m.min(room)));
        answer.instructions = self.instructions;
        answer.previous_response_id = self.previous_response_id;
        answer.background = self.background;
        answer
    }

    /// vLLM's `construct_input_messages`: the new instructions, the previous conversation
    /// without its system turns (instructions do not carry over), the previous output as the
    /// assistant's turns, then the new input.
    fn conversation(&self, store: Option<&ResponseStore>) -> Result<Vec<Message>, ApiError> {
        let mut out: Vec<Message> = self
            .instructions
            .iter()
            .map(|s| ("system".to_owned(), s.clone()))
            .collect();
        if let Some(id) = &self.previous_response_id {
            let History { messages, output } = store
                .and_then(|s| s.history(id))
                .ok_or_else(|| store::not_found(id))?;
            out.extend(messages.into_iter().filter(|(role, _)| role != "system"));
            out.extend(output.into_iter().map(|text| ("assistant".to_owned(), text)));
        }
        match &self.input {
            Input::Text(t) => out.push(("user".to_owned(), t.clone())),
            Input::Items(items) => out.extend(items.iter().map(Turn::message)),
        }
        Ok(out)
    }

    fn validate(&self) -> Result<(), ApiError> {
        // Store on or off, before the model is looked at.
        if self.background && !self.store {
            return Err(ApiError::bad_request(
                "background can only be used when `store` is true (parameter=background)",
                Some("background"),
            ));
        }
        Ok(())
    }

    fn check(&self, store: Option<&ResponseStore>) -> Result<(), ApiError> {
        if self.background && store.is_none() {
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
    let conversation = req.conversation(None).unwrap_or_default();
    let n = engine.tokenize(&prompt(&conversation)).len();
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
