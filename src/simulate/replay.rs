//! The replay: the configuration made to run offline, a gateway per
//! configuration on a clock that follows the log, and every line through
//! [`Gateway::decide_only`] in order.
//!
//! Offline means the in-process store whatever `store:` says (no Redis
//! call, so also no Redis key hash for API keys). The clock is set to each
//! line's time; a line earlier than the one before it (logs written at the
//! end of a request can be a little out of order) is replayed at the later
//! time, as a gateway's clock never goes back, and counted.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::runtime::Runtime;

use super::input::{self, Line, Parsed, Parser};
use super::options::{InputFormat, Options, SimError};
use super::reader::{self, Chunk};
use super::tally::Tally;
use super::trace::Trace;
use crate::clock::ManualClock;
use crate::config::Config;
use crate::identity::{self, Caller};
use crate::pipeline::exchange::caller_digest;
use crate::pipeline::{Gateway, Rehearsal};

/// The `Host` of requests whose line names none, unless `--host` says.
pub const DEFAULT_HOST: &str = "localhost";

/// A line that could not be read, for the report (and its JSON, whose
/// keys are these fields' names in this order).
#[derive(Debug, Clone, Serialize)]
pub struct BadLine {
    /// The file.
    pub file: String,
    /// Its 1-based line number.
    pub line: u64,
    /// What is wrong.
    pub error: String,
}

/// What was read.
#[derive(Debug, Clone, Default)]
pub struct InputStats {
    /// The files, in order.
    pub files: Vec<String>,
    /// Their format.
    pub format: Option<InputFormat>,
    /// Lines read.
    pub lines: u64,
    /// Lines replayed as requests.
    pub requests: u64,
    /// Blank lines and other events of a tollgate log.
    pub skipped: u64,
    /// Lines that could not be read as requests.
    pub bad: u64,
    /// The first few of those.
    pub bad_shown: Vec<BadLine>,
    /// Lines earlier than the one before them (replayed at its time).
    pub out_of_order: u64,
    /// Time of the first and the last request replayed (ms).
    pub first_ms: Option<u64>,
    /// See `first_ms`.
    pub last_ms: Option<u64>,
    /// How long the replay took.
    pub elapsed: Duration,
}

/// The outcome of a replay: one tally per configuration (the simulated
/// one, then `--against`'s), and what was read.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The simulated configuration's tally.
    pub tally: Tally,
    /// The `--against` configuration's, when asked.
    pub against: Option<Tally>,
    /// What was read.
    pub input: InputStats,
}

/// Loads a configuration for an offline replay of `format` lines.
///
/// # Errors
/// The file does not load.
pub fn load(path: &std::path::Path, format: InputFormat) -> Result<Config, SimError> {
    let mut config = crate::config::load::load_file(path).map_err(|errors| SimError::Config {
        path: path.display().to_string(),
        errors,
    })?;
    offline(&mut config, format);
    Ok(config)
}

/// The configuration as a replay runs it: the in-process store, and for a
/// tollgate log each static API key (and each exempt one) also known by the
/// digest that stands for it in the log, with the same plan.
pub fn offline(config: &mut Config, format: InputFormat) {
    config.store.redis = None;
    config.api_keys.redis_hash = false;
    if format != InputFormat::Tollgate {
        return;
    }
    let empty = http::HeaderMap::new();
    let digests: Vec<(String, Arc<str>)> = config
        .api_keys
        .keys
        .iter()
        .filter_map(|(key, plan)| {
            let caller = Caller {
                ip: identity::group(std::net::Ipv4Addr::UNSPECIFIED.into(), 64),
                api_key: Some(key.as_bytes()),
                user: None,
                plan: None,
                headers: &empty,
                body: None,
            };
            Some((caller_digest(&caller)?, plan.clone()))
        })
        .collect();
    config.api_keys.keys.extend(digests);
    let digest = |key: &[u8]| {
        let caller = Caller {
            ip: identity::group(std::net::Ipv4Addr::UNSPECIFIED.into(), 64),
            api_key: Some(key),
            user: None,
            plan: None,
            headers: &empty,
            body: None,
        };
        caller_digest(&caller)
    };
    let exempts = config.routes.iter_mut().map(|r| &mut r.exempt);
    for exempt in exempts.chain([&mut config.exempt]).flatten() {
        let exempt = Arc::make_mut(exempt);
        let digests: Vec<Box<[u8]>> = exempt
            .api_keys
            .iter()
            .filter_map(|k| digest(k))
            .map(|d| d.into_bytes().into_boxed_slice())
            .collect();
        exempt.api_keys.extend(digests);
    }
}

