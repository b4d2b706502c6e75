//! The change-data-capture job loop: a [`ChangeSource`] kept equal, table by table, to Iceberg
//! tables whose identifier fields are the source key — exactly once.
//!
//! * **Recovery.** Each table's newest marker of the job holds the source position its data
//!   reaches; the source resumes from there and skips, per table, what a table already holds.
//!   Nothing local is needed.
//! * **Initial snapshot** (no commit yet): the source's copy is written straight to data files
//!   and committed as one checkpoint that also empties each table (a table left by an earlier,
//!   unfinished attempt holds nothing of it afterwards) — the snapshot appears whole or not at
//!   all.
//! * **Checkpoint.** Every `interval`, or once `max_buffered_bytes` of changes are buffered,
//!   at a source transaction boundary: per table, one row delta — equality deletes for keys
//!   that may exist in older data, the final image of every live key as new data, and a
//!   truncate when the source emptied the table — and all tables (the dead-letter anchor
//!   first) in **one** multi-table commit with the marker `{job, writer, checkpoint,
//!   positions}`. A source transaction is therefore never half-visible. Only after the commit
//!   is the source told (Postgres: the slot's flush position).
//! * **Schema changes.** Columns the source gained are added to the Iceberg table before the
//!   checkpoint that first carries them; a change the source cannot follow stops the job
//!   before anything after it is committed.

use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use floe_core::{ChangeSource, ChangeStart, Positions, TableChanges};
use floe_lake::commit::{RetryPolicy, commit_checkpoint};
use floe_lake::marker::{CommitMarker, newest_marker};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::snapshot::Delta;
use floe_lake::writer::{DataWriter, EqualityDeleteWriter, WriterOptions, equality_delete_input};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use tokio_util::sync::CancellationToken;

use crate::deadletter;
use crate::job::{JobConfig, PartitionField};
use crate::metrics::JobMetrics;
use crate::run::RunSummary;
use crate::tables::{Wanted, arrow_schema, conform, ensure_table, writer_options};

/// A followed table: its Iceberg table and writer settings.
struct Followed {
    table: LoadedTable,
    options: WriterOptions,
    key: Vec<String>,
    partition: Vec<PartitionField>,
    properties: std::collections::BTreeMap<String, String>,
    name: String,
}

/// A running change-data-capture job.
pub struct ChangeJob<S: ChangeSource> {
    config: JobConfig,
    client: CatalogClient,
    source: S,
    metrics: JobMetrics,
    writer_id: String,
    next_checkpoint: u64,
    anchor: LoadedTable,
    tables: Vec<Followed>,
    committed: Option<Positions>,
    summary: RunSummary,
}

impl<S: ChangeSource> std::fmt::Debug for ChangeJob<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeJob")
            .field("name", &self.config.name)
            .field("tables", &self.tables.len())
            .finish_non_exhaustive()
    }
}

fn source_error(e: floe_core::SourceError) -> LakeError {
    LakeError::new(ErrorKind::Unavailable, e.0)
}

impl<S: ChangeSource> ChangeJob<S> {
    /// Creates the tables the source follows (and the dead-letter table, the anchor of every
    /// checkpoint); refuses a partition spec on anything but key columns.
    pub async fn open(
        config: JobConfig,
        client: CatalogClient,
        source: S,
        metrics: JobMetrics,
    ) -> LakeResult<Self> {
        let (anchor, _) = deadletter::ensure_anchor(&client, &config).await?;
        let mut job = Self {
            writer_id: uuid::Uuid::now_v7().to_string(),
            config,
            client,
            source,
            metrics,
            next_checkpoint: 1,
            anchor,
            tables: Vec::new(),
            committed: None,
            summary: RunSummary::default(),
        };
        job.follow_new_tables().await?;
        Ok(job)
    }

