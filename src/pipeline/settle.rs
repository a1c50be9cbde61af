//! Where the pipeline settles reserved costs (the rules are in
//! [`crate::decision::settle`]): [`prepare`] before `act` (a byte quota on
//! the request puts a [`BodyBytes`] count on it for the forwarder), and
//! [`finish`] on `act`'s answer — a `from_header` amount settled before
//! the response leaves, the rest handed to a [`Watch`] on its body that
//! settles when the body ends, in a task of its own (never in `Drop`).
//!
//! A `from_body` cost is read by a [`UsageReader`] fed each data frame as
//! it passes to the client (nothing is held back or buffered), and settled
//! when the body ends: complete, with the usage the body reported; cut
//! short (the client went away, the upstream broke off), with what the
//! upstream had reported by then, else the reservation stands
//! (`reason="aborted"`). An error status, a body that is neither JSON nor
//! an event stream, or one without usage keeps the reservation, counted
//! by reason.
//!
//! A request that fails before the upstream answers (502, 504, a broken
//! client body) settles its byte quotas with the bytes counted; a
//! reservation waiting for a header, a trailer or a body stands.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Either;

use super::gateway::Gateway;
use crate::clock::Clock;
use crate::decision::limiter::Limiter;
use crate::decision::settle::{self, BodyEnd, Reservations};
use crate::limit::settle::BodyUsage;
use crate::limit::usage::{Framing, UsageReader};
use crate::logs::HeldLine;
use crate::problem::GatewayError;
use crate::proxy::{Body, BodyBytes, Watch};

/// A request's reservations and the count of its forwarded body bytes.
pub struct Settling {
    pending: Reservations,
    request_bytes: Option<BodyBytes>,
}

/// Takes the decision's reservations; counts the request's body bytes
/// when a byte quota needs them (the forwarder counts them, or, behind
/// the tower layer, the request body the application's service reads).
pub fn prepare<B>(reservations: Option<Reservations>, req: &mut Request<B>) -> Option<Settling> {
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

/// [`settle_head`] for the gateway: the watch goes on the upstream's body,
/// or ends at once on a body the gateway made itself.
pub(super) async fn finish(
    gw: &Gateway,
    settling: Option<Settling>,
    answer: Result<Response<Body>, GatewayError>,
) -> Result<Response<Body>, GatewayError> {
    // The costs read the answer's fields: the passed ones too.
    let answer = answer.map(|mut res| {
        crate::http1::text_fields::materialize(&mut res);
        res
    });
    let (mut res, watch) = settle_head(&gw.limiter, &gw.clock, settling, answer).await?;
    if let Some(mut watch) = watch {
        match res.body_mut() {
            Either::Left(watched) => watched.add_watch(watch),
            // A body the gateway made itself carries nothing of the upstream's.
            Either::Right(_) => watch.end(true),
        }
    }
    Ok(res)
}

/// Settles what `answer` settles at once (a failure, a `from_header`
/// amount); returns the answer and, when the rest waits for its body, the
/// [`Watch`] to set on that body, which settles it at the end.
///
/// # Errors
/// `answer`'s own, once a failure's byte quotas are settled.
pub async fn settle_head<B, E>(
    limiter: &Arc<Limiter>,
    clock: &Arc<dyn Clock>,
    settling: Option<Settling>,
    answer: Result<Response<B>, E>,
) -> Result<(Response<B>, Option<Box<dyn Watch>>), E> {
    let Some(Settling {
        mut pending,
        request_bytes,
    }) = settling
    else {
        return answer.map(|res| (res, None));
    };
    let sent = || request_bytes.as_ref().map_or(0, BodyBytes::get);
    let mut res = match answer {
        Ok(res) => res,
        Err(e) => {
            let due = pending.failed(limiter.settler(), "upstream_error", sent());
            settle::settle(limiter.settler(), clock.now_ms(), due).await;
            return Err(e);
        }
    };
    pending
        .header(limiter.settler(), clock.now_ms(), res.headers())
        .await;
    if !pending.waits_for_body() {
        return Ok((res, None));
    }
    let readers = pending
        .body_sources()
        .into_iter()
        .map(|u| {
            let reading = Reading::of(&u, res.status(), res.headers());
            (u.written, reading)
        })
        .collect::<Vec<_>>();
    let late = (!readers.is_empty()).then(|| {
        let late = LateLine::default();
        res.extensions_mut().insert(late.clone());
        late
    });
    let watch = SettleWatch {
        late,
        pending: Some(pending),
        limiter: Arc::clone(limiter),
        clock: Arc::clone(clock),
        request_bytes,
        response_bytes: 0,
        trailers: None,
        readers,
    };
    Ok((res, Some(Box::new(watch))))
}

/// The access-log line and the span's end of a request whose cost its
/// response body settles: each written once the body has ended, with the
/// amounts read (`settled`), by whichever comes second — the line rendered
/// (and the span ended) when the response head goes out
/// ([`super::observe`], [`super::traces`]), or the body's end.
#[derive(Clone, Default)]
pub struct LateLine(Arc<Mutex<Late>>);

/// A traced request's span, ended with the `settled` text.
pub type LateSpan = Box<dyn FnOnce(&str) + Send>;

#[derive(Default)]
struct Late {
    /// The line, waiting for the body's end.
    line: Option<HeldLine>,
    /// The span, waiting for the body's end.
    span: Option<LateSpan>,
    /// The body's `settled` field, once the body has ended.
    settled: Option<String>,
}

impl std::fmt::Debug for LateLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateLine")
    }
}