/// Replays `opts.logs` through the configuration (and `--against`'s).
///
/// # Errors
/// A configuration does not load, a log cannot be read, the gateway
/// cannot be built.
pub fn replay(opts: &Options) -> Result<Replayed, SimError> {
    let format = match opts.input {
        Some(f) => f,
        None => match opts.logs.first() {
            Some(first) => input::detect(&input::first_line(first)?),
            None => InputFormat::Combined,
        },
    };
    let config = load(&opts.config, format)?;
    let against = opts.against.as_ref().map(|p| load(p, format)).transpose()?;
    // An HTTP/1.1 request needs a host, and a combined log records none.
    let host = HeaderValue::from_str(opts.host.as_deref().unwrap_or(DEFAULT_HOST))
        .map_err(|_| SimError::io("--host", std::io::Error::other("not a header value")))?;
    let parser = Parser::new(
        format,
        &opts.fields,
        Some(host),
        config.api_keys.header.clone(),
        config.users.header.clone(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SimError::io("runtime", e))?;
    run(&runtime, opts, format, parser, config, against)
}

/// One configuration replayed: its gateway, its clock, its tally.
struct Sim {
    gateway: Gateway,
    clock: ManualClock,
    tally: Tally,
}

impl Sim {
    fn new(runtime: &Runtime, mut config: Config) -> Result<Self, SimError> {
        // A replay answers nothing and traces nothing: no exporter starts.
        config.tracing = None;
        let clock = ManualClock::new(0);
        let tally = Tally::new(&config);
        let gateway = runtime.block_on(Gateway::with_clock(config, Arc::new(clock.clone())))?;
        Ok(Self {
            gateway,
            clock,
            tally,
        })
    }

    fn step(
        &mut self,
        runtime: &Runtime,
        ts_ms: u64,
        req: Request<()>,
        peer: SocketAddr,
    ) -> Rehearsal {
        self.clock.set(ts_ms);
        let r = at_once(runtime, self.gateway.decide_only(req, peer));
        self.tally.add(ts_ms / 60_000, &r);
        r
    }
}

/// The output of `f`, polled here: on the in-process store a decision
/// never waits, so the first poll finishes it without a trip through the
/// runtime's scheduler. Should one ever wait, the runtime drives it.
fn at_once<F: Future>(runtime: &Runtime, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => runtime.block_on(f),
    }
}

/// The replay itself: the gateways built, the reader started, every
/// chunk of lines replayed in order, then what was counted.
fn run(
    runtime: &Runtime,
    opts: &Options,
    format: InputFormat,
    parser: Parser,
    config: Config,
    against: Option<Config>,
) -> Result<Replayed, SimError> {
    let started = Instant::now();
    let sim = Sim::new(runtime, config)?;
    let old = against.map(|c| Sim::new(runtime, c)).transpose()?;
    let (chunks, give_back, read) = reader::spawn(opts.logs.clone());
    let progress = Progress::new(opts, read, started);
    let trace = opts.decisions.as_deref().map(Trace::create).transpose()?;
    let mut run = Run {
        runtime,
        parser,
        sim,
        old,
        trace,
        show_bad: opts.show_bad,
        now: 0,
        stats: InputStats {
            files: opts.logs.iter().map(|p| p.display().to_string()).collect(),
            format: Some(format),
            ..InputStats::default()
        },
    };
    for chunk in chunks {
        let chunk = chunk?;
        run.stats.lines += chunk.ends.len() as u64;
        progress.show(run.stats.lines);
        run.chunk(&chunk)?;
        // Only fails once the reader has finished; the chunk is dropped then.
        let _ = give_back.try_send(chunk);
    }
    run.finish(progress, started)
}

