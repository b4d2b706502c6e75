//! Merging rollup partials: the `merge` task.
//!
//! A window keyed by a column that spans source partitions lands one partial row per
//! (window, key, source partition); queries merge them with a `GROUP BY` (docs/operators.md gives
//! them for DuckDB and Trino). Once every partition a window's partials come from has committed
//! a watermark at or past `window_end + allowed_lateness`, the job never changes those rows
//! again, and this task replaces them by one row per (window, key) whose `source_partition` is
//! `*`, so that tables shrink by the number of partitions and every documented query gives the
//! same answer before and after.
//!
//! Everything the task needs is in the table ([`floe_core::rollup`]): the merge rule of every
//! column in the table's properties (written by the job when it creates the table), and the
//! committed watermarks in the newest commit marker of the table's history. A watermark there
//! is never ahead of what the job has durably seen, so nothing the job may still update is
//! merged — after a crash the job restores those same watermarks.
//!
//! Planning reads the live files of the current snapshot per partition of the table (by day
//! of `window_start`) and takes a partition unless no window in it can be closed yet (by the
//! files' lower bounds of `window_end`), or it holds only files this task wrote and no delete
//! files. Execution reads a partition's rows with the deletes applied (the rows that are still
//! open pass through unchanged), writes them with the merged rows and commits one validated
//! RewriteFiles per partition: the job keeps committing meanwhile, and its later equality
//! deletes still apply to the rows that passed through (see [`floe_lake::rewrite`]). A
//! partition's rows are merged in memory; a rollup partition holds one day of windows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array,
};
use arrow_schema::{DataType, SchemaRef};
use floe_core::rollup::{MERGED_PARTITION, MergeRule, RollupPlan, pick_order};
use floe_lake::marker::{CommitMarker, JOB_ID};
use floe_lake::rest::{CatalogClient, LoadedTable};
use floe_lake::tables::conform;
use floe_lake::writer::{DataWriter, WriterOptions};
use floe_lake::{ErrorKind, LakeError, LakeResult};
use floe_sketch::hll::{self, HyperLogLog};
use floe_sketch::quantile::{self, QuantileSketch};
use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{DataFile, PrimitiveLiteral};

use crate::compact::{PartitionGroup, live_files, read_group, replace_group};

/// The file name prefix of the files this task writes.
const PREFIX: &str = "merge";

/// A merge planned on one snapshot.
#[derive(Debug, Clone)]
pub struct MergePlan {
    /// The snapshot the plan read.
    pub starting_snapshot_id: i64,
    /// The table's rollup plan.
    pub rollup: RollupPlan,
    /// The committed watermark of each source partition (µs).
    pub watermarks: BTreeMap<String, i64>,
    /// The job whose marker gave them.
    pub job: String,
    /// Partitions of the table to read, oldest first.
    pub groups: Vec<PartitionGroup>,
}

/// What a merge run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeReport {
    /// Partitions rewritten.
    pub partitions_committed: usize,
    /// Partitions read that held nothing to merge.
    pub partitions_unchanged: usize,
    /// Partitions that conflicted with a writer (planned again next run).
    pub partitions_conflicted: usize,
    /// Partial rows replaced.
    pub rows_merged: u64,
    /// Merged rows written in their place.
    pub rows_written: u64,
    /// Data files replaced.
    pub files_rewritten: usize,
    /// Data files written.
    pub files_written: usize,
    /// Delete files removed.
    pub delete_files_removed: usize,
}

fn invalid(message: impl Into<String>) -> LakeError {
    LakeError::new(ErrorKind::Invalid, message)
}

