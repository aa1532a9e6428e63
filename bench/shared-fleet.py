#!/usr/bin/env python3
"""Shared limits' cost to Redis as the fleet grows: G gateways on one fresh redis-server, C = 8,
C + W closed-loop clients spread over the gateways (W of them waiting), fifo or fair share with
team quotas. For each binary (before/after, measured in the same run) and each point: Redis script
calls and Redis CPU (INFO cpu, user + sys) per served request, INFO commandstats, the most
requests the engine ran at once (C held?), mode changes (the gateways' logs), and the grant
latency where the gateway exports it (spillway_redis_grant_seconds: to the waiter learning of
it; spillway_redis_grant_to_upstream_seconds: to its first attempt upstream).

Usage: python3 bench/shared-fleet.py OUT.json LABEL=BIN [LABEL=BIN ...]
  env: GATEWAYS=1,3  WAITERS=0,16,128,1024  FAIRNESS=fifo,teams  SECONDS=8
"""
import json, os, re, signal, socket, subprocess, sys, threading, time, urllib.request

C = 8
KEYS = {"a": ("key-a", "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4"),
        "b": ("key-b", "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634")}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(url, timeout=2):
    try:
        return urllib.request.urlopen(url, timeout=timeout).read().decode()
    except Exception:
        return ""


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True).stdout


def info(port, section):
    out = {}
    for line in redis_cli(port, "info", section).splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.strip().split(":", 1)
            out[k] = v
    return out


def commandstats(port):
    stats = {}
    for k, v in info(port, "commandstats").items():
        f = dict(p.split("=") for p in v.split(","))
        stats[k.removeprefix("cmdstat_")] = (int(f["calls"]), float(f["usec"]))
    return stats


def redis_cpu(port):
    i = info(port, "cpu")
    return float(i["used_cpu_user"]) + float(i["used_cpu_sys"])


def histogram_quantiles(text, name, qs):
    buckets = []
    for line in text.splitlines():
        m = re.match(name + r'_bucket\{.*le="([^"]+)"\} (\S+)', line)
        if m:
            buckets.append((float(m.group(1)), float(m.group(2))))
    if not buckets:
        return None
    merged = {}
    for le, n in buckets:
        merged[le] = merged.get(le, 0) + n
    les = sorted(merged)
    total = merged[les[-1]]
    if total == 0:
        return None
    out = []
    for q in qs:
        for le in les:
            if merged[le] >= q * total:
                out.append(le)
                break
    return out, total


