//! The Postgres change source: tables of a publication, copied once from a snapshot exported
//! by the replication slot, then followed through pgoutput.
//!
//! * **Setup.** The publication is created if missing (for the listed tables, or all tables);
//!   each published table is read from the catalog — columns (generated ones are not
//!   replicated), the key (the primary key, or the replica-identity index), the replica
//!   identity — and refused with a clear error if it has no key, a column of an unsupported
//!   type, or TOAST-able columns under a replica identity that cannot supply unchanged values
//!   (`REPLICA IDENTITY FULL` is needed; `replica_identity_full = true` lets Floe set it).
//! * **First start** (nothing committed): a slot left by an earlier attempt that never
//!   committed is dropped; `CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')` on a replication
//!   session that then stays idle; `parallelism` ordinary sessions import that snapshot and
//!   `COPY` the tables; the copy's position is the slot's consistent point, so streaming from
//!   the slot carries exactly the transactions the copy did not see.
//! * **Streaming** starts on the same slot (after a restart: at the committed LSN; the slot
//!   never goes back past what was acknowledged). A transaction's changes are skipped for a
//!   table whose commit already holds it (its commit LSN is below the table's committed end
//!   LSN), so a restart never applies a change twice.
//! * **Acknowledgement.** The slot's flush position moves only in [`acknowledge`], called
//!   after the Iceberg commit; when idle with nothing uncommitted, keepalive positions are
//!   acknowledged so the slot does not hold WAL for unrelated traffic.
//!
//! [`acknowledge`]: floe_core::ChangeSource::acknowledge

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use bytes::Bytes;
use floe_core::{ChangeSource, ChangeStart, ChangeTable, Positions, SourceError, TableChanges};
use iceberg::spec::{NestedField, Schema};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use tokio::sync::mpsc;
use tokio_postgres::NoTls;

use crate::changes::{Change, ChangeBuffer, Column, Layout};
use crate::copy::CopyTable;
use crate::pgoutput::{self, Message, OldTuple};
use crate::types::{self, PgType, TypeInfo};

/// Reconnection attempts after the replication session breaks.
const RECONNECT_ATTEMPTS: u32 = 8;

/// Position keys in commit markers.
pub const LSN: &str = "pg.lsn";
/// The cluster's system identifier.
pub const SYSTEM: &str = "pg.system-id";
/// The timeline.
pub const TIMELINE: &str = "pg.timeline";
/// The slot.
pub const SLOT: &str = "pg.slot";

/// TLS to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS without verifying the certificate.
    Require,
    /// TLS, the certificate verified against `root_cert` (or the system roots).
    VerifyCa,
    /// As `VerifyCa`, and the host name checked.
    VerifyFull,
}

/// `[source.postgres]`.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Host name, or a Unix socket directory.
    pub host: String,
    /// Port.
    pub port: u16,
    /// User (needs the REPLICATION attribute).
    pub user: String,
    /// Password.
    pub password: String,
    /// Database.
    pub database: String,
    /// TLS.
    pub ssl_mode: SslMode,
    /// CA certificate file for `VerifyCa` / `VerifyFull`.
    pub ssl_root_cert: Option<std::path::PathBuf>,
    /// Publication (created if missing).
    pub publication: String,
    /// Replication slot (created if missing).
    pub slot: String,
    /// Tables (`schema.table`) of a publication to create; empty = all tables.
    pub tables: Vec<String>,
    /// Sessions copying tables in parallel during the initial snapshot.
    pub snapshot_parallelism: usize,
    /// Set `REPLICA IDENTITY FULL` on tables that need it instead of refusing them.
    pub replica_identity_full: bool,
    /// Warn when the slot retains more WAL than this (bytes).
    pub warn_retained_wal: u64,
    /// Iceberg table name of a source table (`schema.table` → name); default: the table name
    /// (`schema_table` outside `public`).
    pub table_names: HashMap<String, String>,
}

impl PostgresConfig {
    fn tokio_config(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::new();
        c.host(&self.host)
            .port(self.port)
            .user(&self.user)
            .password(&self.password)
            .dbname(&self.database)
            .application_name("floe")
            .options(types::SESSION_OPTIONS);
        c
    }

