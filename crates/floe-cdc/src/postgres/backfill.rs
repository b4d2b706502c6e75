//! Incremental snapshots: a table added to a running job is copied in chunks while the
//! replication stream keeps flowing, with no lock held and no change lost or applied twice —
//! the watermark technique of Netflix's DBLog (also behind Flink CDC's and Debezium's
//! incremental snapshots), with the chunk's own MVCC snapshot as the low watermark.
//!
//! One chunk, between two transactions of the stream:
//!
//! 1. In a `REPEATABLE READ` transaction: `pg_current_snapshot()` (the chunk's snapshot *S*:
//!    which transactions it sees), the chunk's upper key (`ORDER BY key OFFSET n-1 LIMIT 1`)
//!    and a binary `COPY` of the rows with `after < key <= upper`.
//! 2. After it, a transactional `pg_logical_emit_message` — the **high watermark**, delivered
//!    at its commit, so that the stream, on reaching it, has delivered every transaction *S*
//!    sees (all committed before *S* was taken). Transactional, because a commit flushes the
//!    WAL: a non-transactional message waits for the WAL writer (up to `wal_writer_delay`)
//!    before the walsender may send it.
//! 3. The stream goes on meanwhile. Its changes of the table are sorted by key against the
//!    copy's progress (by Postgres itself, so every type and collation orders as the chunks
//!    do): a change of a key already copied is applied; one of a key not copied yet is
//!    dropped — a later chunk reads that row's newest state — so the Iceberg table never holds
//!    a key the copy has not reached, and copied rows are plain rows of new keys, written
//!    straight to data files (the sink commits them a snapshot before the checkpoint's
//!    changes, whose equality deletes then reach them).
//!    When the watermark arrives, the chunk's rows are handed over, then **again** the changes
//!    to its keys from transactions *S* does not see (their effect is not in the chunk; each
//!    is a whole row image or a delete, so it may follow the chunk's row). A transaction that
//!    changed a key not copied yet, arrived before the chunk was taken and is not seen by *S*
//!    (its commit was decoded before it became visible, e.g. while a synchronous standby held
//!    it) makes the chunk be taken again.
//!
//! Per key this gives the chunk's image followed by every later change, in order: row locks
//! order two writers of one key the way *S* sees them, and `TRUNCATE`'s lock orders it with
//! every writer of the table.
//!
//! Progress — the tables in the job, and per pending table the last key copied — is a
//! position (`pg.tables`, `pg.backfill`), committed with the rows, so a job killed mid-way
//! goes on after the last committed chunk. A table new to the job is emptied first (it may
//! hold rows from an earlier life in the job).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use arrow_array::RecordBatch;
use floe_core::{Op, Positions, SourceError};

use super::catalog::PgTable;
use super::{BACKFILL, PostgresSource, TABLES, err};
use crate::copy::CopyTable;
use crate::pgoutput::Tuple;

/// The logical message prefix of the high watermarks.
pub(super) const WATERMARK_PREFIX: &str = "floe.watermark";

/// The logical message prefix of a re-snapshot request (`floe cdc resnapshot`): its content
/// is `slot` TAB `schema.table`.
pub(super) const RESNAPSHOT_PREFIX: &str = "floe.resnapshot";

/// A `pg_snapshot`: which transactions it sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct XidSnapshot {
    xmin: u64,
    xmax: u64,
    running: Vec<u64>,
}

impl XidSnapshot {
    /// Parses `pg_current_snapshot()::text` (`xmin:xmax:xip,…`).
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("not a pg_snapshot: {text:?}");
        let mut parts = text.trim().splitn(3, ':');
        let number = |s: Option<&str>| s.and_then(|s| s.parse::<u64>().ok()).ok_or_else(bad);
        let xmin = number(parts.next())?;
        let xmax = number(parts.next())?;
        let running = match parts.next() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|x| x.parse::<u64>().map_err(|_| bad()))
                .collect::<Result<_, _>>()?,
        };
        Ok(Self {
            xmin,
            xmax,
            running,
        })
    }

    /// Whether the snapshot sees (the commit of) transaction `xid` — the 32-bit id pgoutput
    /// sends, taken as the 64-bit id nearest to `xmax`.
    pub(super) fn sees(&self, xid: u32) -> bool {
        // The transactions that matter are within 2^31 of xmax, either side.
        let offset = i64::from(xid.wrapping_sub(self.xmax as u32) as i32);
        let full = (self.xmax as i64 + offset).max(0) as u64;
        full < self.xmin || (full < self.xmax && !self.running.contains(&full))
    }
}

