#!/usr/bin/env python3
"""CPU per request (µs) of A (after) and B (before) from bench/ab.sh's OUT, with nginx beside them."""
import json,glob,sys,statistics as st
base = sys.argv[1]  # the OUT of bench/ab.sh
res={}
for order in ['ab','ba']:
    for mode in ['burst','paced']:
        for f in sorted(glob.glob(f'{base}/{order}-{mode}/*.json')):
            d=json.load(open(f))
            t=d['target']
            name={'ab':{'gateway':'after','traced':'before'},'ba':{'gateway':'before','traced':'after'}}[order].get(t,t)
            us=d['proxy_cpu_s']/max(d['requests_done'],1)*1e6
            res.setdefault((mode,name),[]).append(us)
for mode in ['burst','paced']:
    print(f"| {mode} |", end='')
    for name in ['after','before','nginx']:
        v=res[(mode,name)]
        print(f" {', '.join(f'{x:.1f}' for x in v)} (median {st.median(v):.1f}) |", end='')
    a=res[(mode,'after')]; b=res[(mode,'before')]; n=res[(mode,'nginx')]
    r=[x/y for x,y in zip(a,b)]; rn=[x/y for x,y in zip(a,n)]; rb=[x/y for x,y in zip(b,n)]
    print(f" {', '.join(f'{x:.2f}' for x in r)} (median {st.median(r):.2f}) | {st.median(rn):.2f} | {st.median(rb):.2f} |")
