//! The job loop — one for every job kind: read, route, write, and commit one checkpoint at a
//! time, exactly once.
//!
//! ```text
//!  Reader ──rows (per source partition)──> sinks (writer task: append | upsert) ──files──┐
//!    ^  seek(committed)      │ refused: dead letters → the anchor's sink                 │
//!    │                       └─ barrier: where the reader allows one ────────────────────┤
//!    └── acknowledge ── Committer: one fenced multi-table commit, the anchor always in it ┘
//! ```
//!
//! * **Recovery.** The positions come from the anchor (dead-letter) table's newest marker of
//!   the job, and the reader seeks there — the local state directory is never needed for it.
//! * **Checkpoint.** Every `interval` (or once `max_buffered_bytes` were read), where the
//!   reader allows a barrier (never inside a source transaction or an initial copy), the
//!   sinks hand over their files and the committer commits them with the positions. Reading
//!   goes on while that commit runs; the next barrier first waits for it (one commit in
//!   flight), and a finished commit is settled as soon as it is seen, so the source hears
//!   of it promptly.
//! * **Fencing** ([`crate::committer`]): a checkpoint whose partitions another writer moved is
//!   dropped and the partitions are sought again.
//! * **Rebalance.** When the source's partitions change, the uncommitted checkpoint is dropped
//!   (its files deleted) and every owned partition is sought to its committed position.
//! * **Streams and tables.** Each stream lands in its table, created on first use; a stream
//!   whose schema gains columns gets them added before rows carrying them are written.
//! * **Bad data** goes to the dead-letter table in the same checkpoint; the job goes on.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use floe_core::{Barrier, Committed, Polled, Positions, ReadItem, ReadOut, Reader, SourceError};
use floe_lake::marker::newest_marker;
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use iceberg::TableIdent;
use iceberg::io::FileIO;
use tokio_util::sync::CancellationToken;

use crate::committer::{Checkpoint, Committer, Part, Settled};
use crate::deadletter::{self, DeadLetters};
use crate::job::JobConfig;
use crate::landing::Landing;
use crate::metrics::JobMetrics;
use crate::sink::{Sink, SinkInput, SinkKind, Sinks};

/// Rows buffered in the reader before they are handed to the sinks.
const FLUSH_ROWS: usize = 64 * 1024;

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

/// A table a sink writes.
#[derive(Debug, Clone)]
struct Landed {
    ident: TableIdent,
    io: FileIO,
    /// The current schema's column names, to see when a stream gained some.
    columns: Vec<String>,
}

impl Landed {
    fn of(table: &LoadedTable) -> Self {
        Self {
            ident: table.ident.clone(),
            io: table.io.clone(),
            columns: column_names(table.metadata.current_schema()),
        }
    }
}

fn column_names(schema: &iceberg::spec::Schema) -> Vec<String> {
    schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

/// A running job.
pub struct Job<R: Reader> {
    config: JobConfig,
    client: CatalogClient,
    reader: R,
    metrics: JobMetrics,
    sinks: Sinks,
    committer: Committer,
    /// The table of each sink; `landed[0]` is the dead-letter (anchor) table.
    landed: Vec<Landed>,
    /// The sink of each reader stream, once its table exists.
    stream_sinks: Vec<Option<usize>>,
    /// The reader's streams version the sinks follow.
    streams_version: Option<u64>,
    dead_letters: DeadLetters,
    /// This writer's positions as last sought or committed.
    start: Positions,
    /// `reader.bytes_read()` at the last barrier.
    bytes_at_barrier: u64,
    summary: RunSummary,
}

impl<R: Reader> std::fmt::Debug for Job<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.config.name)
            .field("writer", &self.committer.writer())
            .finish_non_exhaustive()
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// A source failure as the job's error: retryable faults are unavailability, the rest the
/// input's or ours.
fn source_error(e: SourceError) -> LakeError {
    let kind = if e.retryable() {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Invalid
    };
    LakeError::new(kind, e.to_string())
}

impl<R: Reader> Job<R> {
    /// Creates the dead-letter (anchor) table and the tables of the streams known now.
    pub async fn open(
        config: JobConfig,
        client: CatalogClient,
        reader: R,
        metrics: JobMetrics,
    ) -> LakeResult<Self> {
        let (anchor, options) = deadletter::ensure_anchor(&client, &config).await?;
        let mut sinks = Sinks::start();
        let landed = vec![Landed::of(&anchor)];
        sinks
            .add(Sink::new(anchor, options, SinkKind::Append)?)
            .await?;
        let mut job = Self {
            committer: Committer::new(client.clone(), config.name.clone()),
            config,
            client,
            reader,
            metrics,
            sinks,
            landed,
            stream_sinks: Vec::new(),
            streams_version: None,
            dead_letters: DeadLetters::default(),
            start: Positions::new(),
            bytes_at_barrier: 0,
            summary: RunSummary::default(),
        };
        job.follow_streams().await?;
        Ok(job)
    }

