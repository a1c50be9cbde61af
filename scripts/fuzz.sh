#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ and prints, per target, the executions and
# the result.
#
#   scripts/fuzz.sh SECONDS [TARGET...]   each target for SECONDS, growing the
#                                         local corpus fuzz/corpus/TARGET
#   scripts/fuzz.sh --ci [TARGET...]      the deterministic pass CI runs: the
#                                         checked-in seeds, then a fixed number
#                                         of fresh inputs from seed 1
#
# With no TARGET, every target in fuzz/Cargo.toml runs. Seeds live in
# fuzz/seeds/TARGET (small, minimised, checked in); the corpus a run grows,
# crash artifacts and logs stay out of the repository (fuzz/.gitignore).
# Uses nightly where installed, else the stable toolchain with
# RUSTC_BOOTSTRAP=1. `-s none`: tollgate has no unsafe code, so a panic or a
# target's own assertion is what a finding is, and no sanitizer is needed.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

usage() { echo "usage: $0 SECONDS|--ci [TARGET...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
mode=$1; shift
# Fresh inputs per target in --ci, sized to about 20 s each on a 2-core
# machine (the loader, the expansion and the address walk are the slow
# ones; the usage reader reads each input three ways, some compressed).
# FUZZ_CI_RUNS sets one number for all.
ci_runs() {
    if [ -n "${FUZZ_CI_RUNS:-}" ]; then echo "$FUZZ_CI_RUNS"; return; fi
    case "$1" in
        config) echo 300000 ;;
        expand) echo 500000 ;;
        forwarded) echo 1200000 ;;
        admin_request) echo 800000 ;;
        usage) echo 80000 ;;
        h1_response) echo 200000 ;;
        http1_diff) echo 400000 ;;
        *) echo 3000000 ;;
    esac
}
case "$mode" in
    --ci) ;;
    ''|*[!0-9]*) usage ;;
esac

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz" >&2
    cargo install --locked --quiet cargo-fuzz
fi
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <("${fuzz[@]}" list)
fi

mkdir -p logs
if ! "${fuzz[@]}" build -s none >logs/build.log 2>&1; then
    tail -n 30 logs/build.log >&2
    exit 1
fi
failed=0
printf '%-16s %14s  %s\n' target executions result
for t in "${targets[@]}"; do
    mkdir -p "seeds/$t"
    if [ "$mode" = --ci ]; then
        corpus=$(mktemp -d)
        args=(-runs="$(ci_runs "$t")" -seed=1)
    else
        corpus="corpus/$t"
        mkdir -p "$corpus"
        args=(-max_total_time="$mode")
    fi
    log="logs/$t.log"
    if "${fuzz[@]}" run -s none "$t" "$corpus" "seeds/$t" -- \
        "${args[@]}" -print_final_stats=1 >"$log" 2>&1; then
        result=clean
    else
        result="FAILED: $(grep -m1 -oE 'Test unit written to [^ ]+' "$log" || echo "see fuzz/$log")"
        failed=1
    fi
    [ "$mode" = --ci ] && rm -rf "$corpus"
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    printf '%-16s %14s  %s\n' "$t" "${execs:-?}" "$result"
done
exit $failed
