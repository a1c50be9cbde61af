//! The `tollgate` binary: parses the command line, sets up logging, loads the
//! configuration and hands it to [`tollgate::run`].
//!
//! Nothing here prints with `println!` or `eprintln!`: they panic when the
//! reader has gone away (`tollgate schema | head -1` closes the pipe after
//! one line), and a panic is exit status 101 with a message about a bug
//! that is not one. [`print`] and [`complain`] say what happens instead.
#![forbid(unsafe_code)]

use std::fmt::Display;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use tollgate::config::Config;
use tollgate::config::load::ConfigErrors;
use tollgate::logs::AccessWriter;
use tollgate::reload::{Hangups, Overrides, Reload};
use tollgate::server::Serve;
use tracing_subscriber::EnvFilter;

/// A rate-limiting reverse-proxy HTTP gateway.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Configuration file to serve.
    #[arg(
        short,
        long,
        env = "TOLLGATE_CONFIG",
        default_value = "gateway.yaml",
        global = true
    )]
    config: PathBuf,
    /// Listen on these addresses instead of the file's `listen` (repeatable):
    /// IP:PORT, or HOST:PORT with every address the name resolves to.
    #[arg(long, value_name = "ADDR", value_parser = socket_addrs)]
    listen: Vec<Addrs>,
    /// Serve the admin listener on this address instead of the file's `admin`
    /// (IP:PORT, or HOST:PORT and the first address the name resolves to).
    #[arg(long, value_name = "ADDR", value_parser = socket_addrs)]
    admin: Option<Addrs>,
    /// Log lines as human-readable text or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a configuration file without serving; exit status 2 if it is bad.
    Check {
        /// The file to check (defaults to --config).
        file: Option<PathBuf>,
    },
    /// Print the JSON Schema of the configuration file (for editor completion).
    Schema,
    /// Replay recorded traffic through the configuration's routes and limits
    /// on a clock that follows the log, and report what they would have done.
    Simulate(SimulateArgs),
    /// Ask a running gateway's admin listener whether it is up (`/healthz`)
    /// or ready (`/readyz`): exit status 0 on a 200, else 1 with the reason.
    /// For container health checks; the image has no curl.
    Health(HealthArgs),
    /// One caller's limits on a running gateway: `show` them (read without
    /// counting) or `reset` them, e.g. `tollgate callers show api_key=k1`.
    /// The token comes from TOLLGATE_ADMIN_TOKEN.
    Callers {
        #[command(subcommand)]
        action: CallersAction,
    },
    /// Per-caller overrides on a running gateway: `set` one (e.g.
    /// `api_key=k1 limit=per_key quota=6 ttl=24h`), `list` them, `rm` one.
    /// The token comes from TOLLGATE_ADMIN_TOKEN.
    Overrides {
        #[command(subcommand)]
        action: OverridesAction,
    },
}

#[derive(Debug, Subcommand)]
enum CallersAction {
    /// The caller's limits: quota, used, remaining, reset, override.
    Show(ApiArgs),
    /// Resets the caller's counters (all, or `route=` / `limit=`) on every gateway.
    Reset(ApiArgs),
}

#[derive(Debug, Subcommand)]
enum OverridesAction {
    /// Sets an override: a caller field, then `limit=`, `quota=`, `window=`,
    /// `plan=`, `exempt=true`, `ttl=`.
    Set(ApiArgs),
    /// Lists every override.
    List(ApiArgs),
    /// Removes the caller's override of `limit=` (every one without it).
    Rm(ApiArgs),
}

/// The arguments of `tollgate callers` and `tollgate overrides`
/// (docs/operations.md#support-one-callers-limits).
#[derive(Debug, clap::Args)]
struct ApiArgs {
    /// `NAME=VALUE`: the caller (`ip`, `api_key`, `user`, `header.NAME`)
    /// and what to narrow or set.
    #[arg(value_name = "NAME=VALUE")]
    fields: Vec<String>,
    /// The admin listener: `http://HOST:PORT` or `HOST:PORT`.
    #[arg(long, value_name = "URL", default_value = tollgate::admin::probe::DEFAULT_ADMIN)]
    admin: String,
    /// Print the gateway's JSON answer instead of a table.
    #[arg(long)]
    json: bool,
}