impl LateLine {
    fn late(&self) -> std::sync::MutexGuard<'_, Late> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request's line, rendered up to its last field.
    pub fn line(&self, mut line: HeldLine) {
        let mut late = self.late();
        if let Some(text) = &late.settled {
            end_line(line, text);
        } else if late.line.is_some() {
            // Twice: write what came now rather than lose it.
            line.str("settled", "-");
            line.write();
        } else {
            late.line = Some(line);
        }
    }

    /// The request's span, to end with the `settled` text.
    pub fn span(&self, span: LateSpan) {
        let mut late = self.late();
        match &late.settled {
            Some(text) => span(settled_or_dash(text)),
            None => late.span = Some(span),
        }
    }

    /// The body ended with `text` settled.
    fn settled(&self, text: String) {
        let mut late = self.late();
        if late.settled.is_some() {
            return;
        }
        if let Some(line) = late.line.take() {
            end_line(line, &text);
        }
        if let Some(span) = late.span.take() {
            span(settled_or_dash(&text));
        }
        late.settled = Some(text);
    }
}

/// `settled`'s text: `-` when nothing was read from the body.
fn settled_or_dash(settled: &str) -> &str {
    if settled.is_empty() { "-" } else { settled }
}

/// Ends `line` with `settled` (`-` when nothing was read from the body:
/// the reservations stand).
fn end_line(mut line: HeldLine, settled: &str) {
    line.str("settled", settled_or_dash(settled));
    line.write();
}

/// One `from_body` source's reading of a response body.
enum Reading {
    /// The body is read as it passes.
    Reader(UsageReader),
    /// The body is not read: the reservation stands, for this reason.
    Kept(&'static str),
}

impl Reading {
    /// How a response of `status` with `headers` is read for `usage`: an
    /// error status, or a body neither JSON nor an event stream, is not
    /// read and keeps the reservation.
    fn of(usage: &BodyUsage, status: StatusCode, headers: &HeaderMap) -> Self {
        if !status.is_success() {
            return Self::Kept("upstream_error");
        }
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let Some(framing) = Framing::of(content_type) else {
            return Self::Kept("content_type");
        };
        let encoding = headers.get(CONTENT_ENCODING).map(HeaderValue::as_bytes);
        Self::Reader(UsageReader::new(Arc::clone(&usage.spec), framing, encoding))
    }

    /// The usage read once the body ended (`complete`), or when it ended
    /// early what the upstream had reported by then; else why the
    /// reservation stands.
    fn result(self, complete: bool) -> Result<u64, &'static str> {
        match self {
            Self::Kept(reason) => Err(reason),
            Self::Reader(r) if complete => r.finish().map_err(|k| k.label()),
            Self::Reader(r) => r.so_far().ok_or("aborted"),
        }
    }
}

/// Counts a response body, reads the usage it reports, and settles the
/// reservations left when it ends.
struct SettleWatch {
    /// The access-log line written at the body's end, for a `from_body`
    /// cost.
    late: Option<LateLine>,
    pending: Option<Reservations>,
    limiter: Arc<Limiter>,
    clock: Arc<dyn Clock>,
    request_bytes: Option<BodyBytes>,
    response_bytes: u64,
    trailers: Option<HeaderMap>,
    /// Per `from_body` source: its spelling and its reading.
    readers: Vec<(Arc<str>, Reading)>,
}

impl Watch for SettleWatch {
    fn data(&mut self, data: &Bytes) {
        self.response_bytes = self.response_bytes.saturating_add(data.len() as u64);
        for (_, reading) in &mut self.readers {
            if let Reading::Reader(r) = reading {
                r.feed(data);
            }
        }
    }

    fn trailers(&mut self, trailers: &HeaderMap) {
        self.trailers = Some(trailers.clone());
    }

    fn end(&mut self, complete: bool) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let usage: Vec<(Arc<str>, Result<u64, &'static str>)> = std::mem::take(&mut self.readers)
            .into_iter()
            .map(|(written, reading)| (written, reading.result(complete)))
            .collect();
        let ended = BodyEnd {
            trailers: self.trailers.as_ref(),
            request_bytes: self.request_bytes.as_ref().map_or(0, BodyBytes::get),
            response_bytes: self.response_bytes,
            usage: &usage,
        };
        let due = pending.at_end(self.limiter.settler(), &ended);
        if let Some(late) = self.late.take() {
            late.settled(settle::written(&due));
        }
        if due.is_empty() {
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
            settle::settle(limiter.settler(), now_ms, due).await;
        });
    }
}
