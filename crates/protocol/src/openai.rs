//! OpenAI-compatible request and response bodies, as vLLM serves them.
//!
//! Requests keep every field they do not name in `extra`, so that a proxy can forward a body it
//! does not fully understand and an engine can ignore sampling knobs it does not simulate.

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// A key of a request object, borrowed from the body when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// `Deserialize` for a body whose named fields are typed and whose other fields are kept in
/// `extra`. `#[serde(flatten)]` says the same, but buffers the whole object first (every key and
/// value copied once more, nested objects too); the gateway parses a request per request.
/// Missing, duplicate and mistyped fields fail as the derived impl's would.
macro_rules! typed_fields_and_extra {
    ($ty:ident { required: [$($req:ident = $req_name:literal),*], optional: [$($opt:ident = $opt_name:literal),*] }) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("struct ", stringify!($ty)))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$ty, A::Error> {
                        $(let mut $req = None;)*
                        $(let mut $opt = None;)*
                        let mut extra = Map::new();
                        while let Some(Key(key)) = map.next_key()? {
                            match key.as_ref() {
                                $($req_name => {
                                    if $req.is_some() {
                                        return Err(de::Error::duplicate_field($req_name));
                                    }
                                    $req = Some(map.next_value()?);
                                })*
                                $($opt_name => {
                                    if $opt.is_some() {
                                        return Err(de::Error::duplicate_field($opt_name));
                                    }
                                    $opt = Some(map.next_value()?);
                                })*
                                _ => {
                                    let value: Value = map.next_value()?;
                                    extra.insert(key.into_owned(), value);
                                }
                            }
                        }
                        Ok($ty {
                            $($req: $req.ok_or_else(|| de::Error::missing_field($req_name))?,)*
                            // Present as `null` or absent: `None` either way, as `#[serde(default)]`.
                            $($opt: $opt.flatten(),)*
                            extra,
                        })
                    }
                }
                d.deserialize_map(V)
            }
        }
    };
}

/// `stream_options` of a streamed request.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StreamOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

typed_fields_and_extra!(StreamOptions {
    required: [],
    optional: [include_usage = "include_usage"]
});

impl StreamOptions {
    /// Whether a request's `stream_options` ask for the final usage chunk.
    pub fn wants_usage(options: Option<&StreamOptions>) -> bool {
        options.and_then(|o| o.include_usage).unwrap_or(false)
    }
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The newer name for `max_tokens`; when both are given this one wins, as in OpenAI's API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// vLLM's extension: keep generating past end-of-sequence until `max_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

typed_fields_and_extra!(ChatCompletionRequest {
    required: [model = "model", messages = "messages"],
    optional: [
        max_tokens = "max_tokens",
        max_completion_tokens = "max_completion_tokens",
        n = "n",
        stream = "stream",
        stream_options = "stream_options",
        ignore_eos = "ignore_eos"
    ]
});

impl ChatCompletionRequest {
    pub fn requested_max_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }
}

/// One chat message; only `role` and the text of `content` matter to Spillway.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

typed_fields_and_extra!(ChatMessage {
    required: [role = "role"],
    optional: [content = "content"]
});

/// A message's content: a plain string or a list of typed parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// By the JSON type, where serde's `untagged` would buffer the value and try each variant (a
/// copy and an allocation more for every message on the gateway's request path).
impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(s))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<MessageContent, A::Error> {
                Vec::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(MessageContent::Parts)
            }
        }
        d.deserialize_any(V)
    }
}

/// A typed content part; text parts carry `text`, others (images, audio) are kept as they came.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

typed_fields_and_extra!(ContentPart {
    required: [kind = "type"],
    optional: [text = "text"]
});

impl MessageContent {
    /// The text of the content, parts joined by newlines; non-text parts contribute nothing.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            MessageContent::Text(s) => Cow::Borrowed(s),
            MessageContent::Parts(parts) => Cow::Owned(
                parts
                    .iter()
                    .filter_map(|p| p.text.as_deref())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

typed_fields_and_extra!(CompletionRequest {
    required: [model = "model", prompt = "prompt"],
    optional: [
        max_tokens = "max_tokens",
        n = "n",
        stream = "stream",
        stream_options = "stream_options",
        ignore_eos = "ignore_eos"
    ]
});

/// A legacy completion prompt: text, a batch of texts, token ids, or a batch of token-id lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`: the input as one text, a batch of texts, token ids or a batch of
/// token-id lists (the shapes of a completion's prompt).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: Prompt,
    /// `float` (the default) or `base64` (little-endian f32s; what the openai Python client asks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

typed_fields_and_extra!(EmbeddingRequest {
    required: [model = "model", input = "input"],
    optional: [encoding_format = "encoding_format", dimensions = "dimensions"]
});

/// A `/v1/embeddings` answer: one embedding per input, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub object: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    pub model: String,
    pub data: Vec<Embedding>,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    pub object: String,
    pub index: u32,
    pub embedding: EmbeddingVector,
}

