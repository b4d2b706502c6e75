//! The upsert buffer: changelog rows of one table collapsed per key within a checkpoint.
//!
//! Per key only the **last** image survives (or the fact that the key is gone), together with
//! whether the key may exist in data committed before the checkpoint — false when its first
//! row in the checkpoint was `+I` (a new key). [`UpsertBuffer::finish`] turns that into the
//! two halves of a row delta: the keys to equality-delete from older data, and the final rows
//! to append. Every key is written at most once per checkpoint, so no row of a checkpoint ever
//! needs a position delete against a row of the same checkpoint.
//!
//! A row whose [`UNCHANGED_COLUMN`] names columns takes them from the key's previous image in
//! the buffer; a row where the buffer has none is refused (it is never written as NULL).
//! A truncate drops everything buffered and deletes all older data.

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use arrow_array::{Array, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::SchemaRef;
use floe_core::{OP_COLUMN, Op, UNCHANGED_COLUMN};
use floe_lake::tables::conform;
use floe_lake::{ErrorKind, LakeError, LakeResult};

#[derive(Debug)]
struct Entry {
    /// The key may exist in data committed before this checkpoint.
    existed: bool,
    /// A row carrying the key (batch, row).
    key_at: (usize, usize),
    /// The last image (batch, row); `None` = the key is gone.
    image: Option<(usize, usize)>,
}

/// Collapsed changelog rows of one table.
pub(crate) struct UpsertBuffer {
    key: Vec<String>,
    converter: Option<RowConverter>,
    /// Rows as received, without the op and unchanged columns.
    batches: Vec<RecordBatch>,
    index: HashMap<Box<[u8]>, usize>,
    entries: Vec<Entry>,
    truncated: bool,
}

impl std::fmt::Debug for UpsertBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpsertBuffer")
            .field("key", &self.key)
            .field("keys", &self.entries.len())
            .finish_non_exhaustive()
    }
}

fn invalid(message: impl Into<String>) -> LakeError {
    LakeError::new(ErrorKind::Invalid, message)
}

/// The collapsed changes of one checkpoint.
#[derive(Debug, Default)]
pub(crate) struct Collapsed {
    /// The table was emptied first.
    pub(crate) truncate: bool,
    /// Key columns of keys that may exist in older data and are replaced or removed.
    pub(crate) deletes: Option<RecordBatch>,
    /// The final image of every key still present.
    pub(crate) rows: Option<RecordBatch>,
}

impl UpsertBuffer {
    /// A buffer for a table keyed by `key`.
    pub(crate) fn new(key: Vec<String>) -> Self {
        Self {
            key,
            converter: None,
            batches: Vec::new(),
            index: HashMap::new(),
            entries: Vec::new(),
            truncated: false,
        }
    }

