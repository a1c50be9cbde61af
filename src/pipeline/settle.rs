//! Where the pipeline settles reserved costs (the rules are in
//! [`crate::decision::settle`]): [`prepare`] before `act` (a byte quota on
//! the request puts a [`BodyBytes`] count on it for the forwarder), and
//! [`finish`] on `act`'s answer — a `from_header` amount settled before
//! the response leaves, the rest handed to a [`Watch`] on its body that
//! settles when the body ends, in a task of its own (never in `Drop`).
//!
//! A request that fails before the upstream answers (502, 504, a broken
//! client body) settles its byte quotas with the bytes counted; a
//! reservation waiting for a header or trailer stands.

use std::sync::Arc;

use http::{HeaderMap, Request, Response};
use http_body_util::Either;

use super::gateway::Gateway;
use crate::clock::Clock;
use crate::decision::limiter::Limiter;
use crate::decision::settle::{self, Reservations};
use crate::problem::GatewayError;
use crate::proxy::{Body, BodyBytes, ClientBody, Watch};

/// A request's reservations and the count of its forwarded body bytes.
pub(super) struct Settling {
    pending: Reservations,
    request_bytes: Option<BodyBytes>,
}

/// Takes the decision's reservations; counts the request's body bytes
/// when a byte quota needs them.
pub(super) fn prepare(
    reservations: Option<Reservations>,
    req: &mut Request<ClientBody>,
) -> Option<Settling> {
    let pending = reservations?;
    let request_bytes = pending.counts_request().then(|| {
        let count = BodyBytes::default();
        req.extensions_mut().insert(count.clone());
        count
    });
    Some(Settling {
        pending,
        request_bytes,
    })
}

/// Settles what `answer` settles at once and watches its body for the
/// rest; returns the answer.
pub(super) async fn finish(
    gw: &Gateway,
    settling: Option<Settling>,
    answer: Result<Response<Body>, GatewayError>,
) -> Result<Response<Body>, GatewayError> {
    let Some(Settling {
        mut pending,
        request_bytes,
    }) = settling
    else {
        return answer;
    };
    let sent = || request_bytes.as_ref().map_or(0, BodyBytes::get);
    let mut res = match answer {
        Ok(res) => res,
        Err(e) => {
            let settlements = pending.at_end(gw.limiter.settler(), None, sent(), 0);
            settle::settle(gw.limiter.settler(), gw.clock.now_ms(), &settlements).await;
            return Err(e);
        }
    };
    pending
        .header(gw.limiter.settler(), gw.clock.now_ms(), res.headers())
        .await;
    if !pending.waits_for_body() {
        return Ok(res);
    }
    let watch = SettleWatch {
        pending: Some(pending),
        limiter: Arc::clone(&gw.limiter),
        clock: Arc::clone(&gw.clock),
        request_bytes,
        response_bytes: 0,
        trailers: None,
    };
    match res.body_mut() {
        Either::Left(watched) => watched.add_watch(Box::new(watch)),
        // A body the gateway made itself carries nothing of the upstream's.
        Either::Right(_) => {
            let mut watch = watch;
            watch.end(true);
        }
    }
    Ok(res)
}

/// Counts a response body and settles the reservations left when it ends.
struct SettleWatch {
    pending: Option<Reservations>,
    limiter: Arc<Limiter>,
    clock: Arc<dyn Clock>,
    request_bytes: Option<BodyBytes>,
    response_bytes: u64,
    trailers: Option<HeaderMap>,
}

impl Watch for SettleWatch {
    fn data(&mut self, len: usize) {
        self.response_bytes = self.response_bytes.saturating_add(len as u64);
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        self.trailers = Some(trailers.clone());
    }

    fn end(&mut self, _complete: bool) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let request_bytes = self.request_bytes.as_ref().map_or(0, BodyBytes::get);
        let settlements = pending.at_end(
            self.limiter.settler(),
            self.trailers.as_ref(),
            request_bytes,
            self.response_bytes,
        );
        if settlements.is_empty() {
            return;
        }
        // Never block here: `end` may run in a drop. Without a runtime (a
        // body dropped at shutdown) the reservations stand.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = Arc::clone(&self.limiter);
        let now_ms = self.clock.now_ms();
        runtime.spawn(async move {
            settle::settle(limiter.settler(), now_ms, &settlements).await;
        });
    }
}
