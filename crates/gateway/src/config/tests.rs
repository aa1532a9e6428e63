use super::*;

const GOOD: &str = r#"
listen: 127.0.0.1:8080
routes:
  - model: corp-chat
    upstream_model: spark-chat
    replicas: [http://127.0.0.1:8001, "http://127.0.0.1:8002/"]
    balance: least_outstanding
    limits: { max_input_tokens: 6000, max_tokens: { default: 512, cap: 2048 }, max_n: 1 }
    timeouts: { connect: 1s, first_token: 8s, stream_idle: 15s, total: 120s }
    overflow_status: 503
    classes:
      - name: interactive
        concurrency: 24
        queue: 12
        queue_wait: 2s
        slo: { ttft: 1s, itl: 50ms }
      - name: long
        when: { max_tokens_over: 1024 }
        concurrency: 4
        queue: 4
        queue_wait: 5s
tenants:
  - team: search
    key_sha256: [ "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08" ]
    models: [ corp-chat ]
    priority: critical
"#;

#[test]
fn the_design_example_parses() {
    let c = Config::from_yaml(GOOD).unwrap();
    let r = &c.routes[0];
    assert_eq!(r.replicas[1], "http://127.0.0.1:8002", "trailing slash trimmed");
    assert_eq!(r.timeouts.first_token, Duration::from_secs(8));
    assert_eq!(r.classes[1].when.as_ref().unwrap().max_tokens_over, Some(1024));
    assert_eq!(r.classes[0].slo.unwrap().itl, Some(Duration::from_millis(50)));
    assert_eq!(c.tenants[0].priority, Priority::Critical);
    assert!(
        c.tenants[0].key_sha256[0].starts_with("9f86"),
        "hashes are lower-cased"
    );
}

fn bad(edit: impl Fn(&str) -> String) -> ConfigError {
    Config::from_yaml(&edit(GOOD)).unwrap_err()
}

#[test]
fn errors_name_the_path_and_the_reason() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            GOOD.replace(
                "balance: least_outstanding",
                "balance: slo\n    slo_fallback: slo",
            ),
            "routes[0].slo_fallback",
            "must be another balancer",
        ),
        (
            GOOD.replace("first_token: 8s", "first_token: 500ms"),
            "routes[0].timeouts",
            "connect (1s) must be less than first_token",
        ),
        (
            GOOD.replace("total: 120s", "total: 5s"),
            "routes[0].timeouts",
            "first_token (8s) must not exceed total",
        ),
        (
            GOOD.replace("queue_wait: 5s", "queue_wait: 9s"),
            "routes[0].classes[1].queue_wait",
            "first_token budget",
        ),
        (
            GOOD.replace("concurrency: 4", "concurrency: 0"),
            "routes[0].classes[1].concurrency",
            "",
        ),
        (
            GOOD.replace("queue_wait: 2s", "queue_wait: soon"),
            "routes[0].classes[0].queue_wait",
            "",
        ),
        (
            GOOD.replace("balance: least_outstanding", "balance: random"),
            "routes[0].balance",
            "unknown variant",
        ),
        (
            GOOD.replace("overflow_status: 503", "overflow_status: 500"),
            "routes[0].overflow_status",
            "503 or 429",
        ),
        (
            GOOD.replace("max_n: 1 }", "max_n: 1, max_cost: 3 }"),
            "routes[0].limits.max_cost",
            "unknown field",
        ),
        (
            GOOD.replace("http://127.0.0.1:8001", "127.0.0.1:8001"),
            "routes[0].replicas[0]",
            "http://",
        ),
        (
            GOOD.replace("default: 512", "default: 4096"),
            "routes[0].limits.max_tokens",
            "exceeds cap",
        ),
        (
            GOOD.replace("models: [ corp-chat ]", "models: [ other ]"),
            "tenants[0].models[0]",
            "no route serves",
        ),
        (
            GOOD.replace("9F86D0", "XX86D0"),
            "tenants[0].key_sha256[0]",
            "64 hex digits",
        ),
        (
            GOOD.replace("        when: { max_tokens_over: 1024 }\n", ""),
            "routes[0].classes[1].when",
            "needs a rule",
        ),
        (
            GOOD.replace("name: long", "name: interactive"),
            "routes[0].classes[1].name",
            "appears twice",
        ),
        (
            format!("{GOOD}\nretries: 3\n"),
            "retries",
            "unknown field `retries`",
        ),
        (
            format!("{GOOD}\nserver: {{ send_timeout: 0s }}\n"),
            "server.send_timeout",
            "more than zero",
        ),
        (
            format!("{GOOD}\nserver: {{ header_timeout: 1000y }}\n"),
            "server.header_timeout",
            "at most 24h",
        ),
    ];
    for (yaml, path, needle) in cases {
        let e = Config::from_yaml(&yaml).unwrap_err();
        assert_eq!(e.path, path, "{e}");
        assert!(e.message.contains(needle), "{e}");
    }
    assert!(
        bad(|g| g.replace("routes:", "routez:"))
            .message
            .contains("unknown field")
    );
}

