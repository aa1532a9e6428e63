//! The plan as files, one per control point, each serialized from typed structs so that a field
//! name is spelled once and every value is escaped by the serializer.

mod kube;
mod litellm;
mod spillway;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::PlanError;
use crate::arith::Plan;

/// A control point to emit configuration for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Spillway's own config (`spillway serve --config`).
    Spillway,
    /// An Envoy Gateway `BackendTrafficPolicy`.
    Envoy,
    /// A LiteLLM proxy `model_list` entry.
    Litellm,
    /// `vllm serve` arguments for each replica.
    Vllm,
    /// The same arguments in a KServe `InferenceService`.
    Kserve,
}

impl Target {
    pub const ALL: [Target; 5] = [
        Target::Spillway,
        Target::Envoy,
        Target::Litellm,
        Target::Vllm,
        Target::Kserve,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Spillway => "spillway",
            Target::Envoy => "envoy",
            Target::Litellm => "litellm",
            Target::Vllm => "vllm",
            Target::Kserve => "kserve",
        }
    }

    /// The file it is written to under `--out`.
    pub fn file_name(self) -> &'static str {
        match self {
            Target::Spillway => "spillway.yaml",
            Target::Envoy => "envoy-backendtrafficpolicy.yaml",
            Target::Litellm => "litellm.yaml",
            Target::Vllm => "vllm-args.txt",
            Target::Kserve => "kserve-inferenceservice.yaml",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown target {s:?} (spillway, envoy, litellm, vllm, kserve)"))
    }
}

/// One emitted file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Artifact {
    pub target: Target,
    pub file_name: &'static str,
    pub text: String,
}

/// The file for one control point.
pub fn render(plan: &Plan, target: Target) -> Result<Artifact, PlanError> {
    let text = match target {
        Target::Spillway => yaml(target, &spillway::config(plan))?,
        Target::Envoy => yaml(target, &kube::backend_traffic_policy(plan)?)?,
        Target::Litellm => yaml(target, &litellm::config(plan))?,
        Target::Vllm => kube::vllm_command(plan),
        Target::Kserve => yaml(target, &kube::inference_service(plan)?)?,
    };
    Ok(Artifact {
        target,
        file_name: target.file_name(),
        text: format!("{}{text}", unmeasured(plan, target)),
    })
}

/// The files for several control points, in the order asked.
pub fn render_all(plan: &Plan, targets: &[Target]) -> Result<Vec<Artifact>, PlanError> {
    targets.iter().map(|t| render(plan, *t)).collect()
}

/// `# ` lines naming what in this file nothing measured, so that a guess is not applied as fact.
fn unmeasured(plan: &Plan, target: Target) -> String {
    plan.names
        .unmeasured
        .iter()
        .filter(|u| u.targets.contains(&target))
        .map(|u| format!("# NOT MEASURED: {}\n", u.note))
        .collect()
}

fn yaml(target: Target, value: &impl Serialize) -> Result<String, PlanError> {
    serde_yaml_ng::to_string(value).map_err(|source| PlanError::Yaml {
        target: target.name(),
        source,
    })
}

/// A duration as config files write it: `2s`, or `1500ms` when not whole seconds. Both humantime
/// (Spillway) and Envoy Gateway's `^([0-9]{1,5}(h|m|s|ms)){1,4}$` read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Human(pub(crate) Duration);

impl Serialize for Human {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            s.collect_str(&format_args!("{}s", ms / 1000))
        } else {
            s.collect_str(&format_args!("{ms}ms"))
        }
    }
}

/// Whole seconds, rounded up: for fields that take an integer number of seconds.
pub(crate) fn whole_secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000) as u64
}
