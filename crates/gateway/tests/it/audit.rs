//! The audit trail of admin changes (drain, undrain, reload, adaptive C) as structured log events
//! naming the token's holder, and `/admin/state`'s account of where the running state differs
//! from the file.

use crate::operations::{TOKEN, admin_url};
use crate::support::{Stack, engine, http, read_stream, tiny};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// Everything logged on this thread while installed, as the JSON lines a log pipeline reads.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Logs of this (current-thread) test go here until the guards drop: this thread's
    /// subscriber, and a second dispatcher held beside it. Tracing caches each
    /// callsite's interest process-wide, and while only one dispatcher exists the first thread to
    /// reach a callsite decides it from its own default — a sibling test with none would cache
    /// "never" and the event would be lost here. With two, interest is their union.
    fn install(&self) -> (tracing::subscriber::DefaultGuard, tracing::Dispatch) {
        let w = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || w.clone())
            .finish();
        let anchor = tracing::Dispatch::new(tracing_subscriber::registry());
        (tracing::subscriber::set_default(subscriber), anchor)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The audit events' fields, in order.
    fn audit(&self) -> Vec<Value> {
        self.text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == spillway_gateway::audit::TARGET)
            .map(|v| v["fields"].clone())
            .collect()
    }
}

fn yaml(concurrency: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token_env: SPILLWAY_TEST_ADMIN_TOKEN, name: oncall-alice }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [{{E0}}, {{E1}}]
    classes:
      - {{ name: interactive, concurrency: {concurrency}, queue: 8, queue_wait: 5s, slo: {{ ttft: 2s }} }}
"#
    )
}

async fn post(url: String, body: Option<Value>) -> u16 {
    let mut req = http().post(url).bearer_auth(TOKEN);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn drift(admin: &str) -> Vec<Value> {
    let state: Value = http()
        .get(format!("{admin}/admin/state"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    state["drift"].as_array().unwrap().clone()
}

// Current-thread: the gateway's tasks run on this thread, where the capture is installed.
#[tokio::test]
async fn every_drain_undrain_and_reload_is_one_audit_event_naming_the_token_holder() {
    let log = Captured::default();
    let _guard = log.install();
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], &yaml("1")).await;
    let admin = admin_url(&stack).await;
    let replica = stack.engines[1].url();
    let target = json!({"route": "chat", "replica": replica});
    assert_eq!(
        post(format!("{admin}/admin/replicas/drain"), Some(target.clone())).await,
        200
    );
    assert_eq!(
        post(format!("{admin}/admin/replicas/undrain"), Some(target)).await,
        200
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, stack.fill(&yaml("4"))).unwrap();
    stack.gateway.set_config_path(path.clone());
    assert_eq!(post(format!("{admin}/admin/reload"), None).await, 200);
    // Only the balancer changes: the event still says what.
    let p2c = yaml("4").replace("    classes:", "    balance: p2c\n    classes:");
    std::fs::write(&path, stack.fill(&p2c)).unwrap();
    assert_eq!(post(format!("{admin}/admin/reload"), None).await, 200);
    std::fs::write(&path, "listen: 127.0.0.1:0\nroutes: []\n").unwrap();
    assert_eq!(post(format!("{admin}/admin/reload"), None).await, 400);

    let events = log.audit();
    assert_eq!(events.len(), 5, "one event per change: {events:#?}");
    let (drain, undrain, reload, refused) = (&events[0], &events[1], &events[2], &events[4]);
    let balance = &events[3];
    assert!(
        balance["before"]
            .as_str()
            .unwrap()
            .contains("balance least_outstanding")
            && balance["after"].as_str().unwrap().contains("balance p2c"),
        "{balance}"
    );
    assert_eq!(drain["action"], "drain");
    assert_eq!(drain["by"], "oncall-alice");
    assert_eq!(drain["replica"], replica.as_str());
    assert_eq!(
        (&drain["before"], &drain["after"]),
        (&json!("in service"), &json!("drained"))
    );
    assert_eq!(undrain["action"], "undrain");
    assert_eq!(
        (&undrain["before"], &undrain["after"]),
        (&json!("drained"), &json!("in service"))
    );
    assert_eq!(reload["action"], "reload");
    assert_eq!(reload["by"], "oncall-alice");
    assert!(
        reload["before"].as_str().unwrap().contains("interactive C=1 Q=8"),
        "{reload}"
    );
    assert!(
        reload["after"].as_str().unwrap().contains("interactive C=4 Q=8"),
        "{reload}"
    );
    assert_eq!(refused["action"], "reload");
    assert!(
        refused["error"].as_str().unwrap().contains("at least one route"),
        "{refused}"
    );
    assert!(!log.text().contains(TOKEN), "the token itself is never logged");
}

#[tokio::test]
async fn an_adaptive_move_is_an_audit_event_and_shows_as_drift() {
    let log = Captured::default();
    let _guard = log.install();
    let adaptive = "{ adaptive: { min: 1, max: 8, interval: 100ms } }";
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], &yaml(adaptive)).await;
    let admin = admin_url(&stack).await;
    let gate = stack.gateway.admission("chat", "interactive").unwrap();
    // Fast first tokens against a 2 s objective, with the one slot in use: the controller raises C.
    let mut moved = false;
    for _ in 0..50 {
        read_stream(stack.stream("chat", 2).await).await;
        if gate.limits().concurrency > 1 {
            moved = true;
            break;
        }
    }
    assert!(moved, "the controller raised C");
    let event = log
        .audit()
        .into_iter()
        .find(|e| e["action"] == "adaptive_concurrency")
        .expect("an audit event for the move");
    assert_eq!(event["by"], "adaptive controller");
    assert_eq!(
        (&event["route"], &event["class"]),
        (&json!("chat"), &json!("interactive"))
    );
    assert_eq!(event["before"], 1);
    assert!(event["after"].as_u64().unwrap() > 1);
    let drift = drift(&admin).await;
    let c = drift
        .iter()
        .find(|d| d["what"] == "concurrency")
        .unwrap_or_else(|| panic!("adaptive C away from its start is drift: {drift:#?}"));
    assert_eq!(c["configured"], 1);
    assert_eq!(c["running"], gate.limits().concurrency);
}

