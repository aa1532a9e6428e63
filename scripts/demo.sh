#!/usr/bin/env bash
# The main job on the embedded default, until `spillway demo` exists: two simulated vLLM replicas,
# a streamed completion, a burst that fills the engine's queue, a fault, and the metrics that show it.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v curl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq curl >/dev/null; }

echo "== building spillway (release)"
cargo build --release --locked --quiet
bin=target/release/spillway
port=${SPILLWAY_DEMO_PORT:-18000}
base=http://127.0.0.1:$port
log=$(mktemp)

"$bin" engine --listen "127.0.0.1:$port" --replicas 2 --preset tiny --model demo --max-num-seqs 16 --dcgm >"$log" 2>&1 &
engine_pid=$!
trap 'kill $engine_pid 2>/dev/null; wait $engine_pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do curl -sf "$base/health" >/dev/null && break; sleep 0.1; done
sed 's/^/   /' "$log"

echo
echo "== a streamed chat completion from replica 0 ($base), one SSE chunk per token"
curl -sN "$base/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"demo","messages":[{"role":"user","content":"Why bound a queue?"}],"max_tokens":12,"stream":true,"stream_options":{"include_usage":true}}' \
  | head -c 1200 || true
echo "..."

echo
echo "== a burst of 64 concurrent requests against max-num-seqs 16: the engine queues the rest"
for _ in $(seq 64); do
  curl -s -o /dev/null "$base/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"demo","prompt":"burst","max_tokens":400}' &
done
sleep 0.3
curl -s "$base/metrics" | grep -E '^vllm:num_requests_(running|waiting)|^vllm:kv_cache_usage_perc|^DCGM_FI_DEV_GPU_UTIL' | sed -E 's/engine="0",?//; s/,?model_name="demo"//; s/\{\}//; s/^/   /'
wait $(jobs -p | grep -v "^$engine_pid$") 2>/dev/null || true

echo
echo "== after the burst: TTFT grew with the queue (vllm:time_to_first_token_seconds)"
curl -s "$base/metrics" | grep -E '^vllm:(time_to_first_token_seconds|request_queue_time_seconds)_(sum|count)|^vllm:request_success_total' | sed -E 's/engine="0",?//; s/,?model_name="demo"//; s/\{\}//; s/^/   /'

echo
echo "== fault injection on replica 1: never send the first token (a hung engine)"
r1=http://127.0.0.1:$((port + 1))
curl -s "$r1/admin/faults" -d '{"stall_after_tokens":0}'; echo
echo "   a client with a 2 s timeout gets nothing:"
curl -s -m 2 "$r1/v1/completions" -H 'content-type: application/json' -d '{"model":"demo","prompt":"x","max_tokens":5}' \
  || echo "   (timed out after 2 s, exit $?)"
sleep 0.2
curl -s "$r1/admin/state" | sed 's/^/   /'; echo
curl -s "$r1/admin/faults" -d '{"clear":true}' >/dev/null
echo
echo "Done. Run your own: $bin engine --help"
