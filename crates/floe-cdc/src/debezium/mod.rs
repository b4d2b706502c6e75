//! Debezium change events (JSON, from Kafka) as a [`Format`]: one changelog stream per
//! source table.
//!
//! One Kafka topic per source table (`<prefix>.<schema>.<table>`, Debezium's default). Each
//! record is decoded with or without the JsonConverter schema envelope
//! (`{"schema": …, "payload": …}`):
//!
//! * ops `c` (insert) and `r` (snapshot read) are upserts — Debezium may deliver a row again
//!   after its own restart, so a repeated insert must replace, not duplicate; `u` updates
//!   (a key change arrives as `d` of the old key and `c` of the new); `d` deletes by the
//!   record key; `t` empties the table; a **tombstone** (null value) deletes by key and is
//!   harmless after its `d`; `m` (logical messages) are ignored;
//! * columns and types come from the envelope's `after`/`before` schema (Debezium logical
//!   types: `Date`, `Time`/`MicroTime`, `Timestamp`/`MicroTimestamp`/`NanoTimestamp`,
//!   `ZonedTimestamp`, Connect `Decimal`, `VariableScaleDecimal`, `Uuid`, `Json`, `Enum`);
//!   without the envelope they are inferred from the first non-null value (integer → long,
//!   fraction → double, boolean, string, array → list, object → JSON text). The key columns
//!   are the fields of the record key;
//! * the TOAST placeholder `__debezium_unavailable_value` never overwrites a value: it is an
//!   unchanged value, filled from the full `before` image or from the key's earlier image in
//!   the checkpoint;
//! * **order**: per key, Kafka partition order; an event whose `source.sequence` is older than
//!   the newest applied from its partition (a replay after Debezium restarted) is dropped;
//! * **exactly once**: positions are the Kafka offsets (and per partition the sequence
//!   watermark, `"{topic}/{p}#sequence"`), committed in the Iceberg snapshot as for the OTLP
//!   job;
//! * **bad input**: a record that cannot be decoded (not JSON, no `op`, a value of the wrong
//!   type) is refused and dead-lettered — skipping it leaves every other key exact; a table
//!   Floe cannot keep (records without keys, a type it cannot map) stops the job.
//!
//! Ops become changelog rows: `c`, `r` and `u` are `+U` (an upsert, since Debezium may
//! deliver a row twice), `d` and tombstones `-D`. Values go through the same
//! [`ChangelogBuilder`] as the Postgres source's: Connect decimals, dates, times and integer
//! timestamps typed, every other value in its Postgres text form (`values`).
//!
//! * `schema` — the envelope, and a topic's columns from its row schema or first values;
//! * `values` — a JSON value as its column's tuple value.
//!
//! Record errors name the column and value and refuse the record (dead-lettered); table
//! errors name the topic and stop the job ([`SourceError::user`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use floe_core::{
    Appended, Format, Op, Positions, Refused, SourceError, SourceRecord, StreamSpec, position_key,
};
use serde_json::Value as Json;

use crate::changelog::{ChangelogBuilder, Layout, changelog_stream};
use crate::pgoutput::Value;
use schema::{DbzColumn, added_columns, envelope, first_columns};
use values::encode;

mod schema;
mod values;

/// Debezium's stand-in for a TOASTed value it did not read.
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

#[derive(Debug)]
struct DbzTable {
    topic: String,
    source_name: String,
    name: String,
    columns: Vec<DbzColumn>,
    layout: Layout,
    schema: iceberg::spec::Schema,
    rows: ChangelogBuilder,
}

/// Decodes Debezium topics into changelog streams, one per source table (in the order their
/// first event arrived).
pub struct DebeziumFormat {
    tables: Vec<DbzTable>,
    by_topic: HashMap<String, usize>,
    /// Sequence watermarks per partition after the records appended so far.
    sequences: Positions,
    table_names: HashMap<String, String>,
    version: u64,
}

impl std::fmt::Debug for DebeziumFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebeziumFormat")
            .field("tables", &self.tables.len())
            .finish_non_exhaustive()
    }
}

fn watermark_key(topic: &str, partition: i32) -> String {
    format!("{}#sequence", position_key(topic, partition))
}

/// `["123","456"]` → (123, 456); a null part is 0.
fn parse_sequence(source: &Json) -> Option<(u64, u64)> {
    let text = source.get("sequence")?.as_str()?;
    let parts: Vec<Json> = serde_json::from_str(text).ok()?;
    let n = |v: Option<&Json>| -> u64 {
        match v {
            Some(Json::String(s)) => s.parse().unwrap_or(0),
            Some(Json::Number(n)) => n.as_u64().unwrap_or(0),
            _ => 0,
        }
    };
    Some((n(parts.first()), n(parts.get(1))))
}

