//! Writers from Arrow batches to Iceberg files: partitioned data files, equality deletes and
//! position deletes (iceberg-rust 0.10 has no position-delete writer).
//!
//! Contract shared by all writers:
//! * zstd Parquet by default, column statistics for pruning (iceberg's Parquet writer computes
//!   them), optional bloom filters per column;
//! * file names carry a UUID drawn per writer, so a restarted writer never overwrites a file a
//!   previous incarnation wrote (iceberg's name counter restarts at 0);
//! * files roll at the target size even inside one large batch (batches are fed in slices of
//!   at most [`SLICE_ROWS`] rows, and the roll check runs before each slice);
//! * the partitioned writer keeps at most `max_open_files` partitions open and finishes the
//!   least recently used one when another is needed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, NestedField, PartitionKey, PrimitiveType, Schema,
    SchemaRef, Struct, Type,
};
use iceberg::transform::{BoxedTransformFunction, create_transform_function};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::base_writer::equality_delete_writer::{
    EqualityDeleteFileWriterBuilder, EqualityDeleteWriterConfig,
};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::location::EscapedLocationGenerator;
use crate::rest::LoadedTable;

/// Rows handed to a file writer at once, so the roll check runs often enough.
pub const SLICE_ROWS: usize = 8192;

/// Field id of `file_path` in a position-delete file (spec, reserved).
const POS_FILE_PATH_ID: i32 = 2_147_483_546;
/// Field id of `pos` in a position-delete file (spec, reserved).
const POS_POS_ID: i32 = 2_147_483_545;

/// Settings of every writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Roll to a new file past this many bytes.
    pub target_file_size: usize,
    /// Largest number of partitions open at once.
    pub max_open_files: usize,
    /// zstd level (1–22).
    pub zstd_level: i32,
    /// Columns that get a Parquet bloom filter.
    pub bloom_filter_columns: Vec<String>,
    /// Columns written without dictionary encoding: ids and timestamps that rarely repeat,
    /// where a dictionary costs time and space (and Parquet falls back anyway).
    pub plain_columns: Vec<String>,
    /// Start of every file name, e.g. the job id.
    pub file_prefix: String,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            target_file_size: 128 * 1024 * 1024,
            max_open_files: 64,
            zstd_level: 3,
            bloom_filter_columns: Vec::new(),
            plain_columns: Vec::new(),
            file_prefix: "floe".to_string(),
        }
    }
}

/// Iceberg's table property for the zstd level.
const PROP_ZSTD_LEVEL: &str = "write.parquet.compression-level";
/// Iceberg's table property for the codec (Floe writes zstd).
const PROP_CODEC: &str = "write.parquet.compression-codec";
/// Iceberg's table property prefix enabling a column's bloom filter.
const PROP_BLOOM: &str = "write.parquet.bloom-filter-enabled.column.";
/// Iceberg's table property for the target data file size.
const PROP_TARGET_SIZE: &str = "write.target-file-size-bytes";
/// Floe's table property listing the columns written without dictionary encoding.
const PROP_PLAIN: &str = "floe.write.parquet.plain-columns";

impl WriterOptions {
    /// The table properties recording these settings (Iceberg's where it has one), so that
    /// other writers of the table — compaction above all — write files alike.
    pub fn to_table_properties(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::from([
            (PROP_CODEC.to_string(), "zstd".to_string()),
            (PROP_ZSTD_LEVEL.to_string(), self.zstd_level.to_string()),
            (
                PROP_TARGET_SIZE.to_string(),
                self.target_file_size.to_string(),
            ),
        ]);
        for column in &self.bloom_filter_columns {
            out.insert(format!("{PROP_BLOOM}{column}"), "true".to_string());
        }
        if !self.plain_columns.is_empty() {
            out.insert(PROP_PLAIN.to_string(), self.plain_columns.join(","));
        }
        out
    }

