//! Stages 1–4 of the request path: parse and validate, cap the cost of one request, and find its
//! class and priority. Pure functions over the request; nothing here waits.

use super::api::Api;
use crate::config::{OverCap, Priority};
use crate::error::{GatewayError, Invalid};
use crate::route::Route;
use crate::table::Table;
use crate::tenant::Tenant;
use axum::http::HeaderMap;
use bytes::Bytes;
use memchr::memmem;
use protocol::agents::{Dialect, MessagesRequest, ResponsesRequest};
use protocol::error::parse_json;
use protocol::openai::{ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Prompt, StreamOptions};
use std::sync::{Arc, LazyLock};

pub(crate) use super::hints::Objectives;
use super::hints::{objectives, priority};

/// A parsed request, before routing.
pub(crate) enum Parsed {
    Chat(ChatCompletionRequest),
    Completion(CompletionRequest),
    Embedding(EmbeddingRequest),
    Responses(Box<Agent<ResponsesRequest>>),
    /// A message, or (`count`) a count of its tokens.
    Messages {
        request: Box<Agent<MessagesRequest>>,
        count: bool,
    },
}

/// An agents' API request and the text of its parts in order (instructions or system first),
/// read once: the token count, the prefix key and the access log's block hashes all read it.
pub(crate) struct Agent<R> {
    request: R,
    texts: Vec<String>,
}

impl<R> std::ops::Deref for Agent<R> {
    type Target = R;
    fn deref(&self) -> &R {
        &self.request
    }
}

impl<R> std::ops::DerefMut for Agent<R> {
    fn deref_mut(&mut self) -> &mut R {
        &mut self.request
    }
}

impl Agent<ResponsesRequest> {
    fn new(request: ResponsesRequest) -> Box<Self> {
        let mut texts = Vec::new();
        for part in [&request.instructions, &request.input].into_iter().flatten() {
            protocol::agents::texts(part, &mut texts);
        }
        Box::new(Agent { request, texts })
    }
}

impl Agent<MessagesRequest> {
    fn new(request: MessagesRequest) -> Box<Self> {
        let mut texts = Vec::new();
        let parts = request.system.iter().chain(&request.messages);
        parts.for_each(|part| protocol::agents::texts(part, &mut texts));
        Box::new(Agent { request, texts })
    }
}

impl Parsed {
    pub(crate) fn parse(api: Api, body: &[u8]) -> Result<Parsed, GatewayError> {
        let to_err =
            |e: protocol::ApiError| GatewayError::bad_request(Invalid::Request, e.body.error.message, None);
        let parsed = match api {
            Api::Chat => Parsed::Chat(parse_json(body).map_err(to_err)?),
            Api::Completions => Parsed::Completion(parse_json(body).map_err(to_err)?),
            Api::Embeddings => Parsed::Embedding(parse_json(body).map_err(to_err)?),
            Api::Responses => {
                Parsed::Responses(Agent::<ResponsesRequest>::new(parse_json(body).map_err(to_err)?))
            }
            Api::Messages | Api::CountTokens => Parsed::Messages {
                request: Agent::<MessagesRequest>::new(parse_json(body).map_err(to_err)?),
                count: api == Api::CountTokens,
            },
        };
        if let Parsed::Chat(c) = &parsed
            && c.messages.is_empty()
        {
            return Err(GatewayError::bad_request(
                Invalid::Request,
                "'messages' must not be empty",
                Some("messages"),
            ));
        }
        Ok(parsed)
    }

    pub(crate) fn model(&self) -> &str {
        match self {
            Parsed::Chat(c) => &c.model,
            Parsed::Completion(c) => &c.model,
            Parsed::Embedding(e) => &e.model,
            Parsed::Responses(r) => &r.model,
            Parsed::Messages { request, .. } => &request.model,
        }
    }

    pub(crate) fn stream(&self) -> bool {
        match self {
            Parsed::Chat(c) => c.stream,
            Parsed::Completion(c) => c.stream,
            Parsed::Responses(r) => r.stream,
            Parsed::Messages { request, count } => request.stream.filter(|_| !count),
            Parsed::Embedding(_) => None,
        }
        .unwrap_or(false)
    }

