#!/usr/bin/env bash
# Runs tollgate's whole test suite. Installs redis-server (Debian/Ubuntu) when
# it is missing: the tests start real Redis servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis-server not found; installing it with apt-get" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
# The Cluster tests join nodes with redis-cli (package redis-tools, normally
# pulled in by redis-server). Sentinels run as `redis-server --sentinel`.
if ! command -v redis-cli >/dev/null 2>&1; then
    echo "redis-cli not found; installing redis-tools with apt-get" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-tools >/dev/null
fi
# The package starts a system instance on 6379; the tests never use it.

exec cargo test --all-targets "$@"
