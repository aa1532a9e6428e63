#!/usr/bin/env bash
# Fair share between teams, measured with `spillway bench --tenant`: C = 4, deep queue, a with 24 closed-loop
# clients, b with 4; one gateway (FAIRNESS fifo|teams), or three on one Redis (N=3).
# Usage: bench/fair-share.sh BIN FAIRNESS TAG [N] [WEIGHT_A]
set -u
BIN=$1; F=$2; TAG=$3; N=${4:-1}; WA=${5:-1}
D=target/fair-share/$TAG; rm -rf $D; mkdir -p $D
PIDS=()
$BIN engine --listen 127.0.0.1:18400 --preset tiny --model sim >/dev/null 2>&1 & PIDS+=($!)
REDIS=""
if [ "$N" -gt 1 ]; then
  redis-server --port 16380 --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & PIDS+=($!)
  REDIS="redis: { gateways: $N, namespace: two-$TAG }"
fi
URLS=()
for i in $(seq 1 $N); do
  PORT=$((18410+i))
  cat > $D/gw$i.yaml <<YAML
listen: 127.0.0.1:$PORT
server: { access_log: false }
$REDIS
routes:
  - model: chat
    upstream_model: sim
    replicas: [http://127.0.0.1:18400]
    timeouts: { connect: 1s, first_token: 30s, stream_idle: 5s, total: 60s }
    classes:
      - { name: shared, concurrency: 4, queue: 64, queue_wait: 20s, fairness: $F }
tenants:
  - team: a
    weight: $WA
    key_sha256: [ "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4" ]
  - team: b
    key_sha256: [ "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634" ]
YAML
  SPILLWAY_REDIS_URL=redis://127.0.0.1:16380/ $BIN serve --workers 1 --config $D/gw$i.yaml >$D/gw$i.log 2>&1 & PIDS+=($!)
  URLS+=("http://127.0.0.1:$PORT")
done
sleep 2
export KA=key-a KB=key-b
if [ "$N" -gt 1 ]; then
  # a floods through every gateway (8 clients each), b comes through the last one only.
  for i in $(seq 1 $N); do
    $BIN bench --url ${URLS[$((i-1))]} --model chat --tenant a$i=KA:clients=$((24/N)) $( [ $i -eq $N ] && echo --tenant b=KB:clients=4 ) \
      --duration 20s --warmup 3s --input-len 64 --output-len 60 --json $D/bench$i.json > $D/bench$i.txt 2>&1 &
    BP+=($!)
  done
  wait ${BP[@]}
else
  COLUMNS=100 $BIN bench --url ${URLS[0]} --model chat --tenant a=KA:clients=24 --tenant b=KB:clients=4 \
    --duration 20s --warmup 3s --input-len 64 --output-len 60 --json $D/bench.json > $D/bench.txt 2>&1
fi
kill ${PIDS[@]} 2>/dev/null; wait 2>/dev/null
cat $D/bench*.txt | grep -v "^$" | tail -30
# Across gateways: each bench saw its own tenants; the teams' totals from their JSON.
python3 - "$D" <<'PY'
import glob, json, sys
rows = {}
for path in sorted(glob.glob(sys.argv[1] + '/bench*.json')):
    for t in json.load(open(path))['tenants']:
        r = rows.setdefault(t['name'][0], {'served': 0, 'p95': []})
        r['served'] += t['served']
        r['p95'].append(round(t['ttft']['p95'], 3) if t['ttft'] else None)
total = sum(r['served'] for r in rows.values()) or 1
for team, r in sorted(rows.items()):
    print(f"team {team}: served {r['served']} ({100 * r['served'] / total:.1f}%), TTFT p95 by gateway (s) {r['p95']}")
PY
