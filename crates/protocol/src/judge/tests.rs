use super::*;

/// A small generator (xorshift), so the generated cases are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The ways replicas write the same JSON.
#[derive(Clone, Copy, Debug)]
enum Style {
    /// As vLLM and serde write it.
    Compact,
    /// As Python's `json.dumps` does by default: `", "` and `": "`.
    Dumps,
    /// Indented, over several lines (and so several `data:` lines).
    Pretty,
}

fn write(value: &serde_json::Value, style: Style) -> String {
    match style {
        Style::Compact => serde_json::to_string(value).unwrap(),
        Style::Dumps => {
            // serde_json's pretty printer with no newlines is what `json.dumps` writes.
            let mut out = Vec::new();
            let fmt = serde_json::ser::PrettyFormatter::with_indent(b"");
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            serde::Serialize::serialize(value, &mut ser).unwrap();
            String::from_utf8(out)
                .unwrap()
                .replace(",\n", ", ")
                .replace("[\n", "[")
                .replace("{\n", "{")
                .replace("\n]", "]")
                .replace("\n}", "}")
        }
        Style::Pretty => serde_json::to_string_pretty(value).unwrap(),
    }
}

/// One SSE event holding `json`, its lines ended by `eol`, one `data:` line per line of `json`.
fn event(json: &str, eol: &str, space: bool) -> Vec<u8> {
    let mut out = String::new();
    for line in json.split('\n') {
        out.push_str(if space { "data: " } else { "data:" });
        out.push_str(line);
        out.push_str(eol);
    }
    out.push_str(eol);
    out.into_bytes()
}

fn chunk(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    let text = *rng.pick(&["", "t0 ", "héllo", "a\"b", "\n", "\\u00e9"]);
    let delta = match rng.below(8) {
        0 => json!({"role": "assistant", "content": ""}),
        1 => json!({"content": text}),
        2 => json!({"reasoning": text}),
        3 => json!({"reasoning_content": text, "content": null}),
        4 => json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a"}}]}),
        5 => json!({"tool_calls": []}),
        6 => json!({}),
        _ => json!({"content": 7}),
    };
    let choices = match rng.below(6) {
        0 => json!([]),
        1 => json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": null}]),
        2 => json!([{"index": 0, "delta": delta, "finish_reason": "stop"}]),
        3 => json!({"index": 0}),
        _ => json!([{"index": 0, "delta": delta, "logprobs": {"content": [{"token": "x"}]}}]),
    };
    let mut v = json!({
        "id": *rng.pick(&["chatcmpl-1", "cmpl-\u{e9}"]),
        "object": "chat.completion.chunk",
        "created": 1_700_000_000u64,
        "model": *rng.pick(&["up", "other", "u\u{70}"]),
        "choices": choices,
    });
    match rng.below(5) {
        0 => v["usage"] = json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}),
        1 => v["usage"] = json!({"prompt_tokens": 3, "prompt_tokens_details": null}),
        2 => v["usage"] = json!(null),
        _ => {}
    }
    if rng.below(6) == 0 {
        v = json!({"error": {"object": "error", "message": "busy", "type": "x", "code": *rng.pick(&[json!(503), json!("429"), json!("busy"), json!(200)])}});
    }
    v
}

/// Every byte of `bytes` changed, removed or doubled in turn, a few at random.
fn mutate(rng: &mut Rng, bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..=rng.below(3) {
        if out.is_empty() {
            break;
        }
        let at = rng.below(out.len());
        match rng.below(4) {
            0 => {
                out.remove(at);
            }
            1 => out.insert(at, *rng.pick(b"{}[]\":, \\u0\r\n9e-.")),
            2 => out[at] = *rng.pick(b"{}[]\":, \\u0\r\n9e-."),
            _ => {
                let b = out[at];
                out.insert(at, b);
            }
        }
    }
    out
}

#[test]
fn the_judgement_is_a_parses_on_generated_and_mutated_events_in_every_style() {
    let mut rng = Rng(0x5eed_1234_abcd_0042);
    let (mut tokens, mut mutated_kinds) = (0, std::collections::HashSet::new());
    for _ in 0..20_000 {
        let style = *rng.pick(&[Style::Compact, Style::Dumps, Style::Pretty]);
        let eol = *rng.pick(&["\n", "\r\n", "\r"]);
        let e = event(&write(&chunk(&mut rng), style), eol, rng.below(2) == 0);
        check(&e);
        tokens += usize::from(summary(&e).kind == Kind::Tokens);
        let m = mutate(&mut rng, &e);
        check(&m);
        mutated_kinds.insert(format!("{:?}", summary(&m).kind));
    }
    // The generator reaches every kind, mutated or not.
    assert!(tokens > 2_000, "{tokens}");
    assert_eq!(mutated_kinds.len(), 4, "{mutated_kinds:?}");
}

#[test]
fn the_same_chunk_in_every_style_is_judged_alike() {
    let json =
        serde_json::json!({"id": "c", "model": "up", "choices": [{"index": 0, "delta": {"content": "t0 "}}]});
    for style in [Style::Compact, Style::Dumps, Style::Pretty] {
        for eol in ["\n", "\r\n", "\r"] {
            let e = event(&write(&json, style), eol, true);
            let (j, data) = judge(&e);
            assert_eq!(
                j.kind,
                Kind::Tokens,
                "{style:?} {eol:?}: {}",
                String::from_utf8_lossy(&e)
            );
            assert_eq!(j.models.last(data.unwrap().bytes()).as_deref(), Some("up"));
        }
    }
}

