//! A folder of Kubernetes manifests as the deploy tests read it (`deploy/kubernetes/` and its
//! `endpoint-picker/`), and the checks both sets must pass: complete, the Deployment running the
//! ConfigMap's file, the config passing `spillway check`, the grace period outlasting the drain.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::support::BIN;

/// Long enough for `spillway check`; the token itself is never used against a server.
pub(crate) const TOKEN: &str = "deploy-test-admin-token-0123456789";

/// `deploy/kubernetes/` below the repository's root, or a folder inside it.
pub(crate) fn deploy_dir(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes")
        .join(sub)
}

/// Every document of every `.yaml` file of one folder (not its subfolders), with its file.
pub(crate) struct Manifests {
    dir: PathBuf,
    docs: Vec<(String, Value)>,
}

impl Manifests {
    pub(crate) fn load(dir: PathBuf) -> Self {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
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
        Manifests { dir, docs }
    }

    /// The one object of this kind.
    pub(crate) fn the(&self, kind: &str) -> &Value {
        let found: Vec<&Value> = self
            .docs
            .iter()
            .filter(|(_, d)| d["kind"] == kind)
            .map(|(_, d)| d)
            .collect();
        assert_eq!(found.len(), 1, "one {kind} in {}", self.dir.display());
        found[0]
    }

    pub(crate) fn service(&self, name: &str) -> &Value {
        self.docs
            .iter()
            .map(|(_, d)| d)
            .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Service {name} in {}", self.dir.display()))
    }

    /// The gateway's configuration as the ConfigMap holds it.
    pub(crate) fn config_text(&self) -> String {
        self.the("ConfigMap")["data"]["spillway.yaml"]
            .as_str()
            .expect("the ConfigMap holds spillway.yaml")
            .to_owned()
    }

    pub(crate) fn container(&self) -> &Value {
        let containers = self.the("Deployment")["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 1);
        &containers[0]
    }

    /// A probe's or Service's `port`: a number, or the name of one of the container's ports.
    pub(crate) fn container_port(&self, port: &Value) -> u64 {
        if let Some(n) = port.as_u64() {
            return n;
        }
        let name = port.as_str().expect("a port is a number or a name");
        self.container()["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("the container has no port named {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    }

    /// The port a Service's named port sends to, as a container port.
    pub(crate) fn service_target(&self, service: &str, port: &Value) -> u64 {
        let svc = self.service(service);
        let entry = svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["port"] == *port)
            .unwrap_or_else(|| panic!("the Service {service} has no port {port}"));
        self.container_port(&entry["targetPort"])
    }

    /// Every document has an apiVersion and a kind, each of `kinds` is there, and the
    /// kustomization lists every other file, so that `kubectl apply -k` applies them all.
    pub(crate) fn assert_complete(&self, kinds: &[&str]) {
        for (file, doc) in &self.docs {
            assert!(
                doc["apiVersion"].is_string(),
                "{file}: a document without apiVersion"
            );
            assert!(doc["kind"].is_string(), "{file}: a document without kind");
        }
        for kind in kinds {
            assert!(
                self.docs.iter().any(|(_, d)| d["kind"] == *kind),
                "no {kind} in {}",
                self.dir.display()
            );
        }
        let listed: Vec<&str> = self.the("Kustomization")["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        for (file, doc) in &self.docs {
            if doc["kind"] != "Kustomization" {
                assert!(
                    listed.contains(&file.as_str()),
                    "{file} is not in kustomization.yaml"
                );
            }
        }
    }

    /// The container runs `serve --config` on a file of the ConfigMap, mounted as a directory.
    pub(crate) fn assert_deployment_runs_the_configmaps_file(&self) {
        let c = self.container();
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[..2], ["serve", "--config"]);
        let config_path = Path::new(args[2]);
        let pod = &self.the("Deployment")["spec"]["template"]["spec"];
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| config_path.starts_with(m["mountPath"].as_str().unwrap()))
            .expect("the config path is under a volume mount");
        assert!(
            mount["subPath"].is_null(),
            "a subPath mount never sees ConfigMap updates"
        );
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("the mount's volume");
        let cm = self.the("ConfigMap");
        assert_eq!(volume["configMap"]["name"], cm["metadata"]["name"]);
        let key = config_path.file_name().unwrap().to_str().unwrap();
        assert!(cm["data"][key].is_string(), "the ConfigMap has no key {key}");
    }

    /// `spillway check` passes on the ConfigMap's config with the admin token set and fails
    /// without it, and the container takes the token from a Secret.
    pub(crate) fn assert_config_passes_spillway_check(&self, config: &gateway::Config) {
        let path = temp_file(&self.config_text());
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

        let token_env = &config
            .admin
            .as_ref()
            .expect("the config has an admin section")
            .token_env;
        let var = self.container()["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == token_env.as_str())
            .unwrap_or_else(|| panic!("the container does not set {token_env}"));
        assert!(
            var["valueFrom"]["secretKeyRef"]["name"].is_string(),
            "{token_env} comes from a Secret"
        );
    }

    /// The grace period outlasts the preStop sleep and the drain, the drain outlasts the longest
    /// stream budget, and the HTTPRoute in front never cuts a stream inside that budget.
    pub(crate) fn assert_grace_outlasts_the_drain_and_the_longest_stream(&self, config: &gateway::Config) {
        let pod = &self.the("Deployment")["spec"]["template"]["spec"];
        let grace = Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap());
        let pre_stop = Duration::from_secs(
            self.container()["lifecycle"]["preStop"]["sleep"]["seconds"]
                .as_u64()
                .expect("a preStop sleep"),
        );
        let drain = config.server.drain_delay + config.server.drain_timeout;
        assert!(
            grace > pre_stop + drain,
            "grace {grace:?} ≤ preStop {pre_stop:?} + drain_delay + drain_timeout {drain:?}"
        );
        let longest = longest_total(config);
        assert!(
            config.server.drain_timeout >= longest,
            "drain_timeout {:?} cuts streams inside their budget (total {longest:?})",
            config.server.drain_timeout
        );
        let mut timed = 0;
        for rule in self.the("HTTPRoute")["spec"]["rules"].as_array().unwrap() {
            if let Some(request) = rule["timeouts"].get("request") {
                timed += 1;
                assert!(
                    k8s_duration(request) >= longest,
                    "the HTTPRoute's timeout {request} is under total {longest:?}"
                );
            }
        }
        assert!(timed > 0, "no HTTPRoute rule sets timeouts.request");
    }
}

/// The longest stream budget of any route.
pub(crate) fn longest_total(config: &gateway::Config) -> Duration {
    config.routes.iter().map(|r| r.timeouts.total).max().unwrap()
}

pub(crate) fn k8s_duration(v: &Value) -> Duration {
    humantime::parse_duration(v.as_str().expect("a duration string")).unwrap()
}

fn temp_file(text: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("spillway-deploy-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("spillway.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The object validates strictly against the CRD, and the check is not vacuous: the same object
/// with `misspell` applied (a field renamed) fails it, naming the field.
pub(crate) fn assert_fits_crd(crd: &Path, object: &Value, misspelt: &str, misspell: impl FnOnce(&mut Value)) {
    let errors = testkit::crd::violations(crd, object);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let mut typo = object.clone();
    misspell(&mut typo);
    let errors = testkit::crd::violations(crd, &typo);
    assert!(
        errors.iter().any(|e| e.contains(misspelt)),
        "a misspelt field passed validation: {errors:?}"
    );
}
