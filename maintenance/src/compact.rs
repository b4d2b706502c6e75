//! Compaction: bin-pack a table's small files per partition and apply its deletes.
//!
//! Planning reads the live files of one snapshot (the starting snapshot) and picks, per
//! partition of the default spec that is sealed (no file committed to it for `sealed_after`):
//! * every data file of a partition that has at least `delete_file_threshold` delete files —
//!   its rows are rewritten with the deletes applied and those delete files leave the table;
//! * otherwise the files smaller than the target, once there are `min_input_files` of them.
//!
//! Groups are taken until `max_bytes_per_run`. Execution reads each group's rows through
//! `floe_lake::read` (which applies position and equality deletes as of the starting snapshot),
//! writes them with `floe-lake`'s writer and commits one validated RewriteFiles per group: its
//! output keeps the starting sequence number, so deletes committed meanwhile still apply, and
//! a position delete committed against a group's input fails that group only (its output files
//! are deleted; the next run plans again). Output files take the writer settings recorded in
//! the table's properties (codec level, bloom filters, plain columns). After the groups, the
//! manifests are merged, so readers do not wade through the replaced files' DELETED entries.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow_array::RecordBatch;
use floe_lake::commit::{RetryPolicy, commit_operation};
use floe_lake::manifests::RewriteManifests;
use floe_lake::read::{ReadRequest, read_live};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::rewrite::Rewrite;
use floe_lake::snapshot::current_manifests;
use floe_lake::writer::{DataWriter, WriterOptions};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{DataContentType, DataFile, Struct};
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};

/// What compaction aims for.
#[derive(Debug, Clone)]
pub struct CompactionSettings {
    /// Files smaller than this are compacted, into files of about this size.
    pub target_file_size: u64,
    /// Compact a partition's small files once there are at least this many.
    pub min_input_files: usize,
    /// Rewrite a whole partition (applying its deletes) once it has this many delete files.
    pub delete_file_threshold: usize,
    /// Stop planning groups past this many input bytes in one run.
    pub max_bytes_per_run: u64,
    /// Only partitions that received no file for this long (zero: every partition), so the
    /// partition a stream is still writing is left alone until it is sealed.
    pub sealed_after: std::time::Duration,
    /// Sort the rewritten rows by these columns (`"name"` or `"name DESC"`, nulls last), in
    /// runs of about the target file size; empty: keep the read order.
    pub sort_by: Vec<String>,
}

impl Default for CompactionSettings {
    fn default() -> Self {
        Self {
            target_file_size: 128 * 1024 * 1024,
            min_input_files: 5,
            delete_file_threshold: 1,
            max_bytes_per_run: 16 * 1024 * 1024 * 1024,
            sealed_after: std::time::Duration::ZERO,
            sort_by: Vec::new(),
        }
    }
}

/// The files of one partition to rewrite together.
#[derive(Debug, Clone)]
pub struct PartitionGroup {
    /// The partition tuple.
    pub partition: Struct,
    /// Data files to replace.
    pub data_files: Vec<DataFile>,
    /// Delete files that leave with them (every data file of the partition is rewritten).
    pub delete_files: Vec<DataFile>,
    /// Whether the partition has any delete file (then rows are read with deletes applied).
    pub has_deletes: bool,
}

impl PartitionGroup {
    /// Input bytes.
    pub fn bytes(&self) -> u64 {
        self.data_files
            .iter()
            .map(DataFile::file_size_in_bytes)
            .sum()
    }
}

/// A compaction planned on one snapshot.
#[derive(Debug, Clone)]
pub struct CompactionPlan {
    /// The snapshot the plan read.
    pub starting_snapshot_id: i64,
    /// Partition groups, largest saving first.
    pub groups: Vec<PartitionGroup>,
}

/// What a compaction run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// Groups committed.
    pub groups_committed: usize,
    /// Groups that failed validation (to be planned again next run).
    pub groups_conflicted: usize,
    /// Data files replaced.
    pub files_rewritten: usize,
    /// Data files written.
    pub files_written: usize,
    /// Input bytes of the replaced files.
    pub bytes_rewritten: u64,
    /// Delete files removed.
    pub delete_files_removed: usize,
    /// Whether the manifests were merged afterwards.
    pub manifests_merged: bool,
}