    /// Creates the tables of streams that got a schema, and adds the columns a stream gained.
    async fn follow_streams(&mut self) -> LakeResult<()> {
        let version = self.reader.streams_version();
        if self.streams_version == Some(version) {
            return Ok(());
        }
        for (index, spec) in self.reader.streams().iter().enumerate() {
            let Some(schema) = &spec.schema else {
                continue;
            };
            if self.stream_sinks.len() <= index {
                self.stream_sinks.resize(index + 1, None);
            }
            let landing = Landing::of(&self.config, spec)?;
            match self.stream_sinks[index] {
                None => {
                    let table = landing
                        .ensure(&self.client, &self.config.catalog.namespace, schema)
                        .await?;
                    self.landed.push(Landed::of(&table));
                    let sink = self
                        .sinks
                        .add(Sink::new(table, landing.options, landing.kind)?)
                        .await?;
                    self.stream_sinks[index] = Some(sink);
                }
                Some(sink) => {
                    let columns = &self.landed[sink].columns;
                    let gained = column_names(schema).iter().any(|c| !columns.contains(c));
                    if gained {
                        let table = landing
                            .ensure(&self.client, &self.config.catalog.namespace, schema)
                            .await?;
                        self.landed[sink] = Landed::of(&table);
                        self.sinks.retable(sink, table).await?;
                    }
                }
            }
        }
        self.streams_version = Some(version);
        Ok(())
    }

    /// Seeks the reader to the job's committed positions.
    async fn recover(&mut self) -> LakeResult<()> {
        let anchor = self.client.load_table(&self.landed[0].ident).await?;
        let job = newest_marker(&anchor.metadata, &self.config.name).map(|f| f.marker.positions);
        // A table's own positions matter only when a catalog without multi-table commits may
        // have left it behind the anchor.
        let mut tables = Vec::new();
        if self.reader.wants_table_positions() && !self.client.supports_transactions() {
            for sink in &self.stream_sinks {
                tables.push(match sink {
                    Some(sink) => {
                        let table = self.client.load_table(&self.landed[*sink].ident).await?;
                        newest_marker(&table.metadata, &self.config.name)
                            .map(|f| f.marker.positions)
                    }
                    None => None,
                });
            }
        }
        let committed = Committed {
            job: job.clone(),
            tables,
        };
        self.reader.seek(&committed).await.map_err(source_error)?;
        // Fencing compares the anchor's values of the entries this writer holds.
        let job = job.unwrap_or_default();
        self.start = self
            .reader
            .positions()
            .keys()
            .filter_map(|k| job.get(k).map(|v| (k.clone(), v.clone())))
            .collect();
        self.bytes_at_barrier = self.reader.bytes_read();
        tracing::info!(
            job = %self.config.name,
            writer = %self.committer.writer(),
            positions = ?self.start,
            "reading from the committed positions"
        );
        Ok(())
    }

