#!/usr/bin/env bash
# Issue 51: a trace recorded from the gateway's own access log, converted, summarised, simulated
# over a grid (plan --simulate), and replayed on the real stack (spillway engine behind spillway
# serve) for the candidates, to hold the simulation against the replay. Run from the repo root
# after `cargo build --release -p spillway`. Ports 18000/18080.
set -euo pipefail
BIN=${BIN:-target/release/spillway}
D=bench/runs/2026-12-07-rust-2core-trace-sim
SPEED=${SPEED:-3}
SLO="ttft_p95=1s,error_rate=5%"
ENGINE="--preset llama-3.1-8b-h100 --model m --enable-prefix-caching"

gateway_config() { # C Q Wq
  cat > "$D/gw.yaml" <<YAML
listen: 127.0.0.1:18080
routes:
  - model: m
    replicas: [http://127.0.0.1:18000]
    timeouts: { connect: 1s, first_token: 60s, stream_idle: 30s, total: 300s }
    classes:
      - name: interactive
        concurrency: $1
        queue: $2
        queue_wait: $3
YAML
}

up() { # max-num-seqs C Q Wq access-log
  $BIN engine --listen 127.0.0.1:18000 $ENGINE --max-num-seqs "$1" 2>/dev/null & EPID=$!
  gateway_config "$2" "$3" "$4"
  SPILLWAY_TRACE_SALT=issue51 $BIN serve --config "$D/gw.yaml" > "$5" 2>/dev/null & GPID=$!
  for _ in $(seq 100); do curl -sf http://127.0.0.1:18080/ready >/dev/null 2>&1 && curl -sf http://127.0.0.1:18000/health >/dev/null 2>&1 && return; sleep 0.1; done
  echo "stack did not come up" >&2; exit 1
}
down() { kill "$GPID" "$EPID"; wait "$GPID" "$EPID" 2>/dev/null || true; }

# 1. Record: an open loop of mixed lengths with four shared 1024-token prefixes through the gateway.
if [ ! -s "$D/access.log" ]; then
up 64 64 64 5s "$D/access.log"
$BIN bench --url http://127.0.0.1:18080 --model m --rate 8 --duration 30s --phases staircase \
  --shared-prefix 4,1024 --input-len uniform:32,512 --output-len uniform:16,256 --slo "$SLO" --quiet > "$D/record.txt"
down
fi
# 2. Convert and summarise.
$BIN trace summary "$D/access.log" > "$D/summary.txt"
$BIN trace convert "$D/access.log" --to mooncake -o "$D/trace.jsonl"
$BIN trace convert "$D/trace.jsonl" --to azure -o "$D/trace.csv"
# 3. Simulate the grid at SPEED× (the recorded load was light).
( time $BIN plan --simulate "$D/trace.jsonl" --replicas 1 --model m --speed "$SPEED" --slo "$SLO" \
    --engine-preset llama-3.1-8b-h100 --grid-concurrency 4,8,16,32 --grid-queue 0,16 --grid-wait 2s \
    --grid-max-num-seqs 32 --upstream http://127.0.0.1:18000 --json > "$D/plan.json" 2> "$D/plan.txt" ) 2> "$D/plan-time.txt"
# 4. Replay candidates on the real stack.
for cand in "4 0" "8 16" "16 0" "16 16" "32 16"; do
  set -- $cand
  up 32 "$1" "$2" 2s "$D/replay-c$1-q$2.log"
  $BIN bench --url http://127.0.0.1:18080 --model m --trace "$D/trace.jsonl" --speed "$SPEED" --slo "$SLO" \
    --json "$D/replay-c$1-q$2.json" --quiet > "$D/replay-c$1-q$2.txt"
  down
done
python3 "$D/compare.py" "$D" > "$D/compare.txt"
cat "$D/compare.txt"
