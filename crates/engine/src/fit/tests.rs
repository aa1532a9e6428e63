use super::*;
use crate::config::{EngineConfig, Preset};
use crate::engine::{Engine, GenerateParams};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// Closed-loop clients against an in-process engine on the paused clock, level after level (60
/// virtual seconds each), each request's prompt length drawn from `prompts` by a fixed sequence: a
/// bench run whose truth is the engine's cost model. The paused clock wakes timers on whole
/// milliseconds, so the costs below are steps of tens of milliseconds, where that rounding is noise.
async fn bench(config: EngineConfig, levels: &[u32], prompts: (u32, u32), output: u32) -> Vec<Sample> {
    let (engine, steps) = Engine::start(config).expect("the engine starts");
    let origin = Instant::now();
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    for &c in levels {
        let stop = Instant::now() + Duration::from_secs(60);
        let mut clients = Vec::new();
        for client in 0..c {
            let (engine, samples) = (engine.clone(), samples.clone());
            clients.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(u64::from(client) * 7)).await;
                let mut k = 0u32;
                while Instant::now() < stop {
                    let x = mix(u64::from(client) << 32 | u64::from(k) ^ u64::from(c) << 48);
                    let len = prompts.0 + (x % u64::from(prompts.1 - prompts.0 + 1)) as u32;
                    let x = x as u32;
                    let prompt = (0..len).map(|t| t ^ x.rotate_left(7)).collect();
                    let params = GenerateParams {
                        prompt,
                        max_tokens: Some(output),
                        n: 1,
                        ignore_eos: true,
                    };
                    let sent = Instant::now();
                    engine.frontend_admit().await;
                    let mut g = engine.submit(params).expect("admitted");
                    let _ = g.choices[0].wait_for(|p| p.tokens >= 1).await;
                    let ttft = sent.elapsed();
                    let mut itl = Vec::new();
                    let mut last = Instant::now();
                    for token in 2..=output {
                        let _ = g.choices[0].wait_for(|p| p.tokens >= token).await;
                        itl.push(last.elapsed().as_secs_f64());
                        last = Instant::now();
                    }
                    let _ = g.choices[0].wait_for(|p| p.finish.is_some()).await;
                    samples.lock().unwrap().push(Sample {
                        sent: (sent - origin).as_secs_f64(),
                        prompt: len,
                        output,
                        ttft: ttft.as_secs_f64(),
                        e2e: sent.elapsed().as_secs_f64(),
                        itl,
                        level: format!("c={c}"),
                    });
                    k += 1;
                }
            }));
        }
        for client in clients {
            client.await.expect("a client ends");
        }
    }
    steps.stop();
    Arc::try_unwrap(samples).unwrap().into_inner().unwrap()
}

/// splitmix64's finaliser: a well-spread number from a counter.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn truth() -> CostModel {
    CostModel {
        overhead: Duration::from_millis(20),
        prefill_token: Duration::from_micros(200),
        prefill_attention_per_million_pairs: Duration::from_millis(40),
        decode_seq: Duration::from_micros(500),
        context_token: Duration::from_nanos(200),
    }
}

fn near(got: Duration, want: Duration, tolerance: f64) -> bool {
    let (g, w) = (got.as_secs_f64(), want.as_secs_f64());
    (g - w).abs() <= tolerance * w
}

#[tokio::test(start_paused = true)]
async fn recovers_the_terms_of_a_known_engine() {
    let mut config = EngineConfig::preset(Preset::Tiny);
    config.cost = truth();
    config.max_num_batched_tokens = 4096;
    let samples = bench(config, &[1, 4, 16, 48], (64, 3000), 96).await;
    let fit = fit(
        &samples,
        FitOptions {
            max_num_batched_tokens: 4096,
        },
    )
    .unwrap();
    let (got, want) = (fit.cost, truth());
    let report = fit.render();
    eprintln!("{report}");
    assert!(fit.ttft_requests >= 20, "{report}");
    assert!(near(got.overhead, want.overhead, 0.10), "{report}");
    assert!(near(got.prefill_token, want.prefill_token, 0.10), "{report}");
    assert!(
        near(
            got.prefill_attention_per_million_pairs,
            want.prefill_attention_per_million_pairs,
            0.15
        ),
        "{report}"
    );
    // Requests decoding together attend contexts of one distribution, so a run tells the cost of
    // one more sequence at the contexts it ran, not how that cost splits between decode_seq and
    // context_token: held at the run's mean context (the prompts' mean plus half the answer).
    let context = (64.0 + 3000.0) / 2.0 + 48.0;
    let per_seq = |m: &CostModel| m.decode_seq.as_secs_f64() + m.context_token.as_secs_f64() * context;
    assert!(
        (per_seq(&got) - per_seq(&want)).abs() < 0.15 * per_seq(&want),
        "{report}"
    );
    for r in fit.residuals.iter() {
        assert!(r.relative_error().abs() < 0.05, "{report}");
    }
    // What the step does not explain is the clock's rounding: under a millisecond.
    assert!(fit.frontend.per_request < Duration::from_millis(1), "{report}");
    assert!(fit.ttft_rms_relative_error < 0.05, "{report}");
    assert!(fit.itl_rms_relative_error < 0.10, "{report}");
    assert!(fit.notes.is_empty(), "{report}");
}

