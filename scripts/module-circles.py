#!/usr/bin/env python3
"""Import circles between a crate's modules, from its `crate::` and `super::` paths (comments left out).
Usage: scripts/module-circles.py crates/gateway/src [depth] [-v]  (depth 1: top-level modules and
folders; 2: one level down; -v lists every edge). Issue 36 reports its output before and after."""
import os, re, sys
root = sys.argv[1]; depth = int(sys.argv[2]) if len(sys.argv) > 2 else 1
def modpath(f):
    rel = os.path.relpath(f, root)[:-3].split(os.sep)
    if rel[-1] in ('lib', 'mod', 'main'): rel = rel[:-1]
    return rel
mods = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'): mods[os.path.join(d, f)] = modpath(os.path.join(d, f))
tops = set(p[0] for p in mods.values() if p)
edges = {}
def key(p): return '/'.join(p[:depth]) if p else 'lib'
for f, p in mods.items():
    src = open(f).read()
    # strip comments
    src = re.sub(r'//[^\n]*', '', src)
    me = key(p)
    targets = set()
    for m in re.finditer(r'\bcrate::((?:\w+::)*\w+)', src):
        t = m.group(1).split('::')
        targets.add(tuple(t))
    # super:: relative to p (file's module path); in a non-mod file foo/bar.rs, super = foo
    for m in re.finditer(r'\b((?:super::)+)((?:\w+::)*\w+)', src):
        n = m.group(1).count('super::'); t = m.group(2).split('::')
        base = p[:len(p)-n] if n <= len(p) else []
        targets.add(tuple(base + t))
    # use crate::{a, b::c}
    for m in re.finditer(r'\bcrate::\{([^;]*?)\}\s*;', src, re.S):
        for part in re.split(r',', m.group(1)):
            w = part.strip().split('::')[0].strip('{} \n')
            if w: targets.add((w,))
    for t in targets:
        if t and t[0] in tops:
            # resolve depth: keep up to depth components that are modules
            k = []
            for i in range(min(depth, len(t))):
                cand = t[:i+1]
                if any(mp[:i+1] == list(cand) for mp in mods.values()): k = list(cand)
            kk = '/'.join(k)
            if kk and kk != me and not me.startswith(kk + '/') and not kk.startswith(me + '/'):
                edges.setdefault(me, set()).add(kk)
nodes = set(edges) | {x for v in edges.values() for x in v}
# Tarjan
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in sorted(nodes):
    if v not in idx: sc(v)
print(f"modules at depth {depth}: {len(nodes)}; circles: {len(sccs)}")
for s in sccs: print("  {" + ", ".join(s) + "}")
if '-v' in sys.argv:
    for k in sorted(edges): print(k, '->', sorted(edges[k]))