    fn replication_config(&self) -> ReplicationConfig {
        let tls = match self.ssl_mode {
            SslMode::Disable => TlsConfig::disabled(),
            SslMode::Require => TlsConfig::require(),
            SslMode::VerifyCa => TlsConfig::verify_ca(self.ssl_root_cert.clone()),
            SslMode::VerifyFull => TlsConfig::verify_full(self.ssl_root_cert.clone()),
        };
        ReplicationConfig::new(
            self.host.clone(),
            self.user.clone(),
            self.password.clone(),
            self.database.clone(),
            self.slot.clone(),
            self.publication.clone(),
        )
        .with_port(self.port)
        .with_tls(tls)
        .with_options(types::SESSION_OPTIONS)
        .with_application_name("floe")
        .with_status_interval(Duration::from_secs(1))
    }
}

fn err(context: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError(format!("postgres: {context}: {e}"))
}

/// One followed table.
#[derive(Debug, Clone)]
struct PgTable {
    schema: String,
    name: String,
    iceberg_name: String,
    layout: Layout,
    /// The select list of the initial binary `COPY` (see [`types::copy_expression`]).
    copy_columns: Vec<String>,
    /// Every column the Iceberg table has: `layout` plus columns dropped at the source since
    /// the job started (kept, NULL from then on). `None` while equal to `layout`.
    layout_union: Option<Layout>,
    /// The Iceberg schema (ids assigned here; the catalog renumbers them).
    iceberg: Schema,
    /// Transactions with a commit LSN below this are in the table's last commit.
    committed_end: u64,
}

impl PgTable {
    fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    fn quoted(&self) -> String {
        format!("{}.{}", quote(&self.schema), quote(&self.name))
    }
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

pub(crate) fn iceberg_schema(layout: &[Column]) -> Result<Schema, String> {
    let mut next = layout.len() as i32 + 1;
    let mut fields = Vec::new();
    let mut identifier = Vec::new();
    for (i, c) in layout.iter().enumerate() {
        let id = i as i32 + 1;
        let element = next;
        if c.ty.array {
            next += 1;
        }
        let ty = c.ty.iceberg(element);
        fields.push(Arc::new(if c.key {
            identifier.push(id);
            NestedField::required(id, &c.name, ty)
        } else {
            NestedField::optional(id, &c.name, ty)
        }));
    }
    Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(identifier)
        .build()
        .map_err(|e| e.to_string())
}

/// The Postgres [`ChangeSource`].
pub struct PostgresSource {
    config: PostgresConfig,
    catalog: tokio_postgres::Client,
    tables: Vec<PgTable>,
    by_oid: HashMap<u32, usize>,
    replication: Option<ReplicationClient>,
    /// START_REPLICATION was accepted.
    streaming: bool,
    system_id: String,
    timeline: u32,
    snapshot: Option<mpsc::Receiver<Result<(usize, RecordBatch), SourceError>>>,
    buffer: ChangeBuffer,
    /// End LSN of the last transaction read whole.
    position: u64,
    /// Changes taken but not yet acknowledged.
    uncommitted: bool,
    /// The LSN last acknowledged (committed in Iceberg), or the start position.
    acknowledged: u64,
    /// Current transaction's commit LSN, while inside one.
    in_transaction: Option<u64>,
}

impl std::fmt::Debug for PostgresSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSource")
            .field("slot", &self.config.slot)
            .field("tables", &self.tables.len())
            .finish_non_exhaustive()
    }
}

async fn connect(config: &PostgresConfig) -> Result<tokio_postgres::Client, SourceError> {
    // The causes say what went wrong (a TLS handshake error names the certificate problem).
    let failed = |e: tokio_postgres::Error| {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        err(
            &format!("cannot connect to {}:{}", config.host, config.port),
            message,
        )
    };
    let tls = crate::tls::connector(&config.ssl_mode, config.ssl_root_cert.as_deref())
        .map_err(|e| SourceError(format!("postgres: TLS: {e}")))?;
    let mut settings = config.tokio_config();
    let client = match tls {
        None => {
            let (client, connection) = settings.connect(NoTls).await.map_err(failed)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            client
        }
        Some(tls) => {
            settings.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, connection) = settings.connect(tls).await.map_err(failed)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            client
        }
    };
    Ok(client)
}

impl PostgresSource {
    /// Connects, makes sure the publication exists, and reads the published tables.
    pub async fn connect(config: PostgresConfig) -> Result<Self, SourceError> {
        let catalog = connect(&config).await?;
        let mut source = Self {
            config,
            catalog,
            tables: Vec::new(),
            by_oid: HashMap::new(),
            replication: None,
            streaming: false,
            system_id: String::new(),
            timeline: 0,
            snapshot: None,
            buffer: ChangeBuffer::default(),
            position: 0,
            uncommitted: false,
            acknowledged: 0,
            in_transaction: None,
        };
        source.ensure_publication().await?;
        source.read_tables().await?;
        Ok(source)
    }

