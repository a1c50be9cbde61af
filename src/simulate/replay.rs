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
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::{HeaderValue, Request};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::runtime::Runtime;

use super::input::{self, Lines, Parsed, Parser};
use super::options::{InputFormat, Options, SimError};
use super::tally::Tally;
use super::trace;
use crate::clock::ManualClock;
use crate::config::Config;
use crate::identity::{self, Caller};
use crate::pipeline::exchange::caller_digest;
use crate::pipeline::{Gateway, Rehearsal};

/// The `Host` of requests whose line names none, unless `--host` says.
pub const DEFAULT_HOST: &str = "localhost";

/// A line that could not be read, for the report.
#[derive(Debug, Clone)]
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
/// tollgate log each static API key also known by the digest that stands
/// for it in the log, with the same plan.
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
                headers: &empty,
            };
            Some((caller_digest(&caller)?, plan.clone()))
        })
        .collect();
    config.api_keys.keys.extend(digests);
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
    let host =
        HeaderValue::from_str(opts.host.as_deref().unwrap_or(DEFAULT_HOST)).map_err(|_| {
            SimError::Io {
                path: "--host".into(),
                source: std::io::Error::other("not a header value"),
            }
        })?;
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
        .map_err(|e| SimError::Io {
            path: "runtime".into(),
            source: e,
        })?;
    run(&runtime, opts, format, parser, config, against)
}

/// One configuration replayed: its gateway, its clock, its tally.
struct Sim {
    gateway: Gateway,
    clock: ManualClock,
    tally: Tally,
}

impl Sim {
    fn new(runtime: &Runtime, config: Config) -> Result<Self, SimError> {
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

/// Lines read from one file, handed from the reader thread to the replay.
/// Its buffers go back to the reader to be filled again, so that memory
/// is allocated and freed on one thread only.
#[derive(Default)]
struct Chunk {
    /// The lines, one after the other.
    text: Vec<u8>,
    /// Where each line ends in `text`.
    ends: Vec<usize>,
    /// The file's index among the logs.
    file: usize,
    /// The number of the chunk's first line in its file.
    first_line: u64,
}

/// Lines per chunk.
const CHUNK_LINES: usize = 2048;
/// Chunks in flight between the threads (bounds the memory used).
const CHUNKS: usize = 8;

/// Reads `files` on a thread of its own (gzip is decompressed there), so
/// that the replay thread, which must take lines in order, only parses and
/// decides. Yields chunks of lines, or the read error that ended the input;
/// send used chunks back on the second channel.
fn reader(
    files: Vec<std::path::PathBuf>,
) -> (
    mpsc::Receiver<Result<Chunk, SimError>>,
    mpsc::SyncSender<Chunk>,
    Arc<std::sync::atomic::AtomicU64>,
) {
    let (tx, rx) = mpsc::sync_channel(CHUNKS);
    let (give_back, returned) = mpsc::sync_channel::<Chunk>(CHUNKS + 2);
    let mut lines = Lines::new(files);
    let read = lines.read.clone();
    std::thread::spawn(move || {
        let mut made = 0;
        let mut fresh = || -> Option<Chunk> {
            if made < CHUNKS + 1 {
                made += 1;
                return Some(Chunk::default());
            }
            returned.recv().ok()
        };
        let Some(mut chunk) = fresh() else { return };
        loop {
            let file = lines.index;
            let before = chunk.text.len();
            let more = match lines.append_next(&mut chunk.text) {
                Ok(more) => more,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            // A full chunk, the end, or a line from the next file: the
            // chunk goes, and the line just read starts the next one.
            let switched = more && !chunk.ends.is_empty() && lines.index != file;
            if switched || !more || chunk.ends.len() == CHUNK_LINES {
                let mut next = match fresh() {
                    Some(c) => c,
                    None => return,
                };
                next.text.clear();
                next.ends.clear();
                if more {
                    next.text.extend_from_slice(&chunk.text[before..]);
                    chunk.text.truncate(before);
                }
                if !chunk.ends.is_empty() && tx.send(Ok(chunk)).is_err() {
                    return;
                }
                chunk = next;
                if !more {
                    return;
                }
            }
            if chunk.ends.is_empty() {
                chunk.file = lines.index;
                chunk.first_line = lines.number;
            }
            chunk.ends.push(chunk.text.len());
        }
    });
    (rx, give_back, read)
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

fn run(
    runtime: &Runtime,
    opts: &Options,
    format: InputFormat,
    parser: Parser,
    config: Config,
    against: Option<Config>,
) -> Result<Replayed, SimError> {
    let started = Instant::now();
    let mut sim = Sim::new(runtime, config)?;
    let mut old = match against {
        Some(c) => Some(Sim::new(runtime, c)?),
        None => None,
    };
    let mut stats = InputStats {
        files: opts.logs.iter().map(|p| p.display().to_string()).collect(),
        format: Some(format),
        ..InputStats::default()
    };
    let (chunks, give_back, read) = reader(opts.logs.clone());
    let progress =
        (opts.progress && std::io::stderr().is_terminal()).then(|| progress_bar(&opts.logs));
    let mut trace = match &opts.decisions {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| SimError::Io {
                path: path.display().to_string(),
                source: e,
            })?,
        )),
        None => None,
    };
    let mut now = 0u64;
    for chunk in chunks {
        let chunk = chunk?;
        stats.lines += chunk.ends.len() as u64;
        if let Some(bar) = &progress {
            bar.set_position(read.load(Ordering::Relaxed));
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!(
                "{} lines, {:.0} lines/s",
                stats.lines,
                stats.lines as f64 / secs
            ));
        }
        let mut start = 0;
        for (i, &end) in chunk.ends.iter().enumerate() {
            let text = &chunk.text[start..end];
            start = end;
            let line = match parser.parse(text) {
                Ok(Parsed::Request(line)) => line,
                Ok(Parsed::Skip) => {
                    stats.skipped += 1;
                    continue;
                }
                Err(error) => {
                    stats.bad += 1;
                    if stats.bad_shown.len() < opts.show_bad {
                        stats.bad_shown.push(BadLine {
                            file: opts
                                .logs
                                .get(chunk.file)
                                .map(|p| p.display().to_string())
                                .unwrap_or_default(),
                            line: chunk.first_line + i as u64,
                            error,
                        });
                    }
                    continue;
                }
            };
            stats.requests += 1;
            if line.ts_ms < now {
                stats.out_of_order += 1;
            } else {
                now = line.ts_ms;
            }
            stats.first_ms.get_or_insert(now);
            stats.last_ms = Some(now);
            if let Some(old) = &mut old {
                old.step(runtime, now, copy(&line.req), line.peer);
            }
            let r = sim.step(runtime, now, line.req, line.peer);
            if let Some(out) = &mut trace {
                trace::write(out, stats.requests, now, &r).map_err(|e| SimError::Io {
                    path: opts
                        .decisions
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    source: e,
                })?;
            }
        }
        // Only fails once the reader has finished; the chunk is dropped then.
        let _ = give_back.try_send(chunk);
    }
    if let Some(mut out) = trace {
        std::io::Write::flush(&mut out).map_err(|e| SimError::Io {
            path: "--decisions".into(),
            source: e,
        })?;
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    stats.elapsed = started.elapsed();
    Ok(Replayed {
        tally: sim.tally,
        against: old.map(|o| o.tally),
        input: stats,
    })
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

fn progress_bar(logs: &[std::path::PathBuf]) -> ProgressBar {
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
