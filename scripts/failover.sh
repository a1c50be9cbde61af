#!/usr/bin/env bash
# The long Redis failover tests (tests/redis/failover.rs, `#[ignore]`d in
# the ordinary suite): a Sentinel master frozen for 15 s under load, with
# `on_error: deny` and `local`, through one gateway (100 ms call timeout)
# and through two (the default 25 ms). About two minutes. CI runs it after
# the suite; `--nocapture` prints the figures docs/redis.md quotes. The
# Cluster's frozen master (tests/redis/cluster_failover.rs, 15 s) runs in
# the ordinary suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# One at a time: run together on a small machine, their 25 ms calls time
# out for want of CPU, not for the fault.
exec cargo test --test redis failover:: -- --ignored --nocapture --test-threads=1 "$@"
