//! Telling a Redis that refuses this gateway from a Redis that is not there.
//!
//! An outage heals by itself; a wrong password, a missing ACL permission or
//! a TLS setting that does not match the server does not, and the gateway
//! would otherwise show both the same way (`on_error` deciding, the link
//! down). So every Redis failure is sorted here:
//!
//! - **auth**: Redis answered `WRONGPASS` or `NOAUTH` (while connecting, or
//!   to a command);
//! - **permission**: Redis answered `NOPERM`: the ACL user lacks a command
//!   (`EVALSHA`, `EVAL`, `SCRIPT`, `PING`, `HGET`, or one fred sends while
//!   connecting) or a key pattern;
//! - **tls**: the TLS handshake failed (an untrusted certificate, a protocol
//!   error), or the two sides do not speak the same protocol: a `rediss://`
//!   URL against a plain-text port, or a `redis://` URL against a TLS port.
//!   Neither says so by itself — the first times out waiting for a
//!   handshake, the second has its connection reset — so after such a
//!   failure one `probe` asks the server in the other protocol: a
//!   plain-text `PING` answered in RESP, or a TLS handshake answered by a
//!   certificate or an alert, names the mismatch. A connection refused is
//!   an outage and is not probed.
//! - **sentinel**: every sentinel that answered knows no master by the
//!   configured service name (a typo in `service_name`, or sentinels
//!   monitoring under another name);
//! - anything else is an outage, handled by the breaker and `on_error`.
//!
//! [`Health`] keeps one fault per place a refusal can come from ([`Op`]):
//! connecting, the decision script, the small `EVAL` scripts, the breaker's
//! `PING` and the API-key `HGET`. A fault is raised by a refusal from its
//! place and cleared only by a success there (a connection made, a call
//! answered) — never by an outage, which cannot say whether the refusal
//! still holds. Each raise or change is logged once at ERROR with Redis's
//! own words, each clear once at INFO; requests never log. While any fault
//! stands, `/readyz` answers 503 with the first one, and the gauge
//! `tollgate_store_fault{kind}` is 1 for its kind. The failure policy still
//! decides every request meanwhile.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use fred::error::{Error as FredError, ErrorKind};
use fred::rustls::crypto::ring;
use fred::rustls::pki_types::ServerName;
use fred::rustls::{ClientConfig, RootCertStore};
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{error, info};

use crate::store::contract::StoreError;

/// What kind of refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `WRONGPASS` or `NOAUTH`: wrong or missing credentials.
    Auth,
    /// `NOPERM`: the ACL user lacks a command or key pattern.
    Permission,
    /// The TLS handshake failed, or one side does not speak TLS.
    Tls,
    /// No sentinel knows the configured service name.
    Sentinel,
}

impl FaultKind {
    /// Every kind, in the order of [`Self::index`].
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Auth,
        FaultKind::Permission,
        FaultKind::Tls,
        FaultKind::Sentinel,
    ];

    /// The `kind` label of `tollgate_store_fault`.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Auth => "auth",
            FaultKind::Permission => "permission",
            FaultKind::Tls => "tls",
            FaultKind::Sentinel => "sentinel",
        }
    }

    /// Position in [`Self::ALL`].
    pub fn index(self) -> usize {
        match self {
            FaultKind::Auth => 0,
            FaultKind::Permission => 1,
            FaultKind::Tls => 2,
            FaultKind::Sentinel => 3,
        }
    }
}

/// Redis refuses this gateway, in Redis's (or the TLS library's) words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What kind of refusal.
    pub kind: FaultKind,
    /// What the server said (`WRONGPASS invalid username-password pair or
    /// user is disabled.`), or what the handshake found.
    pub words: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            FaultKind::Auth => "authentication failed",
            FaultKind::Permission => "permission denied",
            FaultKind::Tls => "TLS failed",
            FaultKind::Sentinel => "sentinel",
        };
        write!(f, "{what}: {}", self.words)
    }
}

