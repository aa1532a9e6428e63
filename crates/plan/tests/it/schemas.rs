//! The emitted Kubernetes objects against the CRDs their projects publish: Envoy Gateway's
//! `BackendTrafficPolicy` and KServe's `InferenceService`, validated as JSON Schema.
//!
//! Kubernetes prunes unknown fields instead of rejecting them, so a misspelt field would pass a
//! plain validation and then silently do nothing; the check here is strict, as
//! `kubectl apply --validate=strict` is: objects that list their properties take no others. The
//! CRDs' CEL rules (`x-kubernetes-validations`) are not JSON Schema; the one that concerns us (a
//! `targetRefs` entry is a Gateway API `HTTPRoute`) is asserted by hand.

use std::path::Path;

use serde_json::Value;
use spillway_plan::emit::render;
use spillway_plan::{Target, plan};

use crate::support::{seed_deployment, seed_measurement};
use testkit::crd::schemas_dir;

/// What the CRD says is wrong with the object: empty when it validates.
fn violations(crd: &Path, object_yaml: &str) -> Vec<String> {
    let object: Value = serde_yaml_ng::from_str(object_yaml).unwrap();
    testkit::crd::violations(crd, &object)
}

fn validate(crd: &Path, object_yaml: &str) {
    let errors = violations(crd, object_yaml);
    assert!(errors.is_empty(), "{}\n{object_yaml}", errors.join("\n"));
}

#[test]
fn the_backend_traffic_policy_validates_against_envoy_gateways_crd() {
    let Some(dir) = schemas_dir() else { return };
    for gateways in [1, 3] {
        let mut d = seed_deployment();
        d.gateway_replicas = gateways;
        let p = plan(&seed_measurement(true), &d).unwrap();
        let policy = render(&p, Target::Envoy).unwrap();
        validate(
            &dir.join("envoy-gateway.backendtrafficpolicies.crd.yaml"),
            &policy.text,
        );
        let object: Value = serde_yaml_ng::from_str(&policy.text).unwrap();
        for target in object["spec"]["targetRefs"].as_array().unwrap() {
            assert_eq!(target["group"], "gateway.networking.k8s.io");
            assert_eq!(target["kind"], "HTTPRoute");
        }
    }
}

#[test]
fn the_inference_service_validates_against_kserves_crd() {
    let Some(dir) = schemas_dir() else { return };
    let p = plan(&seed_measurement(true), &seed_deployment()).unwrap();
    let isvc = render(&p, Target::Kserve).unwrap();
    validate(&dir.join("kserve.inferenceservices.crd.yaml"), &isvc.text);
}

#[test]
fn the_strict_check_catches_a_misspelt_field() {
    let Some(dir) = schemas_dir() else { return };
    let p = plan(&seed_measurement(true), &seed_deployment()).unwrap();
    let policy = render(&p, Target::Envoy).unwrap();
    let typo = policy.text.replace("maxPendingRequests", "maxPendingRequest");
    let crd = dir.join("envoy-gateway.backendtrafficpolicies.crd.yaml");
    let errors = violations(&crd, &typo);
    assert!(
        errors.iter().any(|e| e.contains("maxPendingRequest")),
        "a misspelt field passed validation: {errors:?}"
    );
}
