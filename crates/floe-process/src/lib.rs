//! What every Floe binary (`floe`, `floe-catalog`, `floe-maintenance`) does as a process:
//! log to stderr (structured, colour only on a terminal, or JSON lines), stop gracefully on
//! SIGTERM or SIGINT, and serve its Prometheus registry at `/metrics` with the probes
//! `/healthz` and `/readyz` and, where the binary has one, its status page at `/` beside it.

pub mod html;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;

use prometheus::{Encoder, Registry, TextEncoder};

/// Milliseconds since the Unix epoch (0 on a clock before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

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

/// Whether the process does its work yet: what `/readyz` answers. A job is ready once it has
/// recovered its committed state and reads its sources; a daemon once it schedules. Clones
/// share one flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Whether it is.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A status page: HTML rendered at each request.
pub type Page = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves, in the background on `listen`, `registry` at `/metrics`, `/healthz` (200 while the
/// process answers: a liveness probe), `/readyz` (200 once `ready` is set, 503 before: a
/// readiness probe) and `page` at `/`; returns the bound address (so `127.0.0.1:0` picks a
/// free port).
pub async fn serve_metrics(
    registry: Registry,
    listen: &str,
    ready: Readiness,
    page: Option<Page>,
) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { render(&registry) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready.is_ready() {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
                    }
                }
            }),
        );
    let app = match page {
        Some(page) => app.route(
            "/",
            get(move || {
                let page = page.clone();
                async move { axum::response::Html(page()) }
            }),
        ),
        None => app,
    };
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status code and body of `GET path`.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response.split(' ').nth(1).unwrap().parse().unwrap();
        let body = response.split_once("\r\n\r\n").unwrap().1.to_string();
        (status, body)
    }

    #[tokio::test]
    async fn probes_answer_alive_at_once_and_ready_only_when_told() {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("floe_test_total", "a test counter").unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        counter.inc();
        let ready = Readiness::default();
        let page: Page = Arc::new(|| "<p>a page</p>".to_string());
        let addr = serve_metrics(registry, "127.0.0.1:0", ready.clone(), Some(page))
            .await
            .unwrap();
        assert_eq!(get(addr, "/").await, (200, "<p>a page</p>".into()));
        assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(get(addr, "/readyz").await, (503, "starting\n".into()));
        ready.set(true);
        assert_eq!(get(addr, "/readyz").await, (200, "ready\n".into()));
        let (status, metrics) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(metrics.contains("floe_test_total 1"), "{metrics}");
        assert_eq!(get(addr, "/nothing").await.0, 404);
    }
}