    /// Creates (or loads) the Iceberg tables of source tables not followed yet — all of them
    /// at start; a source that discovers tables as it reads (Debezium topics) adds more.
    async fn follow_new_tables(&mut self) -> LakeResult<()> {
        let specs = self.source.tables();
        for spec in specs.into_iter().skip(self.tables.len()) {
            let config = &self.config;
            let table_config = config.tables.iter().find(|t| t.key == spec.source_name);
            let name = table_config
                .map(|t| t.name.clone())
                .unwrap_or_else(|| spec.name.clone());
            let partition = table_config
                .map(|t| t.partition.clone())
                .unwrap_or_default();
            if let Some(p) = partition.iter().find(|p| !spec.key.contains(&p.column)) {
                return Err(LakeError::new(
                    ErrorKind::Invalid,
                    format!(
                        "table {}: partitioning by {} is refused — only key columns ({}) never \
                         move a row between partitions, which deletes by key rely on",
                        spec.source_name,
                        p.column,
                        spec.key.join(", ")
                    ),
                ));
            }
            let options = writer_options(
                config,
                table_config.map_or(128 * 1024 * 1024, |t| t.target_file_size),
                &[],
                &[],
            );
            let mut properties = options.to_table_properties();
            if let Some(t) = table_config {
                properties.extend(t.properties.clone());
            }
            let table = ensure_table(
                &self.client,
                &config.catalog.namespace,
                &Wanted {
                    name: &name,
                    schema: &spec.schema,
                    partition: &partition,
                    properties: &properties,
                },
            )
            .await?;
            self.tables.push(Followed {
                table,
                options,
                key: spec.key,
                partition,
                properties,
                name,
            });
        }
        Ok(())
    }

