"""Per-request legs of a proxy from `perf script` of its raw_syscalls (see bench/legs.sh)."""
import json
import re
import statistics
import sys

name, trace, ss, pid, load = sys.argv[1:6]
READS = {0, 19, 45, 47}  # read, readv, recvfrom, recvmsg
WRITES = {1, 20, 44, 46}  # write, writev, sendto, sendmsg

upstream, client = set(), set()
for line in open(ss):
    m = re.search(rf"pid={pid},fd=(\d+)", line)
    if m:
        local, peer = line.split()[3:5]
        if peer.endswith(":18000"):
            upstream.add(int(m.group(1)))

events, pending = [], {}
pattern = re.compile(r"\s*(\d+)\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+) (.*)")
for line in open(trace):
    m = pattern.match(line)
    if not m:
        continue
    tid, t, kind, nr, rest = m.group(1), float(m.group(2)), m.group(3), int(m.group(4)), m.group(5)
    if kind == "enter":
        fd = re.match(r"\(([0-9a-fx]+)", rest)
        pending[tid] = (nr, int(fd.group(1), 16) if fd else -1)
        if nr in WRITES:
            events.append(("write", t, pending[tid][1], 0))
    else:
        ret = re.search(r"= (-?\d+)", rest)
        call = pending.pop(tid, None)
        if call and call[0] == nr and nr in READS and ret and int(ret.group(1)) > 0:
            events.append(("read", t, call[1], int(ret.group(1))))
# The client's connections: sockets read from that are not the mock's (standard streams excluded).
client = {e[2] for e in events if e[0] == "read" and e[2] not in upstream and e[2] > 2}

# The mock may send its response head before its first event (it does when its body task runs
# after the head is flushed): a proxy that relays heads at once (nginx) then writes the head to
# the client before the first token exists. So the legs end at the first token, not the head:
# the answer counts from the first upstream read that brings body bytes, and the response leg ends
# at the first client write after it. A head read alone has the size most first reads have.
firsts, state = [], 0
for e in events:
    if state == 0 and e[0] == "write" and e[2] in upstream:
        state = 1
    elif state == 1 and e[0] == "read" and e[2] in upstream:
        firsts.append(e[3])
        state = 0
mode = max(set(firsts), key=firsts.count) if firsts else 0
head_alone = mode if mode <= 512 else None

legs = {"request leg": [], "upstream wait": [], "response leg": []}
state = 0
for e in events:
    kind, t, fd = e[0], e[1], e[2]
    if state == 0 and kind == "read" and fd in client:
        start, state = t, 1
    elif state == 1 and kind == "write" and fd in upstream:
        sent, state = t, 2
    elif state == 2 and kind == "read" and fd in upstream:
        answered = t
        state = 3 if e[3] == head_alone else 4
    elif state == 3 and kind == "read" and fd in upstream:
        answered, state = t, 4
    elif state == 4 and kind == "write" and fd in client:
        legs["request leg"].append(sent - start)
        legs["upstream wait"].append(answered - sent)
        legs["response leg"].append(t - answered)
        state = 0
n = len(legs["request leg"])
if n == 0:
    sys.exit(f"{name}: no whole request found in the trace (upstream fds {upstream}, client fds {client})")
cells = ", ".join(f"{k} {statistics.median(v) * 1e6:.0f} µs" for k, v in legs.items())
ttft = json.load(open(load))["ttft_ms"]["p50"]
head = f"the mock's head came alone ({head_alone} bytes)" if head_alone else "head and body together"
print(f"{name}: {n} requests ({head}); medians: {cells}; the client's TTFT p50 {ttft} ms (traced)")
