#!/usr/bin/env python3
"""Soak: two gateways over Redis Sentinel through repeated failovers.

Starts, on free loopback ports in a temporary directory, one Redis master,
one replica and three sentinels (quorum 2, down-after-milliseconds 1000,
failover-timeout 3000), and two tollgate gateways sharing them with
`on_error: local` (or --on-error). Sends --rate requests a second, split
over the two gateways on keep-alive connections, for --minutes. Meanwhile:

- every --failover-every seconds the current master is faulted, alternating
  `kill -9` (the process is started again on its port afterwards, empty, as
  a replica of the new master) and `kill -STOP` for 15 s (then `-CONT`);
- every minute both gateways are sent SIGHUP (a configuration reload).

Prints one line a minute: requests, 5xx, requests admitted (200) and the
count the current master holds for them (both since the start), the
gateways' RSS and open descriptors, and the failovers so far. Everything
stays on 127.0.0.1; every process it started is stopped when it ends.

Needs redis-server, redis-cli and a tollgate binary (--binary; by default
target/release/tollgate, else target/debug/tollgate). Python 3 standard
library only.

    python3 scripts/soak-failover.py --minutes 30
"""

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SERVICE = "mymaster"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args, timeout=2.0):
    """One redis-cli command; its output, or None when it failed."""
    try:
        out = subprocess.run(
            ["redis-cli", "-p", str(port), "--raw", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    return out.stdout if out.returncode == 0 else None


def wait_until(what, check, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    sys.exit(f"soak: {what} not within {within}s")


class Redis:
    """One redis-server process on a fixed port and directory."""

    def __init__(self, root, name, args):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.args = args
        self.proc = None
        self.start()

    def start(self, extra=()):
        cmd = ["redis-server"]
        if self.args and self.args[0].endswith(".conf"):
            cmd.append(self.args[0])
            rest = self.args[1:]
        else:
            rest = self.args
        rest = [*rest, *extra]
        cmd += [
            "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"), *rest,
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(f"redis on {self.port}", lambda: cli(self.port, "PING") == "PONG\n")

    def signal(self, sig):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def master_port(sentinels):
    """The port the sentinels name as the master (highest epoch first)."""
    best = None
    for s in sentinels:
        out = cli(s.port, "SENTINEL", "MASTER", SERVICE, timeout=1.0)
        if not out:
            continue
        lines = out.split("\n")
        fields = dict(zip(lines[0::2], lines[1::2]))
        try:
            named = (int(fields.get("config-epoch", "0")), int(fields["port"]))
        except (KeyError, ValueError):
            continue
        if best is None or named > best:
            best = named
    return best[1] if best else None


def counted(port):
    """The sum of the route's fixed-window counts (`<window>:<count>`) on
    `port`; None unless it answers as a master (frozen, dead, or a node
    the sentinels are still turning into a replica)."""
    role = cli(port, "ROLE", timeout=1.0)
    if not role or not role.startswith("master"):
        return None
    keys = cli(port, "KEYS", "tg:{*}?*")
    if keys is None:
        return None
    total = 0
    for key in keys.split():
        value = cli(port, "GET", key) or ""
        _, _, count = value.strip().partition(":")
        total += int(count) if count.isdigit() else 0
    return total


GATEWAY = """listen: 127.0.0.1:{port}
admin: 127.0.0.1:{admin}
store:
  redis: {{ sentinel: {{ service_name: {service}, nodes: [{nodes}] }} }}
  on_error: {on_error}
routes:
  - name: t
    match: {{ path: /t }}
    respond: {{ status: 200 }}
    limits: [ {{ name: l, key: ip, limit: 10000000, window: 1d, algorithm: fixed_window }} ]
"""


class Gateway:
    def __init__(self, root, name, binary, nodes, on_error):
        self.port, self.admin = free_port(), free_port()
        self.config = os.path.join(root, f"{name}.yaml")
        with open(self.config, "w") as f:
            f.write(GATEWAY.format(port=self.port, admin=self.admin, service=SERVICE,
                                   nodes=nodes, on_error=on_error))
        self.log = open(os.path.join(root, f"{name}.log"), "w")
        self.proc = subprocess.Popen([binary, "--config", self.config], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log)
        wait_until(f"gateway {name}", self.ready)

    def ready(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=1)
            c.request("GET", "/readyz")
            return c.getresponse().status == 200
        except OSError:
            return False

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def metric(self, name):
        """The sum of a metric's series from /metrics."""
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=2)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        except OSError:
            return None
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = self.errors = self.admitted = 0

    def add(self, status):
        with self.lock:
            self.requests += 1
            if status is None or status >= 500:
                self.errors += 1
            if status == 200:
                self.admitted += 1

    def snapshot(self):
        with self.lock:
            return self.requests, self.errors, self.admitted


def worker(port, interval, stop, tally):
    """Sends /t to one gateway every `interval` seconds on one keep-alive
    connection (opened again after an error). A failed request counts as 5xx."""
    conn = None
    next_at = time.monotonic()
    while not stop.is_set():
        next_at += interval
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/t")
            resp = conn.getresponse()
            resp.read()
            tally.add(resp.status)
        except (OSError, http.client.HTTPException):
            tally.add(None)
            conn = None
        time.sleep(max(0.0, next_at - time.monotonic()))


def fault(sentinels, servers, n, freeze):
    """Faults the current master: `kill -9` (then starts it again on its
    port; the sentinels make it a replica) when `n` is even, else
    `kill -STOP` for `freeze` seconds, then `-CONT`."""
    port = master_port(sentinels)
    victim = servers.get(port)
    if victim is None:
        return
    if n % 2 == 0:
        victim.signal(signal.SIGKILL)
        victim.proc.wait()
        wait_until("a new master", lambda: master_port(sentinels) not in (None, port))
        # Back as a replica of the new master, with nothing of its own: a
        # dump.rdb left by an earlier full sync would otherwise bring it up
        # as a master holding counts minutes old, which a second failover
        # could then promote over the new master's.
        dump = os.path.join(victim.dir, "dump.rdb")
        if os.path.exists(dump):
            os.remove(dump)
        new = master_port(sentinels)
        victim.start(["--replicaof", "127.0.0.1", str(new)] if new else [])
    else:
        victim.signal(signal.SIGSTOP)
        time.sleep(freeze)
        victim.signal(signal.SIGCONT)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=int, default=200, help="requests a second, both gateways")
    ap.add_argument("--failover-every", type=float, default=120, help="seconds")
    ap.add_argument("--freeze", type=float, default=15, help="seconds a SIGSTOP lasts")
    ap.add_argument("--on-error", default="local")
    ap.add_argument("--binary")
    args = ap.parse_args()
    binary = args.binary or next(
        (p for p in (os.path.join(ROOT, "target/release/tollgate"),
                     os.path.join(ROOT, "target/debug/tollgate")) if os.path.exists(p)), None)
    if not binary:
        sys.exit("soak: no tollgate binary; cargo build --release, or pass --binary")

    root = tempfile.mkdtemp(prefix="tollgate-soak-")
    procs, gateways = [], []
    stop = threading.Event()
    try:
        master = Redis(root, "a", [])
        replica = Redis(root, "b", ["--replicaof", "127.0.0.1", str(master.port)])
        servers = {master.port: master, replica.port: replica}
        procs += [master, replica]
        wait_until("replica sync", lambda: "master_link_status:up"
                   in (cli(replica.port, "INFO", "replication") or ""))
        sentinels = []
        for i in range(3):
            conf = os.path.join(root, f"sentinel{i}.conf")
            port = free_port()
            with open(conf, "w") as f:
                f.write(f"port {port}\nsentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                        f"sentinel failover-timeout {SERVICE} 3000\n")
            s = Redis.__new__(Redis)
            s.dir, s.port, s.args, s.proc = os.path.join(root, f"s{i}"), port, [conf, "--sentinel"], None
            os.makedirs(s.dir, exist_ok=True)
            s.start()
            sentinels.append(s)
            procs.append(s)
        nodes = ", ".join(f"127.0.0.1:{s.port}" for s in sentinels)
        for name in ("gw1", "gw2"):
            gateways.append(Gateway(root, name, binary, nodes, args.on_error))

        tally = Tally()
        per_worker = 4
        threads = []
        for g in gateways:
            for _ in range(per_worker):
                interval = len(gateways) * per_worker / args.rate
                t = threading.Thread(target=worker, args=(g.port, interval, stop, tally), daemon=True)
                t.start()
                threads.append(t)

        print(f"soak: {args.minutes} min, {args.rate} req/s over 2 gateways, on_error: {args.on_error}, "
              f"failover every {args.failover_every:.0f}s (kill -9 / SIGSTOP {args.freeze:.0f}s), "
              f"SIGHUP every 60s; logs in {root}", flush=True)
        print("min  requests   5xx  admitted   counted  counted/admitted  rss_kb(gw1,gw2)  fds(gw1,gw2)  failovers", flush=True)
        start = time.monotonic()
        end = start + args.minutes * 60
        # Faults fall between the per-minute lines, not on them.
        next_fault = start + args.failover_every - 30
        next_hup = start + 60
        next_print = start + 60
        kills = 0
        minute = 0
        last = (0, 0, 0)
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_fault:
                # In its own thread: a freeze lasts --freeze seconds, and the
                # per-minute lines must not wait for it.
                threading.Thread(target=fault, args=(sentinels, servers, kills, args.freeze),
                                 daemon=True).start()
                kills += 1
                next_fault += args.failover_every
            if now >= next_hup:
                for g in gateways:
                    g.proc.send_signal(signal.SIGHUP)
                next_hup += 60
            if now >= next_print:
                minute += 1
                req, err, adm = tally.snapshot()
                port = master_port(sentinels)
                count = counted(port) if port else None
                ratio = f"{100.0 * count / adm:.2f} %" if count is not None and adm else "-"
                fo = sum(g.metric("tollgate_store_failovers_total") or 0 for g in gateways)
                print(f"{minute:3d}  {req - last[0]:8d}  {err - last[1]:4d}  {adm:8d}  "
                      f"{count if count is not None else '-':>8}  {ratio:>16}  "
                      f"{gateways[0].rss_kb():7d},{gateways[1].rss_kb():7d}  "
                      f"{gateways[0].fds():5d},{gateways[1].fds():5d}  {fo:9.0f}", flush=True)
                last = (req, err, adm)
                next_print += 60
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(timeout=10)
        # The last backlog reaches Redis with the next decision; one more
        # request through each gateway, then the final count.
        time.sleep(1)
        req, err, adm = tally.snapshot()
        port = master_port(sentinels)
        count = counted(port) if port else None
        print(f"end: {req} requests, {err} 5xx, {adm} admitted, {count} counted on the master "
              f"({100.0 * (count or 0) / max(adm, 1):.2f} %), {kills} faults", flush=True)
    finally:
        stop.set()
        for g in gateways:
            g.stop()
        for p in procs:
            p.signal(signal.SIGCONT)
            p.stop()


if __name__ == "__main__":
    main()
