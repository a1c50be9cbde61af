//! Redis Cluster: a decision is one script call of its own ([`decide`];
//! no batches, see `batch`), unless its limits sit in several hash slots.
//!
//! Every script call must touch one slot. Keys carry the caller's identity
//! as a hash tag (`tollgate:{ip:…}…`), so the limits of one identity share a
//! slot and are decided together, atomically, by one `EVALSHA` as on a
//! single server. A request whose limits count different identities (say
//! `ip` and `api_key`) has keys in different slots, often on different
//! nodes, and no single script can decide them.
//!
//! Such a request is decided slot group by slot group, **in ascending slot
//! order** (a fixed order, so two requests contending for the same groups
//! meet them in the same sequence). Each group's call consumes ("reserves")
//! when that group admits. When every group admits the request is admitted.
//! When a group denies, or a call fails, the groups that reserved are given
//! back with [`refund.lua`](REFUND) and the request is denied (or the error
//! goes to the failure policy).
//!
//! The bound this leaves, compared with one atomic decision:
//! - **Never more admitted than the limit.** A reservation is counted by
//!   everyone while it stands, so concurrent requests can only be denied
//!   because of it, not admitted.
//! - **Spurious denials while a reservation stands.** Between a reservation
//!   and its refund (one to a few round trips) another request of the same
//!   identity can be denied by units that are about to be given back: at
//!   most the cost of the requests in flight across slots.
//! - **A refund that cannot be delivered** (Redis failed or the deadline
//!   passed between the calls) leaves its units consumed: the limit admits
//!   up to that cost less until the window has decayed (at most two
//!   windows). The refund has its own timeout, so a denied cross-slot
//!   request takes at most twice `store.redis.timeout`.
//! - With `clock: redis` the refund reads `TIME` again; a window boundary
//!   between the reservation and the refund can put the refund into the
//!   other count of the two (an error of at most the cost, for one window).
//! - A denied request shows every limit without it: the limits of the
//!   denying slot group as the script reads them, a refunded limit as the
//!   refund leaves it (its remaining quota and reset at the refund's
//!   instant). A limit whose reservation stands (below, or a refund that
//!   failed) shows it taken, as it is.
//! - Only `sliding_window` limits are refunded. Units a reservation took
//!   from a `fixed_window`, `sliding_log` or `gcra` limit stay consumed until
//!   that limit's window (or emission interval) passes: such a limit can
//!   deny up to the cost of each refused cross-slot request too early, never
//!   admit too much. Keep such limits' keys in one slot (the same identity)
//!   to avoid it.

use std::borrow::Cow;

use fred::types::{ClusterHash, Value};
use fred::util::redis_keyslot;
use tokio::time::Instant;
use tracing::warn;

use super::clients::{Clients, slot_groups};
use super::script::{Encoded, SERVER_CLOCK, parse_replies};
use crate::limit::{Answer, LimitRequest, Standing, sliding_window};
use crate::store::contract::StoreError;

/// Gives back a reservation; its header comment names `KEYS` and `ARGV`.
pub const REFUND: &str = concat!(include_str!("arith.lua"), include_str!("refund.lua"));

/// Decides one request in a Cluster, within `deadline`: in one call when
/// its keys share a slot, slot group by slot group when they do not.
pub(super) async fn decide(
    clients: &Clients,
    deadline: Instant,
    now_ms: u64,
    requests: &[LimitRequest],
) -> Result<Answer, StoreError> {
    // Keys in several Cluster slots, reserved slot by slot.
    if spans_slots(requests) {
        return decide_across_slots(clients, deadline, now_ms, requests).await;
    }
    tokio::time::timeout_at(
        deadline,
        decide_in_one_call(clients, deadline, now_ms, requests),
    )
    .await
    .unwrap_or(Err(StoreError::Timeout))
}

