#!/usr/bin/env bash
# bench/ab.sh's paced half only, five repetitions each way round (nginx beside them).
# usage: bench/runs/2026-12-07-one-back-half/ab-paced.sh A_BINARY B_BINARY OUT
set -u
A=$1; B=$2; OUT=$3
cd "$(dirname "$0")/../../.."
for order in ab ba; do
  if [ $order = ab ]; then G=$A; T=$B; else G=$B; T=$A; fi
  OUT=$OUT/$order-paced TARGETS="nginx gateway traced" CONCS="64" REPS=5 DUR=4 RUN=$PWD/target/ovrun \
    MOCK_ARGS="--itl-ms 10 --tokens 32" \
    GATEWAY_CMD="$G serve --workers 1 --config $PWD/target/gw-18084.yaml" \
    TRACED_CMD="$T serve --workers 1 --config $PWD/target/gw-18085.yaml" \
    bash target/peers/scripts/overhead.sh
done