/// Plans a merge of the table's current snapshot; `None` when there is nothing to do (the
/// table is no rollup, or no job committed watermarks to it yet).
pub async fn plan_merge(table: &LoadedTable) -> LakeResult<Option<MergePlan>> {
    let Some(rollup) = RollupPlan::from_properties(table.metadata.properties()) else {
        return Ok(None);
    };
    let rollup = rollup.map_err(|e| invalid(format!("table {}: {e}", table.ident)))?;
    let Some(start) = table.metadata.current_snapshot_id() else {
        return Ok(None);
    };
    let Some(marker) = newest_marker(table) else {
        return Ok(None);
    };
    let suffix = rollup.watermark_entry("");
    let watermarks: BTreeMap<String, i64> = marker
        .positions
        .iter()
        .filter_map(|(key, value)| {
            let partition = key.strip_suffix(&suffix)?;
            Some((partition.to_string(), value.parse().ok()?))
        })
        .collect();
    let Some(&newest) = watermarks.values().max() else {
        return Ok(None);
    };
    let schema = table.metadata.current_schema();
    let end_id = schema
        .field_by_name("window_end")
        .ok_or_else(|| invalid(format!("rollup table {} has no window_end", table.ident)))?
        .id;
    // No window ending after this can be closed in any partition.
    let closable = newest.saturating_sub(rollup.allowed_lateness);
    let mut groups = Vec::new();
    for (_, files) in live_files(table).await? {
        if files.data.is_empty() {
            continue;
        }
        let merged_only = files.deletes.is_empty() && files.data.iter().all(written_here);
        let earliest_end = files
            .data
            .iter()
            .map(
                |f| match f.lower_bounds().get(&end_id).map(|d| d.literal()) {
                    Some(PrimitiveLiteral::Long(v)) => *v,
                    _ => i64::MIN,
                },
            )
            .min()
            .unwrap_or(i64::MIN);
        if merged_only || earliest_end > closable {
            continue;
        }
        groups.push((
            earliest_end,
            PartitionGroup {
                partition: files.partition.unwrap_or_else(iceberg::spec::Struct::empty),
                has_deletes: !files.deletes.is_empty(),
                data_files: files.data,
                delete_files: files.deletes,
            },
        ));
    }
    groups.sort_by_key(|(end, _)| *end);
    Ok((!groups.is_empty()).then(|| MergePlan {
        starting_snapshot_id: start,
        rollup,
        watermarks,
        job: marker.job_id,
        groups: groups.into_iter().map(|(_, g)| g).collect(),
    }))
}

/// Whether this task wrote the file.
fn written_here(file: &DataFile) -> bool {
    let name = file.file_path().rsplit('/').next().unwrap_or_default();
    name.starts_with(&format!("{PREFIX}-"))
}

/// The newest commit marker along `main`'s ancestry, of whichever job writes the table.
fn newest_marker(table: &LoadedTable) -> Option<CommitMarker> {
    let metadata = &table.metadata;
    let mut next = metadata.snapshot_for_ref("main").map(|s| s.snapshot_id());
    while let Some(id) = next {
        let snapshot = metadata.snapshot_by_id(id)?;
        let properties = &snapshot.summary().additional_properties;
        if properties.contains_key(JOB_ID)
            && let Some(marker) = CommitMarker::from_properties(properties)
        {
            return Some(marker);
        }
        next = snapshot.parent_snapshot_id();
    }
    None
}

/// Runs a plan: one validated rewrite per partition that has rows to merge; a partition that
/// conflicts is skipped (its new files deleted) and the others go on.
pub async fn merge(
    client: &CatalogClient,
    ident: &iceberg::TableIdent,
    plan: &MergePlan,
) -> LakeResult<MergeReport> {
    let mut report = MergeReport::default();
    let table = client.load_table(ident).await?;
    let schema = Arc::new(schema_to_arrow_schema(table.metadata.current_schema())?);
    let merger = Merger::new(&plan.rollup, &plan.watermarks, &schema)?;
    for group in &plan.groups {
        let batches: Vec<RecordBatch> =
            read_group(&table, plan.starting_snapshot_id, group, schema.clone())
                .await?
                .try_collect()
                .await?;
        let rows = arrow_select::concat::concat_batches(&schema, &batches)
            .map_err(|e| invalid("cannot gather a partition's rows").with_source(e))?;
        let Some(merged) = merger.merge(&rows)? else {
            report.partitions_unchanged += 1;
            continue;
        };
        let options = WriterOptions {
            file_prefix: PREFIX.to_string(),
            ..WriterOptions::from_table_properties(table.metadata.properties())
        };
        let mut writer = DataWriter::data(&table, &options)?;
        writer.write(&merged.batch).await?;
        let outputs = writer.close().await?;
        if replace_group(
            client,
            &table,
            plan.starting_snapshot_id,
            group,
            &outputs,
            "merge",
        )
        .await?
        {
            report.partitions_committed += 1;
            report.rows_merged += merged.replaced;
            report.rows_written += merged.written;
            report.files_rewritten += group.data_files.len();
            report.files_written += outputs.len();
            report.delete_files_removed += group.delete_files.len();
        } else {
            report.partitions_conflicted += 1;
        }
    }
    Ok(report)
}

