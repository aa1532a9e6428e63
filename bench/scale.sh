#!/usr/bin/env bash
# Issue 10's item 4 in the peers harness's setup: direct, nginx and Spillway (and optionally a
# second Spillway build) at CONC paced streams, one after another in each repetition, each run
# logging every request (loadc --log), so that TTFT can be read past the opening burst, and the
# proxy's RSS sampled half-way through the run (the in-flight figure, not the end's).
#
#   bench/scale.sh NAME CONC "MOCK_ARGS" REPS SECONDS spillway-binary [second-binary]   (whole seconds)
#   python3 bench/scale.py target/scale-NAME [SKIP_MS]
#
# e.g. bench/scale.sh s2000 2000 "--itl-ms 100 --tokens 16" 3 8 target/release/spillway
#
# loadc's closed loop keeps its clients in step: after the opening burst, most of a wave of CONC
# requests starts within half a second. With RATE set, the client is `spillway bench` (the first
# binary) in open loop instead: Poisson arrivals at RATE per second for SECONDS, the first WARMUP
# seconds (default 4) left out of its statistics; CONC is then only the label, and the streams in
# flight are RATE times the streams' length. e.g., about 2,000 streams of 3.2 s:
#   RATE=625 bench/scale.sh o2000 2000 "--itl-ms 200 --tokens 16" 3 12 target/release/spillway
# Needs the peers harness built in target/peers (bench/README.md). The proxies run on core 1, the
# mock and the client on core 0. Spillway listens on 18084 (and 18085) with C = Q = 4000. The
# targets' order turns by one each repetition, so that no target always runs last.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 6 ] || { grep '^#   bench/scale\|^# e\.g\.' "$0"; exit 2; }
NAME=$1 CONC=$2 MOCK_ARGS=$3 REPS=$4 DUR=$5 GW=$6 GW2=${7:-}
RATE=${RATE:-} WARMUP=${WARMUP:-4}
[ -f target/peers/scripts/lib.sh ] || { echo "target/peers is missing: see bench/README.md" >&2; exit 1; }
export RUN=$PWD/target/scale-run
source target/peers/scripts/lib.sh
# The harness's stop_all is written for scripts without -e: a process already gone would end it early.
trap 'set +e; stop_all' EXIT
OUT=$PWD/target/scale-$NAME
mkdir -p "$OUT"
rm -f "$OUT"/*
config() { # port -> a config file
  cat >"$RUN/gw-$1.yaml" <<EOF
listen: 127.0.0.1:$1
routes:
  - model: mock
    replicas: [http://127.0.0.1:18000]
    timeouts: { connect: 5s }
    classes:
      - { name: interactive, concurrency: 4000, queue: 4000, queue_wait: 5s }
EOF
  echo "$RUN/gw-$1.yaml"
}
for port in 18000 18081 18084 18085; do
  # A server left from another run would be measured in place of the one this run starts.
  if (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is in use: stop what listens there first" >&2
    exit 1
  fi
done
start_mock 18000 $MOCK_ARGS
declare -A PORT=([direct]=18000) PID=([direct]=$LAST_PID)
start_nginx 18081 18000
PORT[nginx]=18081 PID[nginx]=$LAST_PID
start_cmd 18084 18000 "$(realpath "$GW") serve --workers 1 --config $(config 18084)"
PORT[spillway]=18084 PID[spillway]=$LAST_PID
TARGETS="direct nginx spillway"
if [ -n "$GW2" ]; then
  start_cmd 18085 18000 "$(realpath "$GW2") serve --workers 1 --config $(config 18085)"
  PORT[other]=18085 PID[other]=$LAST_PID
  TARGETS="$TARGETS other"
fi
url() { echo "http://127.0.0.1:${PORT[$1]}/v1/chat/completions"; }
for t in $TARGETS; do # warm up, then the idle RSS that the per-stream figure starts from
  loadc --url "$(url "$t")" -H "$AUTH" -c 1 -n 50 --max-time-s 20 --json /dev/null 2>/dev/null
  read -r _ idle < <(proc_usage "${PID[$t]}")
  echo "$idle" >"$OUT/$t-idle-rss"
done
for t in $TARGETS; do
  kill -0 "${PID[$t]}" || { echo "$t did not start: see $RUN" >&2; exit 1; }
done
read -ra ORDER <<<"$TARGETS"
for rep in $(seq 1 "$REPS"); do
  turn=$(((rep - 1) % ${#ORDER[@]}))
  for t in "${ORDER[@]:turn}" "${ORDER[@]:0:turn}"; do
    read -r p0 _ < <(proc_usage "${PID[$t]}")
    (
      sleep $((DUR / 2))
      read -r _ rss < <(proc_usage "${PID[$t]}")
      echo "$rss" >"$OUT/$t-r$rep.rss"
    ) &
    sampler=$!
    if [ -n "$RATE" ]; then
      # The output length is the mock's: it ignores max_tokens.
      taskset -c "$CPU_LOAD" "$(realpath "$GW")" bench --url "http://127.0.0.1:${PORT[$t]}" --model mock \
        --phases staircase --rate "$RATE" --arrivals poisson --duration "${DUR}s" --warmup "${WARMUP}s" \
        --input-len 32 --output-len 16 --slo ttft_p99=60s --seed "$rep" --quiet \
        --json "$OUT/$t-r$rep.bench.json" >/dev/null
    else
      loadc --url "$(url "$t")" -H "$AUTH" -c "$CONC" -n 2000000 --duration-s "$DUR" --max-time-s 60 \
        --label "$t c=$CONC rep=$rep" --json "$OUT/$t-r$rep.json" --log "$OUT/$t-r$rep.csv" 2>&1 | grep '^\[' >&2
    fi
    wait "$sampler"
    read -r p1 _ < <(proc_usage "${PID[$t]}")
    echo $((p1 - p0)) >"$OUT/$t-r$rep.cpu"
    sleep 1
  done
done
log "results in $OUT: python3 bench/scale.py $OUT [SKIP_MS]"