/// The numbers, or their little-endian f32 bytes in base64, as the request's `encoding_format` asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

/// An embedding's cost: its input, nothing generated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

/// Token accounting, as in every OpenAI response and in the final streamed chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// A non-streamed `/v1/completions` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a completion, or of a streamed completion chunk (where `text` is the delta).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// A non-streamed `/v1/chat/completions` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ResponseMessage,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
}

/// One streamed chat chunk; the usage-only chunk has no choices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One streamed `/v1/completions` chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::parse_json;

    #[test]
    fn chat_request_keeps_unknown_fields_for_forwarding() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],
            "temperature":0.2,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#;
        let req: ChatCompletionRequest = parse_json(body).unwrap();
        assert_eq!(req.requested_max_tokens(), Some(5));
        assert_eq!(req.extra["temperature"], 0.2);
        let back = serde_json::to_value(&req).unwrap();
        assert_eq!(back["temperature"], 0.2);
        assert_eq!(back["stream_options"]["include_usage"], true);
    }

    /// The requests as `#[serde(flatten)]` derived them before `typed_fields_and_extra!`.
    mod derived {
        use serde::{Deserialize, Serialize};
        use serde_json::{Map, Value};

        #[derive(Serialize, Deserialize)]
        pub(super) struct StreamOptions {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            include_usage: Option<bool>,
            #[serde(flatten)]
            extra: Map<String, Value>,
        }

        #[derive(Serialize, Deserialize)]
        pub(super) struct ContentPart {
            #[serde(rename = "type")]
            kind: String,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            text: Option<String>,
            #[serde(flatten)]
            extra: Map<String, Value>,
        }

        #[derive(Serialize, Deserialize)]
        #[serde(untagged)]
        pub(super) enum MessageContent {
            Text(String),
            Parts(Vec<ContentPart>),
        }

        #[derive(Serialize, Deserialize)]
        pub(super) struct ChatMessage {
            role: String,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            content: Option<MessageContent>,
            #[serde(flatten)]
            extra: Map<String, Value>,
        }

        #[derive(Serialize, Deserialize)]
        pub(super) struct Chat {
            model: String,
            messages: Vec<ChatMessage>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            max_tokens: Option<u32>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            max_completion_tokens: Option<u32>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            n: Option<u32>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            stream: Option<bool>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            stream_options: Option<StreamOptions>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            ignore_eos: Option<bool>,
            #[serde(flatten)]
            extra: Map<String, Value>,
        }

        #[derive(Serialize, Deserialize)]
        pub(super) struct Completion {
            model: String,
            prompt: super::Prompt,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            max_tokens: Option<u32>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            n: Option<u32>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            stream: Option<bool>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            stream_options: Option<StreamOptions>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            ignore_eos: Option<bool>,
            #[serde(flatten)]
            extra: Map<String, Value>,
        }
    }

    /// Parsed by both impls: the same request (compared as the JSON it forwards), or a refusal
    /// by both that names the same field (or, now, a part of it).
    fn parses_as_derived<
        New: Serialize + serde::de::DeserializeOwned,
        Old: Serialize + serde::de::DeserializeOwned,
    >(
        body: &str,
    ) {
        let new = parse_json::<New>(body.as_bytes());
        let old = parse_json::<Old>(body.as_bytes());
        match (new, old) {
            (Ok(n), Ok(o)) => assert_eq!(
                serde_json::to_value(n).unwrap(),
                serde_json::to_value(o).unwrap(),
                "{body}"
            ),
            // The same field, or a part of it: a content part missing its `type` is named as
            // such, where the derived `untagged` could only say the content matched no variant.
            (Err(n), Err(o)) => {
                let (np, op) = (n.body.error.param.clone(), o.body.error.param.clone());
                let within = match (&np, &op) {
                    (Some(np), Some(op)) => np.starts_with(op.as_str()),
                    _ => np == op,
                };
                assert!(within, "{body}: {n:?} / {o:?}");
            }
            (n, o) => panic!("{body}: now {:?}, derived {:?}", n.is_ok(), o.is_ok()),
        }
    }

    #[test]
    fn requests_parse_as_the_derived_impls_did() {
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            r#"{"messages":[{"role":"user","content":"hi","name":"x"}],"model":"m","temperature":0.2,"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"model":{"type":"string"}}}}}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","cache":1},{"type":"image_url","image_url":{"url":"x"}}]}],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
            r#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[]}],"max_tokens":null,"n":null,"stream_options":null}"#,
            r#"{"model":"m","messages":[],"max_completion_tokens":7,"ignore_eos":true,"max_tokens":3}"#,
            r#"{"\u006dodel":"m","messages":[{"role":"user","content":"\"quoted\" \u00e9"}],"extra\nkey":[1,{"a":null}]}"#,
            r#"{"model":"m"}"#,
            r#"{"messages":[]}"#,
            r#"{"model":"m","messages":[{"content":"no role"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"text":"no type"}]}]}"#,
            r#"{"model":"m","messages":[],"max_tokens":"5"}"#,
            r#"{"model":"m","messages":[],"max_tokens":-1}"#,
            r#"{"model":"m","messages":[],"n":4294967296}"#,
            r#"{"model":"m","messages":[],"stream":"yes"}"#,
            r#"{"model":"m","messages":[],"stream_options":{"include_usage":1}}"#,
            r#"{"model":"m","messages":[],"model":"again"}"#,
            r#"{"model":7,"messages":[]}"#,
            r#"["m",[]]"#,
            r#"{"model":"m","messages":{}}"#,
            r#"{"model":"m","messages":[],}"#,
            r#"{"model":"m","messages":[]"#,
        ] {
            parses_as_derived::<ChatCompletionRequest, derived::Chat>(body);
        }
        for body in [
            r#"{"model":"m","prompt":"x","max_tokens":5,"echo":true,"logprobs":2}"#,
            r#"{"model":"m","prompt":[[1],[2]],"n":2,"stream":true,"stream_options":{"include_usage":false}}"#,
            r#"{"model":"m","prompt":{"a":1}}"#,
            r#"{"model":"m"}"#,
            r#"{"prompt":"x"}"#,
            r#"{"model":"m","prompt":"x","ignore_eos":null,"best_of":3}"#,
            r#"{"model":"m","prompt":"x","n":"2"}"#,
        ] {
            parses_as_derived::<CompletionRequest, derived::Completion>(body);
        }
    }

    #[test]
    fn content_parts_join_their_text() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}"#;
        let req: ChatCompletionRequest = parse_json(body).unwrap();
        assert_eq!(req.messages[0].content.as_ref().unwrap().text(), "a\nb");
    }

    #[test]
    fn prompt_accepts_every_openai_shape() {
        for (body, ok) in [
            (r#"{"model":"m","prompt":"x"}"#, true),
            (r#"{"model":"m","prompt":["x","y"]}"#, true),
            (r#"{"model":"m","prompt":[1,2,3]}"#, true),
            (r#"{"model":"m","prompt":[[1],[2]]}"#, true),
            (r#"{"model":"m","prompt":{"a":1}}"#, false),
        ] {
            assert_eq!(
                parse_json::<CompletionRequest>(body.as_bytes()).is_ok(),
                ok,
                "{body}"
            );
        }
    }
}