/// A partition's rows after merging.
#[derive(Debug)]
pub struct Merged {
    /// Every row of the partition: the open ones unchanged, then the merged ones.
    pub batch: RecordBatch,
    /// Partial rows replaced.
    pub replaced: u64,
    /// Merged rows that replace them.
    pub written: u64,
}

/// Merges the closed partials of a rollup's rows.
#[derive(Debug)]
pub struct Merger {
    schema: SchemaRef,
    /// Column index and rule, in table order.
    rules: Vec<(usize, MergeRule)>,
    group: Vec<usize>,
    partition: usize,
    end: usize,
    lateness: i64,
    watermarks: HashMap<String, i64>,
}

impl Merger {
    /// A merger of rows of `schema` by `rollup`, given the committed watermarks.
    pub fn new(
        rollup: &RollupPlan,
        watermarks: &BTreeMap<String, i64>,
        schema: &SchemaRef,
    ) -> LakeResult<Self> {
        let mut rules = Vec::new();
        for field in schema.fields() {
            let rule = rollup
                .columns
                .iter()
                .find(|(c, _)| c == field.name())
                .map(|(_, r)| r.clone())
                .ok_or_else(|| {
                    invalid(format!(
                        "column {} has no merge rule in the table's properties",
                        field.name()
                    ))
                })?;
            rules.push((schema.index_of(field.name()).unwrap_or_default(), rule));
        }
        let index = |name: &str| {
            schema
                .index_of(name)
                .map_err(|_| invalid(format!("the rollup has no column {name}")))
        };
        for (_, rule) in &rules {
            match rule {
                MergeRule::Avg { sum, count } => {
                    index(sum)?;
                    index(count)?;
                }
                MergeRule::Distinct { hll } => {
                    index(hll)?;
                }
                MergeRule::Quantile { sketch, .. } => {
                    index(sketch)?;
                }
                MergeRule::MaxBy { by } => {
                    index(by)?;
                }
                _ => {}
            }
        }
        let group = rules
            .iter()
            .filter(|(_, r)| *r == MergeRule::Group)
            .map(|(i, _)| *i)
            .collect();
        let partition = rules
            .iter()
            .find(|(_, r)| *r == MergeRule::Partition)
            .map(|(i, _)| *i)
            .ok_or_else(|| invalid("the rollup has no source partition column"))?;
        Ok(Self {
            schema: schema.clone(),
            rules,
            group,
            partition,
            end: index("window_end")?,
            lateness: rollup.allowed_lateness,
            watermarks: watermarks.clone().into_iter().collect(),
        })
    }

    /// Whether the job can no longer change row `row` (or it is merged already).
    fn closed(&self, partitions: &StringArray, ends: &[i64], row: usize) -> bool {
        let p = partitions.value(row);
        p == MERGED_PARTITION
            || self
                .watermarks
                .get(p)
                .is_some_and(|w| ends[row].saturating_add(self.lateness) <= *w)
    }

    /// `rows` with the closed partials of each (window, key) merged into one row; `None`
    /// when no two closed rows share a (window, key) and nothing else would change.
    pub fn merge(&self, rows: &RecordBatch) -> LakeResult<Option<Merged>> {
        let fail = |e: arrow_schema::ArrowError| invalid("cannot merge rollup rows").with_source(e);
        let partitions = rows
            .column(self.partition)
            .as_string_opt::<i32>()
            .ok_or_else(|| invalid("source_partition is not a string column"))?;
        let ends = arrow_cast::cast(rows.column(self.end), &DataType::Int64).map_err(fail)?;
        let ends = ends.as_primitive::<Int64Type>().values().to_vec();
        let converter = arrow_row::RowConverter::new(
            self.group
                .iter()
                .map(|&i| arrow_row::SortField::new(rows.column(i).data_type().clone()))
                .collect(),
        )
        .map_err(fail)?;
        let keys = converter
            .convert_columns(
                &self
                    .group
                    .iter()
                    .map(|&i| rows.column(i).clone())
                    .collect::<Vec<_>>(),
            )
            .map_err(fail)?;
        // Closed rows by (window, key), in the order of the groups' first rows.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut slot: HashMap<arrow_row::Row<'_>, usize> = HashMap::new();
        let mut open = Vec::new();
        for row in 0..rows.num_rows() {
            if !self.closed(partitions, &ends, row) {
                open.push(row as u32);
                continue;
            }
            let g = *slot.entry(keys.row(row)).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(row);
        }
        if groups.iter().all(|g| g.len() < 2) {
            return Ok(None);
        }
        // Single closed rows stay as they are.
        let mut keep = open;
        let mut merging = Vec::new();
        for g in groups {
            if g.len() < 2 {
                keep.push(g[0] as u32);
            } else {
                merging.push(g);
            }
        }
        keep.sort_unstable();
        let kept =
            arrow_select::take::take_record_batch(rows, &UInt32Array::from(keep)).map_err(fail)?;
        let merged = self.merge_groups(rows, &merging)?;
        let batch =
            arrow_select::concat::concat_batches(&self.schema, &[kept, merged]).map_err(fail)?;
        Ok(Some(Merged {
            batch,
            replaced: merging.iter().map(|g| g.len() as u64).sum(),
            written: merging.len() as u64,
        }))
    }

