//! Reading a snapshot's live rows: its data files with their position and equality deletes
//! applied by hash lookups.
//!
//! iceberg-rust 0.10's reader turns each equality delete into a predicate evaluated against
//! every row, so its cost grows with rows × deleted keys: a state table of 10k keys took 4.2 s
//! to restore and one of 1M keys did not finish. This reader loads the deletes that can apply
//! once, as a map from each deleted key to the newest sequence number that deleted it (per
//! partition, and one map for deletes of an unpartitioned spec, which apply everywhere), and
//! the position deletes as a map from data file to positions; then it decodes each kept data
//! file once and drops its deleted rows. Cost: one pass over the deletes and one over the data.
//!
//! Contract (the Iceberg v2 rules):
//! * an equality delete applies to a data file of the same partition (or to every data file,
//!   when it belongs to an unpartitioned spec) whose data sequence number is **lower** than
//!   the delete's; a position delete to the file it names when its sequence number is **not
//!   lower** than the file's;
//! * columns are matched by field id: a column a file lacks reads as nulls, a promoted type is
//!   cast to the current one; files without field ids are refused;
//! * batches have the current schema's Arrow fields (with field ids) for the chosen columns;
//!   files are read one after another, batch by batch, so a table bigger than memory is read
//!   with one file's compressed bytes held at a time.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    DataContentType, DataFile, ManifestContentType, ManifestList, ManifestStatus, PartitionSpec,
    Schema,
};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::rest::LoadedTable;
use crate::{ErrorKind, LakeError, LakeResult};

/// Field ids of a position delete file's columns (Iceberg's reserved ids).
const POS_FILE_PATH_ID: i32 = 2_147_483_546;
const POS_POS_ID: i32 = 2_147_483_545;
/// Rows per decoded batch.
const BATCH_ROWS: usize = 8192;

/// Which data files of the table to keep, given their partition spec.
pub type KeepFile = Arc<dyn Fn(&PartitionSpec, &DataFile) -> bool + Send + Sync>;

/// What to read: a snapshot, some columns, some data files.
#[derive(Clone, Default)]
pub struct ReadRequest {
    snapshot_id: Option<i64>,
    columns: Option<Vec<String>>,
    keep: Option<KeepFile>,
}

impl ReadRequest {
    /// Every column of every live row of `main`'s current snapshot.
    pub fn current() -> Self {
        Self::default()
    }

    /// Reads snapshot `id` instead of `main`'s current one.
    pub fn snapshot(mut self, id: i64) -> Self {
        self.snapshot_id = Some(id);
        self
    }

    /// Only these columns (of the current schema), in this order.
    pub fn columns(mut self, columns: &[&str]) -> Self {
        self.columns = Some(columns.iter().map(|c| c.to_string()).collect());
        self
    }

    /// Only the rows of data files `keep` accepts; deletes of other partitions are not read.
    pub fn files(
        mut self,
        keep: impl Fn(&PartitionSpec, &DataFile) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.keep = Some(Arc::new(keep));
        self
    }
}

impl std::fmt::Debug for ReadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadRequest")
            .field("snapshot_id", &self.snapshot_id)
            .field("columns", &self.columns)
            .field("files", &self.keep.as_ref().map(|_| "filtered"))
            .finish()
    }
}

/// Where a file's deletes can reach: its partition spec id and partition (as text).
type Scope = (i32, String);

/// A data file to read, with what decides which of its rows are deleted.
struct DataEntry {
    path: String,
    sequence: i64,
    /// Index into the plan's partition scopes.
    scope: usize,
}

/// A delete file and its data sequence number.
struct DeleteEntry {
    file: DataFile,
    sequence: i64,
    /// `None`: a delete of an unpartitioned spec, which applies to every partition.
    scope: Option<Scope>,
}

/// The live files of a snapshot that a read needs.
#[derive(Default)]
struct Plan {
    data: Vec<DataEntry>,
    scopes: HashMap<Scope, usize>,
    equality: Vec<DeleteEntry>,
    positional: Vec<DeleteEntry>,
    /// The oldest data sequence number of the kept files per scope.
    oldest: Vec<i64>,
}

