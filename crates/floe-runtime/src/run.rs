//! The job loop: read, decode, write, and commit one checkpoint at a time, exactly once.
//!
//! * **Recovery.** The positions come from the anchor (dead-letter) table's newest marker of
//!   the job, and the source seeks there — the local state directory is never needed for it.
//! * **Checkpoint.** Every `interval` (or once `max_buffered_bytes` of payload are buffered)
//!   the writers close their files and one commit carries all tables, the anchor always among
//!   them, with the marker `{job, writer, checkpoint, positions}`. Reading goes on while that
//!   commit runs; the next barrier first waits for it (one commit in flight). Only a settled
//!   commit's positions are acknowledged to the source.
//! * **Fencing.** The positions recorded are planned on the anchor's head at commit time: if
//!   another writer (a replica that took over a partition) committed any of this writer's
//!   partitions since this writer sought them, the checkpoint is dropped and the partitions
//!   are sought again — a zombie never commits a duplicate.
//! * **Rebalance.** When the source's partitions change, the uncommitted checkpoint is dropped
//!   (its files deleted) and every owned partition is sought to its committed position.
//! * **Bad data** goes to the dead-letter table in the same checkpoint; the job goes on.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use floe_core::{Format, PollLimit, Polled, Positions, Source, SourceRecord, position_key};
use floe_lake::commit::{RetryPolicy, commit_checkpoint_planned};
use floe_lake::marker::{CommitMarker, newest_marker};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::snapshot::Delta;
use floe_lake::{ErrorKind, LakeError, LakeResult};
use tokio_util::sync::CancellationToken;

use crate::deadletter::{self, DeadLetters};
use crate::job::JobConfig;
use crate::metrics::JobMetrics;
use crate::tables::{Wanted, ensure_table, writer_options};
use crate::writers::{Target, Writers};

/// The writer key of the dead-letter table.
const DEAD_LETTER: &str = "dead_letter";

/// Rows buffered in the format before they are handed to the writers.
const FLUSH_ROWS: usize = 64 * 1024;
/// What one poll may take from the source: the records waiting for decoding stay small.
const POLL: PollLimit = PollLimit {
    records: 8192,
    bytes: 8 * 1024 * 1024,
};

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Rows committed, per table name.
    pub rows: BTreeMap<String, u64>,
    /// Records dead-lettered.
    pub dead_letters: u64,
}

/// A running job.
pub struct Job<S: Source, F: Format> {
    config: JobConfig,
    client: CatalogClient,
    source: S,
    format: F,
    metrics: JobMetrics,
    writer_id: String,
    next_checkpoint: u64,
    /// The job's tables; `tables[0]` is the dead-letter (anchor) table.
    tables: Vec<LoadedTable>,
    /// The writer task, with one target per table in the same order.
    writers: Writers,
    dead_letters: DeadLetters,
    /// Positions of the owned partitions as last sought or committed.
    start: Positions,
    /// Positions of the owned partitions after the records read so far.
    current: Positions,
    buffered_bytes: u64,
    summary: RunSummary,
    in_flight: Option<InFlight>,
}

/// A checkpoint being committed while the next one is read.
struct InFlight {
    task: tokio::task::JoinHandle<LakeResult<(floe_lake::commit::CommitReport, Duration)>>,
    /// The positions it records for this writer's partitions.
    positions: Positions,
    deltas: Vec<(iceberg::TableIdent, Delta)>,
    rows: Vec<(String, u64)>,
    began: Instant,
}

impl<S: Source, F: Format> std::fmt::Debug for Job<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.config.name)
            .field("writer", &self.writer_id)
            .finish_non_exhaustive()
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

fn fenced(message: String) -> LakeError {
    LakeError::new(ErrorKind::Fenced, message)
}

impl<S: Source, F: Format> Job<S, F> {
    /// Creates or evolves the job's tables.
    pub async fn open(
        config: JobConfig,
        client: CatalogClient,
        source: S,
        format: F,
        metrics: JobMetrics,
    ) -> LakeResult<Self> {
        let mut targets = Vec::new();
        let (anchor, dead_letter_options) = deadletter::ensure_anchor(&client, &config).await?;
        targets.push(Target::new(DEAD_LETTER, anchor, dead_letter_options)?);
        for spec in format.tables() {
            let table_config = config
                .tables
                .iter()
                .find(|t| t.key == spec.key)
                .ok_or_else(|| {
                    LakeError::new(ErrorKind::Invalid, format!("no settings for {}", spec.key))
                })?;
            let writer_options = writer_options(
                &config,
                table_config.target_file_size,
                spec.bloom_filter_columns,
                spec.plain_columns,
            );
            let mut properties = writer_options.to_table_properties();
            properties.extend(table_config.properties.clone());
            let table = ensure_table(
                &client,
                &config.catalog.namespace,
                &Wanted {
                    name: &table_config.name,
                    schema: &spec.schema,
                    partition: &table_config.partition,
                    properties: &properties,
                },
            )
            .await?;
            targets.push(Target::new(spec.key, table, writer_options)?);
        }
        Ok(Self {
            writer_id: uuid::Uuid::now_v7().to_string(),
            config,
            client,
            source,
            format,
            metrics,
            next_checkpoint: 1,
            tables: targets.iter().map(|t| t.table.clone()).collect(),
            writers: Writers::start(targets),
            dead_letters: DeadLetters::default(),
            start: Positions::new(),
            current: Positions::new(),
            buffered_bytes: 0,
            summary: RunSummary::default(),
            in_flight: None,
        })
    }

