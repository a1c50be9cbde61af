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

# compose.yaml is checked with `docker-compose config`, which needs no
# engine: the Docker engine it recommends is left out.
if ! command -v docker-compose >/dev/null 2>&1; then
    echo "installing docker-compose with apt-get" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi

# deploy/kubernetes is rendered with `kubectl kustomize`. kubectl is not a
# Debian package; without it that one test says it skipped.
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the Kubernetes manifest test (tests/operations/deploy.rs) is skipped" >&2
fi

exec cargo test --all-targets "$@"
