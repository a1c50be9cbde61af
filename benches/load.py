#!/usr/bin/env python3
"""Load benchmark: tollgate against its contenders, in one run, on loopback.

Method
------
An nginx upstream (`return 200`, one worker) answers every request. Each
contender sits in front of it (or is it) and receives the same load from
`wrk -t1 -c50` for DURATION seconds. Contenders run one at a time, in
interleaved rounds (A B C ... A B C ...), so slow drifts of this shared
machine hit all of them alike. For every run the script records:

* CPU time of the proxy process(es) (utime+stime from /proc/PID/stat) over
  the run divided by the requests served: CPU microseconds per request. This
  holds within a few percent on a noisy machine where requests/s does not;
* the same for redis-server, when the contender uses it;
* requests/s and p99 latency as wrk reports them;
* for `sync` mode, CPU (its own and Redis's) and calls until its last
  exchange of what the run admitted (up to 10 s after the run; `tails`);
* Redis calls per request: EVALSHA/EVAL (and HGET) counts from INFO
  commandstats before and after (commands a script runs inside Redis are
  not round trips and are not counted).

Both sides do the same work: by default each proxy under test writes one
access-log line per request to a file (nginx `access_log`, tollgate's
access log on stderr at `RUST_LOG=info`); `--no-access-log` turns both off.
The upstream nginx logs nothing. The nginx proxies send the upstream the
request tollgate sends: the client's `Host`, `X-Forwarded-For`,
`X-Forwarded-Proto` and `X-Forwarded-Host` set, a client's `Forwarded`
dropped.

Each figure is the median over the rounds; ratios are to nginx `proxy_pass`
measured in the same run. One worker/thread per proxy
(`TOKIO_WORKER_THREADS=1` for tollgate, `worker_processes 1` for nginx,
`nbthread 1` for HAProxy).

Contenders: direct upstream; nginx proxy_pass (keep-alive upstream); nginx
limit_req (limit high enough that all pass); HAProxy (`nbthread 1`, keep-alive
upstream connections reused, the same forwarded headers, its HTTP log line
per request written to a file through its stdout); tollgate without limits;
tollgate memory store; tollgate Redis store with 10,000 distinct keys all
admitted, exact (every decision in Redis) and in `sync` mode (decided in
process, counts exchanged with Redis every 100 ms); tollgate deny path (one
key far over its limit); and the two Redis modes again as a fleet of three
gateways over the one Redis, each gateway getting a third of the
connections from its own wrk at the same time (requests and CPU summed over
the three, p99 the worst of them); then no limits, the memory store and the
deny path again with `server: { http1: native }` (tollgate's own HTTP/1.1
server and upstream client in place of hyper's).

Below the table, the performance targets beside this run's ratios, each marked
when met.

gRPC over h2c, in rounds of their own after the HTTP/1.1 ones: an nginx
upstream speaking cleartext HTTP/2 (`listen ... http2`, `return 200`),
nginx `grpc_pass` (keep-alive upstream connections) and tollgate with an
`h2c://` upstream (no limits) in front of it, and the upstream direct;
`h2load -c50 -m1` sends unary calls (POST, `content-type:
application/grpc`, `te: trailers`, one 5-byte message). Same figures as
above, mean latency instead of p99 (h2load reports no percentiles), ratios
to nginx `grpc_pass`. (Neither proxy reads the messages, so an upstream
that answers `200 ok` measures the proxies as well as a gRPC server would,
without a server's own cost in the figures.)

After the tables: Redis memory per identity for one sliding_window limit,
from INFO memory (used_memory) before and after 100,000 distinct API keys
each made a request through tollgate, divided by the keys created; taken
after a warm-up on 1,000 other keys, so what Redis allocates once (script
cache, client buffers) is not counted per identity.

Usage: python3 benches/load.py [--rounds 3] [--duration 5] [--only NAME,...]
       [--no-access-log] [--binary PATH] [--baseline PATH] [--no-build]
(`--baseline PATH`: the tollgate no limits, memory and deny path rows,
hyper and native, again for a second binary, in the same rounds, named
"... (baseline)", to compare two builds on the same machine state)
(`--only "redis memory" --rounds 0` measures only the memory figure;
`--only grpc` only the gRPC rows)
Needs wrk, nginx, haproxy, redis-server and h2load (Debian's nghttp2-client); installs
them with apt-get when missing.
Traffic goes only to 127.0.0.1.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def ensure_tools():
    missing = [p for p, b in (("wrk", "wrk"), ("nginx", "nginx"), ("haproxy", "haproxy"),
                              ("redis-server", "redis-server"),
                              ("nghttp2-client", "h2load"))
               if shutil.which(b) is None and not os.path.exists("/usr/sbin/" + b)]
    if missing:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        print(f"installing {' '.join(missing)} with apt-get", file=sys.stderr)
        subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-qq"] + missing, check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def nginx_bin():
    return shutil.which("nginx") or "/usr/sbin/nginx"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


class Nginx:
    """An nginx instance with one worker, from a generated config."""

    def __init__(self, tmp, name, body, access_log=False):
        self.dir = os.path.join(tmp, re.sub(r"\W+", "_", name))
        log = f"access_log {self.dir}/access.log;" if access_log else "access_log off;"
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""
worker_processes 1;
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  {log}
  client_body_temp_path {self.dir};
  proxy_temp_path {self.dir};
  fastcgi_temp_path {self.dir};
  uwsgi_temp_path {self.dir};
  scgi_temp_path {self.dir};
  {body}
}}
""")
        self.proc = subprocess.Popen([nginx_bin(), "-c", conf, "-p", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pids(self):
        return [self.proc.pid] + children(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Haproxy:
    """An HAProxy instance with one thread in front of up_port, sending the
    upstream what tollgate and the nginx proxies send it; with access_log,
    one HTTP log line per request, written through its stdout to a file;
    rules are more frontend lines (each ending in a newline)."""

    def __init__(self, tmp, name, up_port, port, access_log=False, rules=""):
        self.dir = os.path.join(tmp, re.sub(r"\W+", "_", name))
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "haproxy.cfg")
        log_global = "  log stdout format raw local0\n" if access_log else ""
        log_defaults = "  log global\n  option httplog\n" if access_log else ""
        with open(conf, "w") as f:
            f.write(f"""global
  nbthread 1
  maxconn 4096
{log_global}
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
{log_defaults}
frontend fe
  bind 127.0.0.1:{port}
  option forwardfor
  http-request set-header X-Forwarded-Proto http
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-request del-header Forwarded
{rules}  default_backend up

backend up
  server up 127.0.0.1:{up_port}
""")
        self.log = open(os.path.join(self.dir, "access.log"), "ab")
        self.proc = subprocess.Popen([shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", conf],
                                     stdout=self.log, stderr=subprocess.DEVNULL)

    def pids(self):
        return [self.proc.pid] + children(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


class Process:
    def __init__(self, argv, env=None, stderr=None):
        err = open(stderr, "ab") if stderr else subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err,
                                     env=dict(os.environ, **(env or {})))

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop_all(started, tmp):
    """Stops what a run started, last first, and removes its directory."""
    for p in reversed(started):
        try:
            p.stop()
        except Exception:  # best effort cleanup
            pass
    shutil.rmtree(tmp, ignore_errors=True)


def redis_calls(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "commandstats"],
                         capture_output=True, text=True).stdout
    # Commands run inside a script are counted too; a client round trip is
    # one EVALSHA/EVAL or one plain command, so count those at the top level.
    total = 0
    for m in re.finditer(r"^cmdstat_(\w+):calls=(\d+)", out, re.M):
        if m.group(1) in ("evalsha", "eval", "hget"):
            total += int(m.group(2))
    return total


def wrk_argv(port, seconds, script, connections):
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if script:
        argv += ["-s", script]
    argv.append(f"http://127.0.0.1:{port}/bench")
    return argv


def parse_wrk(out):
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return reqs, rps, float(p99.group(1)) * scale, int(non2xx.group(1)) if non2xx else 0


def run_wrk(ports, seconds, script):
    """wrk against each of ports at once, 50 connections split among them:
    requests, requests/s and non-2xx summed, the worst p99."""
    each = max(1, 50 // len(ports))
    procs = [subprocess.Popen(wrk_argv(p, seconds, script, each), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for p in ports]
    runs = [parse_wrk(p.communicate()[0]) for p in procs]
    return (sum(r[0] for r in runs), sum(r[1] for r in runs), max(r[2] for r in runs),
            sum(r[3] for r in runs))


# What nginx adds to a proxied request so that the upstream gets the
# request tollgate sends: the client's Host, X-Forwarded-For/-Proto/-Host
# set, a client's Forwarded dropped; keep-alive to the upstream.
FORWARD = ("proxy_http_version 1.1; proxy_set_header Connection \"\"; "
           "proxy_set_header Host $http_host; "
           "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; "
           "proxy_set_header X-Forwarded-Proto $scheme; "
           "proxy_set_header X-Forwarded-Host $host; "
           "proxy_set_header Forwarded \"\";")


def nginx_proxy_pass(up_port, port, limit_req=False):
    """The http-block body of the nginx contender on port in front of
    up_port; with limit_req, a limit high enough that all pass."""
    zone, limit = "", ""
    if limit_req:
        zone = "limit_req_zone $binary_remote_addr zone=z:10m rate=1000000r/s;\n"
        limit = "limit_req zone=z burst=1000000 nodelay; "
    return (f"{zone}upstream up {{ server 127.0.0.1:{up_port}; keepalive 64; }}\n"
            f"server {{ listen 127.0.0.1:{port}; location / {{ {limit}proxy_pass http://up; {FORWARD} }} }}")


def start_fixture(tmp, started):
    """What every load run stands on: the upstream (an nginx answering 200),
    a redis-server, and the wrk script of 10,000 API keys at random. Returns
    (upstream, its port, redis, its port, the script's path)."""
    up_port = free_port()
    upstream = Nginx(tmp, "upstream", f"server {{ listen 127.0.0.1:{up_port}; location / {{ return 200 'ok'; }} }}")
    started.append(upstream)
    wait_port(up_port)
    redis_port = free_port()
    redis = Process(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no",
                     "--dir", tmp])
    started.append(redis)
    wait_port(redis_port)
    keys_lua = os.path.join(tmp, "keys.lua")
    with open(keys_lua, "w") as f:
        f.write('math.randomseed(42)\nrequest = function()\n'
                '  return wrk.format(nil, nil, { ["x-api-key"] = "k" .. math.random(1, 10000) })\nend\n')
    return upstream, up_port, redis, redis_port, keys_lua


def tollgate_config(path, port, upstream, limits, redis_port=None, sync=None, http1="hyper"):
    store = f"server: {{ http1: {http1} }}\n"
    if redis_port:
        extra = f", sync: {sync}" if sync else ""
        store += f'store: {{ redis: {{ url: "redis://127.0.0.1:{redis_port}", timeout: 100ms{extra} }}, on_error: local }}\n'
    with open(path, "w") as f:
        f.write(f"""listen: 127.0.0.1:{port}
{store}routes:
  - name: bench
    match: {{ path_prefix: / }}
    upstream: http://127.0.0.1:{upstream}
    limits: [{limits}]
""")


def run_h2load(port, seconds, body):
    """Unary gRPC calls at port over h2c for seconds: requests, requests/s,
    mean latency (ms) and the non-2xx answers."""
    argv = ["h2load", "-t1", "-c50", "-m1", "-D", str(seconds), "-d", body,
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://127.0.0.1:{port}/demo.Echo/Say"]
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    reqs = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", out).group(1))
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))
    m = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    mean = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    ok = int(re.search(r"status codes: (\d+) 2xx", out).group(1))
    return reqs, rps, mean, reqs - ok


def grpc_rounds(args, binary, tmp, started, logs):
    """The gRPC rows: direct h2c upstream, nginx grpc_pass and tollgate
    h2c, interleaved rounds, medians, ratios to nginx grpc_pass."""
    up_port = free_port()
    upstream = Nginx(tmp, "h2c upstream",
                     f"server {{ listen 127.0.0.1:{up_port} http2; location / {{ return 200 'ok'; }} }}")
    started.append(upstream)
    wait_port(up_port)
    body = os.path.join(tmp, "call.bin")
    with open(body, "wb") as f:
        f.write(b"\x00\x00\x00\x00\x00")
    port = free_port()
    nginx = Nginx(tmp, "nginx grpc_pass",
                  f"upstream g {{ server 127.0.0.1:{up_port}; keepalive 64; }}\n"
                  f"server {{ listen 127.0.0.1:{port} http2; location / {{ grpc_pass grpc://g; }} }}",
                  access_log=logs)
    started.append(nginx)
    wait_port(port)
    contenders = [("direct h2c upstream", up_port, upstream.pids), ("nginx grpc_pass", port, nginx.pids)]
    port = free_port()
    cfg = os.path.join(tmp, "grpc.yaml")
    with open(cfg, "w") as f:
        f.write(f"""listen: 127.0.0.1:{port}
routes:
  - name: grpc
    match: {{ path_prefix: / }}
    upstream: h2c://127.0.0.1:{up_port}
""")
    p = Process([binary, "--config", cfg],
                env={"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "info" if logs else "warn"},
                stderr=cfg + ".log" if logs else None)
    started.append(p)
    wait_port(port)
    contenders.append(("tollgate h2c", port, p.pids))

    results = {c[0]: [] for c in contenders}
    for r in range(args.rounds):
        for name, port, pids in contenders:
            run_h2load(port, 1, body)  # warm-up
            p0 = cpu_ticks(pids())
            reqs, rps, mean, non2xx = run_h2load(port, args.duration, body)
            p1 = cpu_ticks(pids())
            results[name].append({"cpu": (p1 - p0) / TICK * 1e6 / max(reqs, 1), "rps": rps,
                                  "mean": mean, "non2xx": non2xx})
            print(f"round {r + 1}: {name}: {rps:.0f} req/s, mean {mean:.2f} ms", file=sys.stderr)
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
    base = med["nginx grpc_pass"]
    print(f"\ngRPC over h2c: {args.rounds} interleaved rounds of {args.duration}s, h2load -c50 -m1; "
          f"medians; ratios to nginx grpc_pass\n")
    hdr = f"{'contender':31} {'CPU us/req':>10} {'req/s':>9} {'mean ms':>8} {'non-2xx':>8} " \
          f"{'CPU x':>6} {'req/s x':>7} {'mean x':>6}"
    print(hdr)
    print("-" * len(hdr))
    for n, m in med.items():
        print(f"{n:31} {m['cpu']:10.1f} {m['rps']:9.0f} {m['mean']:8.2f} {m['non2xx']:8.0f} "
              f"{m['cpu'] / base['cpu']:6.2f} {m['rps'] / base['rps']:7.2f} {m['mean'] / base['mean']:6.2f}")


def info_memory(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "memory"],
                         capture_output=True, text=True).stdout
    return int(re.search(r"^used_memory:(\d+)", out, re.M).group(1))


def redis_memory(binary, tmp, up_port, redis_port, started, identities=100_000):
    """Redis memory per identity for one sliding_window limit: INFO memory
    used_memory before and after 100,000 distinct API keys each made one
    request through tollgate, divided by the keys created."""
    subprocess.run(["redis-cli", "-p", str(redis_port), "FLUSHALL"], capture_output=True, check=True)
    port = free_port()
    cfg = os.path.join(tmp, "memory.yaml")
    tollgate_config(cfg, port, up_port, "{ name: all, key: api_key, limit: 100, window: 1h }", redis_port)
    p = Process([binary, "--config", cfg], env={"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "warn"})
    started.append(p)
    wait_port(port)
    script = os.path.join(tmp, "seq.lua")

    def dbsize():
        out = subprocess.run(["redis-cli", "-p", str(redis_port), "DBSIZE"],
                             capture_output=True, text=True).stdout
        return int(out.strip() or 0)

    def sequential(name, start, count):
        with open(script, "w") as f:
            f.write(f"i = {start}\nrequest = function()\n  i = i % {count} + 1\n"
                    f"  return wrk.format(nil, nil, {{ [\"x-api-key\"] = \"{name}\" .. i }})\nend\n")

    # Warm-up on other identities first, so what the server allocates once
    # (script cache, client buffers, the heartbeat set) is not counted per
    # identity.
    sequential("w", 0, 1000)
    run_wrk([port], 1, script)
    base = dbsize()
    before = info_memory(redis_port)
    keys = 0
    for _ in range(20):
        # Sequential keys from where the last run stopped, so every identity
        # is seen once the runs have covered them all.
        sequential("k", keys, identities)
        run_wrk([port], 2, script)
        keys = dbsize() - base
        if keys >= identities:
            break
    after = info_memory(redis_port)
    sample = subprocess.run(["redis-cli", "-p", str(redis_port), "RANDOMKEY"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\nRedis memory, one sliding_window limit keyed by api_key: {keys} keys, "
          f"{(after - before) / max(keys, 1):.0f} B per identity (INFO memory used_memory; "
          f"key names like {sample!r})")


# The performance targets (docs/performance.md#targets), as ratios to nginx proxy_pass in the same run: CPU per
# request (tollgate's and Redis's), Redis CPU µs per decision, p99 and
# requests/s. None where the targets set none.
GOALS = [
    ("tollgate no limits", 1.0, None, 1.0, 1.0),
    ("tollgate memory", 1.1, None, 1.1, 0.95),
    ("tollgate redis 10k keys", 1.5, 3.0, 1.2, 0.85),
    ("tollgate redis sync 10k keys", 1.15, 0.3, 1.1, 0.95),
    ("tollgate deny path", 0.5, None, None, None),
    ("tollgate native no limits", 1.0, None, 1.0, 1.0),
    ("tollgate native memory", 1.1, None, 1.1, 0.95),
    ("tollgate native deny path", 0.6, None, None, None),
]


def print_goals(med, base):
    """The goals beside what this run measured, each marked met or not."""
    print("\nGoals (the targets) against this run; * marks a goal met\n")
    hdr = f"{'contender':42} {'CPU x (goal)':>15} {'redis us (goal)':>16} {'p99 x (goal)':>15} {'req/s x (goal)':>16}"
    print(hdr)
    print("-" * len(hdr))

    def cell(value, goal, at_most, width):
        if goal is None:
            return f"{value:{width - 9}.2f}  (  -  ) "
        met = value <= goal if at_most else value >= goal
        return f"{value:{width - 9}.2f} ({goal:5.2f}){'*' if met else ' '}"

    rows = [(name + suffix, goals) for name, *goals in GOALS for suffix in ("", " (baseline)")]
    for name, (cpu, redis_us, p99, rps) in rows:
        m = med.get(name)
        if m is None:
            continue
        print(f"{name:42} {cell((m['cpu'] + m['redis_cpu']) / base['cpu'], cpu, True, 15)} "
              f"{cell(m['redis_cpu'], redis_us, True, 16)} {cell(m['p99'] / base['p99'], p99, True, 15)} "
              f"{cell(m['rps'] / base['rps'], rps, False, 16)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-build", action="store_true", help="use the existing target/release/tollgate")
    ap.add_argument("--binary", help="the tollgate binary to measure (default: target/release/tollgate)")
    ap.add_argument("--baseline", help="a second tollgate binary whose HTTP/1.1 rows (no limits, "
                                       "memory, deny path; hyper and native) are measured in the "
                                       "same rounds, named \"... (baseline)\"")
    ap.add_argument("--no-access-log", action="store_true",
                    help="no access log on either side (by default nginx and tollgate each "
                         "write one line per request to a file)")
    args = ap.parse_args()

    ensure_tools()
    if not args.no_build and not args.binary:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    binary = args.binary or os.path.join(ROOT, "target", "release", "tollgate")
    logs = not args.no_access_log
    tmp = tempfile.mkdtemp(prefix="tollgate-load-")
    started = []
    try:
        upstream, up_port, redis, redis_port, keys_lua = start_fixture(tmp, started)
        deny_lua = os.path.join(tmp, "deny.lua")
        with open(deny_lua, "w") as f:
            f.write('wrk.headers["x-api-key"] = "hot"\n')

        contenders = []  # (name, port, pids_fn, uses_redis, wrk_script)
        wanted = set(args.only.split(",")) if args.only else set()

        def add_nginx(name, limit_req=False):
            port = free_port()
            n = Nginx(tmp, name, nginx_proxy_pass(up_port, port, limit_req), access_log=logs)
            started.append(n)
            wait_port(port)
            contenders.append((name, [port], n.pids, False, None))

        add_nginx("nginx proxy_pass")
        add_nginx("nginx limit_req", limit_req=True)

        port = free_port()
        h = Haproxy(tmp, "haproxy", up_port, port, access_log=logs)
        started.append(h)
        wait_port(port)
        contenders.append(("haproxy", [port], h.pids, False, None))

        def add_tollgate(name, limits, use_redis, script, sync=None, instances=1, http1="hyper",
                         binary_path=None):
            if args.only and name not in wanted:
                return
            ports, procs = [], []
            for i in range(instances):
                port = free_port()
                cfg = os.path.join(tmp, f"{name.replace(' ', '_')}_{i}.yaml")
                tollgate_config(cfg, port, up_port, limits, redis_port if use_redis else None, sync, http1)
                p = Process([binary_path or binary, "--config", cfg],
                            env={"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "info" if logs else "warn"},
                            stderr=cfg + ".log" if logs else None)
                started.append(p)
                wait_port(port)
                ports.append(port)
                procs.append(p)
            contenders.append((name, ports, lambda: [pid for p in procs for pid in p.pids()],
                               use_redis, script))

        big = "{ name: all, key: api_key | ip, limit: 100000000, window: 1h }"
        add_tollgate("tollgate no limits", "", False, None)
        add_tollgate("tollgate memory", big, False, keys_lua)
        add_tollgate("tollgate redis 10k keys", big, True, keys_lua)
        add_tollgate("tollgate redis sync 10k keys", big, True, keys_lua, sync="100ms")
        tiny = "{ name: tiny, key: api_key, limit: 1, window: 1h }"
        add_tollgate("tollgate deny path", tiny, True, deny_lua)
        add_tollgate("tollgate native no limits", "", False, None, http1="native")
        add_tollgate("tollgate native memory", big, False, keys_lua, http1="native")
        add_tollgate("tollgate native deny path", tiny, True, deny_lua, http1="native")
        if args.baseline:
            # The same rows for a second binary, in the same rounds.
            for name, limits, redis_on, script, http1 in (
                    ("tollgate no limits", "", False, None, "hyper"),
                    ("tollgate memory", big, False, keys_lua, "hyper"),
                    ("tollgate deny path", tiny, True, deny_lua, "hyper"),
                    ("tollgate native no limits", "", False, None, "native"),
                    ("tollgate native memory", big, False, keys_lua, "native"),
                    ("tollgate native deny path", tiny, True, deny_lua, "native")):
                add_tollgate(name + " (baseline)", limits, redis_on, script, http1=http1,
                             binary_path=args.baseline)
        add_tollgate("tollgate redis 3 gateways", big, True, keys_lua, instances=3)
        add_tollgate("tollgate redis sync 3 gateways", big, True, keys_lua, sync="100ms", instances=3)
        contenders.insert(0, ("direct upstream", [up_port], upstream.pids, False, None))

        if args.only:
            contenders = [c for c in contenders if c[0] in wanted or c[0] == "nginx proxy_pass"]
            if wanted <= {"grpc", "redis memory"}:
                contenders = []

        # sync mode sends a key far from its limit to Redis up to 100
        # intervals after it was touched (10 s at sync: 100ms): its Redis
        # work is counted until then, after the run, so that it is neither
        # missed nor counted against the next contender.
        tails = {"tollgate redis sync 10k keys": 10.5, "tollgate redis sync 3 gateways": 10.5}
        results = {c[0]: [] for c in contenders}
        for r in range(args.rounds):
            for name, ports, pids, uses_redis, script in contenders:
                run_wrk(ports, 1, script)  # warm-up: pools, caches, script load
                p0, r0, c0 = cpu_ticks(pids()), cpu_ticks(redis.pids()), redis_calls(redis_port)
                reqs, rps, p99, non2xx = run_wrk(ports, args.duration, script)
                time.sleep(tails.get(name, 0))
                p1, r1, c1 = cpu_ticks(pids()), cpu_ticks(redis.pids()), redis_calls(redis_port)
                us = lambda t: (t / TICK) * 1e6 / max(reqs, 1)
                results[name].append({
                    "cpu": us(p1 - p0), "redis_cpu": us(r1 - r0) if uses_redis else 0.0,
                    "rps": rps, "p99": p99, "cmds": (c1 - c0) / max(reqs, 1) if uses_redis else 0.0,
                    "non2xx": non2xx,
                })
                print(f"round {r + 1}: {name}: {rps:.0f} req/s, p99 {p99:.2f} ms", file=sys.stderr)

        if args.rounds and contenders:
            med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
            base = med["nginx proxy_pass"]
            print(f"\n{args.rounds} interleaved rounds of {args.duration}s, wrk -t1 -c50; medians; "
                  f"ratios to nginx proxy_pass\n")
            hdr = f"{'contender':42} {'CPU us/req':>10} {'redis us/req':>12} {'(sum)':>7} {'req/s':>9} " \
                  f"{'p99 ms':>7} {'redis call/req':>14} {'non-2xx':>8} {'CPU x':>6} {'req/s x':>7} {'p99 x':>6}"
            print(hdr)
            print("-" * len(hdr))
            for n, m in med.items():
                total = m["cpu"] + m["redis_cpu"]
                print(f"{n:42} {m['cpu']:10.1f} {m['redis_cpu']:12.1f} {total:7.1f} {m['rps']:9.0f} "
                      f"{m['p99']:7.2f} {m['cmds']:14.3f} {m['non2xx']:8.0f} {total / base['cpu']:6.2f} "
                      f"{m['rps'] / base['rps']:7.2f} {m['p99'] / base['p99']:6.2f}")
            print_goals(med, base)
        if args.rounds and (not args.only or "grpc" in wanted):
            grpc_rounds(args, binary, tmp, started, logs)
        if not args.only or "redis memory" in args.only:
            redis_memory(binary, tmp, up_port, redis_port, started)
    finally:
        stop_all(started, tmp)


if __name__ == "__main__":
    main()
