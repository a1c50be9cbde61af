//! An axum application with tollgate's limits in front of it.
//!
//! ```sh
//! cargo run --example axum_app -- --config FILE --listen ADDR
//! ```
//!
//! FILE is written as the gateway's file is: a `store:`, the caller
//! sections the limits' keys need (`client_ip:`, `api_keys:`, `users:`,
//! all optional) and a top-level `limits:` list, applied to every request.
//! The app answers `GET /` with 200. See docs/embedding.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use axum::extract::ConnectInfo;
use tollgate::RateLimitLayer;

#[derive(clap::Parser)]
struct Args {
    /// The layer's configuration file.
    #[arg(long)]
    config: PathBuf,
    /// Where the app listens.
    #[arg(long, default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let layer = match RateLimitLayer::from_file(&args.config) {
        // The client IP is the connection's, as axum sees it.
        Ok(builder) => builder.peer_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0)),
        Err(e) => {
            eprintln!("{}: {e}", args.config.display());
            return ExitCode::from(2);
        }
    };
    let layer = match layer.build().await {
        Ok(layer) => layer,
        Err(e) => {
            eprintln!("the limits cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello from the app\n" }))
        .layer(layer);
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    eprintln!("listening on {}", args.listen);
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serving ended: {e}");
            ExitCode::FAILURE
        }
    }
}