    /// The settings a table's properties ask for; defaults where they say nothing.
    pub fn from_table_properties(properties: &std::collections::HashMap<String, String>) -> Self {
        let mut options = Self::default();
        if let Some(level) = properties.get(PROP_ZSTD_LEVEL).and_then(|v| v.parse().ok()) {
            options.zstd_level = level;
        }
        if let Some(size) = properties
            .get(PROP_TARGET_SIZE)
            .and_then(|v| v.parse().ok())
        {
            options.target_file_size = size;
        }
        let mut bloom: Vec<String> = properties
            .iter()
            .filter(|(_, v)| v.eq_ignore_ascii_case("true"))
            .filter_map(|(k, _)| k.strip_prefix(PROP_BLOOM).map(str::to_string))
            .collect();
        bloom.sort();
        options.bloom_filter_columns = bloom;
        if let Some(plain) = properties.get(PROP_PLAIN) {
            options.plain_columns = plain
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
        }
        options
    }

    /// The Parquet writer properties of these settings.
    pub fn parquet_properties(&self) -> LakeResult<WriterProperties> {
        let level = ZstdLevel::try_new(self.zstd_level).map_err(|e| {
            LakeError::new(
                ErrorKind::Invalid,
                format!("zstd level {}", self.zstd_level),
            )
            .with_source(e)
        })?;
        let mut builder = WriterProperties::builder().set_compression(Compression::ZSTD(level));
        for column in &self.bloom_filter_columns {
            builder =
                builder.set_column_bloom_filter_enabled(ColumnPath::from(column.as_str()), true);
        }
        for column in &self.plain_columns {
            builder =
                builder.set_column_dictionary_enabled(ColumnPath::from(column.as_str()), false);
        }
        Ok(builder.build())
    }

    /// A name generator unique to this writer incarnation.
    fn names(&self) -> DefaultFileNameGenerator {
        DefaultFileNameGenerator::new(
            self.file_prefix.clone(),
            Some(uuid::Uuid::new_v4().to_string()),
            DataFileFormat::Parquet,
        )
    }

    fn rolling(
        &self,
        table: &LoadedTable,
        schema: SchemaRef,
    ) -> LakeResult<
        RollingFileWriterBuilder<
            ParquetWriterBuilder,
            EscapedLocationGenerator,
            DefaultFileNameGenerator,
        >,
    > {
        Ok(RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(self.parquet_properties()?, schema),
            self.target_file_size,
            table.io.clone(),
            EscapedLocationGenerator::new(&table.metadata)?,
            self.names(),
        ))
    }
}

struct OpenWriter<W> {
    writer: W,
    last_used: u64,
}

/// How rows map to partitions: iceberg's splitter, plus the partition source columns and their
/// transforms for the fast path.
struct Partitioner {
    splitter: RecordBatchPartitionSplitter,
    /// (column index in the input batch, transform) per partition field; `None` when a source
    /// column is nested (no fast path then).
    columns: Option<Vec<(usize, BoxedTransformFunction)>>,
}

impl Partitioner {
    fn new(table: &LoadedTable, schema: SchemaRef) -> LakeResult<Option<Self>> {
        let spec = table.metadata.default_partition_spec();
        if spec.is_unpartitioned() {
            return Ok(None);
        }
        let top: Vec<i32> = schema.as_struct().fields().iter().map(|f| f.id).collect();
        let columns = spec
            .fields()
            .iter()
            .map(|field| {
                let index = top.iter().position(|id| *id == field.source_id)?;
                create_transform_function(&field.transform)
                    .ok()
                    .map(|f| (index, f))
            })
            .collect();
        Ok(Some(Self {
            splitter: RecordBatchPartitionSplitter::try_new_with_computed_values(
                schema,
                spec.clone(),
            )?,
            columns,
        }))
    }

    /// Splits a batch by partition. Rows already grouped by partition — every row of a
    /// time-ordered stream in one partition, or the state table's rows in operator and
    /// partition order — are found as runs with vectorized transforms and compares, each run
    /// a slice of the batch, without iceberg's per-row grouping (which converts every row's
    /// partition values to a struct).
    fn split(&self, batch: &RecordBatch) -> LakeResult<Vec<(PartitionKey, RecordBatch)>> {
        if let Some(runs) = self.runs(batch)? {
            let mut split = Vec::with_capacity(runs.len());
            for (start, len) in runs {
                let rows = batch.slice(start, len);
                match self.splitter.split(&rows.slice(0, 1))?.pop() {
                    Some((key, _)) => split.push((key, rows)),
                    None => return Ok(self.splitter.split(batch)?),
                }
            }
            return Ok(split);
        }
        Ok(self.splitter.split(batch)?)
    }