#[tokio::test(start_paused = true)]
async fn an_api_server_in_front_shows_as_its_per_request_time() {
    let mut config = EngineConfig::preset(Preset::Tiny);
    config.cost = truth();
    config.frontend = FrontendCost {
        per_request: Duration::from_millis(30),
        per_output_token: Duration::ZERO,
    };
    let samples = bench(config, &[1, 8], (64, 2000), 16).await;
    let fit = fit(&samples, FitOptions::default()).unwrap();
    let report = fit.render();
    eprintln!("{report}");
    assert!(
        near(fit.frontend.per_request, Duration::from_millis(30), 0.15),
        "{report}"
    );
    assert!(near(fit.cost.overhead, truth().overhead, 0.15), "{report}");
}

#[tokio::test(start_paused = true)]
async fn fixed_prompt_lengths_leave_the_attention_term_out_and_say_so() {
    let mut config = EngineConfig::preset(Preset::Tiny);
    config.cost = truth();
    let samples = bench(config, &[1, 8], (512, 512), 16).await;
    let fit = fit(&samples, FitOptions::default()).unwrap();
    assert_eq!(fit.cost.prefill_attention_per_million_pairs, Duration::ZERO);
    assert!(
        fit.notes.iter().any(|n| n.contains("attention term")),
        "{:?}",
        fit.notes
    );
}

#[test]
fn too_few_requests_are_refused() {
    let one = Sample {
        sent: 0.0,
        prompt: 10,
        output: 4,
        ttft: 0.01,
        e2e: 0.02,
        itl: vec![0.003; 3],
        level: "c=1".into(),
    };
    assert!(fit(&[one], FitOptions::default()).is_err());
}

#[test]
fn reads_the_records_of_a_bench_result() {
    let text = r#"{"schema":"spillway-bench/1","levels":[
        {"load":{"concurrency":2},"start":1.5,"records":[
            {"scheduled":0.25,"send_lag":0.001,"ttft":0.02,"e2e":0.1,"itl_us":[1000,2500],"input_tokens":100,
             "output_tokens":9,"outcome":{"kind":"ok"},"id":null,"long":false},
            {"scheduled":0.5,"send_lag":0.0,"ttft":null,"e2e":0.1,"itl_us":[],"input_tokens":null,
             "output_tokens":0,"outcome":{"kind":"http_503"},"id":null,"long":false}]},
        {"load":{"rate":0.5},"start":9.0,"records":[
            {"scheduled":0.0,"send_lag":0.0,"ttft":0.03,"e2e":0.2,"itl_us":[],"input_tokens":null,
             "asked_input_tokens":64,"output_tokens":5,"outcome":{"kind":"ok"},"id":null,"long":false}]}]}"#;
    let samples = samples_from_bench_json(text).unwrap();
    assert_eq!(samples.len(), 2);
    assert!((samples[0].sent - 1.751).abs() < 1e-9);
    assert_eq!((samples[0].prompt, samples[0].output), (100, 9));
    assert_eq!(samples[0].level, "c=2");
    assert_eq!(samples[0].itl, vec![0.001, 0.0025]);
    assert_eq!((samples[1].prompt, samples[1].level.as_str()), (64, "0.5 rps"));
    let bare = r#"{"schema":"spillway-bench/1","levels":[{"load":{"concurrency":1},"start":0}]}"#;
    let err = samples_from_bench_json(bare).unwrap_err().to_string();
    assert!(err.contains("--records"), "{err}");
}
