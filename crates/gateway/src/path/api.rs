//! The endpoints the request path serves, named once: each one's path, how its answer is read and
//! the shape of its errors. Both front doors, the router and the ledger read this table.

use crate::error::Shape;
use protocol::agents::Dialect;

/// Which endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completions,
    /// Admitted as the others are; its cost is its input, and its answer is never a stream.
    Embeddings,
    /// OpenAI's Responses API, which agents speak.
    Responses,
    /// Anthropic's Messages API: its bodies, events and errors are Anthropic's.
    Messages,
    /// Messages' token count: checked and routed as the others, and passed through without a
    /// slot, since the replica generates nothing for it.
    CountTokens,
}

impl Api {
    /// Every endpoint the request path serves: the one table of paths each front door reads.
    pub(crate) const ALL: [Api; 6] = [
        Api::Chat,
        Api::Completions,
        Api::Embeddings,
        Api::Responses,
        Api::Messages,
        Api::CountTokens,
    ];

    /// The endpoint a POST to `path` (without its query) asks for, if the gateway serves it.
    pub(crate) fn at(path: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|api| api.path() == path)
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Embeddings => "/v1/embeddings",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
            Api::CountTokens => "/v1/messages/count_tokens",
        }
    }

    /// Its name in the access log and the metrics' `api` label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Embeddings => "embeddings",
            Api::Responses => "responses",
            Api::Messages => "messages",
            Api::CountTokens => "count_tokens",
        }
    }

    /// Its GenAI operation name in a trace's spans (OpenTelemetry's semantic conventions).
    pub(crate) fn operation(self) -> &'static str {
        match self {
            Api::Completions => "text_completion",
            Api::Embeddings => "embeddings",
            Api::Chat | Api::Responses | Api::Messages | Api::CountTokens => "chat",
        }
    }

    /// How its streams' events and whole answers are read: `None` for OpenAI's completions.
    pub(crate) fn dialect(self) -> Option<Dialect> {
        match self {
            Api::Responses => Some(Dialect::Responses),
            Api::Messages | Api::CountTokens => Some(Dialect::Messages),
            Api::Chat | Api::Completions | Api::Embeddings => None,
        }
    }

    pub(crate) fn shape(self) -> Shape {
        match self {
            Api::Messages | Api::CountTokens => Shape::Anthropic,
            _ => Shape::OpenAi,
        }
    }

    /// Whether a request takes a slot: all but a token count, which generates nothing.
    pub(crate) fn takes_slot(self) -> bool {
        self != Api::CountTokens
    }
}
