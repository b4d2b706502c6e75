//! What every Floe binary (`floe`, `floe-catalog`, `floe-maintenance`) does as a process:
//! stop gracefully on SIGTERM or SIGINT, and serve its Prometheus registry at `/metrics`.

use std::net::SocketAddr;

use prometheus::{Encoder, Registry, TextEncoder};

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
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
