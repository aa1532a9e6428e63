//! Request lengths against the served model's context, and a target URL without its scheme.

use std::time::Duration;

use bench::spec::{LengthDist, Phase};

use crate::support::{concurrency, options, paused_engine};

/// The long mix's defaults (4,096 in, 512 out) shrink to fit a 1,024-token context the engine
/// publishes in /v1/models, and say so; every long request then succeeds.
#[tokio::test(start_paused = true)]
async fn the_long_mix_fits_the_context_the_server_publishes() {
    let mut cfg = paused_engine(16, Duration::from_millis(2));
    cfg.max_model_len = 1024;
    let engine = testkit::Engine::start(cfg).await;
    let mut opts = options(&engine.url(), 16, 8, "ttft_p95=1s,error_rate=1%");
    opts.phases = vec![Phase::Baseline, Phase::LongMix];
    opts.loads = concurrency(&[2]);
    opts.long_input = None;
    opts.long_output = None;
    opts.long_share = 0.5;
    let report = bench::run(opts.clone()).await.unwrap();
    let table = bench::report::table(&report);
    assert_eq!(report.parameters.max_model_len, Some(1024));
    // An eighth of the context out, the rest in but for room for the chat template.
    assert_eq!(
        report.parameters.long_output_len,
        LengthDist::Fixed { tokens: 128 }
    );
    assert_eq!(
        report.parameters.long_input_len,
        LengthDist::Fixed { tokens: 832 }
    );
    assert!(
        table.contains("note: long mix: 832 tokens in, 128 out"),
        "{table}"
    );
    let mix = report.levels.iter().find(|l| l.phase == Phase::LongMix).unwrap();
    assert!(mix.long.as_ref().unwrap().requests > 0, "{table}");
    assert!(mix.stats.errors.is_empty() && mix.pass, "{table}");

    // Lengths given that cannot fit stop the run before it sends load, naming both numbers.
    opts.long_input = Some(LengthDist::Fixed { tokens: 2000 });
    let err = bench::run(opts.clone()).await.unwrap_err().to_string();
    assert!(
        err.contains("--long-input-len 2000") && err.contains("max_model_len 1024"),
        "{err}"
    );
    opts.long_input = None;
    opts.workload = bench::workload::Workload {
        source: bench::workload::Source::Synthetic {
            input: LengthDist::Uniform { min: 100, max: 1000 },
            output: LengthDist::Fixed { tokens: 100 },
        },
        long: None,
    };
    let err = bench::run(opts).await.unwrap_err().to_string();
    assert!(
        err.contains("--input-len uniform:100,1000") && err.contains("reach 1100 tokens"),
        "{err}"
    );
}

#[tokio::test]
async fn a_url_without_a_scheme_says_so() {
    let opts = options("127.0.0.1:8000", 16, 8, "ttft_p95=1s");
    let err = bench::run(opts).await.unwrap_err().to_string();
    assert!(
        err.contains("the scheme is missing") && err.contains("http://127.0.0.1:8000"),
        "{err}"
    );
}

/// A `tokenizer.json` that makes every character a token: a server whose tokenizer counts the
/// bench's words about four times as long as they were asked.
fn char_tokenizer() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("spillway-char-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
        "pre_tokenizer":{"type":"Split","pattern":{"Regex":"."},"behavior":"Isolated","invert":false},
        "post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}"#;
    std::fs::write(&path, json).unwrap();
    path
}

/// The server counts the prompts (`usage.prompt_tokens`) about four times as long as asked:
/// the report says so in the table, the JSON and a warning, and the long mix's fitted prompts
/// are fitted again with the server's count, so that none is longer than the context.
#[tokio::test(start_paused = true)]
async fn prompts_the_server_counts_longer_are_reported_and_the_long_mix_refitted() {
    let mut cfg = paused_engine(16, Duration::from_millis(2));
    cfg.max_model_len = 2048;
    cfg.tokenizer = Some(char_tokenizer());
    let engine = testkit::Engine::start(cfg).await;
    let mut opts = options(&engine.url(), 16, 8, "ttft_p95=1s,error_rate=1%");
    opts.phases = vec![Phase::Baseline, Phase::LongMix];
    opts.loads = concurrency(&[2]);
    opts.long_input = None;
    opts.long_output = None;
    opts.long_share = 0.5;
    let report = bench::run(opts).await.unwrap();
    let table = bench::report::table(&report);
    let p = report.prompt_tokens.as_ref().expect("measured");
    assert!((2.5..3.5).contains(&p.drift), "{p:?}");
    assert!(p.template_tokens.is_some());
    assert!(
        table.contains("prompt tokens: ") && table.contains(" asked, "),
        "{table}"
    );
    assert!(
        matches!(report.parameters.long_input_len, LengthDist::Fixed { tokens } if tokens < 600),
        "the long prompts as refitted: {:?}",
        report.parameters.long_input_len
    );
    assert!(
        table.contains("WARNING: the server counted the prompts +"),
        "{table}"
    );
    assert!(table.contains("with the server's tokenizer"), "{table}");
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["prompt_tokens"]["drift"].as_f64().unwrap() > 2.5);
    let mix = report.levels.iter().find(|l| l.phase == Phase::LongMix).unwrap();
    assert!(mix.long.as_ref().unwrap().requests > 0, "{table}");
    assert!(mix.stats.errors.is_empty(), "no long prompt overflows: {table}");
    let html = bench::html::render(&report).unwrap();
    assert!(html.contains("the server counted the prompts"));
}
