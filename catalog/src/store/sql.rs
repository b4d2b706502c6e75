//! The store's statements, written once over the [`SqlBackend`] / [`SqlTx`] pair that SQLite
//! and Postgres implement.
//!
//! Statements use `$N` placeholders (the SQLite backend rewrites them to `?N`), only text and
//! 64-bit integer values, and every change runs inside an explicit transaction that the caller
//! commits; a transaction dropped without commit is rolled back by its backend.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;

use super::{CatalogStore, IdempotencyRecord, PointerSwap, StoredResponse, SwapOutcome};
use crate::error::{ApiError, ApiResult, ErrorType};
use crate::ident::{Namespace, TableName};

/// A parameter of a statement.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    /// A text value (or NULL).
    Text(Option<&'a str>),
    /// A 64-bit integer.
    Int(i64),
}

/// A value read back from a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// NULL.
    Null,
    /// A text value.
    Text(String),
    /// An integer value.
    Int(i64),
}

impl Cell {
    fn text(&self) -> Option<&str> {
        match self {
            Cell::Text(s) => Some(s),
            _ => None,
        }
    }

    fn int(&self) -> Option<i64> {
        match self {
            Cell::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// One open transaction.
#[async_trait]
pub trait SqlTx: Send {
    /// Runs a statement and returns the number of rows it changed.
    async fn exec(&mut self, sql: &str, params: &[Param<'_>]) -> ApiResult<u64>;
    /// Runs a query and returns its rows.
    async fn query(&mut self, sql: &str, params: &[Param<'_>]) -> ApiResult<Vec<Vec<Cell>>>;
    /// Commits. An error here leaves the outcome unknown.
    async fn commit(self: Box<Self>) -> ApiResult<()>;
}

/// A database that hands out transactions.
#[async_trait]
pub trait SqlBackend: Send + Sync + std::fmt::Debug + 'static {
    /// Starts a transaction; `write` transactions take the write lock up front where the
    /// database needs that to avoid deadlocks (SQLite `BEGIN IMMEDIATE`).
    async fn begin(&self, write: bool) -> ApiResult<Box<dyn SqlTx>>;
    /// Whether an error from `exec` is a unique-key violation.
    fn dialect(&self) -> Dialect;
}

/// The few places where the two databases differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

const SCHEMA_VERSION: i64 = 1;

/// The JDBC-compatible tables plus Floe's own, created if missing.
const DDL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS iceberg_tables (
        catalog_name VARCHAR(255) NOT NULL,
        table_namespace VARCHAR(255) NOT NULL,
        table_name VARCHAR(255) NOT NULL,
        metadata_location VARCHAR(1000),
        previous_metadata_location VARCHAR(1000),
        iceberg_type VARCHAR(5),
        PRIMARY KEY (catalog_name, table_namespace, table_name))",
    "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
        catalog_name VARCHAR(255) NOT NULL,
        namespace VARCHAR(255) NOT NULL,
        property_key VARCHAR(255),
        property_value VARCHAR(1000),
        PRIMARY KEY (catalog_name, namespace, property_key))",
    "CREATE TABLE IF NOT EXISTS floe_staged_tables (
        catalog_name VARCHAR(255) NOT NULL,
        table_namespace VARCHAR(255) NOT NULL,
        table_name VARCHAR(255) NOT NULL,
        metadata TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        PRIMARY KEY (catalog_name, table_namespace, table_name))",
    "CREATE TABLE IF NOT EXISTS floe_idempotency (
        catalog_name VARCHAR(255) NOT NULL,
        idempotency_key VARCHAR(255) NOT NULL,
        request_hash VARCHAR(64) NOT NULL,
        status BIGINT NOT NULL,
        body TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        PRIMARY KEY (catalog_name, idempotency_key))",
    "CREATE TABLE IF NOT EXISTS floe_schema_version (version BIGINT NOT NULL)",
];

/// Marker property the JDBC catalog writes so an empty namespace exists.
const EXISTS_KEY: &str = "exists";

/// How long a staged table is kept if its create is never committed.
const STAGED_TTL_MS: i64 = 24 * 3600 * 1000;

/// The [`CatalogStore`] over any [`SqlBackend`].
#[derive(Debug)]
pub struct SqlStore<B> {
    backend: B,
    catalog: String,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

impl<B: SqlBackend> SqlStore<B> {
    /// Opens the store for catalog `catalog`, creating or migrating the schema.
    pub async fn open(backend: B, catalog: &str) -> ApiResult<Self> {
        let store = Self {
            backend,
            catalog: catalog.to_string(),
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> ApiResult<()> {
        let mut tx = self.backend.begin(true).await?;
        for ddl in DDL {
            tx.exec(ddl, &[]).await?;
        }
        // A JDBC catalog created with the V0 schema lacks `iceberg_type`; add it.
        let has_type = match self.backend.dialect() {
            Dialect::Sqlite => {
                tx.query(
                    "SELECT 1 FROM pragma_table_info('iceberg_tables') WHERE name = 'iceberg_type'",
                    &[],
                )
                .await?
            }
            Dialect::Postgres => {
                tx.query(
                    "SELECT 1 FROM information_schema.columns
                     WHERE table_name = 'iceberg_tables' AND column_name = 'iceberg_type'
                       AND table_schema = current_schema()",
                    &[],
                )
                .await?
            }
        };
        if has_type.is_empty() {
            tx.exec(
                "ALTER TABLE iceberg_tables ADD COLUMN iceberg_type VARCHAR(5)",
                &[],
            )
            .await?;
        }
        let version = tx
            .query("SELECT MAX(version) FROM floe_schema_version", &[])
            .await?;
        match version.first().and_then(|row| row[0].int()) {
            None => {
                tx.exec(
                    "INSERT INTO floe_schema_version (version) VALUES ($1)",
                    &[Param::Int(SCHEMA_VERSION)],
                )
                .await?;
            }
            Some(v) if v > SCHEMA_VERSION => {
                return Err(ApiError::internal(format!(
                    "the catalog database has schema version {v}, newer than this floe-catalog \
                     understands ({SCHEMA_VERSION}); upgrade floe-catalog"
                )));
            }
            Some(_) => {}
        }
        // Forget staged creates that were never committed and expired idempotency records.
        let cutoff = now_ms();
        tx.exec(
            "DELETE FROM floe_staged_tables WHERE catalog_name = $1 AND created_at_ms < $2",
            &[
                Param::Text(Some(&self.catalog)),
                Param::Int(cutoff - STAGED_TTL_MS),
            ],
        )
        .await?;
        tx.exec(
            "DELETE FROM floe_idempotency WHERE catalog_name = $1 AND expires_at_ms < $2",
            &[Param::Text(Some(&self.catalog)), Param::Int(cutoff)],
        )
        .await?;
        tx.commit().await
    }

    fn cat(&self) -> Param<'_> {
        Param::Text(Some(&self.catalog))
    }

    /// `$1, $2, $3` = catalog, namespace (stored form, kept alive by the caller), table name.
    fn table_key<'a>(&'a self, namespace: &'a str, table: &'a TableName) -> [Param<'a>; 3] {
        [
            self.cat(),
            Param::Text(Some(namespace)),
            Param::Text(Some(&table.name)),
        ]
    }

    async fn namespace_exists(&self, tx: &mut dyn SqlTx, ns: &str) -> ApiResult<bool> {
        let prefix = children_pattern(ns);
        let rows = tx
            .query(
                "SELECT 1 FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2
                 UNION ALL
                 SELECT 1 FROM iceberg_tables WHERE catalog_name = $1
                   AND (table_namespace = $2 OR table_namespace LIKE $3 ESCAPE '\\')",
                &[self.cat(), Param::Text(Some(ns)), Param::Text(Some(&prefix))],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn require_namespace(&self, tx: &mut dyn SqlTx, ns: &Namespace) -> ApiResult<()> {
        if self.namespace_exists(tx, &ns.stored()).await? {
            Ok(())
        } else {
            Err(ApiError::no_such_namespace(ns))
        }
    }

    async fn pointer(&self, tx: &mut dyn SqlTx, t: &TableName) -> ApiResult<Option<String>> {
        let rows = tx
            .query(
                "SELECT metadata_location FROM iceberg_tables
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3
                   AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
                &self.table_key(&t.namespace.stored(), t),
            )
            .await?;
        Ok(rows.first().and_then(|r| r[0].text().map(str::to_string)))
    }

    /// Stores an idempotency record; `false` if a live record with the key exists already
    /// (a concurrent request with the same key got there first).
    async fn insert_idempotency(
        &self,
        tx: &mut dyn SqlTx,
        record: &IdempotencyRecord,
    ) -> ApiResult<bool> {
        tx.exec(
            "DELETE FROM floe_idempotency
             WHERE catalog_name = $1 AND idempotency_key = $2 AND expires_at_ms < $3",
            &[
                self.cat(),
                Param::Text(Some(&record.key)),
                Param::Int(now_ms()),
            ],
        )
        .await?;
        let inserted = tx
            .exec(
                "INSERT INTO floe_idempotency
                   (catalog_name, idempotency_key, request_hash, status, body, expires_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (catalog_name, idempotency_key) DO NOTHING",
                &[
                    self.cat(),
                    Param::Text(Some(&record.key)),
                    Param::Text(Some(&record.response.request_hash)),
                    Param::Int(i64::from(record.response.status)),
                    Param::Text(Some(&record.response.body)),
                    Param::Int(record.expires_at_ms),
                ],
            )
            .await?;
        Ok(inserted == 1)
    }
}

/// A `LIKE` pattern matching every namespace nested in `ns` (stored form).
fn children_pattern(ns: &str) -> String {
    let mut pattern = String::with_capacity(ns.len() + 3);
    for c in ns.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str(".%");
    pattern
}

#[async_trait]
impl<B: SqlBackend> CatalogStore for SqlStore<B> {
    async fn list_namespaces(&self) -> ApiResult<Vec<Namespace>> {
        let mut tx = self.backend.begin(false).await?;
        let rows = tx
            .query(
                "SELECT DISTINCT namespace FROM iceberg_namespace_properties WHERE catalog_name = $1
                 UNION
                 SELECT DISTINCT table_namespace FROM iceberg_tables WHERE catalog_name = $1",
                &[self.cat()],
            )
            .await?;
        tx.commit().await?;
        let mut all = BTreeSet::new();
        for row in rows {
            // Rows written by other tools may hold names we refuse (e.g. with `/`); skip them
            // rather than failing every listing.
            if let Some(ns) = row[0].text().and_then(|s| Namespace::from_stored(s).ok()) {
                // A table in `a.b` implies `a` too, as the JDBC catalog lists it.
                for depth in 1..=ns.parts().len() {
                    if let Ok(prefix) = Namespace::from_parts(ns.parts()[..depth].to_vec()) {
                        all.insert(prefix);
                    }
                }
            }
        }
        Ok(all.into_iter().collect())
    }

    async fn create_namespace(
        &self,
        namespace: &Namespace,
        properties: &HashMap<String, String>,
    ) -> ApiResult<()> {
        let ns = namespace.stored();
        let mut tx = self.backend.begin(true).await?;
        if self.namespace_exists(tx.as_mut(), &ns).await? {
            return Err(ApiError::new(
                ErrorType::AlreadyExists,
                format!("namespace {namespace} already exists"),
            ));
        }
        let marker = [(EXISTS_KEY, "true")];
        let user = properties
            .iter()
            .filter(|(k, _)| *k != EXISTS_KEY)
            .map(|(k, v)| (k.as_str(), v.as_str()));
        for (key, value) in user.chain(marker) {
            tx.exec(
                "INSERT INTO iceberg_namespace_properties
                   (catalog_name, namespace, property_key, property_value)
                 VALUES ($1, $2, $3, $4)",
                &[
                    self.cat(),
                    Param::Text(Some(&ns)),
                    Param::Text(Some(key)),
                    Param::Text(Some(value)),
                ],
            )
            .await?;
        }
        tx.commit().await
    }

    async fn namespace_properties(
        &self,
        namespace: &Namespace,
    ) -> ApiResult<Option<HashMap<String, String>>> {
        let ns = namespace.stored();
        let mut tx = self.backend.begin(false).await?;
        if !self.namespace_exists(tx.as_mut(), &ns).await? {
            return Ok(None);
        }
        let rows = tx
            .query(
                "SELECT property_key, property_value FROM iceberg_namespace_properties
                 WHERE catalog_name = $1 AND namespace = $2",
                &[self.cat(), Param::Text(Some(&ns))],
            )
            .await?;
        tx.commit().await?;
        Ok(Some(
            rows.into_iter()
                .filter_map(|r| {
                    Some((
                        r[0].text()?.to_string(),
                        r[1].text().unwrap_or("").to_string(),
                    ))
                })
                .filter(|(k, _)| k != EXISTS_KEY)
                .collect(),
        ))
    }

    async fn update_namespace_properties(
        &self,
        namespace: &Namespace,
        removals: &[String],
        updates: &HashMap<String, String>,
    ) -> ApiResult<()> {
        let ns = namespace.stored();
        let mut tx = self.backend.begin(true).await?;
        self.require_namespace(tx.as_mut(), namespace).await?;
        for key in removals.iter().filter(|k| *k != EXISTS_KEY) {
            tx.exec(
                "DELETE FROM iceberg_namespace_properties
                 WHERE catalog_name = $1 AND namespace = $2 AND property_key = $3",
                &[self.cat(), Param::Text(Some(&ns)), Param::Text(Some(key))],
            )
            .await?;
        }
        for (key, value) in updates.iter().filter(|(k, _)| *k != EXISTS_KEY) {
            tx.exec(
                "INSERT INTO iceberg_namespace_properties
                   (catalog_name, namespace, property_key, property_value)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (catalog_name, namespace, property_key)
                 DO UPDATE SET property_value = excluded.property_value",
                &[
                    self.cat(),
                    Param::Text(Some(&ns)),
                    Param::Text(Some(key)),
                    Param::Text(Some(value)),
                ],
            )
            .await?;
        }
        // An update that removed every property must not make the namespace disappear.
        tx.exec(
            "INSERT INTO iceberg_namespace_properties
               (catalog_name, namespace, property_key, property_value)
             VALUES ($1, $2, $3, 'true')
             ON CONFLICT (catalog_name, namespace, property_key) DO NOTHING",
            &[
                self.cat(),
                Param::Text(Some(&ns)),
                Param::Text(Some(EXISTS_KEY)),
            ],
        )
        .await?;
        tx.commit().await
    }

    async fn drop_namespace(&self, namespace: &Namespace) -> ApiResult<()> {
        let ns = namespace.stored();
        let mut tx = self.backend.begin(true).await?;
        self.require_namespace(tx.as_mut(), namespace).await?;
        let prefix = children_pattern(&ns);
        let children = tx
            .query(
                "SELECT 1 FROM iceberg_tables WHERE catalog_name = $1
                   AND (table_namespace = $2 OR table_namespace LIKE $3 ESCAPE '\\')
                 UNION ALL
                 SELECT 1 FROM iceberg_namespace_properties WHERE catalog_name = $1
                   AND namespace LIKE $3 ESCAPE '\\'",
                &[
                    self.cat(),
                    Param::Text(Some(&ns)),
                    Param::Text(Some(&prefix)),
                ],
            )
            .await?;
        if !children.is_empty() {
            return Err(ApiError::new(
                ErrorType::NamespaceNotEmpty,
                format!("namespace {namespace} is not empty"),
            ));
        }
        tx.exec(
            "DELETE FROM iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2",
            &[self.cat(), Param::Text(Some(&ns))],
        )
        .await?;
        tx.commit().await
    }

    async fn list_tables(&self, namespace: &Namespace) -> ApiResult<Vec<String>> {
        let mut tx = self.backend.begin(false).await?;
        self.require_namespace(tx.as_mut(), namespace).await?;
        let rows = tx
            .query(
                "SELECT table_name FROM iceberg_tables
                 WHERE catalog_name = $1 AND table_namespace = $2
                   AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)
                 ORDER BY table_name",
                &[self.cat(), Param::Text(Some(&namespace.stored()))],
            )
            .await?;
        tx.commit().await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| r[0].text().map(str::to_string))
            .collect())
    }

    async fn table_pointer(&self, table: &TableName) -> ApiResult<Option<String>> {
        let mut tx = self.backend.begin(false).await?;
        let pointer = self.pointer(tx.as_mut(), table).await?;
        tx.commit().await?;
        Ok(pointer)
    }

    async fn swap_pointers(
        &self,
        swaps: &[PointerSwap],
        remember: Option<&IdempotencyRecord>,
    ) -> ApiResult<SwapOutcome> {
        let mut tx = self.backend.begin(true).await?;
        for swap in swaps {
            let ns = swap.table.namespace.stored();
            let changed = match &swap.expected {
                Some(expected) => {
                    tx.exec(
                        "UPDATE iceberg_tables
                         SET metadata_location = $1, previous_metadata_location = $2
                         WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5
                           AND metadata_location = $2
                           AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
                        &[
                            Param::Text(Some(&swap.new)),
                            Param::Text(Some(expected)),
                            self.cat(),
                            Param::Text(Some(&ns)),
                            Param::Text(Some(&swap.table.name)),
                        ],
                    )
                    .await?
                }
                None => {
                    self.require_namespace(tx.as_mut(), &swap.table.namespace)
                        .await?;
                    let changed = tx
                        .exec(
                            "INSERT INTO iceberg_tables
                               (catalog_name, table_namespace, table_name, metadata_location,
                                previous_metadata_location, iceberg_type)
                             VALUES ($1, $2, $3, $4, NULL, 'TABLE')
                             ON CONFLICT (catalog_name, table_namespace, table_name) DO NOTHING",
                            &[
                                self.cat(),
                                Param::Text(Some(&ns)),
                                Param::Text(Some(&swap.table.name)),
                                Param::Text(Some(&swap.new)),
                            ],
                        )
                        .await?;
                    tx.exec(
                        "DELETE FROM floe_staged_tables
                         WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
                        &self.table_key(&ns, &swap.table),
                    )
                    .await?;
                    changed
                }
            };
            if changed != 1 {
                // Dropping `tx` rolls back every swap made so far.
                return Ok(SwapOutcome::Lost {
                    table: swap.table.clone(),
                });
            }
        }
        if let Some(record) = remember
            && !self.insert_idempotency(tx.as_mut(), record).await?
        {
            return Err(ApiError::commit_failed(
                "a request with the same Idempotency-Key was committed concurrently",
            ));
        }
        match tx.commit().await {
            Ok(()) => Ok(SwapOutcome::Committed),
            Err(e) => Err(ApiError::new(
                ErrorType::CommitStateUnknown,
                format!("the catalog database failed while committing: {e}"),
            )),
        }
    }

    async fn drop_table(&self, table: &TableName) -> ApiResult<String> {
        let mut tx = self.backend.begin(true).await?;
        let Some(location) = self.pointer(tx.as_mut(), table).await? else {
            return Err(ApiError::no_such_table(table));
        };
        tx.exec(
            "DELETE FROM iceberg_tables
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
            &self.table_key(&table.namespace.stored(), table),
        )
        .await?;
        tx.commit().await?;
        Ok(location)
    }

    async fn rename_table(&self, from: &TableName, to: &TableName) -> ApiResult<()> {
        let mut tx = self.backend.begin(true).await?;
        if self.pointer(tx.as_mut(), from).await?.is_none() {
            return Err(ApiError::no_such_table(from));
        }
        self.require_namespace(tx.as_mut(), &to.namespace).await?;
        let to_ns = to.namespace.stored();
        let taken = tx
            .query(
                "SELECT 1 FROM iceberg_tables
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
                &self.table_key(&to_ns, to),
            )
            .await?;
        if !taken.is_empty() {
            return Err(ApiError::new(
                ErrorType::AlreadyExists,
                format!("table {to} already exists"),
            ));
        }
        tx.exec(
            "UPDATE iceberg_tables SET table_namespace = $1, table_name = $2
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5",
            &[
                Param::Text(Some(&to_ns)),
                Param::Text(Some(&to.name)),
                self.cat(),
                Param::Text(Some(&from.namespace.stored())),
                Param::Text(Some(&from.name)),
            ],
        )
        .await?;
        tx.commit().await
    }

    async fn put_staged(&self, table: &TableName, metadata_json: &str) -> ApiResult<()> {
        let mut tx = self.backend.begin(true).await?;
        self.require_namespace(tx.as_mut(), &table.namespace)
            .await?;
        tx.exec(
            "INSERT INTO floe_staged_tables
               (catalog_name, table_namespace, table_name, metadata, created_at_ms)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (catalog_name, table_namespace, table_name)
             DO UPDATE SET metadata = excluded.metadata, created_at_ms = excluded.created_at_ms",
            &[
                self.cat(),
                Param::Text(Some(&table.namespace.stored())),
                Param::Text(Some(&table.name)),
                Param::Text(Some(metadata_json)),
                Param::Int(now_ms()),
            ],
        )
        .await?;
        tx.commit().await
    }

    async fn staged(&self, table: &TableName) -> ApiResult<Option<String>> {
        let mut tx = self.backend.begin(false).await?;
        let rows = tx
            .query(
                "SELECT metadata FROM floe_staged_tables
                 WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
                &self.table_key(&table.namespace.stored(), table),
            )
            .await?;
        tx.commit().await?;
        Ok(rows.first().and_then(|r| r[0].text().map(str::to_string)))
    }

    async fn remembered(&self, key: &str, now_ms: i64) -> ApiResult<Option<StoredResponse>> {
        let mut tx = self.backend.begin(false).await?;
        let rows = tx
            .query(
                "SELECT request_hash, status, body FROM floe_idempotency
                 WHERE catalog_name = $1 AND idempotency_key = $2 AND expires_at_ms >= $3",
                &[self.cat(), Param::Text(Some(key)), Param::Int(now_ms)],
            )
            .await?;
        tx.commit().await?;
        Ok(rows.first().map(|r| StoredResponse {
            request_hash: r[0].text().unwrap_or_default().to_string(),
            status: r[1]
                .int()
                .and_then(|s| u16::try_from(s).ok())
                .unwrap_or(500),
            body: r[2].text().unwrap_or_default().to_string(),
        }))
    }

    async fn remember(&self, record: &IdempotencyRecord) -> ApiResult<()> {
        let mut tx = self.backend.begin(true).await?;
        // A concurrent request with the same key may have stored its outcome first; that one
        // stands.
        self.insert_idempotency(tx.as_mut(), record).await?;
        tx.commit().await
    }

    async fn ping(&self) -> ApiResult<()> {
        let mut tx = self.backend.begin(false).await?;
        tx.query("SELECT 1", &[]).await?;
        tx.commit().await
    }
}
