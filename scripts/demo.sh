#!/usr/bin/env bash
# The main job on the embedded default, until `spillway demo` exists: `spillway bench` finds the
# safe concurrency of one simulated vLLM replica; then two replicas with the Spillway gateway in
# front of them: a streamed completion, a burst that meets a bounded queue (fast 503s with
# Retry-After instead of a pile-up), a hung replica caught at the first-token budget, and the
# metrics that say where requests waited.
#
# Ports: four consecutive ones from SPILLWAY_DEMO_PORT (default 18000); when one of them is taken,
# the next block of four that is free, said on the terminal. Logs and reports stay in target/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v curl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }

out=target/demo
mkdir -p "$out"
rm -f "$out"/*.log "$out"/*.yaml
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Something listens on 127.0.0.1:$1 (a connection is accepted).
taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Stops the demo with the server's own last words: its log's last line, then the log's tail.
died() {
  local name=$1 log=$2 why=$3
  echo
  echo "demo: the $name $why."
  echo "   its last line: $(grep -v '^\s*$' "$log" | tail -1)"
  echo "   its log ($log):"
  tail -5 "$log" | sed 's/^/   | /'
  exit 1
}

# Waits up to 20 s for every URL to answer 2xx while the process lives; otherwise stops the demo.
healthy() {
  local name=$1 pid=$2 log=$3
  shift 3
  for _ in $(seq 200); do
    kill -0 "$pid" 2>/dev/null || died "$name" "$log" "exited at start"
    local ok=1
    for url in "$@"; do curl -sf -o /dev/null --max-time 1 "$url" || { ok=0; break; }; done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  died "$name" "$log" "did not answer $* within 20 s"
}

echo "== building spillway (release). The first build compiles about 300 crates: several minutes on"
echo "   2 cores, one line per crate below; later runs take a second."
cargo build --release --locked 2>&1 | sed -u 's/^ */   /'
bin=target/release/spillway

base=${SPILLWAY_DEMO_PORT:-18000}
first=$base
for _ in $(seq 20); do
  [ $((base + 3)) -le 65535 ] || break
  busy=""
  for p in $base $((base + 1)) $((base + 2)) $((base + 3)); do taken "$p" && busy="$busy $p"; done
  [ -z "$busy" ] && break
  echo "   port(s)$busy on 127.0.0.1 already in use by another program; trying $((base + 10))-$((base + 13))"
  base=$((base + 10))
done
if [ $((base + 3)) -gt 65535 ]; then
  echo "demo: it needs four ports from $base, past 65535; set SPILLWAY_DEMO_PORT lower"; exit 1
fi
[ -z "$busy" ] || { echo "demo: no four free ports between $first and $base; set SPILLWAY_DEMO_PORT"; exit 1; }
bench_port=$base
replica0=$((base + 1))
replica1=$((base + 2))
gw_port=$((base + 3))
echo "   ports: $bench_port (engine for the bench), $replica0 and $replica1 (two replicas), $gw_port (gateway)"

echo
echo "== spillway bench: how many concurrent requests can one replica take inside the SLO?"
echo "   The replica is a simulated vLLM (spillway engine) whose step costs are calibrated to"
echo "   Llama-3.1-8B on one H100 (--preset llama-3.1-8b-h100), limited to 16 sequences at once"
echo "   (--max-num-seqs 16): a 17th request waits for a free slot, about one request's time (~150 ms)."
echo "   Requests: 64 prompt tokens, 32 output tokens. SLO: TTFT p99 under 100 ms, errors under 1%."
echo "   The bench runs 1, 2, 4, ... 32 clients for 1 s each, then bisects between the last level"
echo "   that passed and the first that failed (the knee). A level also fails when the engine's"
echo "   waiting queue does not drain (the 'waiting' column: requests waiting, on average)."
echo "   Then a burst: twice the best level for 1 s; that level is safe only if TTFT and the queue"
echo "   recover within 3 s. A burst row's verdict is that recovery ('recovered'): during the burst"
echo "   its TTFT is expected to exceed the SLO. About 20 s."
"$bin" engine --listen "127.0.0.1:$bench_port" --preset llama-3.1-8b-h100 --model sim --max-num-seqs 16 >"$out/bench-engine.log" 2>&1 &
bench_engine=$!
pids+=("$bench_engine")
healthy "engine for the bench" "$bench_engine" "$out/bench-engine.log" "http://127.0.0.1:$bench_port/health"
"$bin" bench --url "http://127.0.0.1:$bench_port" --model sim --input-len 64 --output-len 32 --duration 1s \
  --max-concurrency 32 --phases baseline,staircase,burst --burst-length 1s --recovery-timeout 3s \
  --slo ttft_p99=100ms,error_rate=1% --metrics-url "http://127.0.0.1:$bench_port/metrics" \
  --json "$out/bench.json" --html "$out/bench.html" | sed 's/^/   /'