/// A change of the table being copied, kept while its chunk is open.
#[derive(Debug, Clone)]
pub(super) enum Change {
    Row(Op, Tuple),
    Truncate,
}

/// A chunk taken, waiting for its watermark in the stream.
#[derive(Debug)]
pub(super) struct OpenChunk {
    snapshot: XidSnapshot,
    rows: Vec<RecordBatch>,
    /// The chunk's last key (text forms); `None` when it reached the end of the table.
    upper: Option<Vec<String>>,
    /// The watermark message's content.
    token: String,
    /// The table's changes that arrived since the chunk was taken, with their transaction.
    window: Vec<(u32, Change)>,
}

/// The incremental snapshot of one table.
#[derive(Debug)]
pub(super) struct Backfill {
    /// `schema.table`.
    pub(super) table: String,
    /// The last key copied (text forms); `None` before the first chunk (and after the last,
    /// with `done`).
    pub(super) after: Option<Vec<String>>,
    /// `after` as of the last take: a broken replication session goes back to it (what
    /// was read since is read again).
    taken_after: Option<Vec<String>>,
    /// The last chunk was copied; the table is whole once it is handed over.
    done: bool,
    /// The table is to be emptied before its first rows (it is new to the job).
    empty_first: bool,
    /// Transactions whose changes of keys not copied yet were dropped since the last chunk
    /// was taken.
    touched: Vec<u32>,
    /// The table's changes read and not sorted against the copy's progress yet.
    held: Vec<(u32, Change)>,
    /// The open chunk's watermark arrived: it closes once `held` is sorted.
    closing: bool,
    pub(super) open: Option<OpenChunk>,
    pub(super) rows: u64,
    pub(super) chunks: u64,
    /// Rows the table has by the planner's count (for the ETA).
    pub(super) estimate: u64,
    began: Instant,
    /// When the last chunk was taken (`snapshot_chunk_delay` counts from it).
    taken_at: Option<Instant>,
}

impl Backfill {
    pub(super) fn new(table: String, after: Option<Vec<String>>, empty_first: bool) -> Self {
        Self {
            table,
            taken_after: after.clone(),
            after,
            done: false,
            empty_first,
            touched: Vec::new(),
            held: Vec::new(),
            closing: false,
            open: None,
            rows: 0,
            chunks: 0,
            estimate: 0,
            began: Instant::now(),
            taken_at: None,
        }
    }

    /// A change of the table arrived in transaction `xid`; it is applied, kept or dropped
    /// once sorted ([`PostgresSource::sort_held`]).
    pub(super) fn hold(&mut self, xid: u32, change: Change) {
        if self.after.is_none() && self.open.is_none() && !self.done {
            // Nothing copied yet (a table waiting for its turn, or before its first chunk):
            // its chunks will read every row as it is then.
            self.touch(xid);
            return;
        }
        self.held.push((xid, change));
    }

    /// A change of transaction `xid` was dropped: the next chunk's snapshot must see it.
    fn touch(&mut self, xid: u32) {
        if self.touched.last() != Some(&xid) {
            self.touched.push(xid);
        }
    }

    /// Its open chunk's watermark arrived.
    pub(super) fn closing(&self) -> bool {
        self.closing
    }

    /// Rows held (not sorted yet).
    pub(super) fn held_rows(&self) -> usize {
        self.held.len()
    }

