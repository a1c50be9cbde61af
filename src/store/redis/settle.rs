//! Settling reservations in Redis: one `EVAL` of
//! [`settle.lua`](SETTLE) per key, so each settlement is atomic and lands
//! on its key's node in a Cluster; a request has one or two settled
//! limits, so one call each costs little. The rules are
//! [`crate::limit::settle`]'s, which the in-process store applies.

use fred::types::Value;
use tokio::time::Instant;

use super::clients::Clients;
use super::script::SERVER_CLOCK;
use crate::limit::calendar;
use crate::limit::settle::Settlement;
use crate::store::contract::StoreError;

/// The settle script with the shared prelude.
pub const SETTLE: &str = concat!(include_str!("arith.lua"), include_str!("settle.lua"));

/// Settles `settlements` at `now_ms`, all by one deadline (the store's
/// timeout from now).
///
/// # Errors
/// The first call that fails; the settlements after it are not sent (their
/// reservations stand).
pub(super) async fn send(
    clients: &Clients,
    now_ms: u64,
    settlements: &[Settlement],
) -> Result<(), StoreError> {
    let deadline = Instant::now() + clients.timeout;
    for s in settlements {
        let delta = s.bounded_delta();
        if delta == 0 || s.request.algorithm.unsettled_because().is_some() {
            continue;
        }
        let reply = clients
            .eval_by(
                deadline,
                SETTLE,
                &[&*s.request.key.text()],
                args(s, now_ms, delta, clients.server_clock()),
            )
            .await?;
        if !matches!(reply, Value::Integer(0 | 1)) {
            return Err(StoreError::Protocol(format!("settle replied {reply:?}")));
        }
    }
    Ok(())
}

/// settle.lua's ARGV for `s` (see the script's header).
fn args(s: &Settlement, now_ms: u64, delta: i128, server_clock: bool) -> Vec<Value> {
    let int = |n: u64| Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    let r = &s.request;
    let (month_res, month_now, month_end) = match r.algorithm.month(now_ms) {
        Some((now_idx, end)) => (calendar::month_index(s.reserved_at_ms), now_idx, end),
        None => (0, 0, 0),
    };
    let burst = r.algorithm.settle_arg();
    vec![
        if server_clock {
            Value::from(SERVER_CLOCK)
        } else {
            int(now_ms)
        },
        int(r.algorithm.code()),
        int(r.limit),
        int(r.window_ms),
        int(now_ms.saturating_sub(s.reserved_at_ms)),
        // Within ±2^52 (bounded_delta), so an i64.
        Value::Integer(i64::try_from(delta).unwrap_or(0)),
        int(month_res),
        int(month_now),
        int(month_end),
        int(burst),
    ]
}
