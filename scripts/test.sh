#!/usr/bin/env bash
# Runs tollgate's whole test suite. Installs redis-server (Debian/Ubuntu) when
# it is missing: the tests start real Redis servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Cluster tests join nodes with redis-cli (package redis-tools, normally
# pulled in by redis-server). Sentinels run as `redis-server --sentinel`.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# tests/browsers.rs drives a real headless Chromium (Debian's package).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} with apt-get" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The package starts a system instance on 6379; the tests never use it.

exec cargo test --all-targets "$@"
