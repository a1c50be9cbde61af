#!/usr/bin/env python3
"""Redis decision profile: what one decision costs Redis and the gateway.

The Redis contender of `load.py` (10,000 API keys chosen at random, limits
high enough that every request is admitted), with the figures that say
where a Redis decision's cost goes:

* Redis CPU per request: utime+stime of redis-server over the run divided
  by the requests served (what `load.py` calls "redis us/req");
* from `INFO commandstats` before and after each run: top-level `EVALSHA`
  calls, hence requests per call (the batch size), and `usec_per_call` of
  `EVALSHA` (the script's time, the commands it runs included, without
  reading the request or writing the reply), divided by the batch size:
  the script's µs per decision;
* the commands the script ran inside Redis per decision (`GET`, `SET`,
  `MGET`, ...), counted from the same stats;
* gateway CPU per request, requests/s and p99, with ratios to nginx
  `proxy_pass` in the same run.

Two shapes: one `sliding_window` limit per request (`1 limit`, the
`load.py` contender) and two on the same identity (`2 limits`: a minute and
an hour). Several binaries can be compared in one run (`--binary
before=/path/to/old/tollgate`): every contender runs once per round, the
rounds interleaved (A B C ... A B C ...), medians reported, as in `load.py`.
They share one redis-server; the limits are far from reached, so sharing
counters changes no decision.

With --callgrind REV,... it measures instead what the decision script
itself costs, in instructions, which unlike CPU time repeat to the last
digit on a shared machine: the script of each git revision (arith.lua and
limits.lua as that revision has them) runs in a redis-server under
valgrind's callgrind, driven by redis-benchmark with one request of 12
decisions at a time over 2,000 random keys (`EVALSHA` with the arguments
that revision's header asks for), and the instructions redis-server spends
per call are divided by 12. `floor` is a script that only does what every
decision must: one `GET` and one `SET ... PX` per key.

With --memory each binary also runs the `1 limit` shape on the in-process
store: the difference is what deciding in Redis costs the gateway.

Usage: python3 benches/redis_profile.py [--rounds 3] [--duration 3]
         [--binary NAME=PATH ...] [--no-build] [--shapes "1 limit,2 limits"]
         [--memory]
       python3 benches/redis_profile.py --callgrind main,HEAD
Without --binary it builds and uses this checkout's release binary.
"""

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import shutil
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ beside the benches
import load  # noqa: E402  (the helpers of the load benchmark)

SHAPES = {
    "1 limit": "{ name: all, key: api_key | ip, limit: 100000000, window: 1h }",
    "2 limits": "{ name: minute, key: api_key | ip, limit: 100000000, window: 1m }, "
                "{ name: hour, key: api_key | ip, limit: 100000000, window: 1h }",
}


def commandstats(port):
    """{command: (calls, usec)} from INFO commandstats."""
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "commandstats"],
                         capture_output=True, text=True).stdout
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^cmdstat_(\w+):calls=(\d+),usec=(\d+)", out, re.M)}


FLOOR = """local out, o = {}, 0
for i = 1, #KEYS do
  redis.pcall('GET', KEYS[i])
  redis.call('SET', KEYS[i], '29463820:0:12', 'PX', '3600000')
  out[o + 1] = 1 out[o + 2] = 1 out[o + 3] = 99 out[o + 4] = 3600000 out[o + 5] = 0
  o = o + 5
end
return out
"""


def script_of(rev):
    """The decision script of a git revision, and whether its arguments
    are runs (shape, now, count) or a shape index per request."""
    if rev == "floor":
        return FLOOR, True
    text = "".join(subprocess.run(["git", "show", f"{rev}:src/store/redis/{f}"], cwd=load.ROOT,
                                  capture_output=True, text=True, check=True).stdout
                   for f in ("arith.lua", "limits.lua"))
    return text, "runs of requests" in text


