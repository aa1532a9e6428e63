#!/usr/bin/env bash
# The Redis scripts' cost per admitted request, fifo vs teams: two teams flood one gateway with
# limits shared through a fresh redis-server; INFO commandstats gives the scripts' µs per call.
# Usage: bench/shared-script-cost.sh BIN FAIRNESS TAG
set -u
BIN=$1; F=$2; TAG=$3
D=target/fair-share/$TAG; mkdir -p $D
redis-server --port 16379 --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
RP=$!
$BIN engine --listen 127.0.0.1:18300 --preset tiny --model sim >/dev/null 2>&1 &
EP=$!
cat > $D/gw.yaml <<YAML
listen: 127.0.0.1:18301
server: { access_log: false }
redis: { gateways: 1, namespace: cost-$TAG }
routes:
  - model: chat
    upstream_model: sim
    replicas: [http://127.0.0.1:18300]
    timeouts: { connect: 1s, first_token: 30s, stream_idle: 5s, total: 60s }
    classes:
      - { name: shared, concurrency: 8, queue: 256, queue_wait: 20s, fairness: $F }
tenants:
  - team: a
    key_sha256: [ "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4" ]
  - team: b
    key_sha256: [ "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634" ]
YAML
sleep 1
SPILLWAY_REDIS_URL=redis://127.0.0.1:16379/ $BIN serve --workers 1 --config $D/gw.yaml >$D/gw.log 2>&1 &
GP=$!
sleep 2
redis-cli -p 16379 config resetstat >/dev/null
t0=$(awk '{print $14+$15}' /proc/$GP/stat)
KEY_A=key-a KEY_B=key-b
KEY_A=key-a $BIN bench --url http://127.0.0.1:18301 --model chat --api-key-env KEY_A --concurrency 120 --duration 15s --phases staircase --input-len 64 --output-len 32 --json $D/a.json >$D/a.log 2>&1 &
BA=$!
KEY_B=key-b $BIN bench --url http://127.0.0.1:18301 --model chat --api-key-env KEY_B --concurrency 4 --duration 15s --phases staircase --input-len 64 --output-len 32 --json $D/b.json >$D/b.log 2>&1 &
BB=$!
wait $BA $BB
t1=$(awk '{print $14+$15}' /proc/$GP/stat)
redis-cli -p 16379 info commandstats | grep -E "evalsha|eval:" > $D/commandstats
curl -s http://127.0.0.1:18301/metrics | grep -E '^spillway_requests_total\{' > $D/requests
echo "gateway cpu ticks: $((t1-t0))" > $D/cpu
kill $GP $EP $RP 2>/dev/null; wait 2>/dev/null
cat $D/commandstats $D/requests $D/cpu
