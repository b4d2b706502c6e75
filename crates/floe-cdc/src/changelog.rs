//! Changelog rows of a followed table, built from decoded tuples (Postgres text values, or
//! values a Debezium event carries already typed).
//!
//! Each change becomes one row with its [`Op`] in [`OP_COLUMN`]: an insert `+I`, an update
//! `+U` (an update that changes the key: `-D` of the old key and `+I` of the new, which a
//! primary key guarantees did not exist), a delete `-D` carrying only the key columns. The
//! runtime's upsert sink collapses the rows per key. A TOASTed value an update left untouched
//! ([`Value::Unchanged`]) that the old row could not supply is left NULL and named in
//! [`UNCHANGED_COLUMN`]: the sink fills it from the key's earlier image in the checkpoint, or
//! refuses the change — it is never written as NULL.
//!
//! When the table's columns change mid-stream ([`ChangelogBuilder::set_layout`]), the rows so
//! far become a batch of their own, so every batch has one layout.

use std::sync::Arc;

use arrow_array::builder::{Int8Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use floe_core::{OP_COLUMN, Op, StreamSpec, UNCHANGED_COLUMN};

use crate::pgoutput::Value;
use crate::types::{ColumnBuilder, Native, PgType};

/// A column of a followed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Name.
    pub name: String,
    /// Type.
    pub ty: PgType,
    /// Part of the key.
    pub key: bool,
}

/// The columns of a table as of some point of the stream; tuples are in this order.
pub type Layout = Arc<Vec<Column>>;

/// The Iceberg table of a source table when the job file does not name it: the table's own
/// name in `public`, `schema_table` elsewhere — one rule for the Postgres source and Debezium.
pub fn default_table_name(schema: &str, table: &str) -> String {
    if schema == "public" {
        table.to_string()
    } else {
        format!("{schema}_{table}")
    }
}

/// The stream of a followed table (Postgres or Debezium): changelog rows keyed by the
/// layout's key columns, landing in Iceberg table `table` with `schema`.
pub fn changelog_stream(
    name: String,
    table: String,
    schema: iceberg::spec::Schema,
    layout: &[Column],
) -> StreamSpec {
    StreamSpec {
        name,
        table,
        schema: Some(schema),
        changelog: true,
        key: key_names(layout),
        time_column: None,
        partition: Vec::new(),
        bloom_filter_columns: Vec::new(),
        plain_columns: Vec::new(),
        properties: Vec::new(),
    }
}

/// The names of the key columns, in column order.
pub fn key_names(columns: &[Column]) -> Vec<String> {
    columns
        .iter()
        .filter(|c| c.key)
        .map(|c| c.name.clone())
        .collect()
}

/// The key values of `tuple` (encoded), or `None` when one is missing: two tuples of a
/// layout whose key values took the same form (text, or native) have the same key exactly
/// when these are equal.
pub fn key_of(layout: &[Column], tuple: &[Value]) -> Option<Vec<u8>> {
    let mut encoded = Vec::new();
    for (column, value) in layout.iter().zip(tuple) {
        if !column.key {
            continue;
        }
        match value {
            Value::Text(v) => {
                encoded.extend_from_slice(&(v.len() as u32).to_le_bytes());
                encoded.extend_from_slice(v);
            }
            // Tagged apart from any text (no text is u32::MAX bytes long).
            Value::Native(v) => {
                let (tag, bits) = match *v {
                    Native::Decimal(n) => (0, n),
                    Native::Date(n) => (1, n as i128),
                    Native::Time(n) => (2, n as i128),
                    Native::Timestamp(n) => (3, n as i128),
                };
                encoded.extend_from_slice(&u32::MAX.to_le_bytes());
                encoded.push(tag);
                encoded.extend_from_slice(&bits.to_le_bytes());
            }
            Value::Null | Value::Unchanged => return None,
        }
    }
    Some(encoded)
}

/// Changelog rows of one table.
#[derive(Debug)]
pub struct ChangelogBuilder {
    layout: Layout,
    columns: Vec<ColumnBuilder>,
    ops: Int8Builder,
    unchanged: StringBuilder,
    any_unchanged: bool,
    rows: usize,
    bytes: usize,
    done: Vec<RecordBatch>,
}

impl ChangelogBuilder {
    /// An empty builder for tuples in `layout`.
    pub fn new(layout: Layout) -> Self {
        let columns = layout
            .iter()
            .map(|c| ColumnBuilder::new(c.ty, 1024))
            .collect();
        Self {
            layout,
            columns,
            ops: Int8Builder::new(),
            unchanged: StringBuilder::new(),
            any_unchanged: false,
            rows: 0,
            bytes: 0,
            done: Vec::new(),
        }
    }

