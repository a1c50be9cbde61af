#!/usr/bin/env python3
"""Syscalls per request: tollgate against nginx and HAProxy, on loopback.

Method
------
The fixture and the contenders are benches/load.py's: an nginx upstream
answering `200 ok`, nginx `proxy_pass` (keep-alive upstream, access log to a
file), HAProxy (`nbthread 1`, its HTTP log line through stdout to a file)
and tollgate (`TOKIO_WORKER_THREADS=1`, `RUST_LOG=info`, its access log on
stderr to a file) with hyper's HTTP/1.1 or its own (`server.http1:
native`), with no limits and on the deny path (load.py's: one key far
over its limit in the Redis store, answered 429 from the gateway's deny
cache). For the
deny path nginx (`limit_req`, `limit_req_status 429`) and HAProxy
(`http-request deny deny_status 429`) refuse every request too.

For each contender, after a one-second warm-up, `perf stat` counts the
syscalls of all the contender's threads (tracepoints `syscalls:sys_enter_*`
and `raw_syscalls:sys_enter` for the total, which costs the traced process
little, unlike `strace`) while `wrk -t1 -c50` sends load for DURATION
seconds; every count is divided by the requests wrk saw answered, and so
are the user and system CPU times of those threads (/proc/PID/stat) in
the same window (perf's tracepoints add a little to the system time of
every contender alike). Reads
that returned EAGAIN are counted at the syscall's exit (`ret == -11`).
Context switches are perf's software event, and per thread name
(voluntary: the thread waited; involuntary: it was preempted) from
/proc/PID/task/TID/status, which shows which threads wake per request
(tollgate's worker, `tollgate-log`, tokio's blocking pool). Clock reads go through the
vDSO and are no syscalls; they are not seen here.

Rounds are interleaved (A B C ... A B C ...); each figure is the median
over them.

Usage: python3 benches/syscalls.py [--rounds 3] [--duration 3]
       [--binary PATH] [--baseline PATH] [--only NAME,...] [--no-access-log]
With --baseline, the tollgate rows are measured for that binary too (rows
named "... (baseline)"), in the same rounds.
Needs perf (Debian's linux-perf), wrk, nginx, haproxy and redis-server;
`perf_event_paranoid` must allow tracepoints (run as root, or set it to -1).
Traffic goes only to 127.0.0.1.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402  (benches/load.py: the fixture and the contenders)

# The syscalls shown in their own columns; the rest are summed in "other".
READS = ["read", "readv", "recvfrom", "recvmsg"]
WRITES = ["write", "writev", "sendto", "sendmsg"]
POLLS = ["epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl"]
THREADS = ["futex", "sched_yield", "nanosleep", "clock_nanosleep"]
CONNS = ["accept4", "close", "setsockopt", "getsockopt", "ioctl"]
MEMORY = ["mmap", "munmap", "madvise", "brk", "mprotect"]
NAMED = READS + WRITES + POLLS + THREADS + CONNS + MEMORY


def events():
    evs = ["raw_syscalls:sys_enter", "context-switches"]
    evs += [f"syscalls:sys_enter_{n}" for n in NAMED]
    # Reads that found nothing: each read syscall's exit with -EAGAIN.
    eagain = [(f"syscalls:sys_exit_{n}", "ret == -11") for n in READS]
    return evs, eagain


def perf_argv(pids, out):
    evs, eagain = events()
    argv = ["perf", "stat", "-x", ",", "-o", out, "--no-big-num"]
    for e in evs:
        argv += ["-e", e]
    for e, f in eagain:
        argv += ["-e", e, "--filter", f]
    argv += ["-p", ",".join(str(p) for p in pids)]
    return argv


def parse_perf(path):
    """{event name: count} from perf stat's CSV output; an EAGAIN exit
    counts under `eagain_<call>`."""
    counts = {}
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 3 or line.startswith("#"):
                continue
            try:
                value = int(parts[0])
            except ValueError:
                value = 0  # <not counted> / <not supported>
            ev = parts[2]
            if ev.startswith("syscalls:sys_exit_"):
                key = "eagain_" + ev[len("syscalls:sys_exit_"):]
            elif ev.startswith("syscalls:sys_enter_"):
                key = ev[len("syscalls:sys_enter_"):]
            elif ev == "raw_syscalls:sys_enter":
                key = "total"
            else:
                key = ev
            counts[key] = counts.get(key, 0) + value
    return counts


def cpu_split(pids):
    """(user, system) clock ticks of pids, from /proc/PID/stat."""
    user = system = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return user, system


def switches(pids):
    """{thread name: [voluntary, involuntary]} context switches so far,
    summed over the threads of that name, from /proc/PID/task/TID/status."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            name = status.get("Name", "?").strip()
            counts = out.setdefault(name, [0, 0])
            counts[0] += int(status.get("voluntary_ctxt_switches", "0"))
            counts[1] += int(status.get("nonvoluntary_ctxt_switches", "0"))
    return out