    /// Runs until `shutdown` is cancelled (then takes a final checkpoint) or a bounded source
    /// finishes.
    pub async fn run(mut self, shutdown: CancellationToken) -> LakeResult<RunSummary> {
        self.recover().await?;
        let mut deadline = Instant::now() + self.config.interval;
        let mut status_due = Instant::now();
        loop {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), Duration::from_millis(200));
            let polled = tokio::select! {
                polled = self.reader.read(wait) => polled,
                () = shutdown.cancelled() => {
                    self.stop().await?;
                    return Ok(self.summary);
                }
            };
            let polled = polled.map_err(source_error)?;
            if polled == Polled::Rebalanced {
                // A commit in flight lands (or not) before anything is sought again.
                self.settle().await?;
                self.abort("the partition assignment changed").await;
                self.recover().await?;
                continue;
            }
            self.follow_streams().await?;
            if self.committer.finished() {
                self.settle().await?;
            }
            if self.reader.buffered_rows() >= FLUSH_ROWS {
                self.flush().await?;
            }
            let barrier = self.reader.barrier();
            if polled == Polled::Finished && barrier != Barrier::NotNow {
                self.checkpoint().await?;
                self.settle().await?;
                return Ok(self.summary);
            }
            let due = Instant::now() >= deadline
                || self.reader.bytes_read() - self.bytes_at_barrier
                    >= self.config.max_buffered_bytes;
            if barrier == Barrier::Wanted || (due && barrier == Barrier::Allowed) {
                self.checkpoint().await?;
                deadline = Instant::now() + self.config.interval;
            }
            if Instant::now() >= status_due {
                self.refresh_status().await;
                status_due = Instant::now() + self.config.interval;
            }
        }
    }

    /// SIGTERM: a final checkpoint (unless the reader is where no barrier may go).
    async fn stop(&mut self) -> LakeResult<()> {
        if self.reader.barrier() == Barrier::NotNow {
            tracing::info!(
                job = %self.config.name,
                "stopping inside a source transaction or an initial copy; the next start reads it again"
            );
            self.settle().await?;
            return Ok(());
        }
        tracing::info!("stopping: taking a final checkpoint");
        self.checkpoint().await?;
        self.settle().await?;
        Ok(())
    }

    /// Reads the source's own gauges.
    async fn refresh_status(&mut self) {
        for (measure, value) in self.reader.status().await {
            self.metrics
                .source_status
                .with_label_values(&[measure])
                .set(value);
        }
    }

    /// Hands what the reader read to the sinks.
    async fn flush(&mut self) -> LakeResult<()> {
        let mut out = ReadOut::default();
        self.reader.take(&mut out);
        let ingested_at = now_us();
        for letter in &out.dead_letters {
            self.dead_letters.push(letter, ingested_at);
        }
        let mut inputs = Vec::with_capacity(out.items.len() + 1);
        if let Some(batch) = self.dead_letters.take() {
            inputs.push((0, SinkInput::Rows(batch)));
        }
        for item in out.items {
            let stream = match &item {
                ReadItem::Rows(rows) => rows.stream,
                ReadItem::Truncate(stream) => *stream,
            };
            let Some(sink) = self.stream_sinks.get(stream).copied().flatten() else {
                return Err(LakeError::new(
                    ErrorKind::Invalid,
                    format!("rows of stream {stream}, which has no table yet"),
                ));
            };
            inputs.push((
                sink,
                match item {
                    ReadItem::Rows(rows) => SinkInput::Rows(rows.batch),
                    ReadItem::Truncate(_) => SinkInput::Truncate,
                },
            ));
        }
        self.sinks.write(inputs).await
    }

    /// Drops the uncommitted checkpoint: its rows and files.
    async fn abort(&mut self, why: &str) {
        tracing::warn!(job = %self.config.name, why, "dropping what is not committed and seeking again");
        self.metrics.aborted_checkpoints.inc();
        let mut dropped = ReadOut::default();
        self.reader.take(&mut dropped);
        let _ = self.dead_letters.take();
        self.sinks.abort().await;
    }

    /// The barrier: closes the files of everything read so far and starts committing them as
    /// one checkpoint, after the previous checkpoint's commit has settled.
    async fn checkpoint(&mut self) -> LakeResult<()> {
        if self.settle().await? {
            // The previous checkpoint was fenced: everything after it was dropped.
            return Ok(());
        }
        let began = Instant::now();
        self.flush().await?;
        let closings = self.sinks.close().await?;
        self.bytes_at_barrier = self.reader.bytes_read();
        let parts = self
            .landed
            .iter()
            .zip(closings)
            .map(|(landed, closing)| Part {
                table: landed.ident.clone(),
                io: landed.io.clone(),
                closing,
            })
            .collect();
        self.committer.start(Checkpoint {
            parts,
            start: self.start.clone(),
            current: self.reader.positions(),
            began,
        });
        Ok(())
    }

    /// Waits for the commit in flight, if any. Returns whether it was fenced (then everything
    /// read since was dropped and the partitions were sought again).
    async fn settle(&mut self) -> LakeResult<bool> {
        match self.committer.settle().await? {
            Settled::Nothing => Ok(false),
            Settled::Committed(committed) => {
                self.metrics
                    .commit_seconds
                    .observe(committed.commit_took.as_secs_f64());
                self.start = committed.positions;
                self.reader.acknowledge(&self.start);
                self.metrics.checkpoints.inc();
                self.metrics
                    .checkpoint_seconds
                    .observe(committed.took.as_secs_f64());
                self.metrics.last_commit.set(now_us() / 1_000_000);
                for (partition, lag) in self.reader.lag() {
                    self.metrics.lag.with_label_values(&[&partition]).set(lag);
                }
                self.summary.checkpoints += 1;
                let dead_rows = committed.rows.first().map_or(0, |(_, r)| *r);
                self.metrics.dead_letters.inc_by(dead_rows);
                self.summary.dead_letters += dead_rows;
                for (table, n) in &committed.rows {
                    self.metrics.rows.with_label_values(&[table]).inc_by(*n);
                    *self.summary.rows.entry(table.clone()).or_default() += n;
                }
                self.progress(
                    &committed.rows,
                    committed.id,
                    committed.took,
                    committed.attempts,
                );
                Ok(false)
            }
            Settled::Fenced(why) => {
                self.abort(&why).await;
                self.recover().await?;
                Ok(true)
            }
        }
    }

    fn progress(&self, rows: &[(String, u64)], checkpoint: u64, took: Duration, attempts: u32) {
        let written: Vec<String> = rows
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| format!("{t} {n}"))
            .collect();
        tracing::info!(
            job = %self.config.name,
            checkpoint,
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
