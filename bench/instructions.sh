#!/usr/bin/env bash
# User-space instructions per request of a proxy under callgrind, in front of the peers harness's
# mock: a count, not a timing, so two builds (or Spillway and nginx) compare without most of the
# machine's noise (runs of one build differ by about 0.5%: timing still decides how many events a
# read brings and how often the runtime parks). What it leaves out is the kernel's share (most of
# a proxy's CPU; strace -c and the peers harness see that) and the cost of cache misses.
#
#   bench/instructions.sh NAME CONC REQUESTS "MOCK_ARGS" spillway-binary
#   bench/instructions.sh NAME CONC REQUESTS "MOCK_ARGS" nginx
#
# e.g. bench/instructions.sh base-paced 4 400 "--itl-ms 10 --tokens 32" target/release/spillway
# HEADERS=FILE adds the request headers in FILE, one a line (# for comments), e.g.
# bench/openai-headers.txt: those the official OpenAI Python client sends.
# Needs valgrind and the peers harness built in target/peers (bench/README.md). The proxy runs on
# core 1 under callgrind, the mock and the load client on core 0; a quarter of REQUESTS warms it
# up, then the counters are zeroed, REQUESTS are run, and the counters dumped. Spillway listens on
# 18084 with target/gw.yaml (made if missing: route `mock` to the mock on 18000, every default on); nginx with the harness's config.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 5 ] || { grep '^#   bench/instructions.sh\|^# e\.g\.' "$0"; exit 2; }
NAME=$1 CONC=$2 N=$3 MOCK_ARGS=$4 PROXY=$5
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
[ -f target/peers/scripts/lib.sh ] || { echo "target/peers is missing: see bench/README.md" >&2; exit 1; }
export RUN=$PWD/target/instructions-run
source target/peers/scripts/lib.sh
# The harness's stop_all is written for scripts without -e: a process already gone would end it early.
trap 'set +e; stop_all' EXIT
OUT=$PWD/target/instructions-$NAME.out
rm -f "$OUT"*
start_mock 18000 $MOCK_ARGS
if [ "$PROXY" = nginx ]; then
  mkdir -p "$RUN/nginx-tmp-18081"
  render "$PEERS/conf/nginx.conf.in" "$RUN/nginx.conf" RUN="$RUN" LISTEN=18081 UP=18000 EXTRA=""
  # One process: the master would otherwise be the one callgrind follows.
  sed -i 's/^daemon off;/daemon off; master_process off;/' "$RUN/nginx.conf"
  cmd=(nginx -p "$RUN" -c "$RUN/nginx.conf") PORT=18081
else
  [ -f target/gw.yaml ] || cat >target/gw.yaml <<'EOF'
listen: 127.0.0.1:18084
routes:
  - model: mock
    replicas: [http://127.0.0.1:18000]
    classes:
      - { name: interactive, concurrency: 1000, queue: 1000, queue_wait: 5s }
EOF
  cmd=("$PROXY" serve --workers 1 --config "$PWD/target/gw.yaml") PORT=18084
fi
taskset -c "$CPU_PROXY" valgrind --tool=callgrind --callgrind-out-file="$OUT" "${cmd[@]}" >"$RUN/proxy.log" 2>&1 &
PIDS+=($!)
wait_port "$PORT" 120
URL=http://127.0.0.1:$PORT/v1/chat/completions
H=()
if [ -n "${HEADERS:-}" ]; then
  while IFS= read -r line; do
    case "$line" in '' | '#'*) ;; *) H+=(-H "$line") ;; esac
  done <"$HEADERS"
fi
loadc --url "$URL" "${H[@]}" -c "$CONC" -n $((N / 4)) --max-time-s 300 --json /dev/null 2>&1 | grep '^\[' | tail -1
callgrind_control --zero >/dev/null 2>&1
loadc --url "$URL" "${H[@]}" -c "$CONC" -n "$N" --max-time-s 900 --json "$RUN/$NAME.json" 2>&1 | grep '^\[' | tail -1
callgrind_control --dump=measured >/dev/null 2>&1
sleep 1
F=$(grep -l '^part: 1' "$OUT"*)
IR=$(awk '/^summary:/ {print $2}' "$F")
echo "$NAME: $IR instructions over $N requests = $((IR / N)) per request (profile: $F; callgrind_annotate $F)"