/// `tollgate health` (docs/operations.md).
#[derive(Debug, clap::Args)]
struct HealthArgs {
    /// The admin listener: `http://HOST:PORT` or `HOST:PORT`.
    #[arg(long, value_name = "URL", default_value = tollgate::admin::probe::DEFAULT_ADMIN)]
    admin: String,
    /// Ask `/readyz` (takes traffic) instead of `/healthz` (is up).
    #[arg(long)]
    ready: bool,
    /// Give up after this many seconds (connect, request and answer).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0, value_parser = seconds)]
    timeout: f64,
}

/// A positive, finite number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && Duration::try_from_secs_f64(v).is_ok() => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

/// `tollgate simulate` (docs/simulate.md).
#[derive(Debug, clap::Args)]
struct SimulateArgs {
    /// Logs to replay, in order; `.gz` files are read through gzip.
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,
    /// Replay through this configuration too, and report who is newly
    /// limited and who no longer is.
    #[arg(long, value_name = "OLD.yaml")]
    against: Option<PathBuf>,
    /// The report's form.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Write the report to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The logs' format (default: detected from the first non-empty line).
    #[arg(long, value_enum)]
    input: Option<InputArg>,
    /// Combined format: the header an extra quoted field after the user
    /// agent becomes, in order (repeatable; `-` skips a field).
    #[arg(long = "field", value_name = "HEADER")]
    fields: Vec<String>,
    /// The `Host` of requests whose line names none.
    #[arg(long, value_name = "HOST")]
    host: Option<String>,
    /// Offenders listed per route and per limit.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Also write every request's decision to this file (JSON lines).
    #[arg(long, value_name = "FILE")]
    decisions: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ReportFormat {
    Table,
    Json,
    Html,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum InputArg {
    Combined,
    Tollgate,
    Jsonl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Exit status for a configuration that does not load.
const BAD_CONFIG: u8 = 2;

/// Writes `text` and a newline to stdout, and returns `status`.
///
/// A reader that stopped reading (`EPIPE`: `| head`, a closed terminal) is
/// not a failure of the command: the rest is dropped quietly and `status`
/// stands, as in ripgrep. A shell's pipeline status is the last command's
/// anyway, and a SIGPIPE-style 141 would fail `set -o pipefail` scripts
/// for `tollgate schema | head`. Any other write error is one (a full
/// disk): it is reported on stderr and the status is 1.
fn print(text: &str, status: ExitCode) -> ExitCode {
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => status,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => status,
        Err(e) => {
            complain(format_args!("tollgate: cannot write to stdout: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Writes a line to stderr. When stderr itself is gone there is nowhere
/// left to say anything, so a failure is ignored and the caller's exit
/// status carries the outcome.
fn complain(line: impl Display) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Schema)) {
        return print(&tollgate::config::schema::json(), ExitCode::SUCCESS);
    }
    if let Some(Command::Simulate(args)) = &cli.command {
        return simulate(&cli.config, args);
    }
    if let Some(Command::Health(args)) = &cli.command {
        return health(args);
    }
    if let Some(Command::Callers { action }) = &cli.command {
        return support_api(ApiCall::Callers(action));
    }
    if let Some(Command::Overrides { action }) = &cli.command {
        return support_api(ApiCall::Overrides(action));
    }
    // The guard is kept to the end of `main`: dropping it writes out what
    // is queued.
    let (access_log, _flush_at_exit) = init_logging(cli.log_format);

    let path = match &cli.command {
        Some(Command::Check { file: Some(f) }) => f.clone(),
        _ => cli.config.clone(),
    };
    let mut config = match load(&path) {
        Ok(c) => c,
        Err(status) => return status,
    };
    if matches!(cli.command, Some(Command::Check { .. })) {
        // Warnings first, one line per limit, then the verdict: the file
        // is valid either way.
        let mut text = tollgate::config::load::advice(&config).join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!(
            "{}: ok ({} routes)",
            path.display(),
            config.routes.len()
        ));
        return print(&text, ExitCode::SUCCESS);
    }

    let overrides = Overrides {
        listen: cli
            .listen
            .iter()
            .flat_map(|a| a.0.iter().copied())
            .collect(),
        admin: cli.admin.as_ref().and_then(|a| a.0.first().copied()),
    };
    overrides.apply(&mut config);
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            complain(format_args!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(config, path, overrides, access_log))
}

/// Logs to stderr, filtered by `RUST_LOG` (`info` when unset), as text or
/// as JSON lines. Every line goes through a bounded queue that a thread of
/// its own writes out: a slow or unread stderr drops (and counts) lines
/// instead of holding up requests. The access log, in the same format and
/// queue; dropping the guard writes out what is queued.
fn init_logging(format: LogFormat) -> (AccessWriter, tollgate::logs::Flush) {
    let (writer, guard) = tollgate::logs::stderr();
    let access_log = AccessWriter::new(writer.clone(), format == LogFormat::Json);
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(writer)
        // Colours for a terminal only: a log file or a collector gets plain
        // text, not escape codes.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    (access_log, guard)
}

/// The configuration at `path`; when it does not load, every error is
/// written to stderr and the exit status is [`BAD_CONFIG`].
fn load(path: &Path) -> Result<Config, ExitCode> {
    if !path.exists() {
        complain(format_args!(
            "no configuration file at {}; name one with --config FILE (or -c FILE) or the \
             TOLLGATE_CONFIG environment variable",
            path.display()
        ));
        return Err(ExitCode::from(BAD_CONFIG));
    }
    tollgate::config::load::load_file(path).map_err(|errors| config_errors(path.display(), &errors))
}

/// The addresses of `--listen` and `--admin`.
#[derive(Debug, Clone)]
struct Addrs(Vec<std::net::SocketAddr>);

/// `IP:PORT`, or `HOST:PORT` resolved now to every address the name has,
/// as nginx's `listen` reads a name.
fn socket_addrs(s: &str) -> Result<Addrs, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = s.parse() {
        return Ok(Addrs(vec![addr]));
    }
    let write = "write IP:PORT or HOST:PORT, e.g. 127.0.0.1:8080, [::1]:8080 or localhost:8080";
    let mut all: Vec<std::net::SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("{s:?} is not an address that resolves ({e}); {write}"))?
        .collect();
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        return Err(format!("{s:?} resolves to no address; {write}"));
    }
    Ok(Addrs(all))
}

