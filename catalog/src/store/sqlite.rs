//! The SQLite backend: one database file (the embedded default) or memory, in WAL mode.
//!
//! One connection serves the process; SQLite serialises writers anyway, and our statements take
//! microseconds. Calls run under `block_in_place` so they never stall other tasks on the
//! runtime's worker. Write transactions use `BEGIN IMMEDIATE` so two catalog processes sharing
//! the file queue on the lock (`busy_timeout`) instead of failing with a deadlock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::sql::{Cell, Dialect, Param, SqlBackend, SqlTx};
use crate::error::{ApiError, ApiResult, ErrorType};

/// A SQLite database behind one connection.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    conn: Arc<Mutex<Connection>>,
}

fn unavailable(error: rusqlite::Error) -> ApiError {
    ApiError::new(
        ErrorType::ServiceUnavailable,
        format!("the catalog database (SQLite) failed: {error}"),
    )
}

impl SqliteBackend {
    /// Opens (creating if needed) the database file at `path`; `:memory:` gives a private
    /// in-memory database.
    pub fn open(path: &Path) -> ApiResult<Self> {
        let conn = if path.as_os_str() == ":memory:" {
            Connection::open_in_memory()
        } else {
            Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
        }
        .map_err(unavailable)?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(unavailable)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;
             PRAGMA case_sensitive_like = ON;",
        )
        .map_err(unavailable)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }
}

struct SqliteTx {
    conn: Option<OwnedMutexGuard<Connection>>,
}

fn to_sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

fn bind(params: &[Param<'_>]) -> Vec<Value> {
    params
        .iter()
        .map(|p| match p {
            Param::Text(Some(s)) => Value::Text(s.to_string()),
            Param::Text(None) => Value::Null,
            Param::Int(i) => Value::Integer(*i),
        })
        .collect()
}

impl SqliteTx {
    fn conn(&mut self) -> ApiResult<&mut Connection> {
        self.conn
            .as_deref_mut()
            .ok_or_else(|| ApiError::internal("transaction used after it ended"))
    }
}

#[async_trait]
impl SqlTx for SqliteTx {
    async fn exec(&mut self, sql: &str, params: &[Param<'_>]) -> ApiResult<u64> {
        let conn = self.conn()?;
        let values = bind(params);
        tokio::task::block_in_place(|| {
            let mut stmt = conn.prepare_cached(&to_sqlite(sql))?;
            stmt.execute(rusqlite::params_from_iter(values.iter()))
        })
        .map(|n| n as u64)
        .map_err(unavailable)
    }

    async fn query(&mut self, sql: &str, params: &[Param<'_>]) -> ApiResult<Vec<Vec<Cell>>> {
        let conn = self.conn()?;
        let values = bind(params);
        tokio::task::block_in_place(|| {
            let mut stmt = conn.prepare_cached(&to_sqlite(sql))?;
            let width = stmt.column_count();
            let mut rows = stmt.query(rusqlite::params_from_iter(values.iter()))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let mut cells = Vec::with_capacity(width);
                for i in 0..width {
                    cells.push(match row.get_ref(i)? {
                        ValueRef::Null => Cell::Null,
                        ValueRef::Integer(v) => Cell::Int(v),
                        ValueRef::Real(v) => Cell::Text(v.to_string()),
                        ValueRef::Text(t) | ValueRef::Blob(t) => {
                            Cell::Text(String::from_utf8_lossy(t).into_owned())
                        }
                    });
                }
                out.push(cells);
            }
            Ok(out)
        })
        .map_err(unavailable)
    }

    async fn commit(mut self: Box<Self>) -> ApiResult<()> {
        let conn = self.conn()?;
        let result = tokio::task::block_in_place(|| conn.execute_batch("COMMIT"));
        // A COMMIT that failed (SQLITE_BUSY, a full disk) leaves the transaction open: keep
        // the connection so that drop rolls it back, or every later BEGIN would fail.
        if result.is_ok() {
            self.conn = None;
        }
        result.map_err(unavailable)
    }
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_deref_mut() {
            // Not committed: undo. A failure here means the transaction is already gone.
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
}

#[async_trait]
impl SqlBackend for SqliteBackend {
    async fn begin(&self, write: bool) -> ApiResult<Box<dyn SqlTx>> {
        let guard = self.conn.clone().lock_owned().await;
        let begin = if write {
            "BEGIN IMMEDIATE"
        } else {
            "BEGIN DEFERRED"
        };
        tokio::task::block_in_place(|| guard.execute_batch(begin)).map_err(unavailable)?;
        Ok(Box::new(SqliteTx { conn: Some(guard) }))
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
}