    /// Whether nothing is buffered (no row, no truncate).
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && !self.truncated
    }

    /// Whether changelog rows are buffered.
    pub(crate) fn has_changes(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The key columns.
    pub(crate) fn key(&self) -> &[String] {
        &self.key
    }

    /// Forgets everything buffered.
    pub(crate) fn clear(&mut self) {
        self.batches.clear();
        self.index.clear();
        self.entries.clear();
        self.truncated = false;
    }

    /// Everything buffered goes, and older data too.
    pub(crate) fn truncate(&mut self) {
        self.batches.clear();
        self.index.clear();
        self.entries.clear();
        self.truncated = true;
    }

    /// Applies a changelog batch (with [`OP_COLUMN`]).
    pub(crate) fn apply(&mut self, batch: &RecordBatch) -> LakeResult<()> {
        let ops = batch
            .column_by_name(OP_COLUMN)
            .ok_or_else(|| invalid(format!("a changelog batch without {OP_COLUMN}")))?
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| invalid(format!("{OP_COLUMN} is not Int8")))?
            .clone();
        let unchanged = batch
            .column_by_name(UNCHANGED_COLUMN)
            .map(|c| c.as_string::<i32>().clone());
        let keep: Vec<usize> = batch
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, f)| f.name() != OP_COLUMN && f.name() != UNCHANGED_COLUMN)
            .map(|(i, _)| i)
            .collect();
        let image = batch
            .project(&keep)
            .map_err(|e| invalid("changelog columns").with_source(e))?;
        let key_columns = self
            .key
            .iter()
            .map(|k| {
                image
                    .column_by_name(k)
                    .cloned()
                    .ok_or_else(|| invalid(format!("a changelog batch without key column {k}")))
            })
            .collect::<LakeResult<Vec<_>>>()?;
        let converter = match &mut self.converter {
            Some(c) => c,
            None => self.converter.insert(
                RowConverter::new(
                    key_columns
                        .iter()
                        .map(|c| SortField::new(c.data_type().clone()))
                        .collect(),
                )
                .map_err(|e| invalid("key columns").with_source(e))?,
            ),
        };
        let keys = converter
            .convert_columns(&key_columns)
            .map_err(|e| invalid("key values").with_source(e))?;
        let at = self.batches.len();
        self.batches.push(image);
        for row in 0..batch.num_rows() {
            let op = Op::from_code(ops.value(row))
                .ok_or_else(|| invalid(format!("unknown op code {}", ops.value(row))))?;
            if key_columns.iter().any(|c| c.is_null(row)) {
                return Err(invalid(format!(
                    "a {} row without its key ({})",
                    op.symbol(),
                    self.key.join(", ")
                )));
            }
            let key = keys.row(row);
            let entry = match self.index.get(key.as_ref()) {
                Some(&e) => e,
                None => {
                    self.entries.push(Entry {
                        existed: op != Op::Insert,
                        key_at: (at, row),
                        image: None,
                    });
                    self.index
                        .insert(key.as_ref().into(), self.entries.len() - 1);
                    self.entries.len() - 1
                }
            };
            if !op.is_image() {
                self.entries[entry].image = None;
                continue;
            }
            let missing = unchanged
                .as_ref()
                .filter(|u| !u.is_null(row))
                .map(|u| u.value(row).to_string());
            let image_at = match missing {
                None => (at, row),
                Some(columns) => self.patch(entry, (at, row), &columns)?,
            };
            self.entries[entry].image = Some(image_at);
        }
        Ok(())
    }

    /// The row at `at` with `columns` taken from the key's previous image: a new one-row
    /// batch.
    fn patch(
        &mut self,
        entry: usize,
        at: (usize, usize),
        columns: &str,
    ) -> LakeResult<(usize, usize)> {
        let columns: Vec<&str> = columns.split(',').collect();
        let previous = self.entries[entry].image.ok_or_else(|| {
            invalid(format!(
                "column {} kept an unchanged TOASTed value that neither the old row nor this \
                 checkpoint holds; the table needs REPLICA IDENTITY FULL",
                columns.join(", ")
            ))
        })?;
        let row = &self.batches[at.0];
        let before = &self.batches[previous.0];
        let mut arrays = Vec::with_capacity(row.num_columns());
        for (i, field) in row.schema().fields().iter().enumerate() {
            let array = if columns.contains(&field.name().as_str()) {
                match before.column_by_name(field.name()) {
                    Some(c) => c.slice(previous.1, 1),
                    None => {
                        return Err(invalid(format!(
                            "column {} kept an unchanged value the key's earlier image lacks",
                            field.name()
                        )));
                    }
                }
            } else {
                row.column(i).slice(at.1, 1)
            };
            arrays.push(array);
        }
        let patched = RecordBatch::try_new(row.schema(), arrays)
            .map_err(|e| invalid("patched row").with_source(e))?;
        self.batches.push(patched);
        Ok((self.batches.len() - 1, 0))
    }

    /// The collapsed changes in `table`'s columns (by name), and the key columns of the
    /// deletes in `delete_schema`; the buffer is empty afterwards.
    pub(crate) fn finish(
        &mut self,
        table: &SchemaRef,
        delete_schema: &SchemaRef,
    ) -> LakeResult<Collapsed> {
        let truncate = std::mem::take(&mut self.truncated);
        let batches = std::mem::take(&mut self.batches);
        let entries = std::mem::take(&mut self.entries);
        self.index.clear();
        let rows_at: Vec<(usize, usize)> = entries.iter().filter_map(|e| e.image).collect();
        let deletes_at: Vec<(usize, usize)> = entries
            .iter()
            .filter(|e| e.existed && !truncate)
            .map(|e| e.key_at)
            .collect();
        let gather =
            |target: &SchemaRef, at: &[(usize, usize)]| -> LakeResult<Option<RecordBatch>> {
                if at.is_empty() {
                    return Ok(None);
                }
                let conformed = batches
                    .iter()
                    .map(|b| conform(b, target))
                    .collect::<LakeResult<Vec<_>>>()?;
                let refs: Vec<&RecordBatch> = conformed.iter().collect();
                arrow_select::interleave::interleave_record_batch(&refs, at)
                    .map(Some)
                    .map_err(|e| invalid("collapsing rows").with_source(e))
            };
        let rows = gather(table, &rows_at)?;
        let deletes = gather(delete_schema, &deletes_at)?;
        Ok(Collapsed {
            truncate,
            deletes,
            rows,
        })
    }
}