/// A replay under way: the gateways, the replay clock's time, what was
/// read so far.
struct Run<'a> {
    runtime: &'a Runtime,
    parser: Parser,
    /// The simulated configuration.
    sim: Sim,
    /// `--against`'s.
    old: Option<Sim>,
    /// `--decisions`.
    trace: Option<Trace>,
    /// Bad lines kept for the report.
    show_bad: usize,
    /// The time of the latest line so far (ms).
    now: u64,
    stats: InputStats,
}

impl Run<'_> {
    /// Replays the lines of `chunk`, in order.
    fn chunk(&mut self, chunk: &Chunk) -> Result<(), SimError> {
        let mut start = 0;
        for (i, &end) in chunk.ends.iter().enumerate() {
            let text = &chunk.text[start..end];
            start = end;
            match self.parser.parse(text) {
                Ok(Parsed::Request(line)) => self.request(line)?,
                Ok(Parsed::Skip) => self.stats.skipped += 1,
                Err(error) => self.bad(chunk.file, chunk.first_line + i as u64, error),
            }
        }
        Ok(())
    }

    /// Counts a line that could not be read, and keeps the first few.
    fn bad(&mut self, file: usize, line: u64, error: String) {
        self.stats.bad += 1;
        if self.stats.bad_shown.len() < self.show_bad {
            self.stats.bad_shown.push(BadLine {
                file: self.stats.files.get(file).cloned().unwrap_or_default(),
                line,
                error,
            });
        }
    }

    /// Replays one request through each configuration at its time, or at
    /// the latest time so far when it is out of order.
    fn request(&mut self, line: Line) -> Result<(), SimError> {
        let stats = &mut self.stats;
        stats.requests += 1;
        if line.ts_ms < self.now {
            stats.out_of_order += 1;
        } else {
            self.now = line.ts_ms;
        }
        stats.first_ms.get_or_insert(self.now);
        stats.last_ms = Some(self.now);
        if let Some(old) = &mut self.old {
            old.step(self.runtime, self.now, copy(&line.req), line.peer);
        }
        let r = self.sim.step(self.runtime, self.now, line.req, line.peer);
        if let Some(trace) = &mut self.trace {
            trace.record(self.stats.requests, self.now, &r)?;
        }
        Ok(())
    }

    /// The end of the input: the trace written out, the tallies.
    fn finish(self, progress: Progress, started: Instant) -> Result<Replayed, SimError> {
        if let Some(trace) = self.trace {
            trace.finish()?;
        }
        progress.finish();
        Ok(Replayed {
            tally: self.sim.tally,
            against: self.old.map(|o| o.tally),
            input: InputStats {
                elapsed: started.elapsed(),
                ..self.stats
            },
        })
    }
}

/// A copy of a request head (`Request` is not `Clone`).
fn copy(req: &Request<()>) -> Request<()> {
    let mut r = Request::new(());
    *r.method_mut() = req.method().clone();
    *r.uri_mut() = req.uri().clone();
    *r.version_mut() = req.version();
    *r.headers_mut() = req.headers().clone();
    r
}

/// The progress bar on stderr, when asked for and stderr is a terminal.
struct Progress {
    bar: Option<ProgressBar>,
    /// Bytes of the logs read so far.
    read: Arc<AtomicU64>,
    started: Instant,
}

impl Progress {
    fn new(opts: &Options, read: Arc<AtomicU64>, started: Instant) -> Self {
        let bar =
            (opts.progress && std::io::stderr().is_terminal()).then(|| Self::bar_for(&opts.logs));
        Self { bar, read, started }
    }

    /// Shows the bytes read, and `lines` with the rate so far.
    fn show(&self, lines: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.read.load(Ordering::Relaxed));
            let secs = self.started.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!(
                "{} lines, {:.0} lines/s",
                lines,
                lines as f64 / secs
            ));
        }
    }

    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }

    /// A bar as long as the logs' bytes.
    fn bar_for(logs: &[std::path::PathBuf]) -> ProgressBar {
        let total: u64 = logs
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg} (ETA {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    }
}