impl Plan {
    /// The scope index a delete of `scope` with sequence `sequence` can reach (`Some(None)`:
    /// every scope), or `None` when it can reach no kept file. `strict`: only files older
    /// than the delete (equality deletes), else files not newer (position deletes).
    fn reach(&self, scope: &Option<Scope>, sequence: i64, strict: bool) -> Option<Option<usize>> {
        let reaches = |oldest: i64| {
            if strict {
                sequence > oldest
            } else {
                sequence >= oldest
            }
        };
        match scope {
            Some(s) => {
                let index = *self.scopes.get(s)?;
                reaches(self.oldest[index]).then_some(Some(index))
            }
            None => reaches(self.oldest.iter().copied().min()?).then_some(None),
        }
    }
}

/// Deleted keys of one set of equality field ids: key → newest deleting sequence number.
struct EqualityDeletes {
    ids: Vec<i32>,
    /// The key columns (current types, with field ids).
    fields: Vec<Field>,
    converter: RowConverter,
    /// Per partition scope (indexed like the plan's scopes).
    scoped: Vec<HashMap<Box<[u8]>, i64>>,
    /// Deletes of an unpartitioned spec: they apply to every partition.
    global: HashMap<Box<[u8]>, i64>,
}

impl EqualityDeletes {
    fn new(schema: &Schema, ids: Vec<i32>, scopes: usize) -> LakeResult<Self> {
        let fields = fields_of(schema, &ids)?;
        let sort_fields = fields
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(Self {
            ids,
            fields,
            converter: RowConverter::new(sort_fields).map_err(arrow_error)?,
            scoped: vec![HashMap::new(); scopes],
            global: HashMap::new(),
        })
    }

    /// Whether a row of key `key`, in a file of `scope` with sequence `sequence`, is deleted.
    fn deletes(&self, scope: usize, key: &[u8], sequence: i64) -> bool {
        let newer = |map: &HashMap<Box<[u8]>, i64>| map.get(key).is_some_and(|s| *s > sequence);
        newer(&self.scoped[scope]) || newer(&self.global)
    }

    fn applies_to(&self, scope: usize) -> bool {
        !self.scoped[scope].is_empty() || !self.global.is_empty()
    }
}