    /// One row per group of closed partials.
    fn merge_groups(&self, rows: &RecordBatch, groups: &[Vec<usize>]) -> LakeResult<RecordBatch> {
        let fail = |e: arrow_schema::ArrowError| invalid("cannot merge rollup rows").with_source(e);
        let sketch_fail =
            |e: floe_sketch::SketchError| invalid(format!("cannot merge rollup sketches: {e}"));
        let firsts = UInt32Array::from(groups.iter().map(|g| g[0] as u32).collect::<Vec<_>>());
        let mut columns: HashMap<usize, ArrayRef> = HashMap::new();
        let mut hlls: HashMap<String, Vec<HyperLogLog>> = HashMap::new();
        let mut sketches: HashMap<String, Vec<QuantileSketch>> = HashMap::new();
        let mut numbers: HashMap<String, Vec<Option<f64>>> = HashMap::new();
        // Plain merges first; derived values read the merged parts after.
        for (index, rule) in &self.rules {
            let column = rows.column(*index);
            let name = self.schema.field(*index).name().clone();
            let merged: ArrayRef = match rule {
                MergeRule::Group => {
                    arrow_select::take::take(column, &firsts, None).map_err(fail)?
                }
                MergeRule::Partition => {
                    Arc::new(StringArray::from(vec![MERGED_PARTITION; groups.len()]))
                }
                MergeRule::Sum | MergeRule::Min | MergeRule::Max => {
                    let merged = fold_numbers(column, groups, rule).map_err(fail)?;
                    numbers.insert(name, as_f64(&merged).map_err(fail)?);
                    merged
                }
                MergeRule::Hll => {
                    let list = column
                        .as_list_opt::<i32>()
                        .ok_or_else(|| invalid(format!("{name} is not a sketch column")))?;
                    let mut merged = Vec::with_capacity(groups.len());
                    for g in groups {
                        let mut h = HyperLogLog::new();
                        for &row in g {
                            if let Some(part) =
                                hll::from_list_array(list, row).map_err(sketch_fail)?
                            {
                                h.merge(&part);
                            }
                        }
                        merged.push(h);
                    }
                    let array = Arc::new(hll::to_list_array(&merged).map_err(sketch_fail)?);
                    hlls.insert(name, merged);
                    array
                }
                MergeRule::Sketch => {
                    let list = column
                        .as_list_opt::<i32>()
                        .ok_or_else(|| invalid(format!("{name} is not a sketch column")))?;
                    let mut merged = Vec::with_capacity(groups.len());
                    for g in groups {
                        let mut q = QuantileSketch::new();
                        for &row in g {
                            if let Some(part) =
                                quantile::from_list_array(list, row).map_err(sketch_fail)?
                            {
                                q.merge(&part);
                            }
                        }
                        merged.push(q);
                    }
                    let array = Arc::new(quantile::to_list_array(&merged).map_err(sketch_fail)?);
                    sketches.insert(name, merged);
                    array
                }
                MergeRule::MaxBy { by } => {
                    // The row of each group with the largest `by`, then the largest value.
                    let by = rows.column(self.schema.index_of(by).map_err(fail)?);
                    let by = arrow_cast::cast(by, &DataType::Float64).map_err(fail)?;
                    let by = by.as_primitive::<Float64Type>();
                    let values = arrow_cast::cast(column, &DataType::Utf8).map_err(fail)?;
                    let values = values.as_string::<i32>();
                    let picks = UInt32Array::from_iter(groups.iter().map(|g| {
                        g.iter()
                            .copied()
                            .filter(|&r| by.is_valid(r) && values.is_valid(r))
                            .max_by(|&x, &y| {
                                pick_order(
                                    (by.value(x), values.value(x)),
                                    (by.value(y), values.value(y)),
                                )
                            })
                            .map(|r| r as u32)
                    }));
                    arrow_select::take::take(column, &picks, None).map_err(fail)?
                }
                MergeRule::Avg { .. } | MergeRule::Distinct { .. } | MergeRule::Quantile { .. } => {
                    continue;
                }
            };
            columns.insert(*index, merged);
        }
        let missing = |name: &str| invalid(format!("{name} is not a mergeable column"));
        for (index, rule) in &self.rules {
            let derived: ArrayRef = match rule {
                MergeRule::Avg { sum, count } => {
                    let (sums, counts) = (
                        numbers.get(sum).ok_or_else(|| missing(sum))?,
                        numbers.get(count).ok_or_else(|| missing(count))?,
                    );
                    Arc::new(Float64Array::from_iter(sums.iter().zip(counts).map(
                        |(s, n)| match (s, n) {
                            (Some(s), Some(n)) if *n > 0.0 => Some(s / n),
                            _ => None,
                        },
                    )))
                }
                MergeRule::Distinct { hll } => Arc::new(Int64Array::from_iter_values(
                    hlls.get(hll)
                        .ok_or_else(|| missing(hll))?
                        .iter()
                        .map(|h| h.estimate() as i64),
                )),
                MergeRule::Quantile { sketch, q } => Arc::new(Float64Array::from_iter(
                    sketches
                        .get(sketch)
                        .ok_or_else(|| missing(sketch))?
                        .iter()
                        .map(|s| s.quantile(*q)),
                )),
                _ => continue,
            };
            columns.insert(*index, derived);
        }
        let arrays: Vec<ArrayRef> = (0..self.schema.fields().len())
            .map(|i| columns.remove(&i).expect("every column has a rule"))
            .collect();
        // The merged arrays have the plain types; the table's carry field ids and names.
        let plain = arrow_schema::Schema::new(
            self.schema
                .fields()
                .iter()
                .zip(&arrays)
                .map(|(f, a)| arrow_schema::Field::new(f.name(), a.data_type().clone(), true))
                .collect::<Vec<_>>(),
        );
        let batch = RecordBatch::try_new(Arc::new(plain), arrays).map_err(fail)?;
        conform(&batch, &self.schema)
    }
}

