//! The seed's worked example, reproduced: C_safe 15 per replica × 2 replicas × 0.8 → C 24;
//! 6 req/s × 2 s → Q 12; LiteLLM 24 + 12 → 36; vLLM `--max-num-seqs` 24 / 2 → 12 — and the same
//! numbers in every emitted file, each of which parses, the Spillway one as a gateway config.

use spillway_plan::arith::Layer;
use spillway_plan::emit::render_all;
use spillway_plan::{Target, plan};

use crate::support::{seed_deployment, seed_measurement};

#[test]
fn the_seeds_numbers_come_out() {
    let p = plan(&seed_measurement(false), &seed_deployment()).unwrap();
    assert_eq!(p.concurrency, 24);
    assert_eq!(p.queue, 12);
    assert_eq!(p.litellm_max_parallel, 36);
    assert_eq!(p.max_num_seqs, 12);
    assert_eq!(p.binding, Layer::Gateway, "{}", p.binding_why);
    let text: Vec<&str> = p.lines.iter().map(|l| l.text.as_str()).collect();
    assert!(
        text.contains(&"C = floor(C_safe × R × headroom) = floor(15 × 2 × 0.8) = floor(24) = 24"),
        "{text:#?}"
    );
    assert!(
        text[2].starts_with("Q = ceil(throughput × Wq) = ceil(6 × 2) = 12"),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|l| l.starts_with("LiteLLM max_parallel_requests = C + Q = 24 + 12 = 36"))
    );
    assert!(
        text.iter()
            .any(|l| l.starts_with("--max-num-seqs = ceil(C / R) = ceil(24 / 2) = 12"))
    );
    // Each line says where its inputs came from.
    let c = p.lines.iter().find(|l| l.name == "C").unwrap();
    assert!(
        c.from.contains("--c-safe") && c.from.contains("--replicas"),
        "{}",
        c.from
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn every_file_carries_the_same_numbers_and_parses() {
    let p = plan(&seed_measurement(true), &seed_deployment()).unwrap();
    let files = render_all(&p, &Target::ALL).unwrap();
    let yaml = |t: Target| -> serde_json::Value {
        let f = files.iter().find(|f| f.target == t).unwrap();
        serde_yaml_ng::from_str(&f.text).unwrap_or_else(|e| panic!("{t}: {e}\n{}", f.text))
    };
    let spillway = files.iter().find(|f| f.target == Target::Spillway).unwrap();
    let config = gateway::Config::from_yaml(&spillway.text)
        .unwrap_or_else(|e| panic!("the gateway refuses its planned config: {e}\n{}", spillway.text));
    let class = &config.routes[0].classes[0];
    assert_eq!((class.concurrency.initial(), class.queue), (24, 12));
    assert_eq!(class.queue_wait, std::time::Duration::from_secs(2));
    assert_eq!(config.routes[0].upstream_model.as_deref(), Some("spark-chat"));

    let envoy = yaml(Target::Envoy);
    assert_eq!(envoy["spec"]["circuitBreaker"]["maxParallelRequests"], 24);
    assert_eq!(envoy["spec"]["circuitBreaker"]["maxPendingRequests"], 12);
    assert_eq!(envoy["spec"]["targetRefs"][0]["name"], "corp-chat");
    assert_eq!(envoy["metadata"]["namespace"], "ai-serving");
    let litellm = yaml(Target::Litellm);
    assert_eq!(
        litellm["model_list"][0]["litellm_params"]["max_parallel_requests"],
        36
    );
    let kserve = yaml(Target::Kserve);
    let args = kserve["spec"]["predictor"]["model"]["args"].as_array().unwrap();
    assert!(args.iter().any(|a| a == "--max-num-seqs=12"), "{args:?}");
    assert_eq!(kserve["spec"]["predictor"]["minReplicas"], 2);
    let vllm = files.iter().find(|f| f.target == Target::Vllm).unwrap();
    assert!(vllm.text.contains("--max-num-seqs 12"), "{}", vllm.text);
    // vLLM's own queue is a backstop behind the gateway's Q 12: C, what the gateway can hand
    // one replica at most.
    assert!(vllm.text.contains("--max-num-queued-reqs 24"), "{}", vllm.text);
    assert!(args.iter().any(|a| a == "--max-num-queued-reqs=24"), "{args:?}");
}

#[test]
fn three_gateways_with_their_own_counters_each_take_a_third() {
    let mut d = seed_deployment();
    d.gateway_replicas = 3;
    let p = plan(&seed_measurement(true), &d).unwrap();
    let files = render_all(&p, &[Target::Spillway, Target::Envoy]).unwrap();
    let config = gateway::Config::from_yaml(&files[0].text).unwrap();
    let class = &config.routes[0].classes[0];
    assert_eq!((class.concurrency.initial(), class.queue), (8, 4));
    let envoy: serde_json::Value = serde_yaml_ng::from_str(&files[1].text).unwrap();
    assert_eq!(envoy["spec"]["circuitBreaker"]["maxParallelRequests"], 8);
    // LiteLLM sees all of them at once: its cap stays C + Q.
    assert_eq!(p.litellm_max_parallel, 36);
    assert!(
        p.lines.iter().any(|l| l.text.contains("Redis")),
        "the shared-counter mode is named"
    );
}