echo "   report: $out/bench.html (charts), $out/bench.json (every number)"
kill "$bench_engine" 2>/dev/null || true
wait "$bench_engine" 2>/dev/null || true

echo
echo "== the gateway: two fresh replicas behind spillway serve, 16 sequences each, with the fast"
echo "   test preset (tiny: a 300-token answer takes ~0.35 s)"
echo "   Its limit is deliberately small, C = 8 requests in flight over both replicas together, so"
echo "   that a burst shows the queue: Q = 8 may wait, each for at most Wq = 500 ms; the rest are"
echo "   refused at once. A first token must come within 2 s (first_token)."
cat >"$out/spillway.yaml" <<YAML
listen: 127.0.0.1:$gw_port
server: { drain_delay: 0s }
routes:
  - model: corp-chat
    upstream_model: sim
    replicas: [http://127.0.0.1:$replica0, http://127.0.0.1:$replica1]
    limits: { max_input_tokens: 2000, max_tokens: { default: 64, cap: 1024 } }
    timeouts: { connect: 500ms, first_token: 2s, stream_idle: 2s, total: 60s }
    classes:
      - name: interactive
        concurrency: 8
        queue: 8
        queue_wait: 500ms
        slo: { ttft: 300ms, itl: 20ms }
YAML
"$bin" engine --listen "127.0.0.1:$replica0" --replicas 2 --preset tiny --model sim --max-num-seqs 16 >"$out/engine.log" 2>&1 &
engine=$!
pids+=("$engine")
healthy "engine (two replicas)" "$engine" "$out/engine.log" \
  "http://127.0.0.1:$replica0/health" "http://127.0.0.1:$replica1/health"
echo "   spillway check $out/spillway.yaml:"
"$bin" check "$out/spillway.yaml" | sed 's/^/   /'
"$bin" serve --config "$out/spillway.yaml" >"$out/access.log" 2>"$out/gateway.log" &
gateway=$!
pids+=("$gateway")
gw=http://127.0.0.1:$gw_port
# /ready answers 200 once every route has a healthy replica.
healthy "gateway" "$gateway" "$out/gateway.log" "$gw/ready"

echo
echo "== a streamed chat completion through the gateway ($gw): one SSE chunk per token"
curl -sN "$gw/v1/chat/completions" -H 'content-type: application/json' -H 'x-request-id: demo-1' \
  -d '{"model":"corp-chat","messages":[{"role":"user","content":"Why bound a queue?"}],"max_tokens":6,"stream":true}' \
  | sed '/^\s*$/d' | cut -c1-150 | sed 's/^/   /'
echo "   its access-log line (queue_ms: time in the gateway's queue; ttft_ms: to the first token):"
echo "   $(grep demo-1 "$out/access.log")"

echo
echo "== a burst: 64 requests at once, 300 tokens each, against C = 8, Q = 8, Wq = 500 ms"
burst=$(mktemp -d)
trap 'cleanup; rm -rf "$burst"' EXIT
burst_pids=()
for i in $(seq 64); do
  curl -s -o "$burst/body.$i" -w '%{http_code} %{time_total}\n' "$gw/v1/chat/completions" \
    -H 'content-type: application/json' -D "$burst/head.$i" \
    -d '{"model":"corp-chat","messages":[{"role":"user","content":"burst"}],"max_tokens":300,"stream":true}' >"$burst/status.$i" &
  burst_pids+=($!)
done
wait "${burst_pids[@]}" 2>/dev/null || true
ok=$(cat "$burst"/status.* | awk '$1==200' | wc -l)
rej=$(cat "$burst"/status.* | awk '$1==503' | wc -l)
other=$((64 - ok - rej))
echo "   $ok answered: 8 at once, the others after a wait in the queue as slots freed;"
echo "   $rej refused with 503$([ "$other" -gt 0 ] && echo ", $other other"), by reason (the body's code):"
{ cat "$burst"/body.* | grep -ho '"code":"[a-z_]*"' || true; } | sort | uniq -c | sed 's/"code"://; s/"//g; s/^ */     /'
echo "   (queue_full: Q = 8 already waiting; predicted_wait: its place in line would outlast Wq;"
echo "   queue_timeout: waited Wq = 500 ms without a slot)"
slowest=$(cat "$burst"/status.* | awk '$1==503 {print $2}' | sort -n | tail -1)
echo "   the slowest refusal came after $(awk -v s="${slowest:-0}" 'BEGIN { printf "%.0f", s * 1000 }') ms: nobody waits longer than Wq"
one=$(grep -l '"error"' "$burst"/body.* | head -1 || true)
if [ -n "$one" ]; then
  echo "   a refusal's body: $(cat "$one")"
  echo "   and its header $(grep -i '^retry-after' "${one/body/head}" | tr -d '\r') (seconds, from the measured drain rate)"
fi
for r in 0 1; do
  port=$((replica0 + r))
  most=$(curl -s "http://127.0.0.1:$port/admin/state" | sed 's/.*"max_running":\([0-9]*\).*/\1/')
  echo "   replica $r (port $port) ran at most $most requests at once (it could run 16)"
done
echo "   together at most C = 8: the gateway held the rest, so the engines never queued."

echo
echo "== replica 1 hangs: it takes requests but never sends a first token (a scripted fault)"
echo "   The gateway has not noticed (its health check only asks /health, which still answers)."
echo "   Two requests in a row; the balancer sends each to the replica with fewer in flight, ties in"
echo "   turn, so one goes to each: replica 0 answers at once, replica 1 gets 504 at first_token (2 s)."
curl -s "http://127.0.0.1:$replica1/admin/faults" -d '{"stall_after_tokens":0}' >/dev/null
for i in 1 2; do
  code=$(curl -s -o "$burst/hung.$i" -w '%{http_code} %{time_total}' "$gw/v1/chat/completions" \
    -H 'content-type: application/json' -H "x-request-id: hung-$i" \
    -d '{"model":"corp-chat","messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":true}')
  replica=$(grep "\"hung-$i\"" "$out/access.log" | sed 's/.*"replica":"\([^"]*\)".*/\1/' || true)
  ms=$(awk -v s="${code#* }" 'BEGIN { printf "%.0f", s * 1000 }')
  echo "   status ${code% *} after $ms ms from $replica: $(head -c 130 "$burst/hung.$i" | tr '\n' ' ')"
done
curl -s "http://127.0.0.1:$replica1/admin/faults" -d '{"clear":true}' >/dev/null
aborts=$(curl -s "http://127.0.0.1:$replica1/admin/state" | sed 's/.*"aborts":\([0-9]*\).*/\1/')
echo "   At 504 the gateway closed its upstream request, and the hung replica aborted it and freed its"
echo "   slot: $aborts abort(s) on replica 1. (The fault is now cleared.)"

echo
echo "== the gateway's metrics ($gw/metrics): answers by status (all of the above), refusals by"
echo "   reason, cancellations by reason (deadline: the 504 above), time spent in its queue, and"
echo "   goodput: completed requests whose TTFT (queue included) and ITL met the class SLO"
echo "   (TTFT 300 ms, ITL 20 ms), out of slo_requests, the completed requests measured"
curl -s "$gw/metrics" | grep -E '^spillway_(rejections_total|requests_total|goodput_requests_total|slo_requests_total|cancellations_total)|^spillway_queue_wait_seconds_(sum|count)' | sed 's/^/   /'
echo
echo "Done. Logs, the gateway's config and the bench report: $out/"
echo "Next: $bin serve --help, $bin bench --help, docs/config.md, docs/bench.md"
