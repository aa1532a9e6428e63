//! The Kubernetes objects — Envoy Gateway's `BackendTrafficPolicy`, KServe's `InferenceService` —
//! and the vLLM arguments the latter carries.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Human, whole_secs};
use crate::PlanError;
use crate::arith::Plan;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Object<Spec> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Serialize)]
struct Metadata {
    name: String,
    namespace: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'static str, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PolicySpec {
    target_refs: Vec<TargetRef>,
    circuit_breaker: CircuitBreaker,
    timeout: PolicyTimeout,
}

#[derive(Serialize)]
struct TargetRef {
    group: &'static str,
    kind: &'static str,
    name: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CircuitBreaker {
    max_parallel_requests: u32,
    max_pending_requests: u32,
}

#[derive(Serialize)]
struct PolicyTimeout {
    tcp: TcpTimeout,
    http: HttpTimeout,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TcpTimeout {
    connect_timeout: Human,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HttpTimeout {
    /// The whole response, streams included: Envoy's default of 15 s would cut long streams.
    request_timeout: Human,
    stream_idle_timeout: Human,
}

/// What Envoy Gateway's policy cannot say, recorded on the object for whoever reads it in a cluster.
const ENVOY_NOTE: &str = "Envoy Gateway has no queue-wait timer (a pending request waits until requestTimeout, not Wq) and no first-token timer (first_token is not enforced here)";

pub(super) fn backend_traffic_policy(plan: &Plan) -> Result<Object<PolicySpec>, PlanError> {
    let n = &plan.names;
    dns_label(&n.route, "--route")?;
    dns_label(&n.namespace, "--namespace")?;
    let b = &plan.budgets;
    let mut annotations = BTreeMap::new();
    let spread = if plan.gateway_replicas == 1 {
        String::new()
    } else {
        format!(
            " per proxy (C {} and Q {} over {} proxies)",
            plan.concurrency, plan.queue, plan.gateway_replicas
        )
    };
    annotations.insert(
        "spillway.dev/plan",
        format!(
            "C {} and Q {}{spread}, Wq {}; from spillway plan",
            plan.per_gateway.concurrency,
            plan.per_gateway.queue,
            crate::arith::dur(b.queue_wait)
        ),
    );
    annotations.insert("spillway.dev/not-expressed", ENVOY_NOTE.to_owned());
    Ok(Object {
        api_version: "gateway.envoyproxy.io/v1alpha1",
        kind: "BackendTrafficPolicy",
        metadata: Metadata {
            name: format!("{}-capacity", n.route),
            namespace: n.namespace.clone(),
            annotations,
        },
        spec: PolicySpec {
            target_refs: vec![TargetRef {
                group: "gateway.networking.k8s.io",
                kind: "HTTPRoute",
                name: n.route.clone(),
            }],
            circuit_breaker: CircuitBreaker {
                max_parallel_requests: plan.per_gateway.concurrency,
                max_pending_requests: plan.per_gateway.queue,
            },
            timeout: PolicyTimeout {
                tcp: TcpTimeout {
                    connect_timeout: Human(b.connect),
                },
                http: HttpTimeout {
                    request_timeout: Human(b.total),
                    stream_idle_timeout: Human(b.stream_idle),
                },
            },
        },
    })
}

#[derive(Serialize)]
pub(super) struct IsvcSpec {
    predictor: Predictor,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Predictor {
    min_replicas: u32,
    max_replicas: u32,
    /// Seconds before a request to the predictor times out: the model's own budget.
    timeout: u64,
    model: Model,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Model {
    model_format: ModelFormat,
    storage_uri: String,
    args: Vec<String>,
}

#[derive(Serialize)]
struct ModelFormat {
    name: &'static str,
}

pub(super) fn inference_service(plan: &Plan) -> Result<Object<IsvcSpec>, PlanError> {
    let n = &plan.names;
    dns_label(&n.route, "--route")?;
    dns_label(&n.namespace, "--namespace")?;
    let mut args = vec![format!("--model_name={}", n.served_model)];
    args.extend(engine_args(plan).into_iter().map(|(k, v)| format!("{k}={v}")));
    let storage_uri = if n.hf_model.contains("://") {
        n.hf_model.clone()
    } else {
        format!("hf://{}", n.hf_model)
    };
    Ok(Object {
        api_version: "serving.kserve.io/v1beta1",
        kind: "InferenceService",
        metadata: Metadata {
            name: n.route.clone(),
            namespace: n.namespace.clone(),
            annotations: BTreeMap::new(),
        },
        spec: IsvcSpec {
            predictor: Predictor {
                min_replicas: plan.replicas,
                max_replicas: plan.replicas,
                timeout: whole_secs(plan.budgets.model),
                model: Model {
                    model_format: ModelFormat { name: "huggingface" },
                    storage_uri,
                    args,
                },
            },
        },
    })
}

/// The engine's flags from the plan, and the ones passed through.
fn engine_args(plan: &Plan) -> Vec<(&'static str, String)> {
    let n = &plan.names;
    let mut args = vec![
        ("--max-num-seqs", plan.max_num_seqs.to_string()),
        ("--max-num-queued-reqs", plan.max_num_queued_reqs.to_string()),
    ];
    if let Some(len) = n.max_model_len {
        args.push(("--max-model-len", len.to_string()));
    }
    if let Some(tokens) = n.max_num_batched_tokens {
        args.push(("--max-num-batched-tokens", tokens.to_string()));
    }
    args
}

/// `vllm serve …` for each replica, as a shell line (a `#` line above says what it is).
pub(super) fn vllm_command(plan: &Plan) -> String {
    let n = &plan.names;
    let mut words = vec!["vllm".to_owned(), "serve".to_owned(), shell_word(&n.hf_model)];
    words.push("--served-model-name".into());
    words.push(shell_word(&n.served_model));
    if n.model != n.served_model {
        // A gateway that passes the public name through (Envoy) reaches the engine by it too.
        words.push(shell_word(&n.model));
    }
    for (k, v) in engine_args(plan) {
        words.push(k.to_owned());
        words.push(v);
    }
    format!(
        "# on each of the {} replicas: --max-num-seqs = ceil(C {} / R {}); --max-num-queued-reqs = C, a backstop behind the gateway's Q\n{}\n",
        plan.replicas,
        plan.concurrency,
        plan.replicas,
        words.join(" ")
    )
}

fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@=+".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Kubernetes object names and namespaces here must be DNS-1123 labels.
fn dns_label(s: &str, flag: &str) -> Result<(), PlanError> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(PlanError::Input(format!(
            "{flag} {s:?}: a Kubernetes name is lower-case letters, digits and '-', at most 63, starting and ending alphanumeric"
        )))
    }
}