/// The live files of one partition of a table's default spec.
#[derive(Default)]
pub(crate) struct PartitionFiles {
    pub(crate) partition: Option<Struct>,
    pub(crate) data: Vec<DataFile>,
    pub(crate) deletes: Vec<DataFile>,
    /// When the newest of its live files was committed (ms; 0 if no snapshot says).
    pub(crate) newest_ms: i64,
}

/// The live files of the table's current snapshot, per partition of its default spec (files
/// of older specs are left alone).
pub(crate) async fn live_files(
    table: &LoadedTable,
) -> LakeResult<BTreeMap<String, PartitionFiles>> {
    let mut partitions: BTreeMap<String, PartitionFiles> = BTreeMap::new();
    for manifest in current_manifests(table).await? {
        if manifest.partition_spec_id != table.metadata.default_partition_spec_id() {
            continue;
        }
        for entry in manifest.load_manifest(&table.io).await?.entries() {
            if !entry.is_alive() {
                continue;
            }
            let file = entry.data_file();
            let slot = partitions
                .entry(format!("{:?}", file.partition()))
                .or_default();
            slot.partition
                .get_or_insert_with(|| file.partition().clone());
            let committed_ms = entry
                .snapshot_id()
                .and_then(|id| table.metadata.snapshot_by_id(id))
                .map_or(0, |s| s.timestamp_ms());
            slot.newest_ms = slot.newest_ms.max(committed_ms);
            match file.content_type() {
                DataContentType::Data => slot.data.push(file.clone()),
                _ => slot.deletes.push(file.clone()),
            }
        }
    }
    Ok(partitions)
}

/// Plans a compaction of the table's current snapshot.
pub async fn plan_compaction(
    table: &LoadedTable,
    settings: &CompactionSettings,
) -> LakeResult<Option<CompactionPlan>> {
    let Some(start) = table.metadata.current_snapshot_id() else {
        return Ok(None);
    };
    let partitions = live_files(table).await?;
    let mut groups = Vec::new();
    let sealed_before = crate::state::now_ms()
        - i64::try_from(settings.sealed_after.as_millis()).unwrap_or(i64::MAX);
    for (_, files) in partitions {
        let partition = files.partition.unwrap_or_else(Struct::empty);
        if files.data.is_empty() || files.newest_ms > sealed_before {
            continue;
        }
        if files.deletes.len() >= settings.delete_file_threshold.max(1) {
            groups.push(PartitionGroup {
                partition,
                data_files: files.data,
                delete_files: files.deletes,
                has_deletes: true,
            });
            continue;
        }
        let small: Vec<DataFile> = files
            .data
            .into_iter()
            .filter(|f| f.file_size_in_bytes() < settings.target_file_size)
            .collect();
        if small.len() >= settings.min_input_files.max(2) {
            groups.push(PartitionGroup {
                partition,
                data_files: small,
                delete_files: Vec::new(),
                has_deletes: !files.deletes.is_empty(),
            });
        }
    }
    // The groups with the most files to merge go first.
    groups.sort_by_key(|g| std::cmp::Reverse(g.data_files.len() + g.delete_files.len()));
    let mut budget = settings.max_bytes_per_run;
    groups.retain(|g| {
        let fits = g.bytes() <= budget;
        if fits {
            budget -= g.bytes();
        }
        fits
    });
    Ok((!groups.is_empty()).then_some(CompactionPlan {
        starting_snapshot_id: start,
        groups,
    }))
}