    async fn ensure_publication(&self) -> Result<(), SourceError> {
        let exists = self
            .catalog
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1",
                &[&self.config.publication],
            )
            .await
            .map_err(|e| err("reading pg_publication", e))?
            .is_some();
        if exists {
            return Ok(());
        }
        let what = if self.config.tables.is_empty() {
            "ALL TABLES".to_string()
        } else {
            let tables: Vec<String> = self
                .config
                .tables
                .iter()
                .map(|t| match t.split_once('.') {
                    Some((s, n)) => format!("{}.{}", quote(s), quote(n)),
                    None => quote(t),
                })
                .collect();
            format!("TABLE {}", tables.join(", "))
        };
        let sql = format!(
            "CREATE PUBLICATION {} FOR {what}",
            quote(&self.config.publication)
        );
        tracing::info!(%sql, "creating the publication");
        self.catalog
            .batch_execute(&sql)
            .await
            .map_err(|e| err("creating the publication", e))
    }

    async fn read_tables(&mut self) -> Result<(), SourceError> {
        let rows = self
            .catalog
            .query(
                "SELECT c.oid, n.nspname::text, c.relname::text, c.relreplident::text \
                 FROM pg_publication_tables p \
                 JOIN pg_namespace n ON n.nspname = p.schemaname \
                 JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename \
                 WHERE p.pubname = $1 ORDER BY 2, 3",
                &[&self.config.publication],
            )
            .await
            .map_err(|e| err("reading the publication's tables", e))?;
        if rows.is_empty() {
            return Err(SourceError(format!(
                "postgres: publication {} has no tables",
                self.config.publication
            )));
        }
        let mut problems = Vec::new();
        for row in rows {
            let oid: u32 = row.get(0);
            let schema: String = row.get(1);
            let name: String = row.get(2);
            let identity: String = row.get(3);
            match self.read_table(oid, &schema, &name, &identity).await {
                Ok(table) => {
                    self.by_oid.insert(oid, self.tables.len());
                    self.tables.push(table);
                }
                Err(problem) => problems.push(problem),
            }
        }
        if !problems.is_empty() {
            return Err(SourceError(problems.join("\n")));
        }
        Ok(())
    }

    async fn read_table(
        &self,
        oid: u32,
        schema: &str,
        name: &str,
        identity: &str,
    ) -> Result<PgTable, String> {
        let qualified = format!("{schema}.{name}");
        let db = |e: tokio_postgres::Error| format!("postgres: reading table {qualified}: {e}");
        // The key: the replica-identity index under `USING INDEX`, else the primary key.
        let key_rows = self
            .catalog
            .query(
                "SELECT a.attname::text FROM pg_index i \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                 WHERE i.indrelid = $1 AND CASE WHEN $2 = 'i' THEN i.indisreplident \
                 ELSE i.indisprimary END",
                &[&oid, &identity],
            )
            .await
            .map_err(db)?;
        let keys: Vec<String> = key_rows.iter().map(|r| r.get(0)).collect();
        if keys.is_empty() {
            return Err(format!(
                "table {qualified} has no primary key: Floe keeps a table equal to its source \
                 by key; add a primary key (or a unique index used as REPLICA IDENTITY)"
            ));
        }
        if identity == "n" {
            return Err(format!(
                "table {qualified} has REPLICA IDENTITY NOTHING: its updates and deletes \
                 carry no key; set REPLICA IDENTITY DEFAULT or FULL"
            ));
        }
        let columns = self
            .catalog
            .query(
                "SELECT a.attname::text, \
                   (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END)::int4, \
                   a.attstorage::text, \
                   (e.oid IS NOT NULL), \
                   COALESCE(e.typname, b.typname)::text, \
                   COALESCE(e.typtype, b.typtype)::text \
                 FROM pg_attribute a \
                 JOIN pg_type t ON t.oid = a.atttypid \
                 JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype \
                   ELSE a.atttypid END \
                 LEFT JOIN pg_type e ON b.typcategory = 'A' AND b.typelem <> 0 AND e.oid = b.typelem \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                   AND a.attgenerated = '' \
                 ORDER BY a.attnum",
                &[&oid],
            )
            .await
            .map_err(db)?;
        let mut layout = Vec::new();
        let mut copy_columns = Vec::new();
        let mut problems = Vec::new();
        let mut toastable = Vec::new();
        for row in &columns {
            let column: String = row.get(0);
            let modifier: i32 = row.get(1);
            let storage: String = row.get(2);
            let array: bool = row.get(3);
            let type_name: String = row.get(4);
            let kind: String = row.get(5);
            match types::map_type(&TypeInfo {
                name: &type_name,
                kind: kind.bytes().next().unwrap_or(b'b'),
                array,
                modifier,
            }) {
                Ok(ty) => {
                    if storage == "x" || storage == "e" {
                        toastable.push(column.clone());
                    }
                    copy_columns.push(types::copy_expression(&quote(&column), ty, &type_name));
                    layout.push(Column {
                        key: keys.contains(&column),
                        name: column,
                        ty,
                    })
                }
                Err(e) => problems.push(format!("table {qualified}, column {column}: {e}")),
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        // Postgres gives a table a TOAST relation only if its rows can outgrow a page's
        // quarter (`needs_toast_table`); without one, no value is ever stored out of line.
        let has_toast: bool = self
            .catalog
            .query_one(
                "SELECT reltoastrelid <> 0 FROM pg_class WHERE oid = $1",
                &[&oid],
            )
            .await
            .map_err(db)?
            .get(0);
        if identity != "f" && has_toast && !toastable.is_empty() {
            if self.config.replica_identity_full {
                let sql = format!(
                    "ALTER TABLE {}.{} REPLICA IDENTITY FULL",
                    quote(schema),
                    quote(name)
                );
                tracing::info!(%sql, "setting the replica identity");
                self.catalog.batch_execute(&sql).await.map_err(db)?;
            } else {
                return Err(format!(
                    "table {qualified}: columns {} can be TOASTed, and under REPLICA IDENTITY \
                     {} an update that leaves them unchanged does not carry their value; run \
                     ALTER TABLE {qualified} REPLICA IDENTITY FULL (or set \
                     replica_identity_full = true in [source.postgres])",
                    toastable.join(", "),
                    if identity == "i" {
                        "USING INDEX"
                    } else {
                        "DEFAULT"
                    }
                ));
            }
        }
        let iceberg = iceberg_schema(&layout).map_err(|e| format!("table {qualified}: {e}"))?;
        let iceberg_name = self
            .config
            .table_names
            .get(&qualified)
            .cloned()
            .unwrap_or_else(|| {
                if schema == "public" {
                    name.to_string()
                } else {
                    format!("{schema}_{name}")
                }
            });
        Ok(PgTable {
            schema: schema.to_string(),
            name: name.to_string(),
            iceberg_name,
            layout: Arc::new(layout),
            copy_columns,
            layout_union: None,
            iceberg,
            committed_end: 0,
        })
    }

    /// The slot's restart LSN, confirmed flush LSN and retained WAL bytes, if the slot exists.
    pub async fn slot_state(&self) -> Result<Option<SlotState>, SourceError> {
        let row = self
            .catalog
            .query_opt(
                "SELECT restart_lsn::text, confirmed_flush_lsn::text, \
                   COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::int8, \
                   COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::int8, \
                   active \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.config.slot],
            )
            .await
            .map_err(|e| err("reading pg_replication_slots", e))?;
        Ok(row.map(|r| SlotState {
            retained_wal_bytes: r.get(2),
            lag_bytes: r.get(3),
            active: r.get(4),
        }))
    }

    async fn start_snapshot(&mut self) -> Result<(), SourceError> {
        if self.slot_state().await?.is_some() {
            tracing::warn!(
                slot = %self.config.slot,
                "dropping a replication slot no commit of this job used (an earlier first \
                 start did not finish its snapshot)"
            );
            self.catalog
                .execute("SELECT pg_drop_replication_slot($1)", &[&self.config.slot])
                .await
                .map_err(|e| err("dropping the unused slot", e))?;
        }
        let mut replication = ReplicationClient::connect_gated(self.config.replication_config())
            .await
            .map_err(|e| err("replication session", e))?;
        let system = replication
            .identify_system()
            .await
            .map_err(|e| err("IDENTIFY_SYSTEM", e))?;
        let rows = replication
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')",
                quote(&self.config.slot)
            ))
            .await
            .map_err(|e| err("creating the replication slot", e))?;
        let row = rows.first().ok_or_else(|| {
            SourceError("postgres: CREATE_REPLICATION_SLOT returned no row".into())
        })?;
        let text = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_ref())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .ok_or_else(|| SourceError(format!("postgres: slot creation: no column {i}")))
        };
        let consistent = Lsn::parse(&text(1)?).map_err(|e| err("consistent point", e))?;
        let snapshot_name = text(2)?;
        tracing::info!(slot = %self.config.slot, consistent_point = %consistent, "replication slot created");
        self.system_id = system.system_id;
        self.timeline = system.timeline;
        self.position = consistent.as_u64();

        // Every copy session imports the snapshot before the first COPY starts.
        let parallelism = self
            .config
            .snapshot_parallelism
            .clamp(1, self.tables.len().max(1));
        let mut sessions = Vec::new();
        for _ in 0..parallelism {
            let client = connect(&self.config).await?;
            client
                .batch_execute(&format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_name}'"
                ))
                .await
                .map_err(|e| err("importing the slot's snapshot", e))?;
            sessions.push(client);
        }
        let queue = Arc::new(std::sync::Mutex::new(
            (0..self.tables.len()).collect::<std::collections::VecDeque<_>>(),
        ));
        let (tx, rx) = mpsc::channel(4);
        for client in sessions {
            let queue = queue.clone();
            let tx = tx.clone();
            let tables = self.tables.clone();
            tokio::spawn(async move {
                loop {
                    let next = queue.lock().expect("queue lock").pop_front();
                    let Some(index) = next else { break };
                    let table = &tables[index];
                    let copy = CopyTable {
                        index,
                        name: table.qualified(),
                        from: table.quoted(),
                        select: &table.copy_columns,
                        layout: &table.layout,
                    };
                    if let Err(e) = copy.run(&client, &tx).await {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                let _ = client.batch_execute("COMMIT").await;
            });
        }
        self.snapshot = Some(rx);
        self.replication = Some(replication);
        Ok(())
    }

    async fn start_streaming(&mut self, committed_lsn: u64) -> Result<(), SourceError> {
        let state = self.slot_state().await?;
        if state.is_none() {
            return Err(SourceError(format!(
                "postgres: replication slot {} is gone, so changes after LSN {} are lost to \
                 this job; drop the job's tables (or its commits) to start over with a new \
                 snapshot",
                self.config.slot,
                Lsn::from_u64(committed_lsn)
            )));
        }
        let mut replication = ReplicationClient::connect_gated(
            self.config
                .replication_config()
                .with_start_lsn(Lsn::from_u64(committed_lsn)),
        )
        .await
        .map_err(|e| err("replication session", e))?;
        let system = replication
            .identify_system()
            .await
            .map_err(|e| err("IDENTIFY_SYSTEM", e))?;
        if !self.system_id.is_empty() && self.system_id != system.system_id {
            return Err(SourceError(format!(
                "postgres: the server is cluster {}, but the job's commits came from cluster \
                 {}; refusing to mix them",
                system.system_id, self.system_id
            )));
        }
        self.system_id = system.system_id;
        self.timeline = system.timeline;
        self.replication = Some(replication);
        self.position = committed_lsn;
        self.acknowledged = committed_lsn;
        Ok(())
    }

    async fn ensure_started(&mut self) -> Result<(), SourceError> {
        if let Some(replication) = &mut self.replication
            && self.snapshot.is_none()
            && !self.streaming
        {
            replication
                .start()
                .await
                .map_err(|e| err("START_REPLICATION", e))?;
            replication
                .wait_started()
                .await
                .map_err(|e| err("START_REPLICATION", e))?;
            self.streaming = true;
        }
        Ok(())
    }

    /// The replication session broke: everything after the last acknowledged LSN is read
    /// again on a new session (the slot resends it), so the buffer starts over. Retried with
    /// backoff; gives up after [`RECONNECT_ATTEMPTS`].
    async fn reconnect(&mut self, why: String) -> Result<(), SourceError> {
        let mut pause = Duration::from_millis(500);
        for attempt in 1..=RECONNECT_ATTEMPTS {
            tracing::warn!(
                slot = %self.config.slot,
                error = %why,
                attempt,
                pause_ms = pause.as_millis() as u64,
                "replication session lost; reconnecting from the last acknowledged LSN"
            );
            if let Some(mut old) = self.replication.take() {
                old.abort();
            }
            self.streaming = false;
            self.buffer = ChangeBuffer::default();
            self.in_transaction = None;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
            // A restarted server closed the catalog session too.
            if self.catalog.is_closed() {
                match connect(&self.config).await {
                    Ok(catalog) => self.catalog = catalog,
                    Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, "reconnecting the catalog session failed");
                        continue;
                    }
                }
            }
            match self.start_streaming(self.acknowledged).await {
                Ok(()) => match self.ensure_started().await {
                    Ok(()) => return Ok(()),
                    Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                    Err(e) => tracing::warn!(error = %e, "START_REPLICATION failed"),
                },
                Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                Err(e) => tracing::warn!(error = %e, "reconnecting failed"),
            }
        }
        Err(SourceError(format!(
            "postgres: the replication session could not be restored: {why}"
        )))
    }

    fn positions(&self) -> Positions {
        Positions::from([
            (LSN.to_string(), Lsn::from_u64(self.position).to_string()),
            (SYSTEM.to_string(), self.system_id.clone()),
            (TIMELINE.to_string(), self.timeline.to_string()),
            (SLOT.to_string(), self.config.slot.clone()),
        ])
    }

    async fn on_message(&mut self, data: Bytes) -> Result<(), SourceError> {
        let commit_lsn = self.in_transaction.unwrap_or(0);
        match pgoutput::decode(data).map_err(|e| err("decoding", e))? {
            Message::Relation(relation) => self.on_relation(relation).await?,
            Message::Insert { relation, new } => {
                self.apply(relation, commit_lsn, Change::Insert(new))?
            }
            Message::Update { relation, old, new } => {
                let old_full = matches!(old, Some(OldTuple::Full(_)));
                let old = old.map(|o| match o {
                    OldTuple::Key(t) | OldTuple::Full(t) => t,
                });
                self.apply(relation, commit_lsn, Change::Update { old, old_full, new })?
            }
            Message::Delete { relation, old } => {
                let old = match old {
                    OldTuple::Key(t) | OldTuple::Full(t) => t,
                };
                self.apply(relation, commit_lsn, Change::Delete(old))?
            }
            Message::Truncate { relations, .. } => {
                for oid in relations {
                    if let Some(&index) = self.by_oid.get(&oid)
                        && commit_lsn >= self.tables[index].committed_end
                    {
                        self.buffer.truncate(index);
                    }
                }
            }
            Message::Type { .. }
            | Message::Origin { .. }
            | Message::Message { .. }
            | Message::Transaction => {}
        }
        Ok(())
    }

    fn apply(&mut self, oid: u32, commit_lsn: u64, change: Change) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(());
        };
        let table = &self.tables[index];
        if commit_lsn < table.committed_end {
            return Ok(());
        }
        let layout = table.layout.clone();
        self.buffer.apply(index, &layout, change).map_err(|e| {
            SourceError(format!(
                "postgres: table {} at LSN {}: {e}",
                table.qualified(),
                Lsn::from_u64(commit_lsn)
            ))
        })
    }

    /// A Relation message: the table's columns from here on. Added columns are followed;
    /// a changed type or key stops the job.
    async fn on_relation(&mut self, relation: pgoutput::Relation) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&relation.id) else {
            return Ok(());
        };
        let current = self.tables[index].layout.clone();
        let qualified = self.tables[index].qualified();
        let mut layout = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let known = current.iter().find(|c| c.name == column.name);
            let ty = match known {
                Some(c) => {
                    let now = self.type_of(column.type_oid, column.type_modifier).await?;
                    if now != c.ty {
                        return Err(SourceError(format!(
                            "postgres: column {} of {qualified} changed type ({:?} → {:?}); \
                             Floe cannot follow that change without rewriting the table — \
                             nothing after it was committed",
                            column.name, c.ty, now
                        )));
                    }
                    c.ty
                }
                None => self.type_of(column.type_oid, column.type_modifier).await?,
            };
            layout.push(Column {
                name: column.name.clone(),
                ty,
                key: known.is_some_and(|c| c.key),
            });
        }
        let keys = |l: &[Column]| -> Vec<String> {
            l.iter().filter(|c| c.key).map(|c| c.name.clone()).collect()
        };
        if keys(&layout) != keys(&current) {
            return Err(SourceError(format!(
                "postgres: the key of {qualified} lost a column; Floe cannot follow that change"
            )));
        }
        if *layout != *current {
            let added: Vec<&str> = layout
                .iter()
                .filter(|c| !current.iter().any(|o| o.name == c.name))
                .map(|c| c.name.as_str())
                .collect();
            tracing::info!(table = %qualified, ?added, "the table's columns changed");
            // Columns dropped at the source stay in Iceberg (NULL from now on).
            let mut union = layout.clone();
            for old in current.iter() {
                if !union.iter().any(|c| c.name == old.name) {
                    union.push(old.clone());
                }
            }
            let table = &mut self.tables[index];
            table.iceberg = iceberg_schema(&union).map_err(|e| err("schema", e))?;
            table.layout = Arc::new(layout);
            table.layout_union = Some(Arc::new(union));
        }
        Ok(())
    }

    async fn type_of(&self, oid: u32, modifier: i32) -> Result<PgType, SourceError> {
        let row = self
            .catalog
            .query_one(
                "SELECT (e.oid IS NOT NULL), COALESCE(e.typname, b.typname)::text, \
                   COALESCE(e.typtype, b.typtype)::text, \
                   (CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE $2 END)::int4 \
                 FROM pg_type t \
                 JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END \
                 LEFT JOIN pg_type e ON b.typcategory = 'A' AND b.typelem <> 0 AND e.oid = b.typelem \
                 WHERE t.oid = $1",
                &[&oid, &modifier],
            )
            .await
            .map_err(|e| err("reading pg_type", e))?;
        let name: String = row.get(1);
        let kind: String = row.get(2);
        types::map_type(&TypeInfo {
            name: &name,
            kind: kind.bytes().next().unwrap_or(b'b'),
            array: row.get(0),
            modifier: row.get(3),
        })
        .map_err(|e| SourceError(format!("postgres: a new column: {e}")))
    }
}

