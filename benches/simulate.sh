#!/usr/bin/env bash
# Times `tollgate simulate` on generated combined-format logs and reports
# lines per second and peak memory (docs/simulate.md, "Speed").
#
#   benches/simulate.sh            # 1,000,000 lines, plain
#   LINES=10000000 GZ=1 benches/simulate.sh
#
# The log is written once to $WORK (default /tmp/tollgate-simulate) by
# scripts/gen-access-log.py and reused. The configuration is gateway.yaml,
# whose `api` route has two limits (per_caller, per_ip); the log's extra
# fields are X-Forwarded-For and X-API-Key. Needs a release build
# (`cargo build --release`; this script builds it if missing) and GNU time
# (/usr/bin/time) for the peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${LINES:-1000000}
IDENTITIES=${IDENTITIES:-5000}
WORK=${WORK:-/tmp/tollgate-simulate}
RUNS=${RUNS:-3}
mkdir -p "$WORK"
log="$WORK/access-$LINES.log"
[ "${GZ:-0}" = 1 ] && log="$log.gz"
if [ ! -s "$log" ]; then
  gz=(); [ "${GZ:-0}" = 1 ] && gz=(--gz)
  echo "writing $log" >&2
  python3 scripts/gen-access-log.py --lines "$LINES" --identities "$IDENTITIES" \
    --rate 300 --seed 1 "${gz[@]}" --out "$log"
fi
bin=target/release/tollgate
[ -x "$bin" ] || cargo build --release
echo "$(nproc) cores; $(du -h "$log" | cut -f1) $log"
for i in $(seq "$RUNS"); do
  /usr/bin/time -v "$bin" simulate --config gateway.yaml "$log" \
    --field x-forwarded-for --field x-api-key --format json --out "$WORK/report.json" \
    2> "$WORK/time.txt"
  wall=$(grep "Elapsed (wall clock)" "$WORK/time.txt" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$WORK/time.txt" | awk '{print $NF}')
  user=$(grep "User time" "$WORK/time.txt" | awk '{print $NF}')
  python3 - "$WORK/report.json" "$wall" "$rss" "$user" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["input"]
print("run: %d lines in %.2f s replay (%s wall, %s s CPU): %d lines/s, peak RSS %.1f MiB; load average %s"
      % (r["lines"], r["seconds"], sys.argv[2], sys.argv[4], r["lines_per_second"],
         int(sys.argv[3]) / 1024, sys.argv[5]))
PY
done
