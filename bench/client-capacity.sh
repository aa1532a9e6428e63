#!/usr/bin/env bash
# How fast `spillway bench` itself can drive streams: closed loop against a zero-cost engine (every
# step takes no time), one level per concurrency, and the bench process's own CPU per request.
# With GuideLLM installed (bench/client-capacity.sh --guidellm installs it into target/compare-venv),
# GuideLLM drives the same engine the same way, in the same run, for comparison.
# usage: bench/client-capacity.sh [LEVELS] [--guidellm]   (default 1,64,256,1000)
set -euo pipefail
cd "$(dirname "$0")/.."
levels=${1:-1,64,256,1000}
cargo build --release --quiet -p spillway
bin=target/release/spillway
port=${PORT:-18500}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
"$bin" engine --listen "127.0.0.1:$port" --preset zero --model sim >"$work/engine.log" 2>&1 &
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
echo "machine: $(nproc) cores, $(uname -r); engine: spillway engine --preset zero (pid $(jobs -p | head -1))"
printf '%-8s %10s %12s %14s %12s %12s\n' level requests "req/s" "CPU µs/req" "ttft p50" "lag p95"
IFS=, read -ra cs <<<"$levels"
for c in "${cs[@]}"; do
  /usr/bin/time -f '%U %S' -o "$work/time" "$bin" bench --url "http://127.0.0.1:$port" --model sim \
    --phases staircase --concurrency "$c" --duration 10s --warmup 1s --input-len 32 --output-len 16 \
    --slo ttft_p99=60s --quiet --json "$work/c$c.json" >/dev/null
  python3 - "$work/c$c.json" "$work/time" "$c" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); u, s = map(float, open(sys.argv[2]).read().split()[-2:])
l = r["levels"][0]; st = l["stats"]; n = st["requests"] + l["warmup_requests"]
print(f'C={sys.argv[3]:<6} {st["requests"]:>10} {st["throughput_rps"]:>12.0f} {1e6 * (u + s) / n:>14.0f} '
      f'{st["ttft"]["p50"] * 1e3:>10.2f}ms {st["send_lag"]["p95"] * 1e6:>10.0f}µs'
      + (f'  DISTORTED: {l["distorted"]}' if l["distorted"] else ''))
PY
done
if [ "${2:-}" = "--guidellm" ]; then
  venv=${GUIDELLM_VENV:-target/compare-venv}
  [ -x "$venv/bin/guidellm" ] || { python3 -m venv "$venv"; "$venv/bin/pip" install --quiet --disable-pip-version-check guidellm; }
  echo "guidellm: $("$venv/bin/pip" show guidellm 2>/dev/null | grep -i '^version')"
  # GuideLLM's synthetic prompts need a tokenizer and the hub is out of reach: a local word-level one.
  "$venv/bin/python" - "$work/tok" <<'PY'
import json, os, sys
from tokenizers import Tokenizer, models, pre_tokenizers
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
words = ["[UNK]"] + "the and for are but not you all any can had her was one our out day get has him his how".split()
t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
t.save(os.path.join(d, "tokenizer.json"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
PY
  /usr/bin/time -f '%U %S' -o "$work/gstart" "$venv/bin/guidellm" run --help >/dev/null
  echo "guidellm start-up alone: $(awk '{print $1 + $2}' "$work/gstart") s CPU"
  for c in "${cs[@]}"; do
    /usr/bin/time -f '%U %S' -o "$work/gtime" "$venv/bin/guidellm" run \
      --backend "kind=openai_http,target=http://127.0.0.1:$port,model=sim" \
      --profile "kind=concurrent,streams=$c" --constraint kind=max_duration,seconds=10 \
      --tokenizer "kind=hf_auto,model=$work/tok" --data kind=synthetic_text,prompt_tokens=32,output_tokens=16 \
      --output "kind=json,path=$work/g$c.json" --disable-console-interactive >"$work/g$c.log" 2>&1 || {
      echo "guidellm C=$c failed: $(tail -3 "$work/g$c.log")"; continue; }
    python3 - "$work/g$c.log" "$work/gtime" "$c" <<'PY'
import re, sys
log = open(sys.argv[1]).read(); u, s = map(float, open(sys.argv[2]).read().split()[-2:])
row = [l for l in log.splitlines() if l.startswith(f"| concurrent@{sys.argv[3]} ")]
# Server throughput table: concurrency median, mean, requests per second, ...
thr = [l for l in row if len(l.split("|")) == 9][-1].split("|")
lat = [l for l in row if len(l.split("|")) > 15][-1].split("|")
print(f"guidellm C={sys.argv[3]:<6} req/s {float(thr[4]):>8.0f}  in flight median {thr[2].strip()}  "
      f"ttft p50 {lat[6].strip()}ms  CPU {u + s:.1f} s in all ({1e6 * (u + s) / (float(thr[4]) * 10):.0f} µs/req)")
for w in re.findall(r"⚠ ([^\n]*)", log):
    print(f"   warning: {w.strip()}")
PY
  done
fi
