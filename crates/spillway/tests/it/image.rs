//! The container image: the Dockerfile and the Kubernetes manifests agree (ports, user, config
//! path, image name, a glibc base, a locked build); where a container builder and both base images
//! are at hand, the image builds and answers the probes with the ConfigMap's own config.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::manifests::{Manifests, TOKEN, deploy_dir};
use crate::support::{try_get, wait_until};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Dockerfile's instructions, continuation lines joined, comments left out: (OP, arguments).
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("a Dockerfile at the root");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                let (op, args) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((op.to_ascii_uppercase(), args.trim().to_owned()));
                current.clear();
            }
        }
    }
    out
}

/// The instructions of the last stage (the image itself).
fn final_stage(all: &[(String, String)]) -> &[(String, String)] {
    let last_from = all.iter().rposition(|(op, _)| op == "FROM").expect("a FROM");
    &all[last_from..]
}

fn one<'a>(stage: &'a [(String, String)], op: &str) -> &'a str {
    let found: Vec<&str> = stage
        .iter()
        .filter(|(o, _)| o == op)
        .map(|(_, a)| a.as_str())
        .collect();
    assert_eq!(found.len(), 1, "one {op} in the image's stage: {found:?}");
    found[0]
}

/// A JSON-form (exec) instruction's words.
fn words(args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("{args}: exec form expected ({e})"))
}

fn both_sets() -> [Manifests; 2] {
    [
        Manifests::load(deploy_dir("")),
        Manifests::load(deploy_dir("endpoint-picker")),
    ]
}

fn listen_ports(config: &str) -> BTreeSet<u64> {
    let c = gateway::Config::from_yaml(config).expect("the ConfigMap's config loads");
    let mut ports = BTreeSet::from([u64::from(c.listen.port())]);
    ports.extend(c.admin.map(|a| u64::from(a.listen.port())));
    ports.extend(c.endpoint_picker.map(|p| u64::from(p.listen.port())));
    ports
}

#[test]
fn the_dockerfile_builds_what_the_manifests_run() {
    let all = instructions();
    let stage = final_stage(&all);
    assert_eq!(
        all.iter().filter(|(op, _)| op == "FROM").count(),
        2,
        "two stages: build, then the binary alone"
    );
    // A glibc base: the binary links libc, libm and libgcc_s.
    let base = one(stage, "FROM");
    assert!(
        base.starts_with("gcr.io/distroless/cc") || base.starts_with("debian:"),
        "{base}"
    );
    for static_base in ["scratch", "static", "alpine", "musl"] {
        assert!(!base.contains(static_base), "{base}");
    }
    let build: Vec<&str> = all
        .iter()
        .filter(|(op, _)| op == "RUN")
        .map(|(_, a)| a.as_str())
        .collect();
    assert!(
        build
            .iter()
            .any(|r| r.contains("cargo build --release --locked -p spillway")),
        "{build:?}"
    );
    // The toolchain the workspace declares.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    assert!(
        all.iter()
            .any(|(op, a)| op == "ARG" && *a == format!("RUST_VERSION={rust_version}")),
        "the build stage's Rust is the workspace's {rust_version}"
    );
    // The binary alone, where the entrypoint runs it.
    let copy = one(stage, "COPY");
    assert!(
        copy.starts_with("--from=build ") && copy.ends_with(" /usr/local/bin/spillway"),
        "{copy}"
    );
    assert_eq!(words(one(stage, "ENTRYPOINT")), ["/usr/local/bin/spillway"]);
    let cmd = words(one(stage, "CMD"));
    let user = one(stage, "USER");
    let exposed: BTreeSet<u64> = one(stage, "EXPOSE")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();

    let mut ports = BTreeSet::new();
    for m in both_sets() {
        let pod = &m.the("Deployment")["spec"]["template"]["spec"];
        let c = m.container();
        assert_eq!(
            c["image"],
            format!("spillway:{}", env!("CARGO_PKG_VERSION")),
            "the image the Dockerfile's docs build"
        );
        let kustomization = m.the("Kustomization");
        assert_eq!(kustomization["images"][0]["name"], "spillway");
        assert_eq!(kustomization["images"][0]["newTag"], env!("CARGO_PKG_VERSION"));
        let args: Vec<String> = serde_json::from_value(c["args"].clone()).unwrap();
        assert_eq!(args, cmd, "the manifests run the image's own command");
        let config = PathBuf::from(&args[args.iter().position(|a| a == "--config").unwrap() + 1]);
        let mount = c["volumeMounts"][0]["mountPath"].as_str().unwrap();
        assert_eq!(config.parent(), Some(Path::new(mount)));
        let sc = &pod["securityContext"];
        assert_eq!(
            user,
            format!("{}:{}", sc["runAsUser"], sc["runAsGroup"]),
            "the image's user is the pods'"
        );
        assert_eq!(sc["runAsNonRoot"], true);
        let container_ports: BTreeSet<u64> = c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_u64().unwrap())
            .collect();
        assert_eq!(
            container_ports,
            listen_ports(&m.config_text()),
            "the container's ports are where its config listens"
        );
        ports.extend(container_ports);
    }
    assert_eq!(exposed, ports, "EXPOSE names every port the manifests use");
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    for out in [".git", "target"] {
        assert!(ignore.lines().any(|l| l == out), "{out} kept out of the context");
    }
}

