#!/usr/bin/env python3
"""Callgrind instructions per request on one path through the gateway.

    python3 benches/callgrind_paths.py BINARY none|one|deny|redis|pool|traced|sampled [N]

The gateway runs under `valgrind --tool=callgrind` with
TOKIO_WORKER_THREADS=1 and RUST_LOG=warn (no access log), one route to a
keep-alive upstream on loopback: `none` without limits, `one` with one
in-process limit by IP that admits, `deny` with one that denies (429),
`redis` with the limit in a redis-server started here (deny cache off),
`pool` without limits to a pool of three such upstreams (`least_request`,
the defaults otherwise) instead of one URL,
`traced` without limits but with every request traced (`tracing:` with
`sample_ratio: 1`, spans posted to an OTLP/HTTP collector started here
that answers 200; the export thread's work is counted too), `sampled`
the same at `sample_ratio: 0.01`.
`HTTP1=hyper` in the environment serves clients with hyper's HTTP/1.1
(`server: { http1: hyper }`); unset, or `HTTP1=native`, with the native
server, the default.
One client connection sends requests one after another (as `wrk -t1
-c1`); after a warm-up, `callgrind_control --zero`, N requests (default
2000), `callgrind_control --dump`: the whole process's instructions
divided by N. Needs valgrind, and redis-server for `redis`.
See docs/performance.md."""
import os, socket, subprocess, sys, time, threading, glob, re, tempfile
BIN, MODE = os.path.abspath(sys.argv[1]), sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
WARM = 300

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

# upstream: keep-alive HTTP/1.1 200, threaded
def upstream(port):
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port)); srv.listen(64)
    def conn(c):
        buf = b""
        while True:
            d = c.recv(65536)
            if not d: return
            buf += d
            while b"\r\n\r\n" in buf:
                _, buf = buf.split(b"\r\n\r\n", 1)
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    while True:
        c, _ = srv.accept(); threading.Thread(target=conn, args=(c,), daemon=True).start()

up, gw = free_port(), free_port()
threading.Thread(target=upstream, args=(up,), daemon=True).start()
upstream_line = f"http://127.0.0.1:{up}"
pools = ""
if MODE == "pool":
    ports = [up] + [free_port() for _ in range(2)]
    for port in ports[1:]:
        threading.Thread(target=upstream, args=(port,), daemon=True).start()
    targets = ", ".join(f"http://127.0.0.1:{port}" for port in ports)
    pools = f"upstreams:\n  api: {{ targets: [ {targets} ] }}\n"
    upstream_line = "api"
d = tempfile.mkdtemp(prefix="cg-")
redis = None
store = "store: { on_error: local }"
limit = ""
if MODE == "one":
    limit = "limits: [ { name: per_ip, key: ip, limit: 100000000, window: 1h } ]"
elif MODE == "deny":
    limit = "limits: [ { name: per_ip, key: ip, limit: 1, window: 1h } ]"
elif MODE == "redis":
    rp = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rp), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    store = "store: { redis: { url: \"redis://127.0.0.1:%d\", timeout: 2s, connect_timeout: 10s }, on_error: deny, deny_cache: 0 }" % rp
    limit = "limits: [ { name: per_ip, key: ip, limit: 100000000, window: 1h } ]"
tracing = ""
if MODE in ("traced", "sampled"):
    import http.server
    class Collector(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()
        def log_message(self, *a): pass
    cp = free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", cp), Collector)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    ratio = 1 if MODE == "traced" else 0.01
    tracing = "tracing: { otlp_endpoint: \"http://127.0.0.1:%d\", sample_ratio: %s }" % (cp, ratio)
server = "server: { http1: %s }\n" % os.environ.get("HTTP1", "native")
cfg = f"""listen: 127.0.0.1:{gw}
{server}{store}
{pools}{tracing}
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: {upstream_line}
    {limit}
"""
open(f"{d}/gw.yaml", "w").write(cfg)
env = dict(os.environ, TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out.%p", BIN, "--config", f"{d}/gw.yaml"], env=env, stderr=open(f"{d}/err", "w"), stdout=subprocess.DEVNULL, cwd=d)
# valgrind starts the binary slowly, slower still on a busy machine: up
# to five minutes for the listener.
s = None
for _ in range(3000):
    try:
        s = socket.create_connection(("127.0.0.1", gw)); break
    except OSError: time.sleep(0.1)
if s is None:
    sys.exit("the gateway did not listen within five minutes: " + open(f"{d}/err").read()[-2000:])
req = b"GET /x HTTP/1.1\r\nhost: example.com\r\n\r\n"
def one():
    s.sendall(req)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    m = re.search(rb"content-length: *(\d+)", head, re.I)
    n = int(m.group(1)) if m else 0
    while len(body) < n: body += s.recv(65536)
    return head.split(b" ")[1]
codes = {}
for _ in range(WARM): one()
subprocess.run(["callgrind_control", "--zero", str(p.pid)], stdout=subprocess.DEVNULL)
for _ in range(N):
    c = one(); codes[c] = codes.get(c, 0) + 1
subprocess.run(["callgrind_control", "--dump=measured", str(p.pid)], stdout=subprocess.DEVNULL)
time.sleep(1)
p.terminate(); p.wait()
if redis: redis.terminate()
files = [f for f in glob.glob(f"{d}/cg.out.*") if open(f, errors="ignore").read().find("measured") >= 0]
tot = None
for f in files:
    for line in open(f, errors="ignore"):
        if line.startswith("summary:") or line.startswith("totals:"):
            tot = int(line.split()[1])
print(MODE, os.environ.get("HTTP1", "native"), codes, "Ir/request", round(tot / N) if tot else None, d)
