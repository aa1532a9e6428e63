//! Micro-benchmarks of the gateway's per-request and per-chunk work: the admission decision and
//! the SSE relay's splitting and classification.

use admission::{Admission, Claim, Fairness, Limits, Priority};
use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use protocol::agents::Dialect;
use protocol::sse::EventSplitter;
use spillway_gateway::event::{Event, Reader, Rename, classify};
use std::hint::black_box;
use std::time::Duration;
use tokio::time::Instant;

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission");
    g.throughput(Throughput::Elements(1));
    let gate = Admission::new(Limits {
        concurrency: 64,
        queue: 64,
        queue_wait: Duration::from_secs(2),
    });
    let deadline = Instant::now() + Duration::from_secs(3600);
    let claim = Claim {
        team: "team-b".into(),
        weight: 1.0,
        cost: 600,
        objective: None,
    };
    // Teams attained service before: the claim's team is found among several.
    for team in ["team-a", "team-c", "team-d", "team-b"] {
        let other = Claim {
            team: team.into(),
            ..claim.clone()
        };
        drop(futures::executor::block_on(gate.acquire(
            Priority::Standard,
            deadline,
            &other,
        )));
    }
    for fairness in [Fairness::Fifo, Fairness::Teams] {
        gate.set_fairness(fairness);
        g.bench_function(format!("admit_and_release_{}", fairness.as_str()), |b| {
            b.iter(|| {
                let mut permit =
                    futures::executor::block_on(gate.acquire(Priority::Standard, deadline, &claim)).unwrap();
                permit.settle(700);
                drop(black_box(permit));
            })
        });
    }
    let full = Admission::new(Limits {
        concurrency: 1,
        queue: 0,
        queue_wait: Duration::from_secs(2),
    });
    let _held = futures::executor::block_on(full.acquire(Priority::Standard, deadline, &claim)).unwrap();
    g.bench_function("reject_queue_full", |b| {
        b.iter(|| {
            black_box(
                futures::executor::block_on(full.acquire(Priority::Standard, deadline, &claim)).unwrap_err(),
            )
        })
    });
    g.finish();
}

fn relay(c: &mut Criterion) {
    let chunk = br#"data: {"id":"chatcmpl-0000000000000001","object":"chat.completion.chunk","created":1795977379,"model":"spillway-sim","choices":[{"index":0,"delta":{"content":" below"},"logprobs":null,"finish_reason":null}]}

"#;
    // vLLM 0.32's reasoning delta: found after the searches for text and usage.
    let reasoning = br#"data: {"id":"chatcmpl-0000000000000001","object":"chat.completion.chunk","created":1795977379,"model":"spillway-sim","choices":[{"index":0,"delta":{"reasoning":" below"},"logprobs":null,"finish_reason":null}]}

"#;
    // The same chunk as Python's json.dumps writes it.
    let dumps = br#"data: {"id": "chatcmpl-0000000000000001", "object": "chat.completion.chunk", "created": 1795977379, "model": "spillway-sim", "choices": [{"index": 0, "delta": {"content": " below"}, "logprobs": null, "finish_reason": null}]}

"#;
    let mut g = c.benchmark_group("relay");
    for (name, chunk) in [
        ("split_and_classify_16_chunks", &chunk[..]),
        ("split_and_classify_16_reasoning_chunks", &reasoning[..]),
        ("split_and_classify_16_dumps_chunks", &dumps[..]),
    ] {
        let stream: Vec<u8> = chunk.iter().copied().cycle().take(chunk.len() * 16).collect();
        g.throughput(Throughput::Bytes(stream.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut s = EventSplitter::default();
                let mut tokens = 0;
                s.feed(black_box(&stream), |e| {
                    if classify(&e) == spillway_gateway::event::EventKind::Tokens {
                        tokens += 1;
                    }
                });
                assert_eq!(tokens, 16);
            })
        });
    }
    // What the relay does with each event: judged once, renamed, appended to the client's bytes.
    let rename = Rename::new("spillway-sim", "corp-chat");
    let stream: Vec<u8> = chunk.iter().copied().cycle().take(chunk.len() * 16).collect();
    g.throughput(Throughput::Bytes(stream.len() as u64));
    // As the relay reads a stream: its chunks after the first the short way (`event::Reader`).
    g.bench_function("split_read_rename_append_16_chunks_of_a_stream", |b| {
        let mut out = BytesMut::with_capacity(8192);
        b.iter(|| {
            out.clear();
            let mut s = EventSplitter::default();
            let mut reader = Reader::default();
            s.feed_slices(black_box(&stream), |e| {
                reader.read(e).append(Some(&rename), &mut out);
            });
            assert!(out.len() > stream.len() / 2);
        })
    });
    // The agents' APIs: each event read by its API's rules (a typed parse of its data, no short
    // way), beside the chat stream's reads above.
    let responses = br#"event: response.output_text.delta
