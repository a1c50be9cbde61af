#!/usr/bin/env bash
# The long Redis failover tests (tests/redis/failover.rs, `#[ignore]`d in
# the ordinary suite): a Sentinel master frozen for 15 s under load, with
# `on_error: deny` and `local`. About a minute. CI runs it after the suite;
# `--nocapture` prints the figures docs/redis.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --test redis failover:: -- --ignored --nocapture "$@"