/// Whether a batch is changelog rows (has [`OP_COLUMN`]) rather than plain new rows.
pub(crate) fn is_changelog(batch: &RecordBatch) -> bool {
    batch.column_by_name(OP_COLUMN).is_some()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{ArrayRef, Int8Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    fn changes(rows: &[(i8, i64, Option<&str>, Option<&str>)]) -> RecordBatch {
        let ops: ArrayRef = Arc::new(Int8Array::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        ));
        let ids: ArrayRef = Arc::new(Int64Array::from(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        ));
        let body: ArrayRef = Arc::new(StringArray::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        ));
        let unchanged: ArrayRef = Arc::new(StringArray::from(
            rows.iter().map(|r| r.3).collect::<Vec<_>>(),
        ));
        RecordBatch::try_from_iter([
            ("id", ids),
            ("body", body),
            (OP_COLUMN, ops),
            (UNCHANGED_COLUMN, unchanged),
        ])
        .unwrap()
    }

    fn table() -> (SchemaRef, SchemaRef) {
        (
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("body", DataType::Utf8, true),
                Field::new("extra", DataType::Int64, true),
            ])),
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        )
    }

    fn ids(batch: &Option<RecordBatch>) -> Vec<i64> {
        batch
            .as_ref()
            .map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .unwrap_or_default()
    }

    const I: i8 = 0;
    const U: i8 = 2;
    const D: i8 = 3;

    #[test]
    fn collapses_per_key_and_deletes_only_keys_that_may_exist() {
        let mut b = UpsertBuffer::new(vec!["id".into()]);
        b.apply(&changes(&[
            // 1: inserted then updated → one row, no delete.
            (I, 1, Some("a"), None),
            (U, 1, Some("b"), None),
            // 2: updated (existed) → delete + row.
            (U, 2, Some("c"), None),
            // 3: deleted → delete only.
            (D, 3, None, None),
            // 4 → 5: a key change → delete 4, row 5 (5 did not exist).
            (D, 4, None, None),
            (I, 5, Some("e"), None),
            // 6: inserted then deleted → nothing.
            (I, 6, Some("f"), None),
            (D, 6, None, None),
        ]))
        .unwrap();
        let (t, d) = table();
        let c = b.finish(&t, &d).unwrap();
        assert!(!c.truncate);
        assert_eq!(ids(&c.deletes), vec![2, 3, 4]);
        assert_eq!(ids(&c.rows), vec![1, 2, 5]);
        let rows = c.rows.unwrap();
        assert_eq!(rows.column(1).as_string::<i32>().value(0), "b");
        assert!(rows.column(2).is_null(0), "a column the rows lack is null");
        assert!(b.is_empty());
    }

    #[test]
    fn unchanged_values_come_from_the_earlier_image_or_are_refused() {
        let mut b = UpsertBuffer::new(vec!["id".into()]);
        b.apply(&changes(&[(I, 1, Some("big"), None)])).unwrap();
        b.apply(&changes(&[(U, 1, None, Some("body"))])).unwrap();
        let err = b
            .apply(&changes(&[(U, 3, None, Some("body"))]))
            .unwrap_err();
        assert!(err.to_string().contains("REPLICA IDENTITY FULL"), "{err}");
        let (t, d) = table();
        let rows = b.finish(&t, &d).unwrap().rows.unwrap();
        assert_eq!(rows.column(1).as_string::<i32>().value(0), "big");
    }

    #[test]
    fn truncate_drops_older_data_and_buffered_changes() {
        let mut b = UpsertBuffer::new(vec!["id".into()]);
        b.apply(&changes(&[(D, 1, None, None)])).unwrap();
        b.truncate();
        b.apply(&changes(&[(U, 2, Some("x"), None)])).unwrap();
        let (t, d) = table();
        let c = b.finish(&t, &d).unwrap();
        assert!(c.truncate);
        assert!(c.deletes.is_none());
        assert_eq!(ids(&c.rows), vec![2]);
    }
}
