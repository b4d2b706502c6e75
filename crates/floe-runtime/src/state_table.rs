//! The job's **state table**: the durable copy of its operators' keyed state, one Iceberg
//! table committed in the same multi-table commit as the outputs and the positions.
//!
//! Rows are `(operator, partition, key, value)` with the first three as identifier fields,
//! partitioned by operator and source partition: each checkpoint upserts the keys its epoch
//! changed (equality deletes and new rows, like any changelog table), so a checkpoint writes
//! what changed, never what is held. Restoring a partition reads its rows — only that
//! partition's files, deletes applied by `floe_lake::read` — into the local RocksDB. Files no snapshot references any more are
//! ordinary orphans; `floe-maintenance` compacts and expires the table like any other (keep
//! its compaction frequent: a restore reads every file of the partition).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::builder::{Int8Builder, LargeBinaryBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use floe_core::{OP_COLUMN, Op, StreamSpec};
use floe_lake::read::{ReadRequest, read_live};
use floe_lake::rest::LoadedTable;
use floe_lake::{ErrorKind, LakeError, LakeResult};
use floe_state::Change;
use futures::TryStreamExt;
use iceberg::spec::{Literal, NestedField, PrimitiveType, Schema, Type};

/// The stream name of the state table's rows.
pub(crate) const STREAM: &str = "__state";

/// The state table of job `job`, unless the job file names another.
pub(crate) fn default_name(job: &str) -> String {
    format!("floe_state_{}", job.replace(['-', '.'], "_"))
}

/// The state table as a changelog stream keyed by `(operator, partition, key)`.
pub(crate) fn spec(table: &str) -> StreamSpec {
    let p = |t| Type::Primitive(t);
    let schema = Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(
                1,
                "operator",
                p(PrimitiveType::String),
            )),
            Arc::new(NestedField::required(
                2,
                "partition",
                p(PrimitiveType::String),
            )),
            Arc::new(NestedField::required(3, "key", p(PrimitiveType::Binary))),
            Arc::new(NestedField::optional(4, "value", p(PrimitiveType::Binary))),
        ])
        .with_identifier_field_ids(vec![1, 2, 3])
        .build()
        .expect("a valid schema");
    StreamSpec {
        name: STREAM.to_string(),
        table: table.to_string(),
        schema: Some(schema),
        changelog: true,
        key: vec!["operator".into(), "partition".into(), "key".into()],
        time_column: None,
        partition: vec![
            ("operator".into(), iceberg::spec::Transform::Identity),
            ("partition".into(), iceberg::spec::Transform::Identity),
        ],
        bloom_filter_columns: Vec::new(),
        plain_columns: vec!["key".into(), "value".into()],
        properties: Vec::new(),
    }
}