/// A sum, minimum or maximum of each group's rows of an integer, timestamp or float column.
fn fold_numbers(
    column: &ArrayRef,
    groups: &[Vec<usize>],
    rule: &MergeRule,
) -> Result<ArrayRef, arrow_schema::ArrowError> {
    let pick = |a: Option<f64>, b: f64| -> f64 {
        match (rule, a) {
            (_, None) => b,
            (MergeRule::Min, Some(a)) => a.min(b),
            (MergeRule::Max, Some(a)) => a.max(b),
            (_, Some(a)) => a + b,
        }
    };
    if matches!(column.data_type(), DataType::Float32 | DataType::Float64) {
        let values = arrow_cast::cast(column, &DataType::Float64)?;
        let values = values.as_primitive::<Float64Type>();
        let out = Float64Array::from_iter(groups.iter().map(|g| {
            let mut acc = (*rule == MergeRule::Sum).then_some(0.0);
            for &row in g {
                if values.is_valid(row) {
                    acc = Some(pick(acc, values.value(row)));
                }
            }
            acc
        }));
        return arrow_cast::cast(&out, column.data_type());
    }
    let values = arrow_cast::cast(column, &DataType::Int64)?;
    let values = values.as_primitive::<Int64Type>();
    let out = Int64Array::from_iter(groups.iter().map(|g| {
        let mut acc: Option<i64> = (*rule == MergeRule::Sum).then_some(0);
        for &row in g {
            if values.is_valid(row) {
                let v = values.value(row);
                acc = Some(match (rule, acc) {
                    (_, None) => v,
                    (MergeRule::Min, Some(a)) => a.min(v),
                    (MergeRule::Max, Some(a)) => a.max(v),
                    (_, Some(a)) => a.wrapping_add(v),
                });
            }
        }
        acc
    }));
    // Timestamps keep their unit and zone: the values are the same i64s.
    arrow_cast::cast(&out, column.data_type())
}

