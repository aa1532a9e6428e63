//! KServe and Kubernetes: an InferenceService's conditions and its pods' restarts, correlated with
//! the GPUs' XID/ECC series. The fixtures are checked against KServe's own CRD when it is present.

use spillway_diagnose::kube::parse_rfc3339;
use spillway_diagnose::{Cluster, Snapshot, Status, Suspect, Thresholds, diagnose};
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn the_inference_service_fixture_is_valid_against_kserves_crd() {
    let Some(dir) = testkit::crd::schemas_dir() else {
        return;
    };
    let crd = dir.join("kserve.inferenceservices.crd.yaml");
    let isvc: serde_json::Value = serde_json::from_str(&fixture("isvc-not-ready.json")).unwrap();
    let errors = testkit::crd::violations(&crd, &isvc);
    assert!(errors.is_empty(), "{errors:#?}");
    // The checker is not vacuous: a condition without its required status, and a field the
    // schema does not know, are refused.
    let mut broken = isvc.clone();
    broken["status"]["conditions"][0]
        .as_object_mut()
        .unwrap()
        .remove("status");
    broken["status"]["conditions"][0]["colour"] = "red".into();
    let errors = testkit::crd::violations(&crd, &broken);
    assert_eq!(errors.len(), 2, "{errors:#?}");
}

#[test]
fn a_not_ready_service_and_a_restart_at_the_time_of_an_xid_route_away() {
    let mut cluster = Cluster::default();
    cluster
        .add_inference_service(&fixture("isvc-not-ready.json"))
        .unwrap();
    cluster.add_pods(&fixture("pods-restarted.json")).unwrap();
    assert_eq!(cluster.service.as_deref(), Some("llama-chat"));
    let not_ready: Vec<&str> = cluster.not_ready().map(|c| c.kind.as_str()).collect();
    assert_eq!(not_ready, ["PredictorReady", "Ready"]);
    assert_eq!(cluster.restarts.len(), 1, "only containers that restarted");

    // The GPU on the restarted pod's node reports XID 79 in the window around the restart.
    let at = parse_rfc3339("2026-12-01T03:01:10Z").unwrap();
    let dcgm = |xid: u32| {
        format!(
            "DCGM_FI_DEV_XID_ERRORS{{gpu=\"0\",UUID=\"GPU-1\",Hostname=\"gpu-node-3\"}} {xid}\nvllm:num_requests_running 1\n"
        )
    };
    let mut start = Snapshot::new(at - 30.0);
    start.add_exposition("gpu-node-3:9400", &dcgm(0));
    let mut end = Snapshot::new(at + 30.0);
    end.add_exposition("gpu-node-3:9400", &dcgm(79));
    let v = diagnose(&start, &end, &Thresholds::default(), &cluster);
    assert_eq!(v.status, Status::Incident);
    assert_eq!(v.findings[0].suspect, Suspect::GpuFault);
    assert!(
        v.findings[0]
            .evidence
            .iter()
            .any(|e| e.series.contains("llama-chat-predictor-7d9f-abcde")),
        "{:#?}",
        v.findings[0].evidence
    );
    // The same restart an hour away from the window is not evidence of this fault.
    let later = |s: &Snapshot, d: f64| {
        let mut s = s.clone();
        s.at += d;
        s
    };
    let v = diagnose(
        &later(&start, 3600.0),
        &later(&end, 3600.0),
        &Thresholds::default(),
        &cluster,
    );
    assert!(v.findings[0].evidence.iter().all(|e| e.stat != "restart"));

    // Without any fault, a not-ready service is still an incident, and says so first.
    let mut calm = Cluster::default();
    calm.add_inference_service(&fixture("isvc-not-ready.json"))
        .unwrap();
    let v = diagnose(&start, &start, &Thresholds::default(), &calm);
    assert_eq!(v.status, Status::Incident);
    assert!(v.summary.contains("llama-chat is not ready"), "{}", v.summary);
}