/// Changelog rows of an epoch's changes, and deletes of `resets` (`(operator, partition,
/// key)` rows of operators whose state was dropped); `operators` and `partitions` name the
/// indices. Returns the batch (none when nothing changed) and its bytes of keys and values.
pub(crate) fn changes_batch(
    changes: &[Change],
    resets: &[(String, String, Vec<u8>)],
    operators: &[String],
    partitions: &dyn Fn(u32) -> String,
) -> (Option<RecordBatch>, u64) {
    if changes.is_empty() && resets.is_empty() {
        return (None, 0);
    }
    // Sized up front: a checkpoint's changes can be hundreds of MiB, and builders that grow
    // by doubling copy them and fault fresh pages in again at every step.
    let rows = changes.len() + resets.len();
    let key_bytes = changes.iter().map(|c| c.key.len()).sum::<usize>()
        + resets.iter().map(|r| r.2.len()).sum::<usize>();
    let value_bytes = changes
        .iter()
        .filter_map(|c| c.value.as_ref())
        .map(Vec::len)
        .sum();
    let name_bytes = operators.iter().map(String::len).max().unwrap_or(0);
    let mut operator = StringBuilder::with_capacity(rows, rows * name_bytes);
    let mut partition = StringBuilder::with_capacity(rows, rows * 16);
    let mut key = LargeBinaryBuilder::with_capacity(rows, key_bytes);
    let mut value = LargeBinaryBuilder::with_capacity(rows, value_bytes);
    let mut op = Int8Builder::with_capacity(rows);
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut bytes = 0u64;
    // In operator and partition order — the table's partitioning — so the writers split the
    // batch into runs, not row by row.
    let mut order: Vec<&Change> = changes.iter().collect();
    order.sort_unstable_by_key(|c| (c.operator, c.partition));
    for c in order {
        operator.append_value(
            operators
                .get(c.operator as usize)
                .map(String::as_str)
                .unwrap_or_default(),
        );
        let name = names
            .entry(c.partition)
            .or_insert_with(|| partitions(c.partition));
        partition.append_value(name);
        key.append_value(&c.key);
        bytes += c.key.len() as u64;
        match &c.value {
            Some(v) => {
                bytes += v.len() as u64;
                value.append_value(v);
                op.append_value(Op::UpdateAfter.code());
            }
            None => {
                value.append_null();
                op.append_value(Op::Delete.code());
            }
        }
    }
    for (o, p, k) in resets {
        operator.append_value(o);
        partition.append_value(p);
        key.append_value(k);
        value.append_null();
        op.append_value(Op::Delete.code());
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(operator.finish()),
        Arc::new(partition.finish()),
        Arc::new(key.finish()),
        Arc::new(value.finish()),
        Arc::new(op.finish()),
    ];
    let schema = ArrowSchema::new(vec![
        Field::new("operator", DataType::Utf8, false),
        Field::new("partition", DataType::Utf8, false),
        Field::new("key", DataType::LargeBinary, false),
        Field::new("value", DataType::LargeBinary, true),
        Field::new(OP_COLUMN, DataType::Int8, false),
    ]);
    (
        Some(RecordBatch::try_new(Arc::new(schema), columns).expect("columns match")),
        bytes,
    )
}

/// Calls `each(operator, partition, key, value)` for every row of the state table's current
/// snapshot in `partitions`, batch by batch (a state bigger than memory is restored without
/// holding it); stops at the first error `each` returns.
pub(crate) async fn read(
    table: &LoadedTable,
    partitions: &[String],
    mut each: impl FnMut(&str, &str, &[u8], &[u8]) -> LakeResult<()>,
) -> LakeResult<u64> {
    if partitions.is_empty() || table.metadata.current_snapshot_id().is_none() {
        return Ok(0);
    }
    let wanted: HashSet<String> = partitions.iter().cloned().collect();
    let literals: Vec<Literal> = partitions.iter().map(Literal::string).collect();
    // Only the files of the partitions read (a spec without the column keeps every file, and
    // the rows are filtered below).
    let request = ReadRequest::current()
        .columns(&["operator", "partition", "key", "value"])
        .files(move |spec, file| {
            let Some(index) = spec.fields().iter().position(|f| f.name == "partition") else {
                return true;
            };
            file.partition().fields()[index]
                .as_ref()
                .is_some_and(|value| literals.contains(value))
        });
    let mut stream = read_live(table, request).await?;
    let mut rows = 0;
    while let Some(b) = stream.try_next().await? {
        let bad = || LakeError::new(ErrorKind::Invalid, "the state table's columns changed");
        let operator = b.column(0).as_string_opt::<i32>().ok_or_else(bad)?;
        let partition = b.column(1).as_string_opt::<i32>().ok_or_else(bad)?;
        let key = b.column(2).as_binary_opt::<i64>().ok_or_else(bad)?;
        let value = b.column(3).as_binary_opt::<i64>().ok_or_else(bad)?;
        for i in 0..b.num_rows() {
            if value.is_null(i) || !wanted.contains(partition.value(i)) {
                continue;
            }
            each(
                operator.value(i),
                partition.value(i),
                key.value(i),
                value.value(i),
            )?;
            rows += 1;
        }
    }
    Ok(rows)
}
