//! One answer's stream read to its end, in the API it was asked in: TTFT at the first event that
//! carries generated tokens, every gap after it, the tokens and how the stream ended.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use protocol::judge::Kind;
use tokio::time::Instant;

use crate::events;
use crate::request::{Api, Outcome, Record};

/// The event that ends a whole answer of `api`.
fn last_event(api: Api) -> &'static str {
    match api {
        Api::Chat | Api::Completions => "[DONE]",
        Api::Responses => "response.completed",
        Api::Messages => "message_stop",
    }
}

/// Reads an SSE body to its end, timing every event that carries generated tokens (text,
/// reasoning, tool-call arguments). An event of only a role, a block's start or usage is not a
/// token; comments and keep-alives are skipped by the SSE parser.
pub async fn read_stream<S, E>(api: Api, body: S, sent: Instant, rec: &mut Record)
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut body = body;
    let mut splitter = protocol::sse::EventSplitter::default();
    let mut pending = Vec::new();
    let mut last = None::<Instant>;
    let mut chunks = 0u32;
    let mut usage_tokens = None;
    let mut done = false;
    'read: while let Some(piece) = body.next().await {
        let now = Instant::now();
        let piece = match piece {
            Ok(p) => p,
            Err(e) => {
                rec.outcome = Outcome::Transport;
                rec.error = Some(format!("reading the stream: {e}"));
                rec.output_tokens = usage_tokens.unwrap_or(chunks);
                return;
            }
        };
        splitter.feed(&piece, |e| pending.push(e));
        for event in pending.drain(..) {
            // The gateway's own reading of an event (protocol::judge, protocol::agents), so that
            // the two agree on which event is the first token.
            let Some(ev) = events::read(api, &event, rec.id.is_none()) else {
                continue;
            };
            if ev.id.is_some() {
                rec.id = ev.id;
            }
            rec.input_tokens = ev.input_tokens.or(rec.input_tokens);
            usage_tokens = ev.output_tokens.or(usage_tokens);
            match ev.kind {
                Kind::Done => {
                    done = true;
                    rec.e2e = now.saturating_duration_since(sent);
                    // Read on to the end of the body: a connection dropped mid-body cannot go back
                    // to the pool, and the next request would pay for a new one.
                    while let Some(Ok(_)) = body.next().await {}
                    break 'read;
                }
                Kind::Error => {
                    let err = ev.error.unwrap_or_default();
                    // Before any token, an error event is the server's answer, as vLLM refuses a
                    // request its full queue cannot take (a 503 inside a 200 stream).
                    rec.outcome = match err.status {
                        Some(code) if last.is_none() => Outcome::Status { code },
                        _ => Outcome::StreamError,
                    };
                    rec.error = Some(err.message.unwrap_or_else(|| "error event".to_owned()));
                    rec.output_tokens = usage_tokens.unwrap_or(chunks);
                    return;
                }
                Kind::Tokens => {
                    chunks += 1;
                    match last {
                        None => rec.ttft = Some(now.saturating_duration_since(sent)),
                        Some(prev) => rec.itl_us.push(
                            u32::try_from(now.saturating_duration_since(prev).as_micros())
                                .unwrap_or(u32::MAX),
                        ),
                    }
                    last = Some(now);
                }
                Kind::Usage | Kind::Other => {}
            }
        }
    }
    rec.output_tokens = usage_tokens.unwrap_or(chunks);
    if done {
        rec.outcome = Outcome::Ok;
    } else {
        rec.outcome = Outcome::Truncated;
        rec.error = Some(format!("the stream ended without {}", last_event(api)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn blank() -> Record {
        Record::unanswered(Duration::ZERO, Duration::ZERO, false)
    }

    const STREAM: &str = ": connected\n\n\
        data: {\"id\":\"chatcmpl-7\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
        : keep-alive\n\n\
        data: {\"id\":\"chatcmpl-7\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\n\
        data: {\"id\":\"chatcmpl-7\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u00e9\"}}]}\n\n\
        :\n\n\
        data: {\"id\":\"chatcmpl-7\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"length\"}]}\n\n\
        data: {\"id\":\"chatcmpl-7\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n\
        data: [DONE]\n\n";

    async fn parse_split(pieces: Vec<Vec<u8>>) -> Record {
        parse_split_as(Api::Chat, pieces).await
    }

    async fn parse_split_as(api: Api, pieces: Vec<Vec<u8>>) -> Record {
        let mut rec = blank();
        let stream = futures::stream::iter(
            pieces
                .into_iter()
                .map(|p| Ok::<_, std::io::Error>(Bytes::from(p))),
        );
        read_stream(api, stream, Instant::now(), &mut rec).await;
        rec
    }

    #[tokio::test]
    async fn chunks_split_anywhere_parse_the_same() {
        let bytes = STREAM.as_bytes();
        for a in 0..bytes.len() {
            for b in [a + 1, a + 7, a + 40] {
                let b = b.min(bytes.len());
                let pieces = vec![bytes[..a].to_vec(), bytes[a..b].to_vec(), bytes[b..].to_vec()];
                let rec = parse_split(pieces).await;
                assert_eq!(rec.outcome, Outcome::Ok, "split at {a},{b}");
                assert_eq!(rec.output_tokens, 3);
                assert_eq!(rec.input_tokens, Some(12));
                assert_eq!(rec.itl_us.len(), 2, "three content chunks give two gaps");
                assert!(rec.ttft.is_some());
                assert_eq!(rec.id.as_deref(), Some("chatcmpl-7"));
            }
        }
        let one_byte_at_a_time = bytes.iter().map(|b| vec![*b]).collect();
        assert_eq!(parse_split(one_byte_at_a_time).await.itl_us.len(), 2);
    }

    /// The same stream as a Python server writes it (json.dumps' spaces, pretty JSON over several
    /// `data:` lines, CR line ends): read alike, as the gateway reads it.
    #[tokio::test]
    async fn every_json_and_line_style_reads_the_same() {
        let styles = [
            STREAM.replace("\":", "\": ").replace("\",\"", "\", \""),
            STREAM.replace("\n\n", "\r\r").replace("\r\n\r\n", "\r\r"),
            STREAM.replace("data: {\"id\"", "data: {\ndata:  \"id\""),
        ];
        for style in styles {
            let rec = parse_split(vec![style.as_bytes().to_vec()]).await;
            assert_eq!(rec.outcome, Outcome::Ok, "{style}");
            assert_eq!((rec.output_tokens, rec.input_tokens), (3, Some(12)), "{style}");
            assert_eq!(rec.itl_us.len(), 2, "{style}");
            assert_eq!(rec.id.as_deref(), Some("chatcmpl-7"), "{style}");
        }
    }

    #[tokio::test]
    async fn error_events_and_cut_streams_are_failures() {
        let err = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                   data: {\"error\":{\"message\":\"upstream stalled\",\"type\":\"timeout\"}}\n\n";
        let rec = parse_split(vec![err.as_bytes().to_vec()]).await;
        assert_eq!(rec.outcome, Outcome::StreamError);
        assert_eq!(rec.error.as_deref(), Some("upstream stalled"));
        assert_eq!(rec.output_tokens, 1);

        let cut = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n";
        let rec = parse_split(vec![cut.as_bytes().to_vec()]).await;
        assert_eq!(rec.outcome, Outcome::Truncated);
        assert_eq!(rec.output_tokens, 2, "counted from chunks without usage");
    }

    /// vLLM 0.32 streams reasoning in `delta.reasoning` (older releases in
    /// `reasoning_content`) and tool calls in `delta.tool_calls`: each times a token.
    #[tokio::test]
    async fn every_delta_that_carries_tokens_is_timed() {
        let stream = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
            data: {\"choices\":[{\"delta\":{\"reasoning\":\"Let me\"}}]}\n\n\
            data: {\"choices\":[{\"delta\":{\"reasoning_content\":\" think\"}}]}\n\n\
            data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n\
            data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n\
            data: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n\
            data: [DONE]\n\n";
        let rec = parse_split(vec![stream.as_bytes().to_vec()]).await;
        assert_eq!(rec.outcome, Outcome::Ok);
        assert!(rec.ttft.is_some(), "the first reasoning delta is the first token");
        assert_eq!(rec.output_tokens, 4);
        assert_eq!(rec.itl_us.len(), 3);
    }

    /// vLLM's overload answer under `--max-num-queued-reqs`: a 200 stream of one error event
    /// (`code` an integer) and `[DONE]`. Before any token it is the status it names, an
    /// overload like a 503; after a token it is the stream's failure.
    #[tokio::test]
    async fn an_error_event_before_the_first_token_counts_as_its_status() {
        let busy = "data: {\"error\": {\"message\": \"The server is overloaded\", \"type\": \"ServiceUnavailableError\", \"param\": null, \"code\": 503}}\n\ndata: [DONE]\n\n";
        let rec = parse_split(vec![busy.as_bytes().to_vec()]).await;
        assert_eq!(rec.outcome, Outcome::Status { code: 503 });
        assert_eq!(rec.outcome.kind(), "http_503");
        let limited = busy.replace("503", "429");
        let rec = parse_split(vec![limited.into_bytes()]).await;
        assert_eq!(rec.outcome.kind(), "http_429");
        let named = busy.replace("503}", "\"queue_full\"}");
        let rec = parse_split(vec![named.into_bytes()]).await;
        assert_eq!(rec.outcome, Outcome::StreamError, "a code that names no status");
        let late = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"a\"}}}}]}}\n\n{busy}");
        let rec = parse_split(vec![late.into_bytes()]).await;
        assert_eq!(rec.outcome, Outcome::StreamError);
    }

    const RESPONSES: &str = include_str!("../../engine/tests/fixtures/vllm-0.32/responses-stream.sse");
    const MESSAGES: &str = include_str!("../../engine/tests/fixtures/vllm-0.32/messages-stream.sse");

    /// vLLM's own streams of both agent APIs, cut into three pieces at every byte (inside a
    /// `data:` line, between the CR and LF of nothing, inside the UTF-8 of a replacement
    /// character): the same tokens, usage, id and end each time.
    #[tokio::test]
    async fn agent_streams_split_anywhere_read_as_vllm_counted_them() {
        let cases = [
            (Api::Responses, RESPONSES, 3, 4, "resp_a866fc21525317cb"),
            (Api::Messages, MESSAGES, 4, 5, "chatcmpl-b1b6a9e04f4f4c4b"),
        ];
        for (api, stream, deltas, output, id) in cases {
            let bytes = stream.as_bytes();
            for a in 0..bytes.len() {
                for b in [a + 1, a + 3, a + 64] {
                    let b = b.min(bytes.len());
                    let pieces = vec![bytes[..a].to_vec(), bytes[a..b].to_vec(), bytes[b..].to_vec()];
                    let rec = parse_split_as(api, pieces).await;
                    let at = format!("{api} split at {a},{b}");
                    assert_eq!(rec.outcome, Outcome::Ok, "{at}");
                    assert_eq!(rec.output_tokens, output, "{at}: usage, not the count of deltas");
                    assert_eq!(rec.input_tokens, Some(20), "{at}");
                    assert_eq!(rec.itl_us.len(), deltas - 1, "{at}");
                    assert!(rec.ttft.is_some(), "{at}");
                    assert_eq!(rec.id.as_deref(), Some(id), "{at}");
                }
            }
            let one_byte_at_a_time = bytes.iter().map(|b| vec![*b]).collect();
            let rec = parse_split_as(api, one_byte_at_a_time).await;
            assert_eq!((rec.outcome, rec.output_tokens), (Outcome::Ok, output), "{api}");
        }
    }

    /// A stream cut before its last event is truncated, its tokens counted from the deltas seen;
    /// a chat stream's `[DONE]` is no end for these APIs' readers to wait for.
    #[tokio::test]
    async fn agent_streams_cut_before_their_last_event_are_truncated() {
        for (api, stream, end) in [
            (Api::Responses, RESPONSES, "event: response.completed"),
            (Api::Messages, MESSAGES, "event: message_delta"),
        ] {
            let cut = &stream[..stream.find(end).unwrap()];
            let rec = parse_split_as(api, vec![cut.as_bytes().to_vec()]).await;
            assert_eq!(rec.outcome, Outcome::Truncated, "{api}");
            assert!(rec.error.as_deref().unwrap().contains(last_event(api)), "{api}");
            assert_eq!(rec.output_tokens, if api == Api::Responses { 3 } else { 4 });
        }
    }

    /// Each API's error event before the first token is the status it names (Anthropic's
    /// `overloaded_error` the 503 a gateway answers it as); after a token it is the stream's failure.
    #[tokio::test]
    async fn agent_error_events_count_as_their_status_before_the_first_token() {
        let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let start = &MESSAGES[..MESSAGES.find("event: content_block_delta").unwrap()];
        let rec = parse_split_as(Api::Messages, vec![format!("{start}{overloaded}").into_bytes()]).await;
        assert_eq!(rec.outcome, Outcome::Status { code: 503 });
        assert_eq!(rec.error.as_deref(), Some("Overloaded"));
        let late = &MESSAGES[..MESSAGES.find("event: content_block_stop").unwrap()];
        let rec = parse_split_as(Api::Messages, vec![format!("{late}{overloaded}").into_bytes()]).await;
        assert_eq!(rec.outcome, Outcome::StreamError);
        assert_eq!(rec.output_tokens, 4);

        let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\"}}}\n\n";
        let rec = parse_split_as(Api::Responses, vec![failed.as_bytes().to_vec()]).await;
        assert_eq!(rec.outcome, Outcome::Status { code: 429 });
        assert_eq!(rec.outcome.kind(), "http_429");
        let busy = "data: {\"error\": {\"message\": \"The server is overloaded\", \"type\": \"ServiceUnavailableError\", \"param\": null, \"code\": 503}}\n\n";
        let rec = parse_split_as(Api::Responses, vec![busy.as_bytes().to_vec()]).await;
        assert_eq!(rec.outcome.kind(), "http_503");
        let mid = &RESPONSES[..RESPONSES.find("event: response.output_text.done").unwrap()];
        let rec = parse_split_as(Api::Responses, vec![format!("{mid}{failed}").into_bytes()]).await;
        assert_eq!(rec.outcome, Outcome::StreamError);
        assert_eq!(rec.error.as_deref(), Some("slow down"));
    }
}