/// The group's rows, deletes applied, as a stream of batches of the table's current schema.
///
/// With no delete file in the partition and a table that never changed its schema (so every
/// file has the current columns), the files are decoded directly with the table's Arrow schema;
/// otherwise through `floe_lake::read` as of the starting snapshot, which applies position and
/// equality deletes and maps older files' columns by field id.
pub(crate) async fn read_group(
    table: &LoadedTable,
    start: i64,
    group: &PartitionGroup,
    schema: arrow_schema::SchemaRef,
) -> LakeResult<futures::stream::BoxStream<'static, LakeResult<RecordBatch>>> {
    if !group.has_deletes && table.metadata.schemas_iter().count() == 1 {
        let io = table.io.clone();
        let paths: Vec<String> = group
            .data_files
            .iter()
            .map(|f| f.file_path().to_string())
            .collect();
        let files = futures::stream::iter(paths).then(move |path| {
            let (io, schema) = (io.clone(), schema.clone());
            async move {
                let bytes = io.new_input(&path)?.read().await?;
                let options = ArrowReaderOptions::new().with_schema(schema);
                let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, options)
                    .and_then(|b| b.with_batch_size(8192).build())
                    .map_err(|e| {
                        LakeError::new(ErrorKind::Invalid, format!("cannot read {path}"))
                            .with_source(e)
                    })?;
                let batches: Vec<LakeResult<RecordBatch>> = reader
                    .map(|b| {
                        b.map_err(|e| {
                            LakeError::new(ErrorKind::Invalid, "cannot decode a data file")
                                .with_source(e)
                        })
                    })
                    .collect();
                LakeResult::Ok(futures::stream::iter(batches))
            }
        });
        return Ok(files.try_flatten().boxed());
    }
    let inputs: HashSet<String> = group
        .data_files
        .iter()
        .map(|f| f.file_path().to_string())
        .collect();
    let request = ReadRequest::current()
        .snapshot(start)
        .files(move |_, file| inputs.contains(file.file_path()));
    // Its batches already have the table's current schema, field ids included.
    read_live(table, request).await
}

/// Reads a group's rows as of the starting snapshot, deletes applied, and writes them anew.
async fn rewrite_group(
    table: &LoadedTable,
    start: i64,
    group: &PartitionGroup,
    settings: &CompactionSettings,
) -> LakeResult<Vec<DataFile>> {
    let schema = Arc::new(schema_to_arrow_schema(table.metadata.current_schema())?);
    let mut stream = read_group(table, start, group, schema.clone()).await?;
    // Reading (and decoding) runs on its own task, so it overlaps encoding on another core.
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let reading = tokio::spawn(async move {
        while let Some(batch) = stream.next().await {
            if tx.send(batch).await.is_err() {
                break;
            }
        }
    });
    // Files like the table's writers write them (their settings are table properties).
    let options = WriterOptions {
        target_file_size: usize::try_from(settings.target_file_size).unwrap_or(usize::MAX),
        file_prefix: "compact".to_string(),
        ..WriterOptions::from_table_properties(table.metadata.properties())
    };
    let mut writer = DataWriter::data(table, &options)?;
    let order = sort_columns(&settings.sort_by, &schema)?;
    let mut run: Vec<RecordBatch> = Vec::new();
    let mut run_bytes = 0usize;
    while let Some(batch) = rx.recv().await {
        let batch = batch?;
        if order.is_empty() {
            writer.write(&batch).await?;
            continue;
        }
        run_bytes += batch.get_array_memory_size();
        run.push(batch);
        if run_bytes >= options.target_file_size {
            writer.write(&sorted(&schema, &order, &run)?).await?;
            run.clear();
            run_bytes = 0;
        }
    }
    if !run.is_empty() {
        writer.write(&sorted(&schema, &order, &run)?).await?;
    }
    reading.await.map_err(|e| {
        LakeError::new(ErrorKind::Invalid, "the compaction reader failed").with_source(e)
    })?;
    writer.close().await
}

/// The column indexes and directions of `sort_by` (`"name"` or `"name DESC"`).
fn sort_columns(
    sort_by: &[String],
    schema: &arrow_schema::SchemaRef,
) -> LakeResult<Vec<(usize, arrow_schema::SortOptions)>> {
    sort_by
        .iter()
        .map(|spec| {
            let mut words = spec.split_whitespace();
            let name = words.next().unwrap_or_default();
            let descending = match words.next().map(str::to_ascii_uppercase).as_deref() {
                None | Some("ASC") => false,
                Some("DESC") => true,
                Some(other) => {
                    return Err(LakeError::new(
                        ErrorKind::Invalid,
                        format!("sort_by {spec:?}: {other:?} is neither ASC nor DESC"),
                    ));
                }
            };
            let index = schema.index_of(name).map_err(|_| {
                LakeError::new(
                    ErrorKind::Invalid,
                    format!("sort_by names {name:?}, which the table does not have"),
                )
            })?;
            Ok((
                index,
                arrow_schema::SortOptions {
                    descending,
                    nulls_first: false,
                },
            ))
        })
        .collect()
}