    /// The positions committed for the whole job.
    async fn committed_positions(&self) -> LakeResult<Positions> {
        let anchor = self.client.load_table(&self.tables[0].ident).await?;
        Ok(newest_marker(&anchor.metadata, &self.config.name)
            .map(|found| found.marker.positions)
            .unwrap_or_default())
    }

    /// Seeks every owned partition to its committed position.
    async fn recover(&mut self) -> LakeResult<()> {
        let committed = self.committed_positions().await?;
        self.source
            .seek(&committed)
            .map_err(|e| LakeError::new(ErrorKind::Unavailable, e.0))?;
        let owned = self.source.assignment();
        self.start = committed
            .into_iter()
            .filter(|(k, _)| owned.contains(k))
            .collect();
        self.current = self.start.clone();
        tracing::info!(
            job = %self.config.name,
            writer = %self.writer_id,
            partitions = owned.len(),
            positions = ?self.start,
            "reading from the committed positions"
        );
        Ok(())
    }

    /// Runs until `shutdown` is cancelled (then takes a final checkpoint) or a bounded source
    /// finishes.
    pub async fn run(mut self, shutdown: CancellationToken) -> LakeResult<RunSummary> {
        self.recover().await?;
        let mut records: Vec<SourceRecord> = Vec::with_capacity(1024);
        let mut deadline = Instant::now() + self.config.interval;
        loop {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(200));
            let polled = tokio::select! {
                polled = self.source.poll(&mut records, POLL, wait) => polled,
                () = shutdown.cancelled() => {
                    tracing::info!("stopping: taking a final checkpoint");
                    self.checkpoint().await?;
                    self.settle().await?;
                    return Ok(self.summary);
                }
            };
            let polled = polled.map_err(|e| LakeError::new(ErrorKind::Unavailable, e.0))?;
            if polled == Polled::Rebalanced {
                records.clear();
                // A commit in flight lands (or not) before anything is sought again.
                self.settle().await?;
                self.abort("the partition assignment changed").await;
                self.recover().await?;
                continue;
            }
            let ingested_at = now_us();
            for record in records.drain(..) {
                self.buffered_bytes += record.payload.len() as u64;
                self.metrics
                    .bytes
                    .with_label_values(&[&*record.topic])
                    .inc_by(record.payload.len() as u64);
                if let Err(reason) = self.format.append(&record, ingested_at) {
                    tracing::debug!(topic = %record.topic, offset = record.offset, %reason, "dead letter");
                    self.dead_letters.push(&record, &reason, ingested_at);
                }
                self.current.insert(
                    position_key(&record.topic, record.partition),
                    (record.offset + 1).to_string(),
                );
            }
            if self.format.buffered_rows() >= FLUSH_ROWS {
                self.flush().await?;
            }
            if polled == Polled::Finished {
                self.checkpoint().await?;
                self.settle().await?;
                return Ok(self.summary);
            }
            if Instant::now() >= deadline || self.buffered_bytes >= self.config.max_buffered_bytes {
                self.checkpoint().await?;
                deadline = Instant::now() + self.config.interval;
            }
        }
    }

    /// Hands the rows buffered in the format to the writer task.
    async fn flush(&mut self) -> LakeResult<()> {
        let mut batches: Vec<(String, arrow_array::RecordBatch)> = Vec::new();
        if let Some(batch) = self.dead_letters.take() {
            batches.push((DEAD_LETTER.to_string(), batch));
        }
        batches.extend(
            self.format
                .take()
                .into_iter()
                .map(|(k, b)| (k.to_string(), b)),
        );
        self.writers.write(batches).await
    }

    /// Drops the uncommitted checkpoint: its rows and files.
    async fn abort(&mut self, why: &str) {
        if self.buffered_bytes > 0 || self.current != self.start {
            tracing::warn!(job = %self.config.name, why, "dropping the uncommitted checkpoint");
            self.metrics.aborted_checkpoints.inc();
        } else {
            tracing::info!(job = %self.config.name, why, "seeking again");
        }
        let _ = self.format.take();
        let _ = self.dead_letters.take();
        self.writers.abort().await;
        self.buffered_bytes = 0;
    }

    /// The barrier: closes the files of everything read so far and starts committing them as
    /// one checkpoint, after the previous checkpoint's commit has settled. Reading goes on
    /// while the commit runs (one commit in flight at a time).
    async fn checkpoint(&mut self) -> LakeResult<()> {
        if self.settle().await? {
            // The previous checkpoint was fenced: everything after it was dropped.
            return Ok(());
        }
        let began = Instant::now();
        self.flush().await?;
        let closed = self.writers.close().await?;
        let mut deltas = Vec::new();
        let mut rows = Vec::new();
        for (index, (table, (files, n))) in self.tables.iter().zip(closed).enumerate() {
            // The anchor is always committed; other tables only with new files.
            if index == 0 || !files.is_empty() {
                rows.push((table.ident.name().to_string(), n));
                deltas.push((
                    table.ident.clone(),
                    Delta {
                        data_files: files,
                        ..Default::default()
                    },
                ));
            }
        }
        self.buffered_bytes = 0;
        let has_files = deltas.iter().any(|(_, d)| !d.data_files.is_empty());
        if !has_files && self.current == self.start {
            return Ok(());
        }
        let marker = CommitMarker {
            job_id: self.config.name.clone(),
            writer: Some(self.writer_id.clone()),
            checkpoint_id: self.next_checkpoint,
            positions: Positions::new(),
        };
        self.next_checkpoint += 1;
        let (client, start, current) = (
            self.client.clone(),
            self.start.clone(),
            self.current.clone(),
        );
        let commit_deltas = deltas.clone();
        let task = tokio::spawn(async move {
            let began = Instant::now();
            commit_checkpoint_planned(
                &client,
                &marker,
                &commit_deltas,
                &RetryPolicy::default(),
                |base| {
                    let mut positions = base.map(|m| m.positions.clone()).unwrap_or_default();
                    for key in current.keys() {
                        if positions.get(key) != start.get(key) {
                            return Err(fenced(format!(
                                "partition {key} was committed by another writer (at {:?}, \
                                 this writer started at {:?})",
                                positions.get(key),
                                start.get(key)
                            )));
                        }
                    }
                    positions.extend(current.clone());
                    Ok(positions)
                },
            )
            .await
            .map(|report| (report, began.elapsed()))
        });
        self.in_flight = Some(InFlight {
            task,
            positions: self.current.clone(),
            deltas,
            rows,
            began,
        });
        Ok(())
    }

    /// Waits for the commit in flight, if any. Returns whether it was fenced (then everything
    /// read since was dropped and the partitions were sought again).
    async fn settle(&mut self) -> LakeResult<bool> {
        let Some(in_flight) = self.in_flight.take() else {
            return Ok(false);
        };
        let result = in_flight.task.await.map_err(|e| {
            LakeError::new(ErrorKind::Invalid, format!("the commit task failed: {e}"))
        })?;
        match result {
            Ok((report, commit_took)) => {
                self.metrics
                    .commit_seconds
                    .observe(commit_took.as_secs_f64());
                self.start = in_flight.positions;
                self.source.acknowledge(&self.start);
                self.metrics.checkpoints.inc();
                let took = in_flight.began.elapsed();
                self.metrics.checkpoint_seconds.observe(took.as_secs_f64());
                self.metrics.last_commit.set(now_us() / 1_000_000);
                for (partition, lag) in self.source.lag() {
                    self.metrics.lag.with_label_values(&[&partition]).set(lag);
                }
                self.summary.checkpoints += 1;
                let rows = &in_flight.rows;
                let dead_rows = rows.first().map_or(0, |(_, r)| *r);
                self.metrics.dead_letters.inc_by(dead_rows);
                self.summary.dead_letters += dead_rows;
                for (table, n) in rows {
                    self.metrics.rows.with_label_values(&[table]).inc_by(*n);
                    *self.summary.rows.entry(table.clone()).or_default() += n;
                }
                self.progress(rows, took, report.attempts);
                Ok(false)
            }
            Err(e) if e.kind() == ErrorKind::Fenced => {
                // Fenced: its files were never committed, and what was read after it builds
                // on positions that are not ours.
                for (ident, delta) in &in_flight.deltas {
                    let io = &self
                        .tables
                        .iter()
                        .find(|t| &t.ident == ident)
                        .expect("a table per delta")
                        .io;
                    for file in &delta.data_files {
                        let _ = io.delete(file.file_path()).await;
                    }
                }
                self.abort(&e.to_string()).await;
                self.recover().await?;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    fn progress(&self, rows: &[(String, u64)], took: Duration, attempts: u32) {
        let written: Vec<String> = rows
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| format!("{t} {n}"))
            .collect();
        tracing::info!(
            job = %self.config.name,
            checkpoint = self.summary.checkpoints,
            rows = ?written,
            millis = took.as_millis() as u64,
            attempts,
            "checkpoint committed"
        );
        if std::io::stderr().is_terminal() {
            eprintln!(
                "checkpoint {:>5}  {:>7} ms  {}",
                self.summary.checkpoints,
                took.as_millis(),
                if written.is_empty() {
                    "positions only".to_string()
                } else {
                    written.join(", ")
                }
            );
        }
    }
}