data: {"content_index":0,"delta":" below","item_id":"msg_882a225d2ebffbee","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}

"#;
    let messages = br#"event: content_block_delta
data: {"type":"content_block_delta","delta":{"type":"text_delta","text":" below"},"index":0}

"#;
    for (name, dialect, event) in [
        (
            "split_read_rename_append_16_responses_deltas",
            Dialect::Responses,
            &responses[..],
        ),
        (
            "split_read_rename_append_16_messages_deltas",
            Dialect::Messages,
            &messages[..],
        ),
    ] {
        let stream: Vec<u8> = event.iter().copied().cycle().take(event.len() * 16).collect();
        g.throughput(Throughput::Bytes(stream.len() as u64));
        g.bench_function(name, |b| {
            let mut out = BytesMut::with_capacity(8192);
            b.iter(|| {
                out.clear();
                let mut s = EventSplitter::default();
                let mut reader = Reader::new(Some(dialect));
                let mut tokens = 0;
                s.feed_slices(black_box(&stream), |e| {
                    let e = reader.read(e);
                    tokens += usize::from(e.kind() == spillway_gateway::event::EventKind::Tokens);
                    e.append(Some(&rename), &mut out);
                });
                assert_eq!(tokens, 16);
            })
        });
    }
    let stream: Vec<u8> = chunk.iter().copied().cycle().take(chunk.len() * 16).collect();
    g.throughput(Throughput::Bytes(stream.len() as u64));
    g.bench_function("split_judge_rename_append_16_chunks", |b| {
        let mut out = BytesMut::with_capacity(8192);
        b.iter(|| {
            out.clear();
            let mut s = EventSplitter::default();
            s.feed_slices(black_box(&stream), |e| {
                Event::read(e).append(Some(&rename), &mut out);
            });
            assert!(out.len() > stream.len() / 2);
        })
    });
    g.finish();
}

/// A client's request body read into the typed request, as every completion request is: the
/// peers harness's body, and one with a system prompt, tools and sampling fields (kept as extra).
fn request(c: &mut Criterion) {
    use protocol::openai::ChatCompletionRequest;
    let small = br#"{"model":"mock","messages":[{"role":"user","content":"Say something about load balancing in a few words, please."}],"max_tokens":16,"stream":true}"#;
    let larger = br#"{"model":"llama","messages":[{"role":"system","content":"You are a helpful assistant that answers briefly."},{"role":"user","content":"What is the weather in Paris?","name":"alice"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"18C, cloudy"}],"tools":[{"type":"function","function":{"name":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"temperature":0.2,"top_p":0.9,"max_tokens":128,"stream":true,"stream_options":{"include_usage":true}}"#;
    let mut g = c.benchmark_group("request");
    g.throughput(Throughput::Elements(1));
    for (name, body) in [
        ("parse_chat_small", &small[..]),
        ("parse_chat_tools", &larger[..]),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let r: ChatCompletionRequest = protocol::error::parse_json(black_box(body)).unwrap();
                black_box(r)
            })
        });
    }
    // The agents' requests of the same sizes: the small one, and one with instructions and tools.
    let responses = br#"{"model":"mock","input":"Say something about load balancing in a few words, please.","max_output_tokens":16,"stream":true}"#;
    let messages = br#"{"model":"llama","system":"You are a helpful assistant that answers briefly.","messages":[{"role":"user","content":"What is the weather in Paris?"},{"role":"assistant","content":[{"type":"tool_use","id":"c1","name":"weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"18C, cloudy"}]}],"tools":[{"name":"weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],"temperature":0.2,"max_tokens":128,"stream":true}"#;
    g.bench_function("parse_responses_small", |b| {
        b.iter(|| {
            let r: protocol::agents::ResponsesRequest =
                protocol::error::parse_json(black_box(&responses[..])).unwrap();
            black_box(r)
        })
    });
    g.bench_function("parse_messages_tools", |b| {
        b.iter(|| {
            let r: protocol::agents::MessagesRequest =
                protocol::error::parse_json(black_box(&messages[..])).unwrap();
            black_box(r)
        })
    });
    // The access log's prefix-block ids (issue 51), made from every prompt on the path: the
    // cost grows with the prompt, so an agent's long context is the case to watch. Beside each,
    // the parse of a body of that size, the work the path already does for it.
    for kib in [1usize, 32, 256] {
        let prompt = "tell me more about the spillway ".repeat(kib * 1024 / 32);
        let body = serde_json::to_vec(&serde_json::json!({
            "model": "mock", "max_tokens": 16, "stream": true,
            "messages": [{"role": "user", "content": prompt}],
        }))
        .unwrap();
        g.bench_function(format!("hash_ids_{kib}KiB"), |b| {
            b.iter(|| {
                black_box(spillway_gateway::access_log::hash_ids([
                    b"user".as_slice(),
                    prompt.as_bytes(),
                ]))
            })
        });
        g.bench_function(format!("parse_chat_{kib}KiB"), |b| {
            b.iter(|| {
                let r: ChatCompletionRequest = protocol::error::parse_json(black_box(&body)).unwrap();
                black_box(r)
            })
        });
    }
    g.finish();
}

/// `balance: slo`'s model: one prediction per candidate replica at each pick, one TTFT and one
/// TPOT update per stream.
fn slo_model(c: &mut Criterion) {
    let mut g = c.benchmark_group("slo_model");
    g.throughput(Throughput::Elements(1));
    let mut model = spillway_gateway::benching::SloModel::default();
    for k in 0..64u32 {
        let ttft = Duration::from_micros(u64::from(20_000 + 900 * (k % 13) + 30 * (k % 7)));
        model.learn(
            300 + 97 * (k % 11),
            k % 13,
            f64::from(k % 3),
            ttft,
            Duration::from_millis(9),
        );
    }
    g.bench_function("predict", |b| {
        b.iter(|| black_box(model.predict(black_box(1200), 7, 1.0)))
    });
    let mut k = 0u32;
    g.bench_function("learn_ttft_and_tpot", |b| {
        b.iter(|| {
            k = k.wrapping_add(1);
            let ttft = Duration::from_micros(u64::from(20_000 + 900 * (k % 13)));
            model.learn(300 + 97 * (k % 11), k % 13, 0.0, ttft, Duration::from_millis(9));
        })
    });
    g.finish();
}

criterion_group!(benches, admission, relay, request, slo_model);
criterion_main!(benches);