    /// Rows per second since it began, and the seconds left by the estimate.
    fn rate_and_eta(&self) -> (u64, Option<u64>) {
        let seconds = self.began.elapsed().as_secs_f64().max(1e-3);
        let rate = self.rows as f64 / seconds;
        let left = self.estimate.saturating_sub(self.rows);
        let eta = (rate > 0.0 && self.estimate > 0).then(|| (left as f64 / rate) as u64);
        (rate as u64, eta)
    }
}

/// A SQL literal of a key value in its column's type.
fn literal(text: &str, ty: &str) -> String {
    format!("'{}'::{ty}", text.replace('\'', "''"))
}

/// `(v1, v2)`: key values (text forms, in index order) as literals of their columns' types.
fn key_literals(table: &PgTable, values: &[String]) -> String {
    let literals: Vec<String> = table
        .key_order
        .iter()
        .zip(values)
        .map(|((_, ty), v)| literal(v, ty))
        .collect();
    format!("({})", literals.join(", "))
}

/// `(k1, k2) op (v1, v2)` over the key in index order.
fn key_compare(table: &PgTable, op: &str, values: &[String]) -> String {
    let columns: Vec<&str> = table.key_order.iter().map(|(c, _)| c.as_str()).collect();
    format!(
        "({}) {op} {}",
        columns.join(", "),
        key_literals(table, values)
    )
}

impl PostgresSource {
    /// After a restart: which tables the job holds whole, which are being copied (and how far
    /// they got), and which are new to it — those are emptied and copied from the start.
    pub(super) fn plan_backfills(&mut self, committed: &Positions) -> Result<(), SourceError> {
        let all: Vec<String> = self.tables.iter().map(|t| t.qualified()).collect();
        let unreadable = |what: &str, e: String| {
            SourceError::internal(format!("postgres: the {what} position: {e}"))
        };
        self.known = match committed.get(TABLES) {
            Some(text) => serde_json::from_str::<BTreeSet<String>>(text)
                .map_err(|e| unreadable(TABLES, e.to_string()))?,
            // Commits from before incremental snapshots: every table then followed is whole.
            None => all.iter().cloned().collect(),
        };
        // A table the job stopped following is new to it if it comes back.
        self.known.retain(|t| all.contains(t));
        let pending = match committed.get(BACKFILL) {
            Some(text) => parse_backfill_position(text).map_err(|e| unreadable(BACKFILL, e))?,
            None => BTreeMap::new(),
        };
        self.backfills.clear();
        self.backfills_handed.clear();
        for (index, name) in all.iter().enumerate() {
            if self.known.contains(name) {
                continue;
            }
            match pending.get(name) {
                Some(after) => {
                    tracing::info!(table = %name, after = ?after, "resuming the table's incremental snapshot");
                    self.backfills
                        .push(Backfill::new(name.clone(), after.clone(), false));
                }
                None => {
                    tracing::info!(table = %name, "a table new to the job: copying it by an incremental snapshot while the stream goes on");
                    // It may hold rows from an earlier life in the job.
                    self.truncated[index] = true;
                    self.backfills.push(Backfill::new(name.clone(), None, true));
                }
            }
        }
        Ok(())
    }

    /// The backfill of table `index`, if it is the one being copied.
    /// The incremental snapshot of table `index`, running or waiting for its turn (asked for
    /// every change the stream reads: no allocation).
    pub(super) fn backfill_of(&mut self, index: usize) -> Option<&mut Backfill> {
        if self.backfills.is_empty() {
            return None;
        }
        let table = &self.tables[index];
        self.backfills.iter_mut().find(|b| table.is(&b.table))
    }

    /// The index of table `schema.table`.
    pub(super) fn table_index(&self, qualified: &str) -> Option<usize> {
        self.tables.iter().position(|t| t.is(qualified))
    }

    /// How long until `snapshot_chunk_delay` lets the next chunk be taken (zero: now, or
    /// no chunk is waiting for it). The stream reads no longer than this at a time.
    pub(super) fn chunk_due_in(&self) -> std::time::Duration {
        let delay = self.config.snapshot_chunk_delay;
        match self.backfills.first() {
            Some(b) if !delay.is_zero() && b.open.is_none() && !b.done => {
                b.taken_at.map_or(std::time::Duration::ZERO, |at| {
                    delay.saturating_sub(at.elapsed())
                })
            }
            _ => std::time::Duration::ZERO,
        }
    }

