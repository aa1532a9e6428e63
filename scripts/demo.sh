#!/usr/bin/env bash
# The main job on the embedded default, until `spillway demo` exists: `spillway bench` finds the
# safe concurrency of one simulated vLLM replica; then two replicas with the Spillway gateway in
# front of them, a streamed completion, a burst that meets a bounded queue
# (fast 503s with Retry-After instead of a pile-up), a hung replica caught at the first-token
# budget, and the metrics that say where requests waited.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v curl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }

echo "== building spillway (release)"
cargo build --release --locked --quiet
bin=target/release/spillway
port=${SPILLWAY_DEMO_PORT:-18000}
gw_port=$((port + 80))
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

"$bin" engine --listen "127.0.0.1:$port" --replicas 2 --preset tiny --model sim --max-num-seqs 16 >"$work/engine.log" 2>&1 &
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done

echo
echo "== spillway bench: the safe concurrency of one replica (it runs 16 sequences at most)"
echo "   SLO: TTFT p99 under 20 ms; staircase 1, 2, 4, ... then bisection; a 2x burst must recover"
mkdir -p target/demo
"$bin" bench --url "http://127.0.0.1:$port" --model sim --input-len 64 --output-len 32 --duration 1s \
  --max-concurrency 32 --phases baseline,staircase,burst --burst-length 1s --recovery-timeout 3s \
  --slo ttft_p99=20ms,error_rate=1% --metrics-url "http://127.0.0.1:$port/metrics" \
  --json target/demo/bench.json --html target/demo/bench.html --quiet 2>&1 | sed 's/^/   /'
echo "   report: target/demo/bench.html (charts), target/demo/bench.json"
cat >"$work/spillway.yaml" <<YAML
listen: 127.0.0.1:$gw_port
server: { drain_delay: 0s }
routes:
  - model: corp-chat
    upstream_model: sim
    replicas: [http://127.0.0.1:$port, http://127.0.0.1:$((port + 1))]
    limits: { max_input_tokens: 2000, max_tokens: { default: 64, cap: 1024 } }
    timeouts: { connect: 500ms, first_token: 2s, stream_idle: 2s, total: 60s }
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 500ms
        slo: { ttft: 300ms, itl: 20ms }
YAML
"$bin" check "$work/spillway.yaml" | sed 's/^/   /'
"$bin" serve --config "$work/spillway.yaml" >"$work/access.log" 2>"$work/gateway.log" &
gw=http://127.0.0.1:$gw_port
for _ in $(seq 100); do curl -sf "$gw/ready" >/dev/null && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done

echo
echo "== a streamed chat completion through the gateway ($gw), one SSE chunk per token"
curl -sN "$gw/v1/chat/completions" -H 'content-type: application/json' -H 'x-request-id: demo-1' \
  -d '{"model":"corp-chat","messages":[{"role":"user","content":"Why bound a queue?"}],"max_tokens":6,"stream":true}' \
  | cut -c1-160
echo "   access log: $(grep demo-1 "$work/access.log")"

echo
echo "== a burst of 64 concurrent requests; C = 8 in flight, Q = 8 waiting, Wq = 500 ms"
burst_pids=()
for i in $(seq 64); do
  curl -s -o "$work/burst.$i" -w '%{http_code} %{time_total}\n' "$gw/v1/chat/completions" \
    -H 'content-type: application/json' -D "$work/head.$i" \
    -d '{"model":"corp-chat","messages":[{"role":"user","content":"burst"}],"max_tokens":300,"stream":true}' >"$work/status.$i" &
  burst_pids+=($!)
done
wait "${burst_pids[@]}" 2>/dev/null || true
ok=$(cat "$work"/status.* | awk '$1==200' | wc -l)
rej=$(cat "$work"/status.* | awk '$1==503' | wc -l)
echo "   $ok answered, $rej refused with 503"
slowest_refusal=$(cat "$work"/status.* | awk '$1==503 {print $2}' | sort -n | tail -1)
echo "   slowest refusal: ${slowest_refusal:-n/a} s (Envoy's circuit breaker: ~8 ms, plain text; LiteLLM: 4-6 s)"
one=$(grep -l '"error"' "$work"/burst.* | head -1 || true)
if [ -n "$one" ]; then
  echo "   a refusal's body: $(cat "$one")"
  echo "   and its $(grep -i '^retry-after' "${one/burst/head}" | tr -d '\r')"
fi
for r in 0 1; do
  echo "   replica $r never ran more than $(curl -s "http://127.0.0.1:$((port + r))/admin/state" | sed 's/.*"max_running":\([0-9]*\).*/\1/') at once"
done

echo
echo "== replica 1 hangs (never sends a first token): the gateway answers 504 at first_token (2 s)"
curl -s "http://127.0.0.1:$((port + 1))/admin/faults" -d '{"stall_after_tokens":0}' >/dev/null
for i in 1 2; do
  curl -s -o "$work/hung.$i" -w "   status %{http_code} after %{time_total} s: " "$gw/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"corp-chat","messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":true}'
  head -c 150 "$work/hung.$i"; echo
done
curl -s "http://127.0.0.1:$((port + 1))/admin/faults" -d '{"clear":true}' >/dev/null
echo "   the hung replica aborted what the gateway dropped: $(curl -s "http://127.0.0.1:$((port + 1))/admin/state" | sed 's/.*"aborts":\([0-9]*\).*/\1/') aborts"

echo
echo "== the gateway's metrics: where requests waited and why they were refused"
curl -s "$gw/metrics" | grep -E '^spillway_(rejections_total|requests_total|goodput_requests_total|slo_requests_total|cancellations_total)|^spillway_queue_wait_seconds_(sum|count)' | sed 's/^/   /'
echo
echo "Done. Next: $bin serve --help, $bin engine --help, docs/config.md"