/// One sorted batch of `run`.
fn sorted(
    schema: &arrow_schema::SchemaRef,
    order: &[(usize, arrow_schema::SortOptions)],
    run: &[RecordBatch],
) -> LakeResult<RecordBatch> {
    let sort_error = |e| LakeError::new(ErrorKind::Invalid, "cannot sort rows").with_source(e);
    let batch = arrow_select::concat::concat_batches(schema, run).map_err(sort_error)?;
    let columns: Vec<arrow_ord::sort::SortColumn> = order
        .iter()
        .map(|(index, options)| arrow_ord::sort::SortColumn {
            values: batch.column(*index).clone(),
            options: Some(*options),
        })
        .collect();
    let indices = arrow_ord::sort::lexsort_to_indices(&columns, None).map_err(sort_error)?;
    arrow_select::take::take_record_batch(&batch, &indices).map_err(sort_error)
}

/// Replaces a partition group's data and delete files with `outputs` in one validated
/// rewrite from `starting_snapshot_id`, the snapshot marked `floe.maintenance = task`.
/// `Ok(false)`: a writer touched the partition meanwhile; nothing changed and `outputs` were
/// deleted, so the group is planned again next run.
pub(crate) async fn replace_group(
    client: &CatalogClient,
    table: &LoadedTable,
    starting_snapshot_id: i64,
    group: &PartitionGroup,
    outputs: &[DataFile],
    task: &str,
) -> LakeResult<bool> {
    let rewrite = Rewrite {
        id: uuid::Uuid::new_v4(),
        starting_snapshot_id,
        removed_data_files: group.data_files.clone(),
        removed_delete_files: group.delete_files.clone(),
        added_data_files: outputs.to_vec(),
        properties: [("floe.maintenance".to_string(), task.to_string())].into(),
    };
    match commit_operation(client, &table.ident, &rewrite, &RetryPolicy::default()).await {
        Ok(_) => Ok(true),
        Err(error) if error.kind() == ErrorKind::Conflict => {
            tracing::warn!(table = %table.ident, %error, task, "the partition conflicted with a writer; it is planned again next run");
            for file in outputs {
                if let Err(error) = table.io.delete(file.file_path()).await {
                    tracing::warn!(path = file.file_path(), %error, "could not delete an uncommitted output");
                }
            }
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Runs a plan: one validated rewrite per group; a group that conflicts is skipped (its new
/// files deleted) and the others go on. `progress` sees the report after every group.
pub async fn compact(
    client: &CatalogClient,
    ident: &iceberg::TableIdent,
    plan: &CompactionPlan,
    settings: &CompactionSettings,
    progress: &(dyn Fn(&CompactionReport) + Send + Sync),
) -> LakeResult<CompactionReport> {
    let mut report = CompactionReport::default();
    let table = client.load_table(ident).await?;
    for group in &plan.groups {
        let outputs = rewrite_group(&table, plan.starting_snapshot_id, group, settings).await?;
        if replace_group(
            client,
            &table,
            plan.starting_snapshot_id,
            group,
            &outputs,
            "compact",
        )
        .await?
        {
            report.groups_committed += 1;
            report.files_rewritten += group.data_files.len();
            report.files_written += outputs.len();
            report.bytes_rewritten += group.bytes();
            report.delete_files_removed += group.delete_files.len();
        } else {
            report.groups_conflicted += 1;
        }
        progress(&report);
    }
    if report.groups_committed > 0 {
        // The rewrites left manifests full of DELETED entries that every reader skips, one
        // per input manifest: merge them.
        let merge = RewriteManifests {
            min_manifests: 2,
            ..RewriteManifests::default()
        };
        // Best effort, never fighting the writers: a few quick attempts, and when writers keep
        // committing in between, the next run (or the `manifests` task) merges them.
        let quick = RetryPolicy {
            attempts: 3,
            initial_backoff: std::time::Duration::from_millis(50),
            max_backoff: std::time::Duration::from_millis(200),
        };
        report.manifests_merged = match commit_operation(client, ident, &merge, &quick).await {
            Ok(snapshot) => snapshot.is_some(),
            Err(e) if e.kind() == ErrorKind::Conflict => {
                tracing::info!(table = %ident, "manifests left to merge: writers kept committing");
                false
            }
            Err(e) => return Err(e),
        };
    }
    Ok(report)
}
