//! The Postgres change source: tables of a publication, copied once from a snapshot exported
//! by the replication slot, then followed through pgoutput. This module holds
//! [`PostgresSource`] and its [`Reader`] contract; the phases live in their own modules.
//!
//! * **Setup** (`catalog`). The publication is created if missing (for the listed tables, or
//!   all tables), and listed tables it lacks are added to it; each followed table is read from the catalog — columns (generated ones
//!   are not replicated), the key (the primary key, or the replica-identity index), the
//!   replica identity — and refused with a clear error if it has no key, a column of an
//!   unsupported type, or TOAST-able columns under a replica identity that cannot supply
//!   unchanged values (`REPLICA IDENTITY FULL` is needed; `replica_identity_full = true` lets
//!   Floe set it). Every session may use TLS (`ssl_mode`; `session`, `tls`); the job file
//!   section is `config`.
//! * **First start** (`snapshot`; nothing committed): a slot left by an earlier attempt that
//!   never committed is dropped; `CREATE_REPLICATION_SLOT … (SNAPSHOT 'export')` on a
//!   replication session that then stays idle; `snapshot_parallelism` ordinary sessions
//!   import that snapshot and `COPY` the tables in binary (`crate::copy`); the copy's
//!   position is the slot's consistent point, so streaming from the slot carries exactly the
//!   transactions the copy did not see.
//! * **Streaming** (`stream`) starts on the same slot (after a restart: at the committed LSN;
//!   the slot never goes back past what was acknowledged). A transaction's changes are
//!   skipped for a table whose commit already holds it (its commit LSN is below the table's
//!   committed end LSN), so a restart never applies a change twice.
//! * **Changelog.** Each table is a changelog stream (`schema.table`): an insert is `+I`, an
//!   update `+U` (one that changes the key `-D` + `+I`), a delete `-D` of the key; unchanged
//!   TOASTed values come from the old row (replica identity full) or are left to the sink
//!   ([`crate::changelog`]). `TRUNCATE` empties the stream. Rows are handed over at
//!   transaction boundaries only, so a checkpoint never splits a transaction; the copy is
//!   append rows of its own checkpoint.
//! * **Tables added later** (`backfill`): a table new to a running job — added to `tables` —
//!   is copied by an incremental snapshot, in chunks interleaved with the stream, committed
//!   chunk by chunk with the job's checkpoints; the stream of every other table keeps
//!   landing meanwhile. The job's commits say which tables it holds (`pg.tables`) and how far
//!   each pending one got (`pg.backfill`).
//! * **Acknowledgement.** The slot's flush position moves only in [`acknowledge`], called
//!   after the Iceberg commit; when idle with nothing uncommitted, keepalive positions are
//!   acknowledged so the slot does not hold WAL for unrelated traffic (`stream`). A broken
//!   session is reopened, with backoff, after the last transaction handed over (what was
//!   read and not handed over is read again).
//!
//! Every failure is a [`SourceError`] saying whose fault it is: a value or change Floe cannot
//! keep, or a slot that is gone, is the user's; a server that fails is external.
//!
//! [`acknowledge`]: floe_core::Reader::acknowledge

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use floe_core::{
    Barrier, Committed, Polled, Positions, ReadItem, ReadOut, Reader, SourceError, StreamBatch,
    StreamSpec,
};
use pgwire_replication::{Lsn, ReplicationClient};
use tokio::sync::mpsc;

use crate::changelog::{ChangelogBuilder, changelog_stream};
use catalog::PgTable;

mod backfill;
mod catalog;
mod config;
mod session;
mod snapshot;
mod stream;
mod tls;

pub use catalog::SlotState;
pub(crate) use catalog::iceberg_schema;
pub use config::{PostgresConfig, RawPostgres, SslMode};

/// Position keys in commit markers.
pub const LSN: &str = "pg.lsn";
/// The cluster's system identifier.
pub const SYSTEM: &str = "pg.system-id";
/// The timeline.
pub const TIMELINE: &str = "pg.timeline";
/// The slot.
pub const SLOT: &str = "pg.slot";
/// Position key: the publication the slot is decoded with.
pub const PUBLICATION: &str = "pg.publication";
/// The tables the job holds whole (a JSON array of `schema.table`).
pub const TABLES: &str = "pg.tables";
/// The tables being copied by an incremental snapshot, and the last key copied of each (a
/// JSON object; `null` before the first chunk).
pub const BACKFILL: &str = "pg.backfill";

/// A failure of the server (or of the way to it) while doing `context`.
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
    /// Rows (or a truncate, `None`) that must be handed over before the rest, in this order:
    /// a closed chunk of an incremental snapshot and what the stream read before it.
    ordered: Vec<(usize, Option<RecordBatch>)>,
    /// The tables the job holds whole.
    known: BTreeSet<String>,
    /// Incremental snapshots to run, the first one in progress.
    backfills: Vec<backfill::Backfill>,
    /// Incremental snapshots copied whole and handed over, until a commit holds them.
    backfills_handed: Vec<backfill::Backfill>,
    /// The transaction being read (its id).
    xid: u32,
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

