//! Tables a writer owns in the catalog: created on first use, evolved when the rows gain
//! columns, and batches conformed to each table's current schema.
//!
//! A table's field ids are the catalog's (a REST catalog renumbers a new table's fields), so
//! batches are matched to the table **by column name**: columns the table has and the format
//! does not (added by someone else) are written as nulls; nested types take the table's field
//! ids without copying any buffer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::rest::{CatalogClient, LoadedTable, TableCommit};
use crate::{ErrorKind, LakeError, LakeResult};
use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};
use iceberg::spec::{
    ListType, MapType, NestedField, Schema, StructType, Type, UnboundPartitionSpec,
};
use iceberg::{NamespaceIdent, TableIdent, TableRequirement, TableUpdate};
use iceberg_catalog_rest::CreateTableRequest;

/// One partition field: `transform(column)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    /// Source column.
    pub column: String,
    /// Iceberg transform.
    pub transform: iceberg::spec::Transform,
}

impl PartitionField {
    /// Parses `transform(column)` (transforms: identity, year, month, day, hour, `bucket[N]`,
    /// `truncate[W]`; also written `bucket(N, column)`).
    pub fn parse(text: &str) -> Result<Self, String> {
        use iceberg::spec::Transform;
        let bad = || {
            format!(
                "{text:?} is not a partition field like \"day(ts)\", \"bucket(16, service_name)\" or \"identity(region)\""
            )
        };
        let (name, rest) = text.trim().split_once('(').ok_or_else(bad)?;
        let inner = rest.strip_suffix(')').ok_or_else(bad)?;
        let args: Vec<&str> = inner.split(',').map(str::trim).collect();
        let number = |s: &str| s.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(bad);
        let (transform, column) = match (name.trim(), args.as_slice()) {
            ("identity", [c]) => (Transform::Identity, *c),
            ("year", [c]) => (Transform::Year, *c),
            ("month", [c]) => (Transform::Month, *c),
            ("day", [c]) => (Transform::Day, *c),
            ("hour", [c]) => (Transform::Hour, *c),
            ("bucket", [n, c]) => (Transform::Bucket(number(n)?), *c),
            ("truncate", [w, c]) => (Transform::Truncate(number(w)?), *c),
            _ => return Err(bad()),
        };
        if column.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            column: column.to_string(),
            transform,
        })
    }

    /// `day(column)`: the default partitioning of time-ordered tables.
    pub fn day(column: &str) -> Self {
        Self {
            column: column.to_string(),
            transform: iceberg::spec::Transform::Day,
        }
    }
}

/// The Arrow schema of an Iceberg schema (with field ids in the metadata).
pub fn arrow_schema(schema: &Schema) -> LakeResult<SchemaRef> {
    Ok(Arc::new(
        iceberg::arrow::schema_to_arrow_schema(schema)
            .map_err(|e| LakeError::new(ErrorKind::Invalid, "table schema").with_source(e))?,
    ))
}

/// What a table should look like.
#[derive(Debug, Clone)]
pub struct Wanted<'a> {
    /// Table name within the namespace.
    pub name: &'a str,
    /// Columns (field ids are the catalog's once created).
    pub schema: &'a Schema,
    /// Partition fields of a new table.
    pub partition: &'a [PartitionField],
    /// Properties of a new table.
    pub properties: &'a BTreeMap<String, String>,
    /// Properties set on a new table and kept current on an existing one.
    pub maintained: &'a BTreeMap<String, String>,
}

