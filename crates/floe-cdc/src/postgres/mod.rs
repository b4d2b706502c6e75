//! The Postgres change source: tables of a publication, copied once from a snapshot exported
//! by the replication slot, then followed through pgoutput.
//!
//! * **Setup** (the `catalog` module). The publication is created if missing (for the listed tables,
//!   or all tables); each published table is read from the catalog — columns (generated ones
//!   are not replicated), the key (the primary key, or the replica-identity index), the
//!   replica identity — and refused with a clear error if it has no key, a column of an
//!   unsupported type, or TOAST-able columns under a replica identity that cannot supply
//!   unchanged values (`REPLICA IDENTITY FULL` is needed; `replica_identity_full = true` lets
//!   Floe set it). Every session may use TLS (`ssl_mode`).
//! * **First start** (nothing committed): a slot left by an earlier attempt that never
//!   committed is dropped; `CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')` on a replication
//!   session that then stays idle; `snapshot_parallelism` ordinary sessions import that
//!   snapshot and `COPY` the tables in binary (`crate::copy`); the copy's position is the slot's consistent point, so streaming from
//!   the slot carries exactly the transactions the copy did not see.
//! * **Streaming** starts on the same slot (after a restart: at the committed LSN; the slot
//!   never goes back past what was acknowledged). A transaction's changes are skipped for a
//!   table whose commit already holds it (its commit LSN is below the table's committed end
//!   LSN), so a restart never applies a change twice.
//! * **Changelog.** Each table is a changelog stream (`schema.table`): an insert is `+I`, an
//!   update `+U` (one that changes the key `-D` + `+I`), a delete `-D` of the key; unchanged
//!   TOASTed values come from the old row (replica identity full) or are left to the sink
//!   ([`crate::changelog`]). `TRUNCATE` empties the stream. Rows are handed over at
//!   transaction boundaries only, so a checkpoint never splits a transaction; the copy is
//!   append rows of its own checkpoint.
//! * **Acknowledgement.** The slot's flush position moves only in [`acknowledge`], called
//!   after the Iceberg commit; when idle with nothing uncommitted, keepalive positions are
//!   acknowledged so the slot does not hold WAL for unrelated traffic. A broken session is
//!   reopened, with backoff, after the last transaction handed over (what was read and not
//!   handed over is read again).
//!
//! [`acknowledge`]: floe_core::Reader::acknowledge

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use bytes::Bytes;
use floe_core::{
    Barrier, Committed, Op, Polled, Positions, ReadItem, ReadOut, Reader, SourceError, StreamBatch,
    StreamSpec,
};
use pgwire_replication::{
    IdentifySystem, Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
};
use tokio::sync::mpsc;
use tokio_postgres::NoTls;

use crate::changelog::{ChangelogBuilder, Column, key_names, key_of};
use crate::copy::CopyTable;
use crate::pgoutput::{self, Message, OldTuple, Tuple, Value};
use crate::types;
use catalog::{PgTable, quote};

mod catalog;
mod config;

pub use catalog::SlotState;
pub(crate) use catalog::iceberg_schema;
pub use config::{PostgresConfig, RawPostgres, SslMode};

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
    SourceError::external(format!("postgres: {context}: {e}"))
}

/// The source partition index of every row: one slot is one partition.
const PARTITION: u32 = 0;

/// Where the reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not sought yet.
    Idle,
    /// Copying the tables; no barrier until the copy is complete.
    Copying,
    /// The copy is complete and must be committed on its own.
    Copied,
    /// The copy was handed over to its checkpoint; streaming starts once it is committed.
    CopyTaken,
    /// Following the slot.
    Streaming,
}

