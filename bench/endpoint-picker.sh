#!/usr/bin/env bash
# The endpoint picker's cost, in one run: Envoy alone (the peers harness's Envoy, one upstream),
# Envoy asking `spillway serve`'s endpoint picker over ext_proc (full-duplex, override_host), and
# Spillway as the proxy — each on the proxy core (one worker each; Envoy and the picker share it),
# the mock and the load client on the other, as in ../shared/peers. Per target and concurrency:
# CPU per request (for the picker target, Envoy's and Spillway's parts too) and TTFT.
#
#   cp -r ../shared/peers target/peers && target/peers/run-all.sh   # once: builds loadc, mockllm, Envoy
#   bench/endpoint-picker.sh target/release/spillway [TAG]
# Results: target/picker-bench-TAG/*.json and a table on stdout.
set -u
SPILLWAY=$(realpath "$1"); TAG=${2:-run}   # not BIN: lib.sh names its own
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_DIR=${PEERS_DIR:-$ROOT/target/peers}
[ -x "$PEERS_DIR/target/release/loadc" ] || { echo "no $PEERS_DIR built: cp -r ../shared/peers target/peers && target/peers/run-all.sh"; exit 2; }
OUT=$ROOT/target/picker-bench-$TAG; RUN=$OUT/run
mkdir -p "$OUT" "$RUN"; rm -f "$OUT"/*.json
export RUN
source "$PEERS_DIR/scripts/lib.sh"
trap stop_all EXIT
REPS=${REPS:-3}; DUR=${DUR:-4}; CONCS=${CONCS:-"1 32"}
MOCK_ARGS=${MOCK_ARGS:-"--tokens 16"}

cat >"$RUN/proxy.yaml" <<YAML
listen: 127.0.0.1:18084
server: { access_log: false }
routes:
  - model: mock
    replicas: [http://127.0.0.1:18000]
    classes:
      - { name: interactive, concurrency: 1000, queue: 1000, queue_wait: 5s }
YAML
sed -e 's/18084/18086/' -e 's/^server:.*/&\nendpoint_picker: { listen: 127.0.0.1:19002, fallbacks: 0 }/' \
  "$RUN/proxy.yaml" >"$RUN/picker.yaml"
# Envoy as the Gateway API Inference Extension sets it up (docs/endpoint-picker.md).
cat >"$RUN/envoy-picker.yaml" <<YAML
admin: { address: { socket_address: { address: 127.0.0.1, port_value: 19903 } } }
static_resources:
  listeners:
  - name: ingress
    address: { socket_address: { address: 127.0.0.1, port_value: 18085 } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route: { cluster: pool }
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: { envoy_grpc: { cluster_name: picker } }
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: FULL_DUPLEX_STREAMED
                response_body_mode: FULL_DUPLEX_STREAMED
                request_trailer_mode: SEND
                response_trailer_mode: SEND
              metadata_options: { receiving_namespaces: { untyped: ["envoy.lb"] } }
          - name: envoy.filters.http.router
            typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }
  clusters:
  - name: picker
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: picker
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 19002 } } } }] }]
  - name: pool
    type: STATIC
    connect_timeout: 1s
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources: [{ metadata: { key: envoy.lb, path: [{ key: x-gateway-destination-endpoint }] } }]
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config: { "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin }
    load_assignment:
      cluster_name: pool
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 18000 } } } }] }]
    circuit_breakers:
      thresholds: [{ priority: DEFAULT, max_connections: 1024, max_pending_requests: 1024, max_requests: 1024 }]
YAML
# Envoy and the picker as one target: the picker is Envoy's process's child, so the harness's
# proc_usage counts both, and both run on the proxy core.
cat >"$RUN/picker-launch.sh" <<SH
"$SPILLWAY" serve --workers 1 --config "$RUN/picker.yaml" >"$RUN/picker.log" 2>&1 &
exec "$VENV/bin/envoy" -c "$RUN/envoy-picker.yaml" --concurrency 1 --disable-hot-restart -l warn
SH

