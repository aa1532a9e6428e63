//! The Kubernetes manifests in `deploy/kubernetes/`: they parse, the HTTPRoute fits the Gateway
//! API's CRD, the probes reach real endpoints, the config passes `spillway check`, and the grace
//! period outlasts the drain.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::support::{BIN, try_get};
use testkit::Process;

/// Long enough for `spillway check`; the token itself is never used against a server.
const TOKEN: &str = "deploy-test-admin-token-0123456789";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every document of every `.yaml` file, with the file it came from.
fn manifests() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        for de in serde_yaml_ng::Deserializer::from_str(&text) {
            let doc = Value::deserialize(de).unwrap_or_else(|e| panic!("{name}: {e}"));
            if !doc.is_null() {
                docs.push((name.clone(), doc));
            }
        }
    }
    docs
}

fn the(kind: &str) -> Value {
    let found: Vec<Value> = manifests()
        .into_iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| d)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in deploy/kubernetes");
    found.into_iter().next().unwrap()
}

fn service(name: &str) -> Value {
    manifests()
        .into_iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Service {name}"))
}

/// The gateway's configuration as the ConfigMap holds it.
fn config_text() -> String {
    let cm = the("ConfigMap");
    cm["data"]["spillway.yaml"]
        .as_str()
        .expect("the ConfigMap holds spillway.yaml")
        .to_owned()
}

fn config() -> gateway::Config {
    gateway::Config::from_yaml(&config_text()).expect("the ConfigMap's config loads")
}