/// Decides `requests` (a whole request, or one slot group of it) in one
/// script call.
async fn decide_in_one_call(
    clients: &Clients,
    deadline: Instant,
    now_ms: u64,
    requests: &[LimitRequest],
) -> Result<Answer, StoreError> {
    let encoded = Encoded::new(now_ms, requests, clients.server_clock())?;
    let slot = first_key_slot(requests);
    let reply = clients
        .call(deadline, slot, std::iter::once(&encoded))
        .await?;
    parse_replies(reply, std::iter::once(requests.len()))?
        .pop()
        .unwrap_or_else(|| Err(StoreError::Protocol("script reply is empty".into())))
}

/// Whether the keys of `requests` fall in more than one hash slot.
fn spans_slots(requests: &[LimitRequest]) -> bool {
    let mut slots = requests
        .iter()
        .map(|r| redis_keyslot(r.key.text().as_bytes()));
    match slots.next() {
        Some(first) => slots.any(|s| s != first),
        None => false,
    }
}

/// The hash slot of the first key, as fred's routing for a custom command
/// (`ClusterHash::Custom`); a random node when there is no key.
fn first_key_slot(requests: &[LimitRequest]) -> ClusterHash {
    requests.first().map_or(ClusterHash::Random, |r| {
        ClusterHash::Custom(redis_keyslot(r.key.text().as_bytes()))
    })
}

