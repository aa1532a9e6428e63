//! The plan as text: the figures, each line of arithmetic with its sources, the binding layer and
//! the warnings.

use std::fmt::Write;

use crate::arith::Plan;
use crate::units::dur;

/// The whole plan for a terminal.
pub fn text(plan: &Plan) -> String {
    let mut out = String::new();
    let n = &plan.names;
    let b = &plan.budgets;
    let measured = plan
        .api
        .map(|api| format!(", measured with the {api} API ({})", api.path()))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "spillway plan: {} on {} replica(s) behind {} gateway(s){measured}",
        n.model, plan.replicas, plan.gateway_replicas
    );
    let _ = writeln!(out);
    for line in &plan.lines {
        let _ = writeln!(out, "  {}", line.text);
        let _ = writeln!(out, "      from: {}", line.from);
    }
    let _ = writeln!(out);
    // LiteLLM is named only where it was planned for.
    let litellm = plan.litellm.then(|| {
        (
            format!("; LiteLLM max_parallel_requests {}", plan.litellm_max_parallel),
            format!(
                " > LiteLLM {} (stream {})",
                dur(b.litellm_timeout),
                dur(b.litellm_stream_timeout)
            ),
        )
    });
    let (litellm_cap, litellm_budget) = litellm.unwrap_or_default();
    let _ = writeln!(
        out,
        "Limits: C {} in flight, Q {} waiting, Wq {} (per gateway: C {}, Q {}); vLLM --max-num-seqs {} and --max-num-queued-reqs {} per replica{litellm_cap}",
        plan.concurrency,
        plan.queue,
        dur(b.queue_wait),
        plan.per_gateway.concurrency,
        plan.per_gateway.queue,
        plan.max_num_seqs,
        plan.max_num_queued_reqs,
    );
    let _ = writeln!(
        out,
        "Budgets: caller {}{litellm_budget} > gateway total {} > model {}; first_token {}, stream_idle {}, connect {}",
        dur(b.caller),
        dur(b.total),
        dur(b.model),
        dur(b.first_token),
        dur(b.stream_idle),
        dur(b.connect)
    );
    if let Some(cap) = plan.max_tokens {
        let _ = writeln!(
            out,
            "Answers: max_tokens at most {cap} (the budgets hold up to it; Spillway's config caps it and sends it when a request gives none)"
        );
    }
    let _ = writeln!(out, "Binding layer: {}", plan.binding_why);
    if plan.envoy {
        let _ = writeln!(
            out,
            "Envoy Gateway: maxParallelRequests and maxPendingRequests carry C and Q, requestTimeout the total and streamIdleTimeout the idle gap; it has no queue-wait timer (a pending request waits until requestTimeout) and no first-token timer."
        );
    }
    let _ = writeln!(
        out,
        "Change one layer at a time: vLLM first, then the gateway's C and Q{}.",
        if plan.litellm {
            ", then tenants in LiteLLM"
        } else {
            ""
        }
    );
    if !plan.warnings.is_empty() {
        let _ = writeln!(out);
        for w in &plan.warnings {
            let _ = writeln!(out, "WARNING: {w}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arith::tests::seed;
    use crate::arith::{Layer, plan};

    #[test]
    fn a_plan_reasons_only_about_the_control_points_it_plans_for() {
        let (m, mut d) = seed();
        (d.litellm, d.envoy) = (false, false);
        d.pinned.max_num_seqs = Some(16);
        let p = plan(&m, &d).unwrap();
        assert_eq!(p.concurrency, 24);
        assert_eq!(p.max_num_seqs, 16);
        assert_eq!(p.binding, Layer::Gateway);
        assert!(
            p.binding_why.ends_with("the engines hold 2 × 16 = 32 ≥ C"),
            "{}",
            p.binding_why
        );
        let text = text(&p);
        assert!(!text.contains("LiteLLM") && !text.contains("Envoy"), "{text}");
        assert!(
            text.contains("--max-num-seqs = 16 per replica, as the engines run"),
            "{text}"
        );
        // With LiteLLM planned for, it is sized and named.
        d.litellm = true;
        let text = super::text(&plan(&m, &d).unwrap());
        assert!(text.contains("LiteLLM 36 ≥ C"), "{text}");
    }
}