    /// Runs until `shutdown` is cancelled; then takes a final checkpoint.
    pub async fn run(mut self, shutdown: CancellationToken) -> LakeResult<RunSummary> {
        let anchor = self.client.load_table(&self.anchor.ident).await?;
        let job = newest_marker(&anchor.metadata, &self.config.name).map(|f| f.marker.positions);
        let mut committed = Vec::new();
        for followed in &self.tables {
            let table = self.client.load_table(&followed.table.ident).await?;
            committed.push(
                newest_marker(&table.metadata, &self.config.name).map(|f| f.marker.positions),
            );
        }
        let start = tokio::select! {
            start = self.source.begin(job.as_ref(), &committed) => start.map_err(source_error)?,
            () = shutdown.cancelled() => return Ok(self.summary),
        };
        if start == ChangeStart::Snapshot {
            tracing::info!(job = %self.config.name, tables = self.tables.len(), "copying the tables (initial snapshot)");
            tokio::select! {
                result = self.snapshot() => result?,
                () = shutdown.cancelled() => {
                    tracing::info!("stopped during the initial snapshot; it starts over next time");
                    return Ok(self.summary);
                }
            }
        } else {
            tracing::info!(
                job = %self.config.name,
                tables = committed.iter().flatten().count(),
                "streaming from the positions committed in the tables"
            );
        }
        let mut deadline = Instant::now() + self.config.interval;
        loop {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(500));
            tokio::select! {
                polled = self.source.poll(wait) => polled.map_err(source_error)?,
                () = shutdown.cancelled() => {
                    tracing::info!("stopping: taking a final checkpoint");
                    self.checkpoint().await?;
                    return Ok(self.summary);
                }
            }
            if Instant::now() >= deadline
                || self.source.buffered_bytes() as u64 >= self.config.max_buffered_bytes
            {
                self.checkpoint().await?;
                self.refresh_status().await;
                deadline = Instant::now() + self.config.interval;
            }
        }
    }

    /// Reads the source's own gauges (every interval, idle or not).
    async fn refresh_status(&mut self) {
        for (measure, value) in self.source.status().await {
            self.metrics
                .source_status
                .with_label_values(&[measure])
                .set(value);
        }
    }

    /// Copies every table and commits the copy as one checkpoint.
    async fn snapshot(&mut self) -> LakeResult<()> {
        let began = Instant::now();
        let mut writers: Vec<Option<DataWriter>> = (0..self.tables.len()).map(|_| None).collect();
        let arrow: Vec<_> = self
            .tables
            .iter()
            .map(|t| arrow_schema(t.table.metadata.current_schema()))
            .collect::<LakeResult<_>>()?;
        let mut rows = vec![0u64; self.tables.len()];
        while let Some((index, batch)) = self.source.snapshot_batch().await.map_err(source_error)? {
            let followed = &self.tables[index];
            let writer = match &mut writers[index] {
                Some(w) => w,
                None => {
                    writers[index].insert(DataWriter::data(&followed.table, &followed.options)?)
                }
            };
            rows[index] += batch.num_rows() as u64;
            writer.write(&conform(&batch, &arrow[index])?).await?;
        }
        let mut deltas = vec![(self.anchor.ident.clone(), Delta::default())];
        for (followed, writer) in self.tables.iter().zip(writers) {
            let data_files = match writer {
                Some(w) => w.close().await?,
                None => Vec::new(),
            };
            deltas.push((
                followed.table.ident.clone(),
                Delta {
                    data_files,
                    truncate: true,
                    ..Default::default()
                },
            ));
        }
        let (_, positions) = self.source.take().map_err(source_error)?;
        let counts: Vec<(String, u64)> = self
            .tables
            .iter()
            .zip(&rows)
            .map(|(t, n)| (t.name.clone(), *n))
            .collect();
        self.commit(deltas, positions, &counts, began).await?;
        tracing::info!(
            job = %self.config.name,
            rows = rows.iter().sum::<u64>(),
            seconds = began.elapsed().as_secs_f64(),
            "initial snapshot committed"
        );
        Ok(())
    }

    /// Adds the columns the source gained to the Iceberg tables.
    async fn follow_schemas(&mut self) -> LakeResult<()> {
        let specs = self.source.tables();
        for (followed, spec) in self.tables.iter_mut().zip(specs) {
            let current = followed.table.metadata.current_schema();
            let gained = spec
                .schema
                .as_struct()
                .fields()
                .iter()
                .any(|f| current.field_by_name(&f.name).is_none());
            if gained {
                followed.table = ensure_table(
                    &self.client,
                    &self.config.catalog.namespace,
                    &Wanted {
                        name: &followed.name,
                        schema: &spec.schema,
                        partition: &followed.partition,
                        properties: &followed.properties,
                    },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Writes the buffered changes as one row delta per table and commits them together.
    async fn checkpoint(&mut self) -> LakeResult<()> {
        let began = Instant::now();
        let (changes, positions) = self.source.take().map_err(source_error)?;
        if changes.is_empty() && self.committed.as_ref() == Some(&positions) {
            return Ok(());
        }
        self.follow_new_tables().await?;
        self.follow_schemas().await?;
        let mut deltas = vec![(self.anchor.ident.clone(), Delta::default())];
        let mut counts = Vec::new();
        for change in changes {
            let followed = &self.tables[change.table];
            let (delta, rows) = write_changes(followed, change).await?;
            counts.push((followed.name.clone(), rows));
            deltas.push((followed.table.ident.clone(), delta));
        }
        self.commit(deltas, positions, &counts, began).await
    }

    async fn commit(
        &mut self,
        deltas: Vec<(iceberg::TableIdent, Delta)>,
        positions: Positions,
        counts: &[(String, u64)],
        began: Instant,
    ) -> LakeResult<()> {
        let marker = CommitMarker {
            job_id: self.config.name.clone(),
            writer: Some(self.writer_id.clone()),
            checkpoint_id: self.next_checkpoint,
            positions: positions.clone(),
        };
        self.next_checkpoint += 1;
        let commit_began = Instant::now();
        let report =
            commit_checkpoint(&self.client, &marker, &deltas, &RetryPolicy::default()).await?;
        self.metrics
            .commit_seconds
            .observe(commit_began.elapsed().as_secs_f64());
        self.source.acknowledge(&positions);
        self.committed = Some(positions);
        self.metrics.checkpoints.inc();
        self.metrics
            .checkpoint_seconds
            .observe(began.elapsed().as_secs_f64());
        self.metrics.last_commit.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or_default(),
        );
        self.summary.checkpoints += 1;
        for (table, n) in counts {
            self.metrics.rows.with_label_values(&[table]).inc_by(*n);
            *self.summary.rows.entry(table.clone()).or_default() += n;
        }
        tracing::info!(
            job = %self.config.name,
            checkpoint = marker.checkpoint_id,
            rows = ?counts,
            millis = began.elapsed().as_millis() as u64,
            attempts = report.attempts,
            "checkpoint committed"
        );
        Ok(())
    }
}

/// One table's changes as files: equality deletes for the keys that may exist in older data,
/// the final rows as data. Returns the delta and the rows written.
async fn write_changes(followed: &Followed, change: TableChanges) -> LakeResult<(Delta, u64)> {
    let mut delta = Delta {
        truncate: change.truncate,
        ..Default::default()
    };
    let mut rows = 0;
    if let Some(deletes) = change.deletes {
        let key: Vec<&str> = followed.key.iter().map(String::as_str).collect();
        let (_, input) = equality_delete_input(&followed.table, &key)?;
        let input = arrow_schema(&input)?;
        let mut writer = EqualityDeleteWriter::equality(&followed.table, &followed.options, &key)?;
        writer.write(&conform(&deletes, &input)?).await?;
        delta.delete_files = writer.close().await?;
    }
    if let Some(batch) = change.rows {
        rows = batch.num_rows() as u64;
        let mut writer = DataWriter::data(&followed.table, &followed.options)?;
        let batch: RecordBatch = conform(
            &batch,
            &arrow_schema(followed.table.metadata.current_schema())?,
        )?;
        writer.write(&batch).await?;
        delta.data_files = writer.close().await?;
    }
    Ok((delta, rows))
}
