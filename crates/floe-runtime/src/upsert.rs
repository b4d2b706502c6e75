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
//!
//! The cost per row is one hash of its key bytes and one probe: the index holds entry numbers
//! only, and a key's bytes stay in the arrow-row buffer of the batch that brought it. The final
//! rows come out as slices of the batches they arrived in wherever whole runs survive (a
//! snapshot's copied chunk, untouched in its checkpoint, is written without a copy); only the
//! scattered survivors are gathered.

use std::hash::BuildHasher;

use arrow_array::cast::AsArray;
use arrow_array::types::Int8Type;
use arrow_array::{Array, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::SchemaRef;
use floe_core::{OP_COLUMN, Op, UNCHANGED_COLUMN};
use floe_lake::tables::conform;
use floe_lake::{ErrorKind, LakeError, LakeResult};
use foldhash::fast::RandomState;
use hashbrown::HashTable;

#[derive(Debug)]
struct Entry {
    /// The key may exist in data committed before this checkpoint.
    existed: bool,
    /// A row carrying the key (batch, row).
    key_at: (usize, usize),
    /// Where the key's bytes are: (`keys` buffer, row).
    key_bytes: (usize, usize),
    /// The hash of those bytes.
    hash: u64,
    /// The last image (batch, row); `None` = the key is gone.
    image: Option<(usize, usize)>,
}

/// Runs of at least this many consecutive surviving rows of one batch are written as a slice
/// of it; shorter ones are gathered with the other scattered rows.
const MIN_RUN: usize = 64;

/// Collapsed changelog rows of one table.
pub(crate) struct UpsertBuffer {
    key: Vec<String>,
    converter: Option<RowConverter>,
    /// Rows as received, without the op and unchanged columns (and patched one-row batches).
    batches: Vec<RecordBatch>,
    /// The key columns of each received batch in arrow-row form.
    keys: Vec<Rows>,
    /// Entry numbers by the hash of their key bytes.
    index: HashTable<usize>,
    hasher: RandomState,
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
    /// The final image of every key still present, in the table's columns (empty: none).
    pub(crate) rows: Vec<RecordBatch>,
}

impl UpsertBuffer {
    /// A buffer for a table keyed by `key`.
    pub(crate) fn new(key: Vec<String>) -> Self {
        Self {
            key,
            converter: None,
            batches: Vec::new(),
            keys: Vec::new(),
            index: HashTable::new(),
            hasher: RandomState::default(),
            entries: Vec::new(),
            truncated: false,
        }
    }

    /// Whether nothing is buffered (no row, no truncate).
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty() && !self.truncated
    }

    /// The key columns.
    pub(crate) fn key(&self) -> &[String] {
        &self.key
    }

    /// Forgets everything buffered (keeping the index's and entries' capacity for the next
    /// checkpoint).
    pub(crate) fn clear(&mut self) {
        self.batches.clear();
        self.keys.clear();
        self.index.clear();
        self.entries.clear();
        self.truncated = false;
    }

    /// Everything buffered goes, and older data too.
    pub(crate) fn truncate(&mut self) {
        self.clear();
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
        let rows = converter
            .convert_columns(&key_columns)
            .map_err(|e| invalid("key values").with_source(e))?;
        let at = self.batches.len();
        let key_batch = self.keys.len();
        self.batches.push(image);
        self.keys.push(rows);
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
            let entry = self.entry((key_batch, row), (at, row), op != Op::Insert);
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

    /// The entry of the key at `key_bytes` (in `keys`), made for the row at `at` if the key
    /// is new to the checkpoint.
    fn entry(&mut self, key_bytes: (usize, usize), at: (usize, usize), existed: bool) -> usize {
        let (keys, entries) = (&self.keys, &mut self.entries);
        let key = keys[key_bytes.0].row(key_bytes.1);
        let hash = self.hasher.hash_one(key.as_ref());
        let same = |e: &usize| {
            let (b, r) = entries[*e].key_bytes;
            keys[b].row(r).as_ref() == key.as_ref()
        };
        if let Some(&found) = self.index.find(hash, same) {
            return found;
        }
        entries.push(Entry {
            existed,
            key_at: at,
            key_bytes,
            hash,
            image: None,
        });
        let number = entries.len() - 1;
        self.index.insert_unique(hash, number, |e| entries[*e].hash);
        number
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
    /// deletes in `delete_schema`; the buffer is empty afterwards. After a truncate no key
    /// exists in older data — unless `rows_beside` (rows written past the buffer since the
    /// truncate, such as a snapshot's copied rows, committed a snapshot before these changes):
    /// then a changed key is deleted from them as from any older data.
    pub(crate) fn finish(
        &mut self,
        table: &SchemaRef,
        delete_schema: &SchemaRef,
        rows_beside: bool,
    ) -> LakeResult<Collapsed> {
        let truncate = std::mem::take(&mut self.truncated);
        let batches = std::mem::take(&mut self.batches);
        let rows_at: Vec<(usize, usize)> = self.entries.iter().filter_map(|e| e.image).collect();
        let deletes_at: Vec<(usize, usize)> = self
            .entries
            .iter()
            .filter(|e| e.existed && (!truncate || rows_beside))
            .map(|e| e.key_at)
            .collect();
        self.clear();
        let rows = gather_runs(&batches, table, &rows_at)?;
        let deletes = gather(&batches, delete_schema, &deletes_at)?;
        Ok(Collapsed {
            truncate,
            deletes,
            rows,
        })
    }
}

/// The rows at `at` of `batches` in `target`'s columns, as one batch (`None`: no rows).
fn gather(
    batches: &[RecordBatch],
    target: &SchemaRef,
    at: &[(usize, usize)],
) -> LakeResult<Option<RecordBatch>> {
    if at.is_empty() {
        return Ok(None);
    }
    // Only the batches the rows come from are conformed, each once.
    let mut used: Vec<usize> = at.iter().map(|(b, _)| *b).collect();
    used.sort_unstable();
    used.dedup();
    let conformed = used
        .iter()
        .map(|b| conform(&batches[*b], target))
        .collect::<LakeResult<Vec<_>>>()?;
    let refs: Vec<&RecordBatch> = conformed.iter().collect();
    let renumbered: Vec<(usize, usize)> = at
        .iter()
        .map(|(b, r)| (used.binary_search(b).unwrap_or_default(), *r))
        .collect();
    arrow_select::interleave::interleave_record_batch(&refs, &renumbered)
        .map(Some)
        .map_err(|e| invalid("collapsing rows").with_source(e))
}

/// The rows at `at` of `batches` in `target`'s columns, in that order: every run of at least
/// [`MIN_RUN`] consecutive rows of one batch as a slice of it (no copy), the rest gathered
/// into one batch after them.
fn gather_runs(
    batches: &[RecordBatch],
    target: &SchemaRef,
    at: &[(usize, usize)],
) -> LakeResult<Vec<RecordBatch>> {
    let mut out = Vec::new();
    let mut scattered = Vec::new();
    let mut start = 0;
    while start < at.len() {
        let (batch, first) = at[start];
        let mut end = start + 1;
        while end < at.len() && at[end] == (batch, first + (end - start)) {
            end += 1;
        }
        if end - start >= MIN_RUN {
            out.push(conform(&batches[batch], target)?.slice(first, end - start));
        } else {
            scattered.extend_from_slice(&at[start..end]);
        }
        start = end;
    }
    out.extend(gather(batches, target, &scattered)?);
    Ok(out)
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

    fn ids<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> Vec<i64> {
        batches
            .into_iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
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
        let c = b.finish(&t, &d, false).unwrap();
        assert!(!c.truncate);
        assert_eq!(ids(&c.deletes), vec![2, 3, 4]);
        assert_eq!(ids(&c.rows), vec![1, 2, 5]);
        let rows = &c.rows[0];
        assert_eq!(rows.column(1).as_string::<i32>().value(0), "b");
        assert!(rows.column(2).is_null(0), "a column the rows lack is null");
        assert!(b.is_empty());
    }

    #[test]
    fn surviving_runs_are_slices_and_the_rest_is_gathered() {
        let mut b = UpsertBuffer::new(vec!["id".into()]);
        let copied: Vec<(i8, i64, Option<&str>, Option<&str>)> =
            (0..200).map(|id| (I, id, Some("copied"), None)).collect();
        let chunk = changes(&copied);
        b.apply(&chunk).unwrap();
        b.apply(&changes(&[
            (U, 50, Some("changed"), None),
            (D, 150, None, None),
        ]))
        .unwrap();
        let (t, d) = table();
        let c = b.finish(&t, &d, false).unwrap();
        assert!(c.deletes.is_none(), "every key was new to the checkpoint");
        // 51..150 survive untouched in a row: a slice of the received batch, not a copy.
        assert_eq!(c.rows.len(), 2);
        assert_eq!(ids(&c.rows[..1]), (51..150).collect::<Vec<_>>());
        let received = chunk.column(0).to_data().buffers()[0].as_ptr();
        let written = c.rows[0].column(0).to_data().buffers()[0].as_ptr();
        assert_eq!(
            written,
            received.wrapping_add(51 * 8),
            "the slice shares the ids"
        );
        // The rest, in entry order: 0..50, the changed 50, 151..200.
        let mut rest: Vec<i64> = (0..51).collect();
        rest.extend(151..200);
        assert_eq!(ids(&c.rows[1..]), rest);
        assert_eq!(c.rows[1].column(1).as_string::<i32>().value(50), "changed");
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
        let rows = b.finish(&t, &d, false).unwrap().rows.remove(0);
        assert_eq!(rows.column(1).as_string::<i32>().value(0), "big");
    }

    #[test]
    fn truncate_drops_older_data_and_buffered_changes() {
        let mut b = UpsertBuffer::new(vec!["id".into()]);
        b.apply(&changes(&[(D, 1, None, None)])).unwrap();
        b.truncate();
        b.apply(&changes(&[(U, 2, Some("x"), None)])).unwrap();
        let (t, d) = table();
        let c = b.finish(&t, &d, false).unwrap();
        assert!(c.truncate);
        assert!(c.deletes.is_none());
        assert_eq!(ids(&c.rows), vec![2]);
    }

    #[test]
    fn after_a_truncate_changes_still_delete_the_rows_copied_beside_the_buffer() {
        // Rows copied since the truncate went to files of their own, committed a snapshot
        // before these changes: an update or a delete of one of their keys must reach them.
        let mut b = UpsertBuffer::new(vec!["id".into()]);
        b.truncate();
        b.apply(&changes(&[
            (U, 2, Some("x"), None),
            (D, 3, None, None),
            (I, 4, Some("new"), None),
        ]))
        .unwrap();
        let (t, d) = table();
        let c = b.finish(&t, &d, true).unwrap();
        assert!(c.truncate);
        assert_eq!(ids(&c.deletes), vec![2, 3], "not 4: an insert is a new key");
        assert_eq!(ids(&c.rows), vec![2, 4]);
    }
}