impl DebeziumFormat {
    /// A format for Debezium topics; `table_names` maps `schema.table` to an Iceberg table
    /// name.
    pub fn new(table_names: HashMap<String, String>) -> Self {
        Self {
            tables: Vec::new(),
            by_topic: HashMap::new(),
            sequences: Positions::new(),
            table_names,
            version: 0,
        }
    }

    /// The table of `topic`, created from the first event's schema (or values) and key.
    fn table_for(
        &mut self,
        topic: &str,
        key: &Json,
        key_schema: Option<&Json>,
        schema: Option<&Json>,
        payload: &Json,
    ) -> Result<usize, String> {
        let columns = first_columns(topic, key, key_schema, schema, payload)?;
        let source_name = {
            let parts: Vec<&str> = topic.split('.').collect();
            match parts.as_slice() {
                [.., schema, table] if parts.len() >= 3 => format!("{schema}.{table}"),
                _ => topic.to_string(),
            }
        };
        let name = self
            .table_names
            .get(&source_name)
            .cloned()
            .unwrap_or_else(|| match source_name.split_once('.') {
                Some((schema, table)) => crate::changelog::default_table_name(schema, table),
                None => source_name.replace(['.', '-'], "_"),
            });
        let layout: Layout = Arc::new(columns.iter().map(|c| c.column.clone()).collect());
        let schema =
            crate::postgres::iceberg_schema(&layout).map_err(|e| format!("topic {topic}: {e}"))?;
        let index = self.tables.len();
        self.tables.push(DbzTable {
            topic: topic.to_string(),
            source_name,
            name,
            columns,
            rows: ChangelogBuilder::new(layout.clone()),
            layout,
            schema,
        });
        self.by_topic.insert(topic.to_string(), index);
        self.version += 1;
        Ok(index)
    }

    /// Adds columns a later event's schema (or values) shows.
    fn widen(&mut self, index: usize, schema: Option<&Json>, image: &Json) -> Result<(), String> {
        let table = &mut self.tables[index];
        let added = added_columns(&table.columns, schema, image)?;
        if !added.is_empty() {
            tracing::info!(topic = %table.topic, columns = ?added.iter().map(|c| &c.column.name).collect::<Vec<_>>(), "the table gained columns");
            table.columns.extend(added);
            table.layout = Arc::new(table.columns.iter().map(|c| c.column.clone()).collect());
            table.schema = crate::postgres::iceberg_schema(&table.layout)
                .map_err(|e| format!("topic {}: {e}", table.topic))?;
            table.rows.set_layout(table.layout.clone())?;
            self.version += 1;
        }
        Ok(())
    }

    fn tuple(&self, index: usize, image: &Json) -> Result<Vec<Value>, String> {
        let table = &self.tables[index];
        table
            .columns
            .iter()
            .map(|c| {
                encode(c, image.get(&c.column.name).unwrap_or(&Json::Null))
                    .map_err(|e| format!("column {}: {e}", c.column.name))
            })
            .collect()
    }

    /// A tuple with only the key columns set, from the record key.
    fn key_tuple(&self, index: usize, key: &Json) -> Result<Vec<Value>, String> {
        self.tables[index]
            .columns
            .iter()
            .map(|c| {
                if c.column.key {
                    encode(c, key.get(&c.column.name).unwrap_or(&Json::Null))
                } else {
                    Ok(Value::Null)
                }
            })
            .collect()
    }