fn docker(args: &[&str]) -> std::io::Result<Output> {
    Command::new("docker").args(args).output()
}

fn said(out: &Output) -> String {
    let text = String::from_utf8_lossy(if out.stderr.is_empty() {
        &out.stdout
    } else {
        &out.stderr
    });
    text.lines().last().unwrap_or("").to_owned()
}

/// Why the image cannot be built here, if it cannot: no builder, or a base image not present (the
/// test pulls nothing: a machine without a registry would hang on it).
fn cannot_build() -> Option<String> {
    match docker(&["info", "--format", "{{.ServerVersion}}"]) {
        Err(e) => return Some(format!("no container builder: docker: {e}")),
        Ok(o) if !o.status.success() => {
            return Some(format!("no container builder: docker info: {}", said(&o)));
        }
        Ok(_) => {}
    }
    let all = instructions();
    let arg = |name: &str| {
        all.iter()
            .find_map(|(op, a)| (op == "ARG").then(|| a.strip_prefix(&format!("{name}=")))?)
            .unwrap_or_default()
            .to_owned()
    };
    for (op, from) in all.iter().filter(|(op, _)| op == "FROM") {
        let image = from
            .split_whitespace()
            .next()
            .unwrap()
            .replace("${RUST_VERSION}", &arg("RUST_VERSION"));
        let present = docker(&["image", "inspect", &image]).is_ok_and(|o| o.status.success());
        if !present {
            return Some(format!(
                "the base image {image} ({op}) is not present: `docker pull {image}` where a registry is in reach"
            ));
        }
    }
    None
}

/// Removes the container, the image and the config's folder when the test ends, however it ends.
struct Cleanup {
    name: String,
    tag: String,
    dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.name]);
        let _ = docker(&["rmi", "-f", &self.tag]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The image built from the Dockerfile, started as the Deployment starts it (its command, the
/// ConfigMap's file mounted at the config path, a read-only root, the pods' user), answers the
/// probes on their port: `/health` 200, `/ready` 200 or 503 (the cluster's vLLM is not here).
#[test]
fn the_image_builds_and_answers_its_probes() {
    if let Some(why) = cannot_build() {
        eprintln!("skipped: {why}");
        return;
    }
    let tag = format!("spillway-image-test:{}", std::process::id());
    let name = format!("spillway-image-test-{}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    let _cleanup = Cleanup {
        name: name.clone(),
        tag: tag.clone(),
        dir: dir.clone(),
    };
    let root = root();
    let build = docker(&["build", "-t", &tag, root.to_str().unwrap()]).unwrap();
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );

    let m = Manifests::load(deploy_dir(""));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("spillway.yaml"), m.config_text()).unwrap();
    let c = m.container();
    let probe: &Value = &c["livenessProbe"]["httpGet"];
    let port = m.container_port(&probe["port"]);
    let mount = format!("{}:/etc/spillway:ro", dir.display());
    let publish = format!("127.0.0.1::{port}");
    let run = docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--read-only",
        "-e",
        &format!("SPILLWAY_ADMIN_TOKEN={TOKEN}"),
        "-v",
        &mount,
        "-p",
        &publish,
        &tag,
    ])
    .unwrap();
    assert!(run.status.success(), "{}", said(&run));
    let mapped = docker(&["port", &name, &port.to_string()]).unwrap();
    let host_port: u16 = String::from_utf8_lossy(&mapped.stdout)
        .lines()
        .next()
        .and_then(|l| l.rsplit(':').next())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("docker port: {}", said(&mapped)));
    let status = |path: &str| {
        try_get(host_port, path)
            .ok()
            .and_then(|r| r.get(9..12).map(str::to_owned))
    };
    let health = probe["path"].as_str().unwrap();
    assert!(
        wait_until(1500, || status(health).as_deref() == Some("200")),
        "{health} never answered 200: {}",
        docker(&["logs", &name]).map(|o| said(&o)).unwrap_or_default()
    );
    let ready = c["readinessProbe"]["httpGet"]["path"].as_str().unwrap();
    let ready_status = status(ready).unwrap();
    assert!(
        ready_status == "200" || ready_status == "503",
        "{ready}: {ready_status}"
    );
}
