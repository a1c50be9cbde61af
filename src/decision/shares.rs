//! Whether the processes that count on one share agree on what it is.
//!
//! A share's counter is one Redis key for every process naming the share
//! — gateways and applications' layers, each with a file of its own — so
//! the loader, which sees one file, cannot hold them to one definition.
//! Beside the counters lies the share's fingerprint
//! ([`keys::share_definition`]): the first process to check writes its
//! own, every later one compares, and a process whose numbers differ says
//! so (a warning naming the share, and `tollgate_share_mismatches_total`)
//! rather than counting the same callers by other numbers in silence. It
//! keeps counting by its own numbers: which side is right is the
//! operator's call.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tracing::{debug, warn};

use super::limiter::Limiter;
use crate::config::Limit;
use crate::store::keys;

/// Waits for Redis (up to `startup_wait`), then checks the fingerprint of
/// every share among `limits` (the first limit of each share stands for
/// it); each mismatch is logged and counted on `mismatches`. Without
/// Redis there is nothing to share, and nothing is checked.
pub async fn check(
    limiter: Arc<Limiter>,
    prefix: String,
    limits: Vec<Limit>,
    startup_wait: Duration,
    mismatches: Option<Counter>,
) {
    let Some(redis) = limiter.admin().redis() else {
        return;
    };
    if !limiter.health().wait_ready(startup_wait).await {
        debug!("shares' fingerprints not checked: redis has not answered");
        return;
    }
    let mut seen: Vec<&str> = Vec::new();
    for limit in &limits {
        let Some(share) = limit.share.as_deref() else {
            continue;
        };
        if seen.contains(&share) {
            continue;
        }
        seen.push(share);
        let definition = limit.definition();
        let ours = keys::share_fingerprint(&definition);
        let key = keys::share_definition(&prefix, share);
        match redis.share_fingerprint(&key, &ours).await {
            Ok(theirs) if theirs == ours => {}
            Ok(theirs) => {
                warn!(
                    share,
                    ours = %ours,
                    theirs = %theirs,
                    definition = %definition,
                    "another process counts on this share with another definition (key, limit, window, algorithm or kind); both count on one counter"
                );
                if let Some(c) = &mismatches {
                    c.inc();
                }
            }
            Err(e) => debug!(share, error = %e, "share fingerprint not checked"),
        }
    }
}

/// Every limit with a share that `routes` and `limits` hold: what
/// [`check`] is given.
pub fn shared<'a>(routes: impl Iterator<Item = &'a [Limit]>, limits: &'a [Limit]) -> Vec<Limit> {
    routes
        .chain(std::iter::once(limits))
        .flatten()
        .filter(|l| l.share.is_some())
        .cloned()
        .collect()
}