#[test]
fn a_route_without_classes_gets_a_bounded_default() {
    let c =
        Config::from_yaml("listen: 127.0.0.1:1\nroutes:\n  - model: m\n    replicas: [http://127.0.0.1:2]\n")
            .unwrap();
    let class = &c.routes[0].classes[0];
    assert_eq!(
        (class.name.as_str(), class.concurrency.initial(), class.queue),
        ("default", 64, 64)
    );
    assert!(c.tenants.is_empty());
}

#[test]
fn redis_shares_and_refusals_name_the_field() {
    let with =
        |redis: &str| Config::from_yaml(&GOOD.replace("routes:\n", &format!("redis: {redis}\nroutes:\n")));
    let c = with("{ gateways: 3 }").unwrap();
    let r = c.redis.as_ref().unwrap();
    assert_eq!(
        (r.url_env.as_str(), r.lease_ttl, r.namespace.as_str()),
        ("SPILLWAY_REDIS_URL", Duration::from_secs(10), "spillway")
    );
    // C = 24 over 3 gateways: 8 each; Q = 4: 1 each; never 0 unless the limit is.
    assert_eq!((r.share(24), r.share(4), r.share(1), r.share(0)), (8, 1, 1, 0));
    assert!(
        r.url(&|_| None)
            .unwrap_err()
            .to_string()
            .contains("SPILLWAY_REDIS_URL")
    );
    assert_eq!(r.down_after, Duration::from_secs(1));
    assert_eq!(r.password(&|_| None).unwrap(), None, "no password_env: none");
    let p = with("{ gateways: 3, password_env: RPW }").unwrap();
    let p = p.redis.as_ref().unwrap();
    assert!(
        p.password(&|_| None)
            .unwrap_err()
            .to_string()
            .contains("redis.password_env")
    );
    assert_eq!(
        p.password(&|v| (v == "RPW").then(|| "s3cret".into())).unwrap(),
        Some("s3cret".into())
    );
    assert_eq!(
        p.sentinel_password(&|_| None).unwrap(),
        None,
        "no sentinel_password_env: none"
    );
    let s = with("{ gateways: 3, sentinel_password_env: SPW }").unwrap();
    let s = s.redis.as_ref().unwrap();
    let unset = s.sentinel_password(&|_| None).unwrap_err().to_string();
    assert!(
        unset.contains("redis.sentinel_password_env") && unset.contains("SPW"),
        "{unset}"
    );
    assert_eq!(
        s.sentinel_password(&|v| (v == "SPW").then(|| "t0p".into()))
            .unwrap(),
        Some("t0p".into())
    );
    for (bad, field) in [
        ("{ gateways: 0 }", "gateways"),
        ("{ gateways: 2, lease_ttl: 500ms }", "redis.lease_ttl"),
        ("{ gateways: 2, timeout: 2s }", "redis.timeout"),
        ("{ gateways: 2, namespace: 'a{b}' }", "redis.namespace"),
        ("{ gateways: 2, password: x }", "password"),
        ("{ gateways: 2, down_after: 50ms }", "redis.down_after"),
        (
            "{ gateways: 2, lease_ttl: 2s, down_after: 3s }",
            "redis.down_after",
        ),
        ("{ gateways: 2, tls: { cert_file: c.pem } }", "redis.tls"),
        ("{ gateways: 2, tls: { ca: c.pem } }", "redis.tls"),
    ] {
        let e = with(bad).unwrap_err().to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
    let adaptive = GOOD
        .replace("routes:\n", "redis: { gateways: 2 }\nroutes:\n")
        .replace(
            "concurrency: 24",
            "concurrency: { adaptive: { min: 4, max: 32 } }",
        );
    let e = Config::from_yaml(&adaptive).unwrap_err().to_string();
    assert!(e.contains("classes[0].concurrency") && e.contains("redis"), "{e}");
}

#[test]
fn the_endpoint_picker_section_parses_and_its_mistakes_name_the_field() {
    let with = |section: &str| Config::from_yaml(&format!("{GOOD}endpoint_picker: {section}\n"));
    let p = with("{ listen: 127.0.0.1:9002 }")
        .unwrap()
        .endpoint_picker
        .unwrap();
    assert_eq!((p.fallbacks, p.tls), (1, None));
    let p = with("{ listen: 127.0.0.1:9002, fallbacks: 0, tls: self_signed }")
        .unwrap()
        .endpoint_picker
        .unwrap();
    assert_eq!(p.tls, Some(PickerTls::Made(SelfSigned::SelfSigned)));
    let p = with("{ listen: 127.0.0.1:9002, tls: { cert: a.crt, key: a.key } }")
        .unwrap()
        .endpoint_picker
        .unwrap();
    assert!(matches!(p.tls, Some(PickerTls::Files(_))));
    let e = with("{ listen: 127.0.0.1:8080 }").unwrap_err();
    assert_eq!(e.path, "endpoint_picker.listen", "{e}");
    let e = with("{ listen: 127.0.0.1:9002, fallbacks: 9 }").unwrap_err();
    assert_eq!(e.path, "endpoint_picker.fallbacks", "{e}");
    assert!(
        with("{ listen: 127.0.0.1:9002, fallback: 1 }").is_err(),
        "unknown fields refused"
    );
    assert!(with("{ listen: 127.0.0.1:9002, tls: self-made }").is_err());
}