/// The Postgres [`Reader`].
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
    phase: Phase,
    snapshot: Option<mpsc::Receiver<Result<(usize, RecordBatch), SourceError>>>,
    /// Changelog rows per table, not handed over yet.
    changes: Vec<ChangelogBuilder>,
    /// Tables truncated since the last take (their truncate goes before their rows).
    truncated: Vec<bool>,
    /// Copied rows not handed over yet.
    copied: Vec<(usize, RecordBatch)>,
    /// Bumps when a table's columns change.
    version: u64,
    /// End LSN of the last transaction read whole.
    position: u64,
    /// `position` at the last take: a broken session resumes there.
    taken: u64,
    /// The LSN last acknowledged (committed in Iceberg), or the start position.
    acknowledged: u64,
    /// Current transaction's commit LSN, while inside one.
    in_transaction: Option<u64>,
    /// WAL bytes read.
    bytes: u64,
    /// When the initial copy started.
    copy_began: Option<Instant>,
    /// No barrier before the stream reaches the job's committed position again: a checkpoint
    /// must never record an older position than the one committed.
    catch_up: u64,
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
        .map_err(|e| SourceError::user(format!("postgres: TLS: {e}")))?;
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
            phase: Phase::Idle,
            snapshot: None,
            changes: Vec::new(),
            truncated: Vec::new(),
            copied: Vec::new(),
            version: 0,
            position: 0,
            taken: 0,
            acknowledged: 0,
            in_transaction: None,
            bytes: 0,
            copy_began: None,
            catch_up: 0,
        };
        catalog::ensure_publication(&source.catalog, &source.config).await?;
        for (oid, table) in catalog::read_tables(&source.catalog, &source.config).await? {
            source.by_oid.insert(oid, source.tables.len());
            source
                .changes
                .push(ChangelogBuilder::new(table.layout.clone()));
            source.truncated.push(false);
            source.tables.push(table);
        }
        Ok(source)
    }

    /// A replication session that waits before START_REPLICATION (it will start at `start`),
    /// and the server's IDENTIFY_SYSTEM answer.
    async fn open_replication(
        &self,
        start: Lsn,
    ) -> Result<(ReplicationClient, IdentifySystem), SourceError> {
        let mut replication = ReplicationClient::connect_gated(
            self.config.replication_config().with_start_lsn(start),
        )
        .await
        .map_err(|e| err("replication session", e))?;
        let system = replication
            .identify_system()
            .await
            .map_err(|e| err("IDENTIFY_SYSTEM", e))?;
        Ok((replication, system))
    }

    async fn start_snapshot(&mut self) -> Result<(), SourceError> {
        if catalog::slot_state(&self.catalog, &self.config.slot)
            .await?
            .is_some()
        {
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
        let (mut replication, system) = self.open_replication(Lsn::from_u64(0)).await?;
        let rows = replication
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')",
                quote(&self.config.slot)
            ))
            .await
            .map_err(|e| err("creating the replication slot", e))?;
        let row = rows.first().ok_or_else(|| {
            SourceError::external("postgres: CREATE_REPLICATION_SLOT returned no row")
        })?;
        let text = |i: usize| {
            row.get(i)
                .and_then(|v| v.as_ref())
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .ok_or_else(|| {
                    SourceError::external(format!("postgres: slot creation: no column {i}"))
                })
        };
        let consistent = Lsn::parse(&text(1)?).map_err(|e| err("consistent point", e))?;
        let snapshot_name = text(2)?;
        tracing::info!(slot = %self.config.slot, consistent_point = %consistent, "replication slot created");
        self.system_id = system.system_id;
        self.timeline = system.timeline;
        self.position = consistent.as_u64();
        self.taken = self.position;

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
        // The copy replaces whatever an earlier, unfinished attempt left in the tables.
        self.truncated.iter_mut().for_each(|t| *t = true);
        self.snapshot = Some(rx);
        self.replication = Some(replication);
        self.phase = Phase::Copying;
        self.copy_began = Some(Instant::now());
        tracing::info!(
            tables = self.tables.len(),
            "copying the tables (initial snapshot)"
        );
        Ok(())
    }

    async fn start_streaming(&mut self, committed_lsn: u64) -> Result<(), SourceError> {
        let state = catalog::slot_state(&self.catalog, &self.config.slot).await?;
        if state.is_none() {
            return Err(SourceError::user(format!(
                "postgres: replication slot {} is gone, so changes after LSN {} are lost to \
                 this job; drop the job's tables (or its commits) to start over with a new \
                 snapshot",
                self.config.slot,
                Lsn::from_u64(committed_lsn)
            )));
        }
        let (replication, system) = self.open_replication(Lsn::from_u64(committed_lsn)).await?;
        if !self.system_id.is_empty() && self.system_id != system.system_id {
            return Err(SourceError::user(format!(
                "postgres: the server is cluster {}, but the job's commits came from cluster \
                 {}; refusing to mix them",
                system.system_id, self.system_id
            )));
        }
        self.system_id = system.system_id;
        self.timeline = system.timeline;
        self.replication = Some(replication);
        self.position = committed_lsn;
        self.taken = committed_lsn;
        self.phase = Phase::Streaming;
        Ok(())
    }

    async fn ensure_started(&mut self) -> Result<(), SourceError> {
        if let Some(replication) = &mut self.replication
            && self.phase == Phase::Streaming
            && !self.streaming
        {
            let slot = &self.config.slot;
            let refused = |e: pgwire_replication::PgWireError| {
                let message = e.to_string();
                if message.contains("is active for PID") {
                    // A slot has one reader: this is a second replica of the job.
                    SourceError::user(format!(
                        "postgres: replication slot {slot} is being read by another session \
                         ({message}); a slot has one reader, so a Postgres CDC job runs as one \
                         replica — stop the other one first"
                    ))
                } else {
                    err("START_REPLICATION", message)
                }
            };
            replication.start().await.map_err(refused)?;
            replication.wait_started().await.map_err(refused)?;
            self.streaming = true;
        }
        Ok(())
    }

    /// Forgets every change not handed over (and the transaction being read).
    fn forget_unread(&mut self) {
        for builder in &mut self.changes {
            builder.clear();
        }
        self.truncated.iter_mut().for_each(|t| *t = false);
        self.in_transaction = None;
    }

    /// The replication session broke: everything after the last transaction handed over is
    /// read again on a new session. Retried with backoff; gives up after
    /// [`RECONNECT_ATTEMPTS`].
    async fn reconnect(&mut self, why: String) -> Result<(), SourceError> {
        let mut pause = Duration::from_millis(500);
        for attempt in 1..=RECONNECT_ATTEMPTS {
            tracing::warn!(
                slot = %self.config.slot,
                error = %why,
                attempt,
                pause_ms = pause.as_millis() as u64,
                "replication session lost; reconnecting after the last transaction handed over"
            );
            if let Some(mut old) = self.replication.take() {
                old.abort();
            }
            self.streaming = false;
            self.forget_unread();
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
            match self.start_streaming(self.taken).await {
                Ok(()) => match self.ensure_started().await {
                    Ok(()) => return Ok(()),
                    Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                    Err(e) => tracing::warn!(error = %e, "START_REPLICATION failed"),
                },
                Err(e) if attempt == RECONNECT_ATTEMPTS => return Err(e),
                Err(e) => tracing::warn!(error = %e, "reconnecting failed"),
            }
        }
        Err(SourceError::external(format!(
            "postgres: the replication session could not be restored: {why}"
        )))
    }

    async fn on_message(&mut self, data: Bytes) -> Result<(), SourceError> {
        let commit_lsn = self.in_transaction.unwrap_or(0);
        let message = pgoutput::decode(data)
            .map_err(|e| SourceError::internal(format!("postgres: decoding pgoutput: {e}")))?;
        match message {
            Message::Relation(relation) => self.on_relation(relation).await?,
            Message::Insert { relation, new } => {
                self.change(relation, commit_lsn, Op::Insert, &new)?
            }
            Message::Update { relation, old, new } => {
                self.on_update(relation, commit_lsn, old, new)?
            }
            Message::Delete { relation, old } => {
                let old = match old {
                    OldTuple::Key(t) | OldTuple::Full(t) => t,
                };
                self.change(relation, commit_lsn, Op::Delete, &old)?
            }
            Message::Truncate { relations, .. } => {
                for oid in relations {
                    if let Some(&index) = self.by_oid.get(&oid)
                        && commit_lsn >= self.tables[index].committed_end
                    {
                        self.changes[index].clear();
                        self.truncated[index] = true;
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

    /// An update: `+U`, or `-D` of the old key and `+I` of the new one when the key changed;
    /// unchanged TOASTed values are taken from a full old row.
    fn on_update(
        &mut self,
        oid: u32,
        commit_lsn: u64,
        old: Option<OldTuple>,
        mut new: Tuple,
    ) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(());
        };
        let layout = self.tables[index].layout.clone();
        let (old, old_full) = match old {
            Some(OldTuple::Full(t)) => (Some(t), true),
            Some(OldTuple::Key(t)) => (Some(t), false),
            None => (None, false),
        };
        if old_full && let Some(old) = &old {
            for (value, before) in new.iter_mut().zip(old) {
                if *value == Value::Unchanged && *before != Value::Unchanged {
                    *value = before.clone();
                }
            }
        }
        let moved = old.as_ref().filter(|o| {
            key_of(&layout, o).is_some() && key_of(&layout, o) != key_of(&layout, &new)
        });
        match moved {
            Some(old) => {
                self.change(oid, commit_lsn, Op::Delete, old)?;
                self.change(oid, commit_lsn, Op::Insert, &new)
            }
            None => self.change(oid, commit_lsn, Op::UpdateAfter, &new),
        }
    }

    fn change(
        &mut self,
        oid: u32,
        commit_lsn: u64,
        op: Op,
        tuple: &Tuple,
    ) -> Result<(), SourceError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(());
        };
        let table = &self.tables[index];
        if commit_lsn < table.committed_end {
            return Ok(());
        }
        if key_of(&table.layout, tuple).is_none() {
            return Err(SourceError::internal(format!(
                "postgres: table {}: a {} change carries no complete key",
                table.qualified(),
                op.symbol()
            )));
        }
        self.changes[index].push(op, tuple).map_err(|e| {
            SourceError::user(format!(
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
                    let now =
                        catalog::type_of(&self.catalog, column.type_oid, column.type_modifier)
                            .await?;
                    if now != c.ty {
                        return Err(SourceError::user(format!(
                            "postgres: column {} of {qualified} changed type ({:?} → {:?}); \
                             Floe cannot follow that change without rewriting the table — \
                             nothing after it was committed",
                            column.name, c.ty, now
                        )));
                    }
                    c.ty
                }
                None => {
                    catalog::type_of(&self.catalog, column.type_oid, column.type_modifier).await?
                }
            };
            layout.push(Column {
                name: column.name.clone(),
                ty,
                key: known.is_some_and(|c| c.key),
            });
        }
        if key_names(&layout) != key_names(&current) {
            return Err(SourceError::user(format!(
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
            let layout = Arc::new(layout);
            self.changes[index]
                .set_layout(layout.clone())
                .map_err(|e| SourceError::internal(format!("postgres: {qualified}: {e}")))?;
            let table = &mut self.tables[index];
            table.iceberg = iceberg_schema(&union)
                .map_err(|e| SourceError::internal(format!("postgres: schema: {e}")))?;
            table.layout = layout;
            table.layout_union = Some(Arc::new(union));
            self.version += 1;
        }
        Ok(())
    }

    /// Reads one copied batch (or notes that the copy is complete).
    async fn read_copy(&mut self) -> Result<(), SourceError> {
        let Some(rx) = &mut self.snapshot else {
            return Ok(());
        };
        match rx.recv().await {
            Some(Ok((index, batch))) => {
                self.bytes += batch.get_array_memory_size() as u64;
                self.copied.push((index, batch));
            }
            Some(Err(e)) => return Err(e),
            None => {
                self.snapshot = None;
                self.phase = Phase::Copied;
                tracing::info!(slot = %self.config.slot, "initial copy read; committing it");
            }
        }
        Ok(())
    }

    /// Reads the slot until `timeout` passes outside a transaction.
    async fn read_stream(&mut self, timeout: Duration) -> Result<(), SourceError> {
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
                .ok_or_else(|| SourceError::internal("postgres: not started"))?;
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
                ReplicationEvent::XLogData { data, .. } => {
                    self.bytes += data.len() as u64;
                    self.on_message(data).await?
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    self.in_transaction = None;
                    self.position = self.position.max(end_lsn.as_u64());
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    // Nothing read since the last commit, and nothing uncommitted: the slot
                    // need not hold the WAL up to here.
                    if self.in_transaction.is_none()
                        && self.position <= self.acknowledged
                        && self.changes.iter().all(|c| c.rows() == 0)
                    {
                        replication.update_applied_lsn(wal_end);
                    }
                }
                ReplicationEvent::Message { .. } => {}
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(SourceError::external(
                        "postgres: the replication stream stopped",
                    ));
                }
            }
        }
    }
}

impl Reader for PostgresSource {
    fn streams(&self) -> Vec<StreamSpec> {
        self.tables
            .iter()
            .map(|t| StreamSpec {
                name: t.qualified(),
                table: t.iceberg_name.clone(),
                schema: Some(t.iceberg.clone()),
                changelog: true,
                key: key_names(&t.layout),
                time_column: None,
                partition: Vec::new(),
                bloom_filter_columns: Vec::new(),
                plain_columns: Vec::new(),
                properties: Vec::new(),
            })
            .collect()
    }

    fn streams_version(&self) -> u64 {
        self.version
    }

    fn partition_name(&self, _partition: u32) -> String {
        format!("postgres/{}", self.config.slot)
    }

    fn partition_index(&mut self, name: &str) -> Option<u32> {
        (name == self.partition_name(PARTITION)).then_some(PARTITION)
    }

    fn wants_table_positions(&self) -> bool {
        true
    }

    async fn seek(&mut self, committed: &Committed) -> Result<(), SourceError> {
        let lsn_of = |p: &Positions| {
            p.get(LSN)
                .and_then(|l| Lsn::parse(l).ok())
                .map(|l| l.as_u64())
        };
        if let Some(mut old) = self.replication.take() {
            // Sought again (a dropped checkpoint): start over from what is committed.
            old.abort();
            self.streaming = false;
            self.snapshot = None;
            self.copied.clear();
        }
        self.forget_unread();
        // Every checkpoint commits its tables with the job's anchor, so the job's position
        // holds for every table; a table's own position is older only when a catalog without
        // multi-table commits left it behind (then its changes up to the job's are read
        // again, and skipped for tables that have them).
        let job_lsn = committed.job.as_ref().and_then(lsn_of);
        for (index, table) in self.tables.iter_mut().enumerate() {
            let own = committed
                .tables
                .get(index)
                .and_then(|p| p.as_ref())
                .and_then(lsn_of);
            table.committed_end = own.or(job_lsn).unwrap_or(0);
        }
        let newest = committed.job.as_ref().or_else(|| {
            committed
                .tables
                .iter()
                .flatten()
                .max_by_key(|p| lsn_of(p).unwrap_or(0))
        });
        let Some(newest) = newest else {
            return self.start_snapshot().await;
        };
        if let Some(slot) = newest.get(SLOT)
            && *slot != self.config.slot
        {
            return Err(SourceError::user(format!(
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
            .map(|t| t.committed_end)
            .min()
            .unwrap_or(0);
        self.acknowledged = start;
        self.catch_up = job_lsn.unwrap_or(0);
        self.start_streaming(start).await
    }

    async fn read(&mut self, timeout: Duration) -> Result<Polled, SourceError> {
        match self.phase {
            Phase::Idle => Err(SourceError::internal("postgres: read before seek")),
            Phase::Copying => {
                tokio::select! {
                    result = self.read_copy() => result?,
                    () = tokio::time::sleep(timeout) => {}
                }
                Ok(Polled::Records)
            }
            // The copy waits for its checkpoint and its commit.
            Phase::Copied | Phase::CopyTaken => {
                tokio::time::sleep(timeout.min(Duration::from_millis(50))).await;
                Ok(Polled::Records)
            }
            Phase::Streaming => {
                self.read_stream(timeout).await?;
                Ok(Polled::Records)
            }
        }
    }

    fn buffered_rows(&self) -> usize {
        self.changes
            .iter()
            .map(ChangelogBuilder::rows)
            .sum::<usize>()
            + self.copied.iter().map(|(_, b)| b.num_rows()).sum::<usize>()
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn take(&mut self, out: &mut ReadOut) {
        for (index, truncated) in self.truncated.iter_mut().enumerate() {
            if std::mem::take(truncated) {
                out.items.push(ReadItem::Truncate(index));
            }
        }
        for (index, batch) in self.copied.drain(..) {
            out.items
                .push(ReadItem::Rows(StreamBatch::single(index, batch, PARTITION)));
        }
        for (index, builder) in self.changes.iter_mut().enumerate() {
            match builder.take() {
                Ok(batches) => out.items.extend(
                    batches
                        .into_iter()
                        .map(|b| ReadItem::Rows(StreamBatch::single(index, b, PARTITION))),
                ),
                // Rows were checked as they were pushed; a batch that cannot be built is ours.
                Err(e) => panic!("changelog rows of {}: {e}", self.tables[index].qualified()),
            }
        }
        if self.phase == Phase::Copied {
            self.phase = Phase::CopyTaken;
        }
        self.taken = self.position;
    }

    fn barrier(&self) -> Barrier {
        match self.phase {
            Phase::Copying | Phase::CopyTaken => Barrier::NotNow,
            Phase::Copied => Barrier::Wanted,
            _ if self.in_transaction.is_some() || self.position < self.catch_up => Barrier::NotNow,
            _ => Barrier::Allowed,
        }
    }

    fn positions(&self) -> Positions {
        if self.phase == Phase::Idle {
            return Positions::new();
        }
        Positions::from([
            (LSN.to_string(), Lsn::from_u64(self.position).to_string()),
            (SYSTEM.to_string(), self.system_id.clone()),
            (TIMELINE.to_string(), self.timeline.to_string()),
            (SLOT.to_string(), self.config.slot.clone()),
        ])
    }

    async fn status(&mut self) -> Vec<(&'static str, i64)> {
        let state = match catalog::slot_state(&self.catalog, &self.config.slot).await {
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
        self.acknowledged = self.acknowledged.max(lsn.as_u64());
        if self.phase == Phase::CopyTaken {
            // The copy is committed: stream from its position.
            tracing::info!(
                slot = %self.config.slot,
                tables = self.tables.len(),
                seconds = self.copy_began.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                "initial snapshot committed"
            );
            self.phase = Phase::Streaming;
        }
        if let Some(replication) = &self.replication {
            replication.update_applied_lsn(lsn);
        }
    }
}