    /// Takes the next chunk of the first pending table, unless one is waiting for its
    /// watermark. Called between transactions of the stream.
    pub(super) async fn next_chunk(&mut self) -> Result<(), SourceError> {
        let Some(backfill) = self.backfills.first() else {
            return Ok(());
        };
        if backfill.open.is_some() || backfill.done || !self.chunk_due_in().is_zero() {
            return Ok(());
        }
        let Some(index) = self.table_index(&backfill.table) else {
            // The table left the publication meanwhile.
            self.backfills.remove(0);
            return Ok(());
        };
        let table = self.tables[index].clone();
        let after = backfill.after.clone();
        let first = backfill.chunks == 0 && backfill.rows == 0;
        let name = table.qualified();
        let failed = |e: tokio_postgres::Error| err(&format!("copying a chunk of {name}"), e);
        if first {
            // Rates and the ETA count from the first chunk (the stream may first have had to
            // reach the table's addition).
            self.backfills[0].began = Instant::now();
        }
        if first && self.backfills[0].estimate == 0 {
            let estimate: i64 = self
                .catalog
                .query_one(
                    "SELECT greatest(reltuples, 0)::int8 FROM pg_class WHERE oid = $1::text::regclass",
                    &[&table.quoted()],
                )
                .await
                .map_err(failed)?
                .get(0);
            self.backfills[0].estimate = estimate as u64;
        }
        let client = &self.catalog;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(failed)?;
        let taken = async {
            let snapshot: String = client
                .query_one("SELECT pg_current_snapshot()::text", &[])
                .await?
                .get(0);
            // The columns the chunk copies, as of its snapshot.
            let current: Vec<String> = client
                .query_one(
                    "SELECT coalesce(array_agg(attname::text ORDER BY attnum), '{}') \
                     FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 \
                     AND NOT attisdropped AND attgenerated = ''",
                    &[&table.quoted()],
                )
                .await?
                .get(0);
            // Aliased: `ORDER BY id` would otherwise sort the text output column `id`.
            let columns: Vec<String> = table
                .key_order
                .iter()
                .enumerate()
                .map(|(i, (c, _))| format!("{c}::text AS floe_key_{i}"))
                .collect();
            let order: Vec<&str> = table.key_order.iter().map(|(c, _)| c.as_str()).collect();
            let from_after = after
                .as_ref()
                .map(|a| format!("WHERE {}", key_compare(&table, ">", a)))
                .unwrap_or_default();
            let upper = client
                .query_opt(
                    &format!(
                        "SELECT {} FROM {} {from_after} ORDER BY {} OFFSET {} LIMIT 1",
                        columns.join(", "),
                        table.quoted(),
                        order.join(", "),
                        self.config.snapshot_chunk_rows - 1
                    ),
                    &[],
                )
                .await?
                .map(|row| {
                    (0..columns.len())
                        .map(|i| row.get::<_, String>(i))
                        .collect::<Vec<String>>()
                });
            Ok::<_, tokio_postgres::Error>((snapshot, upper, current))
        }
        .await;
        let (snapshot, upper, current) = match taken {
            Ok(v) => v,
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(failed(e));
            }
        };
        let known: Vec<&str> = table.layout.iter().map(|c| c.name.as_str()).collect();
        if current.iter().map(String::as_str).ne(known.iter().copied()) {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(super::stream::columns_changed_while_copying(&name));
        }
        let mut filter: Vec<String> = Vec::new();
        if let Some(a) = &after {
            filter.push(key_compare(&table, ">", a));
        }
        if let Some(u) = &upper {
            filter.push(key_compare(&table, "<=", u));
        }
        let copy = CopyTable {
            index,
            name: name.clone(),
            from: table.quoted(),
            select: &table.copy_columns,
            layout: &table.layout,
            filter: (!filter.is_empty()).then(|| filter.join(" AND ")),
        };
        let rows = copy.collect(client).await;
        let _ = client.batch_execute("COMMIT").await;
        let rows = rows?;
        let snapshot = XidSnapshot::parse(&snapshot).map_err(SourceError::internal)?;
        let backfill = &mut self.backfills[0];
        backfill.taken_at = Some(Instant::now());
        // A transaction that touched the table before the chunk was taken but is not in its
        // snapshot would be overwritten by the chunk's older rows: take the chunk again.
        if backfill.touched.iter().any(|xid| !snapshot.sees(*xid)) {
            tracing::debug!(table = %name, "a change the chunk does not see was read already; taking the chunk again");
            // Until a snapshot sees them.
            backfill.touched.retain(|xid| !snapshot.sees(*xid));
            return Ok(());
        }
        backfill.touched.clear();
        let token = format!(
            "{}:{}:{}:{}",
            self.config.slot,
            name,
            backfill.chunks,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        backfill.open = Some(OpenChunk {
            snapshot,
            rows,
            upper,
            token: token.clone(),
            window: Vec::new(),
        });
        self.catalog
            .execute(
                "SELECT pg_logical_emit_message(true, $1, $2)",
                &[&WATERMARK_PREFIX, &token],
            )
            .await
            .map_err(|e| err("writing a snapshot watermark", e))?;
        Ok(())
    }

