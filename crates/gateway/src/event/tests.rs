use super::*;

fn early(json: &str) -> EarlyError {
    Event::read(format!("data: {json}\n\n").as_bytes()).early_error()
}

#[test]
fn an_error_events_status_is_its_code() {
    let status = |json: &str| early(json).status;
    assert_eq!(
        status(r#"{"error":{"message":"x","code":429}}"#),
        Some(axum::http::StatusCode::from_u16(429).unwrap())
    );
    assert_eq!(
        status(r#"{"error": {"message": "x", "code": "503"}}"#),
        Some(axum::http::StatusCode::from_u16(503).unwrap())
    );
    assert_eq!(
        status(r#"{"error":{"message":"x","code":"upstream_busy"}}"#),
        None
    );
    assert_eq!(status(r#"{"error":{"message":"x","code":200}}"#), None);
    assert_eq!(status(r#"{"error":{"message":"x"}}"#), None);
    assert_eq!(
        early(r#"{"error": {}}"#).body,
        Bytes::from_static(b"{\"error\": {}}")
    );
    let kind = |e: &[u8]| Event::read(e).kind();
    assert_eq!(kind(b"data: {\"error\": {}}\n\n"), EventKind::Error);
    assert_eq!(kind(b"\ndata:{ \"error\":{}}\n\n"), EventKind::Error);
    // Wherever the member stands, and over several lines.
    assert_eq!(
        kind(b"data: {\"id\":\"x\",\ndata: \"error\":{}}\n\n"),
        EventKind::Error
    );
    assert_eq!(kind(b"data: {\"id\":\"x\",\"error\":null}\n\n"), EventKind::Other);
    assert_eq!(kind(b": error\n\n"), EventKind::Other);
    assert_eq!(kind(b"data: {\"error\":\n\n"), EventKind::Other);
}

#[test]
fn kinds_are_told_apart() {
    assert_eq!(classify(b"data: [DONE]\n\n"), EventKind::Done);
    assert_eq!(
        classify(
            br#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}"#
        ),
        EventKind::Usage
    );
    assert_eq!(
        classify(br#"data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}"#),
        EventKind::Tokens
    );
    // json.dumps' separators, which the byte search of before missed (a 504 for a healthy stream).
    assert_eq!(
        classify(br#"data: {"choices": [{"index": 0, "delta": {"content": "t0 "}}]}"#),
        EventKind::Tokens
    );
    assert_eq!(
        classify(br#"data: {"choices":[{"index":0,"text":"x"}]}"#),
        EventKind::Tokens
    );
    assert_eq!(
        classify(br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#),
        EventKind::Other
    );
    // Reasoning (vLLM 0.32's field and the older one) and tool calls are generated tokens.
    for delta in [
        r#"{"reasoning":"Let"}"#,
        r#"{"reasoning_content":"Let"}"#,
        r#"{"content":null,"reasoning":" me"}"#,
        r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}"#,
    ] {
        let event = format!(r#"data: {{"choices":[{{"index":0,"delta":{delta}}}]}}"#);
        assert_eq!(classify(event.as_bytes()), EventKind::Tokens, "{delta}");
    }
    for delta in [
        r#"{"reasoning":""}"#,
        r#"{"reasoning_content":""}"#,
        r#"{"reasoning":null}"#,
        r#"{"tool_calls":[]}"#,
    ] {
        let event = format!(r#"data: {{"choices":[{{"index":0,"delta":{delta}}}]}}"#);
        assert_eq!(classify(event.as_bytes()), EventKind::Other, "{delta}");
    }
    assert_eq!(
        classify(br#"data: {"choices":[{"delta":{},"finish_reason":"stop"}]}"#),
        EventKind::Other
    );
    assert_eq!(classify(b": ping\n\n"), EventKind::Other);
    // After a stray blank line, which the splitter leaves at the next event's start.
    assert_eq!(classify(b"\r\ndata: [DONE]\n\n"), EventKind::Done);
    assert_eq!(classify(b"\ndata: [DONE]\n\n"), EventKind::Done);
    assert_eq!(classify(b"\n"), EventKind::Other);
}

fn appended(r: &Rename, event: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    Event::read(event).append(Some(r), &mut out);
    out.to_vec()
}

#[test]
fn the_public_model_name_replaces_the_upstream_one_in_every_style() {
    let r = Rename::new("spark-chat", "corp-chat");
    for (event, expected) in [
        (
            &b"data: {\"id\":\"x\",\"model\":\"spark-chat\",\"choices\":[]}\n\n"[..],
            &b"data: {\"id\":\"x\",\"model\":\"corp-chat\",\"choices\":[]}\n\n"[..],
        ),
        (
            b"data: {\"id\": \"x\", \"model\": \"spark-chat\"}\r\n\r\n",
            b"data: {\"id\": \"x\", \"model\": \"corp-chat\"}\r\n\r\n",
        ),
        (
            b"event: chunk\ndata:{\"model\" : \"spark\\u002dchat\"}\n\n",
            b"event: chunk\ndata:{\"model\" : \"corp-chat\"}\n\n",
        ),
        (
            b"data: {\ndata:   \"model\": \"spark-chat\"\ndata: }\n\n",
            b"data: {\ndata:   \"model\": \"corp-chat\"\ndata: }\n\n",
        ),
        // Not the top level's, not the name, not JSON: as it was.
        (
            b"data: {\"x\":{\"model\":\"spark-chat\"}}\n\n",
            b"data: {\"x\":{\"model\":\"spark-chat\"}}\n\n",
        ),
        (
            b"data: {\"model\":\"other\"}\n\n",
            b"data: {\"model\":\"other\"}\n\n",
        ),
        (
            b"data: {\"model\":\"spark-chat\"\n\n",
            b"data: {\"model\":\"spark-chat\"\n\n",
        ),
    ] {
        assert_eq!(
            String::from_utf8_lossy(&appended(&r, event)),
            String::from_utf8_lossy(expected)
        );
    }
    let body = Bytes::from_static(b"{\"id\": \"x\",\n  \"model\": \"spark-chat\",\n  \"choices\": []}");
    assert_eq!(
        &r.apply(body)[..],
        b"{\"id\": \"x\",\n  \"model\": \"corp-chat\",\n  \"choices\": []}"
    );
}

/// A whole answer's usage is the top level's, wherever it stands; a truncated body has none,
/// nor one without its prompt.
#[test]
fn usage_is_the_top_levels_wherever_it_stands() {
    let u = r#"{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}"#;
    let nested = r#"{"prompt_tokens":70,"completion_tokens":90,"total_tokens":160}"#;
    for (body, expected) in [
        (format!(r#"{{"id":"x","choices":[],"usage":{u}}}"#), Some((3, 5))),
        (format!("{{\"choices\":[], \"usage\" : {u} }}\n"), Some((3, 5))),
        (format!(r#"{{"usage":{u},"id":"x"}}"#), Some((3, 5))),
        (
            format!(r#"{{"usage":{u},"x":{{"usage":{nested}}}}}"#),
            Some((3, 5)),
        ),
        (
            format!(r#"{{"x":{{"usage":{nested}}},"usage":{u}}}"#),
            Some((3, 5)),
        ),
        (format!(r#"{{"x":{{"usage":{nested}}}}}"#), None),
        (r#"{"id":"x","usage":null}"#.to_string(), None),
        // An embedding's usage: its input, nothing generated.
        (
            r#"{"id":"x","usage":{"prompt_tokens":3,"total_tokens":3}}"#.to_string(),
            Some((3, 0)),
        ),
        (r#"{"id":"x","usage":{"completion_tokens":3}}"#.to_string(), None),
        (format!(r#"{{"id":"x","usage":{u}"#), None),
        ("not json".to_string(), None),
    ] {
        assert_eq!(parse_usage(body.as_bytes()), expected, "{body}");
    }
    let chunk =
        b"data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 5}}\r\n\r\n";
    let e = Event::read(chunk);
    assert_eq!((e.kind(), e.usage()), (EventKind::Usage, Some((3, 5))));
}

/// The `sse_judge` fuzz target's corpus (seeds in every style, and what runs kept), replayed:
/// the test command runs the fuzz check on stable this way.
#[test]
fn the_fuzz_corpus_reads_as_a_parse_reads_it() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/sse_judge");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        check(&bytes);
        n += 1;
    }
    assert!(n >= 30, "{n} inputs in {}", dir.display());
}

#[test]
fn usage_is_taken_from_the_usage_chunk_or_a_chunk_that_counts_what_was_generated() {
    let usage = |e: &str| Event::read(e.as_bytes()).usage();
    assert_eq!(
        usage(r#"data: {"choices":[],"usage":{"prompt_tokens":3}}"#),
        Some((3, 0))
    );
    // vLLM's continuous usage stats: the counts so far, on a token's chunk.
    assert_eq!(
        usage(
            r#"data: {"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#
        ),
        Some((3, 2))
    );
    // The prompt alone on a token's chunk says nothing of what was generated.
    assert_eq!(
        usage(r#"data: {"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":3}}"#),
        None
    );
}

/// A stream's token chunks after the first are read the short way when only their text differs,
/// and every one is judged as a parse judges it; a chunk whose text needs an escape, or that
/// differs elsewhere, is read in full.
#[test]
fn a_streams_next_chunks_are_read_the_short_way_and_judged_alike() {
    let chunk = |text: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"sim\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let mut reader = Reader::default();
    let first = chunk("t0 ", "null");
    assert_eq!(reader.read(first.as_bytes()).kind(), EventKind::Tokens);
    for (text, finish, short) in [
        ("a much longer token ", "null", true),
        ("é", "null", true),
        ("x", "null", true),
        ("", "null", false),
        ("q\\\"", "null", false),
        ("y", "\"length\"", false),
    ] {
        let e = chunk(text, finish);
        assert_eq!(reader.short(e.as_bytes()).is_some(), short, "{e}");
        let read = reader.read(e.as_bytes());
        let expected = protocol::judge::reference::judge(e.as_bytes());
        assert_eq!(read.kind(), expected.kind, "{e}");
        assert_eq!(read.judgement.models.last(read.data()), expected.model, "{e}");
        // The rename, the short way too.
        let mut out = BytesMut::new();
        read.append(Some(&Rename::new("sim", "chat")), &mut out);
        assert_eq!(
            out.to_vec(),
            e.replace("\"model\":\"sim\"", "\"model\":\"chat\"").into_bytes()
        );
    }
}

/// The agents' streams as vLLM writes them, and as other servers might (a renamed model at each
/// place it stands, pretty JSON over several lines, CR LF), hold to `check_agents`.
#[test]
fn the_agents_streams_read_alike_before_and_after_a_rename() {
    for fixture in ["messages-stream.sse", "responses-stream.sse"] {
        let path = format!(
            "{}/../engine/tests/fixtures/vllm-0.32/{fixture}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).unwrap();
        check_agents(text.as_bytes());
        check_agents(text.replace("\"tiny\"", "\"up\"").as_bytes());
        check_agents(
            text.replace('\n', "\r\n")
                .replace("\"tiny\"", "\"up\"")
                .as_bytes(),
        );
    }
    check_agents(b"event: message_start\ndata: {\"type\":\"message_start\",\ndata: \"message\":{\"id\":\"m\",\"model\":\"up\",\"usage\":{\"input_tokens\":3}}}\n\n");
    check_agents(b"data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"x\"},\"model\":\"up\"}\n\n");
}