impl Fault {
    /// The fault a refused command's error reply names (see
    /// [`StoreError::Refused`]).
    pub fn of_refusal(words: &str) -> Fault {
        let kind = if words.starts_with("NOPERM") {
            FaultKind::Permission
        } else {
            FaultKind::Auth
        };
        Fault {
            kind,
            words: words.to_owned(),
        }
    }
}

/// Where a refusal came from; each keeps its own fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Making a connection (AUTH, TLS, the commands fred sends first).
    Connect,
    /// The decision script (`SCRIPT LOAD`, `EVALSHA`).
    Script,
    /// The small scripts sent whole: heartbeat, refund, outage push.
    Eval,
    /// The breaker's probe.
    Ping,
    /// The API-key plan lookup.
    Hget,
    /// Asking the sentinels for the master.
    Sentinel,
}

const OPS: usize = 6;

impl Op {
    fn index(self) -> usize {
        match self {
            Op::Connect => 0,
            Op::Script => 1,
            Op::Eval => 2,
            Op::Ping => 3,
            Op::Hget => 4,
            Op::Sentinel => 5,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Op::Connect => "connecting",
            Op::Script => "EVALSHA (decisions)",
            Op::Eval => "EVAL (heartbeat, refunds, outage push)",
            Op::Ping => "PING (breaker probe)",
            Op::Hget => "HGET (API-key plans)",
            Op::Sentinel => "asking the sentinels for the master",
        }
    }
}

/// The faults standing now, one slot per [`Op`].
#[derive(Debug, Default)]
pub struct Health {
    /// Which Redis, for the log (the password hidden).
    redis: String,
    slots: Mutex<[Option<Fault>; OPS]>,
    /// Bit `i` set while slot `i` holds a fault: a success checks this and
    /// takes no lock.
    raised: AtomicU8,
    /// `tollgate_store_fault`, per [`FaultKind::index`], once known.
    gauges: OnceLock<[Gauge<i64, AtomicI64>; 4]>,
    /// Woken whenever a fault is raised: a start waiting for Redis ends
    /// at once, as waiting cannot mend it.
    pub(super) raised_now: tokio::sync::Notify,
}

impl Health {
    /// No fault yet; `redis` names the server in log lines (without its
    /// password: [`crate::config::RedisConfig::describe`]).
    pub fn new(redis: String) -> Self {
        Self {
            redis,
            ..Self::default()
        }
    }

    /// Which Redis, for log lines (without its password).
    pub fn redis(&self) -> &str {
        &self.redis
    }

    /// The first fault standing (connecting first), if any.
    pub fn fault(&self) -> Option<Fault> {
        if self.raised.load(Ordering::Acquire) == 0 {
            return None;
        }
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.iter().flatten().next().cloned()
    }

    /// Mirrors the faults in `gauges` (1 while one of that kind stands).
    pub fn export(&self, gauges: [Gauge<i64, AtomicI64>; 4]) {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        show(&gauges, &slots);
        let _ = self.gauges.set(gauges);
    }

    /// Records what one call at `op` returned: a success clears `op`'s
    /// fault, a refusal raises one; an outage or garbage changes nothing.
    pub(super) fn observe<T>(&self, op: Op, result: &Result<T, StoreError>) {
        match result {
            Ok(_) => self.clear(op),
            Err(StoreError::Refused(words)) => self.raise(op, Fault::of_refusal(words)),
            Err(StoreError::Unavailable(_) | StoreError::Timeout | StoreError::Protocol(_)) => {}
        }
    }

    /// `op` was refused: logged at ERROR when it was not already.
    pub(super) fn raise(&self, op: Op, fault: Fault) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut slots[op.index()];
        if slot.as_ref() == Some(&fault) {
            return;
        }
        error!(
            redis = %self.redis,
            kind = fault.kind.label(),
            during = op.what(),
            "redis refuses this gateway: {fault} (on_error decides until the store configuration or the server is fixed)"
        );
        *slot = Some(fault);
        self.raised.fetch_or(1 << op.index(), Ordering::AcqRel);
        if let Some(g) = self.gauges.get() {
            show(g, &slots);
        }
        self.raised_now.notify_waiters();
    }

    /// `op` succeeded: its fault, if any, is over (logged once).
    pub(super) fn clear(&self, op: Op) {
        let bit = 1 << op.index();
        if self.raised.load(Ordering::Acquire) & bit == 0 {
            return;
        }
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(was) = slots[op.index()].take() {
            info!(
                redis = %self.redis,
                kind = was.kind.label(),
                during = op.what(),
                "redis accepts this gateway again (was: {was})"
            );
        }
        self.raised.fetch_and(!bit, Ordering::AcqRel);
        if let Some(g) = self.gauges.get() {
            show(g, &slots);
        }
    }
}