/// The live rows `request` asks for, as a stream of batches (see the module docs).
pub async fn read_live(
    table: &LoadedTable,
    request: ReadRequest,
) -> LakeResult<BoxStream<'static, LakeResult<RecordBatch>>> {
    let metadata = &table.metadata;
    let snapshot = match request.snapshot_id {
        Some(id) => metadata.snapshot_by_id(id).ok_or_else(|| {
            LakeError::new(
                ErrorKind::NotFound,
                format!("snapshot {id} is not in the table"),
            )
        })?,
        None => match metadata.snapshot_for_ref("main") {
            Some(s) => s,
            None => return Ok(stream::empty().boxed()),
        },
    };
    let schema = metadata.current_schema().clone();
    let output = output_schema(&schema, request.columns.as_deref())?;
    let plan = plan(table, snapshot.manifest_list(), request.keep.as_ref()).await?;
    let equality = Arc::new(equality_deletes(table, &schema, &plan).await?);
    let positions = Arc::new(position_deletes(table, &plan).await?);
    let table = table.clone();
    let files = stream::iter(plan.data).then(move |entry| {
        let (table, output) = (table.clone(), output.clone());
        let (equality, positions) = (equality.clone(), positions.clone());
        async move { read_file(&table, entry, output, equality, &positions).await }
    });
    Ok(files
        .map(|file| match file {
            Ok(batches) => batches,
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
        .filter(|b| futures::future::ready(b.as_ref().map_or(true, |b| b.num_rows() > 0)))
        .boxed())
}

/// The rows snapshot `id` added: the data files its own manifests list as ADDED by it (a
/// compaction's or another writer's files never), with the deletes live at that snapshot
/// applied — what a mirror delivers for it.
pub async fn read_added(table: &LoadedTable, id: i64) -> LakeResult<Vec<RecordBatch>> {
    let metadata = &table.metadata;
    let snapshot = metadata.snapshot_by_id(id).ok_or_else(|| {
        LakeError::new(
            ErrorKind::NotFound,
            format!("snapshot {id} is not in the table (expired?)"),
        )
    })?;
    let bytes = table.io.new_input(snapshot.manifest_list())?.read().await?;
    let list = ManifestList::parse_with_version(&bytes, metadata.format_version())?;
    let mut added = HashSet::new();
    for manifest in list.entries() {
        if manifest.added_snapshot_id != id || manifest.content != ManifestContentType::Data {
            continue;
        }
        for entry in manifest.load_manifest(&table.io).await?.entries() {
            if entry.status() == ManifestStatus::Added && entry.snapshot_id() == Some(id) {
                added.insert(entry.data_file().file_path().to_string());
            }
        }
    }
    if added.is_empty() {
        return Ok(Vec::new());
    }
    let request = ReadRequest::current()
        .snapshot(id)
        .files(move |_, file| added.contains(file.file_path()));
    read_live(table, request).await?.try_collect().await
}

/// The kept data files of the manifest list at `manifest_list`, and every delete file.
async fn plan(
    table: &LoadedTable,
    manifest_list: &str,
    keep: Option<&KeepFile>,
) -> LakeResult<Plan> {
    let metadata = &table.metadata;
    let bytes = table.io.new_input(manifest_list)?.read().await?;
    let list = ManifestList::parse_with_version(&bytes, metadata.format_version())?;
    let mut plan = Plan::default();
    for manifest in list.entries() {
        let spec = metadata
            .partition_spec_by_id(manifest.partition_spec_id)
            .ok_or_else(|| {
                invalid(format!(
                    "manifest of unknown spec {}",
                    manifest.partition_spec_id
                ))
            })?;
        for entry in manifest.load_manifest(&table.io).await?.entries() {
            if !entry.is_alive() {
                continue;
            }
            let file = entry.data_file();
            let sequence = entry.sequence_number().unwrap_or(0);
            let scope = (spec.spec_id(), format!("{:?}", file.partition()));
            match file.content_type() {
                DataContentType::Data => {
                    if keep.is_some_and(|keep| !keep(spec, file)) {
                        continue;
                    }
                    let next = plan.scopes.len();
                    let scope = *plan.scopes.entry(scope).or_insert(next);
                    if scope == plan.oldest.len() {
                        plan.oldest.push(sequence);
                    }
                    plan.oldest[scope] = plan.oldest[scope].min(sequence);
                    plan.data.push(DataEntry {
                        path: file.file_path().to_string(),
                        sequence,
                        scope,
                    });
                }
                DataContentType::EqualityDeletes => plan.equality.push(DeleteEntry {
                    file: file.clone(),
                    sequence,
                    scope: (!spec.is_unpartitioned()).then_some(scope),
                }),
                DataContentType::PositionDeletes => plan.positional.push(DeleteEntry {
                    file: file.clone(),
                    sequence,
                    scope: Some(scope),
                }),
            }
        }
    }
    Ok(plan)
}

/// The equality deletes that reach a kept file, one map per set of equality field ids.
async fn equality_deletes(
    table: &LoadedTable,
    schema: &Schema,
    plan: &Plan,
) -> LakeResult<Vec<EqualityDeletes>> {
    let mut groups: Vec<EqualityDeletes> = Vec::new();
    for delete in &plan.equality {
        let Some(scope) = plan.reach(&delete.scope, delete.sequence, true) else {
            continue;
        };
        let ids = delete.file.equality_ids().unwrap_or_default();
        if ids.is_empty() {
            return Err(invalid(format!(
                "{}: an equality delete file without equality ids",
                delete.file.file_path()
            )));
        }
        let index = match groups.iter().position(|g| g.ids == ids) {
            Some(i) => i,
            None => {
                groups.push(EqualityDeletes::new(schema, ids, plan.scopes.len())?);
                groups.len() - 1
            }
        };
        let group = &mut groups[index];
        for batch in open(table, delete.file.file_path(), &group.fields).await? {
            let columns = project(&batch.map_err(arrow_error)?, &group.fields)?;
            let rows = group
                .converter
                .convert_columns(&columns)
                .map_err(arrow_error)?;
            let map = match scope {
                Some(s) => &mut group.scoped[s],
                None => &mut group.global,
            };
            for row in rows.iter() {
                let newest = map.entry(row.as_ref().into()).or_insert(delete.sequence);
                *newest = (*newest).max(delete.sequence);
            }
        }
    }
    Ok(groups)
}

/// The position deletes of kept files: data file path → (position, sequence number).
async fn position_deletes(
    table: &LoadedTable,
    plan: &Plan,
) -> LakeResult<HashMap<String, Vec<(i64, i64)>>> {
    let kept: HashSet<&str> = plan.data.iter().map(|d| d.path.as_str()).collect();
    let mut positions: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    let fields = position_fields();
    for delete in &plan.positional {
        let elsewhere = delete
            .file
            .referenced_data_file()
            .is_some_and(|p| !kept.contains(p.as_str()));
        if elsewhere || plan.reach(&delete.scope, delete.sequence, false).is_none() {
            continue;
        }
        for batch in open(table, delete.file.file_path(), &fields).await? {
            let columns = project(&batch.map_err(arrow_error)?, &fields)?;
            let paths = columns[0]
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| invalid("position deletes: file_path is not a string"))?;
            let pos = columns[1]
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| invalid("position deletes: pos is not a long"))?;
            for i in 0..paths.len() {
                if kept.contains(paths.value(i)) {
                    positions
                        .entry(paths.value(i).to_string())
                        .or_default()
                        .push((pos.value(i), delete.sequence));
                }
            }
        }
    }
    Ok(positions)
}