    /// The runs `(start, len)` of consecutive rows in one partition, when they are few enough
    /// (one per [`ROWS_PER_RUN`] rows at most) that slicing beats grouping row by row.
    fn runs(&self, batch: &RecordBatch) -> LakeResult<Option<Vec<(usize, usize)>>> {
        let Some(columns) = &self.columns else {
            return Ok(None);
        };
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(None);
        }
        // Row i + 1 starts a run when any partition value differs from row i's.
        let mut changed = None;
        for (index, transform) in columns {
            let values = transform.transform(batch.column(*index).clone())?;
            let differs =
                arrow_ord::cmp::distinct(&values.slice(0, rows - 1), &values.slice(1, rows - 1))
                    .map_err(|e| {
                        LakeError::new(ErrorKind::Invalid, "partition compare").with_source(e)
                    })?;
            let any = match changed.take() {
                Some(before) => &before | differs.values(),
                None => differs.values().clone(),
            };
            if any.count_set_bits() > rows / ROWS_PER_RUN {
                return Ok(None);
            }
            changed = Some(any);
        }
        let starts: Vec<usize> = std::iter::once(0)
            .chain(changed.iter().flat_map(|c| c.set_indices().map(|i| i + 1)))
            .collect();
        let ends = starts.iter().skip(1).copied().chain([rows]);
        Ok(Some(
            starts.iter().zip(ends).map(|(s, e)| (*s, e - s)).collect(),
        ))
    }
}

/// Partitioned rows are written as runs of one partition when runs are at least this long on
/// average (else iceberg groups them row by row).
const ROWS_PER_RUN: usize = 64;

/// Fans batches out to one writer per partition, with a cap on open writers.
pub struct PartitionedWriter<B: IcebergWriterBuilder> {
    builder: B,
    partitioner: Option<Partitioner>,
    open: HashMap<Option<Struct>, OpenWriter<B::R>>,
    max_open: usize,
    tick: u64,
    finished: Vec<DataFile>,
}

impl<B: IcebergWriterBuilder> std::fmt::Debug for PartitionedWriter<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedWriter")
            .field("open", &self.open.len())
            .field("finished", &self.finished.len())
            .finish()
    }
}

/// The partitioned writer of data files.
pub type DataWriter = PartitionedWriter<
    DataFileWriterBuilder<ParquetWriterBuilder, EscapedLocationGenerator, DefaultFileNameGenerator>,
>;

/// The partitioned writer of equality-delete files.
pub type EqualityDeleteWriter = PartitionedWriter<
    EqualityDeleteFileWriterBuilder<
        ParquetWriterBuilder,
        EscapedLocationGenerator,
        DefaultFileNameGenerator,
    >,
>;

impl DataWriter {
    /// A writer of data files in the table's current schema and default partition spec.
    pub fn data(table: &LoadedTable, options: &WriterOptions) -> LakeResult<Self> {
        let schema = table.metadata.current_schema().clone();
        Ok(Self {
            builder: DataFileWriterBuilder::new(options.rolling(table, schema.clone())?),
            partitioner: Partitioner::new(table, schema)?,
            open: HashMap::new(),
            max_open: options.max_open_files.max(1),
            tick: 0,
            finished: Vec::new(),
        })
    }
}

