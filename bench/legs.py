"""Per-request legs of a proxy from `perf script` of its raw_syscalls (see bench/legs.sh)."""
import json
import re
import statistics
import sys

name, trace, ss, pid, load, head_bytes = sys.argv[1:7]
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
client = {fd for kind, _, fd, _ in events if kind == "read" and fd not in upstream and fd > 2}

# The mock may send its response head before its first event (it does when its body task runs
# after the head is flushed): a proxy that relays heads at once (nginx) then writes the head to
# the client before the first token exists. So the legs end at the first token, not the head:
# the answer counts from the first upstream read that brings body bytes (one of exactly the
# mock's head size, `head_bytes`, brought the head alone), and the response leg ends at the next
# client write. A request whose calls do not follow that order (a new request read first) is
# left out and counted.
head_bytes = int(head_bytes)
legs = {"request leg": [], "upstream wait": [], "response leg": []}
state, heads_alone, skipped = 0, 0, 0
for kind, t, fd, size in events:
    if kind == "read" and fd in client:
        skipped += state != 0
        start, state = t, 1
    elif state == 1 and kind == "write" and fd in upstream:
        sent, state = t, 2
    elif state in (2, 3) and kind == "read" and fd in upstream:
        answered = t
        if state == 2 and size == head_bytes:
            heads_alone, state = heads_alone + 1, 3
        else:
            state = 4
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
print(
    f"{name}: {n} requests ({heads_alone} with the mock's {head_bytes}-byte head read alone, {skipped} left out); "
    f"medians: {cells}; the client's TTFT p50 {ttft} ms (traced)"
)