/// The live rows of one data file, batch by batch.
async fn read_file(
    table: &LoadedTable,
    entry: DataEntry,
    output: SchemaRef,
    equality: Arc<Vec<EqualityDeletes>>,
    positions: &HashMap<String, Vec<(i64, i64)>>,
) -> LakeResult<BoxStream<'static, LakeResult<RecordBatch>>> {
    let deleted: HashSet<i64> = positions
        .get(&entry.path)
        .into_iter()
        .flatten()
        .filter(|(_, s)| *s >= entry.sequence)
        .map(|(p, _)| *p)
        .collect();
    let applying: Vec<usize> = (0..equality.len())
        .filter(|g| equality[*g].applies_to(entry.scope))
        .collect();
    // The output columns and the key columns of the deletes that apply.
    let mut needed: Vec<Field> = output.fields().iter().map(|f| (**f).clone()).collect();
    for g in &applying {
        for field in &equality[*g].fields {
            if !needed.iter().any(|f| field_id(f) == field_id(field)) {
                needed.push(field.clone());
            }
        }
    }
    let reader = open(table, &entry.path, &needed).await?;
    let mut offset = 0i64;
    let batches = reader.map(move |batch| {
        let batch = batch.map_err(arrow_error)?;
        let rows = batch.num_rows();
        let mut keep: Vec<bool> = (0..rows)
            .map(|i| !deleted.contains(&(offset + i as i64)))
            .collect();
        offset += rows as i64;
        for g in &applying {
            let group = &equality[*g];
            let columns = project(&batch, &group.fields)?;
            let keys = group
                .converter
                .convert_columns(&columns)
                .map_err(arrow_error)?;
            for (i, key) in keys.iter().enumerate() {
                if keep[i] && group.deletes(entry.scope, key.as_ref(), entry.sequence) {
                    keep[i] = false;
                }
            }
        }
        let columns = project(&batch, output.fields().iter().map(|f| &**f))?;
        let projected = RecordBatch::try_new(output.clone(), columns).map_err(arrow_error)?;
        if keep.iter().all(|k| *k) {
            return Ok(projected);
        }
        arrow_select::filter::filter_record_batch(&projected, &BooleanArray::from(keep))
            .map_err(arrow_error)
    });
    Ok(stream::iter(batches).boxed())
}