/// Loads the table, creating it if missing and adding the columns it lacks.
pub async fn ensure_table(
    client: &CatalogClient,
    namespace: &str,
    wanted: &Wanted<'_>,
) -> LakeResult<LoadedTable> {
    let ident = TableIdent::new(
        NamespaceIdent::new(namespace.to_string()),
        wanted.name.to_string(),
    );
    let table = match client.load_table(&ident).await {
        Ok(table) => table,
        Err(e) if e.kind() == ErrorKind::NotFound => match create(client, &ident, wanted).await {
            Ok(table) => return Ok(table),
            // Another replica created it first.
            Err(e) if e.kind() == ErrorKind::Conflict => client.load_table(&ident).await?,
            Err(e) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let table = evolve(client, table, wanted.schema).await?;
    keep_properties(client, table, wanted.maintained).await
}

/// Sets the properties of `maintained` the table lacks or holds other values of.
async fn keep_properties(
    client: &CatalogClient,
    table: LoadedTable,
    maintained: &BTreeMap<String, String>,
) -> LakeResult<LoadedTable> {
    let current = table.metadata.properties();
    let updates: HashMap<String, String> = maintained
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if updates.is_empty() {
        return Ok(table);
    }
    tracing::info!(table = %table.ident, properties = ?updates.keys().collect::<Vec<_>>(), "updating table properties");
    client
        .commit_table(&TableCommit {
            ident: table.ident.clone(),
            requirements: vec![TableRequirement::UuidMatch {
                uuid: table.metadata.uuid(),
            }],
            updates: vec![TableUpdate::SetProperties { updates }],
        })
        .await?;
    client.load_table(&table.ident).await
}

async fn create(
    client: &CatalogClient,
    ident: &TableIdent,
    wanted: &Wanted<'_>,
) -> LakeResult<LoadedTable> {
    let mut spec = UnboundPartitionSpec::builder();
    for field in wanted.partition {
        let source = wanted.schema.field_by_name(&field.column).ok_or_else(|| {
            LakeError::new(
                ErrorKind::Invalid,
                format!("no column {} to partition {} by", field.column, wanted.name),
            )
        })?;
        let name = match field.transform {
            iceberg::spec::Transform::Identity => field.column.clone(),
            t => format!("{}_{}", field.column, transform_suffix(t)),
        };
        spec = spec
            .add_partition_field(source.id, name, field.transform)
            .map_err(|e| LakeError::new(ErrorKind::Invalid, "bad partition spec").with_source(e))?;
    }
    let mut properties: HashMap<String, String> = HashMap::from([
        ("format-version".into(), "2".into()),
        ("write.parquet.compression-codec".into(), "zstd".into()),
        (
            "write.metadata.delete-after-commit.enabled".into(),
            "true".into(),
        ),
        ("write.metadata.previous-versions-max".into(), "100".into()),
    ]);
    properties.extend(wanted.properties.clone());
    properties.extend(wanted.maintained.clone());
    tracing::info!(table = %ident, "creating table");
    client
        .create_table(
            ident,
            &CreateTableRequest {
                name: wanted.name.to_string(),
                location: None,
                schema: wanted.schema.clone(),
                partition_spec: Some(spec.build()),
                write_order: None,
                stage_create: None,
                properties,
            },
        )
        .await
}

fn transform_suffix(t: iceberg::spec::Transform) -> String {
    use iceberg::spec::Transform;
    match t {
        Transform::Year => "year".into(),
        Transform::Month => "month".into(),
        Transform::Day => "day".into(),
        Transform::Hour => "hour".into(),
        Transform::Bucket(n) => format!("bucket_{n}"),
        Transform::Truncate(w) => format!("trunc_{w}"),
        other => other.to_string(),
    }
}

/// Adds the top-level columns of `wanted` the table lacks (with fresh field ids).
async fn evolve(
    client: &CatalogClient,
    table: LoadedTable,
    wanted: &Schema,
) -> LakeResult<LoadedTable> {
    let current = table.metadata.current_schema();
    let missing: Vec<&NestedField> = wanted
        .as_struct()
        .fields()
        .iter()
        .filter(|f| current.field_by_name(&f.name).is_none())
        .map(|f| f.as_ref())
        .collect();
    if missing.is_empty() {
        return Ok(table);
    }
    let mut next_id = table.metadata.last_column_id();
    let mut fields: Vec<Arc<NestedField>> = current.as_struct().fields().to_vec();
    for field in &missing {
        // Added columns are optional: existing rows have no value.
        fields.push(Arc::new(renumber_field(field, &mut next_id, false)));
    }
    let schema = Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(current.identifier_field_ids())
        .build()
        .map_err(|e| LakeError::new(ErrorKind::Invalid, "evolved schema").with_source(e))?;
    tracing::info!(
        table = %table.ident,
        columns = ?missing.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        "adding columns"
    );
    client
        .commit_table(&TableCommit {
            ident: table.ident.clone(),
            requirements: vec![
                TableRequirement::UuidMatch {
                    uuid: table.metadata.uuid(),
                },
                TableRequirement::CurrentSchemaIdMatch {
                    current_schema_id: current.schema_id(),
                },
            ],
            updates: vec![
                TableUpdate::AddSchema { schema },
                TableUpdate::SetCurrentSchema { schema_id: -1 },
            ],
        })
        .await?;
    client.load_table(&table.ident).await
}

fn renumber_field(field: &NestedField, next_id: &mut i32, required: bool) -> NestedField {
    *next_id += 1;
    let id = *next_id;
    let ty = renumber(&field.field_type, next_id);
    let mut out = if required {
        NestedField::required(id, field.name.clone(), ty)
    } else {
        NestedField::optional(id, field.name.clone(), ty)
    };
    out.doc = field.doc.clone();
    out
}

fn renumber(ty: &Type, next_id: &mut i32) -> Type {
    match ty {
        Type::Primitive(_) => ty.clone(),
        Type::Struct(s) => Type::Struct(StructType::new(
            s.fields()
                .iter()
                .map(|f| Arc::new(renumber_field(f, next_id, f.required)))
                .collect(),
        )),
        Type::List(l) => Type::List(ListType::new(Arc::new(renumber_field(
            &l.element_field,
            next_id,
            l.element_field.required,
        )))),
        Type::Map(m) => Type::Map(MapType::new(
            Arc::new(renumber_field(&m.key_field, next_id, true)),
            Arc::new(renumber_field(
                &m.value_field,
                next_id,
                m.value_field.required,
            )),
        )),
    }
}

/// `batch` with the table's columns, in the table's order and types (by name; absent → null).
pub fn conform(batch: &RecordBatch, target: &SchemaRef) -> LakeResult<RecordBatch> {
    let columns: Vec<ArrayRef> = target
        .fields()
        .iter()
        .map(|field| match batch.column_by_name(field.name()) {
            Some(column) if column.data_type() == field.data_type() => Ok(column.clone()),
            Some(column) => retype(column.to_data(), field.data_type())
                .map(arrow_array::make_array)
                .map_err(|e| {
                    LakeError::new(
                        ErrorKind::Invalid,
                        format!("column {} does not fit the table: {e}", field.name()),
                    )
                }),
            None => Ok(new_null_array(field.data_type(), batch.num_rows())),
        })
        .collect::<LakeResult<_>>()?;
    RecordBatch::try_new(target.clone(), columns).map_err(|e| {
        LakeError::new(ErrorKind::Invalid, "batch does not fit the table").with_source(e)
    })
}

/// The same array with the nested field names, nullability and ids of `to`.
fn retype(data: ArrayData, to: &DataType) -> Result<ArrayData, arrow_schema::ArrowError> {
    let children: Vec<&DataType> = match to {
        DataType::List(f) | DataType::LargeList(f) | DataType::Map(f, _) => vec![f.data_type()],
        DataType::Struct(fields) => fields.iter().map(|f| f.data_type()).collect(),
        _ => Vec::new(),
    };
    if children.len() != data.child_data().len() {
        return Err(arrow_schema::ArrowError::SchemaError(format!(
            "{} cannot become {to}",
            data.data_type()
        )));
    }
    let child_data = data
        .child_data()
        .iter()
        .zip(children)
        .map(|(child, ty)| retype(child.clone(), ty))
        .collect::<Result<Vec<_>, _>>()?;
    data.into_builder()
        .data_type(to.clone())
        .child_data(child_data)
        .build()
}
