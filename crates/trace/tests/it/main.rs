//! The formats read from small fixture files, converted into each other and back, and summarised.

use std::time::Duration;

use spillway_trace::format::{Format, read, write};
use spillway_trace::{Summary, Trace, TraceError};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn convert(t: &Trace, to: Format) -> Trace {
    let mut out = Vec::new();
    write(t, to, &mut out).unwrap();
    read(to, &out[..], Some(t.block_tokens)).unwrap()
}

#[test]
fn the_access_log_is_a_trace_refusals_included() {
    let t = read(Format::AccessLog, &fixture("access.log")[..], None).unwrap();
    // a1 at 0, a3 at 250 ms (logged after a2: lines are written at the end), a2 at 400, a5 at 2.1 s.
    let at: Vec<u64> = t.requests.iter().map(|r| r.at.as_millis() as u64).collect();
    assert_eq!(at, [0, 250, 400, 2100]);
    assert_eq!(t.start_ms, Some(1_765_000_000_000));
    let refused = &t.requests[2];
    assert_eq!(refused.refused.as_deref(), Some("queue_full"));
    assert_eq!(
        (refused.input_tokens, refused.output_tokens),
        (2100, 512),
        "what it asked"
    );
    assert_eq!(t.requests[1].output_tokens, 40, "answered: what it generated");
    assert_eq!(t.requests[0].team.as_deref(), Some("search"));
    assert_eq!(refused.priority.as_deref(), Some("sheddable"));
    assert_eq!(
        t.skipped,
        [
            "1 line: no arrival_ms (written by a gateway before the access log carried it)",
            "1 line: no tokens_in (refused before its prompt was counted)"
        ]
    );
}

#[test]
fn mooncake_and_azure_read_as_published() {
    let m = read(Format::Mooncake, &fixture("mooncake.jsonl")[..], None).unwrap();
    assert_eq!(m.requests.len(), 4);
    assert_eq!(m.requests[2].at, Duration::from_millis(27_482));
    assert_eq!(m.requests[1].hash_ids[..11], m.requests[0].hash_ids[..11]);
    assert_eq!(m.block_tokens, 512);
    let a = read(Format::Azure, &fixture("azure.csv")[..], None).unwrap();
    assert_eq!(a.requests.len(), 4);
    assert_eq!(a.requests[3].at, Duration::from_millis(4_431));
    assert_eq!(
        (a.requests[2].input_tokens, a.requests[2].output_tokens),
        (879, 17)
    );
    assert_eq!(a.start_ms, Some(1_700_158_546_680));
}

#[test]
fn conversions_keep_times_lengths_and_shared_prefixes() {
    let log = read(Format::AccessLog, &fixture("access.log")[..], None).unwrap();
    // Through Mooncake: ids renumbered densely, equal where they were equal.
    let m = convert(&log, Format::Mooncake);
    assert_eq!(m.requests.len(), log.requests.len());
    for (a, b) in log.requests.iter().zip(&m.requests) {
        assert_eq!(
            (a.at, a.input_tokens, a.output_tokens),
            (b.at, b.input_tokens, b.output_tokens)
        );
        assert_eq!(a.hash_ids.len(), b.hash_ids.len());
    }
    assert_eq!(m.requests[0].hash_ids, [0, 1, 2]);
    assert_eq!(
        m.requests[2].hash_ids,
        [0, 1, 5, 6, 7],
        "a2 shares a1's first two blocks"
    );
    assert_eq!(m.requests[3].hash_ids, [0, 1, 2]);
    // Back into a log and out again: the same trace.
    let again = convert(&convert(&m, Format::AccessLog), Format::Mooncake);
    assert_eq!(again.requests, m.requests);
    // Through Azure: times and lengths (the CSV has no prefixes), to the millisecond.
    let a = read(Format::Azure, &fixture("azure.csv")[..], None).unwrap();
    let back = convert(&convert(&a, Format::AccessLog), Format::Azure);
    assert_eq!(back, a);
}

#[test]
fn bad_lines_are_named_by_number_and_field() {
    let cases: [(Format, &str, &str); 5] = [
        (
            Format::Mooncake,
            "{\"timestamp\":0,\"input_length\":1,\"output_length\":1}\n{\"timestamp\":-5,\"input_length\":1,\"output_length\":1}\n",
            "line 2: timestamp -5",
        ),
        (
            Format::Mooncake,
            "{\"timestamp\":0,\"input_length\":\"many\",\"output_length\":1}\n",
            "line 1: not a Mooncake trace line",
        ),
        (
            Format::Azure,
            "TIMESTAMP,ContextTokens\n",
            "no GeneratedTokens column",
        ),
        (
            Format::Azure,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12,x\n",
            "line 2: GeneratedTokens \"x\"",
        ),
        (Format::AccessLog, "not json\n", "line 1: not an access-log line"),
    ];
    for (format, text, want) in cases {
        let err = read(format, text.as_bytes(), None).unwrap_err().to_string();
        assert!(err.contains(want), "{want:?} in {err:?}");
    }
    let ids: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
    let line = format!(
        "{{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[{}]}}",
        ids.join(",")
    );
    let err = read(Format::Mooncake, line.as_bytes(), None).unwrap_err();
    assert!(
        matches!(&err, TraceError::Line { line: 1, detail } if detail.contains("limit of 4096")),
        "{err}"
    );
}

#[test]
fn a_summary_counts_rates_lengths_and_reuse() {
    let t = read(Format::AccessLog, &fixture("access.log")[..], None).unwrap();
    let s = Summary::of(&t);
    assert_eq!(s.requests, 4);
    assert_eq!(s.peak_rate, 3, "three arrivals in the first second");
    assert!((s.mean_rate - 4.0 / 2.1).abs() < 1e-9);
    let input = s.input.unwrap();
    assert_eq!((input.p50, input.max), (1100, 2100));
    // 13 blocks; reused: a2's 101, 102 and all three of a5's.
    assert_eq!((s.blocks, s.reused_blocks), (13, 5));
    assert_eq!(s.requests_sharing_a_prefix, 2);
    assert_eq!(s.refused["queue_full"], 1);
    assert_eq!(s.by_class["batch"], 1);
    let text = s.to_string();
    assert!(text.contains("5 of 13 blocks of 512 tokens (38.5%)"), "{text}");
    assert!(text.contains("left out: 1 line: no tokens_in"), "{text}");
    let m = read(Format::Mooncake, &fixture("mooncake.jsonl")[..], None).unwrap();
    let s = Summary::of(&m);
    assert_eq!(
        (s.blocks, s.reused_blocks, s.requests_sharing_a_prefix),
        (46, 22, 2)
    );
}
