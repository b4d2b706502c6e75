//! The Postgres backend (tokio-postgres behind a deadpool pool), for production catalogs.
//!
//! Transactions are opened with explicit `BEGIN` on a pooled connection so they can be held in
//! a boxed trait object; one dropped without commit is rolled back on a background task before
//! its connection returns to the pool. Commits run at `READ COMMITTED`: the compare-and-swap is
//! a single-row `UPDATE … WHERE metadata_location = old`, which Postgres re-checks after
//! waiting on a concurrent writer's row lock, so two racing commits can never both win.

use async_trait::async_trait;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime, Timeouts};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::sql::{Cell, Dialect, Param, SqlBackend, SqlTx};
use crate::error::{ApiError, ApiResult, ErrorType};

/// Longest wait for a new connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a free pooled connection.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// A pool of Postgres connections.
#[derive(Clone)]
pub struct PostgresBackend {
    pool: Pool,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The pool's config holds the password; never print it.
        f.debug_struct("PostgresBackend").finish_non_exhaustive()
    }
}

fn unavailable(error: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        ErrorType::ServiceUnavailable,
        format!("the catalog database (Postgres) failed: {error}"),
    )
}

/// Maps a statement error: a unique-key violation means a concurrent writer created the same
/// row first (409); anything else is the database's fault.
fn statement_error(error: tokio_postgres::Error) -> ApiError {
    if error.code() == Some(&SqlState::UNIQUE_VIOLATION) {
        return ApiError::new(
            ErrorType::AlreadyExists,
            "the name was taken by a concurrent request",
        );
    }
    unavailable(error)
}

impl PostgresBackend {
    /// Connects to `url` (`postgres://user:pass@host:port/db`) with up to `max_connections`.
    pub fn connect(url: &str, max_connections: usize) -> ApiResult<Self> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            ApiError::bad_request(format!("the Postgres store URL is invalid: {e}"))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // Bounded waits: a request answers 503 when the database is unreachable or every
        // connection is busy, instead of hanging.
        let pool = Pool::builder(manager)
            .max_size(max_connections)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: Some(POOL_WAIT),
                create: Some(CONNECT_TIMEOUT),
                recycle: Some(CONNECT_TIMEOUT),
            })
            .build()
            .map_err(unavailable)?;
        Ok(Self { pool })
    }
}

struct PgTx {
    conn: Option<Object>,
}

impl PgTx {
    fn conn(&self) -> ApiResult<&Object> {
        self.conn
            .as_ref()
            .ok_or_else(|| ApiError::internal("transaction used after it ended"))
    }
}

fn bind<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| match p {
            Param::Text(v) => v as &(dyn ToSql + Sync),
            Param::Int(v) => v as &(dyn ToSql + Sync),
        })
        .collect()
}

#[async_trait]
impl SqlTx for PgTx {
    async fn exec(&mut self, sql: &str, params: &[Param<'_>]) -> ApiResult<u64> {
        let conn = self.conn()?;
        let stmt = conn.prepare_cached(sql).await.map_err(unavailable)?;
        conn.execute(&stmt, &bind(params))
            .await
            .map_err(statement_error)
    }

    async fn query(&mut self, sql: &str, params: &[Param<'_>]) -> ApiResult<Vec<Vec<Cell>>> {
        let conn = self.conn()?;
        let stmt = conn.prepare_cached(sql).await.map_err(unavailable)?;
        let rows = conn
            .query(&stmt, &bind(params))
            .await
            .map_err(unavailable)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut cells = Vec::with_capacity(row.len());
            for (i, column) in row.columns().iter().enumerate() {
                let cell = match *column.type_() {
                    Type::INT8 => row.try_get::<_, Option<i64>>(i).map(|v| v.map(Cell::Int)),
                    Type::INT4 => row
                        .try_get::<_, Option<i32>>(i)
                        .map(|v| v.map(|v| Cell::Int(v.into()))),
                    _ => row
                        .try_get::<_, Option<String>>(i)
                        .map(|v| v.map(Cell::Text)),
                }
                .map_err(unavailable)?;
                cells.push(cell.unwrap_or(Cell::Null));
            }
            out.push(cells);
        }
        Ok(out)
    }

    async fn commit(mut self: Box<Self>) -> ApiResult<()> {
        let conn = self
            .conn
            .take()
            .ok_or_else(|| ApiError::internal("transaction used after it ended"))?;
        conn.batch_execute("COMMIT").await.map_err(unavailable)
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Not committed: roll back before the connection is reused. If that fails the
            // connection is broken and is detached from the pool instead.
            tokio::spawn(async move {
                if conn.batch_execute("ROLLBACK").await.is_err() {
                    let _ = Object::take(conn);
                }
            });
        }
    }
}

#[async_trait]
impl SqlBackend for PostgresBackend {
    async fn begin(&self, _write: bool) -> ApiResult<Box<dyn SqlTx>> {
        let conn = self.pool.get().await.map_err(unavailable)?;
        conn.batch_execute("BEGIN").await.map_err(unavailable)?;
        Ok(Box::new(PgTx { conn: Some(conn) }))
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
}
