//! The change buffer: row changes of whole transactions, collapsed per key until a checkpoint
//! takes them.
//!
//! Per table and key only the **last** image survives (or the fact that the key is deleted),
//! and whether the key may exist in data committed before the buffer started — true unless its
//! first change in the buffer was an insert (a primary key that is inserted did not exist).
//! [`ChangeBuffer::take_table`] turns that into the two halves of an upsert: the keys to
//! equality-delete from older data, and the final rows to append. Because every key is
//! written at most once per checkpoint, no row of a checkpoint ever needs a position delete
//! against a row of the same checkpoint.
//!
//! A TOASTed value the change left untouched ([`Value::Unchanged`]) is filled from the old
//! row (replica identity full) or from the key's image already in the buffer; a change where
//! neither can supply it is an error — it is never written as NULL.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema as ArrowSchema};
use bytes::Bytes;
use floe_core::TableChanges;

use crate::pgoutput::{Tuple, Value};
use crate::types::{ColumnBuilder, PgType};

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

/// The names of the key columns, in column order.
pub fn key_names(columns: &[Column]) -> Vec<String> {
    columns
        .iter()
        .filter(|c| c.key)
        .map(|c| c.name.clone())
        .collect()
}

#[derive(Debug)]
struct Entry {
    /// The key may exist in older data.
    existed: bool,
    /// The last image, in `layout`; `None` = deleted.
    image: Option<(Layout, Tuple)>,
    /// The key values (in key-column order), for the equality delete.
    key: Vec<Bytes>,
}

#[derive(Debug, Default)]
struct TableBuffer {
    entries: HashMap<Vec<u8>, Entry>,
    truncated: bool,
}

/// A change to apply.
#[derive(Debug, Clone)]
pub enum Change {
    /// A new row.
    Insert(Tuple),
    /// A changed row; `old` is the full old row (replica identity full) or the old key (only
    /// sent when the key changed), `new` the new row.
    Update {
        /// The old row or key, if sent.
        old: Option<Tuple>,
        /// Whether `old` is the full row.
        old_full: bool,
        /// The new row.
        new: Tuple,
    },
    /// A removed row (its key, or the full row).
    Delete(Tuple),
}

/// Collapsed changes per table, with their size.
#[derive(Debug, Default)]
pub struct ChangeBuffer {
    tables: HashMap<usize, TableBuffer>,
    bytes: usize,
}

fn tuple_bytes(t: &Tuple) -> usize {
    t.iter()
        .map(|v| match v {
            Value::Text(b) => b.len() + 16,
            _ => 16,
        })
        .sum()
}

/// The key values of `tuple` (in layout order of the key columns), or `None` if one is
/// missing.
fn key_of(layout: &[Column], tuple: &Tuple) -> Option<(Vec<u8>, Vec<Bytes>)> {
    let mut encoded = Vec::new();
    let mut values = Vec::new();
    for (column, value) in layout.iter().zip(tuple) {
        if !column.key {
            continue;
        }
        let Value::Text(v) = value else {
            return None;
        };
        encoded.extend_from_slice(&(v.len() as u32).to_le_bytes());
        encoded.extend_from_slice(v);
        values.push(v.clone());
    }
    Some((encoded, values))
}

impl ChangeBuffer {
    /// Bytes of values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Empties `table`: older data goes, changes buffered for it so far are dropped.
    pub fn truncate(&mut self, table: usize) {
        let buffer = self.tables.entry(table).or_default();
        buffer.entries.clear();
        buffer.truncated = true;
    }