impl EqualityDeleteWriter {
    /// A writer of equality deletes on the columns `key_columns`. Batches carry the key
    /// columns plus the partition source columns, as fields of the table's current schema
    /// (so each delete lands in the partition of the rows it deletes).
    pub fn equality(
        table: &LoadedTable,
        options: &WriterOptions,
        key_columns: &[&str],
    ) -> LakeResult<Self> {
        let (ids, input_schema) = equality_delete_input(table, key_columns)?;
        let config = EqualityDeleteWriterConfig::new(ids, input_schema.clone())?;
        let projected = Arc::new(iceberg::arrow::arrow_schema_to_schema(
            config.projected_arrow_schema_ref(),
        )?);
        Ok(Self {
            builder: EqualityDeleteFileWriterBuilder::new(
                options.rolling(table, projected)?,
                config,
            ),
            partitioner: Partitioner::new(table, input_schema)?,
            open: HashMap::new(),
            max_open: options.max_open_files.max(1),
            tick: 0,
            finished: Vec::new(),
        })
    }
}

/// The field ids of `key_columns`, and the schema of the batches an [`EqualityDeleteWriter`]
/// takes: the key columns plus the partition source columns, in table order.
pub fn equality_delete_input(
    table: &LoadedTable,
    key_columns: &[&str],
) -> LakeResult<(Vec<i32>, SchemaRef)> {
    let table_schema = table.metadata.current_schema();
    let spec = table.metadata.default_partition_spec();
    let mut ids: Vec<i32> = Vec::new();
    for name in key_columns {
        let field = table_schema.field_by_name(name).ok_or_else(|| {
            LakeError::new(
                ErrorKind::Invalid,
                format!("no column {name:?} in {}", table.ident),
            )
        })?;
        ids.push(field.id);
    }
    let mut columns = ids.clone();
    columns.extend(spec.fields().iter().map(|f| f.source_id));
    let fields: Vec<_> = table_schema
        .as_struct()
        .fields()
        .iter()
        .filter(|f| columns.contains(&f.id))
        .cloned()
        .collect();
    Ok((
        ids,
        Arc::new(Schema::builder().with_fields(fields).build()?),
    ))
}

impl<B: IcebergWriterBuilder> PartitionedWriter<B> {
    /// Writes a batch (of the writer's input schema).
    pub async fn write(&mut self, batch: &RecordBatch) -> LakeResult<()> {
        let parts: Vec<(Option<PartitionKey>, RecordBatch)> = match &self.partitioner {
            Some(partitioner) => partitioner
                .split(batch)?
                .into_iter()
                .map(|(key, part)| (Some(key), part))
                .collect(),
            None => vec![(None, batch.clone())],
        };
        for (key, part) in parts {
            let slot = key.as_ref().map(|k| k.data().clone());
            if !self.open.contains_key(&slot) {
                if self.open.len() >= self.max_open {
                    self.finish_least_recent().await?;
                }
                let writer = self.builder.build(key.clone()).await?;
                self.open.insert(
                    slot.clone(),
                    OpenWriter {
                        writer,
                        last_used: 0,
                    },
                );
            }
            self.tick += 1;
            let open = self.open.get_mut(&slot).expect("inserted above");
            open.last_used = self.tick;
            let mut offset = 0;
            while offset < part.num_rows() {
                let len = SLICE_ROWS.min(part.num_rows() - offset);
                open.writer.write(part.slice(offset, len)).await?;
                offset += len;
            }
        }
        Ok(())
    }

    async fn finish_least_recent(&mut self) -> LakeResult<()> {
        let oldest = self
            .open
            .iter()
            .min_by_key(|(_, w)| w.last_used)
            .map(|(k, _)| k.clone());
        if let Some(key) = oldest
            && let Some(mut open) = self.open.remove(&key)
        {
            self.finished.extend(open.writer.close().await?);
        }
        Ok(())
    }

    /// Finishes every file and returns them all.
    pub async fn close(mut self) -> LakeResult<Vec<DataFile>> {
        for (_, mut open) in self.open.drain() {
            self.finished.extend(open.writer.close().await?);
        }
        Ok(self.finished)
    }
}

/// Position deletes of rows in one data file.
#[derive(Debug, Clone)]
pub struct PositionDeletes<'a> {
    /// The data file holding the rows.
    pub data_file: &'a DataFile,
    /// Row positions (0-based) in that file.
    pub positions: Vec<i64>,
}