/// Decides a request whose keys span several slots: reserve slot group
/// by slot group in ascending order, refund on a deny (module docs).
async fn decide_across_slots(
    clients: &Clients,
    deadline: Instant,
    now_ms: u64,
    requests: &[LimitRequest],
) -> Result<Answer, StoreError> {
    let mut outcomes: Vec<Option<Standing>> = vec![None; requests.len()];
    let mut reserved: Vec<Vec<usize>> = Vec::new();
    let mut failure = None;
    let texts: Vec<Cow<'_, str>> = requests.iter().map(|r| r.key.text()).collect();
    for group in slot_groups(true, texts.iter().map(|t| &**t)) {
        let part: Vec<LimitRequest> = group.iter().map(|&i| requests[i].clone()).collect();
        let decided = tokio::time::timeout_at(
            deadline,
            decide_in_one_call(clients, deadline, now_ms, &part),
        )
        .await
        .unwrap_or(Err(StoreError::Timeout));
        match decided {
            Ok(d) => {
                for (&i, o) in group.iter().zip(d.outcomes) {
                    outcomes[i] = Some(o);
                }
                if d.allowed {
                    reserved.push(group);
                }
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let allowed = failure.is_none() && outcomes.iter().all(|o| o.is_some_and(|o| o.admits));
    if !allowed && !reserved.is_empty() {
        // Its own budget: the decision's deadline may be spent.
        let refund_by = Instant::now() + clients.timeout;
        for group in &reserved {
            match refund(clients, refund_by, now_ms, requests, group).await {
                // Each refunded limit shows its counter as the refund
                // left it: a read at cost 0, as the script answers for
                // the limits of a denied request.
                Ok((at, left)) => {
                    for (i, state) in left {
                        let r = &requests[i];
                        let w = r.window_ms.max(1);
                        let shown = sliding_window::check(state.at(at / w), at, r.limit, w, 0);
                        if let Some(o) = outcomes[i].as_mut() {
                            o.remaining = shown.remaining;
                            o.reset_ms = shown.reset_ms;
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "could not refund a cross-slot reservation; those units stay consumed until the window decays");
                }
            }
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let outcomes = outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| StoreError::Protocol("a slot group went undecided".into())))
        .collect::<Result<_, _>>()?;
    Ok(Answer { allowed, outcomes })
}

/// Gives back what the decision script consumed for `group` at `now_ms`.
/// Returns the instant of the refund (`now_ms`, or the server's with
/// `clock: redis`) and each refunded request's counter as it left it.
async fn refund(
    clients: &Clients,
    deadline: Instant,
    now_ms: u64,
    requests: &[LimitRequest],
    group: &[usize],
) -> Result<(u64, Vec<(usize, sliding_window::Counts)>), StoreError> {
    // refund.lua understands the sliding-window counter only; units a
    // reservation took from a limit of another algorithm stay consumed
    // until its window passes (never an over-admission; see module docs).
    let group: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| requests[i].algorithm.refundable())
        .collect();
    if group.is_empty() {
        return Ok((now_ms, Vec::new()));
    }
    let group = &group[..];
    let texts: Vec<Cow<'_, str>> = group.iter().map(|&i| requests[i].key.text()).collect();
    let keys: Vec<&str> = texts.iter().map(|t| &**t).collect();
    let mut args = Vec::with_capacity(1 + 2 * group.len());
    args.push(if clients.server_clock() {
        Value::from(SERVER_CLOCK)
    } else {
        Value::Integer(i64::try_from(now_ms).unwrap_or(i64::MAX))
    });
    for &i in group {
        args.push(Value::Integer(
            i64::try_from(requests[i].window_ms).unwrap_or(i64::MAX),
        ));
        args.push(Value::Integer(
            i64::try_from(requests[i].units()).unwrap_or(i64::MAX),
        ));
    }
    let reply = clients.eval_by(deadline, REFUND, &keys, args).await?;
    parse_refund(reply, group)
}

/// Reads refund.lua's reply, `{ now, window, prev, cur, ... }` with one
/// counter per request of `group`.
fn parse_refund(
    reply: Value,
    group: &[usize],
) -> Result<(u64, Vec<(usize, sliding_window::Counts)>), StoreError> {
    let bad = || StoreError::Protocol(format!("refund replied {reply:?}"));
    let Value::Array(items) = &reply else {
        return Err(bad());
    };
    if items.len() != 1 + 3 * group.len() {
        return Err(bad());
    }
    let mut ints = items.iter().map(|v| match v {
        Value::Integer(i) => u64::try_from(*i).ok(),
        _ => None,
    });
    let mut next = || ints.next().flatten().ok_or_else(bad);
    let at = next()?;
    let mut left = Vec::with_capacity(group.len());
    for &i in group {
        let (window, prev, cur) = (next()?, next()?, next()?);
        left.push((i, sliding_window::Counts { window, prev, cur }));
    }
    Ok((at, left))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    fn req(key: &str) -> LimitRequest {
        LimitRequest {
            key: key.into(),
            limit: 1,
            window_ms: 1_000,
            cost: 1,
            algorithm: Algorithm::SlidingWindow,
            mode: Default::default(),
        }
    }

    #[test]
    fn hash_tags_keep_one_identity_in_one_slot() {
        let same = [req("t:{ip:1.2.3.4}:r:a"), req("t:{ip:1.2.3.4}:r:b")];
        assert!(!spans_slots(&same));
        let split = [req("t:{ip:1.2.3.4}:r:a"), req("t:{key:abc}:r:b")];
        assert!(spans_slots(&split));
        assert!(!spans_slots(&[]));
    }

    #[test]
    fn reads_the_counters_a_refund_leaves() {
        let ints = |v: &[i64]| Value::Array(v.iter().copied().map(Value::Integer).collect());
        let (at, left) = parse_refund(ints(&[100_500, 100, 4, 5, 0, 0, 0]), &[2, 0]).unwrap();
        assert_eq!(at, 100_500);
        let counter = |window, prev, cur| sliding_window::Counts { window, prev, cur };
        assert_eq!(left, [(2, counter(100, 4, 5)), (0, counter(0, 0, 0))]);
        for bad in [
            ints(&[100_500, 100, 4]),                // too short
            ints(&[100_500, 100, -1, 5]),            // negative
            Value::Array(vec![Value::from("1"); 4]), // not integers
            Value::Integer(1),                       // the old reply
        ] {
            assert!(matches!(
                parse_refund(bad, &[0]),
                Err(StoreError::Protocol(_))
            ));
        }
    }

    #[test]
    fn groups_come_in_ascending_slot_order() {
        let reqs: Vec<LimitRequest> = (0..20).map(|i| req(&format!("{{id{i}}}"))).collect();
        let texts: Vec<String> = reqs.iter().map(|r| r.key.to_string()).collect();
        let groups = slot_groups(true, texts.iter().map(String::as_str));
        let slots: Vec<u16> = groups
            .iter()
            .map(|g| redis_keyslot(texts[g[0]].as_bytes()))
            .collect();
        assert!(slots.windows(2).all(|w| w[0] < w[1]), "{slots:?}");
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), 20);
    }
}