fn show(gauges: &[Gauge<i64, AtomicI64>; 4], slots: &[Option<Fault>; OPS]) {
    for kind in FaultKind::ALL {
        let on = slots.iter().flatten().any(|f| f.kind == kind);
        gauges[kind.index()].set(i64::from(on));
    }
}

/// What a failed connection attempt says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LinkError {
    /// A refusal: nothing to wait for.
    Fault(Fault),
    /// A timeout or a connection cut short: an outage, or TLS on one side
    /// only; [`probe`] tells which.
    Suspect,
    /// An outage.
    Outage,
}

/// Sorts an error fred reported for a connection; `tls` is whether this
/// gateway speaks TLS to Redis.
pub(super) fn classify(e: &FredError, tls: bool) -> LinkError {
    let words = e.details();
    match e.kind() {
        ErrorKind::Auth => LinkError::Fault(Fault {
            kind: FaultKind::Auth,
            words: words.to_owned(),
        }),
        ErrorKind::Tls => LinkError::Fault(Fault {
            kind: FaultKind::Tls,
            words: words.to_owned(),
        }),
        // A command fred sends while connecting (SELECT, CLIENT SETNAME)
        // refused by the ACL.
        ErrorKind::Unknown if words.starts_with("NOPERM") => LinkError::Fault(Fault {
            kind: FaultKind::Permission,
            words: words.to_owned(),
        }),
        // rustls reports through the socket as `InvalidData` carrying its
        // own error: `Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }`.
        ErrorKind::IO if tls && words.contains("InvalidData") => LinkError::Fault(Fault {
            kind: FaultKind::Tls,
            words: rustls_words(words).to_owned(),
        }),
        // Nothing listens: an outage whatever the protocol.
        ErrorKind::IO if words.contains("ConnectionRefused") => LinkError::Outage,
        ErrorKind::IO | ErrorKind::Timeout => LinkError::Suspect,
        ErrorKind::Config
        | ErrorKind::Url
        | ErrorKind::Protocol
        | ErrorKind::Unknown
        | ErrorKind::Canceled
        | ErrorKind::Cluster
        | ErrorKind::Parse
        | ErrorKind::Sentinel
        | ErrorKind::NotFound
        | ErrorKind::Backpressure
        | ErrorKind::Routing
        | ErrorKind::InvalidCommand
        | ErrorKind::InvalidArgument => LinkError::Outage,
    }
}

/// The rustls error inside fred's rendering of an `io::Error`.
fn rustls_words(details: &str) -> &str {
    details
        .split_once("error: ")
        .map_or(details, |(_, rest)| rest.trim_end_matches([' ', '}']))
}

/// Where and how to probe after a suspect failure.
#[derive(Debug, Clone)]
pub(super) struct Probe {
    /// The first configured server (host, port).
    pub host: String,
    pub port: u16,
    /// This gateway speaks TLS to Redis.
    pub tls: bool,
    /// Bound on the probe's connection and answer.
    pub timeout: Duration,
}

/// Asks the server in the protocol this gateway does *not* speak: a
/// `PING` in plain text when it speaks TLS, a TLS handshake when it does
/// not. A fault when the server answers that way, `None` when it does not
/// (an outage, or nothing conclusive).
pub(super) async fn probe(p: &Probe) -> Option<Fault> {
    let connect = TcpStream::connect((p.host.as_str(), p.port));
    let stream = tokio::time::timeout(p.timeout, connect).await.ok()?.ok()?;
    let words = if p.tls {
        plain_answer(stream, p.timeout).await.map(|answer| {
            format!(
                "the URL is rediss:// but {}:{} answered a plain-text PING with \"{answer}\": it does not speak TLS there (use redis://, or the server's TLS port)",
                p.host, p.port
            )
        })
    } else {
        tls_answer(stream, &p.host, p.timeout).await.map(|answer| {
            format!(
                "the URL is redis:// but {}:{} answered a TLS handshake ({answer}): it speaks TLS there (use rediss://)",
                p.host, p.port
            )
        })
    }?;
    Some(Fault {
        kind: FaultKind::Tls,
        words,
    })
}