/// Slot health, for metrics.
#[derive(Debug, Clone, Copy)]
pub struct SlotState {
    /// WAL the slot keeps on the server (from its restart LSN).
    pub retained_wal_bytes: i64,
    /// WAL written since the slot's confirmed flush LSN.
    pub lag_bytes: i64,
    /// A session is streaming from it.
    pub active: bool,
}

impl ChangeSource for PostgresSource {
    fn tables(&self) -> Vec<ChangeTable> {
        self.tables
            .iter()
            .map(|t| ChangeTable {
                source_name: t.qualified(),
                name: t.iceberg_name.clone(),
                schema: t.iceberg.clone(),
                key: t
                    .layout
                    .iter()
                    .filter(|c| c.key)
                    .map(|c| c.name.clone())
                    .collect(),
            })
            .collect()
    }

    async fn begin(
        &mut self,
        _job: Option<&Positions>,
        committed: &[Option<Positions>],
    ) -> Result<ChangeStart, SourceError> {
        let lsn_of = |p: &Positions| {
            p.get(LSN)
                .and_then(|l| Lsn::parse(l).ok())
                .map(|l| l.as_u64())
        };
        let mut newest = None::<&Positions>;
        for (table, positions) in self.tables.iter_mut().zip(committed) {
            if let Some(p) = positions {
                table.committed_end = lsn_of(p).unwrap_or(0);
                if newest.is_none_or(|n| lsn_of(n) < lsn_of(p)) {
                    newest = Some(p);
                }
            }
        }
        let Some(newest) = newest else {
            self.start_snapshot().await?;
            return Ok(ChangeStart::Snapshot);
        };
        if let Some(slot) = newest.get(SLOT)
            && *slot != self.config.slot
        {
            return Err(SourceError(format!(
                "postgres: the job's commits follow slot {slot}, but the job file names slot {}",
                self.config.slot
            )));
        }
        self.system_id = newest.get(SYSTEM).cloned().unwrap_or_default();
        // Resume from the oldest table position: the slot itself never goes back past what
        // was acknowledged, and per-table skipping drops what a table already holds.
        let start = self
            .tables
            .iter()
            .zip(committed)
            .filter_map(|(t, p)| p.as_ref().map(|_| t.committed_end))
            .min()
            .unwrap_or(0);
        self.start_streaming(start).await?;
        Ok(ChangeStart::Stream)
    }

