#!/usr/bin/env bash
# Runs tollgate's whole test suite. Installs redis-server (Debian/Ubuntu) when
# it is missing: the tests start real Redis servers on free ports. The gRPC
# tests (tests/grpc.rs) drive Python's grpcio, installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Cluster tests join nodes with redis-cli (package redis-tools, normally
# pulled in by redis-server). Sentinels run as `redis-server --sentinel`.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# tests/browsers.rs drives a real headless Chromium (Debian's package).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# tests/edge.rs reads a listener's accept queue with `ss`.
command -v ss >/dev/null 2>&1 || missing+=(iproute2)
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
# Debian package; without it that one test prints a SKIPPED line.
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the Kubernetes manifest test (tests/operations/deploy.rs) is skipped" >&2
fi

# grpcio from PyPI; where pip is missing or the system Python refuses it
# (PEP 668), Debian's own package.
if ! python3 -c 'import grpc' >/dev/null 2>&1; then
    echo "installing grpcio for the gRPC tests" >&2
    python3 -m pip install --quiet grpcio >/dev/null 2>&1 \
        || python3 -m pip install --quiet --break-system-packages grpcio >/dev/null 2>&1 \
        || {
            SUDO=""
            if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
            $SUDO apt-get update -qq
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-grpcio >/dev/null
        }
fi

# The official openai package for the token-limit tests
# (tests/limits/tokens.rs); without it they print a SKIPPED line.
if ! python3 -c 'import openai' >/dev/null 2>&1; then
    echo "installing openai for the token-limit tests" >&2
    python3 -m pip install --quiet openai >/dev/null 2>&1 \
        || python3 -m pip install --quiet --break-system-packages openai >/dev/null 2>&1 \
        || echo "could not install openai: the token-limit tests that drive it are skipped" >&2
fi

cargo test --all-targets "$@"

# The edge's contract and the crates whose gateways serve clients over
# HTTP/1.1 a second time with hyper's HTTP/1.1 server and client
# (server.http1: hyper, which an operator can go back to) serving every
# test gateway. The Redis crate is left to the default pass: its gateways'
# HTTP/1.1 is what the other crates cover, and its failover tests take
# minutes.
TOLLGATE_TEST_HTTP1=hyper cargo test --test edge --test target --test gateway --test tls \
    --test limits --test pools --test callers --test operations --test grpc --test browsers "$@"
