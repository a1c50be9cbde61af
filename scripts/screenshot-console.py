#!/usr/bin/env python3
"""Screenshots of the operators' console, one PNG per view.

    python3 scripts/screenshot-console.py [OUT_DIR]     # default /tmp/tollgate-console

Starts a redis-server on a free port (if one is on PATH; else a single
gateway on the in-process store), two gateways of the tollgate binary
(the newer of target/release and target/debug) sharing it, each with an admin
listener and token, sends them a little traffic with a few API keys so the
limits deny some, and a simulate report into the replays folder. Then
headless Chromium, driven over the DevTools protocol through its pipe
(--remote-debugging-pipe: commands on fd 3, replies on fd 4, NUL-ended
JSON), logs in by setting sessionStorage `tollgate.token` and captures
each view: now.png, limited.png, caller.png, replays.png. Nothing is
written in the repository unless OUT_DIR is in it (docs/console/ is where
docs/console.md looks for them).
"""
import base64, json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tollgate-console")
TOKEN = "screenshot-token"


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def wait_http(url, within=60):
    end = time.time() + within
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=1).read(); return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"{url} did not answer within {within}s")


def binary():
    """The newest of target/release and target/debug's binaries (built if neither is)."""
    found = [os.path.join(ROOT, b) for b in ("target/release/tollgate", "target/debug/tollgate")
             if os.access(os.path.join(ROOT, b), os.X_OK)]
    if found:
        return max(found, key=os.path.getmtime)
    subprocess.check_call(["cargo", "build", "--bin", "tollgate"], cwd=ROOT)
    return os.path.join(ROOT, "target/debug/tollgate")


def call(url, headers):
    req = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(req, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


class Chromium:
    def __init__(self, work):
        browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        if not browser:
            sys.exit("no chromium: apt-get install -y chromium")
        to_r, to_w = os.pipe()      # commands: we write, chromium reads fd 3
        from_r, from_w = os.pipe()  # replies: chromium writes fd 4, we read
        os.set_inheritable(to_r, True); os.set_inheritable(from_w, True)
        self.proc = subprocess.Popen(
            ["sh", "-c", f'exec "$0" --headless --no-sandbox --disable-gpu --disable-background-networking '
             f'--disable-component-update --disable-sync --no-first-run --hide-scrollbars '
             f'--window-size=1280,900 --user-data-dir="{work}/profile" --remote-debugging-pipe '
             f'3<&{to_r} 4>&{from_w}', browser],
            pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r); os.close(from_w)
        self.w, self.r, self.buf, self.next = os.fdopen(to_w, "wb"), os.fdopen(from_r, "rb"), b"", 0

    def call(self, method, params=None, session=None):
        self.next += 1
        msg = {"id": self.next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.w.write(json.dumps(msg).encode() + b"\0"); self.w.flush()
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.r.fileno(), 1 << 20)
                if not chunk:
                    sys.exit("chromium closed its pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next:
                if "error" in reply:
                    sys.exit(f"{method}: {reply['error']}")
                return reply["result"]

    def close(self):
        self.proc.kill()


def main():
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp()
    procs = []
    try:
        redis_port = None
        if shutil.which("redis-server"):
            redis_port = free_port()
            procs.append(subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
                                          stdout=subprocess.DEVNULL, cwd=work))
        replays = os.path.join(work, "replays"); os.makedirs(replays)
        store = f"store: {{ redis: {{ url: 'redis://127.0.0.1:{redis_port}' }} }}\n" if redis_port else ""
        gateways = []
        for _ in range(2 if redis_port else 1):
            port, admin = free_port(), free_port()
            cfg = os.path.join(work, f"gw{port}.yaml")
            open(cfg, "w").write(f"""listen: 127.0.0.1:{port}
admin: {{ addr: 127.0.0.1:{admin}, token: {TOKEN}, replays: {replays} }}
{store}api_keys: {{ keys: {{ key-alpha: free, key-beta: free, key-gamma: free }} }}
plans:
  free: [ {{ name: per_minute, limit: 20, window: 1m }} ]
routes:
  - name: search
    match: {{ path_prefix: /search }}
    respond: {{ status: 200, body: ok }}
    limits: [ {{ name: per_key, key: api_key, limit: 5, window: 1m }} ]
  - name: orders
    match: {{ path_prefix: /orders }}
    respond: {{ status: 200, body: ok }}
    limits:
      - {{ name: per_ip, key: ip, limit: 30, window: 1m }}
      - {{ name: per_key_shadow, key: api_key, limit: 2, window: 1m, shadow: true }}
""")
            procs.append(subprocess.Popen([binary(), "--config", cfg], stderr=open(os.path.join(work, f"gw{port}.log"), "w"), cwd=work))
            gateways.append((port, admin))
        for port, admin in gateways:
            wait_http(f"http://127.0.0.1:{admin}/readyz")
        # A simulate report for the Replays view.
        log = os.path.join(work, "access.log")
        subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts/gen-access-log.py"), "--lines", "20000",
                               "--identities", "200", "--rate", "10", "--seed", "3", "--out", log], stdout=subprocess.DEVNULL)
        subprocess.check_call([binary(), "simulate", "--config", os.path.join(ROOT, "gateway.yaml"), log,
                               "--field", "x-forwarded-for", "--field", "x-api-key", "--format", "html",
                               "--out", os.path.join(replays, "gateway-yaml-6h.html")], stdout=subprocess.DEVNULL)
        # Traffic over a few seconds so the charts have a shape.
        for second in range(8):
            for i, (port, _) in enumerate(gateways):
                for key, n in (("key-alpha", 12), ("key-beta", 4 + second), ("key-gamma", 2)):
                    for _ in range(n):
                        call(f"http://127.0.0.1:{port}/search?q=1", {"x-api-key": key})
                        call(f"http://127.0.0.1:{port}/orders", {"x-api-key": key})
            time.sleep(1)
        time.sleep(2)
        admin = gateways[-1][1]
        base = f"http://127.0.0.1:{admin}/console/"
        cr = Chromium(work)
        try:
            target = cr.call("Target.createTarget", {"url": "about:blank"})
            s = cr.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
            cr.call("Page.enable", session=s)
            cr.call("Page.navigate", {"url": base}, session=s); time.sleep(1)
            cr.call("Runtime.evaluate", {"expression": f"sessionStorage.setItem('tollgate.token', {json.dumps(TOKEN)})"}, session=s)
            cr.call("Page.reload", session=s); time.sleep(1)
            views = [("now", "#now"), ("limited", "#limited"),
                     ("caller", "#caller?api_key=key-alpha"), ("replays", "#replays")]
            for name, hash_ in views:
                cr.call("Runtime.evaluate", {"expression": f"location.hash = {json.dumps(hash_)}"}, session=s)
                time.sleep(3)
                shot = cr.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=s)
                path = os.path.join(OUT, f"{name}.png")
                open(path, "wb").write(base64.b64decode(shot["data"]))
                print(path, os.path.getsize(path), "bytes")
        finally:
            cr.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
