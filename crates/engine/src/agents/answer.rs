//! An answer's bodies as vLLM writes them: a Message, or a Responses object in any status.

use super::Agent;
use crate::engine::Generation;
use crate::scheduler::FinishReason;
use crate::text;
use serde_json::{Value, json};

/// Everything one answer's bodies and events share.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(super) agent: Agent,
    pub(crate) id: String,
    pub(super) item: String,
    created: u64,
    pub(super) model: String,
    pub(super) seed: u64,
    pub(super) prompt_tokens: u32,
    pub(super) max_output_tokens: Option<u32>,
    pub(super) instructions: Option<String>,
    pub(super) previous_response_id: Option<String>,
    pub(super) background: bool,
}

/// A Responses object's status: vLLM's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// A background response from its answer until it ends (vLLM never moves it to
    /// `in_progress` in the store).
    Queued,
    /// Only in a stream's first two events.
    InProgress,
    Completed,
    /// Cut at `max_output_tokens` (or the context).
    Incomplete,
    Cancelled,
    Failed,
}

impl Status {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Cancelled => "cancelled",
            Status::Failed => "failed",
        }
    }

    /// What a finished generation is: a cap is `incomplete`, anything else `completed`.
    pub(crate) fn of(finish: FinishReason) -> Status {
        if finish == FinishReason::Length {
            Status::Incomplete
        } else {
            Status::Completed
        }
    }

    /// Whether there is output and usage to show.
    fn ended(self) -> bool {
        matches!(self, Status::Completed | Status::Incomplete)
    }
}

impl Answer {
    pub(super) fn new(agent: Agent, generation: &Generation, created: u64, model: String) -> Self {
        let seq = generation.id;
        let id = match agent {
            // vLLM answers Messages with its chat completion's id.
            Agent::Messages => format!("chatcmpl-{seq:016x}"),
            // Random, as vLLM's are: ids of two replicas never collide (main's 20987ef3).
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
            previous_response_id: None,
            background: false,
        }
    }

    pub(super) fn text(&self, tokens: u32) -> String {
        (0..tokens).map(|i| text::token(self.seed, i)).collect()
    }

    pub(super) fn stop_reason(finish: FinishReason) -> &'static str {
        match finish {
            FinishReason::Length => "max_tokens",
            _ => "end_turn",
        }
    }

    /// The Responses object: output and usage once it ended with `tokens`, none before (or
    /// when it was cancelled or failed: vLLM keeps the object it stored at the start).
    pub(crate) fn response(&self, status: Status, tokens: u32) -> Value {
        let ended = status.ended();
        let output = if ended {
            json!([self.message_item("completed", &self.text(tokens))])
        } else {
            json!([])
        };
        let incomplete = (status == Status::Incomplete).then(|| json!({"reason": "max_output_tokens"}));
        let usage = ended.then(|| {
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
            "background": self.background, "max_output_tokens": self.max_output_tokens, "max_tool_calls": null,
            "previous_response_id": self.previous_response_id, "prompt": null, "reasoning": null, "service_tier": "auto",
            "status": status.word(), "text": null, "top_logprobs": null, "truncation": "disabled",
            "usage": usage, "user": null, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "kv_transfer_params": null, "ec_transfer_params": null, "input_messages": null,
            "output_messages": null,
        })
    }

    pub(super) fn message_item(&self, status: &str, text: &str) -> Value {
        let content = if status == "in_progress" {
            json!([])
        } else {
            json!([{"annotations": [], "text": text, "type": "output_text", "logprobs": null}])
        };
        json!({"id": self.item, "content": content, "role": "assistant", "status": status, "type": "message", "phase": null})
    }

    /// The whole answer, once the generation finished with `tokens` and `finish`.
    pub(crate) fn whole(&self, tokens: u32, finish: FinishReason) -> Value {
        match self.agent {
            Agent::Messages => json!({
                "id": self.id, "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": self.text(tokens)}],
                "model": self.model, "stop_reason": Self::stop_reason(finish),
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": tokens},
            }),
            Agent::Responses => self.response(Status::of(finish), tokens),
        }
    }
}