    /// A logical message arrived: the open chunk's watermark means the stream has delivered
    /// every transaction its snapshot sees. Returns whether it was.
    pub(super) fn on_watermark(&mut self, prefix: &str, content: &[u8]) -> bool {
        let Some(backfill) = self.backfills.first_mut() else {
            return false;
        };
        let ours = prefix == WATERMARK_PREFIX
            && backfill
                .open
                .as_ref()
                .is_some_and(|open| open.token.as_bytes() == content);
        backfill.closing |= ours;
        ours
    }

    /// A re-snapshot request arrived in the stream (`floe cdc resnapshot`): the table is
    /// emptied here, in stream order, and copied again by an incremental snapshot. Returns
    /// whether the message was one for this job.
    pub(super) fn on_resnapshot(&mut self, prefix: &str, content: &[u8]) -> bool {
        if prefix != RESNAPSHOT_PREFIX {
            return false;
        }
        let content = String::from_utf8_lossy(content);
        let Some((slot, name)) = content.split_once('\t') else {
            return false;
        };
        if slot != self.config.slot {
            return false;
        }
        let Some(index) = self.table_index(name) else {
            tracing::warn!(table = %name, "a re-snapshot request for a table the job does not follow; ignored");
            return true;
        };
        if self.backfills.iter().any(|b| b.table == name) {
            tracing::warn!(table = %name, "a re-snapshot request for a table being copied already; ignored");
            return true;
        }
        tracing::info!(table = %name, "re-snapshot requested: the table is emptied and copied again while the stream goes on");
        self.changes[index].clear();
        self.truncated[index] = true;
        self.known.remove(name);
        self.backfills
            .push(Backfill::new(name.to_string(), None, true));
        true
    }

    /// Sorts the held changes, then closes the chunk whose watermark arrived. Called after
    /// each read of the stream, outside a transaction.
    pub(super) async fn settle_backfill(&mut self) -> Result<(), SourceError> {
        self.sort_held().await?;
        if self.backfills.first().is_some_and(|b| b.closing) {
            self.close_chunk()?;
        }
        Ok(())
    }