def callgrind(revs, batch=12, calls=1000):
    """Instructions redis-server spends per decision, per revision's script."""
    tmp = tempfile.mkdtemp(prefix="tollgate-cg-")
    port = load.free_port()
    redis = load.Process(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p",
                          "redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                          "--dir", tmp])
    cli = lambda *a, **kw: subprocess.run(["redis-cli", "-p", str(port)] + list(a), capture_output=True,  # noqa: E731
                                          text=True, **kw).stdout.strip()
    try:
        load.wait_port(port, timeout=60)

        def instructions():
            subprocess.run(["callgrind_control", "-d", str(redis.proc.pid)], capture_output=True)
            time.sleep(0.5)
            newest = max(glob.glob(f"{tmp}/cg.*"), key=os.path.getmtime)
            with open(newest) as f:
                return int(re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M).group(1))

        print(f"\nInstructions redis-server spends per decision, calls of {batch} decisions "
              f"(valgrind callgrind, {calls} calls):\n")
        for rev in revs + ["floor"]:
            script, runs = script_of(rev)
            sha = cli("-x", "SCRIPT", "LOAD", input=script)
            for n in (1, 2):
                now = str(int(time.time() * 1000))
                keys = [f"tg:{{__rand_int__}}l{j}" for _ in range(batch) for j in range(n)]
                limits = []
                for j in range(n):
                    limits += ["0", "100000000", str(60000 * (1 + 59 * j)), "1", "100000000"]
                if runs:
                    argv = ["1", str(n)] + limits + ["1", now, str(batch)]
                else:
                    argv = ["1", str(n), now] + limits + ["1"] * batch
                bench = ["redis-benchmark", "-p", str(port), "-r", "2000", "-c", "1", "-q",
                         "EVALSHA", sha, str(len(keys))] + keys + argv
                cli("FLUSHALL")  # every revision starts from the same keys
                subprocess.run(bench[:1] + ["-n", "300"] + bench[1:], capture_output=True)  # keys exist
                subprocess.run(["callgrind_control", "-z", str(redis.proc.pid)], capture_output=True)
                time.sleep(0.3)
                subprocess.run(bench[:1] + ["-n", str(calls)] + bench[1:], capture_output=True)
                per_call = instructions() / calls
                print(f"  {rev:12} {n} limit{'s' if n > 1 else ' '}  {per_call / batch:9,.0f} per decision "
                      f"({per_call:,.0f} per call)")
    finally:
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3)
    ap.add_argument("--binary", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--callgrind", default="", metavar="REV,...",
                    help="instructions per decision of each git revision's script instead")
    ap.add_argument("--memory", action="store_true",
                    help="also each binary with the in-process store (1 limit): what Redis adds")
    args = ap.parse_args()

    load.ensure_tools()
    if args.callgrind:
        callgrind([r.strip() for r in args.callgrind.split(",") if r.strip()])
        return
    binaries = []
    for b in args.binary:
        name, _, path = b.partition("=")
        binaries.append((name, os.path.abspath(path)))
    if not binaries:
        if not args.no_build:
            subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=load.ROOT, check=True)
        binaries.append(("tollgate", os.path.join(load.ROOT, "target", "release", "tollgate")))
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]

    tmp = tempfile.mkdtemp(prefix="tollgate-rprof-")
    started = []
    try:
        _, up_port, redis, redis_port, keys_lua = load.start_fixture(tmp, started)

        contenders = []  # (name, port, pids, uses_redis)
        port = load.free_port()
        ngx = load.Nginx(tmp, "nginx proxy_pass", load.nginx_proxy_pass(up_port, port))
        started.append(ngx)
        load.wait_port(port)
        contenders.append(("nginx proxy_pass", port, ngx.pids, False))
        runs = [(shape, True) for shape in shapes] + ([("1 limit", False)] if args.memory else [])
        for shape, uses_redis in runs:
            for bname, path in binaries:
                port = load.free_port()
                name = f"{bname}, {shape}" if uses_redis else f"{bname}, memory"
                cfg = os.path.join(tmp, re.sub(r"\W+", "_", name) + ".yaml")
                load.tollgate_config(cfg, port, up_port, SHAPES[shape], redis_port if uses_redis else None)
                p = load.Process([path, "--config", cfg],
                                 env={"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "warn"})
                started.append(p)
                load.wait_port(port)
                contenders.append((name, port, p.pids, uses_redis))

        results = {c[0]: [] for c in contenders}
        for r in range(args.rounds):
            for name, port, pids, uses_redis in contenders:
                script = None if name == "nginx proxy_pass" else keys_lua
                load.run_wrk([port], 1, script)  # warm-up: pools, script load, keys
                p0, r0, s0 = load.cpu_ticks(pids()), load.cpu_ticks(redis.pids()), commandstats(redis_port)
                reqs, rps, p99, _ = load.run_wrk([port], args.duration, script)
                p1, r1, s1 = load.cpu_ticks(pids()), load.cpu_ticks(redis.pids()), commandstats(redis_port)
                us = lambda t: (t / load.TICK) * 1e6 / max(reqs, 1)  # noqa: E731
                delta = {c: (s1[c][0] - s0.get(c, (0, 0))[0], s1[c][1] - s0.get(c, (0, 0))[1])
                         for c in s1}
                calls, usec = delta.get("evalsha", (0, 0))
                inner = {c: n / max(reqs, 1) for c, (n, _) in delta.items()
                         if c not in ("evalsha", "eval", "info", "ping", "script", "hget")
                         and n >= 0.005 * reqs}
                results[name].append({
                    "cpu": us(p1 - p0), "redis_cpu": us(r1 - r0) if uses_redis else 0.0,
                    "rps": rps, "p99": p99,
                    "batch": reqs / calls if calls else 0.0,
                    "usec_call": usec / calls if calls else 0.0,
                    "usec_dec": usec / reqs if uses_redis else 0.0,
                    "inner": inner,
                })
                print(f"round {r + 1}: {name}: {rps:.0f} req/s, p99 {p99:.2f} ms", file=sys.stderr)

        if not args.rounds:
            return
        base = {k: statistics.median(x[k] for x in results["nginx proxy_pass"])
                for k in ("cpu", "rps", "p99")}
        print(f"\n{args.rounds} interleaved rounds of {args.duration}s, wrk -t1 -c50, 10,000 API keys; "
              f"medians; ratios to nginx proxy_pass\n")
        hdr = (f"{'contender':24} {'CPU us/req':>10} {'redis us/req':>12} {'evalsha us/call':>15} "
               f"{'req/call':>8} {'script us/dec':>13} {'req/s':>8} {'p99 ms':>7} "
               f"{'CPU x':>6} {'req/s x':>7} {'p99 x':>6}")
        print(hdr)
        print("-" * len(hdr))
        for name, rs in results.items():
            m = {k: statistics.median(x[k] for x in rs) for k in rs[0] if k != "inner"}
            total = m["cpu"] + m["redis_cpu"]
            print(f"{name:24} {m['cpu']:10.1f} {m['redis_cpu']:12.1f} {m['usec_call']:15.1f} "
                  f"{m['batch']:8.1f} {m['usec_dec']:13.2f} {m['rps']:8.0f} {m['p99']:7.2f} "
                  f"{total / base['cpu']:6.2f} {m['rps'] / base['rps']:7.2f} {m['p99'] / base['p99']:6.2f}")
        print("\ncommands run inside the script, per decision (last round):")
        for name, rs in results.items():
            if rs[-1]["inner"]:
                inner = ", ".join(f"{c.upper()} {n:.2f}" for c, n in sorted(rs[-1]["inner"].items()))
                print(f"  {name:24} {inner}")
        print("\nCPU x is (gateway + redis-server CPU) / nginx CPU per request.")
    finally:
        load.stop_all(started, tmp)


if __name__ == "__main__":
    main()
