//! The endpoint-picker set in `deploy/kubernetes/endpoint-picker/`: it parses, the InferencePool,
//! HTTPRoute and BackendTrafficPolicy fit their CRDs, the pool asks the picker's Service on the
//! port the config listens on and selects the pods the config names, the probes ask the picker's
//! health services, the config passes `spillway check`, and the grace period outlasts the drain.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::Value;

use crate::manifests::{Manifests, assert_fits_crd, deploy_dir, k8s_duration};

fn manifests() -> Manifests {
    Manifests::load(deploy_dir("endpoint-picker"))
}

/// The config's `endpoint_picker` section.
struct Picker {
    listen: SocketAddr,
    fallbacks: u64,
}

/// The ConfigMap's config: its `endpoint_picker` section read here, the rest as the gateway reads
/// it (the section is taken out first, so this does not depend on how the gateway's `Config`
/// types it).
fn config(m: &Manifests) -> (Picker, gateway::Config) {
    let mut yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&m.config_text()).unwrap();
    let section = yaml
        .as_mapping_mut()
        .unwrap()
        .remove("endpoint_picker")
        .expect("the ConfigMap's config has endpoint_picker");
    let listen = section["listen"]
        .as_str()
        .expect("endpoint_picker.listen")
        .parse()
        .expect("endpoint_picker.listen is an address");
    // 1 is the gateway's default.
    let fallbacks = section.get("fallbacks").map_or(1, |f| f.as_u64().unwrap());
    let rest = gateway::Config::from_yaml(&serde_yaml_ng::to_string(&yaml).unwrap())
        .expect("the ConfigMap's config loads");
    (Picker { listen, fallbacks }, rest)
}

/// A CRD of the schemas folder; `None`, with a printed reason, where the folder or the file is
/// absent (a shared folder from before the InferencePool CRD was added to it).
fn crd(file: &str) -> Option<std::path::PathBuf> {
    let path = testkit::crd::schemas_dir()?.join(file);
    if path.is_file() {
        Some(path)
    } else {
        println!("skipped: no {} (the schemas folder predates it)", path.display());
        None
    }
}

#[test]
fn every_manifest_parses_and_the_set_is_complete() {
    manifests().assert_complete(&[
        "Deployment",
        "Service",
        "ConfigMap",
        "PodDisruptionBudget",
        "InferencePool",
        "HTTPRoute",
        "BackendTrafficPolicy",
    ]);
}

/// Needs a gateway that knows `endpoint_picker` (issue 40's picker): before it, `spillway check`
/// refuses the section as an unknown field.
#[test]
fn the_configmaps_config_passes_spillway_check_with_the_admin_token_set() {
    let m = manifests();
    m.assert_config_passes_spillway_check(&config(&m).1);
}

#[test]
fn the_deployment_runs_the_configmaps_file() {
    manifests().assert_deployment_runs_the_configmaps_file();
}

#[test]
fn the_grace_period_outlasts_the_prestop_the_drain_and_the_longest_stream() {
    let m = manifests();
    m.assert_grace_outlasts_the_drain_and_the_longest_stream(&config(&m).1);
}

/// The pool's `endpointPickerRef` is the picker's Service in the pool's namespace, on the Service
/// port that reaches `endpoint_picker.listen`, spoken as h2c; the pool fails closed.
#[test]
fn the_inference_pool_asks_the_pickers_service_on_the_configs_port_and_fits_its_crd() {
    let m = manifests();
    let (picker, _) = config(&m);
    let pool = m.the("InferencePool");
    let spec = &pool["spec"];
    let picker_ref = &spec["endpointPickerRef"];
    // Kind and group default to a core Service.
    assert!(picker_ref["kind"].is_null() || picker_ref["kind"] == "Service");
    assert!(picker_ref["group"].is_null() || picker_ref["group"] == "");
    let name = picker_ref["name"].as_str().unwrap();
    let service = m.service(name);
    assert_eq!(service["metadata"]["namespace"], pool["metadata"]["namespace"]);
    let port = &picker_ref["port"]["number"];
    assert_eq!(
        m.service_target(name, port),
        u64::from(picker.listen.port()),
        "the pool's picker port reaches endpoint_picker.listen"
    );
    let service_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == *port)
        .unwrap();
    assert_eq!(
        service_port["appProtocol"], "kubernetes.io/h2c",
        "ext_proc is gRPC in plaintext HTTP/2"
    );
    assert_eq!(picker_ref["failureMode"], "FailClose");

    let Some(crd) = crd("gateway-api-inference-extension.inferencepools.crd.yaml") else {
        return;
    };
    assert_fits_crd(&crd, pool, "failuremode", |typo| {
        let mode = typo["spec"]["endpointPickerRef"]
            .as_object_mut()
            .unwrap()
            .remove("failureMode")
            .unwrap();
        typo["spec"]["endpointPickerRef"]["failuremode"] = mode;
    });
}

