//! Rendering generated tokens as OpenAI responses: streamed SSE chunks and whole completions.

use crate::engine::Generation;
use crate::scheduler::{FinishReason, Progress};
use crate::text;
use axum::body::Body;
use bytes::{BufMut, Bytes, BytesMut};
use protocol::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, CompletionChoice,
    CompletionChunk, CompletionResponse, Delta, ResponseMessage, Usage,
};
use protocol::sse;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenderKind {
    Chat,
    Completion,
}

/// Everything constant across a response's chunks, with the hot token chunk's JSON prefix prebuilt.
pub(crate) struct Render {
    kind: RenderKind,
    id: String,
    created: u64,
    model: String,
    seed: u64,
    token_prefix: Vec<u8>,
    /// How the events are written (compact, as built here, then rewritten if another style).
    pub(crate) style: sse::Style,
}

impl Render {
    pub(crate) fn new(kind: RenderKind, seq: u64, created: u64, model: String) -> Self {
        let (id, object) = match kind {
            RenderKind::Chat => (format!("chatcmpl-{seq:016x}"), "chat.completion.chunk"),
            RenderKind::Completion => (format!("cmpl-{seq:016x}"), "text_completion"),
        };
        let model_json = serde_json::to_string(&model).unwrap_or_else(|_| "\"\"".into());
        let token_prefix = format!(
            "data: {{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},\"choices\":[{{\"index\":"
        )
        .into_bytes();
        Self {
            kind,
            id,
            created,
            model,
            seed: seq,
            token_prefix,
            style: sse::Style::Compact,
        }
    }

    /// The events of `buf` as this response's style writes them.
    fn styled(&self, buf: BytesMut) -> Bytes {
        match self.style {
            sse::Style::Compact => buf.freeze(),
            style => Bytes::from(style.restyle(&buf)),
        }
    }

    /// A token's chunk; the last one of a choice carries its finish reason, as vLLM's does.
    fn token_chunk(&self, buf: &mut BytesMut, choice: u32, word: &str, finish: Option<FinishReason>) {
        buf.put_slice(&self.token_prefix);
        buf.put_slice(choice.to_string().as_bytes());
        match self.kind {
            RenderKind::Chat => buf.put_slice(b",\"delta\":{\"content\":\""),
            RenderKind::Completion => buf.put_slice(b",\"text\":\""),
        }
        // Filler words are plain ASCII without quotes or backslashes: no escaping needed.
        buf.put_slice(word.as_bytes());
        match self.kind {
            RenderKind::Chat => buf.put_slice(b"\"},\"logprobs\":null,\"finish_reason\":"),
            RenderKind::Completion => buf.put_slice(b"\",\"logprobs\":null,\"finish_reason\":"),
        }
        match finish {
            None => buf.put_slice(b"null}]}\n\n"),
            Some(reason) => {
                buf.put_slice(b"\"");
                buf.put_slice(reason.as_str().as_bytes());
                buf.put_slice(b"\",\"stop_reason\":null}]}\n\n");
            }
        }
    }

    fn role_chunk(&self, buf: &mut BytesMut, choice: u32) {
        if self.kind == RenderKind::Chat {
            let delta = Delta {
                role: Some("assistant".into()),
                content: Some(String::new()),
            };
            sse::write_event(buf, &self.chat_chunk(choice, delta, None));
        }
    }

    fn finish_chunk(&self, buf: &mut BytesMut, choice: u32, reason: FinishReason) {
        let reason = Some(reason.as_str().to_owned());
        match self.kind {
            RenderKind::Chat => sse::write_event(buf, &self.chat_chunk(choice, Delta::default(), reason)),
            RenderKind::Completion => sse::write_event(
                buf,
                &CompletionChunk {
                    id: self.id.clone(),
                    object: "text_completion".into(),
                    created: self.created,
                    model: self.model.clone(),
                    choices: vec![CompletionChoice {
                        index: choice,
                        text: String::new(),
                        logprobs: None,
                        finish_reason: reason,
                    }],
                    usage: None,
                },
            ),
        }
    }

    fn usage_chunk(&self, buf: &mut BytesMut, usage: Usage) {
        match self.kind {
            RenderKind::Chat => sse::write_event(
                buf,
                &ChatCompletionChunk {
                    id: self.id.clone(),
                    object: "chat.completion.chunk".into(),
                    created: self.created,
                    model: self.model.clone(),
                    choices: Vec::new(),
                    usage: Some(usage),
                },
            ),
            RenderKind::Completion => sse::write_event(
                buf,
                &CompletionChunk {
                    id: self.id.clone(),
                    object: "text_completion".into(),
                    created: self.created,
                    model: self.model.clone(),
                    choices: Vec::new(),
                    usage: Some(usage),
                },
            ),
        }
    }

