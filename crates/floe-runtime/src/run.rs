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
//! * **Threads.** The reader decodes on the loop; the operators run on the pipeline thread
//!   ([`crate::pipeline_thread`]), whose replies the loop lands in order (exchanges, sinks);
//!   anything that must not see later rows waits for every reply first.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floe_core::{
    Barrier, Committed, DeadLetter, Polled, Positions, ReadItem, ReadOut, Reader, SourceError,
    StreamSpec, partition_of_entry,
};
use floe_lake::marker::{landed_by_other_job, newest_marker};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use iceberg::TableIdent;
use iceberg::io::FileIO;
use tokio_util::sync::CancellationToken;

use crate::committer::{Checkpoint, Committer, Part, Settled};
use crate::deadletter::{self, DeadLetters};
use crate::exchange::Outbound;
use crate::job::JobConfig;
use crate::landing::Landing;
use crate::metrics::JobMetrics;
use crate::mirror::{MirrorSink, Mirrors};
use crate::pipeline::Routed;
use crate::pipeline_thread::{IN_FLIGHT, LOAD_CHUNK, PipelineThread, Reply, Sealed, Status};
use crate::sink::{Sink, SinkInput, SinkKind, Sinks};
use crate::state_table;

/// How often operators see processing time pass.
const TICK: Duration = Duration::from_secs(1);

pub use floe_core::rollup::WATERMARK;

