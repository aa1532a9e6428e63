use super::*;

#[test]
fn an_error_events_status_is_its_code() {
    let status = |json: &str| EarlyError::parse(format!("data: {json}\n\n").as_bytes()).status;
    assert_eq!(
        status(r#"{"error":{"message":"x","code":429}}"#),
        Some(axum::http::StatusCode::from_u16(429).unwrap())
    );
    assert_eq!(
        status(r#"{"error":{"message":"x","code":"503"}}"#),
        Some(axum::http::StatusCode::from_u16(503).unwrap())
    );
    assert_eq!(
        status(r#"{"error":{"message":"x","code":"upstream_busy"}}"#),
        None
    );
    assert_eq!(status(r#"{"error":{"message":"x","code":200}}"#), None);
    assert_eq!(status(r#"{"error":{"message":"x"}}"#), None);
    assert_eq!(status(r#"{"error":"#), None);
    assert!(is_error_event(b"data: {\"error\": {}}\n\n"));
    assert!(is_error_event(b"\ndata:{ \"error\":{}}\n\n"));
    assert!(!is_error_event(b"data: {\"id\":\"x\",\"error\":null}\n\n"));
    assert!(!is_error_event(b": error\n\n"));
}

#[test]
fn kinds_are_told_apart_without_parsing() {
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

#[test]
fn the_public_model_name_replaces_the_upstream_one() {
    let r = Rename::new("spark-chat", "corp-chat");
    let e = Bytes::from_static(b"data: {\"id\":\"x\",\"model\":\"spark-chat\",\"choices\":[]}\n\n");
    assert_eq!(
        &r.apply(e)[..],
        b"data: {\"id\":\"x\",\"model\":\"corp-chat\",\"choices\":[]}\n\n"
    );
    let other = Bytes::from_static(b"data: {\"model\":\"other\"}\n\n");
    assert_eq!(r.apply(other.clone()), other);
}

#[test]
fn usage_is_read_from_a_chunk_or_a_body() {
    let chunk = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5,\"total_tokens\":8}}\n\n";
    assert_eq!(parse_usage(chunk), Some((3, 5)));
    assert_eq!(
        parse_usage(br#"{"id":"x","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#),
        Some((1, 2))
    );
    assert_eq!(parse_usage(b"not json"), None);
}

/// The short way (usage last) and the whole parse agree; a usage nested deeper, or not last,
/// is read by the whole parse, which takes the top level's; a truncated body has none, nor one
/// without its prompt.
#[test]
fn usage_is_the_top_levels_wherever_it_stands() {
    let u = r#"{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}"#;
    let nested = r#"{"prompt_tokens":70,"completion_tokens":90,"total_tokens":160}"#;
    for (body, expected) in [
        (
            format!(r#"data: {{"id":"x","choices":[],"usage":{u}}}"#),
            Some((3, 5)),
        ),
        (
            format!("data: {{\"choices\":[], \"usage\" : {u} }}\n\n"),
            Some((3, 5)),
        ),
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
    ] {
        assert_eq!(parse_usage(body.as_bytes()), expected, "{body}");
    }
    assert_eq!(usage_last(format!(r#"{{"usage":{u}}}"#).as_bytes()), Some((3, 5)));
    assert_eq!(usage_last(format!(r#"{{"x":{{"usage":{u}}}}}"#).as_bytes()), None);
}

/// The hand-read usage is serde's wherever the hand reading answers, and answers for what
/// vLLM and OpenAI write: every body here, and each cut short or with one byte changed.
#[test]
fn flat_usage_agrees_with_serde() {
    let serde = |json: &[u8]| -> Option<((u32, u32), usize)> {
        let mut objects = serde_json::Deserializer::from_slice(json).into_iter::<Usage>();
        let usage = objects.next()?.ok()?;
        Some((
            (usage.prompt_tokens, usage.completion_tokens),
            objects.byte_offset(),
        ))
    };
    let bodies = [
        r#"{"prompt_tokens":5,"total_tokens":21,"completion_tokens":16,"prompt_tokens_details":null}"#,
        r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#,
        r#" { "prompt_tokens" : 0 ,
            "completion_tokens":4294967295 } "#,
        r#"{"prompt_tokens":4294967296,"completion_tokens":1}"#,
        r#"{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens":3}"#,
        r#"{"prompt_tokens":1.0,"completion_tokens":2}"#,
        r#"{"prompt_tokens":1e2,"completion_tokens":2}"#,
        r#"{"prompt_tokens":-1,"completion_tokens":2}"#,
        r#"{"prompt_tokens":01,"completion_tokens":2}"#,
        r#"{"prompt_tokens":"1","completion_tokens":2}"#,
        r#"{"prompt_tokens":null,"completion_tokens":2}"#,
        r#"{"completion_tokens":2}"#,
        r#"{"prompt_t\u006fkens":1,"completion_tokens":2}"#,
        r#"{"prompt_tokens":1,"completion_tokens":2,"x":[1,2],"y":"z","w":true}"#,
        r#"{"prompt_tokens":1,"completion_tokens":2,"d":{"a":{"b":1}}}"#,
        r#"{"prompt_tokens":1,"completion_tokens":2,}"#,
        r#"{}"#,
    ];
    let mut answered = 0;
    for body in bodies {
        let body = body.as_bytes();
        let mut variants = vec![body.to_vec()];
        for i in 0..body.len() {
            variants.push(body[..i].to_vec());
            for b in [
                b'}', b'{', b'"', b',', b':', b'0', b'9', b' ', b'x', b'\\', b'.', b'-', 0xff,
            ] {
                let mut v = body.to_vec();
                v[i] = b;
                variants.push(v);
            }
        }
        for v in variants {
            if let Some(read) = flat_usage(&v) {
                answered += 1;
                assert_eq!(Some(read), serde(&v), "{}", String::from_utf8_lossy(&v));
            }
        }
    }
    for body in &bodies[..3] {
        assert!(flat_usage(body.as_bytes()).is_some(), "{body}");
    }
    assert!(answered > 500, "{answered}");
}
