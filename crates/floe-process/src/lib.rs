//! What every Floe binary (`floe`, `floe-catalog`, `floe-maintenance`) does as a process:
//! log to stderr (structured, colour only on a terminal, or JSON lines), stop gracefully on
//! SIGTERM or SIGINT, and serve its Prometheus registry at `/metrics`.

use std::io::IsTerminal;
use std::net::SocketAddr;

use prometheus::{Encoder, Registry, TextEncoder};

/// Starts logging to stderr: `RUST_LOG` filters (else `default_level`); JSON lines with
/// `json`, else text with colours only when stderr is a terminal (a file or pipe gets no
/// escape codes).
pub fn init_logs(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// Listens for SIGTERM and SIGINT (Ctrl-C) from the moment it is called, and resolves on the
/// first: a signal that arrives before the returned future is polled (a process still
/// starting) is kept, not left to the default action that would kill the process.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let terminate = signal(SignalKind::terminate()).ok();
    let interrupt = signal(SignalKind::interrupt()).ok();
    let first = |s: Option<Signal>| async move {
        match s {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    async move {
        tokio::select! {
            () = first(terminate) => {}
            () = first(interrupt) => {}
        }
    }
}

/// The registry in the Prometheus text exposition format.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Serves `registry` at `http://{listen}/metrics` in the background; returns the bound address
/// (so `127.0.0.1:0` picks a free port).
pub async fn serve_metrics(registry: Registry, listen: &str) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move { render(&registry) }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(addr)
}
