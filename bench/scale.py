"""Reads a bench/scale.sh run: per repetition and target, throughput against direct, TTFT p50 and
p99 over the requests started at or after SKIP_MS (default 3500: past the opening burst, when
every client connects and asks at once), CPU per request, RSS half-way and per in-flight stream.
For an open-loop run (RATE set), the figures are `spillway bench`'s, past its warmup (SKIP_MS is
not used), and the streams in flight are the arrivals per second times the mean stream's length."""
import csv
import json
import os
import sys

run = sys.argv[1]
skip = float(sys.argv[2]) if len(sys.argv) > 2 else 3500.0


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def open_loop(r, t, path, base):
    """Prints a row of an open-loop run; returns direct's (rate, p50, p99) for the rows after it."""
    b = json.load(open(path + ".bench.json"))
    level = b["levels"][0]
    st = level["stats"]
    rate = level["load"]["rate"]
    sent = st["requests"] + level["warmup_requests"]
    nan = float("nan")
    p50, p99 = (st["ttft"]["p50"] * 1e3, st["ttft"]["p99"] * 1e3) if st["ttft"] else (nan, nan)
    if t == "direct":
        base = (rate, p50, p99)
    cpu = int(open(path + ".cpu").read()) / 100 / sent * 1e6
    rss = int(open(f"{path}.rss").read())
    idle = int(open(f"{run}/{t}-idle-rss").read())
    in_flight = rate * st["e2e"]["mean"] if st["e2e"] else nan
    errors = st["requests"] - st["ok"]
    lag = st["send_lag"]["p99"] * 1e3 if st["send_lag"] else nan
    print(f"{r:<3} {t:9} {rate:7.1f} {'open':>7} {p50:7.2f} {p99:7.2f} {p50 - base[1]:+7.2f} {p99 - base[2]:+7.2f} {st['requests']:6} {cpu:10.1f} {rss / 1024:7.1f} {(rss - idle) / in_flight:9.1f} {errors} (in flight {in_flight:.0f}, send lag p99 {lag:.1f} ms{', DISTORTED' if level['distorted'] else ''})")
    return base


reps = sorted({int(f.split("-r")[1].split(".")[0]) for f in os.listdir(run) if f.startswith("direct-r") and f.endswith(".json")})
if any(f.endswith(".bench.json") for f in os.listdir(run)):
    print("open loop: spillway bench's figures past its warmup")
else:
    print(f"TTFT over requests started at or after {skip:.0f} ms")
print(f"{'rep':3} {'target':9} {'req/s':>7} {'÷direct':>7} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>7} {'+p99':>7} {'n':>6} {'CPU µs/req':>10} {'RSS MB':>7} {'KB/stream':>9} errors")
for r in reps:
    base = None
    for t in ["direct", "nginx", "spillway", "other"]:
        path = f"{run}/{t}-r{r}"
        if os.path.exists(path + ".bench.json"):
            base = open_loop(r, t, path, base)
            continue
        if not os.path.exists(path + ".json"):
            continue
        j = json.load(open(path + ".json"))
        rows = [x for x in csv.DictReader(open(path + ".csv")) if float(x["start_ms"]) >= skip and x["outcome"] == "ok"]
        ttft = [float(x["ttft_ms"]) for x in rows]
        p50, p99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
        cpu = int(open(path + ".cpu").read()) / 100 / j["requests_done"] * 1e6
        rss = int(open(path + ".rss").read())
        idle = int(open(f"{run}/{t}-idle-rss").read())
        if t == "direct":
            base = (j["rps"], p50, p99)
        # Failed requests: transport errors (a map of message to count), answers other than 200,
        # and streams cut.
        errors = sum(j["errors"].values()) + sum(n for code, n in j["status"].items() if code != "200") + j["disconnected"]
        print(f"{r:<3} {t:9} {j['rps']:7.1f} {j['rps'] / base[0]:7.3f} {p50:7.1f} {p99:7.1f} {p50 - base[1]:+7.1f} {p99 - base[2]:+7.1f} {len(ttft):6} {cpu:10.1f} {rss / 1024:7.1f} {(rss - idle) / j['concurrency']:9.1f} {errors}")
