#!/usr/bin/env bash
# Renders the HTML report of `tollgate simulate` in headless Chromium and
# writes a PNG, to check the chart by eye. Nothing is written in the repo.
#
#   scripts/screenshot-simulate.sh [OUT.png]     # default /tmp/tollgate-simulate.png
#
# A sample log (6 hours, a few heavy callers) is generated with
# scripts/gen-access-log.py and replayed through gateway.yaml. Needs
# chromium (`apt-get install -y chromium`) and a built tollgate
# (target/release, else target/debug, else it builds the debug one).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/tollgate-simulate.png}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=target/release/tollgate
[ -x "$bin" ] || bin=target/debug/tollgate
[ -x "$bin" ] || { cargo build; bin=target/debug/tollgate; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "no chromium: apt-get install -y chromium" >&2; exit 1; }

python3 scripts/gen-access-log.py --lines 200000 --identities 2000 --rate 10 \
  --seed 3 --out "$work/access.log"
"$bin" simulate --config gateway.yaml "$work/access.log" \
  --field x-forwarded-for --field x-api-key --format html --out "$work/report.html"
"$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run \
  --user-data-dir="$work/profile" --hide-scrollbars \
  --window-size=1060,2600 --screenshot="$out" "file://$work/report.html" 2>/dev/null
echo "$out"
