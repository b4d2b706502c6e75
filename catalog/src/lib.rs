//! `floe-catalog`: an Iceberg REST catalog server.
//!
//! It serves the REST catalog spec's namespace, table and multi-table transaction endpoints
//! over a [`store::CatalogStore`] (SQLite by default, Postgres for production) that keeps the
//! JDBC catalog's tables, with metadata files in a [`warehouse::Warehouse`] on a local path or
//! S3-compatible storage. Its contract:
//!
//! * a commit checks every requirement, applies the updates, writes the next metadata file and
//!   swaps the pointer with a compare-and-swap; a multi-table commit swaps all pointers in one
//!   database transaction, so it is all or nothing;
//! * every 4xx leaves the store and the warehouse as they were; a 5xx is answered only when the
//!   outcome may be unknown;
//! * an `Idempotency-Key` replay returns the first outcome and applies nothing.
//!
//! [`start`] binds and serves in the background (used by the binary, tests and benchmarks).

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod idempotency;
pub mod ident;
pub mod metadata_json;
pub mod metrics;
pub mod service;
pub mod store;
pub mod warehouse;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::config::{CatalogConfig, StoreUrl};
use crate::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::service::Catalog;
use crate::store::{CatalogStore, PostgresBackend, SqlStore, SqliteBackend};
use crate::warehouse::Warehouse;

/// How long [`RunningCatalog::stop`] waits for open connections to finish.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A catalog server running on a background task.
#[derive(Debug)]
pub struct RunningCatalog {
    /// The address it listens on (useful with port 0).
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningCatalog {
    /// The base URI clients use, e.g. `http://127.0.0.1:8181`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting requests and lets in-flight ones finish for up to [`DRAIN_TIMEOUT`];
    /// then it returns, closing what is left. A client's idle keep-alive connection can hold
    /// axum's graceful shutdown open indefinitely, and a catalog asked to stop must stop.
    pub async fn stop(mut self) -> std::io::Result<()> {
        self.shutdown.cancel();
        match tokio::time::timeout(DRAIN_TIMEOUT, &mut self.task).await {
            Ok(joined) => {
                joined.map_err(|e| std::io::Error::other(format!("catalog task failed: {e}")))?
            }
            Err(_) => {
                tracing::warn!(
                    "connections still open {} s after the stop; closing them",
                    DRAIN_TIMEOUT.as_secs()
                );
                self.task.abort();
                Ok(())
            }
        }
    }
}

/// Opens the store named by the config.
pub async fn open_store(config: &CatalogConfig) -> ApiResult<Arc<dyn CatalogStore>> {
    Ok(match &config.store {
        StoreUrl::Sqlite(path) => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| {
                    ApiError::internal(format!("could not create {}: {e}", parent.display()))
                })?;
            }
            Arc::new(SqlStore::open(SqliteBackend::open(path)?, &config.name).await?)
        }
        StoreUrl::Postgres(url) => Arc::new(
            SqlStore::open(
                PostgresBackend::connect(url, config.max_db_connections)?,
                &config.name,
            )
            .await?,
        ),
    })
}

/// Opens the store and warehouse, binds `config.listen`, and serves until [`RunningCatalog::stop`].
pub async fn start(config: &CatalogConfig) -> ApiResult<RunningCatalog> {
    let metrics = Metrics::new();
    let store = open_store(config).await?;
    let warehouse = Warehouse::open(&config.warehouse, &config.s3)?;
    let state = AppState {
        catalog: Catalog::new(store, warehouse, metrics.clone()),
        prefix: config.name.clone(),
        auth: Arc::new(config.auth.clone()),
        metrics,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| ApiError::internal(format!("cannot listen on {}: {e}", config.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ApiError::internal(format!("cannot read the bound address: {e}")))?;
    let shutdown = CancellationToken::new();
    let stopped = shutdown.clone();
    let app = api::router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopped.cancelled().await })
            .await
    });
    Ok(RunningCatalog {
        addr,
        shutdown,
        task,
    })
}