#[tokio::test]
async fn admin_state_shows_where_the_running_state_differs_from_the_file() {
    let stack = Stack::start(vec![engine(tiny()).await, engine(tiny()).await], &yaml("2")).await;
    let admin = admin_url(&stack).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, stack.fill(&yaml("2"))).unwrap();
    stack.gateway.set_config_path(path.clone());
    assert_eq!(drift(&admin).await, Vec::<Value>::new(), "the file is what runs");

    let replica = stack.engines[0].url();
    let target = json!({"route": "chat", "replica": replica});
    assert_eq!(
        post(format!("{admin}/admin/replicas/drain"), Some(target)).await,
        200
    );
    let d = drift(&admin).await;
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0]["what"], "replica_drained");
    assert_eq!(d[0]["replica"], replica.as_str());

    // An edit that fails to load: the running configuration is now older than the file.
    std::fs::write(&path, stack.fill(&yaml("0"))).unwrap();
    assert_eq!(post(format!("{admin}/admin/reload"), None).await, 400);
    let d = drift(&admin).await;
    let file = d
        .iter()
        .find(|d| d["what"] == "config_file")
        .expect("the file drifts");
    assert!(
        file["file"].as_str().unwrap().starts_with("not loadable"),
        "{file}"
    );
    assert!(file["last_reload_error"].is_string(), "{file}");

    // A valid edit not yet reloaded differs too; reloading it ends that drift.
    std::fs::write(&path, stack.fill(&yaml("3"))).unwrap();
    let d = drift(&admin).await;
    let file = d
        .iter()
        .find(|d| d["what"] == "config_file")
        .expect("the file drifts");
    assert_eq!(file["file"], "differs from the running configuration");
    assert_eq!(post(format!("{admin}/admin/reload"), None).await, 200);
    let d = drift(&admin).await;
    assert!(d.iter().all(|d| d["what"] != "config_file"), "{d:#?}");
    assert!(
        d.iter().any(|d| d["what"] == "replica_drained"),
        "a drain survives the reload"
    );
}
