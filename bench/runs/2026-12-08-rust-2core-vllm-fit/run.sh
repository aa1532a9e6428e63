#!/usr/bin/env bash
# Issue 51, deliver 4–5 on a real vLLM: vLLM 0.32's CPU build serving the tiny dummy-weight model
# (scripts/vllm.sh), measured by a bench run with --records, its cost model fitted
# (spillway engine fit), the 2026-12-07 trace simulated with that model (plan --simulate
# --cost-model) and replayed on vLLM behind the gateway for five candidates, the two held side
# by side (compare.py). Run from the repo root after `cargo build -p spillway`. Ports 18652/18653.
set -euo pipefail
BIN=${BIN:-target/debug/spillway}
HERE=bench/runs/2026-12-08-rust-2core-vllm-fit
D=${D:-$HERE}
mkdir -p "$D"
SRC=bench/runs/2026-12-07-rust-2core-trace-sim/trace.jsonl
VPORT=${VPORT:-18652}
GPORT=18653
SPEED=${SPEED:-1}
SLO="ttft_p95=500ms,error_rate=5%"
# vLLM's tokenizer counts 1.42 tokens for each of the bench's (fit-bench.txt: "prompt tokens: 610
# asked, 882 counted", 17 of them its chat template's). The simulation reads the trace's lengths
# as vLLM's tokens; the replay sends a copy whose prompts are 1/1.42 as long in the bench's
# tokens, with blocks of 360 of them standing for the trace's 512.
DRIFT=1.42

# 0. vLLM, unless one is already up on VPORT.
if ! curl -sf "http://127.0.0.1:$VPORT/health" >/dev/null 2>&1; then
  setsid scripts/vllm.sh serve "$VPORT" > "$D/vllm.log" 2>&1 & VGROUP=$!
  # Stopped with its engine core (its own process group) when this script ends.
  trap 'kill -TERM -- "-$VGROUP" 2>/dev/null || true' EXIT
  until grep -q "vllm ready" "$D/vllm.log" 2>/dev/null; do sleep 2; done
fi

# 1. Measure and fit: a concurrency-1 level for TTFT by prompt length, two more for ITL.
$BIN bench --url "http://127.0.0.1:$VPORT" --model tiny --phases staircase --concurrency 1,4,16 \
  --duration 10s --warmup 2s --input-len uniform:32,1200 --output-len 48 --slo ttft_p95=60s \
  --records --json "$D/fit-bench.json" --quiet > "$D/fit-bench.txt" 2>&1
$BIN engine fit "$D/fit-bench.json" -o "$D/vllm-cpu-cost.json" --max-num-batched-tokens 2048 > "$D/fit.txt"

# 2. The traces: the simulation's as recorded, the replay's in the bench's tokens.
cp "$SRC" "$D/trace.jsonl"
python3 - "$D/trace.jsonl" "$D/trace-bench-tokens.jsonl" "$DRIFT" <<'PY'
import json, sys
src, dst, drift = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(src) as f, open(dst, "w") as out:
    for line in f:
        r = json.loads(line)
        r["input_length"] = max(1, round(r["input_length"] / drift))
        out.write(json.dumps(r) + "\n")
PY

# 3. Simulate the grid with the fitted model and vLLM CPU's limits (--max-num-batched-tokens 2048,
#    --max-num-seqs 128, a 524,288-token KV cache as its log says, prefix caching on).
( time $BIN plan --simulate "$D/trace.jsonl" --block-size 512 --replicas 1 --model tiny --speed "$SPEED" \
    --slo "$SLO" --engine-preset tiny --cost-model "$D/vllm-cpu-cost.json" \
    --engine-max-num-batched-tokens 2048 --engine-kv-cache-tokens 524288 \
    --grid-concurrency 2,4,8,16 --grid-queue 0,8 --grid-wait 2s --grid-max-num-seqs 128 \
    --upstream "http://127.0.0.1:$VPORT" --json > "$D/plan.json" 2> "$D/plan.txt" ) 2> "$D/plan-time.txt"

# 4. Replay candidates through the gateway in front of the same vLLM.
for cand in "2 0" "4 0" "4 8" "8 8" "16 8"; do
  set -- $cand
  cat > "$D/gw.yaml" <<YAML
listen: 127.0.0.1:$GPORT
routes:
  - model: tiny
    replicas: [http://127.0.0.1:$VPORT]
    timeouts: { connect: 1s, first_token: 60s, stream_idle: 30s, total: 300s }
    classes:
      - name: interactive
        concurrency: $1
        queue: $2
        queue_wait: 2s
YAML
  $BIN serve --config "$D/gw.yaml" > /dev/null 2>&1 & GPID=$!
  until curl -sf "http://127.0.0.1:$GPORT/ready" >/dev/null 2>&1; do sleep 0.1; done
  $BIN bench --url "http://127.0.0.1:$GPORT" --model tiny --trace "$D/trace-bench-tokens.jsonl" \
    --block-size 360 --speed "$SPEED" --slo "$SLO" --ignore-eos true \
    --json "$D/replay-c$1-q$2.json" --quiet > "$D/replay-c$1-q$2.txt" 2>&1
  kill "$GPID"; wait "$GPID" 2>/dev/null || true
done
python3 "$HERE/compare.py" "$D" > "$D/compare.txt"
cat "$D/compare.txt"