fn as_f64(array: &ArrayRef) -> Result<Vec<Option<f64>>, arrow_schema::ArrowError> {
    let values = arrow_cast::cast(array, &DataType::Float64)?;
    Ok(values.as_primitive::<Float64Type>().iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::TimestampMicrosecondArray;
    use arrow_schema::{Field, Schema, TimeUnit};

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
    }

    fn rollup() -> RollupPlan {
        let rule = |s: &str| s.parse::<MergeRule>().unwrap();
        RollupPlan {
            operator: "w".into(),
            allowed_lateness: 5,
            columns: [
                ("window_start", "group"),
                ("window_end", "group"),
                ("service", "group"),
                ("source_partition", "partition"),
                ("n", "sum"),
                ("last", "max"),
                ("mean", "avg:mean_sum:mean_count"),
                ("mean_sum", "sum"),
                ("mean_count", "sum"),
                ("users", "distinct:users_hll"),
                ("users_hll", "hll"),
                ("p50", "quantile:p50_sketch:0.5"),
                ("p50_sketch", "sketch"),
                ("slowest", "max_by:slowest_by"),
                ("slowest_by", "max"),
            ]
            .into_iter()
            .map(|(c, r)| (c.to_string(), rule(r)))
            .collect(),
        }
    }

    /// One partial: (start, service, partition, values, users).
    type Partial = (i64, &'static str, &'static str, Vec<f64>, Vec<&'static str>);

    fn batch(schema: &SchemaRef, partials: &[Partial]) -> RecordBatch {
        let hlls: Vec<HyperLogLog> = partials
            .iter()
            .map(|p| {
                let mut h = HyperLogLog::new();
                p.4.iter().for_each(|u| h.add_str(u));
                h
            })
            .collect();
        let sketches: Vec<QuantileSketch> = partials
            .iter()
            .map(|p| {
                let mut q = QuantileSketch::new();
                p.3.iter().for_each(|v| q.add(*v).unwrap());
                q
            })
            .collect();
        let start = |p: &Partial| p.0;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(partials.iter().map(start))
                    .with_timezone("+00:00"),
            ),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(partials.iter().map(|p| p.0 + 10))
                    .with_timezone("+00:00"),
            ),
            Arc::new(StringArray::from_iter_values(partials.iter().map(|p| p.1))),
            Arc::new(StringArray::from_iter_values(partials.iter().map(|p| p.2))),
            Arc::new(Int64Array::from_iter_values(
                partials.iter().map(|p| p.3.len() as i64),
            )),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(
                    partials
                        .iter()
                        .map(|p| p.3.iter().cloned().fold(0.0, f64::max) as i64),
                )
                .with_timezone("+00:00"),
            ),
            Arc::new(Float64Array::from_iter_values(
                partials
                    .iter()
                    .map(|p| p.3.iter().sum::<f64>() / p.3.len() as f64),
            )),
            Arc::new(Float64Array::from_iter_values(
                partials.iter().map(|p| p.3.iter().sum::<f64>()),
            )),
            Arc::new(Int64Array::from_iter_values(
                partials.iter().map(|p| p.3.len() as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                hlls.iter().map(|h| h.estimate() as i64),
            )),
            Arc::new(hll::to_list_array(&hlls).unwrap()),
            Arc::new(Float64Array::from_iter(
                sketches.iter().map(|q| q.quantile(0.5)),
            )),
            Arc::new(quantile::to_list_array(&sketches).unwrap()),
            // max_by: the last user, picked by the largest value.
            Arc::new(StringArray::from_iter_values(
                partials.iter().map(|p| *p.4.last().unwrap()),
            )),
            Arc::new(Float64Array::from_iter_values(
                partials
                    .iter()
                    .map(|p| p.3.iter().cloned().fold(0.0, f64::max)),
            )),
        ];
        RecordBatch::try_new(schema.clone(), columns).unwrap()
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("window_start", ts(), false),
            Field::new("window_end", ts(), false),
            Field::new("service", DataType::Utf8, false),
            Field::new("source_partition", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
            Field::new("last", ts(), true),
            Field::new("mean", DataType::Float64, true),
            Field::new("mean_sum", DataType::Float64, false),
            Field::new("mean_count", DataType::Int64, false),
            Field::new("users", DataType::Int64, false),
            Field::new("users_hll", hll::data_type(), false),
            Field::new("p50", DataType::Float64, true),
            Field::new("p50_sketch", quantile::data_type(), false),
            Field::new("slowest", DataType::Utf8, true),
            Field::new("slowest_by", DataType::Float64, true),
        ]))
    }

    fn rows_of(batch: &RecordBatch) -> Vec<String> {
        let mut rows: Vec<String> = (0..batch.num_rows())
            .map(|r| {
                (0..batch.num_columns())
                    .filter(|&c| {
                        !batch.schema().field(c).name().ends_with("_hll")
                            && !batch.schema().field(c).name().ends_with("_sketch")
                    })
                    .map(|c| {
                        arrow_cast::display::array_value_to_string(batch.column(c), r).unwrap()
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect();
        rows.sort();
        rows
    }

    #[test]
    fn closed_partials_merge_into_the_rows_of_all_their_values() {
        let schema = schema();
        // Partition p0 committed watermark 20, p1 15, p2 none: with lateness 5, windows
        // ending at 10 are closed in p0 and p1 (10 + 5 ≤ 15), those ending at 20 in none.
        let watermarks = BTreeMap::from([("p0".to_string(), 20), ("p1".to_string(), 15)]);
        let rows = batch(
            &schema,
            &[
                (0, "a", "p0", vec![1.0, 2.0, 3.0], vec!["u1", "u2"]),
                (0, "a", "p1", vec![4.0, 5.0], vec!["u2", "u3"]),
                (0, "b", "p0", vec![7.0], vec!["u9"]), // alone: kept as it is
                (0, "c", "*", vec![1.0, 9.0], vec!["u1"]), // merged before
                (0, "c", "p1", vec![6.0], vec!["u4"]),
                (0, "c", "p2", vec![8.0], vec!["u5"]), // p2 has no watermark: open
                (10, "a", "p0", vec![1.0], vec!["u1"]), // ends at 20: open
                (10, "a", "p1", vec![2.0], vec!["u1"]),
            ],
        );
        let merger = Merger::new(&rollup(), &watermarks, &schema).unwrap();
        let merged = merger.merge(&rows).unwrap().expect("two groups merge");
        assert_eq!((merged.replaced, merged.written), (4, 2));
        let expected = batch(
            &schema,
            &[
                (
                    0,
                    "a",
                    "*",
                    vec![1.0, 2.0, 3.0, 4.0, 5.0],
                    vec!["u1", "u2", "u3"],
                ),
                (0, "b", "p0", vec![7.0], vec!["u9"]),
                // The pick of the partial with the largest value: u1 at 9.
                (0, "c", "*", vec![1.0, 9.0, 6.0], vec!["u4", "u1"]),
                (0, "c", "p2", vec![8.0], vec!["u5"]),
                (10, "a", "p0", vec![1.0], vec!["u1"]),
                (10, "a", "p1", vec![2.0], vec!["u1"]),
            ],
        );
        assert_eq!(rows_of(&merged.batch), rows_of(&expected));
        // The sketches are the sketches of all the values, not only their estimates.
        let users = merged
            .batch
            .column_by_name("users_hll")
            .unwrap()
            .as_list::<i32>();
        let sketches = merged
            .batch
            .column_by_name("p50_sketch")
            .unwrap()
            .as_list::<i32>();
        let partitions = merged.batch.column(3).as_string::<i32>();
        let services = merged.batch.column(2).as_string::<i32>();
        let row = (0..merged.batch.num_rows())
            .find(|&r| partitions.value(r) == "*" && services.value(r) == "a")
            .unwrap();
        let mut h = HyperLogLog::new();
        ["u1", "u2", "u3"].iter().for_each(|u| h.add_str(u));
        assert_eq!(hll::from_list_array(users, row).unwrap(), Some(h));
        let mut q = QuantileSketch::new();
        [1.0, 2.0, 3.0, 4.0, 5.0]
            .iter()
            .for_each(|v| q.add(*v).unwrap());
        assert_eq!(quantile::from_list_array(sketches, row).unwrap(), Some(q));

        // Merged again, nothing changes.
        assert!(merger.merge(&merged.batch).unwrap().is_none());
    }

    #[test]
    fn a_column_without_a_rule_is_refused() {
        let mut plan = rollup();
        plan.columns.retain(|(c, _)| c != "last");
        let err = Merger::new(&plan, &BTreeMap::new(), &schema()).unwrap_err();
        assert!(
            err.to_string().contains("column last has no merge rule"),
            "{err}"
        );
    }
}
