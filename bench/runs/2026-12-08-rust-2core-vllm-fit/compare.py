#!/usr/bin/env python3
"""The simulation's candidates (plan.json) against their replays (replay-c*-q*.json): goodput,
TTFT p95 and refusals, side by side with the differences."""
import json, sys, glob, os, re
d = sys.argv[1]
plan = json.load(open(os.path.join(d, "plan.json")))
sims = {(c["candidate"]["concurrency"], c["candidate"]["queue"]): c for c in plan["simulation"]["candidates"]}
print("candidate     | goodput sim / replay (points) | TTFT p95 s sim / replay (diff) | refused sim / replay (diff)")
for f in sorted(glob.glob(os.path.join(d, "replay-c*-q*.json"))):
    c, q = map(int, re.search(r"c(\d+)-q(\d+)", f).groups())
    r = json.load(open(f))["levels"][0]["stats"]
    s = sims.get((c, q))
    if s is None:
        continue
    sg, rg = s["goodput"] * 100, r["goodput_share"] * 100
    st = s["ttft"]["p95"] if s["ttft"] else float("nan")
    rt = r["ttft"]["p95"] if r["ttft"] else float("nan")
    sr = s["requests"] - s["served"]
    rr = r["requests"] - r["ok"]
    rel = lambda a, b: (a - b) / b * 100 if b else float("nan")
    print(f"C={c:<2} Q={q:<3}   | {sg:5.1f}% / {rg:5.1f}% ({sg - rg:+.1f})     | {st:.3f} / {rt:.3f} ({rel(st, rt):+.0f}%)      | {sr} / {rr} ({sr - rr:+d}, {rel(sr, rr):+.0f}%)")