/// The replicas the config names are StatefulSet pods by their DNS names,
/// `POD.SERVICE.NAMESPACE.svc.cluster.local:PORT`, with POD = `STATEFULSET-ORDINAL`. The
/// assumption this checks against: the StatefulSet labels its pods
/// `app.kubernetes.io/name: STATEFULSET` (the vLLM StatefulSet is not in this set). Then the
/// pool selects exactly those pods, in its own namespace, on their port, and the IP:port the
/// picker answers with is an endpoint of the pool.
#[test]
fn the_pool_selects_the_pods_the_configs_replicas_name_on_their_port() {
    let m = manifests();
    let (_, config) = config(&m);
    let pool = m.the("InferencePool");
    let target_ports: BTreeSet<u64> = pool["spec"]["targetPorts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["number"].as_u64().unwrap())
        .collect();
    let mut sets = BTreeSet::new();
    let mut ports = BTreeSet::new();
    let urls = config.routes.iter().flat_map(|r| {
        r.replicas
            .iter()
            .chain(r.classes.iter().flat_map(|c| c.replicas.iter().flatten()))
    });
    for url in urls {
        let authority = url
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("{url}: the pool's targets are plain HTTP here"));
        let (host, port) = authority.trim_end_matches('/').rsplit_once(':').unwrap();
        let labels: Vec<&str> = host.split('.').collect();
        assert_eq!(
            labels[3..],
            ["svc", "cluster", "local"],
            "{url}: not a pod's DNS name"
        );
        let (pod, namespace) = (labels[0], labels[2]);
        assert_eq!(pool["metadata"]["namespace"], namespace, "{url}");
        let (set, ordinal) = pod.rsplit_once('-').unwrap();
        assert!(
            ordinal.parse::<u32>().is_ok(),
            "{url}: {pod} is not a StatefulSet pod"
        );
        assert_eq!(labels[1], set, "{url}: the pod's headless Service");
        sets.insert(set.to_owned());
        ports.insert(port.parse::<u64>().unwrap());
    }
    assert_eq!(sets.len(), 1, "one StatefulSet behind the pool: {sets:?}");
    let set = sets.into_iter().next().unwrap();
    let selector = pool["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert_eq!(selector.len(), 1, "{selector:?}");
    assert_eq!(selector["app.kubernetes.io/name"], set.as_str());
    assert_eq!(
        target_ports, ports,
        "the pool's targetPorts are the replicas' ports"
    );
    // The picker's own pods are not in the pool.
    let picker_labels = &m.the("Deployment")["spec"]["template"]["metadata"]["labels"];
    assert_ne!(picker_labels["app.kubernetes.io/name"], set.as_str());
}

/// The route sends its requests to the pool, and fits the Gateway API's CRD.
#[test]
fn the_httproute_sends_to_the_pool_and_fits_the_gateway_api_crd() {
    let m = manifests();
    let route = m.the("HTTPRoute");
    let pool = m.the("InferencePool");
    let mut backends = 0;
    for rule in route["spec"]["rules"].as_array().unwrap() {
        for backend in rule["backendRefs"].as_array().unwrap() {
            backends += 1;
            assert_eq!(backend["group"], "inference.networking.k8s.io");
            assert_eq!(backend["kind"], "InferencePool");
            assert_eq!(backend["name"], pool["metadata"]["name"]);
            assert!(backend["namespace"].is_null() || backend["namespace"] == pool["metadata"]["namespace"]);
        }
    }
    assert!(backends > 0);
    assert_eq!(route["metadata"]["namespace"], pool["metadata"]["namespace"]);
    let Some(crd) = crd("gateway-api.httproutes.crd.yaml") else {
        return;
    };
    assert_fits_crd(&crd, route, "backendRef", |typo| {
        typo["spec"]["rules"][0]["backendRef"] = typo["spec"]["rules"][0]["backendRefs"].clone()
    });
}

/// Envoy Gateway's policy: on the route, one retry per fallback endpoint at most (a retry past the
/// list goes to Envoy's own choice), the route's connect budget, an idle timer that does not cut
/// a request waiting in Spillway's queue; and it fits Envoy Gateway's CRD.
#[test]
fn the_backend_traffic_policy_matches_the_config_and_fits_envoy_gateways_crd() {
    let m = manifests();
    let (picker, config) = config(&m);
    let policy = m.the("BackendTrafficPolicy");
    let spec = &policy["spec"];
    let route = m.the("HTTPRoute");
    let targets = spec["targetRefs"].as_array().unwrap();
    assert_eq!(targets.len(), 1);
    assert_eq!(targets[0]["group"], "gateway.networking.k8s.io");
    assert_eq!(targets[0]["kind"], "HTTPRoute");
    assert_eq!(targets[0]["name"], route["metadata"]["name"]);
    assert_eq!(policy["metadata"]["namespace"], route["metadata"]["namespace"]);

    let retries = spec["retry"]["numRetries"].as_u64().expect("numRetries");
    assert!(
        retries <= picker.fallbacks,
        "{retries} retries but {} fallback endpoints",
        picker.fallbacks
    );
    let timeouts: Vec<_> = config.routes.iter().map(|r| &r.timeouts).collect();
    let connect = k8s_duration(&spec["timeout"]["tcp"]["connectTimeout"]);
    assert!(
        timeouts.iter().all(|t| t.connect == connect),
        "connectTimeout {connect:?} is not the routes' connect"
    );
    let idle = k8s_duration(&spec["timeout"]["http"]["streamIdleTimeout"]);
    assert!(timeouts.iter().all(|t| idle >= t.stream_idle));
    let longest_wait = config
        .routes
        .iter()
        .flat_map(|r| r.classes.iter().map(|c| c.queue_wait))
        .max()
        .unwrap();
    assert!(
        idle > longest_wait,
        "streamIdleTimeout {idle:?} cuts a request queued for up to {longest_wait:?}"
    );
    // The total budget is the route's (checked with the grace period), not a second one here.
    assert!(spec["timeout"]["http"]["requestTimeout"].is_null());

    let Some(crd) = crd("envoy-gateway.backendtrafficpolicies.crd.yaml") else {
        return;
    };
    assert_fits_crd(&crd, policy, "numRetry", |typo| {
        let n = typo["spec"]["retry"]
            .as_object_mut()
            .unwrap()
            .remove("numRetries")
            .unwrap();
        typo["spec"]["retry"]["numRetry"] = n;
    });
}

/// The kubelet asks the picker's gRPC health services on `endpoint_picker.listen`'s port (a gRPC
/// probe's port is a number), and the container's ports are the config's listeners.
#[test]
fn the_probes_ask_the_pickers_health_services_on_its_port() {
    let m = manifests();
    let (picker, config) = config(&m);
    let c = m.container();
    let picker_port = u64::from(picker.listen.port());
    for (probe, service) in [("readinessProbe", "readiness"), ("livenessProbe", "liveness")] {
        let grpc = &c[probe]["grpc"];
        assert_eq!(grpc["service"], service, "{probe}");
        assert_eq!(grpc["port"].as_u64(), Some(picker_port), "{probe}");
    }
    let named = |name: &str| m.container_port(&Value::from(name));
    assert_eq!(named("grpc"), picker_port);
    assert_eq!(named("http"), u64::from(config.listen.port()));
    let admin_port = u64::from(config.admin.unwrap().listen.port());
    assert_eq!(named("admin"), admin_port);
    assert_eq!(
        m.service_target("spillway-picker-admin", &admin_port.into()),
        admin_port
    );
}
