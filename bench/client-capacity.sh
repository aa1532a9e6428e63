#!/usr/bin/env bash
# How fast `spillway bench` itself can drive streams: closed loop against a zero-cost engine (every
# step takes no time), one level per concurrency, and the bench process's own CPU per request.
# With GuideLLM installed (bench/client-capacity.sh --guidellm installs it into target/compare-venv),
# GuideLLM drives the same engine the same way, in the same run, for comparison.
# usage: bench/client-capacity.sh [LEVELS] [--guidellm]   (default 1,64,256,1000)
set -euo pipefail
cd "$(dirname "$0")/.."
levels=${1:-1,64,256,1000}
cargo build --release --quiet -p spillway
bin=target/release/spillway
port=${PORT:-18500}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
"$bin" engine --listen "127.0.0.1:$port" --preset zero --model sim >"$work/engine.log" 2>&1 &
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
echo "machine: $(nproc) cores, $(uname -r); engine: spillway engine --preset zero (pid $(jobs -p | head -1))"
printf '%-8s %10s %12s %14s %12s %12s\n' level requests "req/s" "CPU µs/req" "ttft p50" "lag p95"
IFS=, read -ra cs <<<"$levels"
for c in "${cs[@]}"; do
  /usr/bin/time -f '%U %S' -o "$work/time" "$bin" bench --url "http://127.0.0.1:$port" --model sim \
    --phases staircase --concurrency "$c" --duration 10s --warmup 1s --input-len 32 --output-len 16 \
    --slo ttft_p99=60s --quiet --json "$work/c$c.json" >/dev/null
  python3 - "$work/c$c.json" "$work/time" "$c" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); u, s = map(float, open(sys.argv[2]).read().split()[-2:])
l = r["levels"][0]; st = l["stats"]; n = st["requests"] + l["warmup_requests"]
print(f'C={sys.argv[3]:<6} {st["requests"]:>10} {st["throughput_rps"]:>12.0f} {1e6 * (u + s) / n:>14.0f} '
      f'{st["ttft"]["p50"] * 1e3:>10.2f}ms {st["send_lag"]["p95"] * 1e6:>10.0f}µs'
      + (f'  DISTORTED: {l["distorted"]}' if l["distorted"] else ''))
PY
done
if [ "${2:-}" = "--guidellm" ]; then
  venv=target/compare-venv
  [ -x "$venv/bin/guidellm" ] || { python3 -m venv "$venv"; "$venv/bin/pip" install --quiet --disable-pip-version-check guidellm; }
  echo "guidellm: $("$venv/bin/pip" show guidellm 2>/dev/null | grep -i '^version')"
  for c in "${cs[@]}"; do
    /usr/bin/time -f '%U %S' -o "$work/gtime" "$venv/bin/guidellm" benchmark run --target "http://127.0.0.1:$port" \
      --model sim --processor "${GUIDELLM_PROCESSOR:-gpt2}" --rate-type concurrent --rate "$c" --max-seconds 10 \
      --data "prompt_tokens=32,output_tokens=16" --output-path "$work/g$c.json" >"$work/g$c.log" 2>&1 || {
      echo "guidellm C=$c failed: $(tail -3 "$work/g$c.log")"; continue; }
    echo "guidellm C=$c: CPU $(cat "$work/gtime") s; $(grep -iE 'req/s|requests per' "$work/g$c.log" | tail -2)"
  done
fi