/// The Arrow schema of the chosen columns of `schema` (all, when `columns` is `None`).
fn output_schema(schema: &Schema, columns: Option<&[String]>) -> LakeResult<SchemaRef> {
    let all = schema_to_arrow_schema(schema)?;
    let Some(columns) = columns else {
        return Ok(Arc::new(all));
    };
    let fields: Vec<Field> = columns
        .iter()
        .map(|c| {
            all.field_with_name(c).cloned().map_err(|_| {
                LakeError::new(ErrorKind::Invalid, format!("the table has no column {c:?}"))
            })
        })
        .collect::<LakeResult<_>>()?;
    Ok(Arc::new(ArrowSchema::new(fields)))
}

/// The Arrow fields (current types, with field ids) of top-level fields `ids`.
fn fields_of(schema: &Schema, ids: &[i32]) -> LakeResult<Vec<Field>> {
    let all = schema_to_arrow_schema(schema)?;
    ids.iter()
        .map(|id| {
            all.fields()
                .iter()
                .find(|f| field_id(f) == Some(*id))
                .map(|f| (**f).clone())
                .ok_or_else(|| {
                    invalid(format!(
                        "equality deletes on field {id}, which is not a top-level column"
                    ))
                })
        })
        .collect()
}

fn position_fields() -> Vec<Field> {
    let field = |name: &str, ty, id: i32| {
        Field::new(name, ty, false).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_string(),
            id.to_string(),
        )]))
    };
    vec![
        field("file_path", DataType::Utf8, POS_FILE_PATH_ID),
        field("pos", DataType::Int64, POS_POS_ID),
    ]
}

fn field_id(field: &Field) -> Option<i32> {
    field
        .metadata()
        .get(PARQUET_FIELD_ID_META_KEY)
        .and_then(|v| v.parse().ok())
}

/// Opens the Parquet file at `path`, decoding only the top-level columns whose field ids
/// `fields` name (columns the file lacks are filled in by [`project`]).
async fn open(
    table: &LoadedTable,
    path: &str,
    fields: &[Field],
) -> LakeResult<ParquetRecordBatchReader> {
    let bytes = table.io.new_input(path)?.read().await?;
    let cannot = |e: parquet::errors::ParquetError| {
        LakeError::new(ErrorKind::Invalid, format!("cannot read {path}")).with_source(e)
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(cannot)?;
    let wanted: HashSet<i32> = fields.iter().filter_map(field_id).collect();
    let file_schema = builder.schema().clone();
    let mut roots = Vec::new();
    for (index, field) in file_schema.fields().iter().enumerate() {
        match field_id(field) {
            Some(id) if wanted.contains(&id) => roots.push(index),
            Some(_) => {}
            None => {
                return Err(invalid(format!(
                    "{path}: column {} has no field id (files without field ids are not read)",
                    field.name()
                )));
            }
        }
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(cannot)
}

/// The columns of `batch` for `fields`, matched by field id: cast to each field's type, or
/// all nulls when the file lacks the column.
fn project<'a>(
    batch: &RecordBatch,
    fields: impl IntoIterator<Item = &'a Field>,
) -> LakeResult<Vec<ArrayRef>> {
    let schema = batch.schema();
    fields
        .into_iter()
        .map(|field| {
            let id = field_id(field);
            let found = schema
                .fields()
                .iter()
                .position(|f| id.is_some() && field_id(f) == id);
            match found {
                None => Ok(arrow_array::new_null_array(
                    field.data_type(),
                    batch.num_rows(),
                )),
                Some(i) if batch.column(i).data_type() == field.data_type() => {
                    Ok(batch.column(i).clone())
                }
                Some(i) => arrow_cast::cast(batch.column(i), field.data_type()).map_err(|e| {
                    invalid(format!(
                        "column {} cannot be read as {}",
                        field.name(),
                        field.data_type()
                    ))
                    .with_source(e)
                }),
            }
        })
        .collect()
}

fn invalid(message: impl Into<String>) -> LakeError {
    LakeError::new(ErrorKind::Invalid, message)
}

fn arrow_error(e: arrow_schema::ArrowError) -> LakeError {
    LakeError::new(ErrorKind::Invalid, "cannot decode rows").with_source(e)
}