    /// Whether the client gets a stream's usage: the agents' APIs always carry it.
    fn wants_usage(&self) -> bool {
        StreamOptions::wants_usage(match self {
            Parsed::Chat(c) => c.stream_options.as_ref(),
            Parsed::Completion(c) => c.stream_options.as_ref(),
            Parsed::Responses(_) | Parsed::Messages { .. } => return true,
            Parsed::Embedding(_) => None,
        })
    }

    fn n(&self) -> u32 {
        match self {
            Parsed::Chat(c) => c.n,
            Parsed::Completion(c) => c.n,
            Parsed::Embedding(_) | Parsed::Responses(_) | Parsed::Messages { .. } => None,
        }
        .unwrap_or(1)
    }

    /// `best_of` (candidates generated to return `n`), which OpenAI's legacy API and vLLM accept.
    fn best_of(&self) -> Result<Option<u32>, GatewayError> {
        let extra = match self {
            Parsed::Chat(c) => &c.extra,
            Parsed::Completion(c) => &c.extra,
            Parsed::Embedding(_) | Parsed::Responses(_) | Parsed::Messages { .. } => return Ok(None),
        };
        match extra.get("best_of") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|b| u32::try_from(b).ok())
                .filter(|b| *b >= 1)
                .map(Some)
                .ok_or_else(|| {
                    GatewayError::bad_request(
                        Invalid::Request,
                        "'best_of' must be a whole number of at least 1",
                        Some("best_of"),
                    )
                }),
        }
    }

    /// How many prompts the request holds: a `/v1/completions` prompt, or the input of
    /// `/v1/embeddings`, may be a list.
    fn prompts(&self) -> usize {
        let prompt = match self {
            Parsed::Chat(_) | Parsed::Responses(_) | Parsed::Messages { .. } => return 1,
            Parsed::Completion(c) => &c.prompt,
            Parsed::Embedding(e) => &e.input,
        };
        match prompt {
            Prompt::Text(_) | Prompt::Tokens(_) => 1,
            Prompt::Texts(t) => t.len(),
            Prompt::TokenBatches(b) => b.len(),
        }
    }

    /// The request's field that holds what it asks about, for errors to name.
    fn input_param(&self) -> &'static str {
        match self {
            Parsed::Chat(_) => "messages",
            Parsed::Completion(_) => "prompt",
            Parsed::Embedding(_) | Parsed::Responses(_) => "input",
            Parsed::Messages { .. } => "messages",
        }
    }

    /// The field that caps the answer's length, for errors to name.
    fn max_tokens_param(&self) -> &'static str {
        match self {
            Parsed::Responses(_) => "max_output_tokens",
            _ => "max_tokens",
        }
    }

    /// The text of an agent request's parts in order (instructions or system first).
    fn agent_texts(&self) -> Option<&[String]> {
        match self {
            Parsed::Responses(r) => Some(&r.texts),
            Parsed::Messages { request, .. } => Some(&request.texts),
            _ => None,
        }
    }

    /// What a request of the agents' APIs asks about a stored response: the id it continues.
    pub(crate) fn previous_response_id(&self) -> Option<&str> {
        match self {
            Parsed::Responses(r) => r.previous_response_id.as_deref(),
            _ => None,
        }
    }

    /// Whether it asks to run in the background (Responses' `background: true`).
    pub(crate) fn background(&self) -> bool {
        matches!(self, Parsed::Responses(r) if r.background == Some(true))
    }

    pub(crate) fn max_tokens(&self) -> Option<u32> {
        match self {
            Parsed::Chat(c) => c.requested_max_tokens(),
            Parsed::Completion(c) => c.max_tokens,
            Parsed::Responses(r) => r.max_output_tokens,
            Parsed::Messages { request, count } => request.max_tokens.filter(|_| !count),
            Parsed::Embedding(_) => None,
        }
    }

    /// The prompt's prefix-block ids for the access log, from its parts in order (each message's
    /// role and text; token ids as little-endian bytes).
    pub(crate) fn hash_ids(&self) -> Vec<u64> {
        let ids =
            |ids: &mut dyn Iterator<Item = &u32>| ids.flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
        if let Some(texts) = self.agent_texts() {
            return crate::access_log::hash_ids(texts.iter().map(String::as_bytes));
        }
        match self {
            Parsed::Chat(c) => {
                let texts: Vec<_> = c
                    .messages
                    .iter()
                    .map(|m| m.content.as_ref().map(|c| c.text()))
                    .collect();
                let parts = c
                    .messages
                    .iter()
                    .zip(&texts)
                    .flat_map(|(m, t)| [m.role.as_bytes(), t.as_deref().unwrap_or_default().as_bytes()]);
                crate::access_log::hash_ids(parts)
            }
            Parsed::Responses(_) | Parsed::Messages { .. } => Vec::new(),
            Parsed::Completion(CompletionRequest { prompt, .. })
            | Parsed::Embedding(EmbeddingRequest { input: prompt, .. }) => match prompt {
                Prompt::Text(t) => crate::access_log::hash_ids([t.as_bytes()]),
                Prompt::Texts(ts) => crate::access_log::hash_ids(ts.iter().map(|t| t.as_bytes())),
                Prompt::Tokens(t) => crate::access_log::hash_ids([&ids(&mut t.iter())[..]]),
                Prompt::TokenBatches(b) => crate::access_log::hash_ids([&ids(&mut b.iter().flatten())[..]]),
            },
        }
    }

    /// Prompt tokens, counted with the route's tokenizer (the chat template is the engine's).
    /// A hash of the start of the prompt: requests sharing a long prefix share it.
    fn prefix_key(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8], budget: &mut usize| {
            for b in bytes.iter().take(*budget) {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            *budget = budget.saturating_sub(bytes.len());
        };
        let mut budget = 512;
        if let Some(texts) = self.agent_texts() {
            texts.iter().for_each(|t| feed(t.as_bytes(), &mut budget));
            return h;
        }
        match self {
            Parsed::Chat(c) => {
                for m in &c.messages {
                    feed(m.role.as_bytes(), &mut budget);
                    if let Some(content) = &m.content {
                        feed(content.text().as_bytes(), &mut budget);
                    }
                }
            }
            Parsed::Completion(CompletionRequest { prompt, .. })
            | Parsed::Embedding(EmbeddingRequest { input: prompt, .. }) => match prompt {
                Prompt::Text(t) => feed(t.as_bytes(), &mut budget),
                Prompt::Texts(ts) => ts.iter().for_each(|t| feed(t.as_bytes(), &mut budget)),
                Prompt::Tokens(ids) => ids.iter().for_each(|t| feed(&t.to_le_bytes(), &mut budget)),
                Prompt::TokenBatches(b) => b
                    .iter()
                    .flatten()
                    .for_each(|t| feed(&t.to_le_bytes(), &mut budget)),
            },
            Parsed::Responses(_) | Parsed::Messages { .. } => {}
        }
        h
    }

    pub(crate) fn input_tokens(&self, route: &Route) -> u32 {
        if let Some(texts) = self.agent_texts() {
            let n: usize = texts.iter().map(|t| route.tokenizer.count(t)).sum();
            return u32::try_from(n).unwrap_or(u32::MAX);
        }
        let n = match self {
            Parsed::Chat(c) => {
                let text = tokenize::chat_prompt(c.messages.iter().map(|m| {
                    (
                        m.role.as_str(),
                        m.content.as_ref().map(|c| c.text()).unwrap_or_default(),
                    )
                }));
                route.tokenizer.count(&text)
            }
            Parsed::Completion(CompletionRequest { prompt, .. })
            | Parsed::Embedding(EmbeddingRequest { input: prompt, .. }) => match prompt {
                Prompt::Text(t) => route.tokenizer.count(t),
                Prompt::Texts(ts) => ts.iter().map(|t| route.tokenizer.count(t)).sum(),
                Prompt::Tokens(ids) => ids.len(),
                Prompt::TokenBatches(b) => b.iter().map(Vec::len).sum(),
            },
            Parsed::Responses(_) | Parsed::Messages { .. } => 0,
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// A request ready for admission: its class, priority, cost, and the body to send upstream.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub class: usize,
    pub priority: Priority,
    pub stream: bool,
    pub client_wants_usage: bool,
    pub input_tokens: u32,
    /// After the caps and the default; `None` when neither gives one.
    pub max_tokens: Option<u32>,
    /// Sequences it generates: prompts × `n` (or `best_of`).
    pub sequences: u32,
    pub body: Bytes,
    /// A hash of the prompt's first 512 bytes, for prefix affinity.
    pub prefix_key: u64,
    /// Its own TTFT and TPOT objectives (headers, else the class's `slo`), kept only where the
    /// route balances by them (`balance: slo`); the headers are checked on every route.
    pub slo: Objectives,
    /// How its answer is read: an agents' API's, or OpenAI's completions (`None`).
    pub dialect: Option<Dialect>,
    /// The stored response it continues (`previous_response_id`): only the replica that made it
    /// holds it.
    pub previous: Option<String>,
    /// Its agent session's hash, from the route's `agents.session_headers`.
    pub affinity: Option<u64>,
    /// The replica it must go to (the URL of the one holding `previous`).
    pub pinned: Option<Arc<str>>,
    /// Responses' `background: true`, on a route that holds its slot until it finishes.
    pub background: bool,
}

/// Applies the route's cost caps, picks the class and priority, and writes the upstream body
/// (`raw`, the client's body, as it came when nothing in it changes but an added member).
pub(crate) fn prepare(
    parsed: Parsed,
    raw: &Bytes,
    route: &Route,
    tenant: &Tenant,
    open: bool,
    headers: &HeaderMap,
) -> Result<Prepared, GatewayError> {
    let limits = &route.config.limits;
    let n = parsed.n();
    if n == 0 {
        return Err(GatewayError::bad_request(
            Invalid::Request,
            "'n' must be at least 1",
            Some("n"),
        ));
    }
    let best_of = parsed.best_of()?;
    if best_of.is_some_and(|b| b < n) {
        return Err(GatewayError::bad_request(
            Invalid::Request,
            "'best_of' must be at least 'n'",
            Some("best_of"),
        ));
    }
    let prompts = parsed.prompts();
    if prompts == 0 {
        let param = parsed.input_param();
        return Err(GatewayError::bad_request(
            Invalid::Request,
            format!("'{param}' must not be an empty list"),
            Some(param),
        ));
    }
    let embedding = matches!(parsed, Parsed::Embedding(_));
    // Every prompt of a list generates n (or best_of) sequences: that is what the cap bounds.
    // An embedding generates none, whatever the size of its batch.
    let per_prompt = best_of.unwrap_or(n);
    let sequences = u64::from(per_prompt) * prompts as u64;
    if let Some(max_n) = limits.max_n
        && !embedding
        && sequences > u64::from(max_n.get())
    {
        let (asked, param) = match (prompts, best_of) {
            (1, None) => (format!("n = {n}"), "n"),
            (1, Some(b)) => (format!("best_of = {b}"), "best_of"),
            (p, None) => (format!("{sequences} sequences ({p} prompts × n = {n})"), "prompt"),
            (p, Some(b)) => (
                format!("{sequences} sequences ({p} prompts × best_of = {b})"),
                "prompt",
            ),
        };
        return Err(GatewayError::bad_request(
            Invalid::NOverCap,
            format!("{asked} exceeds this model's limit of {max_n} sequences per request (max_n)"),
            Some(param),
        ));
    }
    let input_tokens = parsed.input_tokens(route);
    if let Some(cap) = limits.max_input_tokens
        && input_tokens > cap.get()
    {
        let param = parsed.input_param();
        return Err(GatewayError::bad_request(
            Invalid::InputTooLong,
            format!(
                "the input is {input_tokens} tokens, over this model's limit of {cap} (max_input_tokens)"
            ),
            Some(param),
        ));
    }
    let mut max_tokens = parsed.max_tokens();
    let max_param = parsed.max_tokens_param();
    if max_tokens == Some(0) {
        return Err(GatewayError::bad_request(
            Invalid::Request,
            format!("'{max_param}' must be at least 1"),
            Some(max_param),
        ));
    }
    if let (Some(m), Some(cap)) = (max_tokens, limits.max_tokens.cap)
        && m > cap.get()
    {
        match limits.over_cap {
            OverCap::Reject => {
                return Err(GatewayError::bad_request(
                    Invalid::MaxTokensOverCap,
                    format!("{max_param} = {m} exceeds this model's cap of {cap} (max_tokens.cap)"),
                    Some(max_param),
                ));
            }
            OverCap::Clamp => max_tokens = Some(cap.get()),
        }
    }
    let background = parsed.background();
    if background && route.config.agents.background == crate::config::Background::Refuse {
        return Err(GatewayError::bad_request(
            Invalid::Request,
            "'background' requests are refused on this route (agents.background: refuse): the replica would generate with no client connected, outside the route's concurrency limit",
            Some("background"),
        ));
    }
    if background && parsed.stream() {
        // A client that leaves a background stream leaves the response running on the replica,
        // where its slot could no longer be followed.
        return Err(GatewayError::bad_request(
            Invalid::Request,
            "'background' with 'stream' is refused on this route: ask without 'stream' and read the response by its id",
            Some("background"),
        ));
    }
    let counting = matches!(parsed, Parsed::Messages { count: true, .. });
    if max_tokens.is_none() && !embedding && !counting {
        max_tokens = limits.max_tokens.default.map(|d| d.get());
    }
    let class = route.classify(max_tokens, input_tokens, headers);
    let priority = priority(headers, tenant, open)?;
    let stream = parsed.stream();
    let client_wants_usage = parsed.wants_usage();
    let prefix_key = parsed.prefix_key();
    let dialect = match &parsed {
        Parsed::Responses(_) => Some(Dialect::Responses),
        Parsed::Messages { .. } => Some(Dialect::Messages),
        _ => None,
    };
    let previous = parsed.previous_response_id().map(str::to_owned);
    let affinity = dialect.and_then(|_| session_key(headers, &route.config.agents.session_headers));
    // Checked on every route, so that a malformed header is the same 400 whichever route serves
    // the request; kept only where the route balances by it.
    let asked = objectives(headers, route.classes[class].config.slo)?;
    let slo = if route.config.balance == crate::config::Balance::Slo {
        asked
    } else {
        Objectives::default()
    };
    let upstream_model = route
        .config
        .upstream_model
        .as_ref()
        .unwrap_or(&route.config.model);
    let unchanged = parsed.model() == upstream_model && parsed.max_tokens() == max_tokens;
    let kept = match (unchanged, stream, client_wants_usage) {
        // The agents' streams carry their usage unasked.
        _ if unchanged && dialect.is_some() => Some(raw.clone()),
        (true, false, _) | (true, true, true) => Some(raw.clone()),
        (true, true, false) if !mentions_stream_options(raw) => with_usage_asked(raw).map(Bytes::from),
        _ => None,
    };
    let body = match kept {
        Some(body) => body,
        None => Bytes::from(rewritten(parsed, upstream_model.clone(), max_tokens, stream)?),
    };
    Ok(Prepared {
        class,
        priority,
        stream,
        client_wants_usage,
        input_tokens,
        max_tokens,
        sequences: u32::try_from(sequences).unwrap_or(u32::MAX),
        body,
        prefix_key,
        slo,
        dialect,
        previous,
        affinity,
        pinned: None,
        background,
    })
}

/// A hash of the session a request names in the first of `names` it carries, if any.
fn session_key(headers: &HeaderMap, names: &[String]) -> Option<u64> {
    let value = names.iter().find_map(|n| headers.get(n.as_str()))?;
    if value.is_empty() {
        return None;
    }
    // Unseeded: every gateway of a fleet sends a session to the same replica.
    Some(xxhash_rust::xxh3::xxh3_64(value.as_bytes()))
}

/// The request written again for the replica: its model and `max_tokens` as the gateway set
/// them, and a stream's usage asked for.
fn rewritten(
    parsed: Parsed,
    model: String,
    max_tokens: Option<u32>,
    stream: bool,
) -> Result<Vec<u8>, GatewayError> {
    match parsed {
        Parsed::Chat(mut c) => {
            c.model = model;
            if c.max_completion_tokens.is_some() {
                c.max_completion_tokens = max_tokens;
            } else {
                c.max_tokens = max_tokens;
            }
            if stream {
                c.stream_options
                    .get_or_insert_with(StreamOptions::default)
                    .include_usage = Some(true);
            }
            serde_json::to_vec(&c)
        }
        Parsed::Completion(mut c) => {
            c.model = model;
            c.max_tokens = max_tokens;
            if stream {
                c.stream_options
                    .get_or_insert_with(StreamOptions::default)
                    .include_usage = Some(true);
            }
            serde_json::to_vec(&c)
        }
        Parsed::Embedding(mut e) => {
            e.model = model;
            serde_json::to_vec(&e)
        }
        Parsed::Responses(mut r) => {
            r.model = model;
            r.max_output_tokens = max_tokens;
            serde_json::to_vec(&r.request)
        }
        Parsed::Messages { mut request, count } => {
            request.model = model;
            if !count {
                request.max_tokens = max_tokens;
            }
            serde_json::to_vec(&request.request)
        }
    }
    .map_err(|e| {
        GatewayError::bad_request(
            Invalid::Request,
            format!("cannot re-encode the request: {e}"),
            None,
        )
    })
}

/// Whether the body may name `stream_options` (`null` parses as absent, and a key may be written
/// with escapes): appending the member would then repeat a key, which strict parsers refuse.
fn mentions_stream_options(body: &[u8]) -> bool {
    // Built once: a searcher costs more to make than to run over a small body.
    static KEY: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"stream_options"));
    static ESCAPE: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\\u"));
    KEY.find(body).is_some() || ESCAPE.find(body).is_some()
}