    /// Applies, keeps or drops each held change by where its key is: copied already
    /// (`<= after`: applied), in the open chunk (`<= upper`: kept to follow the chunk if its
    /// snapshot does not see it), or beyond (dropped; a later chunk reads the row).
    pub(super) async fn sort_held(&mut self) -> Result<(), SourceError> {
        let Some(backfill) = self.backfills.first_mut() else {
            return Ok(());
        };
        if backfill.held.is_empty() {
            return Ok(());
        }
        // Taken only once sorted: a read cancelled during the query (a shutdown) keeps them.
        let count = backfill.held.len();
        let after = backfill.after.clone();
        let done = backfill.done;
        let upper = backfill.open.as_ref().map(|o| o.upper.clone());
        let name = backfill.table.clone();
        let Some(index) = self.table_index(&name) else {
            return Ok(());
        };
        let table = &self.tables[index];
        let positions: Vec<usize> = table
            .key_order
            .iter()
            .map(|(quoted, _)| {
                table
                    .layout
                    .iter()
                    .position(|c| super::catalog::quote(&c.name) == *quoted)
                    .expect("a key column is a column")
            })
            .collect();
        let mut columns: Vec<Vec<String>> = vec![Vec::new(); positions.len()];
        for (_, change) in &self.backfills[0].held[..count] {
            if let Change::Row(_, tuple) = change {
                for (column, &at) in columns.iter_mut().zip(&positions) {
                    column.push(match &tuple[at] {
                        crate::pgoutput::Value::Text(b) => String::from_utf8_lossy(b).into_owned(),
                        other => {
                            return Err(SourceError::internal(format!(
                                "postgres: {name}: a key value that is not text: {other:?}"
                            )));
                        }
                    });
                }
            }
        }
        let keys: Vec<String> = table
            .key_order
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| format!("k{i}::{ty}"))
            .collect();
        let keys = format!("({})", keys.join(", "));
        let values = |v: &[String]| key_literals(table, v);
        let le_after = match &after {
            // The last chunk is copied: every key is.
            _ if done => "true".to_string(),
            Some(a) => format!("{keys} <= {}", values(a)),
            None => "false".to_string(),
        };
        let le_upper = match &upper {
            Some(Some(u)) => format!("{keys} <= {}", values(u)),
            Some(None) => "true".to_string(),
            None => "false".to_string(),
        };
        let unnest: Vec<String> = (1..=positions.len())
            .map(|i| format!("${i}::text[]"))
            .collect();
        let names: Vec<String> = (0..positions.len()).map(|i| format!("k{i}")).collect();
        let sql = format!(
            "SELECT {le_after}, {le_upper} FROM unnest({}) WITH ORDINALITY AS u({}, ord) \
             ORDER BY ord",
            unnest.join(", "),
            names.join(", ")
        );
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = columns
            .iter()
            .map(|c| c as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let rows = if columns.first().is_some_and(|c| !c.is_empty()) {
            self.catalog
                .query(&sql, &params)
                .await
                .map_err(|e| err(&format!("sorting the changes of {name}"), e))?
        } else {
            Vec::new()
        };
        let mut flags = rows
            .iter()
            .map(|r| (r.get::<_, bool>(0), r.get::<_, bool>(1)));
        let held: Vec<(u32, Change)> = self.backfills[0].held.drain(..count).collect();
        for (xid, change) in held {
            let backfill = &mut self.backfills[0];
            match change {
                Change::Truncate => {
                    self.changes[index].clear();
                    self.truncated[index] = true;
                    if let Some(open) = &mut backfill.open {
                        open.window.push((xid, Change::Truncate));
                    }
                }
                Change::Row(op, tuple) => {
                    let (copied, in_chunk) = flags.next().ok_or_else(|| {
                        SourceError::internal(format!("postgres: sorting the changes of {name}"))
                    })?;
                    if copied {
                        self.changes[index].push(op, &tuple).map_err(|e| {
                            SourceError::user(format!("postgres: table {name}: {e}"))
                        })?;
                    } else if in_chunk && let Some(open) = &mut backfill.open {
                        open.window.push((xid, Change::Row(op, tuple)));
                    } else {
                        backfill.touch(xid);
                    }
                }
            }
        }
        Ok(())
    }