start_mock 18000 $MOCK_ARGS; MOCK=$LAST_PID
declare -A PORT=([direct]=18000) PID=([direct]=$MOCK)
start_envoy 18082 18000 19901; PORT[envoy]=18082; PID[envoy]=$LAST_PID
start_cmd 18084 18000 "$SPILLWAY serve --workers 1 --config $RUN/proxy.yaml"; PORT[proxy]=18084; PID[proxy]=$LAST_PID
start_cmd 18085 18000 "bash $RUN/picker-launch.sh"; PORT[picker]=18085; PID[picker]=$LAST_PID
wait_port 19002 || exit 1
PICKER_PID=$(children "${PID[picker]}" | head -1)
url() { echo "http://127.0.0.1:${PORT[$1]}/v1/chat/completions"; }
TARGETS="direct envoy picker proxy"
for t in $TARGETS; do
  loadc --url "$(url $t)" -c 8 -n 400 --max-time-s 20 --json /dev/null 2>/dev/null
done
for rep in $(seq 1 "$REPS"); do
  for c in $CONCS; do
    for t in $TARGETS; do
      f=$OUT/$t-c$c-r$rep.json
      read -r p0 _ < <(proc_usage "${PID[$t]}"); read -r s0 _ < <(proc_usage "$PICKER_PID")
      loadc --url "$(url $t)" -c "$c" -n 2000000 --duration-s "$DUR" --max-time-s 45 \
        --label "$t c=$c rep=$rep" --json "$f" 2>&1 | grep '^\[' >&2
      read -r p1 rss < <(proc_usage "${PID[$t]}"); read -r s1 _ < <(proc_usage "$PICKER_PID")
      python3 - "$f" "$t" "$c" "$rep" $((p1 - p0)) "$rss" $((s1 - s0)) <<'PY'
import json, sys
f, t, c, rep, dp, rss, ds = sys.argv[1:]
d = json.load(open(f))
d.update(target=t, conc=int(c), rep=int(rep), proxy_cpu_s=int(dp) / 100, proxy_rss_kb=int(rss))
if t == "picker":
    d["picker_cpu_s"] = int(ds) / 100
json.dump(d, open(f, "w"))
PY
    done
  done
done
python3 - "$OUT" "$CONCS" "$REPS" <<'PY'
import json, sys, statistics as st
out, concs, reps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def runs(t, c):
    return [json.load(open(f"{out}/{t}-c{c}-r{r}.json")) for r in range(1, reps + 1)]
for c in concs:
    print(f"== concurrency {c} (median of {reps}; CPU per request in µs on the proxy core)")
    print(f"{'target':<8} {'req/s':>8} {'CPU/req':>8} {'of it Envoy':>12} {'of it picker':>13} {'TTFT p50':>9} {'TTFT p99':>9}")
    for t in ("direct", "envoy", "picker", "proxy"):
        rs = runs(t, c)
        med = lambda f: st.median(f(d) for d in rs)
        rps = med(lambda d: d["rps"])
        cpu = "" if t == "direct" else f"{med(lambda d: 1e6 * d['proxy_cpu_s'] / d['requests_done']):.1f}"
        pick = envoy = ""
        if t == "picker":
            p = med(lambda d: 1e6 * d["picker_cpu_s"] / d["requests_done"])
            e = med(lambda d: 1e6 * (d["proxy_cpu_s"] - d["picker_cpu_s"]) / d["requests_done"])
            pick, envoy = f"{p:.1f}", f"{e:.1f}"
        print(f"{t:<8} {rps:>8.0f} {cpu:>8} {envoy:>12} {pick:>13} {med(lambda d: d['ttft_ms']['p50']):>9.3f} {med(lambda d: d['ttft_ms']['p99']):>9.3f}")
PY
