#!/usr/bin/env bash
# Retry-After under a sustained overload: closed-loop clients that obey it (`--honor-retry-after`),
# twice as many as the gateway holds (C = 13 + Q = 13), against two builds in turn, ABBA.
# Usage: bench/retry-after.sh OLD_BIN NEW_BIN TAG [DURATION]
set -u
OLD=$1; NEW=$2; TAG=$3; DUR=${4:-30s}
D=target/retry-after/$TAG; rm -rf $D; mkdir -p $D
$NEW engine --listen 127.0.0.1:18500 --preset tiny --model sim >$D/engine.log 2>&1 & ENGINE=$!
cat > $D/gw.yaml <<YAML
listen: 127.0.0.1:18510
server: { access_log: false }
routes:
  - model: chat
    upstream_model: sim
    replicas: [http://127.0.0.1:18500]
    timeouts: { connect: 1s, first_token: 30s, stream_idle: 5s, total: 60s }
    classes:
      - { name: only, concurrency: 13, queue: 13, queue_wait: 2s }
YAML
run() { # ARM BIN N
  $2 serve --config $D/gw.yaml >$D/gw-$1-$3.log 2>&1 & local GW=$!
  sleep 2
  COLUMNS=100 $2 bench --url http://127.0.0.1:18510 --model chat --concurrency 52 --phases staircase \
    --honor-retry-after --duration $DUR --warmup 5s --input-len 64 --output-len 60 \
    --slo ttft_p95=1s,itl_p95=50ms,error_rate=100% --metrics-url http://127.0.0.1:18510/metrics \
    --records --json $D/$1-$3.json >$D/$1-$3.txt 2>&1
  kill $GW; wait $GW 2>/dev/null
}
sleep 1
run fixed $OLD 1; run spread $NEW 1; run spread $NEW 2; run fixed $OLD 2
kill $ENGINE; wait 2>/dev/null
python3 - "$D" <<'PY'
import collections, glob, json, sys
print("| arm | run | sent | served | refused | refusals per served | served req/s | goodput req/s | TTFT p95 | Retry-After advised (s: count) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sorted(glob.glob(sys.argv[1] + '/*.json')):
    arm, run = path.rsplit('/', 1)[1][:-5].split('-')
    r = json.load(open(path))
    l = r['levels'][-1]; s = l['stats']
    refused = s['errors'].get('http_503', 0) + s['errors'].get('http_429', 0)
    advised = collections.Counter(round(x['retry_after']) for x in l['records'] if x.get('retry_after') is not None)
    advised = ', '.join(f'{k}: {v}' for k, v in sorted(advised.items()))
    print(f"| {arm} | {run} | {s['requests']} | {s['ok']} | {refused} | {refused / max(s['ok'], 1):.2f} | "
          f"{s['throughput_rps']:.1f} | {s['goodput_rps']:.1f} | {s['ttft']['p95'] * 1000:.0f} ms | {advised} |")
PY
