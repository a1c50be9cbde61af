#!/usr/bin/env python3
"""What reading a streamed answer's usage costs the gateway.

    python3 benches/sse_cost.py BINARY [--mb 4] [--requests 20]

An upstream started here answers every POST with an OpenAI-style SSE
stream of about `--mb` MB (chunks of a few hundred bytes, then the usage
chunk and `data: [DONE]`), as fast as the socket takes it. The gateway
(BINARY, in-process store, RUST_LOG=warn) runs twice, with one route
each time:

- `plain`: a requests-per-minute limit only;
- `body`: the same, and a token limit settled from the body
  (`cost: { reserve: { json: max_tokens, default: 1000 }, from_body: openai }`,
  keyed `[ api_key, "json:model" ]`, so the request body is read first too).

One client connection sends `--requests` requests one after another and
reads each answer whole. Printed per route: the gateway's CPU time (user +
system, from /proc/PID/stat) per MB passed, and the median time to the
first byte of the body. Then the ratios, `body` to `plain`. A 4 KB request
body is sent each time (a chat's messages), so `body` also pays for
reading it before the decision.
"""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, threading, time

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("--mb", type=float, default=4)
ap.add_argument("--requests", type=int, default=20)
args = ap.parse_args()

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def stream_body(mb):
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "hello " * 30}, "finish_reason": None}],
             "usage": None}
    line = ("data: %s\n\n" % json.dumps(chunk)).encode()
    n = int(mb * 1e6 / len(line))
    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 100, "total_tokens": 1000}}
    tail = ("data: %s\n\ndata: [DONE]\n\n" % json.dumps(usage)).encode()
    # Chunked frames of ~16 KB, as a server flushing as it goes would send.
    frames, buf = [], b""
    for _ in range(n):
        buf += line
        if len(buf) >= 16384:
            frames.append(b"%x\r\n%s\r\n" % (len(buf), buf)); buf = b""
    buf += tail
    frames.append(b"%x\r\n%s\r\n" % (len(buf), buf))
    frames.append(b"0\r\n\r\n")
    return frames, n * len(line) + len(tail)

FRAMES, BYTES = stream_body(args.mb)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

def upstream(srv):
    def conn(c):
        buf = b""
        while True:
            d = c.recv(65536)
            if not d: return
            buf += d
            while b"\r\n\r\n" in buf:
                head, rest = buf.split(b"\r\n\r\n", 1)
                length = 0
                for h in head.split(b"\r\n")[1:]:
                    k, _, v = h.partition(b":")
                    if k.strip().lower() == b"content-length": length = int(v)
                while len(rest) < length:
                    rest += c.recv(65536)
                buf = rest[length:]
                c.sendall(HEAD)
                for f in FRAMES: c.sendall(f)
    while True:
        c, _ = srv.accept(); threading.Thread(target=conn, args=(c,), daemon=True).start()

srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(64)
threading.Thread(target=upstream, args=(srv,), daemon=True).start()
UP = srv.getsockname()[1]

LIMITS = {
    "plain": "[ { name: rpm, key: api_key, limit: 1000000, window: 1m } ]",
    "body": "[ { name: rpm, key: api_key, limit: 1000000, window: 1m }, "
            "{ name: tpm, key: [ api_key, \"json:model\" ], limit: 1000000000, window: 1m, algorithm: fixed_window, "
            "cost: { reserve: { json: max_tokens, default: 1000 }, from_body: openai } } ]",
}

REQ_BODY = json.dumps({"model": "m", "max_tokens": 1000, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "x" * 4000}]}).encode()
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer k\r\n"
           b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(REQ_BODY), REQ_BODY))

def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def read_response(s):
    """Reads one chunked response; the seconds to its first body byte."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, rest = buf.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    first = None
    while True:
        while b"\r\n" not in rest:
            rest += s.recv(262144)
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size and first is None:
            first = time.perf_counter()
        while len(rest) < size + 2:
            rest += s.recv(262144)
        rest = rest[size + 2:]
        if size == 0:
            return first

def run(name):
    port = free_port()
    d = tempfile.mkdtemp(prefix="sse-")
    cfg = os.path.join(d, "gateway.yaml")
    with open(cfg, "w") as f:
        f.write("listen: 127.0.0.1:%d\nroutes:\n  - name: chat\n    match: { path_prefix: /v1/ }\n"
                "    upstream: http://127.0.0.1:%d\n    limits: %s\n" % (port, UP, LIMITS[name]))
    env = dict(os.environ, RUST_LOG="warn")
    gw = subprocess.Popen([args.binary, "--config", cfg], env=env)
    try:
        for _ in range(200):
            try:
                s = socket.create_connection(("127.0.0.1", port)); break
            except OSError:
                time.sleep(0.05)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(3):  # warm-up
            s.sendall(REQUEST); read_response(s)
        cpu0, ttfb = cpu_seconds(gw.pid), []
        for _ in range(args.requests):
            t0 = time.perf_counter()
            s.sendall(REQUEST)
            ttfb.append(read_response(s) - t0)
        cpu = cpu_seconds(gw.pid) - cpu0
        s.close()
    finally:
        gw.terminate(); gw.wait()
    mb = BYTES * args.requests / 1e6
    return cpu / mb * 1000, statistics.median(ttfb) * 1000

print("stream: %.2f MB x %d requests; gateway %s" % (BYTES / 1e6, args.requests, args.binary))
res = {}
for name in ("plain", "body", "plain", "body"):
    cpu_mb, ttfb = run(name)
    res.setdefault(name, []).append((cpu_mb, ttfb))
    print("%-6s CPU %.2f ms/MB   TTFB median %.3f ms" % (name, cpu_mb, ttfb))
p = [min(x[0] for x in res["plain"]), min(x[1] for x in res["plain"])]
b = [min(x[0] for x in res["body"]), min(x[1] for x in res["body"])]
print("body/plain CPU per MB: %.3f   TTFB difference: %+.3f ms (best of two runs each)" % (b[0] / p[0], b[1] - p[1]))