/// Every error of the configuration at `path` written to stderr, under a
/// header that counts them; the exit status is [`BAD_CONFIG`].
fn config_errors(path: impl Display, errors: &ConfigErrors) -> ExitCode {
    complain(format_args!("{path}: {} error(s):", errors.0.len()));
    for e in &errors.0 {
        complain(format_args!("  {e}"));
    }
    ExitCode::from(BAD_CONFIG)
}

/// The async runtime.
///
/// `TOKIO_WORKER_THREADS=1` asks for one thread: then a current-thread
/// runtime serves everything on the main thread, without the
/// work-stealing scheduler's cross-thread queues and wake-ups, which
/// cost CPU on every request and buy nothing with a single worker.
fn runtime() -> io::Result<tokio::runtime::Runtime> {
    let one_thread = std::env::var("TOKIO_WORKER_THREADS")
        .is_ok_and(|v| v.trim().parse::<usize>().ok() == Some(1));
    let mut builder = if one_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder.enable_all().build()
}

/// Serves `config` until SIGTERM or SIGINT, reloading it from `path` on
/// SIGHUP; the exit status. Runs inside the runtime.
async fn serve(
    config: Config,
    path: PathBuf,
    overrides: Overrides,
    access_log: AccessWriter,
) -> ExitCode {
    // SIGHUP, SIGTERM and SIGINT are caught before anything is bound.
    let hangups = Hangups::catch();
    let shutdown = shutdown_signal();
    let serve = match bind_listeners(&config) {
        Ok(bound) => Serve {
            reload: Some(Reload {
                path,
                overrides,
                hangups,
            }),
            access_log: Some(access_log),
            ..bound
        },
        Err(status) => return status,
    };
    match tollgate::run(config, serve, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            complain(format_args!("tollgate: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Every listener of `config`, the admin one too, bound with the
/// configured accept queue; an address that cannot be bound is said on
/// stderr and ends the command with status 1.
fn bind_listeners(config: &Config) -> Result<Serve, ExitCode> {
    let backlog = config.server.backlog;
    let mut listeners = Vec::new();
    for addr in config.listen.iter().map(|l| l.addr) {
        match tollgate::listener::bind(addr, backlog) {
            Ok(l) => listeners.push(l),
            Err(e) => {
                complain(format_args!("cannot listen on {addr}: {e}"));
                return Err(ExitCode::FAILURE);
            }
        }
    }
    let admin = match config.admin {
        Some(addr) => match tollgate::listener::bind(addr, backlog) {
            Ok(l) => Some(l),
            Err(e) => {
                complain(format_args!("cannot listen on admin address {addr}: {e}"));
                return Err(ExitCode::FAILURE);
            }
        },
        None => None,
    };
    Ok(Serve {
        admin,
        ..Serve::on(listeners)
    })
}

/// `tollgate simulate`: the report on stdout or in `--out`; exit status 2
/// for a configuration that does not load, 1 for a log that cannot be read.
fn simulate(config: &std::path::Path, args: &SimulateArgs) -> ExitCode {
    use tollgate::simulate::{self, InputFormat, OutputFormat, SimError};
    let mut fields = Vec::new();
    for f in &args.fields {
        match http::HeaderName::from_bytes(f.as_bytes()) {
            Ok(name) => fields.push(name),
            Err(_) => {
                complain(format_args!("--field {f:?} is not a header name"));
                return ExitCode::from(BAD_CONFIG);
            }
        }
    }
    let opts = simulate::Options {
        against: args.against.clone(),
        input: args.input.map(|i| match i {
            InputArg::Combined => InputFormat::Combined,
            InputArg::Tollgate => InputFormat::Tollgate,
            InputArg::Jsonl => InputFormat::Jsonl,
        }),
        fields,
        host: args.host.clone(),
        top: args.top,
        decisions: args.decisions.clone(),
        progress: io::stderr().is_terminal(),
        ..simulate::Options::new(config, args.logs.clone())
    };
    let report = match simulate::simulate(&opts) {
        Ok(r) => r,
        Err(SimError::Config { path, errors }) => return config_errors(path, &errors),
        Err(e) => {
            complain(format_args!("tollgate simulate: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let format = match args.format {
        ReportFormat::Table => OutputFormat::Table,
        ReportFormat::Json => OutputFormat::Json,
        ReportFormat::Html => OutputFormat::Html,
    };
    let text = simulate::render(&report, format);
    match &args.out {
        Some(path) => match std::fs::write(path, text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                complain(format_args!("cannot write {}: {e}", path.display()));
                ExitCode::FAILURE
            }
        },
        None => print(text.trim_end(), ExitCode::SUCCESS),
    }
}

/// `tollgate health`: the answer on stdout and status 0 when the admin
/// listener answers 200; otherwise the reason on stderr and status 1,
/// whatever went wrong — a container runtime reads 1 as unhealthy and
/// reserves 2.
fn health(args: &HealthArgs) -> ExitCode {
    use tollgate::admin::probe::{Check, probe};
    let check = if args.ready {
        Check::Ready
    } else {
        Check::Live
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    let answer = run_client(probe(&args.admin, check, timeout));
    match answer {
        Ok(healthy) => print(
            &format!("{}: {}", healthy.url, healthy.body),
            ExitCode::SUCCESS,
        ),
        Err(reason) => {
            complain(format_args!("tollgate health: {reason}"));
            ExitCode::FAILURE
        }
    }
}

/// Runs `work`, a client's one exchange with a running gateway, on a
/// runtime of this thread; its error, or the runtime's, as text.
fn run_client<T, E: std::fmt::Display>(
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(work).map_err(|e| e.to_string())
}

/// Which support API command runs.
enum ApiCall<'a> {
    Callers(&'a CallersAction),
    Overrides(&'a OverridesAction),
}

/// `tollgate callers` and `tollgate overrides`: one call of the admin
/// listener's support API, its answer as a table (or `--json`) on stdout
/// and status 0; a refusal's detail on stderr and status 1.
fn support_api(call: ApiCall<'_>) -> ExitCode {
    use http::Method;
    use tollgate::admin::table;
    let (method, path, args, render): (Method, &str, &ApiArgs, fn(&serde_json::Value) -> String) =
        match call {
            ApiCall::Callers(CallersAction::Show(a)) => {
                (Method::GET, "/admin/callers", a, table::callers)
            }
            ApiCall::Callers(CallersAction::Reset(a)) => {
                (Method::DELETE, "/admin/callers", a, table::reset)
            }
            ApiCall::Overrides(OverridesAction::Set(a)) => {
                (Method::PUT, "/admin/overrides", a, table::overrides)
            }
            ApiCall::Overrides(OverridesAction::List(a)) => {
                (Method::GET, "/admin/overrides", a, table::overrides)
            }
            ApiCall::Overrides(OverridesAction::Rm(a)) => {
                (Method::DELETE, "/admin/overrides", a, table::overrides)
            }
        };
    let built = if method == Method::PUT {
        table::body(&args.fields).map(|b| (path.to_owned(), b))
    } else {
        table::query(&args.fields).map(|q| {
            let target = if q.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{q}")
            };
            (target, String::new())
        })
    };
    let (target, body) = match built {
        Ok(b) => b,
        Err(e) => {
            complain(format_args!("{e}"));
            return ExitCode::from(2);
        }
    };
    let token = std::env::var("TOLLGATE_ADMIN_TOKEN").ok();
    let answer = run_client(tollgate::admin::probe::call(
        &args.admin,
        method,
        &target,
        token.as_deref(),
        body.into(),
        Duration::from_secs(10),
    ));
    let (status, bytes) = match answer {
        Ok(a) => a,
        Err(reason) => {
            complain(format_args!("{reason}"));
            return ExitCode::FAILURE;
        }
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if !status.is_success() {
        let detail = value["detail"].as_str().map_or_else(
            || String::from_utf8_lossy(&bytes).into_owned(),
            str::to_owned,
        );
        complain(format_args!("{status}: {detail}"));
        if status == http::StatusCode::UNAUTHORIZED {
            complain(format_args!("{}", token_hint(token.is_some())));
        }
        return ExitCode::FAILURE;
    }
    if args.json {
        return print(&value.to_string(), ExitCode::SUCCESS);
    }
    print(&render(&value), ExitCode::SUCCESS)
}

/// What a 401 of the support API asks of the command line's user.
fn token_hint(token_set: bool) -> &'static str {
    if token_set {
        "the token in TOLLGATE_ADMIN_TOKEN is not the gateway's admin token \
         (admin.token or admin.token_file); export the right one"
    } else {
        "the command line sends the token in TOLLGATE_ADMIN_TOKEN, which is not set: \
         export TOLLGATE_ADMIN_TOKEN=<admin token> (admin.token or admin.token_file)"
    }
}

/// A future that completes on SIGTERM or SIGINT, with both caught from the
/// moment this returns. Must be called inside the runtime.
///
/// tokio installs a signal handler when the stream is created, and
/// `ctrl_c()` only when first polled; the drain polls its shutdown future
/// only after the listeners are up and logged. Created lazily, a SIGTERM
/// right after the "listening" line met the default action — exit at once,
/// nothing drained — so, like [`tollgate::reload::Hangups::catch`], the
/// streams are made before anything is bound.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams = [SignalKind::terminate(), SignalKind::interrupt()].map(|kind| {
            signal(kind)
                .map_err(|e| {
                    complain(format_args!("cannot catch signal {kind:?}: {e}"));
                })
                .ok()
        });
        async move {
            let [term, int] = streams;
            let wait = |stream: Option<tokio::signal::unix::Signal>| async move {
                match stream {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(int) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
