#!/bin/bash
# The staircase of bench/runs/2026-12-08-rust-2core-bench-agents.md (issue 49): one engine, each API in turn.
set -eu
BIN=${BIN:-target/debug/spillway}
OUT=${OUT:-target/bench-agents}
PORT=${PORT:-18492}
mkdir -p "$OUT"
$BIN engine --listen 127.0.0.1:$PORT --model sim --preset tiny --max-num-seqs 8 > "$OUT/engine.log" 2>&1 &
ENGINE=$!
trap 'kill $ENGINE' EXIT
sleep 1
for pass in 1 2; do
  if [ $pass = 1 ]; then order="chat responses messages"; else order="messages responses chat"; fi
  for api in $order; do
    uptime >> "$OUT/load.txt"
    $BIN bench --url http://127.0.0.1:$PORT --model sim --api $api \
      --concurrency 1,2,4,8,16 --duration 6s --warmup 1s \
      --input-len 256 --output-len 64 --phases staircase \
      --slo ttft_p95=500ms,itl_p95=50ms \
      --metrics-url http://127.0.0.1:$PORT/metrics \
      --json "$OUT/$api-$pass.json" --quiet > "$OUT/$api-$pass.txt" 2>&1
  done
done
