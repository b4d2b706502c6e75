//! Where the catalog keeps its pointers: the [`CatalogStore`] trait and its SQL implementation.
//!
//! The store holds only names and pointers — which namespaces exist with which properties, and
//! for each table the location of its current metadata file. Metadata itself lives in the
//! warehouse. The one operation that matters is [`CatalogStore::swap_pointers`]: a
//! compare-and-swap of one or more table pointers **in one database transaction**, together
//! with the idempotency record of the request, so a multi-table commit is all or nothing and a
//! replayed request can never apply twice.
//!
//! The tables follow the JDBC catalog's layout (`iceberg_tables`,
//! `iceberg_namespace_properties`, V1 schema with `iceberg_type`), so Iceberg Java's
//! `JdbcCatalog` and PyIceberg's `SqlCatalog` can read the same database. Floe adds
//! `floe_staged_tables` (stage-create, invisible to listings), `floe_idempotency` and
//! `floe_schema_version`. The statement logic is written once in [`sql`] over a tiny
//! transaction trait that the SQLite and Postgres backends implement.

mod postgres;
mod sql;
mod sqlite;

use std::collections::HashMap;

use async_trait::async_trait;

pub use self::postgres::PostgresBackend;
pub use self::sql::SqlStore;
pub use self::sqlite::SqliteBackend;
use crate::error::ApiResult;
use crate::ident::{Namespace, TableName};

/// One pointer change of a commit.
#[derive(Debug, Clone)]
pub struct PointerSwap {
    /// The table whose pointer moves.
    pub table: TableName,
    /// The metadata location the commit was based on; `None` creates the table.
    pub expected: Option<String>,
    /// The metadata location written by the commit.
    pub new: String,
}

/// A response remembered under an `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// Hash of the request the key was first used with.
    pub request_hash: String,
    /// The HTTP status of the first outcome.
    pub status: u16,
    /// The JSON body of the first outcome (empty for 204).
    pub body: String,
}

/// A response to remember, with the key and its expiry.
#[derive(Debug, Clone)]
pub struct IdempotencyRecord {
    /// The client's key.
    pub key: String,
    /// The outcome.
    pub response: StoredResponse,
    /// Milliseconds since the epoch after which the record may be forgotten.
    pub expires_at_ms: i64,
}

/// What became of a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwapOutcome {
    /// Every pointer moved.
    Committed,
    /// Some pointer had moved on (or a created table already existed): nothing changed.
    Lost {
        /// The table whose pointer did not match.
        table: TableName,
    },
}

/// The catalog's persistent state. Implementations must make [`Self::swap_pointers`] atomic.
#[async_trait]
pub trait CatalogStore: Send + Sync + std::fmt::Debug + 'static {
    /// Every namespace that exists (explicitly created, or implied by a table inside it).
    async fn list_namespaces(&self) -> ApiResult<Vec<Namespace>>;
    /// Creates a namespace with properties; `AlreadyExists` if it exists.
    async fn create_namespace(
        &self,
        namespace: &Namespace,
        properties: &HashMap<String, String>,
    ) -> ApiResult<()>;
    /// The namespace's properties, or `None` if it does not exist.
    async fn namespace_properties(
        &self,
        namespace: &Namespace,
    ) -> ApiResult<Option<HashMap<String, String>>>;
    /// Removes and sets properties in one transaction; `NoSuchNamespace` if missing.
    async fn update_namespace_properties(
        &self,
        namespace: &Namespace,
        removals: &[String],
        updates: &HashMap<String, String>,
    ) -> ApiResult<()>;
    /// Drops an empty namespace; `NamespaceNotEmpty` if it holds tables or namespaces.
    async fn drop_namespace(&self, namespace: &Namespace) -> ApiResult<()>;
    /// The names of the tables in a namespace; `NoSuchNamespace` if missing.
    async fn list_tables(&self, namespace: &Namespace) -> ApiResult<Vec<String>>;
    /// The table's current metadata location, or `None` if there is no such table.
    async fn table_pointer(&self, table: &TableName) -> ApiResult<Option<String>>;
    /// Moves every pointer from `expected` to `new` (creating tables whose `expected` is
    /// `None`), and stores `remember` — all in one transaction, or nothing at all.
    async fn swap_pointers(
        &self,
        swaps: &[PointerSwap],
        remember: Option<&IdempotencyRecord>,
    ) -> ApiResult<SwapOutcome>;
    /// Removes a table and returns its last metadata location; `NoSuchTable` if missing.
    async fn drop_table(&self, table: &TableName) -> ApiResult<String>;
    /// Renames a table; `NoSuchTable`, `NoSuchNamespace` or `AlreadyExists` as fits.
    async fn rename_table(&self, from: &TableName, to: &TableName) -> ApiResult<()>;
    /// Remembers the metadata of a staged (not yet visible) table, replacing an older one.
    async fn put_staged(&self, table: &TableName, metadata_json: &str) -> ApiResult<()>;
    /// The metadata of a staged table, if one was staged.
    async fn staged(&self, table: &TableName) -> ApiResult<Option<String>>;
    /// The response first given for an idempotency key, unless it expired.
    async fn remembered(&self, key: &str, now_ms: i64) -> ApiResult<Option<StoredResponse>>;
    /// Remembers a response outside of a commit (for non-commit mutations and 4xx outcomes).
    async fn remember(&self, record: &IdempotencyRecord) -> ApiResult<()>;
    /// Whether the store answers (for `/healthz`).
    async fn ping(&self) -> ApiResult<()>;
}
