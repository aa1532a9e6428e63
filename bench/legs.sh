#!/usr/bin/env bash
# Where a proxy's time goes in one request, from its own system calls: one stream through the
# proxy to the peers harness's mock, the proxy's syscalls recorded by `perf record` on the
# raw_syscalls tracepoints (no sampling, so it runs on VMs without hardware counters), then, per
# request, the medians of:
#   request leg    the client's request read → the write of the request to the mock
#   upstream wait  that write → the first read of the mock's answer that brings body bytes (a
#                  response head read alone does not count: the first token is not in it)
#   response leg   that read → the next write to the client (for Spillway, which holds the head
#                  until the first token, the head and the first event; for nginx, which sends
#                  the head at once, the first event)
# Tracepoints slow each system call a little, the same for every proxy: compare proxies or builds
# measured the same way, not these figures with the harness's.
#
#   bench/legs.sh NAME SECONDS spillway-binary
#   bench/legs.sh NAME SECONDS nginx
#
# e.g. bench/legs.sh head 3 target/release/spillway. Needs perf and the peers harness built in
# target/peers (bench/README.md). Spillway listens on 18084 with target/gw.yaml (see
# bench/instructions.sh), nginx with the harness's config. Optional: MOCK_ARGS (the mock's flags),
# BODY (the client's request body instead of loadc's own). Spillway always asks the replica for
# `usage` (stream_options.include_usage) and the mock does more for such a request, so compare
# nginx with BODY='{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":16,
# "stream":true,"stream_options":{"include_usage":true}}' too: the same work upstream.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { grep '^#   bench/legs.sh\|^# e\.g\.' "$0"; exit 2; }
NAME=$1 SECONDS_=$2 PROXY=$3
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 1; }
[ -f target/peers/scripts/lib.sh ] || { echo "target/peers is missing: see bench/README.md" >&2; exit 1; }
[ -f target/gw.yaml ] || { echo "target/gw.yaml is missing: bench/instructions.sh writes it" >&2; exit 1; }
export RUN=$PWD/target/legs-run
export PATH=$PWD/target/peers/target/release:$PATH
source target/peers/scripts/lib.sh
# The harness's stop_all is written for scripts without -e: a process already gone would end it early.
trap 'set +e; stop_all' EXIT
OUT=$PWD/target/legs-$NAME
start_mock 18000 ${MOCK_ARGS:-}
if [ "$PROXY" = nginx ]; then
  start_nginx 18081 18000
  PID=$(pgrep -f "nginx: worker" | head -1) PORT=18081
else
  start_cmd 18084 18000 "$PROXY serve --workers 1 --config $PWD/target/gw.yaml"
  PID=$LAST_PID PORT=18084
fi
URL=http://127.0.0.1:$PORT/v1/chat/completions
# The mock's response head has one size (its date is fixed-width): a read of that many bytes
# brought the head alone.
HEAD_BYTES=$(curl -s -o /dev/null -w '%{size_header}' -H 'content-type: application/json' \
  -d '{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}' \
  http://127.0.0.1:18000/v1/chat/completions)
loadc --url "$URL" ${BODY:+--body "$BODY"} -c 1 -n 2000 --max-time-s 60 --json /dev/null >/dev/null 2>&1
loadc --url "$URL" ${BODY:+--body "$BODY"} -c 1 -n 100000000 --duration-s $((SECONDS_ + 2)) --max-time-s 60 --json "$OUT.json" >/dev/null 2>&1 &
LOAD=$!
sleep 1
perf record -q -o "$OUT.data" -e raw_syscalls:sys_enter,raw_syscalls:sys_exit -p "$PID" -- sleep "$SECONDS_" 2>/dev/null
ss -tnp >"$OUT.ss" 2>/dev/null
wait $LOAD
perf script -i "$OUT.data" -F tid,time,event,trace 2>/dev/null >"$OUT.txt"
python3 bench/legs.py "$NAME" "$OUT.txt" "$OUT.ss" "$PID" "$OUT.json" "$HEAD_BYTES"