#[test]
fn kinds_usage_and_errors_as_written_by_hand() {
    let kind = |e: &str| summary(e.as_bytes()).kind;
    assert_eq!(kind("data: [DONE]\n\n"), Kind::Done);
    assert_eq!(kind("data:[DONE]"), Kind::Done);
    assert_eq!(kind("\r\ndata: [DONE]\r\n\r\n"), Kind::Done);
    assert_eq!(
        kind("data: {\"choices\": [{\"delta\": {\"content\": \"t0 \"}}]}\n\n"),
        Kind::Tokens
    );
    assert_eq!(
        kind("data: {\"ch\\u006fices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"),
        Kind::Tokens
    );
    assert_eq!(
        kind("data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\n"),
        Kind::Other
    );
    // A key written twice counts as its last value.
    assert_eq!(
        kind("data: {\"choices\":[{\"delta\":{\"content\":\"x\",\"content\":\"\"}}]}\n\n"),
        Kind::Other
    );
    assert_eq!(
        kind("data: {\"usage\": {\"prompt_tokens\": 3}, \"choices\": []}\n\n"),
        Kind::Usage
    );
    assert_eq!(kind(": keep-alive\n\n"), Kind::Other);
    assert_eq!(
        kind("event: x\ndata: {\"error\": {\"code\": 503}}\n\n"),
        Kind::Error
    );
    assert_eq!(kind("data: {\"error\": null, \"choices\": []}\n\n"), Kind::Other);
    // Not JSON, or JSON a parse refuses: nothing.
    assert_eq!(
        kind("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]\n\n"),
        Kind::Other
    );
    assert_eq!(
        kind("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"n\":1e400}\n\n"),
        Kind::Other
    );
    assert_eq!(
        kind("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"s\":\"\\ud800\"}\n\n"),
        Kind::Other
    );
    let usage =
        summary(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n").usage;
    assert_eq!(usage.and_then(|u| u.pair()), Some((3, 5)));
    let err = summary(b"data: {\"error\": {\"message\": \"full\", \"code\": \"503\"}}\n\n")
        .error
        .unwrap();
    assert_eq!((err.status, err.message.as_deref()), (Some(503), Some("full")));
}

#[test]
fn data_is_read_as_the_specification_says_whatever_the_line_ends() {
    let d = |e: &str| data(e.as_bytes()).map(|d| String::from_utf8(d.bytes().to_vec()).unwrap());
    for e in [
        "data: a\ndata: b\n\n",
        "data: a\r\ndata: b\r\n\r\n",
        "data: a\rdata: b\r\r",
        "data:a\ndata:b",
    ] {
        assert_eq!(d(e).as_deref(), Some("a\nb"), "{e:?}");
        assert_eq!(
            reference::data(e.as_bytes()),
            d(e).map(String::into_bytes),
            "{e:?}"
        );
    }
    assert_eq!(d("event: x\r\ndata: {}\r\n\r\n").as_deref(), Some("{}"));
    assert_eq!(d(": c\n\n"), None);
    assert_eq!(d("data\n\n").as_deref(), Some(""));
    assert_eq!(d("dataset: 1\n\n"), None);
    let line = data(b"event: x\ndata: {}\n\n").unwrap();
    assert_eq!(line, Data::Line { value: b"{}", at: 15 });
}

#[test]
fn a_rename_changes_the_top_level_model_and_nothing_else() {
    let to = b"\"public\"";
    let r = |json: &str| {
        let j = judge_data(json.as_bytes());
        renamed(json.as_bytes(), &j.models, "up", to).map(|v| String::from_utf8(v).unwrap())
    };
    assert_eq!(
        r("{\"model\": \"up\", \"x\": 1}").as_deref(),
        Some("{\"model\": \"public\", \"x\": 1}")
    );
    assert_eq!(
        r("{\"model\":\"\\u0075p\"}").as_deref(),
        Some("{\"model\":\"public\"}")
    );
    assert_eq!(r("{\"x\": {\"model\": \"up\"}}"), None);
    assert_eq!(r("{\"model\": \"upper\"}"), None);
    assert_eq!(
        r("{\"model\": \"up\", \"text\": \"\\\"model\\\":\\\"up\\\"\"}").as_deref(),
        Some("{\"model\": \"public\", \"text\": \"\\\"model\\\":\\\"up\\\"\"}")
    );
}

#[test]
fn escaped_ids_and_models_are_found_where_they_stand() {
    let json =
        br#"{"id": "c\u0031", "x": {"model": "up"}, "model": "\u0075p", "model": "u\np", "model": "up"}"#;
    let j = judge_data(json);
    assert_eq!(j.id(json).as_deref(), Some("c1"));
    let models: Vec<_> = j
        .models
        .iter()
        .map(|m| m.clone().map(|r| String::from_utf8_lossy(&json[r]).into_owned()))
        .collect();
    assert_eq!(
        models,
        [
            Some(r#""\u0075p""#.into()),
            Some(r#""u\np""#.into()),
            Some(r#""up""#.into())
        ]
    );
    let out = renamed(json, &j.models, "up", b"\"public\"").unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"id": "c\u0031", "x": {"model": "up"}, "model": "public", "model": "u\np", "model": "public"}"#
    );
    // A name with a backslash is compared decoded, never as raw bytes.
    let odd = br#"{"model": "x\ny"}"#;
    assert_eq!(renamed(odd, &judge_data(odd).models, "x\\ny", b"\"p\""), None);
    let marker = br#"{"$serde_json::private::RawValue": "{\"choices\":[{\"text\":\"x\"}]}"}"#;
    for e in [&json[..], odd, marker] {
        check(format!("data: {}\n\n", String::from_utf8_lossy(e)).as_bytes());
    }
    // serde_json's private marker is a member like any other here (JSON has no such rule).
    assert_eq!(judge_data(marker).kind, Kind::Other);
}
