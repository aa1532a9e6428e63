//! The scheduler and cost model through the engine handle, on a paused clock: exact and fast.

use crate::support::{finish, submit, tiny};
use spillway_engine::{Engine, FinishReason};
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn step_times_follow_the_cost_model_exactly() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    let mut g = submit(&engine, 100, 10);
    assert_eq!(finish(&mut g).await, 10);
    let r = &engine.records()[0];
    // Prefill: 1 ms overhead + 100 tokens × 2 µs. Decode of token k (2..=10): 1 ms + 20 µs +
    // context (99 + k tokens) × 20 ns. Steps chain on the model's clock; tokens are released on
    // the runtime's 1 ms timer ticks, so each time is the model's rounded up to the next tick.
    let prefill = Duration::from_micros(1200);
    let model_e2e = prefill
        + (2..=10u64)
            .map(|k| Duration::from_nanos(1_020_000 + (99 + k) * 20))
            .sum::<Duration>();
    let tick = Duration::from_millis(1);
    let ttft = r.ttft.unwrap();
    assert!(ttft >= prefill && ttft < prefill + tick, "{ttft:?}");
    assert!(
        r.e2e >= model_e2e && r.e2e < model_e2e + tick,
        "{:?} vs model {model_e2e:?}",
        r.e2e
    );
    assert_eq!(r.queue, Duration::ZERO);
    assert_eq!(r.finish, FinishReason::Length);
}

#[tokio::test(start_paused = true)]
async fn running_never_exceeds_max_num_seqs() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 8;
    let (engine, _steps) = Engine::start(cfg).unwrap();
    let mut gens: Vec<_> = (0..40).map(|_| submit(&engine, 20, 30)).collect();
    for g in &mut gens {
        assert_eq!(finish(g).await, 30);
    }
    let s = engine.snapshot();
    assert_eq!(s.max_running, 8, "the bound is reached and never passed");
    assert_eq!(engine.records().len(), 40);
}

#[tokio::test(start_paused = true)]
async fn ttft_grows_with_the_waiting_queue() {
    let mut cfg = tiny();
    cfg.max_num_seqs = 4;
    let (engine, _steps) = Engine::start(cfg).unwrap();
    let mut gens: Vec<_> = (0..16).map(|_| submit(&engine, 20, 50)).collect();
    for g in &mut gens {
        finish(g).await;
    }
    let mut records = engine.records();
    records.sort_by_key(|r| r.id);
    let group_ttft = |k: usize| -> Duration {
        records[k * 4..k * 4 + 4]
            .iter()
            .filter_map(|r| r.ttft)
            .sum::<Duration>()
            / 4
    };
    let one_request = records[0].e2e;
    for k in 1..4 {
        assert!(
            group_ttft(k) >= group_ttft(k - 1) + one_request * 9 / 10,
            "each wave waits about one more request time: {:?} then {:?}",
            group_ttft(k - 1),
            group_ttft(k)
        );
        assert!(records[k * 4].queue > Duration::ZERO);
    }
}

#[tokio::test(start_paused = true)]
async fn a_small_kv_cache_preempts_and_recovers() {
    let mut cfg = tiny();
    cfg.max_model_len = 256;
    cfg.kv_cache_tokens = 512;
    let (engine, _steps) = Engine::start(cfg).unwrap();
    let mut gens: Vec<_> = (0..8).map(|_| submit(&engine, 32, 200)).collect();
    for g in &mut gens {
        assert_eq!(finish(g).await, 200, "preempted requests still finish");
    }
    let s = engine.snapshot();
    assert!(s.preemptions > 0);
    assert_eq!(s.kv_blocks_free, s.kv_blocks_total);
    let text = String::from_utf8(engine.metrics_text()).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:num_preemptions_total{"))
        .unwrap();
    assert!(line.ends_with(&format!(" {}", s.preemptions)), "{line}");
}

#[tokio::test(start_paused = true)]
async fn prefix_caching_skips_the_shared_prefill() {
    let mut cfg = tiny();
    cfg.enable_prefix_caching = true;
    let (engine, _steps) = Engine::start(cfg).unwrap();
    let mut a = submit(&engine, 3000, 4);
    finish(&mut a).await;
    let mut b = submit(&engine, 3000, 4);
    finish(&mut b).await;
    let r = engine.records();
    assert_eq!(r[0].prompt_tokens_cached, 0);
    assert_eq!(r[1].prompt_tokens_cached, 2992, "187 full blocks of 16 hit");
    assert!(
        r[1].prefill.unwrap() * 3 < r[0].prefill.unwrap(),
        "{:?} vs {:?}",
        r[1].prefill,
        r[0].prefill
    );
    let text = String::from_utf8(engine.metrics_text()).unwrap();
    assert!(text.contains("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"sim\"} 2992"));
    assert!(text.contains("vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"sim\"} 6000"));
}

#[tokio::test(start_paused = true)]
async fn an_abort_frees_the_kv_cache_and_stops_generation() {
    let (engine, _steps) = Engine::start(tiny()).unwrap();
    let mut g = submit(&engine, 100, 1000);
    g.choices[0].wait_for(|p| p.tokens >= 5).await.unwrap();
    assert!(engine.snapshot().kv_blocks_free < engine.snapshot().kv_blocks_total);
    drop(g);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let s = engine.snapshot();
    assert_eq!(s.aborts, 1);
    assert_eq!(s.running, 0);
    assert_eq!(s.kv_blocks_free, s.kv_blocks_total);
    let generated = s.generated_tokens;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        engine.snapshot().generated_tokens,
        generated,
        "no token after the abort"
    );
    let r = engine.records();
    assert_eq!(r[0].finish, FinishReason::Abort);
    assert!(r[0].output_tokens < 1000);
    // As vLLM 0.32: the abort is not counted among the finished requests (its series stays 0).
    let text = String::from_utf8(engine.metrics_text()).unwrap();
    assert!(
        text.contains(
            "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"sim\"} 0"
        ),
        "{text}"
    );
    assert!(text.contains(
        "vllm:request_success_total{engine=\"0\",finished_reason=\"repetition\",model_name=\"sim\"} 0"
    ));
}

#[tokio::test(start_paused = true)]
async fn output_length_distribution_stops_early_with_stop() {
    let mut cfg = tiny();
    cfg.output_len = Some("fixed:7".parse().unwrap());
    let (engine, _steps) = Engine::start(cfg).unwrap();
    let mut g = engine
        .submit(spillway_engine::GenerateParams {
            prompt: vec![1; 10],
            max_tokens: Some(50),
            n: 1,
            ignore_eos: false,
        })
        .unwrap();
    assert_eq!(finish(&mut g).await, 7);
    assert_eq!(engine.records()[0].finish, FinishReason::Stop);
    let mut g = submit(&engine, 10, 50);
    assert_eq!(finish(&mut g).await, 50, "ignore_eos runs to max_tokens");
}