    /// Applies one record.
    fn apply(&mut self, record: &SourceRecord) -> Result<Appended, Refused> {
        let key_json = match &record.key {
            Some(k) if !k.is_empty() => serde_json::from_slice::<Json>(k)
                .map_err(|e| format!("the key is not JSON: {e}"))?,
            _ => Json::Null,
        };
        let (key_schema, key) = envelope(key_json);
        let (schema, payload) = if record.payload.is_empty() {
            (None, Json::Null)
        } else {
            envelope(
                serde_json::from_slice::<Json>(&record.payload)
                    .map_err(|e| format!("the value is not JSON: {e}"))?,
            )
        };
        let topic = record.topic.to_string();
        let index = match self.by_topic.get(&topic) {
            Some(&i) => i,
            // A table Floe cannot keep stops the job: every later record of it would fail.
            None => self
                .table_for(&topic, &key, key_schema.as_ref(), schema.as_ref(), &payload)
                .map_err(|e| Refused::Stop(SourceError::user(format!("debezium: {e}"))))?,
        };
        if payload.is_null() {
            // A tombstone: delete by key (after its `d`, a no-op).
            let old = self.key_tuple(index, &key)?;
            self.push(index, Op::Delete, &old)?;
            return Ok(Appended::Rows);
        }
        let op = payload
            .get("op")
            .and_then(Json::as_str)
            .ok_or("no `op` in the event (not a Debezium change event?)")?
            .to_string();
        let source = payload.get("source").cloned().unwrap_or(Json::Null);
        if op != "r"
            && let Some(sequence) = parse_sequence(&source)
        {
            let mark = watermark_key(&topic, record.partition);
            let seen = self.sequences.get(&mark).and_then(|s| {
                let (a, b) = s.split_once(',')?;
                Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
            });
            if seen.is_some_and(|seen| sequence < seen) {
                tracing::debug!(%topic, ?sequence, "dropping a replayed event");
                return Ok(Appended::Rows);
            }
            self.sequences
                .insert(mark, format!("{},{}", sequence.0, sequence.1));
        }
        let after = payload.get("after").cloned().unwrap_or(Json::Null);
        let before = payload.get("before").cloned().unwrap_or(Json::Null);
        if !after.is_null() {
            self.widen(index, schema.as_ref(), &after)
                .map_err(|e| Refused::Stop(SourceError::user(format!("debezium: {e}"))))?;
        }
        match op.as_str() {
            "c" | "r" | "u" => {
                let mut new = self.tuple(index, &after)?;
                // A full `before` supplies values the placeholder stands for.
                let before_full = before.as_object().is_some_and(|b| {
                    self.tables[index]
                        .columns
                        .iter()
                        .all(|c| b.contains_key(&c.column.name))
                });
                if before_full && new.contains(&Value::Unchanged) {
                    let old = self.tuple(index, &before)?;
                    for (value, old) in new.iter_mut().zip(old) {
                        if *value == Value::Unchanged && old != Value::Unchanged {
                            *value = old;
                        }
                    }
                }
                self.push(index, Op::UpdateAfter, &new)?;
                Ok(Appended::Rows)
            }
            "d" => {
                let old = self.key_tuple(index, &key)?;
                self.push(index, Op::Delete, &old)?;
                Ok(Appended::Rows)
            }
            "t" => {
                self.tables[index].rows.clear();
                Ok(Appended::Truncate(index))
            }
            "m" => Ok(Appended::Rows),
            other => Err(Refused::Record(format!("unknown op {other:?}"))),
        }
    }

    fn push(&mut self, index: usize, op: Op, tuple: &[Value]) -> Result<(), String> {
        let table = &mut self.tables[index];
        if crate::changelog::key_of(&table.layout, tuple).is_none() {
            return Err(format!("the {} event carries no complete key", op.symbol()));
        }
        table.rows.push(op, tuple)
    }
}

impl Format for DebeziumFormat {
    fn streams(&self) -> Vec<StreamSpec> {
        self.tables
            .iter()
            .map(|t| {
                changelog_stream(
                    t.source_name.clone(),
                    t.name.clone(),
                    t.schema.clone(),
                    &t.layout,
                )
            })
            .collect()
    }

    fn streams_version(&self) -> u64 {
        self.version
    }

    fn append(&mut self, record: &SourceRecord, _ingested_at_us: i64) -> Result<Appended, Refused> {
        self.apply(record)
    }

    fn buffered_rows(&self) -> usize {
        self.tables.iter().map(|t| t.rows.rows()).sum()
    }

    fn stream_rows(&self, stream: usize) -> usize {
        self.tables.get(stream).map_or(0, |t| t.rows.rows())
    }

    fn take(&mut self) -> Vec<(usize, RecordBatch)> {
        let mut out = Vec::new();
        for (index, table) in self.tables.iter_mut().enumerate() {
            match table.rows.take() {
                Ok(batches) => out.extend(batches.into_iter().map(|b| (index, b))),
                // Every value was parsed as it was pushed; a batch that cannot be built is ours.
                Err(e) => panic!("changelog rows of {}: {e}", table.topic),
            }
        }
        out
    }

    fn positions(&self) -> Positions {
        self.sequences.clone()
    }

    fn seek(&mut self, positions: &Positions) {
        self.sequences = positions
            .iter()
            .filter(|(k, _)| k.ends_with("#sequence"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for table in &mut self.tables {
            table.rows.clear();
        }
    }
}