/// A JSON object's bytes with `"stream_options":{"include_usage":true}` added as its last
/// member: the usage chunk the gateway counts tokens with, asked for without writing the rest of
/// the body again. `None` if `object` does not end with `}`.
fn with_usage_asked(object: &[u8]) -> Option<Vec<u8>> {
    const MEMBER: &[u8] = br#""stream_options":{"include_usage":true}}"#;
    let inner = object.trim_ascii_end().strip_suffix(b"}")?;
    let mut out = Vec::with_capacity(inner.len() + MEMBER.len() + 1);
    out.extend_from_slice(inner);
    if !inner.trim_ascii_end().ends_with(b"{") {
        out.push(b',');
    }
    out.extend_from_slice(MEMBER);
    Some(out)
}

/// Stage 3: the route serving the request: its model's (404 if none, 403 if the tenant may not use
/// it), or where one of that route's rules sends it (one hop).
pub(crate) fn route_for(
    table: &Table,
    parsed: &Parsed,
    tenant: &Tenant,
    headers: &HeaderMap,
) -> Result<Arc<Route>, GatewayError> {
    let Some(route) = table.route(parsed.model()) else {
        return Err(GatewayError::ModelNotFound(
            parsed.model().chars().take(100).collect(),
        ));
    };
    if !tenant.may_use(&route.config.model) {
        return Err(GatewayError::ModelNotAllowed {
            team: tenant.team.to_string(),
            model: route.config.model.clone(),
        });
    }
    if route.config.redirect.is_empty() {
        return Ok(route.clone());
    }
    let target = route
        .redirect(parsed.max_tokens(), parsed.input_tokens(route), headers)
        .and_then(|to| table.route(to));
    Ok(target.unwrap_or(route).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::FuzzRoute;

    fn route(extra: &str) -> FuzzRoute {
        let yaml = format!(
            "listen: 127.0.0.1:1\nroutes:\n  - model: m\n    replicas: [http://127.0.0.1:2]\n{extra}    classes:\n      - {{ name: a, concurrency: 1, queue: 1, queue_wait: 1s }}\n"
        );
        FuzzRoute::new(&crate::config::Config::from_yaml(&yaml).unwrap()).unwrap()
    }

    fn upstream_body(route: &FuzzRoute, body: &str) -> String {
        let sent = route
            .prepare(true, &HeaderMap::new(), body.as_bytes())
            .unwrap()
            .body;
        String::from_utf8(sent.to_vec()).unwrap()
    }

    #[test]
    fn the_usage_member_is_added_last_to_the_objects_bytes() {
        let member = r#""stream_options":{"include_usage":true}}"#;
        assert_eq!(
            with_usage_asked(b"{\"a\":1}").unwrap(),
            format!("{{\"a\":1,{member}").as_bytes()
        );
        assert_eq!(
            with_usage_asked(b"{\"a\":1 }\r\n").unwrap(),
            format!("{{\"a\":1 ,{member}").as_bytes()
        );
        assert_eq!(
            with_usage_asked(b"{ }").unwrap(),
            format!("{{ {member}").as_bytes()
        );
        assert_eq!(with_usage_asked(b"[1]"), None);
    }

    /// The client's body goes upstream byte for byte (its spacing, key order and numbers as
    /// written) unless the gateway changes a member; a stream's usage member is added to it.
    #[test]
    fn the_clients_body_is_sent_as_it_came_unless_a_member_changes() {
        let plain = route("");
        let whole = r#"{ "messages": [{"role":"user","content":"hi"}], "model": "m", "temperature": 1.0, "max_tokens": 8 }"#;
        assert_eq!(upstream_body(&plain, whole), whole);
        let asked = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#;
        assert_eq!(upstream_body(&plain, asked), asked);
        let streamed =
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1.0,"stream":true}"#;
        assert_eq!(
            upstream_body(&plain, streamed),
            format!(
                r#"{},"stream_options":{{"include_usage":true}}}}"#,
                &streamed[..streamed.len() - 1]
            )
        );
        // Written again: stream options the client set, a model renamed, a default or a clamp.
        let options = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"continuous_usage_stats":true}}"#;
        let v: serde_json::Value = serde_json::from_str(&upstream_body(&plain, options)).unwrap();
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"continuous_usage_stats": true, "include_usage": true})
        );
        // `null` parses as absent, and a key may hide behind escapes: written again, one key.
        for named in [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":null}"#,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_\u006fptions":null}"#,
        ] {
            let sent = upstream_body(&plain, named);
            let typed: ChatCompletionRequest = parse_json(sent.as_bytes()).expect("no key twice");
            assert_eq!(
                typed.stream_options.and_then(|o| o.include_usage),
                Some(true),
                "{sent}"
            );
        }
        let renamed = route("    upstream_model: up\n");
        let v: serde_json::Value = serde_json::from_str(&upstream_body(&renamed, whole)).unwrap();
        assert_eq!(
            (&v["model"], &v["max_tokens"], &v["temperature"]),
            (&"up".into(), &8.into(), &1.0.into())
        );
        let capped = route("    limits: { max_tokens: { default: 4, cap: 6 }, over_cap: clamp }\n");
        let v: serde_json::Value = serde_json::from_str(&upstream_body(&capped, whole)).unwrap();
        assert_eq!(v["max_tokens"], 6);
        let v: serde_json::Value = serde_json::from_str(&upstream_body(&capped, streamed)).unwrap();
        assert_eq!(
            (&v["max_tokens"], &v["stream_options"]["include_usage"]),
            (&4.into(), &true.into())
        );
    }
}