/// The first line of the server's answer to a plain-text `PING`, when it
/// is RESP (`+PONG`, `-NOAUTH Authentication required.`).
async fn plain_answer(mut stream: TcpStream, timeout: Duration) -> Option<String> {
    let exchange = async {
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 128];
        let n = stream.read(&mut buf).await.ok()?;
        let answer = buf.get(..n)?;
        if !matches!(answer.first(), Some(b'+' | b'-')) {
            return None;
        }
        let line = answer.split(|&b| b == b'\r' || b == b'\n').next()?;
        Some(String::from_utf8_lossy(line).into_owned())
    };
    tokio::time::timeout(timeout, exchange).await.ok()?
}

/// What a TLS handshake with no trusted root found, when it proves the
/// server speaks TLS: its certificate (which nothing here trusts), or an
/// alert it sent. Garbage or silence proves nothing.
async fn tls_answer(stream: TcpStream, host: &str, timeout: Duration) -> Option<String> {
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
        Err(_) => None,
        Ok(Ok(_)) => Some("handshake completed".to_owned()),
        Ok(Err(e)) => {
            use fred::rustls::Error as Tls;
            match e.get_ref()?.downcast_ref::<Tls>()? {
                e @ (Tls::InvalidCertificate(_)
                | Tls::AlertReceived(_)
                | Tls::PeerIncompatible(_)
                | Tls::NoCertificatesPresented) => Some(format!("{e:?}")),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_connection_errors() {
        let e = |kind, words: &str| FredError::new(kind, words.to_owned());
        let fault = |kind, words: &str| {
            LinkError::Fault(Fault {
                kind,
                words: words.to_owned(),
            })
        };
        let wrongpass = "WRONGPASS invalid username-password pair or user is disabled.";
        assert_eq!(
            classify(&e(ErrorKind::Auth, wrongpass), false),
            fault(FaultKind::Auth, wrongpass)
        );
        let cert = "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }";
        assert_eq!(
            classify(&e(ErrorKind::IO, cert), true),
            fault(FaultKind::Tls, "InvalidCertificate(UnknownIssuer)")
        );
        let refused = "Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" }";
        assert_eq!(
            classify(&e(ErrorKind::IO, refused), true),
            LinkError::Outage
        );
        let reset =
            "Os { code: 104, kind: ConnectionReset, message: \"Connection reset by peer\" }";
        assert_eq!(
            classify(&e(ErrorKind::IO, reset), false),
            LinkError::Suspect
        );
        assert_eq!(
            classify(&e(ErrorKind::Timeout, "Request timed out."), true),
            LinkError::Suspect
        );
    }

    #[test]
    fn a_fault_is_logged_and_cleared_once() {
        let h = Health::default();
        let gauges: [Gauge<i64, AtomicI64>; 4] = Default::default();
        h.export(gauges.clone());
        let noperm = "NOPERM this user has no permissions to run the 'evalsha' command";
        h.observe::<()>(Op::Script, &Err(StoreError::Refused(noperm.into())));
        assert_eq!(
            h.fault().map(|f| f.to_string()).as_deref(),
            Some(&*format!("permission denied: {noperm}"))
        );
        assert_eq!(gauges[FaultKind::Permission.index()].get(), 1);
        // An outage says nothing about the refusal; another op's success
        // does not clear it either.
        h.observe::<()>(Op::Script, &Err(StoreError::Timeout));
        h.observe(Op::Eval, &Ok(()));
        assert!(h.fault().is_some());
        h.observe(Op::Script, &Ok(()));
        assert_eq!(h.fault(), None);
        assert_eq!(gauges[FaultKind::Permission.index()].get(), 0);
    }
}