    /// The open chunk's rows go to the table, then what its snapshot does not see.
    fn close_chunk(&mut self) -> Result<(), SourceError> {
        let backfill = &mut self.backfills[0];
        backfill.closing = false;
        let Some(open) = backfill.open.take() else {
            return Ok(());
        };
        let name = backfill.table.clone();
        let Some(index) = self.table_index(&name) else {
            return Ok(());
        };
        // What the stream read of the table so far goes first: it is older than the chunk.
        if std::mem::take(&mut self.truncated[index]) {
            self.ordered.push((index, None));
        }
        let prior = self.changes[index].take().map_err(|e| {
            SourceError::internal(format!("postgres: changelog rows of {name}: {e}"))
        })?;
        let mut copied = 0;
        self.ordered
            .extend(prior.into_iter().map(|b| (index, Some(b))));
        // Copied rows are plain rows (no op column): keys the table does not hold yet.
        for batch in open.rows {
            copied += batch.num_rows() as u64;
            self.ordered.push((index, Some(batch)));
        }
        // Then again what the chunk's snapshot does not see.
        for (xid, change) in open.window {
            if open.snapshot.sees(xid) {
                continue;
            }
            match change {
                Change::Truncate => {
                    self.changes[index].clear();
                    self.truncated[index] = true;
                }
                Change::Row(op, tuple) => {
                    // The chunk inserted the key.
                    let op = if op == Op::Insert {
                        Op::UpdateAfter
                    } else {
                        op
                    };
                    self.changes[index].push(op, &tuple).map_err(|e| {
                        SourceError::internal(format!(
                            "postgres: replaying a change of {name}: {e}"
                        ))
                    })?;
                }
            }
        }
        let backfill = &mut self.backfills[0];
        backfill.rows += copied;
        backfill.chunks += 1;
        backfill.after = open.upper.clone();
        let (rate, eta) = backfill.rate_and_eta();
        if open.upper.is_none() {
            tracing::info!(
                table = %name,
                rows = backfill.rows,
                chunks = backfill.chunks,
                seconds = backfill.began.elapsed().as_secs_f64(),
                rows_per_second = rate,
                "incremental snapshot complete"
            );
            backfill.done = true;
        } else {
            tracing::info!(
                table = %name,
                rows = backfill.rows,
                chunks = backfill.chunks,
                estimate = backfill.estimate,
                rows_per_second = rate,
                eta_seconds = eta,
                "incremental snapshot"
            );
        }
        Ok(())
    }

    /// Everything read so far is handed over: a finished table is whole from here on.
    pub(super) fn backfills_taken(&mut self) {
        for backfill in &mut self.backfills {
            backfill.taken_after = backfill.after.clone();
            backfill.empty_first = false;
        }
        let (done, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut self.backfills)
            .into_iter()
            .partition(|b| b.done);
        self.backfills = pending;
        self.known.extend(done.iter().map(|b| b.table.clone()));
        self.backfills_handed.extend(done);
    }

    /// Whether a table was copied whole and no commit holds it yet.
    pub(super) fn backfill_awaits_commit(&self) -> bool {
        !self.backfills_handed.is_empty() || self.backfills.iter().any(|b| b.done)
    }

    /// A commit landed: copies it holds whole are logged as committed (readers see the whole
    /// table from here on).
    pub(super) fn backfills_committed(&mut self, positions: &Positions) {
        if self.backfills_handed.is_empty() {
            return;
        }
        let whole: BTreeSet<String> = positions
            .get(TABLES)
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        let (committed, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.backfills_handed)
            .into_iter()
            .partition(|b| whole.contains(&b.table));
        self.backfills_handed = waiting;
        for backfill in committed {
            tracing::info!(
                table = %backfill.table,
                rows = backfill.rows,
                chunks = backfill.chunks,
                seconds = backfill.began.elapsed().as_secs_f64(),
                "incremental snapshot committed"
            );
        }
    }

    /// The replication session broke: the stream is read again from the last take, so the
    /// backfills go back there too (an open chunk is taken again).
    pub(super) fn backfills_forget_unread(&mut self) {
        self.ordered.clear();
        for backfill in &mut self.backfills {
            // Changes of the open chunk's window that came before the last take are not read
            // again: the next chunk's snapshot must see them.
            if let Some(open) = backfill.open.take() {
                backfill
                    .touched
                    .extend(open.window.iter().map(|(xid, _)| *xid));
            }
            backfill.held.clear();
            backfill.closing = false;
            backfill.after = backfill.taken_after.clone();
            backfill.done = false;
            if backfill.empty_first
                && let Some(index) = self.tables.iter().position(|t| t.is(&backfill.table))
            {
                self.truncated[index] = true;
            }
        }
    }