/// Settings of a run beyond the job file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Stateful operators whose committed state may be dropped because the job file removed
    /// or reshaped them (`--allow-state-reset ID`).
    pub allow_state_reset: Vec<String>,
    /// Streams whose committed table is renamed to the name the job file now gives it
    /// (`--rename-table STREAM`), instead of refusing the edit.
    pub rename_tables: Vec<String>,
    /// Streams the job committed but no longer reads, to stop following deliberately
    /// (`--stop-following STREAM`); their tables stay as they are.
    pub stop_following: Vec<String>,
}

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
    /// The sink of each stream that lands, once its table exists.
    stream_sinks: HashMap<String, usize>,
    /// The reader's streams (their names by index), as last followed.
    reader_streams: Vec<StreamSpec>,
    /// The reader's streams version the sinks follow.
    streams_version: Option<u64>,
    /// The operators, on their own thread.
    pipeline: PipelineThread,
    /// The last barrier's outcome, until its checkpoint takes it.
    sealed: Option<Sealed>,
    /// The operators' outputs, as the last build answered.
    built: Option<Vec<StreamSpec>>,
    /// The operators' status as of the last barrier.
    status: Status,
    /// The state table's sink (stateful jobs).
    state_sink: Option<usize>,
    options: RunOptions,
    /// The operators' fingerprints the job's newest commit holds.
    committed_operators: BTreeMap<String, String>,
    /// The streams the job's commits landed, and their tables (see [`Job::check_landing`]).
    committed_streams: BTreeMap<String, String>,
    /// The streams this writer lands now, and their tables.
    landed_streams: BTreeMap<String, String>,
    /// Rows of removed or reshaped operators to delete from the state table.
    state_resets: Vec<(String, String, Vec<u8>)>,
    last_tick: Instant,
    dead_letters: DeadLetters,
    /// This writer's positions as last sought or committed.
    start: Positions,
    /// `reader.bytes_read()` at the last barrier.
    bytes_at_barrier: u64,
    /// Where the pipeline's exchanges write (their rows are read back by the reader).
    outbound: Option<Outbound>,
    /// The sinks that mirror committed tables elsewhere.
    mirrors: Mirrors,
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
        Self::open_with(config, client, reader, metrics, RunOptions::default()).await
    }

    /// [`open`](Self::open) with run options.
    pub async fn open_with(
        config: JobConfig,
        client: CatalogClient,
        reader: R,
        metrics: JobMetrics,
        options: RunOptions,
    ) -> LakeResult<Self> {
        let (anchor, anchor_options) = deadletter::ensure_anchor(&client, &config).await?;
        let committed_streams = newest_marker(&anchor.metadata, &config.name)
            .map(|found| found.marker.streams)
            .unwrap_or_default();
        let mut sinks = Sinks::start(
            metrics.writer_busy.clone(),
            metrics.writer_backpressure.clone(),
        );
        let mut landed = vec![Landed::of(&anchor)];
        sinks
            .add(Sink::new(anchor, anchor_options, SinkKind::Append)?)
            .await?;
        let stateful = config.pipeline.operators.iter().any(|o| o.stateful());
        let store = if stateful {
            let dir = config.state_dir.join("rocksdb");
            let store = floe_state::StateStore::open(&dir, config.state_memory as usize)
                .map_err(|e| LakeError::new(ErrorKind::Unavailable, e.to_string()))?;
            // Another replica on this host may hold `rocksdb`: then this one takes `rocksdb.2`…
            tracing::info!(job = %config.name, dir = %store.dir().display(), "local operator state");
            Some(store)
        } else {
            None
        };
        let pipeline = PipelineThread::start(config.pipeline.operators.clone(), store);
        let mut state_sink = None;
        if stateful {
            let spec = state_table::spec(&config.state_table);
            let landing = Landing::of(&config, &spec)?;
            let table = landing
                .ensure(
                    &client,
                    &config.catalog.namespace,
                    spec.schema.as_ref().expect("a schema"),
                )
                .await?;
            landed.push(Landed::of(&table));
            state_sink = Some(
                sinks
                    .add(Sink::new(table, landing.options, landing.kind)?)
                    .await?,
            );
        }
        let mut job = Self {
            committer: Committer::new(client.clone(), config.name.clone()),
            config,
            client,
            reader,
            metrics,
            sinks,
            landed,
            stream_sinks: HashMap::new(),
            reader_streams: Vec::new(),
            streams_version: None,
            pipeline,
            sealed: None,
            built: None,
            status: Status::default(),
            state_sink,
            options,
            committed_operators: BTreeMap::new(),
            committed_streams,
            landed_streams: BTreeMap::new(),
            state_resets: Vec::new(),
            last_tick: Instant::now(),
            dead_letters: DeadLetters::default(),
            start: Positions::new(),
            bytes_at_barrier: 0,
            outbound: None,
            mirrors: Mirrors::default(),
            summary: RunSummary::default(),
        };
        job.follow_streams().await?;
        job.check_left_streams()?;
        Ok(job)
    }

    /// The producer of the pipeline's exchanges (a job with an exchange needs it; the reader
    /// must read the exchanges' topics back, see [`crate::exchange`]).
    pub fn with_exchanges(mut self, outbound: Outbound) -> Self {
        self.outbound = Some(outbound);
        self
    }

    /// The sinks that mirror the job's committed tables to other systems
    /// ([`crate::mirror`]); their streams must land.
    pub fn with_mirrors(mut self, sinks: Vec<MirrorSink>) -> Self {
        self.mirrors = Mirrors::new(sinks);
        self
    }

    /// Collects a finished delivery round; starts the next one when a commit landed since.
    async fn mirror(&mut self) {
        if self.mirrors.is_empty() {
            return;
        }
        self.mirrors.collect(&self.metrics).await;
        if !self.mirrors.ready() {
            return;
        }
        let held = self.held_partitions();
        let first = self.reader.partition_name(0);
        let (landed, sinks) = (&self.landed, &self.stream_sinks);
        self.mirrors
            .start(&self.client, &self.config.name, &held, &first, |stream| {
                sinks.get(stream).map(|i| landed[*i].ident.clone())
            });
    }

    /// Delivers everything committed so far (stopping): the round in flight, then one more.
    async fn drain_mirrors(&mut self) {
        if self.mirrors.is_empty() {
            return;
        }
        self.mirrors.finish(&self.metrics).await;
        self.mirror().await;
        self.mirrors.finish(&self.metrics).await;
    }

    /// Sends the rows routed to exchanges to their topics.
    async fn exchange(&mut self, routed: &mut Routed) -> LakeResult<()> {
        if routed.exchanged.is_empty() {
            return Ok(());
        }
        let Some(outbound) = self.outbound.as_mut() else {
            return Err(LakeError::new(
                ErrorKind::Invalid,
                "the pipeline has an exchange but the job no exchange producer",
            ));
        };
        let reader = &self.reader;
        let names = |p: u32| reader.partition_name(p);
        for (id, batch) in std::mem::take(&mut routed.exchanged) {
            let records = outbound
                .records(&id, &batch, &names)
                .map_err(|e| LakeError::new(ErrorKind::Invalid, format!("exchange {id}: {e}")))?;
            outbound.send(&id, records).await.map_err(source_error)?;
        }
        Ok(())
    }

    /// Builds the operators whose input became known, creates the tables of streams that
    /// land, and adds the columns a stream gained.
    async fn follow_streams(&mut self) -> LakeResult<()> {
        let version = self.reader.streams_version();
        if self.streams_version == Some(version) {
            return Ok(());
        }
        self.reader_streams = self.reader.streams();
        // Rows read before land first: a table may gain columns below.
        self.pipeline.build(self.reader_streams.clone())?;
        self.pump(0).await?;
        let outputs = self
            .built
            .take()
            .ok_or_else(|| LakeError::new(ErrorKind::Invalid, "the pipeline did not build"))?;
        let mut specs = self.reader_streams.clone();
        specs.extend(outputs);
        for spec in &specs {
            let Some(schema) = &spec.schema else {
                continue;
            };
            if !self.config.lands(&spec.name) {
                continue;
            }
            let landing = Landing::of(&self.config, spec)?;
            match self.stream_sinks.get(&spec.name).copied() {
                None => {
                    self.check_landing(&spec.name, &landing.name).await?;
                    let table = landing
                        .ensure(&self.client, &self.config.catalog.namespace, schema)
                        .await?;
                    if spec.changelog {
                        self.check_owner(&table)?;
                    }
                    self.landed.push(Landed::of(&table));
                    self.landed_streams
                        .insert(spec.name.clone(), table.ident.name().to_string());
                    let sink = self
                        .sinks
                        .add(Sink::new(table, landing.options, landing.kind)?)
                        .await?;
                    self.stream_sinks.insert(spec.name.clone(), sink);
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

    /// A keyed table another job lands, and this one never committed to, is refused: a job
    /// renamed in its file starts over (a new slot or consumer group, a new snapshot) and
    /// would land every row a second time next to the old job's.
    fn check_owner(&self, table: &LoadedTable) -> LakeResult<()> {
        let Some(other) = landed_by_other_job(&table.metadata, &self.config.name) else {
            return Ok(());
        };
        Err(LakeError::new(
            ErrorKind::Invalid,
            format!(
                "{}: table {} is landed by job {other:?}, and job {:?} never committed to it; a \
                 renamed job starts over and would land its rows twice. Keep name = {other:?} \
                 in the job file, or land this job in other tables",
                self.config.file, table.ident, self.config.name
            ),
        ))
    }

    /// A stream the job's commits landed in one table must not start landing in another (a
    /// renamed `[tables."…"]` section, a changed default): that would fork its history into two
    /// tables, the old one silently left behind. Refused with the place, unless the stream is in
    /// `--rename-table`, which renames the committed table to the new name first.
    async fn check_landing(&mut self, stream: &str, table: &str) -> LakeResult<()> {
        let Some(committed) = self.committed_streams.get(stream).cloned() else {
            return Ok(());
        };
        if committed == table {
            return Ok(());
        }
        if !self.options.rename_tables.iter().any(|s| s == stream) {
            let place = self
                .config
                .table(stream)
                .map_or(self.config.file.clone(), |t| t.place.clone());
            return Err(LakeError::new(
                ErrorKind::Invalid,
                format!(
                    "{place}: stream {stream} landed in table {committed} in the job's commits, \
                     and the job file now lands it in {table}: that would start a second table \
                     and leave {committed} behind. Set name = \"{committed}\" in \
                     [tables.\"{stream}\"] to keep it, or run once with --rename-table \
                     {stream} to rename {committed} to {table}"
                ),
            ));
        }
        let namespace = iceberg::NamespaceIdent::new(self.config.catalog.namespace.clone());
        let from = TableIdent::new(namespace.clone(), committed.clone());
        let to = TableIdent::new(namespace, table.to_string());
        self.client.rename_table(&from, &to).await.map_err(|e| {
            LakeError::new(
                e.kind(),
                format!("--rename-table {stream}: renaming {committed} to {table}: {e}"),
            )
        })?;
        tracing::warn!(%stream, from = %committed, to = %table, "renamed the stream's table (--rename-table)");
        self.committed_streams
            .insert(stream.to_string(), table.to_string());
        Ok(())
    }

    /// A stream the job's commits landed that the job no longer reads (a table taken out of a
    /// CDC job's `tables`) is refused, unless it is in `--stop-following`. Only readers that
    /// know all their streams from the start are checked (a Debezium job meets its topics as
    /// they come).
    fn check_left_streams(&mut self) -> LakeResult<()> {
        if !self.reader.knows_all_streams() {
            return Ok(());
        }
        let mut problems = Vec::new();
        let left: Vec<(String, String)> = self
            .committed_streams
            .iter()
            .filter(|(stream, _)| !self.landed_streams.contains_key(*stream))
            .map(|(s, t)| (s.clone(), t.clone()))
            .collect();
        for (stream, table) in left {
            if self.options.stop_following.contains(&stream) {
                tracing::warn!(%stream, %table, "no longer following the stream (--stop-following); its table stays as it is");
                self.committed_streams.remove(&stream);
            } else {
                problems.push(format!(
                    "{}: the job's commits follow stream {stream} (into table {table}), but the \
                     job no longer reads it; put it back, or run once with --stop-following \
                     {stream} to stop following it ({table} then stays as it is)",
                    self.config.file
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(LakeError::new(ErrorKind::Invalid, problems.join("\n")))
        }
    }

    /// The streams the next commit records: every one committed so far and this writer's.
    fn streams_to_commit(&self) -> BTreeMap<String, String> {
        let mut streams = self.committed_streams.clone();
        streams.extend(self.landed_streams.clone());
        streams
    }

    /// Checks the job file's stateful operators against the state the job committed: a
    /// removed or reshaped operator is refused unless its state may be reset.
    fn check_operators(
        &mut self,
        committed: &BTreeMap<String, String>,
    ) -> LakeResult<BTreeSet<String>> {
        let now = self.pipeline.fingerprints();
        let mut reset = BTreeSet::new();
        let mut problems = Vec::new();
        for (id, fingerprint) in committed {
            let change = match now.get(id) {
                None => "the job file no longer has it".to_string(),
                Some(f) if f != fingerprint => {
                    let place = self
                        .pipeline
                        .configs()
                        .iter()
                        .find(|c| &c.id == id)
                        .map(|c| c.place.clone())
                        .unwrap_or_default();
                    format!("{place}: its configuration changed what its state means")
                }
                Some(_) => continue,
            };
            if self.options.allow_state_reset.contains(id) {
                tracing::warn!(operator = %id, %change, "dropping the operator's committed state (--allow-state-reset)");
                reset.insert(id.clone());
            } else {
                problems.push(format!(
                    "stateful operator {id}: {change} (committed state: {fingerprint}); keep its \
                     id and settings, or run with --allow-state-reset {id} to start it over"
                ));
            }
        }
        if problems.is_empty() {
            Ok(reset)
        } else {
            Err(LakeError::new(ErrorKind::Invalid, problems.join("\n")))
        }
    }

    /// The partitions this writer reads, by name: the scope of its fencing, state and clocks.
    fn held_partitions(&self) -> BTreeSet<String> {
        self.reader
            .positions()
            .keys()
            .map(|k| partition_of_entry(k).to_string())
            .collect()
    }

    /// Loads the committed state of the partitions this writer reads.
    async fn restore_state(&mut self, reset: &BTreeSet<String>) -> LakeResult<()> {
        let Some(sink) = self.state_sink else {
            return Ok(());
        };
        self.pipeline.clear()?;
        let owned: Vec<String> = self.held_partitions().into_iter().collect();
        let began = Instant::now();
        let table = self.client.load_table(&self.landed[sink].ident).await?;
        let ids = self.pipeline.ids();
        let (reader, pipeline, resets) =
            (&mut self.reader, &mut self.pipeline, &mut self.state_resets);
        let mut rows = Vec::new();
        let count = state_table::read(&table, &owned, |operator, partition, key, value| {
            if reset.contains(operator) {
                resets.push((operator.to_string(), partition.to_string(), key.to_vec()));
                return Ok(());
            }
            let (Some(op), Some(p)) = (
                ids.iter().position(|i| i == operator),
                reader.partition_index(partition),
            ) else {
                return Ok(());
            };
            rows.push((op as u16, p, key.to_vec(), value.to_vec()));
            if rows.len() >= LOAD_CHUNK {
                pipeline.load(std::mem::take(&mut rows))?;
            }
            Ok(())
        })
        .await?;
        self.pipeline.load(rows)?;
        let partitions: Vec<u32> = owned
            .iter()
            .filter_map(|name| self.reader.partition_index(name))
            .collect();
        let (reader, pipeline) = (&self.reader, &mut self.pipeline);
        pipeline.restored(partitions, &|p| reader.partition_name(p))?;
        self.pump(0).await?;
        self.metrics
            .state_restore_seconds
            .observe(began.elapsed().as_secs_f64());
        tracing::info!(
            job = %self.config.name,
            partitions = owned.len(),
            rows = count,
            millis = began.elapsed().as_millis() as u64,
            "operator state restored"
        );
        Ok(())
    }

    /// Seeks the reader to the job's committed positions.
    async fn recover(&mut self) -> LakeResult<()> {
        let anchor = self.client.load_table(&self.landed[0].ident).await?;
        let newest = newest_marker(&anchor.metadata, &self.config.name).map(|f| f.marker);
        let operators = newest
            .as_ref()
            .map(|m| m.operators.clone())
            .unwrap_or_default();
        let job = newest.map(|m| m.positions);
        // A table's own positions matter only when a catalog without multi-table commits may
        // have left it behind the anchor.
        let mut tables = Vec::new();
        if self.reader.wants_table_positions() && !self.client.supports_transactions() {
            for stream in &self.reader_streams {
                tables.push(match self.stream_sinks.get(&stream.name) {
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
        if let Some(outbound) = self.outbound.as_mut() {
            outbound.restore(job.as_ref());
        }
        self.mirrors.recover(job.as_ref(), &self.metrics).await;
        let reset = self.check_operators(&operators)?;
        self.committed_operators = operators;
        // Fencing compares the anchor's values of every entry of the partitions this writer
        // holds (positions, sequence watermarks, operators' watermarks).
        let job = job.unwrap_or_default();
        let held = self.held_partitions();
        self.start = job
            .iter()
            .filter(|(k, _)| held.contains(partition_of_entry(k)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.restore_state(&reset).await?;
        self.mirrors.due();
        self.mirror().await;
        self.bytes_at_barrier = self.reader.bytes_read();
        tracing::info!(
            job = %self.config.name,
            writer = %self.committer.writer(),
            positions = ?self.start,
            "reading from the committed positions"
        );
        self.metrics.ready.set(true);
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
            self.mirror().await;
            if self.reader.buffered_rows() >= FLUSH_ROWS {
                self.flush().await?;
            }
            let barrier = self.reader.barrier();
            if polled == Polled::Finished && barrier != Barrier::NotNow {
                self.checkpoint().await?;
                self.settle().await?;
                self.drain_mirrors().await;
                return Ok(self.summary);
            }
            let due = Instant::now() >= deadline
                || self.reader.bytes_read() - self.bytes_at_barrier
                    >= self.config.max_buffered_bytes;
            // A wanted barrier is taken once no commit is in flight: the reader asks until a
            // commit holds what it wanted committed.
            let wanted = barrier == Barrier::Wanted && self.committer.idle();
            if wanted || (due && barrier != Barrier::NotNow) {
                self.checkpoint().await?;
                deadline = Instant::now() + self.config.interval;
            }
            if self.last_tick.elapsed() >= TICK {
                self.tick().await?;
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
            self.drain_mirrors().await;
            return Ok(());
        }
        tracing::info!("stopping: taking a final checkpoint");
        self.checkpoint().await?;
        self.settle().await?;
        self.drain_mirrors().await;
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

    /// Processing time passed for the operators (idleness, processing-time timers).
    async fn tick(&mut self) -> LakeResult<()> {
        self.last_tick = Instant::now();
        self.pipeline.tick(now_us() / 1000)?;
        self.pump(IN_FLIGHT).await
    }

    /// Lands the pipeline's replies, in order: every one there now, after waiting until at
    /// most `until` are still pending.
    async fn pump(&mut self, until: usize) -> LakeResult<()> {
        loop {
            let reply = if self.pipeline.pending() > until {
                self.pipeline.next().await?
            } else {
                self.pipeline.ready()?
            };
            match reply {
                None => return Ok(()),
                Some(Reply::Routed(routed)) => self.deliver(routed).await?,
                Some(Reply::Sealed(routed, sealed)) => {
                    self.deliver(routed).await?;
                    self.sealed = Some(*sealed);
                }
                Some(Reply::Built(outputs)) => self.built = Some(outputs),
                Some(Reply::Done) => {}
            }
        }
    }

    /// Waits for every pending reply and drops it: what is not committed is being dropped.
    async fn discard(&mut self) {
        while self.pipeline.pending() > 0 {
            if let Err(e) = self.pipeline.next().await {
                tracing::warn!(error = %e, "the operators failed on rows being dropped");
            }
        }
        self.sealed = None;
        self.built = None;
    }

    /// Sends routed rows to their exchanges and sinks.
    async fn deliver(&mut self, mut routed: Routed) -> LakeResult<()> {
        self.exchange(&mut routed).await?;
        let inputs = self.land(routed)?;
        self.sinks.write(inputs).await
    }

    /// The sink inputs of routed rows; refused rows become dead letters.
    fn land(&mut self, routed: Routed) -> LakeResult<Vec<(usize, SinkInput)>> {
        let ingested_at = now_us();
        for dead in routed.dead {
            let name = self.reader.partition_name(dead.partition);
            let (topic, partition) = match name.rsplit_once('/') {
                Some((t, p)) => (t.to_string(), p.parse().unwrap_or(-1)),
                None => (name.clone(), -1),
            };
            let letter = DeadLetter {
                topic: Arc::from(topic.as_str()),
                partition,
                offset: dead.offset,
                raw: dead.row.into_bytes(),
                reason: dead.reason,
            };
            self.dead_letter(&letter, ingested_at);
        }
        let mut inputs = Vec::with_capacity(routed.rows.len() + 1);
        if let Some(batch) = self.dead_letters.take() {
            inputs.push((0, SinkInput::Rows(batch)));
        }
        for stream in routed.truncates {
            if let Some(sink) = self.stream_sinks.get(&stream) {
                inputs.push((*sink, SinkInput::Truncate));
            }
        }
        for (stream, rows) in routed.rows {
            match self.stream_sinks.get(&stream) {
                Some(sink) => inputs.push((*sink, SinkInput::Rows(rows.batch))),
                None if !self.config.lands(&stream) => {}
                None => {
                    return Err(LakeError::new(
                        ErrorKind::Invalid,
                        format!("rows of stream {stream}, which has no table yet"),
                    ));
                }
            }
        }
        Ok(inputs)
    }

    /// Buffers a dead letter for the checkpoint, and shows it on the status page.
    fn dead_letter(&mut self, letter: &DeadLetter, ingested_at: i64) {
        self.metrics.page.dead_letter(letter);
        self.dead_letters.push(letter, ingested_at);
    }

    /// Hands what the reader read to the operators and the sinks.
    async fn flush(&mut self) -> LakeResult<()> {
        let mut out = ReadOut::default();
        self.reader.take(&mut out);
        let ingested_at = now_us();
        for letter in &out.dead_letters {
            self.dead_letter(letter, ingested_at);
        }
        let mut items = Vec::with_capacity(out.items.len());
        for item in out.items {
            let stream = match &item {
                ReadItem::Rows(rows) => rows.stream,
                ReadItem::Truncate(stream) | ReadItem::Clock { stream, .. } => *stream,
            };
            let Some(name) = self.reader_streams.get(stream).map(|s| s.name.clone()) else {
                return Err(LakeError::new(
                    ErrorKind::Invalid,
                    format!("rows of stream {stream}, which the reader did not declare"),
                ));
            };
            items.push((name, item));
        }
        if !items.is_empty() {
            let (reader, pipeline) = (&self.reader, &mut self.pipeline);
            pipeline.items(items, &|p| reader.partition_name(p))?;
        }
        self.pump(IN_FLIGHT).await
    }

    /// Drops the uncommitted checkpoint: its rows and files.
    async fn abort(&mut self, why: &str) {
        tracing::warn!(job = %self.config.name, why, "dropping what is not committed and seeking again");
        self.metrics.aborted_checkpoints.inc();
        self.metrics.show_checkpoint(
            0,
            (Duration::ZERO, Duration::ZERO),
            0,
            format!("dropped: {why}"),
            None,
        );
        let mut dropped = ReadOut::default();
        self.reader.take(&mut dropped);
        self.discard().await;
        let _ = self.dead_letters.take();
        self.sinks.abort().await;
        if let Some(outbound) = &self.outbound {
            outbound.forget();
        }
        // The operators' state goes back to the committed one when the partitions are
        // sought again (recover restores it).
        if let Err(e) = self.pipeline.clear() {
            tracing::warn!(error = %e, "could not clear the operators' state");
        }
        self.discard().await;
    }

    /// The barrier: closes the files of everything read so far and starts committing them as
    /// one checkpoint, after the previous checkpoint's commit has settled.
    async fn checkpoint(&mut self) -> LakeResult<()> {
        let paused = Instant::now();
        if self.settle().await? {
            // The previous checkpoint was fenced: everything after it was dropped.
            return Ok(());
        }
        // Other replicas may have committed rows a sink of this one delivers.
        self.mirrors.due();
        let began = Instant::now();
        self.flush().await?;
        // Everything read before the barrier lands before it (the replies come in order).
        self.pipeline.barrier()?;
        self.pump(0).await?;
        let operators_done = Instant::now();
        let Sealed { epoch, status } = self
            .sealed
            .take()
            .ok_or_else(|| LakeError::new(ErrorKind::Invalid, "the barrier was not answered"))?;
        self.status = status;
        let mut inputs = Vec::new();
        let epoch = match epoch {
            Some((epoch, changes)) => {
                let ids = self.pipeline.ids();
                let names = |p: u32| self.reader.partition_name(p);
                let resets = std::mem::take(&mut self.state_resets);
                let (batch, bytes) = state_table::changes_batch(&changes, &resets, &ids, &names);
                self.metrics.state_checkpoint_bytes.set(bytes as i64);
                self.metrics
                    .state_checkpoint_keys
                    .set((changes.len() + resets.len()) as i64);
                if let (Some(batch), Some(sink)) = (batch, self.state_sink) {
                    inputs.push((sink, SinkInput::Rows(batch)));
                }
                Some(epoch)
            }
            None => None,
        };
        self.sinks.write(inputs).await?;
        let closings = self.sinks.close().await?;
        let writers_done = Instant::now();
        let held = self.held_partitions();
        // The checkpoint's exchange records — and its sources' clocks — are in their topics
        // before it commits.
        if let Some(outbound) = self.outbound.as_mut() {
            let names = |p: u32| self.reader.partition_name(p);
            outbound.advance(&self.status.frontiers, &names);
            outbound.send_clocks(&held).await.map_err(source_error)?;
            let landed = outbound.flush().await.map_err(source_error)?;
            self.metrics.exchange_records.inc_by(landed);
        }
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
        let mut current = self.reader.positions();
        if let Some(outbound) = &self.outbound {
            current.extend(outbound.positions(&held));
        }
        self.mirrors.collect(&self.metrics).await;
        current.extend(self.mirrors.positions());
        for (operator, marks) in &self.status.watermarks {
            for (p, watermark) in marks {
                let partition = self.reader.partition_name(*p);
                if held.contains(&partition) {
                    current.insert(
                        format!("{partition}{WATERMARK}{operator}"),
                        watermark.to_string(),
                    );
                }
            }
        }
        let operators = self.pipeline.fingerprints();
        let streams = self.streams_to_commit();
        let force = operators != self.committed_operators || streams != self.committed_streams;
        self.committer.start(Checkpoint {
            parts,
            start: self.start.clone(),
            current,
            began,
            epoch,
            operators,
            streams,
            forgotten: self.options.stop_following.clone(),
            force,
        });
        let done = Instant::now();
        self.metrics
            .barrier_seconds
            .observe((done - paused).as_secs_f64());
        tracing::debug!(
            job = %self.config.name,
            settle_ms = (began - paused).as_millis() as u64,
            operators_ms = (operators_done - began).as_millis() as u64,
            writers_ms = (writers_done - operators_done).as_millis() as u64,
            exchange_ms = (done - writers_done).as_millis() as u64,
            "barrier: reading paused"
        );
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
                self.mirrors.due();
                if let Some(epoch) = committed.epoch {
                    self.pipeline.committed(epoch)?;
                }
                self.committed_operators = self.pipeline.fingerprints();
                self.committed_streams = committed.streams;
                self.observe_operators();
                self.metrics.checkpoints.inc();
                self.metrics
                    .checkpoint_seconds
                    .observe(committed.took.as_secs_f64());
                self.metrics.last_commit.set(now_us() / 1_000_000);
                for (partition, lag) in self.reader.lag() {
                    self.metrics.lag.with_label_values(&[&partition]).set(lag);
                }
                self.summary.checkpoints += 1;
                self.metrics.show_checkpoint(
                    committed.id,
                    (committed.took, committed.commit_took),
                    committed.rows.iter().map(|(_, n)| n).sum(),
                    "committed".into(),
                    Some(&self.start),
                );
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

    /// Operator and state gauges for `/metrics`.
    fn observe_operators(&self) {
        for (id, stats) in &self.status.stats {
            let m = &self.metrics;
            m.open_windows
                .with_label_values(&[&id])
                .set(stats.open_windows as i64);
            m.late_rows
                .with_label_values(&[&id])
                .set(stats.late_rows as i64);
            m.timers.with_label_values(&[&id]).set(stats.timers as i64);
            if let Some(split) = stats.split_traces {
                m.split_traces.with_label_values(&[&id]).set(split as i64);
            }
        }
        if let Some((keys, bytes)) = self.status.state_size {
            self.metrics.state_keys.set(keys as i64);
            self.metrics.state_bytes.set(bytes as i64);
        }
        let now = now_us();
        for (operator, marks) in &self.status.watermarks {
            for (p, watermark) in marks {
                let partition = self.reader.partition_name(*p);
                self.metrics
                    .watermark_lag
                    .with_label_values(&[operator, &partition])
                    .set((now.saturating_sub(*watermark) / 1000).max(0));
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