def run_point(bin_, gateways, waiters, fairness, seconds, workdir):
    os.makedirs(workdir, exist_ok=True)
    procs = []
    rport, eport = free_port(), free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen([bin_, "engine", "--listen", f"127.0.0.1:{eport}", "--preset", "tiny",
                                   "--model", "sim", "--max-num-seqs", "256"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    quota = "\n    rpm: 10000000\n    tpm: 10000000000" if fairness == "teams" else ""
    gws, logs = [], []
    for i in range(gateways):
        port = free_port()
        yaml = f"""listen: 127.0.0.1:{port}
server: {{ access_log: false }}
redis: {{ gateways: {gateways}, namespace: fleet }}
routes:
  - model: chat
    upstream_model: sim
    replicas: [http://127.0.0.1:{eport}]
    timeouts: {{ connect: 1s, first_token: 90s, stream_idle: 10s, total: 120s }}
    classes:
      - {{ name: shared, concurrency: {C}, queue: 4096, queue_wait: 60s, fairness: {fairness} }}
tenants:
  - team: a
    key_sha256: [ "{KEYS['a'][1]}" ]{quota}
  - team: b
    key_sha256: [ "{KEYS['b'][1]}" ]{quota}
"""
        path = f"{workdir}/gw{i}.yaml"
        open(path, "w").write(yaml)
        log = open(f"{workdir}/gw{i}.log", "w")
        env = dict(os.environ, SPILLWAY_REDIS_URL=f"redis://127.0.0.1:{rport}/")
        procs.append(subprocess.Popen([bin_, "serve", "--workers", "1", "--config", path], stdout=log,
                                      stderr=subprocess.STDOUT, env=env))
        gws.append(f"http://127.0.0.1:{port}")
        logs.append(f"{workdir}/gw{i}.log")
    # Measured once every gateway shares the limits (joining takes up to a second or two).
    deadline = time.time() + 15
    while time.time() < deadline and not all(
            re.search(r'^spillway_limits_mode\{mode="shared"\} 1', get(g + "/metrics"), re.M) for g in gws):
        time.sleep(0.1)
    time.sleep(0.5)
    redis_cli(rport, "config", "resetstat")
    # Mode changes are counted in the measured window only (start-up and shutdown log them too).
    offsets = [os.path.getsize(path) for path in logs]
    cpu0 = redis_cpu(rport)
    # Uncontended: C/2 clients in all; else C + W, spread over the gateways; team b a quarter.
    clients = C // 2 if waiters == 0 else C + waiters
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            m = re.search(r"^vllm:num_requests_running\S* (\S+)", get(f"http://127.0.0.1:{eport}/metrics"), re.M)
            if m:
                peak[0] = max(peak[0], int(float(m.group(1))))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    benches = []
    env = dict(os.environ, KA=KEYS["a"][0], KB=KEYS["b"][0])
    for i, g in enumerate(gws):
        n = clients // gateways + (1 if i < clients % gateways else 0)
        # Exactly `clients` in all: with more gateways than clients some get none, and team b
        # only where a gateway has four or more (it was at least one a and one b per gateway,
        # which made the uncontended point contended at G = 6).
        if n == 0:
            continue
        nb = n // 4
        tenants = ["--tenant", f"a=KA:clients={n - nb}"] + (["--tenant", f"b=KB:clients={nb}"] if nb else [])
        benches.append(subprocess.Popen(
            [bin_, "bench", "--url", g, "--model", "chat", *tenants, "--duration", f"{seconds}s",
             "--input-len", "64", "--output-len", "32", "--json", f"{workdir}/bench{i}.json"],
            stdout=open(f"{workdir}/bench{i}.txt", "w"), stderr=subprocess.STDOUT, env=env))
    t0 = time.time()
    for b in benches:
        b.wait()
    elapsed = time.time() - t0
    stop.set()
    sampler.join()
    cpu = redis_cpu(rport) - cpu0
    stats = commandstats(rport)
    served, grant = 0, None
    texts = []
    for g in gws:
        text = get(g + "/metrics")
        texts.append(text)
        for line in text.splitlines():
            if line.startswith("spillway_requests_total{") and 'status="200"' in line:
                served += int(float(line.rsplit(" ", 1)[1]))
    q = histogram_quantiles("\n".join(texts), "spillway_redis_grant_seconds", [0.5, 0.99])
    if q:
        grant = {"p50_s": q[0][0], "p99_s": q[0][1], "grants": q[1]}
    # From the release that handed the slot to the waiter's first attempt upstream (gateways
    # that export it).
    q = histogram_quantiles("\n".join(texts), "spillway_redis_grant_to_upstream_seconds", [0.5, 0.99])
    to_upstream = {"p50_s": q[0][0], "p99_s": q[0][1], "grants": q[1]} if q else None
    window = [open(path).read()[o:] for path, o in zip(logs, offsets)]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    changes = sum(1 for text in window for line in text.splitlines()
                  if "Redis is unreachable" in line or "limits are shared" in line)
    scripts = sum(c for k, (c, _) in stats.items() if k in ("evalsha", "eval", "fcall"))
    calls = sum(c for c, _ in stats.values())
    script_usec = sum(u for k, (_, u) in stats.items() if k in ("evalsha", "eval", "fcall"))
    return {
        "gateways": gateways, "waiters": waiters, "fairness": fairness, "clients": clients,
        "seconds": round(elapsed, 1), "served": served,
        "served_per_s": round(served / elapsed, 1),
        "script_calls_per_served": round(scripts / max(served, 1), 2),
        "redis_calls_per_served": round(calls / max(served, 1), 2),
        # Scripts' own µs (the commands they run are in it, and counted again on their own lines).
        "redis_script_us_per_served": round(script_usec / max(served, 1), 1),
        "redis_cpu_us_per_served": round(cpu * 1e6 / max(served, 1), 1),
        "engine_running_peak": peak[0], "mode_change_lines": changes, "grant": grant,
        "grant_to_upstream": to_upstream,
        "commandstats": {k: {"calls": c, "usec": u} for k, (c, u) in stats.items()},
    }


def main():
    out, bins = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    gateways = [int(x) for x in os.environ.get("GATEWAYS", "1,3").split(",")]
    waiters = [int(x) for x in os.environ.get("WAITERS", "0,16,128,1024").split(",")]
    fairness = os.environ.get("FAIRNESS", "fifo,teams").split(",")
    seconds = int(os.environ.get("SECONDS_EACH", "8"))
    rows = []
    for f in fairness:
        for g in gateways:
            for w in waiters:
                # Before and after side by side, point by point: the machine's noise hits both.
                for label, bin_ in bins:
                    r = run_point(bin_, g, w, f, seconds, f"target/shared-fleet/{label}-{f}-g{g}-w{w}")
                    r["build"] = label
                    rows.append(r)
                    print(f"{label:8} {f:5} G={g} W={w:5} served={r['served']:6} "
                          f"({r['served_per_s']}/s) scripts/req={r['script_calls_per_served']:7} "
                          f"redis µs/req scripts={r['redis_script_us_per_served']:7} cpu={r['redis_cpu_us_per_served']:7} "
                          f"peak={r['engine_running_peak']} modes={r['mode_change_lines']} grant={r['grant']} "
                          f"to_upstream={r['grant_to_upstream']}",
                          flush=True)
                    json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
