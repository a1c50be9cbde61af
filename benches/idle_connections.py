#!/usr/bin/env python3
"""Memory per idle keep-alive connection, tollgate (hyper or native HTTP/1.1
server) and nginx.

    python3 benches/idle_connections.py BINARY [N] [CONTENDERS]

Each contender proxies to one upstream on loopback. N client connections
(default 2000) each send one request, read the answer and stay open; the
contender's resident memory (VmRSS, all processes: nginx's master and one
worker) is read before the first connection and once all N are idle, and
the difference divided by N is printed. tollgate runs with
TOKIO_WORKER_THREADS=1; nginx with one worker and `keepalive_timeout 300`.
CONTENDERS, a comma-separated choice of `hyper`, `native` and `nginx`,
measures only those (default: all three).

N may be a rising list, `2000,6000`: the connections are opened in
stages in one process, RSS read after each, and what each connection
past the previous stage costs is printed too (the marginal cost, without
what the process keeps whatever the count).
"""
import os, socket, subprocess, sys, tempfile, threading, time

BIN = os.path.abspath(sys.argv[1])
STAGES = [int(n) for n in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2000]
N = STAGES[-1]
ONLY = sys.argv[3].split(",") if len(sys.argv) > 3 else ["hyper", "native", "nginx"]


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def upstream(port):
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port)); srv.listen(512)
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


def rss_kib(pids):
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def wait_listening(port):
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port)).close(); return
        except OSError: time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


def one(s):
    s.sendall(b"GET /x HTTP/1.1\r\nhost: example.com\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf or not buf.endswith(b"ok"):
        d = s.recv(65536)
        if not d: raise SystemExit("connection closed")
        buf += d


def measure(name, port, pids):
    wait_listening(port)
    warm = socket.create_connection(("127.0.0.1", port)); one(warm)
    time.sleep(0.5)
    before = rss_kib(pids)
    conns = []
    last = None
    for n in STAGES:
        while len(conns) < n:
            s = socket.create_connection(("127.0.0.1", port)); one(s); conns.append(s)
        time.sleep(1.0)
        after = rss_kib(pids)
        print(f"{name:16} {n} idle connections: RSS {before} KiB -> {after} KiB, "
              f"{(after - before) * 1024 / n:.0f} bytes per connection")
        if last:
            print(f"{name:16} each past {last[0]}: "
                  f"{(after - last[1]) * 1024 / (n - last[0]):.0f} bytes")
        last = (n, after)
    for s in conns: s.close()
    warm.close()


up = free_port()
threading.Thread(target=upstream, args=(up,), daemon=True).start()
d = tempfile.mkdtemp(prefix="idle-")
for http1 in [c for c in ("hyper", "native") if c in ONLY]:
    gw = free_port()
    open(f"{d}/{http1}.yaml", "w").write(f"""listen: 127.0.0.1:{gw}
server: {{ http1: {http1}, max_connections: {N + 100} }}
timeouts: {{ idle: 300s, header_read: 300s }}
store: {{ on_error: local }}
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: http://127.0.0.1:{up}
""")
    env = dict(os.environ, TOKIO_WORKER_THREADS="1", RUST_LOG="warn")
    p = subprocess.Popen([BIN, "--config", f"{d}/{http1}.yaml"], env=env,
                         stdout=subprocess.DEVNULL, stderr=open(f"{d}/{http1}.err", "w"))
    try:
        measure(f"tollgate {http1}", gw, [p.pid])
    finally:
        p.terminate(); p.wait()

if "nginx" in ONLY and subprocess.run(["which", "nginx"], capture_output=True).returncode == 0:
    ng = free_port()
    open(f"{d}/nginx.conf", "w").write(f"""worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/nginx.err warn;
events {{ worker_connections {N + 100}; }}
http {{
  access_log off;
  keepalive_timeout 300;
  keepalive_requests 100000;
  upstream up {{ server 127.0.0.1:{up}; keepalive 16; }}
  server {{
    listen 127.0.0.1:{ng};
    location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
}}
""")
    p = subprocess.Popen(["nginx", "-c", f"{d}/nginx.conf", "-p", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(ng)
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        measure("nginx", ng, [p.pid] + [int(k) for k in kids])
    finally:
        p.terminate(); p.wait()
