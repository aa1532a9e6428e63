#!/usr/bin/env bash
# Two Spillway builds side by side in the peers harness, both ways round: A in the `gateway` slot
# and B in the second (`traced`) slot, then swapped; 32 back-to-back streams (the mock's 16
# tokens) and 64 paced ones (10 ms apart, 32 tokens), three repetitions each. Needs the harness
# copied to target/peers with its second slot (bench/README.md), nginx, and the mock and load
# client built there. Results: OUT/{ab,ba}-{burst,paced}/*.json; bench/ab-table.py reads them.
# usage: bench/ab.sh A_BINARY B_BINARY OUT
set -u
A=$1; B=$2; OUT=$3
cd "$(dirname "$0")/.."
for p in 18084 18085; do
  printf 'listen: 127.0.0.1:%s\nroutes:\n  - model: mock\n    replicas: [http://127.0.0.1:18000]\n    classes:\n      - { name: interactive, concurrency: 1000, queue: 1000, queue_wait: 5s }\n' "$p" >"target/gw-$p.yaml"
done
for order in ab ba; do
  if [ $order = ab ]; then G=$A; T=$B; else G=$B; T=$A; fi
  for mode in burst paced; do
    if [ $mode = burst ]; then MA="--tokens 16"; C=32; else MA="--itl-ms 10 --tokens 32"; C=64; fi
    OUT=$OUT/$order-$mode TARGETS="direct nginx gateway traced" CONCS="$C" REPS=3 DUR=4 RUN=$PWD/target/ovrun \
      MOCK_ARGS="$MA" \
      GATEWAY_CMD="$G serve --workers 1 --config $PWD/target/gw-18084.yaml" \
      TRACED_CMD="$T serve --workers 1 --config $PWD/target/gw-18085.yaml" \
      bash target/peers/scripts/overhead.sh
  done
done