    /// The layout tuples are read in.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Tuples from now on are in `layout` (the rows so far become a batch of their own).
    pub fn set_layout(&mut self, layout: Layout) -> Result<(), String> {
        self.seal()?;
        *self = Self {
            done: std::mem::take(&mut self.done),
            bytes: self.bytes,
            ..Self::new(layout)
        };
        Ok(())
    }

    /// Rows not taken yet.
    pub fn rows(&self) -> usize {
        self.rows + self.done.iter().map(RecordBatch::num_rows).sum::<usize>()
    }

    /// Approximate bytes of values not taken yet.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Appends one change row. `Err` says why the value cannot be represented (nothing was
    /// appended then).
    pub fn push(&mut self, op: Op, tuple: &[Value]) -> Result<(), String> {
        if tuple.len() > self.layout.len() {
            return Err(format!(
                "a tuple of {} values for {} columns",
                tuple.len(),
                self.layout.len()
            ));
        }
        // Validate first, so that a refused value leaves no half row behind.
        let mut unchanged = Vec::new();
        for (column, value) in self.layout.iter().zip(tuple) {
            if *value == Value::Unchanged {
                if !op.is_image() || op == Op::Insert {
                    return Err(format!(
                        "a {} change carries an unchanged TOASTed value in {}",
                        op.symbol(),
                        column.name
                    ));
                }
                unchanged.push(column.name.as_str());
            }
        }
        for (i, builder) in self.columns.iter_mut().enumerate() {
            let appended = match tuple.get(i) {
                Some(Value::Text(text)) => {
                    self.bytes += text.len() + 8;
                    builder.append(Some(text))
                }
                Some(Value::Native(value)) => {
                    self.bytes += 16 + 8;
                    builder.append_native(*value)
                }
                _ => {
                    self.bytes += 8;
                    builder.append(None)
                }
            };
            if let Err(e) = appended {
                // Columns appended so far cannot be taken back: seal what came before this
                // row and drop the half row by rebuilding from the sealed batches.
                return Err(self.discard_half_row(i, e));
            }
        }
        self.ops.append_value(op.code());
        if unchanged.is_empty() {
            self.unchanged.append_null();
        } else {
            self.any_unchanged = true;
            self.unchanged.append_value(unchanged.join(","));
        }
        self.rows += 1;
        Ok(())
    }