impl PostgresSource {
    /// Connects, makes sure the publication exists, and reads the published tables.
    pub async fn connect(config: PostgresConfig) -> Result<Self, SourceError> {
        let catalog = session::connect(&config).await?;
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
            ordered: Vec::new(),
            backfills_handed: Vec::new(),
            known: BTreeSet::new(),
            backfills: Vec::new(),
            xid: 0,
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
}

/// Asks the running job that follows `config`'s slot to copy `table` (`schema.table`) again:
/// a transactional logical message the job reads in its stream, in order with the changes, so
/// a job that is down acts on it when it comes back. Returns the message's LSN.
pub async fn request_resnapshot(
    config: &PostgresConfig,
    table: &str,
) -> Result<String, SourceError> {
    let client = session::connect(config).await?;
    let followed = catalog::read_tables(&client, config).await?;
    if !followed.iter().any(|(_, t)| t.is(table)) {
        let names: Vec<String> = followed.iter().map(|(_, t)| t.qualified()).collect();
        return Err(SourceError::user(format!(
            "postgres: the job does not follow {table}; it follows {names:?}"
        )));
    }
    let row = client
        .query_one(
            "SELECT pg_logical_emit_message(true, $1, $2)::text",
            &[
                &backfill::RESNAPSHOT_PREFIX,
                &format!("{}\t{table}", config.slot),
            ],
        )
        .await
        .map_err(|e| err("writing the re-snapshot request", e))?;
    Ok(row.get(0))
}

impl Reader for PostgresSource {
    fn streams(&self) -> Vec<StreamSpec> {
        self.tables
            .iter()
            .map(|t| {
                changelog_stream(
                    t.qualified(),
                    t.iceberg_name.clone(),
                    t.iceberg.clone(),
                    &t.layout,
                )
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

    fn knows_all_streams(&self) -> bool {
        // Listed tables are all the job follows; with `FOR ALL TABLES` tables come and go.
        !self.config.tables.is_empty()
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
        // Another publication would follow other tables from the same slot, and one created
        // after the slot's position cannot be decoded there at all.
        if let Some(publication) = newest.get(PUBLICATION)
            && *publication != self.config.publication
        {
            return Err(SourceError::user(format!(
                "postgres: the job's commits follow publication {publication}, but the job file \
                 names publication {}; put publication = \"{publication}\" back (tables are \
                 added to it by listing them), or start a new job with its own slot and tables",
                self.config.publication
            )));
        }
        self.system_id = newest.get(SYSTEM).cloned().unwrap_or_default();
        self.plan_backfills(newest)?;
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
                if self.in_transaction.is_none() {
                    self.next_chunk().await?;
                }
                // A chunk held back by `snapshot_chunk_delay` is taken when it is due.
                let due = self.chunk_due_in();
                let timeout = if due.is_zero() {
                    timeout
                } else {
                    timeout.min(due)
                };
                self.read_stream(timeout).await?;
                self.settle_backfill().await?;
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
            + self.backfills.first().map_or(0, |b| b.held_rows())
            + self
                .ordered
                .iter()
                .map(|(_, b)| b.as_ref().map_or(0, RecordBatch::num_rows))
                .sum::<usize>()
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn take(&mut self, out: &mut ReadOut) {
        for (index, rows) in self.ordered.drain(..) {
            out.items.push(match rows {
                None => ReadItem::Truncate(index),
                Some(batch) => ReadItem::Rows(StreamBatch::single(index, batch, PARTITION)),
            });
        }
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
        self.backfills_taken();
        self.taken = self.position;
    }

    fn barrier(&self) -> Barrier {
        match self.phase {
            Phase::Copying | Phase::CopyTaken => Barrier::NotNow,
            Phase::Copied => Barrier::Wanted,
            _ if self.in_transaction.is_some() || self.position < self.catch_up => Barrier::NotNow,
            // A table copied whole is committed at once, not at the next interval.
            _ if self.backfill_awaits_commit() => Barrier::Wanted,
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
            (PUBLICATION.to_string(), self.config.publication.clone()),
            (
                TABLES.to_string(),
                serde_json::to_string(&self.known).unwrap_or_default(),
            ),
            (BACKFILL.to_string(), self.backfill_position()),
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
        let mut gauges = vec![
            ("postgres_slot_retained_wal_bytes", state.retained_wal_bytes),
            ("postgres_slot_lag_bytes", state.lag_bytes),
            ("postgres_slot_active", state.active as i64),
        ];
        gauges.extend(self.backfill_status());
        gauges
    }

    fn acknowledge(&mut self, positions: &Positions) {
        let Some(lsn) = positions.get(LSN).and_then(|l| Lsn::parse(l).ok()) else {
            return;
        };
        for table in &mut self.tables {
            table.committed_end = table.committed_end.max(lsn.as_u64());
        }
        self.acknowledged = self.acknowledged.max(lsn.as_u64());
        self.backfills_committed(positions);
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