    /// Applies one change to `table`, whose tuples are in `layout`. `Err` says why it cannot
    /// be applied (a missing key, an unchanged TOASTed value nothing can supply).
    pub fn apply(&mut self, table: usize, layout: &Layout, change: Change) -> Result<(), String> {
        let buffer = self.tables.entry(table).or_default();
        let missing_key = || "the change carries no complete key".to_string();
        match change {
            Change::Insert(new) => {
                let (encoded, key) = key_of(layout, &new).ok_or_else(missing_key)?;
                if new.contains(&Value::Unchanged) {
                    return Err("an insert carries an unchanged TOASTed value".into());
                }
                self.bytes += tuple_bytes(&new);
                let entry = buffer.entries.entry(encoded).or_insert(Entry {
                    existed: false,
                    image: None,
                    key,
                });
                entry.image = Some((layout.clone(), new));
            }
            Change::Update {
                old,
                old_full,
                mut new,
            } => {
                let (new_encoded, new_key) = key_of(layout, &new).ok_or_else(missing_key)?;
                // The key changed when the old image carries a different one.
                let old_key = old.as_ref().and_then(|o| key_of(layout, o));
                let moved = old_key
                    .as_ref()
                    .filter(|(encoded, _)| *encoded != new_encoded);
                // Fill unchanged TOASTed values.
                if new.contains(&Value::Unchanged) {
                    let lookup = moved.map(|(e, _)| e).unwrap_or(&new_encoded);
                    let previous = buffer.entries.get(lookup).and_then(|e| e.image.as_ref());
                    for (i, value) in new.iter_mut().enumerate() {
                        if *value != Value::Unchanged {
                            continue;
                        }
                        let from_old = old
                            .as_ref()
                            .filter(|_| old_full)
                            .and_then(|o| o.get(i))
                            .filter(|v| **v != Value::Unchanged);
                        let from_buffer = previous.and_then(|(prev_layout, prev)| {
                            let name = &layout[i].name;
                            prev_layout
                                .iter()
                                .position(|c| &c.name == name)
                                .and_then(|j| prev.get(j))
                                .filter(|v| **v != Value::Unchanged)
                        });
                        match from_old.or(from_buffer) {
                            Some(v) => *value = v.clone(),
                            None => {
                                return Err(format!(
                                    "column {} kept an unchanged TOASTed value that neither the \
                                     old row nor this checkpoint holds; the table needs \
                                     REPLICA IDENTITY FULL",
                                    layout[i].name
                                ));
                            }
                        }
                    }
                }
                if let Some((old_encoded, old_values)) = moved {
                    let entry = buffer.entries.entry(old_encoded.clone()).or_insert(Entry {
                        existed: true,
                        image: None,
                        key: old_values.clone(),
                    });
                    entry.image = None;
                }
                self.bytes += tuple_bytes(&new);
                let entry = buffer.entries.entry(new_encoded).or_insert(Entry {
                    // A key an update moves to did not exist before, unless it is the same.
                    existed: moved.is_none(),
                    image: None,
                    key: new_key,
                });
                entry.image = Some((layout.clone(), new));
            }
            Change::Delete(old) => {
                let (encoded, key) = key_of(layout, &old).ok_or_else(missing_key)?;
                self.bytes += key.iter().map(|k| k.len() + 16).sum::<usize>();
                let entry = buffer.entries.entry(encoded).or_insert(Entry {
                    existed: true,
                    image: None,
                    key,
                });
                entry.image = None;
            }
        }
        Ok(())
    }

