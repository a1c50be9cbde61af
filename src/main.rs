//! The `tollgate` binary: parses the command line, sets up logging, loads the
//! configuration and hands it to [`tollgate::run`].
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tokio::net::TcpListener;

use tracing_subscriber::EnvFilter;

/// A rate-limiting reverse-proxy HTTP gateway.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Configuration file to serve.
    #[arg(short, long, default_value = "gateway.yaml", global = true)]
    config: PathBuf,
    /// Listen on these addresses instead of the file's `listen` (repeatable).
    #[arg(long, value_name = "ADDR")]
    listen: Vec<std::net::SocketAddr>,
    /// Serve the admin listener on this address instead of the file's `admin`.
    #[arg(long, value_name = "ADDR")]
    admin: Option<std::net::SocketAddr>,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Exit status for a configuration that does not load.
const BAD_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Some(Command::Schema)) {
        println!("{}", tollgate::config::schema::json());
        return ExitCode::SUCCESS;
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or a collector gets plain
        // text, not escape codes.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }

    let path = match &cli.command {
        Some(Command::Check { file: Some(f) }) => f.clone(),
        _ => cli.config.clone(),
    };
    let mut config = match tollgate::config::load_file(&path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{}: {} error(s):", path.display(), errors.0.len());
            for e in &errors.0 {
                eprintln!("  {e}");
            }
            return ExitCode::from(BAD_CONFIG);
        }
    };
    if matches!(cli.command, Some(Command::Check { .. })) {
        println!("{}: ok ({} routes)", path.display(), config.routes.len());
        return ExitCode::SUCCESS;
    }

    if !cli.listen.is_empty() {
        // Plain listeners: TLS settings belong to the file's entries.
        config.listen = cli.listen.iter().copied().map(Into::into).collect();
    }
    if cli.admin.is_some() {
        config.admin = cli.admin;
    }
    // `TOKIO_WORKER_THREADS=1` asks for one thread: then a current-thread
    // runtime serves everything on the main thread, without the
    // work-stealing scheduler's cross-thread queues and wake-ups, which
    // cost CPU on every request and buy nothing with a single worker.
    let one_thread = std::env::var("TOKIO_WORKER_THREADS")
        .is_ok_and(|v| v.trim().parse::<usize>().ok() == Some(1));
    let mut builder = if one_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let hangups = tollgate::reload::Hangups::catch();
        let mut listeners = Vec::new();
        for addr in config.listen.iter().map(|l| l.addr) {
            match TcpListener::bind(addr).await {
                Ok(l) => listeners.push(l),
                Err(e) => {
                    eprintln!("cannot listen on {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        let admin = match config.admin {
            Some(addr) => match TcpListener::bind(addr).await {
                Ok(l) => Some(l),
                Err(e) => {
                    eprintln!("cannot listen on admin address {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            },
            None => None,
        };
        let gateway = match tollgate::Gateway::new(config).await {
            Ok(g) => std::sync::Arc::new(g),
            Err(e) => {
                eprintln!("tollgate: {e}");
                return ExitCode::FAILURE;
            }
        };
        tokio::spawn(hangups.reload_on_each(
            gateway.clone(),
            path.clone(),
            tollgate::reload::Overrides {
                listen: cli.listen.clone(),
                admin: cli.admin,
            },
        ));
        tollgate::admin::serve_with_admin(gateway, listeners, admin, shutdown_signal()).await;
        ExitCode::SUCCESS
    })
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
