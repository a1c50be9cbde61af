#!/usr/bin/env python3
"""Throughput and peak memory of one large body streamed through the gateway.

    python3 benches/stream_cost.py BINARY [MIB] [hyper|native]

A Python upstream on loopback answers `GET /down` with MIB MiB (default
600, `Content-Length`) and reads `POST /up` (MIB MiB, `Content-Length`)
to its end before answering 200. One client connection downloads, then
uploads, through the gateway (`server.http1` as the third argument,
default hyper; one route to the upstream, no limits, RUST_LOG=warn); the
script prints each direction's MiB/s and the gateway's peak RSS (VmHWM).
The client and upstream are Python, so the figures compare the two
`server.http1` settings on one machine, not the gateway against others."""
import os, socket, subprocess, sys, tempfile, threading, time

BIN = os.path.abspath(sys.argv[1])
MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 600
HTTP1 = sys.argv[3] if len(sys.argv) > 3 else "hyper"
SIZE = MIB << 20
BLOCK = b"x" * (1 << 20)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_head(c):
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = c.recv(65536)
        if not got:
            return None, b""
        buf += got
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def length(head):
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


def serve(c):
    while True:
        head, rest = read_head(c)
        if head is None:
            return
        if head.startswith(b"GET"):
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % SIZE)
            for _ in range(MIB):
                c.sendall(BLOCK)
        else:
            left = length(head) - len(rest)
            while left > 0:
                got = c.recv(1 << 20)
                if not got:
                    return
                left -= len(got)
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")


def upstream(port):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def peak_rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


up, gw = free_port(), free_port()
threading.Thread(target=upstream, args=(up,), daemon=True).start()
d = tempfile.mkdtemp(prefix="stream-")
open(f"{d}/gw.yaml", "w").write(f"""listen: 127.0.0.1:{gw}
server: {{ http1: {HTTP1} }}
routes:
  - name: api
    match: {{ path_prefix: / }}
    upstream: http://127.0.0.1:{up}
""")
p = subprocess.Popen([BIN, "--config", f"{d}/gw.yaml"], env=dict(os.environ, RUST_LOG="warn"),
                     stdout=subprocess.DEVNULL, stderr=open(f"{d}/err", "w"))
for _ in range(200):
    try:
        s = socket.create_connection(("127.0.0.1", gw))
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("the gateway did not listen: " + open(f"{d}/err").read()[-2000:])

t = time.monotonic()
s.sendall(b"GET /down HTTP/1.1\r\nhost: stream.test\r\n\r\n")
head, rest = read_head(s)
left = length(head) - len(rest)
while left > 0:
    got = s.recv(1 << 20)
    if not got:
        sys.exit("download cut short")
    left -= len(got)
down = MIB / (time.monotonic() - t)

t = time.monotonic()
s.sendall(b"POST /up HTTP/1.1\r\nhost: stream.test\r\ncontent-length: %d\r\n\r\n" % SIZE)
for _ in range(MIB):
    s.sendall(BLOCK)
head, _ = read_head(s)
upl = MIB / (time.monotonic() - t)
status = head.split(b" ")[1].decode() if head else "none"

rss = peak_rss_kib(p.pid)
p.terminate()
p.wait()
print(f"http1={HTTP1} {MIB} MiB: down {down:.0f} MiB/s, up {upl:.0f} MiB/s (status {status}), peak RSS {rss / 1024:.1f} MiB")