    /// Takes the collapsed changes of `table` as Arrow batches in `layout` (the table's
    /// current columns): the truncate flag, the keys to delete, the rows to append. A value
    /// that does not parse is an error naming the column.
    pub fn take_table(
        &mut self,
        table: usize,
        layout: &Layout,
    ) -> Result<Option<TableChanges>, String> {
        let Some(buffer) = self.tables.remove(&table) else {
            return Ok(None);
        };
        let key_columns: Vec<&Column> = layout.iter().filter(|c| c.key).collect();
        let mut key_builders: Vec<ColumnBuilder> = key_columns
            .iter()
            .map(|c| ColumnBuilder::new(c.ty, buffer.entries.len()))
            .collect();
        let mut row_builders: Vec<ColumnBuilder> = layout
            .iter()
            .map(|c| ColumnBuilder::new(c.ty, buffer.entries.len()))
            .collect();
        // Where each current column is in an older layout (Arc pointer → positions).
        let mut mappings: Vec<(Layout, Vec<Option<usize>>)> = Vec::new();
        let (mut deletes, mut rows) = (0usize, 0usize);
        for entry in buffer.entries.into_values() {
            if entry.existed && !buffer.truncated {
                for (b, (k, c)) in key_builders
                    .iter_mut()
                    .zip(entry.key.iter().zip(&key_columns))
                {
                    b.append(Some(k))
                        .map_err(|e| format!("key column {}: {e}", c.name))?;
                }
                deletes += 1;
            }
            let Some((image_layout, tuple)) = entry.image else {
                continue;
            };
            let map = match mappings.iter().find(|(l, _)| Arc::ptr_eq(l, &image_layout)) {
                Some((_, m)) => m,
                None => {
                    let m = layout
                        .iter()
                        .map(|c| image_layout.iter().position(|o| o.name == c.name))
                        .collect();
                    mappings.push((image_layout.clone(), m));
                    &mappings.last().expect("just pushed").1
                }
            };
            for ((b, position), column) in row_builders.iter_mut().zip(map).zip(layout.iter()) {
                let value = match position.and_then(|p| tuple.get(p)) {
                    Some(Value::Text(t)) => Some(t.as_ref()),
                    _ => None,
                };
                b.append(value)
                    .map_err(|e| format!("column {}: {e}", column.name))?;
            }
            rows += 1;
        }
        let batch = |columns: Vec<&Column>, builders: Vec<ColumnBuilder>| {
            let arrays: Vec<ArrayRef> = builders.into_iter().map(|mut b| b.finish()).collect();
            let fields: Vec<Field> = columns
                .iter()
                .zip(&arrays)
                .map(|(c, a)| Field::new(&c.name, a.data_type().clone(), true))
                .collect();
            RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), arrays)
                .map_err(|e| e.to_string())
        };
        let deletes = (deletes > 0)
            .then(|| batch(key_columns.clone(), key_builders))
            .transpose()?;
        let rows = (rows > 0)
            .then(|| batch(layout.iter().collect(), row_builders))
            .transpose()?;
        Ok(Some(TableChanges {
            table,
            truncate: buffer.truncated,
            deletes,
            rows,
        }))
    }

    /// Takes the collapsed changes of every touched table (see [`take_table`]), each in the
    /// layout `layout_of(table)` gives; the buffer is empty afterwards. `Err` names the table
    /// whose values did not convert.
    ///
    /// [`take_table`]: Self::take_table
    pub fn take_all(
        &mut self,
        layout_of: impl Fn(usize) -> Layout,
    ) -> Result<Vec<TableChanges>, (usize, String)> {
        let mut touched: Vec<usize> = self.tables.keys().copied().collect();
        touched.sort_unstable();
        let mut out = Vec::with_capacity(touched.len());
        for table in touched {
            let changes = self
                .take_table(table, &layout_of(table))
                .map_err(|e| (table, e))?;
            out.extend(changes);
        }
        self.bytes = 0;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Scalar;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

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

    fn ids(batch: &Option<RecordBatch>) -> Vec<i64> {
        let mut v: Vec<i64> = batch
            .as_ref()
            .map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn collapses_per_key_and_deletes_only_keys_that_may_exist() {
        let l = layout();
        let mut b = ChangeBuffer::default();
        // 1: inserted then updated → one row, no delete (it did not exist before).
        b.apply(0, &l, Change::Insert(t("1", Some("a")))).unwrap();
        let update = |id, body| Change::Update {
            old: None,
            old_full: false,
            new: t(id, body),
        };
        b.apply(0, &l, update("1", Some("b"))).unwrap();
        // 2: updated (existed) → delete + row.
        b.apply(0, &l, update("2", Some("c"))).unwrap();
        // 3: deleted → delete only.
        b.apply(0, &l, Change::Delete(t("3", None))).unwrap();
        // 4 → 5: key change → delete 4, row 5 (5 did not exist).
        b.apply(
            0,
            &l,
            Change::Update {
                old: Some(t("4", None)),
                old_full: false,
                new: t("5", Some("e")),
            },
        )
        .unwrap();
        // 6: inserted then deleted → nothing.
        b.apply(0, &l, Change::Insert(t("6", Some("f")))).unwrap();
        b.apply(0, &l, Change::Delete(t("6", None))).unwrap();
        let TableChanges {
            truncate,
            deletes,
            rows,
            ..
        } = b.take_table(0, &l).unwrap().unwrap();
        assert!(!truncate);
        assert_eq!(ids(&deletes), vec![2, 3, 4]);
        assert_eq!(ids(&rows), vec![1, 2, 5]);
        assert!(b.take_table(0, &l).unwrap().is_none());
    }

    #[test]
    fn unchanged_toast_is_filled_or_refused() {
        let l = layout();
        let mut b = ChangeBuffer::default();
        b.apply(0, &l, Change::Insert(t("1", Some("big")))).unwrap();
        b.apply(
            0,
            &l,
            Change::Update {
                old: None,
                old_full: false,
                new: t("1", Some("<u>")),
            },
        )
        .unwrap();
        // Full old row supplies it.
        b.apply(
            0,
            &l,
            Change::Update {
                old: Some(t("2", Some("old"))),
                old_full: true,
                new: t("2", Some("<u>")),
            },
        )
        .unwrap();
        let err = b
            .apply(
                0,
                &l,
                Change::Update {
                    old: None,
                    old_full: false,
                    new: t("3", Some("<u>")),
                },
            )
            .unwrap_err();
        assert!(err.contains("REPLICA IDENTITY FULL"), "{err}");
        let rows = b.take_table(0, &l).unwrap().unwrap().rows;
        let rows = rows.unwrap();
        let bodies: std::collections::BTreeSet<&str> =
            rows.column(1).as_string::<i32>().iter().flatten().collect();
        assert_eq!(bodies, ["big", "old"].into());
    }

    #[test]
    fn truncate_drops_older_data_and_buffered_changes() {
        let l = layout();
        let mut b = ChangeBuffer::default();
        b.apply(0, &l, Change::Delete(t("1", None))).unwrap();
        b.truncate(0);
        b.apply(0, &l, Change::Insert(t("2", Some("x")))).unwrap();
        let TableChanges {
            truncate,
            deletes,
            rows,
            ..
        } = b.take_table(0, &l).unwrap().unwrap();
        assert!(truncate);
        assert!(deletes.is_none());
        assert_eq!(ids(&rows), vec![2]);
    }

    #[test]
    fn rows_of_an_older_layout_map_by_name() {
        let old = layout();
        let mut wider = (*old).clone();
        wider.push(Column {
            name: "extra".into(),
            ty: PgType {
                scalar: Scalar::Int,
                array: false,
            },
            key: false,
        });
        let wider: Layout = Arc::new(wider);
        let mut b = ChangeBuffer::default();
        b.apply(0, &old, Change::Insert(t("1", Some("a")))).unwrap();
        let rows = b.take_table(0, &wider).unwrap().unwrap().rows;
        let rows = rows.unwrap();
        assert_eq!(rows.num_columns(), 3);
        assert!(rows.column(2).is_null(0));
    }
}