def measure(pids, ports, seconds, script, tmp):
    """Syscalls per request while wrk runs on ports for seconds, and the
    user and system CPU microseconds per request."""
    out = os.path.join(tmp, "perf.csv")
    perf = subprocess.Popen(perf_argv(pids, out), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # perf attaches before the load starts
    u0, s0 = cpu_split(pids)
    w0 = switches(pids)
    reqs, rps, _, non2xx = load.run_wrk(ports, seconds, script)
    u1, s1 = cpu_split(pids)
    w1 = switches(pids)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    counts = parse_perf(out)
    per = {k: v / max(reqs, 1) for k, v in counts.items()}
    for name, (vol, invol) in w1.items():
        vol0, invol0 = w0.get(name, (0, 0))
        per[f"cs_vol {name}"] = (vol - vol0) / max(reqs, 1)
        per[f"cs_invol {name}"] = (invol - invol0) / max(reqs, 1)
    per["user_us"] = (u1 - u0) / load.TICK * 1e6 / max(reqs, 1)
    per["sys_us"] = (s1 - s0) / load.TICK * 1e6 / max(reqs, 1)
    per["rps"] = rps
    per["non2xx"] = non2xx / max(reqs, 1)
    return per


def row(name, m):
    def s(keys):
        return sum(m.get(k, 0.0) for k in keys)

    named = s(NAMED)
    eagain = s("eagain_" + n for n in READS)
    return (f"{name:34} {m.get('total', 0):6.2f} {s(READS):6.2f} {eagain:6.2f} {s(WRITES):6.2f} "
            f"{s(['epoll_wait', 'epoll_pwait', 'epoll_pwait2']):6.2f} {m.get('epoll_ctl', 0):6.2f} "
            f"{m.get('futex', 0):6.2f} {s(['nanosleep', 'clock_nanosleep', 'sched_yield']):6.2f} "
            f"{s(CONNS + MEMORY):6.2f} {m.get('total', 0) - named:6.2f} "
            f"{m.get('context-switches', 0):6.2f} {m['non2xx']:5.2f} {m['rps']:8.0f} "
            f"{m['user_us']:6.1f} {m['sys_us']:6.1f}")


def detail(name, m):
    keys = [k for k in NAMED + ["eagain_" + n for n in READS] if m.get(k, 0) >= 0.001]
    keys += sorted(k for k in m if k.startswith("cs_") and m[k] >= 0.001)
    return f"{name}: " + ", ".join(f"{k} {m[k]:.3f}" for k in keys)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3)
    ap.add_argument("--binary", default=os.path.join(load.ROOT, "target", "release", "tollgate"))
    ap.add_argument("--baseline", help="a second tollgate binary, measured in the same rounds")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-access-log", action="store_true")
    args = ap.parse_args()
    logs = not args.no_access_log
    tmp = tempfile.mkdtemp(prefix="tollgate-syscalls-")
    started = []
    try:
        upstream, up_port, _redis, redis_port, _keys = load.start_fixture(tmp, started)
        deny_lua = os.path.join(tmp, "deny.lua")
        with open(deny_lua, "w") as f:
            f.write('wrk.headers["x-api-key"] = "hot"\n')
        contenders = []  # (name, ports, pids_fn, wrk script)
        only = set(args.only.split(",")) if args.only else None

        def wanted(name):
            return only is None or name in only

        def add_nginx(name, body, script=None):
            if not wanted(name):
                return
            port = load.free_port()
            n = load.Nginx(tmp, name, body.replace("PORT", str(port)), access_log=logs)
            started.append(n)
            load.wait_port(port)
            # The worker only: the master sleeps.
            contenders.append((name, [port], lambda: load.children(n.proc.pid), script))

        add_nginx("nginx proxy_pass", load.nginx_proxy_pass(up_port, "PORT"))
        add_nginx("nginx deny",
                  "limit_req_zone $http_x_api_key zone=d:1m rate=1r/m;\n"
                  "server { listen 127.0.0.1:PORT; location / { limit_req zone=d nodelay; "
                  f"limit_req_status 429; limit_req_log_level info; proxy_pass http://127.0.0.1:{up_port}; }} }}",
                  deny_lua)
        def add_haproxy(name, rules="", script=None):
            if not wanted(name):
                return
            port = load.free_port()
            h = load.Haproxy(tmp, name, up_port, port, access_log=logs, rules=rules)
            started.append(h)
            load.wait_port(port)
            contenders.append((name, [port], h.pids, script))

        add_haproxy("haproxy")
        add_haproxy("haproxy deny", "  http-request deny deny_status 429\n", deny_lua)

        def add_tollgate(name, binary, limits, script, http1, redis=None):
            if not wanted(name):
                return
            port = load.free_port()
            cfg = os.path.join(tmp, f"{name.replace(' ', '_').replace('(', '').replace(')', '')}.yaml")
            load.tollgate_config(cfg, port, up_port, limits, redis, http1=http1)
            p = load.Process([binary, "--config", cfg],
                             env={"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "info" if logs else "warn"},
                             stderr=cfg + ".log" if logs else None)
            started.append(p)
            load.wait_port(port)
            pid = p.proc.pid
            contenders.append((name, [port], lambda: [pid], script))

        tiny = "{ name: tiny, key: api_key, limit: 1, window: 1h }"
        binaries = [("", args.binary)] + ([(" (baseline)", args.baseline)] if args.baseline else [])
        for suffix, binary in binaries:
            for http1 in ("hyper", "native"):
                tag = "tollgate" if http1 == "hyper" else "tollgate native"
                add_tollgate(f"{tag} no limits{suffix}", binary, "", None, http1)
                add_tollgate(f"{tag} deny path{suffix}", binary, tiny, deny_lua, http1, redis_port)

        results = {c[0]: [] for c in contenders}
        for r in range(args.rounds):
            for name, ports, pids, script in contenders:
                load.run_wrk(ports, 1, script)  # warm-up
                results[name].append(measure(pids(), ports, args.duration, script, tmp))
                print(f"round {r + 1}: {name}: {results[name][-1]['rps']:.0f} req/s", file=sys.stderr)

        med = {n: {k: statistics.median(x.get(k, 0.0) for x in rs) for k in set().union(*rs)}
               for n, rs in results.items() if rs}
        print(f"\nSyscalls per request: {args.rounds} interleaved rounds of {args.duration}s, "
              f"wrk -t1 -c50, perf stat on all the contender's threads; medians"
              f"{'' if logs else '; no access log'}\n")
        hdr = (f"{'contender':34} {'total':>6} {'reads':>6} {'EAGAIN':>6} {'writes':>6} "
               f"{'ep_wait':>6} {'ep_ctl':>6} {'futex':>6} {'sleep':>6} {'conn+mm':>6} {'other':>6} "
               f"{'ctxsw':>6} {'non2xx':>5} {'req/s':>8} {'usr us':>6} {'sys us':>6}")
        print(hdr)
        print("-" * len(hdr))
        for n, m in med.items():
            print(row(n, m))
        print()
        for n, m in med.items():
            print(detail(n, m))
    finally:
        load.stop_all(started, tmp)


if __name__ == "__main__":
    main()