fn position_delete_schema() -> LakeResult<(SchemaRef, Arc<ArrowSchema>)> {
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(
                POS_FILE_PATH_ID,
                "file_path",
                Type::Primitive(PrimitiveType::String),
            )
            .into(),
            NestedField::required(POS_POS_ID, "pos", Type::Primitive(PrimitiveType::Long)).into(),
        ])
        .build()?;
    let field = |name: &str, ty: DataType, id: i32| {
        Field::new(name, ty, false).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_string(),
            id.to_string(),
        )]))
    };
    let arrow = ArrowSchema::new(vec![
        field("file_path", DataType::Utf8, POS_FILE_PATH_ID),
        field("pos", DataType::Int64, POS_POS_ID),
    ]);
    Ok((Arc::new(schema), Arc::new(arrow)))
}

/// Writes position-delete files: one per partition, rows sorted by (file path, position) as
/// the spec requires, `referenced_data_file` set when a file covers one data file.
pub async fn write_position_deletes(
    table: &LoadedTable,
    options: &WriterOptions,
    deletes: &[PositionDeletes<'_>],
) -> LakeResult<Vec<DataFile>> {
    let (schema, arrow_schema) = position_delete_schema()?;
    let spec = table.metadata.default_partition_spec();
    let table_schema = table.metadata.current_schema().clone();
    let mut by_partition: BTreeMap<String, (Struct, Vec<(String, i64)>)> = BTreeMap::new();
    for group in deletes {
        let partition = group.data_file.partition().clone();
        let entry = by_partition
            .entry(format!("{partition:?}"))
            .or_insert_with(|| (partition, Vec::new()));
        for pos in &group.positions {
            entry
                .1
                .push((group.data_file.file_path().to_string(), *pos));
        }
    }
    let rolling = options.rolling(table, schema)?;
    let mut out = Vec::new();
    for (_, (partition, mut rows)) in by_partition {
        rows.sort();
        rows.dedup();
        let key = PartitionKey::new((**spec).clone(), table_schema.clone(), partition.clone());
        let key = (!spec.is_unpartitioned()).then_some(key);
        let mut writer = rolling.build();
        for chunk in rows.chunks(SLICE_ROWS) {
            let paths = StringArray::from_iter_values(chunk.iter().map(|(p, _)| p.as_str()));
            let positions = Int64Array::from_iter_values(chunk.iter().map(|(_, pos)| *pos));
            let batch = RecordBatch::try_new(
                arrow_schema.clone(),
                vec![Arc::new(paths), Arc::new(positions)],
            )
            .map_err(|e| {
                LakeError::new(ErrorKind::Invalid, "position delete batch").with_source(e)
            })?;
            writer.write(&key, &batch).await?;
        }
        let referenced = {
            let first = rows.first().map(|(p, _)| p.clone());
            first.filter(|p| rows.iter().all(|(q, _)| q == p))
        };
        for mut builder in writer.close().await? {
            builder
                .content(DataContentType::PositionDeletes)
                .partition(partition.clone())
                .partition_spec_id(spec.spec_id())
                .referenced_data_file(referenced.clone());
            out.push(builder.build().map_err(|e| {
                LakeError::new(ErrorKind::Invalid, format!("position delete file: {e}"))
            })?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_survive_the_table_properties() {
        let options = WriterOptions {
            target_file_size: 64 << 20,
            zstd_level: 1,
            bloom_filter_columns: vec!["trace_id".into(), "span_id".into()],
            plain_columns: vec!["ts".into(), "trace_id".into()],
            ..WriterOptions::default()
        };
        let properties = options.to_table_properties().into_iter().collect();
        let back = WriterOptions::from_table_properties(&properties);
        assert_eq!(back.target_file_size, 64 << 20);
        assert_eq!(back.zstd_level, 1);
        assert_eq!(back.bloom_filter_columns, ["span_id", "trace_id"]);
        assert_eq!(back.plain_columns, ["ts", "trace_id"]);
        let defaults = WriterOptions::from_table_properties(&Default::default());
        assert_eq!(defaults.zstd_level, WriterOptions::default().zstd_level);
    }
}