    async fn snapshot_batch(&mut self) -> Result<Option<(usize, RecordBatch)>, SourceError> {
        let Some(rx) = &mut self.snapshot else {
            return Ok(None);
        };
        match rx.recv().await {
            Some(Ok(batch)) => Ok(Some(batch)),
            Some(Err(e)) => Err(e),
            None => {
                self.snapshot = None;
                self.uncommitted = true;
                Ok(None)
            }
        }
    }

    async fn poll(&mut self, timeout: Duration) -> Result<(), SourceError> {
        self.ensure_started().await?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && self.in_transaction.is_none() {
                return Ok(());
            }
            let replication = self
                .replication
                .as_mut()
                .ok_or_else(|| SourceError("postgres: not started".into()))?;
            // Inside a transaction, read on to its commit.
            let wait = if self.in_transaction.is_some() {
                Duration::from_secs(3600)
            } else {
                left
            };
            let event = match tokio::time::timeout(wait, replication.recv()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => {
                    self.reconnect("the server ended the replication stream".into())
                        .await?;
                    continue;
                }
                Ok(Err(e)) => {
                    self.reconnect(e.to_string()).await?;
                    continue;
                }
            };
            match event {
                ReplicationEvent::Begin { final_lsn, .. } => {
                    self.in_transaction = Some(final_lsn.as_u64());
                }
                ReplicationEvent::XLogData { data, .. } => self.on_message(data).await?,
                ReplicationEvent::Commit { end_lsn, .. } => {
                    self.in_transaction = None;
                    self.position = self.position.max(end_lsn.as_u64());
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    if self.in_transaction.is_none() && self.buffer.is_empty() && !self.uncommitted
                    {
                        replication.update_applied_lsn(wal_end);
                    }
                }
                ReplicationEvent::Message { .. } => {}
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(SourceError(
                        "postgres: the replication stream stopped".into(),
                    ));
                }
            }
        }
    }

    fn buffered_bytes(&self) -> usize {
        self.buffer.bytes()
    }

    fn take(&mut self) -> Result<(Vec<TableChanges>, Positions), SourceError> {
        let mut out = Vec::new();
        for index in self.buffer.touched() {
            let table = &self.tables[index];
            let layout = table
                .layout_union
                .clone()
                .unwrap_or_else(|| table.layout.clone());
            if let Some(changes) = self
                .buffer
                .take_table(index, &layout)
                .map_err(|e| SourceError(format!("postgres: table {}: {e}", table.qualified())))?
            {
                out.push(changes);
            }
        }
        self.buffer.reset_counters();
        if !out.is_empty() {
            self.uncommitted = true;
        }
        Ok((out, self.positions()))
    }

    async fn status(&mut self) -> Vec<(&'static str, i64)> {
        let state = match self.slot_state().await {
            Ok(Some(state)) => state,
            Ok(None) => return Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the replication slot's state");
                return Vec::new();
            }
        };
        if state.retained_wal_bytes as u64 > self.config.warn_retained_wal {
            tracing::warn!(
                slot = %self.config.slot,
                retained_wal_bytes = state.retained_wal_bytes,
                bound = self.config.warn_retained_wal,
                "the replication slot retains more WAL than the bound: the job is behind, or \
                 was stopped for long; a retired job must drop its slot"
            );
        }
        vec![
            ("postgres_slot_retained_wal_bytes", state.retained_wal_bytes),
            ("postgres_slot_lag_bytes", state.lag_bytes),
            ("postgres_slot_active", state.active as i64),
        ]
    }

    fn acknowledge(&mut self, positions: &Positions) {
        let Some(lsn) = positions.get(LSN).and_then(|l| Lsn::parse(l).ok()) else {
            return;
        };
        for table in &mut self.tables {
            table.committed_end = table.committed_end.max(lsn.as_u64());
        }
        if lsn.as_u64() >= self.position {
            self.uncommitted = false;
        }
        self.acknowledged = self.acknowledged.max(lsn.as_u64());
        if let Some(replication) = &self.replication {
            replication.update_applied_lsn(lsn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iceberg_schema_keys_are_required_identifiers() {
        let col = |name: &str, key, array| Column {
            name: name.into(),
            ty: PgType {
                scalar: types::Scalar::Long,
                array,
            },
            key,
        };
        let schema = iceberg_schema(&[col("id", true, false), col("tags", false, true)]).unwrap();
        assert_eq!(schema.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        assert!(schema.field_by_name("id").unwrap().required);
        assert!(matches!(
            *schema.field_by_name("tags").unwrap().field_type,
            iceberg::spec::Type::List(_)
        ));
    }
}
