#!/usr/bin/env python3
"""Callgrind instructions per request under wrk's load, for tollgate and
for nginx `proxy_pass`, on benches/load.py's fixture.

    python3 benches/callgrind_load.py tollgate|nginx [--http1 hyper|native]
        [--connections 50] [--no-access-log] [--binary PATH] [--seconds 10]
        [--keep DIR]

benches/callgrind_paths.py counts a minimal request on one connection
against a minimal upstream; this counts what benches/load.py measures in
CPU time: wrk's request (`wrk -t1 -cN`) through the contender to load.py's
nginx upstream (its answer carries nginx's fields), with the same
forwarded fields and, unless `--no-access-log`, the access log on both
sides (nginx's `access_log` to a file; tollgate's at `RUST_LOG=info` on
stderr to a file, its writer thread counted). The contender runs under
`valgrind --tool=callgrind` (nginx with `master_process off`, one
worker; tollgate with TOKIO_WORKER_THREADS=1); after a 3 s warm-up,
`callgrind_control --zero`, `--seconds` of load, `callgrind_control
--dump`: the whole process's instructions divided by the requests wrk saw
answered. Needs valgrind, wrk, nginx and redis-server (load.py's
fixture). Traffic goes only to 127.0.0.1. `--keep DIR` copies the measured
dump there (`callgrind_annotate DIR/cg.out.*`) before the temporary
directory goes.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load  # noqa: E402  (benches/load.py: the fixture)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("contender", choices=["tollgate", "nginx"])
    ap.add_argument("--http1", default="native", choices=["hyper", "native"])
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--no-access-log", action="store_true")
    ap.add_argument("--keep", metavar="DIR", help="copy the measured dump into DIR")
    ap.add_argument("--binary", default=os.path.join(load.ROOT, "target", "release", "tollgate"))
    args = ap.parse_args()
    logs = not args.no_access_log
    tmp = tempfile.mkdtemp(prefix="tollgate-cgload-")
    started = []
    try:
        _up, up_port, _redis, _redis_port, _keys = load.start_fixture(tmp, started)
        port = load.free_port()
        if args.contender == "nginx":
            d = os.path.join(tmp, "proxy")
            os.makedirs(d)
            conf = os.path.join(d, "nginx.conf")
            log = f"access_log {d}/access.log;" if logs else "access_log off;"
            with open(conf, "w") as f:
                f.write(f"master_process off; daemon off; worker_processes 1; pid {d}/nginx.pid;\n"
                        f"error_log {d}/error.log warn; events {{ worker_connections 4096; }}\n"
                        f"http {{ {log} client_body_temp_path {d}; proxy_temp_path {d}; "
                        f"fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n"
                        f"{load.nginx_proxy_pass(up_port, port)} }}\n")
            argv, env, err = [load.nginx_bin(), "-c", conf, "-p", d], {}, os.devnull
        else:
            cfg = os.path.join(tmp, "gateway.yaml")
            load.tollgate_config(cfg, port, up_port, "", http1=args.http1)
            argv = [args.binary, "--config", cfg]
            env = {"TOKIO_WORKER_THREADS": "1", "RUST_LOG": "info" if logs else "warn"}
            err = cfg + ".log"
        with open(err, "ab") as errf:
            p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out.%p"]
                                 + argv, env=dict(os.environ, **env), stdout=subprocess.DEVNULL,
                                 stderr=errf)
        load.wait_port(port, 300)
        wrk = ["wrk", "-t1", f"-c{args.connections}"]
        url = f"http://127.0.0.1:{port}/bench"
        subprocess.run(wrk + ["-d3s", url], capture_output=True)
        subprocess.run(["callgrind_control", "--zero", str(p.pid)], stdout=subprocess.DEVNULL)
        out = subprocess.run(wrk + [f"-d{args.seconds}s", url], capture_output=True, text=True).stdout
        subprocess.run(["callgrind_control", "--dump=measured", str(p.pid)], stdout=subprocess.DEVNULL)
        time.sleep(1)
        p.terminate()
        p.wait()
        reqs = int(re.search(r"(\d+) requests in", out).group(1))
        total = 0
        for f in glob.glob(f"{tmp}/cg.out.*"):
            with open(f, errors="ignore") as fh:
                text = fh.read()
            if "Trigger: dump measured" not in text:
                continue
            m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            total += int(m.group(1)) if m else 0
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(f, args.keep)
        what = args.contender if args.contender == "nginx" else f"tollgate {args.http1}"
        print(f"{what}, wrk -t1 -c{args.connections}, access log {'on' if logs else 'off'}: "
              f"{reqs} requests, {total // max(reqs, 1)} instructions per request")
    finally:
        load.stop_all(started, tmp)


if __name__ == "__main__":
    main()