fn container() -> Value {
    let d = the("Deployment");
    let containers = d["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    containers[0].clone()
}

/// A probe's or Service's `port`: a number, or the name of one of the container's ports.
fn container_port(port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let name = port.as_str().expect("a port is a number or a name");
    container()["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("the container has no port named {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

fn k8s_duration(v: &Value) -> Duration {
    humantime::parse_duration(v.as_str().expect("a duration string")).unwrap()
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spillway-deploy-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("spillway.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_manifest_parses_and_the_set_is_complete() {
    let docs = manifests();
    for (file, doc) in &docs {
        assert!(
            doc["apiVersion"].is_string(),
            "{file}: a document without apiVersion"
        );
        assert!(doc["kind"].is_string(), "{file}: a document without kind");
    }
    for kind in [
        "Deployment",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "HTTPRoute",
    ] {
        assert!(
            docs.iter().any(|(_, d)| d["kind"] == kind),
            "no {kind} in deploy/kubernetes"
        );
    }
    // The kustomization lists every other file, so `kubectl apply -k` applies them all.
    let kustomization = the("Kustomization");
    let listed: Vec<&str> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for (file, doc) in &docs {
        if doc["kind"] != "Kustomization" {
            assert!(
                listed.contains(&file.as_str()),
                "{file} is not in kustomization.yaml"
            );
        }
    }
}

#[test]
fn the_configmaps_config_passes_spillway_check_with_the_admin_token_set() {
    let path = temp_file("check", &config_text());
    let with = Command::new(BIN)
        .args(["check", path.to_str().unwrap()])
        .env("SPILLWAY_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&with.stdout);
    assert!(
        with.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert!(stdout.contains(": ok"), "{stdout}");
    // The token comes from the Secret, not the file: without it the same config is refused.
    let without = Command::new(BIN)
        .args(["check", path.to_str().unwrap()])
        .env_remove("SPILLWAY_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!without.status.success(), "checked without the admin token");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());

    let c = container();
    let token_env = config().admin.expect("the config has an admin section").token_env;
    let env = c["env"].as_array().unwrap();
    let var = env
        .iter()
        .find(|e| e["name"] == token_env.as_str())
        .unwrap_or_else(|| panic!("the container does not set {token_env}"));
    assert!(
        var["valueFrom"]["secretKeyRef"]["name"].is_string(),
        "{token_env} comes from a Secret"
    );
}

#[test]
fn the_deployment_runs_the_configmaps_file() {
    let c = container();
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[..2], ["serve", "--config"]);
    let config_path = Path::new(args[2]);
    let pod = &the("Deployment")["spec"]["template"]["spec"];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| config_path.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("the config path is under a volume mount")
        .clone();
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount never sees ConfigMap updates"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume")
        .clone();
    let cm = the("ConfigMap");
    assert_eq!(volume["configMap"]["name"], cm["metadata"]["name"]);
    let key = config_path.file_name().unwrap().to_str().unwrap();
    assert!(cm["data"][key].is_string(), "the ConfigMap has no key {key}");
}

/// The probes' paths and port, asked of a gateway started from the ConfigMap's own config (its
/// listeners moved to loopback ports that are free): `/health` answers 200 and `/ready` answers
/// (503 here, since the cluster's vLLM replicas are not reachable from a test), where a path the
/// gateway does not serve gets 404.
#[test]
fn the_probes_name_endpoints_the_gateway_serves_on_its_listen_port() {
    let c = container();
    let readiness = &c["readinessProbe"]["httpGet"];
    let liveness = &c["livenessProbe"]["httpGet"];
    assert_eq!(readiness["path"], "/ready");
    assert_eq!(liveness["path"], "/health");
    let listen_port = u64::from(config().listen.port());
    assert_eq!(container_port(&readiness["port"]), listen_port);
    assert_eq!(container_port(&liveness["port"]), listen_port);
    let public = service("spillway");
    assert_eq!(
        container_port(&public["spec"]["ports"][0]["targetPort"]),
        listen_port,
        "the Service sends clients to the listen port"
    );
    let admin_port = u64::from(config().admin.unwrap().listen.port());
    assert_eq!(
        container_port(&service("spillway-admin")["spec"]["ports"][0]["targetPort"]),
        admin_port
    );

    let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&config_text()).unwrap();
    yaml["listen"] = "127.0.0.1:{PORT}".into();
    yaml["admin"]["listen"] = "127.0.0.1:{PORT1}".into();
    let gateway = Process::gateway(BIN, &serde_yaml_ng::to_string(&yaml).unwrap(), &[], |cmd| {
        cmd.env("SPILLWAY_ADMIN_TOKEN", TOKEN);
    });
    let port = gateway.port;
    let status = |path: &str| {
        try_get(port, path)
            .ok()
            .and_then(|r| r.get(9..12).map(str::to_owned))
    };
    let health = liveness["path"].as_str().unwrap();
    let ready = readiness["path"].as_str().unwrap();
    assert_eq!(status(health).as_deref(), Some("200"));
    let ready_status = status(ready).unwrap();
    assert!(
        ready_status == "200" || ready_status == "503",
        "{ready} answered {ready_status}"
    );
    assert_eq!(status("/no-such-probe").as_deref(), Some("404"));
}

#[test]
fn the_grace_period_outlasts_the_prestop_the_drain_and_the_longest_stream() {
    let config = config();
    let pod = &the("Deployment")["spec"]["template"]["spec"];
    let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap());
    let pre_stop = Duration::from_secs(
        container()["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .expect("a preStop sleep"),
    );
    let drain = config.server.drain_delay + config.server.drain_timeout;
    assert!(
        grace > pre_stop + drain,
        "grace {grace:?} ≤ preStop {pre_stop:?} + drain_delay + drain_timeout {drain:?}"
    );
    let longest = config.routes.iter().map(|r| r.timeouts.total).max().unwrap();
    assert!(
        config.server.drain_timeout >= longest,
        "drain_timeout {:?} cuts streams inside their budget (total {longest:?})",
        config.server.drain_timeout
    );
    // The route in front must not cut a stream the gateway still allows.
    for rule in the("HTTPRoute")["spec"]["rules"].as_array().unwrap() {
        if let Some(request) = rule["timeouts"].get("request") {
            assert!(
                k8s_duration(request) >= longest,
                "the HTTPRoute's timeout is under total"
            );
        }
    }
}

fn httproute_violations(crd: &Path, route: &Value) -> Vec<String> {
    testkit::crd::violations(crd, route)
}

#[test]
fn the_httproute_validates_against_the_gateway_api_crd_and_reaches_the_service() {
    let route = the("HTTPRoute");
    // Without the CRD, still check that the route sends traffic to the gateway's public port.
    for rule in route["spec"]["rules"].as_array().unwrap() {
        for backend in rule["backendRefs"].as_array().unwrap() {
            let svc = service(backend["name"].as_str().unwrap());
            assert_eq!(svc["metadata"]["namespace"], route["metadata"]["namespace"]);
            let port = svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["port"] == backend["port"])
                .expect("the Service exposes the backendRef's port")
                .clone();
            assert_eq!(
                container_port(&port["targetPort"]),
                u64::from(config().listen.port()),
                "the route reaches the client listener, never the admin one"
            );
        }
    }
    let Some(dir) = testkit::crd::schemas_dir() else {
        return;
    };
    let crd = dir.join("gateway-api.httproutes.crd.yaml");
    let errors = httproute_violations(&crd, &route);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    // The strict check is not vacuous: a misspelt field fails it.
    let mut typo = route.clone();
    typo["spec"]["rules"][0]["backendRef"] = typo["spec"]["rules"][0]["backendRefs"].clone();
    let errors = httproute_violations(&crd, &typo);
    assert!(
        errors.iter().any(|e| e.contains("backendRef")),
        "a misspelt field passed validation: {errors:?}"
    );
}
