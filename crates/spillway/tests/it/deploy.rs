//! The Kubernetes manifests in `deploy/kubernetes/`: they parse, the HTTPRoute fits the Gateway
//! API's CRD, the probes reach real endpoints, the config passes `spillway check`, and the grace
//! period outlasts the drain.

use crate::manifests::{Manifests, TOKEN, assert_fits_crd, deploy_dir};
use crate::support::{BIN, try_get};
use testkit::Process;

fn manifests() -> Manifests {
    Manifests::load(deploy_dir(""))
}

fn config() -> gateway::Config {
    gateway::Config::from_yaml(&manifests().config_text()).expect("the ConfigMap's config loads")
}

#[test]
fn every_manifest_parses_and_the_set_is_complete() {
    manifests().assert_complete(&[
        "Deployment",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "HTTPRoute",
    ]);
}

#[test]
fn the_configmaps_config_passes_spillway_check_with_the_admin_token_set() {
    manifests().assert_config_passes_spillway_check(&config());
}

#[test]
fn the_deployment_runs_the_configmaps_file() {
    manifests().assert_deployment_runs_the_configmaps_file();
}

/// The probes' paths and port, asked of a gateway started from the ConfigMap's own config (its
/// listeners moved to loopback ports that are free): `/health` answers 200 and `/ready` answers
/// (503 here, since the cluster's vLLM replicas are not reachable from a test), where a path the
/// gateway does not serve gets 404.
#[test]
fn the_probes_name_endpoints_the_gateway_serves_on_its_listen_port() {
    let m = manifests();
    let config = config();
    let c = m.container();
    let readiness = &c["readinessProbe"]["httpGet"];
    let liveness = &c["livenessProbe"]["httpGet"];
    assert_eq!(readiness["path"], "/ready");
    assert_eq!(liveness["path"], "/health");
    let listen_port = u64::from(config.listen.port());
    assert_eq!(m.container_port(&readiness["port"]), listen_port);
    assert_eq!(m.container_port(&liveness["port"]), listen_port);
    assert_eq!(
        m.service_target("spillway", &80.into()),
        listen_port,
        "the Service sends clients to the listen port"
    );
    let admin_port = u64::from(config.admin.unwrap().listen.port());
    assert_eq!(m.service_target("spillway-admin", &9090.into()), admin_port);

    let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&m.config_text()).unwrap();
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
    manifests().assert_grace_outlasts_the_drain_and_the_longest_stream(&config());
}

#[test]
fn the_httproute_validates_against_the_gateway_api_crd_and_reaches_the_service() {
    let m = manifests();
    let route = m.the("HTTPRoute");
    // Without the CRD, still check that the route sends traffic to the gateway's public port.
    for rule in route["spec"]["rules"].as_array().unwrap() {
        for backend in rule["backendRefs"].as_array().unwrap() {
            let name = backend["name"].as_str().unwrap();
            assert_eq!(
                m.service(name)["metadata"]["namespace"],
                route["metadata"]["namespace"]
            );
            assert_eq!(
                m.service_target(name, &backend["port"]),
                u64::from(config().listen.port()),
                "the route reaches the client listener, never the admin one"
            );
        }
    }
    let Some(dir) = testkit::crd::schemas_dir() else {
        return;
    };
    assert_fits_crd(
        &dir.join("gateway-api.httproutes.crd.yaml"),
        route,
        "backendRef",
        |typo| typo["spec"]["rules"][0]["backendRef"] = typo["spec"]["rules"][0]["backendRefs"].clone(),
    );
}
