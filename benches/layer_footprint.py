#!/usr/bin/env python3
"""The code each row of `benches/layer.rs` runs per request, against the
first-level instruction cache.

Runs rows of a bench binary under callgrind with its cache simulation (a
32 KiB, 8-way instruction cache of 64-byte lines, as this machine's) and
counts, per iteration: the instructions, the 64-byte lines of code run at
least every other iteration (the row's hot code), the cache sets that hold
more hot lines than they have ways, and the simulated instruction-cache
misses; with `--top N`, the functions those misses fall in.

    python3 benches/layer_footprint.py BINARY [--rows "tollgate gcra,..."] [--top 20]

BINARY is a bench binary (`target/release/deps/layer-*`, or a layout of
`benches/layer_layouts.py`). A row whose hot lines fill more sets than the
cache has ways misses on them every iteration: that, more than the count of
instructions, is what its time pays for past the bare service.
"""

import argparse
import collections
import os
import re
import subprocess
import tempfile

ROWS = "bare service,tollgate sliding_window,tollgate gcra,tower_governor gcra headers"
SETS, WAYS, LINE = 64, 8, 64


def profile(binary, row, out):
    subprocess.run(
        [
            "valgrind", "--tool=callgrind", "--dump-instr=yes", "--cache-sim=yes",
            f"--I1={SETS * WAYS * LINE},{WAYS},{LINE}", "--D1=49152,12,64", "--LL=1048576,8,64",
            f"--callgrind-out-file={out}", binary, "--bench", "--profile-time", "2", f"^layer/{row}$",
        ],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def read(path):
    """Per instruction address: its object, function, Ir and I1 misses;
    and the calls of the bench's per-iteration request builder."""
    names, ir, miss, fn_of = {}, collections.Counter(), collections.Counter(), {}
    ob = fn = None
    addr, skip, iters, cfn = 0, False, 0, None
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?", line)
        if m:
            key = m.group(2) + m.group(3)
            if m.group(4):
                names[key] = m.group(4)
            if m.group(1) == "":
                if m.group(2) == "fn":
                    fn = names.get(key)
                else:
                    ob = names.get(key)
            elif m.group(2) == "fn":
                cfn = names.get(key)
            continue
        if line.startswith("calls="):
            # The bench builds one request per iteration.
            if cfn == "layer::request":
                iters += int(line.split("=")[1].split()[0])
            skip = True
            continue
        if not line or line[0] not in "0123456789+-*":
            continue
        p = line.split()
        a = p[0]
        if a.startswith("0x"):
            addr = int(a, 16)
        elif a.startswith("+"):
            addr += int(a[1:])
        elif a.startswith("-"):
            addr -= int(a[1:])
        if skip:
            skip = False
            continue
        if len(p) < 3:
            continue
        k = (ob, addr)
        ir[k] += int(p[2])
        if len(p) > 5:
            miss[k] += int(p[5])
        fn_of[k] = fn
    return ir, miss, fn_of, iters


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--rows", default=ROWS, help="comma-separated row names")
    ap.add_argument("--top", type=int, default=0, help="functions to list by their misses")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tollgate-footprint-")
    for row in a.rows.split(","):
        out = os.path.join(work, row.replace(" ", "_") + ".out")
        profile(os.path.abspath(a.binary), row, out)
        ir, miss, fn_of, iters = read(out)
        iters = max(iters, 1)
        hot = {}
        for k, c in ir.items():
            if c >= iters / 2:
                hot.setdefault((k[0], k[1] // LINE), fn_of[k])
        per_set = collections.Counter(l % SETS for _, l in hot)
        over = sum(1 for v in per_set.values() if v > WAYS)
        print(
            f"{row:30s} hot lines {len(hot):4d}"
            f" ({len(hot) * LINE // 1024} KiB)  sets over {WAYS} ways {over:2d}"
            f"  I1 misses {sum(miss.values()) / iters:6.1f}"
        )
        if a.top:
            lines = collections.Counter(hot.values())
            by_fn = collections.Counter()
            for k, c in miss.items():
                by_fn[fn_of[k]] += c
            for name, c in by_fn.most_common(a.top):
                print(f"    {c / iters:6.1f} misses {lines[name]:3d} lines  {str(name)[:110]}")


if __name__ == "__main__":
    main()
