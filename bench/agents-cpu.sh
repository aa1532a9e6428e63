#!/bin/bash
# The gateway's CPU per request for each API (issue 49): `spillway engine --preset zero` (steps
# cost nothing) on core 0, `spillway serve --workers 1` on core 1, `spillway bench --api API`
# closed-loop on core 0; the gateway's CPU (utime + stime from /proc) over each run divided by the
# requests the bench saw served. Three rounds, the order of the APIs rotated each round, in one run.
# usage: BIN=target/release/spillway OUT=target/agents-cpu bash bench/agents-cpu.sh
set -eu
BIN=${BIN:-target/release/spillway}
OUT=${OUT:-target/agents-cpu}
EPORT=${EPORT:-18493}
GPORT=${GPORT:-18494}
C=${C:-32}
DUR=${DUR:-5s}
mkdir -p "$OUT"
taskset -c 0 $BIN engine --listen 127.0.0.1:$EPORT --model mock --preset zero > "$OUT/engine.log" 2>&1 &
ENGINE=$!
printf 'listen: 127.0.0.1:%s\nroutes:\n  - model: mock\n    replicas: [http://127.0.0.1:%s]\n    classes:\n      - { name: interactive, concurrency: 1000, queue: 1000, queue_wait: 5s }\n' \
  "$GPORT" "$EPORT" > "$OUT/gw.yaml"
taskset -c 1 $BIN serve --workers 1 --config "$OUT/gw.yaml" > "$OUT/gateway.log" 2>&1 &
GATEWAY=$!
trap 'kill $ENGINE $GATEWAY 2>/dev/null' EXIT
sleep 2
ticks() { awk '{print $14 + $15}' /proc/$GATEWAY/stat; }
apis=(chat responses messages)
for round in 1 2 3; do
  for k in 0 1 2; do
    api=${apis[$(( (k + round - 1) % 3 ))]}
    before=$(ticks)
    taskset -c 0 $BIN bench --url http://127.0.0.1:$GPORT --model mock --api $api \
      --concurrency $C --duration $DUR --input-len 64 --output-len 16 --phases staircase \
      --json "$OUT/$api-$round.json" --quiet > "$OUT/$api-$round.txt" 2>&1
    after=$(ticks)
    echo "$api $round $before $after" >> "$OUT/ticks.txt"
  done
done
python3 - "$OUT" <<'PY'
import json, os, sys, statistics
out = sys.argv[1]
hz = os.sysconf("SC_CLK_TCK")
rows = {}
for line in open(f"{out}/ticks.txt"):
    api, rnd, b, a = line.split()
    j = json.load(open(f"{out}/{api}-{rnd}.json"))
    served = sum(l["stats"]["ok"] for l in j["levels"])
    rows.setdefault(api, []).append((int(a) - int(b)) / hz / max(served, 1) * 1e6)
chat = statistics.median(rows["chat"])
print("| api | gateway CPU µs per request (three rounds) | median | ÷ chat |")
print("| --- | --- | --- | --- |")
for api in ("chat", "responses", "messages"):
    m = statistics.median(rows[api])
    print(f"| {api} | {', '.join(f'{v:.0f}' for v in rows[api])} | {m:.0f} | {m / chat:.2f} |")
PY