    /// A value of column `failed` did not parse after columns `..failed` were appended: the
    /// row is dropped (every builder is rebuilt from the rows before it).
    fn discard_half_row(&mut self, failed: usize, error: String) -> String {
        let column = self.layout[failed].name.clone();
        // Finish the partial columns: the complete ones have `rows + 1` values, the rest
        // `rows`; keep `rows` of each.
        let rows = self.rows;
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|b| {
                let a = b.finish();
                a.slice(0, rows)
            })
            .collect();
        let ops = self.ops.finish();
        let unchanged = self.unchanged.finish();
        self.rows = 0;
        if rows > 0 {
            match self.batch(arrays, Arc::new(ops), Arc::new(unchanged)) {
                Ok(batch) => self.done.push(batch),
                Err(e) => return format!("column {column}: {error} (and {e})"),
            }
        }
        format!("column {column}: {error}")
    }

    fn batch(
        &self,
        arrays: Vec<ArrayRef>,
        ops: ArrayRef,
        unchanged: ArrayRef,
    ) -> Result<RecordBatch, String> {
        let mut fields: Vec<Field> = self
            .layout
            .iter()
            .zip(&arrays)
            .map(|(c, a)| Field::new(&c.name, a.data_type().clone(), true))
            .collect();
        let mut columns = arrays;
        fields.push(Field::new(OP_COLUMN, DataType::Int8, false));
        columns.push(ops);
        if self.any_unchanged {
            fields.push(Field::new(UNCHANGED_COLUMN, DataType::Utf8, true));
            columns.push(unchanged);
        }
        RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).map_err(|e| e.to_string())
    }

    fn seal(&mut self) -> Result<(), String> {
        if self.rows == 0 {
            return Ok(());
        }
        let arrays: Vec<ArrayRef> = self.columns.iter_mut().map(|b| b.finish()).collect();
        let ops = Arc::new(self.ops.finish());
        let unchanged = Arc::new(self.unchanged.finish());
        let batch = self.batch(arrays, ops, unchanged)?;
        self.done.push(batch);
        self.rows = 0;
        self.any_unchanged = false;
        Ok(())
    }

    /// The rows so far, one batch per layout; empty afterwards.
    pub fn take(&mut self) -> Result<Vec<RecordBatch>, String> {
        self.seal()?;
        self.bytes = 0;
        Ok(std::mem::take(&mut self.done))
    }

    /// Forgets every row not taken.
    pub fn clear(&mut self) {
        *self = Self::new(self.layout.clone());
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int8Type, Int64Type};
    use bytes::Bytes;

    use super::*;
    use crate::pgoutput::Tuple;
    use crate::types::Scalar;

    fn layout() -> Layout {
        let col = |name: &str, scalar, key| Column {
            name: name.into(),
            ty: PgType {
                scalar,
                array: false,
            },
            key,
        };
        Arc::new(vec![
            col("id", Scalar::Long, true),
            col("body", Scalar::Text, false),
        ])
    }

    fn t(id: &str, body: Option<&str>) -> Tuple {
        vec![
            Value::Text(Bytes::copy_from_slice(id.as_bytes())),
            match body {
                None => Value::Null,
                Some("<u>") => Value::Unchanged,
                Some(b) => Value::Text(Bytes::copy_from_slice(b.as_bytes())),
            },
        ]
    }

    #[test]
    fn rows_carry_ops_and_unchanged_columns() {
        let mut b = ChangelogBuilder::new(layout());
        b.push(Op::Insert, &t("1", Some("a"))).unwrap();
        b.push(Op::UpdateAfter, &t("1", Some("<u>"))).unwrap();
        b.push(Op::Delete, &t("2", None)).unwrap();
        assert!(b.push(Op::Insert, &t("3", Some("<u>"))).is_err());
        let batches = b.take().unwrap();
        assert_eq!(batches.len(), 1);
        let batch = &batches[0];
        let ids = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(ids, vec![1, 1, 2]);
        let ops = batch
            .column_by_name(OP_COLUMN)
            .unwrap()
            .as_primitive::<Int8Type>()
            .values()
            .to_vec();
        assert_eq!(ops, vec![0, 2, 3]);
        let unchanged = batch
            .column_by_name(UNCHANGED_COLUMN)
            .unwrap()
            .as_string::<i32>();
        assert!(unchanged.is_null(0));
        assert_eq!(unchanged.value(1), "body");
        assert_eq!(b.rows(), 0);
    }

    /// Typed values (a Debezium event's) go into their columns as they are, keys included.
    #[test]
    fn native_values_are_appended_and_keyed() {
        use arrow_array::types::Decimal128Type;

        let layout: Layout = Arc::new(vec![
            Column {
                name: "amount".into(),
                ty: PgType {
                    scalar: Scalar::Decimal {
                        precision: 38,
                        scale: 2,
                    },
                    array: false,
                },
                key: true,
            },
            Column {
                name: "body".into(),
                ty: PgType {
                    scalar: Scalar::Text,
                    array: false,
                },
                key: false,
            },
        ]);
        let max = 10i128.pow(38) - 1;
        let row = |unscaled| {
            vec![
                Value::Native(Native::Decimal(unscaled)),
                Value::Text(Bytes::from_static(b"x")),
            ]
        };
        assert!(key_of(&layout, &row(max)).is_some());
        assert_ne!(key_of(&layout, &row(max)), key_of(&layout, &row(-max)));
        let mut b = ChangelogBuilder::new(layout);
        b.push(Op::UpdateAfter, &row(-1250)).unwrap();
        b.push(Op::UpdateAfter, &row(max)).unwrap();
        // A typed value of another type is refused, and drops only its row.
        assert!(
            b.push(
                Op::UpdateAfter,
                &[
                    Value::Native(Native::Date(1)),
                    Value::Text(Bytes::from_static(b"y"))
                ]
            )
            .is_err()
        );
        let batches = b.take().unwrap();
        let amounts: Vec<i128> = batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_primitive::<Decimal128Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(amounts, vec![-1250, max]);
    }

    #[test]
    fn a_bad_value_drops_only_its_row_and_layouts_split_batches() {
        let mut b = ChangelogBuilder::new(layout());
        b.push(Op::Insert, &t("1", Some("a"))).unwrap();
        assert!(b.push(Op::Insert, &t("x", Some("b"))).is_err());
        b.push(Op::Insert, &t("2", Some("c"))).unwrap();
        let mut wider = (*layout()).clone();
        wider.push(Column {
            name: "extra".into(),
            ty: PgType {
                scalar: Scalar::Int,
                array: false,
            },
            key: false,
        });
        b.set_layout(Arc::new(wider)).unwrap();
        b.push(
            Op::Insert,
            &[
                Value::Text(Bytes::from_static(b"3")),
                Value::Null,
                Value::Text(Bytes::from_static(b"7")),
            ],
        )
        .unwrap();
        let batches = b.take().unwrap();
        let ids: Vec<Vec<i64>> = batches
            .iter()
            .map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, vec![vec![1], vec![2], vec![3]]);
        assert_eq!(batches[2].num_columns(), 4);
    }
}