    fn chat_chunk(&self, index: u32, delta: Delta, finish_reason: Option<String>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice {
                index,
                delta,
                logprobs: None,
                finish_reason,
            }],
            usage: None,
        }
    }

    fn text_of(&self, choice: u32, tokens: u32) -> String {
        (0..tokens)
            .map(|i| text::token(self.seed + u64::from(choice), i))
            .collect()
    }

    /// The non-streamed answer for finished choices.
    pub(crate) fn full_response(&self, prompt_tokens: u32, finals: &[Progress]) -> Vec<u8> {
        let completion: u32 = finals.iter().map(|p| p.tokens).sum();
        let usage = Some(Usage::new(prompt_tokens, completion));
        let reason = |p: &Progress| p.finish.map(|f| f.as_str().to_owned());
        let body = match self.kind {
            RenderKind::Chat => serde_json::to_vec(&ChatCompletionResponse {
                id: self.id.clone(),
                object: "chat.completion".into(),
                created: self.created,
                model: self.model.clone(),
                choices: finals
                    .iter()
                    .zip(0u32..)
                    .map(|(p, i)| ChatChoice {
                        index: i,
                        message: ResponseMessage {
                            role: "assistant".into(),
                            content: Some(self.text_of(i, p.tokens)),
                        },
                        logprobs: None,
                        finish_reason: reason(p),
                    })
                    .collect(),
                usage,
            }),
            RenderKind::Completion => serde_json::to_vec(&CompletionResponse {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model.clone(),
                choices: finals
                    .iter()
                    .zip(0u32..)
                    .map(|(p, i)| CompletionChoice {
                        index: i,
                        text: self.text_of(i, p.tokens),
                        logprobs: None,
                        finish_reason: reason(p),
                    })
                    .collect(),
                usage,
            }),
        };
        body.unwrap_or_default()
    }
}

/// A streamed response: reads the choices' progress and writes every new token as its own chunk.
/// Dropping it (the client left) drops the receivers, which aborts the sequences.
pub(crate) struct TokenStream {
    generation: Generation,
    render: Render,
    include_usage: bool,
    sent: Vec<u32>,
    finished: Vec<bool>,
    done: bool,
}

impl TokenStream {
    pub(crate) fn new(generation: Generation, render: Render, include_usage: bool) -> Self {
        let n = generation.choices.len();
        Self {
            generation,
            render,
            include_usage,
            sent: vec![0; n],
            finished: vec![false; n],
            done: false,
        }
    }

    pub(crate) fn into_body(self) -> Body {
        let stream =
            futures::stream::unfold(self, |mut s| async move { s.next().await.map(|item| (item, s)) });
        Body::from_stream(stream)
    }

    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        loop {
            let mut buf = BytesMut::new();
            for (i, rx) in self.generation.choices.iter_mut().enumerate() {
                let p = *rx.borrow_and_update();
                let choice = i as u32;
                if p.tokens > self.sent[i] {
                    if self.sent[i] == 0 {
                        self.render.role_chunk(&mut buf, choice);
                    }
                    let finish = p
                        .finish
                        .filter(|r| !matches!(r, FinishReason::Error | FinishReason::Abort));
                    for t in self.sent[i]..p.tokens {
                        let word = text::token(self.render.seed + u64::from(choice), t);
                        let last = t + 1 == p.tokens;
                        self.render
                            .token_chunk(&mut buf, choice, word, finish.filter(|_| last));
                    }
                    self.sent[i] = p.tokens;
                    self.finished[i] |= finish.is_some();
                }
                if let Some(reason) = p.finish
                    && !self.finished[i]
                {
                    if matches!(reason, FinishReason::Error | FinishReason::Abort) {
                        // Cut the stream as a dying server would: no finish chunk, no [DONE].
                        self.done = true;
                        return Some(Err(std::io::Error::other("engine failed during generation")));
                    }
                    self.finished[i] = true;
                    self.render.finish_chunk(&mut buf, choice, reason);
                }
            }
            if self.finished.iter().all(|f| *f) {
                if self.include_usage {
                    let completion = self.sent.iter().sum();
                    self.render
                        .usage_chunk(&mut buf, Usage::new(self.generation.prompt_tokens, completion));
                }
                buf.put_slice(sse::DONE);
                self.done = true;
                return Some(Ok(self.render.styled(buf)));
            }
            if !buf.is_empty() {
                return Some(Ok(self.render.styled(buf)));
            }
            if !self.wait_for_change().await {
                self.done = true;
                return Some(Err(std::io::Error::other("engine dropped the request")));
            }
        }
    }

    /// Waits until any unfinished choice has news; false if a sequence vanished without finishing.
    async fn wait_for_change(&mut self) -> bool {
        if let [only] = self.generation.choices.as_mut_slice() {
            return only.changed().await.is_ok();
        }
        let waits: Vec<_> = self
            .generation
            .choices
            .iter_mut()
            .zip(&self.finished)
            .filter(|(_, f)| !**f)
            .map(|(rx, _)| Box::pin(rx.changed()))
            .collect();
        // Not empty: `next` returns before waiting once every choice has finished.
        futures::future::select_all(waits).await.0.is_ok()
    }
}