    /// `pg.backfill`: the pending tables and how far each got.
    pub(super) fn backfill_position(&self) -> String {
        let pending: BTreeMap<&str, Option<&Vec<String>>> = self
            .backfills
            .iter()
            // What was handed over: positions are read right after a take.
            .map(|b| (b.table.as_str(), b.taken_after.as_ref()))
            .collect();
        serde_json::to_string(&pending).unwrap_or_else(|_| "{}".into())
    }

    /// The gauges of the incremental snapshot in progress.
    pub(super) fn backfill_status(&self) -> Vec<(&'static str, i64)> {
        let first = self.backfills.first();
        vec![
            (
                "postgres_snapshot_tables_pending",
                self.backfills.len() as i64,
            ),
            ("postgres_snapshot_rows", first.map_or(0, |b| b.rows as i64)),
            (
                "postgres_snapshot_chunks",
                first.map_or(0, |b| b.chunks as i64),
            ),
            (
                "postgres_snapshot_rows_estimate",
                first.map_or(0, |b| b.estimate as i64),
            ),
            (
                "postgres_snapshot_eta_seconds",
                first
                    .and_then(|b| b.rate_and_eta().1)
                    .map_or(-1, |s| s as i64),
            ),
        ]
    }
}

/// Reads `pg.backfill`.
pub(super) fn parse_backfill_position(
    text: &str,
) -> Result<BTreeMap<String, Option<Vec<String>>>, String> {
    serde_json::from_str(text).map_err(|e| format!("unreadable pg.backfill position: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_sees_what_committed_before_it() {
        let s = XidSnapshot::parse("100:105:101,103").unwrap();
        assert!(s.sees(99));
        assert!(s.sees(100));
        assert!(!s.sees(101));
        assert!(s.sees(102));
        assert!(!s.sees(103));
        assert!(s.sees(104));
        assert!(!s.sees(105));
        assert!(!s.sees(200));
        assert_eq!(
            XidSnapshot::parse("7:7:").unwrap().running,
            Vec::<u64>::new()
        );
        assert!(XidSnapshot::parse("7").is_err());
        assert!(XidSnapshot::parse("7:8:x").is_err());
    }

    #[test]
    fn a_32_bit_xid_is_placed_in_the_snapshots_epoch() {
        // Epoch 1: xmax = 2^32 + 10. A xid of 5 is 2^32 + 5 (seen); one of 2^32 - 3 is from
        // epoch 0 (seen, long before xmin); one of 20 began after the snapshot (not seen).
        let base = 1u64 << 32;
        let s = XidSnapshot {
            xmin: base + 8,
            xmax: base + 10,
            running: vec![base + 9],
        };
        assert!(s.sees(5));
        assert!(s.sees(u32::MAX - 2));
        assert!(!s.sees(9));
        assert!(s.sees(8));
        assert!(!s.sees(20));
    }

    #[test]
    fn changes_before_anything_is_copied_are_dropped_and_remembered() {
        let mut b = Backfill::new("public.t".into(), None, true);
        b.hold(7, Change::Truncate);
        b.hold(7, Change::Row(Op::Insert, Vec::new()));
        b.hold(9, Change::Row(Op::Delete, Vec::new()));
        assert_eq!(b.held_rows(), 0, "a waiting table's changes are not kept");
        assert_eq!(b.touched, vec![7, 9], "but the next chunk must see them");
        // Once a chunk is copied, changes wait to be sorted against it.
        b.after = Some(vec!["10".into()]);
        b.hold(11, Change::Row(Op::Insert, Vec::new()));
        assert_eq!(b.held_rows(), 1);
    }

    #[test]
    fn key_literals_quote_and_cast() {
        assert_eq!(literal("o'hara", "text"), "'o''hara'::text");
        assert_eq!(literal("12", "bigint"), "'12'::bigint");
    }
}
