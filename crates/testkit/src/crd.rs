//! Kubernetes objects checked against the CRDs their projects publish, strictly: Kubernetes prunes
//! unknown fields instead of rejecting them, so a misspelt field would pass a plain validation and
//! then do nothing; here, as with `kubectl apply --validate=strict`, an object schema that lists its
//! properties (and does not preserve unknown fields) takes no others.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// The folder holding the CRDs: `SPILLWAY_SCHEMAS`, else `shared/schemas` beside the workspace.
/// `None`, with a printed reason, where neither exists (a user's clone has no shared folder).
pub fn schemas_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("SPILLWAY_SCHEMAS") {
        Some(d) => PathBuf::from(d),
        None => crate::repo_root().join("../shared/schemas"),
    };
    if dir.is_dir() {
        Some(dir)
    } else {
        println!(
            "skipped: no CRD schemas at {} (set SPILLWAY_SCHEMAS to a folder holding them)",
            dir.display()
        );
        None
    }
}

/// The strict `openAPIV3Schema` of the CRD's served version named in `api_version`, and its kind.
pub fn schema(crd: &Path, api_version: &str) -> (Value, String) {
    let text = std::fs::read_to_string(crd).unwrap_or_else(|e| panic!("{}: {e}", crd.display()));
    let doc: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", crd.display()));
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or_else(|| panic!("{api_version}: not group/version"));
    assert_eq!(doc["spec"]["group"], group, "{}", crd.display());
    let served = doc["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version && v["served"] == true)
        .unwrap_or_else(|| panic!("{} serves no {version}", crd.display()));
    let mut schema = served["schema"]["openAPIV3Schema"].clone();
    close(&mut schema);
    let kind = doc["spec"]["names"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (schema, kind)
}

fn close(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let open = map.contains_key("additionalProperties")
                || map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties") && !open {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            map.values_mut().for_each(close);
        }
        Value::Array(items) => items.iter_mut().for_each(close),
        _ => {}
    }
}

/// What the CRD (JSON Schema, draft 4) says is wrong with `object`: empty when it validates. The
/// object's `kind` must be the CRD's.
pub fn violations(crd: &Path, object: &Value) -> Vec<String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (schema, kind) = schema(crd, api_version);
    assert_eq!(object["kind"], kind.as_str(), "{}", crd.display());
    let validator = jsonschema::draft4::new(&schema).expect("the CRD's schema compiles");
    validator
        .iter_errors(object)
        .map(|e| format!("{kind}: {e} at {}", e.instance_path()))
        .collect()
}
