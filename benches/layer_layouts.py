#!/usr/bin/env python3
"""The layer's overhead against tower_governor's, over several code layouts.

A few tens of nanoseconds of one row of `benches/layer.rs` move with where
the linker happens to place the program's functions: two builds whose code
differs in a line the rows never run can put the same row 40 ns apart,
one in favour of tollgate, the next of governor. One build's figures are
then one draw of that lottery. This script builds the bench once (whole
program, as `cargo bench` does), links the same object again with the
functions in other orders (`rust-lld --shuffle-sections`, one seed per
layout), and runs each layout's rows interleaved, round after round.

Per run and row the figure is the 10th percentile of criterion's samples
(the machine's noise only adds time), less the bare service's; per layout
the median over rounds; the verdict is the median over layouts.

    python3 benches/layer_layouts.py [--layouts 6] [--rounds 2] [--time 2]
    python3 benches/layer_layouts.py --no-build   # the last build's object
    python3 benches/layer_layouts.py --rounds 0 --work DIR   # build and link only
    python3 benches/layer_layouts.py --no-build --also DIR   # DIR's layouts in the same rounds

Needs the Rust toolchain's `rust-lld` (shipped with rustup's toolchains)
and a C compiler driver (`cc`) to call it.
"""

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = [
    ("bare", "bare service"),
    ("sliding", "tollgate sliding_window"),
    ("gcra", "tollgate gcra"),
    ("governor-h", "tower_governor gcra headers"),
]
FILTER = "layer/(bare|tollgate (sliding|gcra)|tower_governor gcra headers)"


def gcc_ld():
    sysroot = subprocess.check_output(["rustc", "--print", "sysroot"], text=True).strip()
    host = re.search(
        r"^host: (\S+)", subprocess.check_output(["rustc", "-vV"], text=True), re.M
    ).group(1)
    path = os.path.join(sysroot, "lib", "rustlib", host, "bin", "gcc-ld")
    if not os.path.isfile(os.path.join(path, "ld.lld")):
        sys.exit(f"no rust-lld wrapper at {path}: install a rustup toolchain")
    return path


def build(work):
    """Builds the bench linked by rust-lld, keeping its object; returns the
    link command rustc ran (a list of arguments, its environment first)."""
    ld = gcc_ld()
    cmd = [
        "cargo", "rustc", "--profile", "bench", "--bench", "layer", "--",
        "-C", "save-temps", "--print", "link-args",
        "-C", "link-arg=-fuse-ld=lld", "-C", f"link-arg=-B{ld}",
    ]
    print("building:", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    line = next(l for l in out.splitlines() if '"-o"' in l)
    args = shlex.split(line)
    obj = next(a for a in args if a.endswith(".rcgu.o"))
    # The bitcode save-temps leaves is some hundreds of MB and read by nothing here.
    for bc in glob.glob(obj[: -len(".o")] + "*.bc"):
        os.remove(bc)
    # The object is kept with the layouts: the next build writes over it.
    kept = os.path.join(work, "layer.o")
    shutil.move(obj, kept)
    args = [kept if a == obj else a for a in args]
    with open(os.path.join(work, "link.txt"), "w") as f:
        f.write(shlex.join(args))
    return args


def link(args, out, seed):
    """The link command `args` with its output at `out`, functions in the
    order of `seed` (0: as rustc placed them)."""
    env = dict(os.environ)
    argv = []
    it = iter(args)
    for a in it:
        if "=" in a and not a.startswith("-") and not argv:
            k, v = a.split("=", 1)
            env[k] = v
            continue
        if a == "-o":
            next(it)
            argv += ["-o", out]
            continue
        argv.append(a)
    if seed:
        argv.append(f"-Wl,--shuffle-sections=.text*={seed}")
    subprocess.run(argv, env=env, check=True)


def run(binary, work, secs):
    """One run of the rows: per row, criterion's 10th percentile (ns)."""
    d = os.path.join(work, "run-" + os.path.basename(binary))
    os.makedirs(d, exist_ok=True)
    subprocess.run(["rm", "-rf", os.path.join(d, "target")], check=True)
    subprocess.run(
        [binary, "--bench", "--warm-up-time", "1", "--measurement-time", str(secs), "--noplot", FILTER],
        cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    p10 = {}
    for short, name in ROWS:
        path = os.path.join(d, "target", "criterion", "layer", name, "new", "sample.json")
        s = json.load(open(path))
        per = sorted(t / i for t, i in zip(s["times"], s["iters"]))
        p10[short] = per[len(per) // 10]
    return p10


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", type=int, default=6, help="layouts (the first is rustc's own order)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of every layout, interleaved")
    ap.add_argument("--time", type=float, default=2, help="criterion's measurement time per row (s)")
    ap.add_argument("--no-build", action="store_true", help="link the object of the last build again")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "tollgate-layouts"))
    ap.add_argument(
        "--also", action="append", default=[],
        help="the work directory of another build (say, an earlier revision's) whose layouts run in the same rounds",
    )
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if a.no_build:
        args = shlex.split(open(os.path.join(a.work, "link.txt")).read())
    else:
        args = build(a.work)
    builds = {a.work: []}
    for seed in range(a.layouts):
        out = os.path.join(a.work, f"layer-{seed}")
        link(args, out, seed)
        builds[a.work].append(out)
    if a.rounds == 0:
        print("linked:", " ".join(builds[a.work]))
        return
    for other in a.also:
        other_args = shlex.split(open(os.path.join(other, "link.txt")).read())
        builds[other] = []
        for seed in range(a.layouts):
            out = os.path.join(other, f"layer-{seed}")
            link(other_args, out, seed)
            builds[other].append(out)
    binaries = [b for seed in range(a.layouts) for b in (builds[w][seed] for w in builds)]
    over = {b: {k: [] for k, _ in ROWS[1:]} for b in binaries}
    for r in range(a.rounds):
        for b in binaries:
            load = open("/proc/loadavg").read().split()[0]
            p = run(b, a.work, a.time)
            for k, _ in ROWS[1:]:
                over[b][k].append(p[k] - p["bare"])
            print(
                f"round {r + 1} {name(b):24s} load {load:5s} bare {p['bare']:6.1f}  "
                + "  ".join(f"{k} +{p[k] - p['bare']:5.1f}" for k, _ in ROWS[1:]),
                flush=True,
            )
    for work, layouts in builds.items():
        print(f"\n{work}: overhead per layout (ns, median of rounds):")
        med = {k: [] for k, _ in ROWS[1:]}
        for b in layouts:
            m = {k: statistics.median(v) for k, v in over[b].items()}
            for k in m:
                med[k].append(m[k])
            print(f"  {os.path.basename(b):9s} " + "  ".join(f"{k} +{m[k]:5.1f}" for k in m))
        mid = {k: statistics.median(v) for k, v in med.items()}
        print("median over layouts: " + "  ".join(f"{k} +{v:.1f}" for k, v in mid.items()))
        for k in ("sliding", "gcra"):
            wins = sum(1 for t, g in zip(med[k], med["governor-h"]) if t <= g)
            print(
                f"  tollgate {k} / governor with headers: {mid[k] / mid['governor-h']:.3f}"
                f" (no slower in {wins} of {len(layouts)} layouts)"
            )


def name(binary):
    """A layout's name: its build's directory and its seed."""
    return os.path.basename(os.path.dirname(binary)) + "/" + os.path.basename(binary)


if __name__ == "__main__":
    main()
