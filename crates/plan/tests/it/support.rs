//! The seed's deployment, and the shared folder's schemas when there is one.

use std::time::Duration;

use spillway_plan::arith::Pinned;
use spillway_plan::{Deployment, Figures, Measurement, Names};

/// The names the seed's chapter uses: `corp-chat` in `ai-serving`, served as `spark-chat`.
pub(crate) fn seed_names(replicas: u32) -> Names {
    Names {
        model: "corp-chat".into(),
        served_model: "spark-chat".into(),
        hf_model: "org/spark-chat".into(),
        namespace: "ai-serving".into(),
        route: "corp-chat".into(),
        listen: "0.0.0.0:8080".into(),
        upstreams: (0..replicas)
            .map(|i| format!("http://127.0.0.1:{}", 8000 + i))
            .collect(),
        api_base: "http://corp-chat.ai-serving.svc.cluster.local/v1".into(),
        class: "interactive".into(),
        max_model_len: Some(8192),
        max_num_batched_tokens: Some(4096),
        unmeasured: Vec::new(),
    }
}

/// The seed's figures: C_safe 15 per replica, 6 req/s over the two replicas, and tails.
pub(crate) fn seed_figures(tails: bool) -> Figures {
    Figures {
        c_safe: 15,
        throughput: 6.0,
        ttft_p99: tails.then(|| Duration::from_millis(800)),
        itl_p99: tails.then(|| Duration::from_millis(60)),
        e2e_p99: tails.then(|| Duration::from_secs(24)),
    }
}

pub(crate) fn seed_deployment() -> Deployment {
    Deployment {
        replicas: 2,
        gateway_replicas: 1,
        wait_budget: Some(Duration::from_secs(2)),
        headroom: 0.8,
        caller_deadline: Duration::from_secs(60),
        pinned: Pinned {
            max_tokens: Some(1024),
            ..Pinned::default()
        },
        tenant_quotas: Vec::new(),
        names: seed_names(2),
        litellm: true,
        envoy: true,
    }
}

pub(crate) fn seed_measurement(tails: bool) -> Measurement {
    Measurement::from_figures(&seed_figures(tails), 2).expect("the seed's figures are valid")
}
