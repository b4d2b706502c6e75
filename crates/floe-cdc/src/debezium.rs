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
//! deliver a row twice), `d` and tombstones `-D`. Values are turned into Postgres' text forms
//! and go through the same [`ChangelogBuilder`] as the Postgres source.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use base64::Engine;
use bytes::Bytes;
use floe_core::{
    Appended, Format, Op, Positions, Refused, SourceError, SourceRecord, StreamSpec, position_key,
};
use serde_json::Value as Json;

use crate::changelog::{ChangelogBuilder, Column, Layout, key_names};
use crate::pgoutput::Value;
use crate::types::{PgType, Scalar};

/// Debezium's stand-in for a TOASTed value it did not read.
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// How a column's JSON values become text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// As the JSON value reads.
    Plain,
    /// Days since 1970-01-01.
    EpochDays,
    /// Since midnight, in this many units per second.
    TimeOfDay(i64),
    /// Since the epoch, in this many units per second.
    Epoch(i64),
    /// ISO-8601 with offset.
    Zoned,
    /// Base64 of a big-endian two's-complement unscaled integer.
    ConnectDecimal(i8),
    /// `{"scale": s, "value": base64}`.
    VariableDecimal,
    /// Base64 bytes.
    Base64,
}

#[derive(Debug, Clone)]
struct DbzColumn {
    column: Column,
    encoding: Encoding,
}

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

fn column_from_schema(field: &Json, key: bool) -> Result<DbzColumn, String> {
    let name = field
        .get("field")
        .and_then(Json::as_str)
        .ok_or("a schema field without a name")?
        .to_string();
    let ty = field.get("type").and_then(Json::as_str).unwrap_or("string");
    let logical = field.get("name").and_then(Json::as_str).unwrap_or("");
    let param = |k: &str| {
        field
            .get("parameters")
            .and_then(|p| p.get(k))
            .and_then(Json::as_str)
            .and_then(|v| v.parse::<i64>().ok())
    };
    let (scalar, encoding) = scalar_of(ty, logical, &param)
        .ok_or_else(|| format!("column {name}: type {ty} {logical} is not supported"))?;
    let (scalar, array) = if ty == "array" {
        let items = field
            .get("items")
            .ok_or_else(|| format!("column {name}: array without items"))?;
        let ity = items.get("type").and_then(Json::as_str).unwrap_or("string");
        let ilogical = items.get("name").and_then(Json::as_str).unwrap_or("");
        let iparam = |k: &str| {
            items
                .get("parameters")
                .and_then(|p| p.get(k))
                .and_then(Json::as_str)
                .and_then(|v| v.parse::<i64>().ok())
        };
        let (s, e) = scalar_of(ity, ilogical, &iparam)
            .ok_or_else(|| format!("column {name}: array of {ity} is not supported"))?;
        return Ok(DbzColumn {
            column: Column {
                name,
                ty: PgType {
                    scalar: s,
                    array: true,
                },
                key,
            },
            encoding: e,
        });
    } else {
        (scalar, false)
    };
    Ok(DbzColumn {
        column: Column {
            name,
            ty: PgType { scalar, array },
            key,
        },
        encoding,
    })
}

fn scalar_of(
    ty: &str,
    logical: &str,
    param: &dyn Fn(&str) -> Option<i64>,
) -> Option<(Scalar, Encoding)> {
    Some(match (ty, logical) {
        (_, "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => {
            (Scalar::Date, Encoding::EpochDays)
        }
        (_, "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time") => {
            (Scalar::Time, Encoding::TimeOfDay(1_000))
        }
        (_, "io.debezium.time.MicroTime") => (Scalar::Time, Encoding::TimeOfDay(1_000_000)),
        (_, "io.debezium.time.NanoTime") => (Scalar::Time, Encoding::TimeOfDay(1_000_000_000)),
        (_, "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp") => {
            (Scalar::Timestamp, Encoding::Epoch(1_000))
        }
        (_, "io.debezium.time.MicroTimestamp") => (Scalar::Timestamp, Encoding::Epoch(1_000_000)),
        (_, "io.debezium.time.NanoTimestamp") => {
            (Scalar::Timestamp, Encoding::Epoch(1_000_000_000))
        }
        (_, "io.debezium.time.ZonedTimestamp") => (Scalar::Timestamptz, Encoding::Zoned),
        (_, "io.debezium.data.Uuid") => (Scalar::Uuid, Encoding::Plain),
        ("bytes", "org.apache.kafka.connect.data.Decimal") => {
            let scale = param("scale").unwrap_or(0);
            let precision = param("connect.decimal.precision").unwrap_or(38);
            if !(0..=38).contains(&precision) || scale < 0 || scale > precision {
                return None;
            }
            (
                Scalar::Decimal {
                    precision: precision as u8,
                    scale: scale as i8,
                },
                Encoding::ConnectDecimal(scale as i8),
            )
        }
        ("struct", "io.debezium.data.VariableScaleDecimal") => {
            (Scalar::Text, Encoding::VariableDecimal)
        }
        ("int8" | "int16" | "int32", _) => (Scalar::Int, Encoding::Plain),
        ("int64", _) => (Scalar::Long, Encoding::Plain),
        ("float32", _) => (Scalar::Float, Encoding::Plain),
        ("float64", _) => (Scalar::Double, Encoding::Plain),
        ("boolean", _) => (Scalar::Bool, Encoding::Plain),
        ("string", _) => (Scalar::Text, Encoding::Plain),
        ("bytes", _) => (Scalar::Bytes, Encoding::Base64),
        ("array", _) => (Scalar::Text, Encoding::Plain),
        ("struct" | "map", _) => (Scalar::Text, Encoding::Plain),
        _ => return None,
    })
}

fn infer(name: &str, value: &Json, key: bool) -> DbzColumn {
    let scalar_of_value = |v: &Json| match v {
        Json::Bool(_) => Scalar::Bool,
        Json::Number(n) if n.is_i64() || n.is_u64() => Scalar::Long,
        Json::Number(_) => Scalar::Double,
        _ => Scalar::Text,
    };
    let ty = match value {
        Json::Array(items) => PgType {
            scalar: items
                .iter()
                .find(|v| !v.is_null())
                .map_or(Scalar::Text, scalar_of_value),
            array: true,
        },
        v => PgType {
            scalar: scalar_of_value(v),
            array: false,
        },
    };
    DbzColumn {
        column: Column {
            name: name.to_string(),
            ty,
            key,
        },
        encoding: Encoding::Plain,
    }
}

fn days_to_date(days: i64) -> Option<String> {
    chrono::DateTime::from_timestamp(days * 86_400, 0).map(|t| t.format("%Y-%m-%d").to_string())
}

fn encode_scalar(scalar: Scalar, encoding: Encoding, value: &Json) -> Result<String, String> {
    let int = || {
        value
            .as_i64()
            .ok_or_else(|| format!("{value} is not an integer"))
    };
    let bad = || format!("{value} is not a valid value");
    Ok(match encoding {
        Encoding::EpochDays => days_to_date(int()?).ok_or_else(bad)?,
        Encoding::TimeOfDay(per_second) => {
            let micros = int()? as i128 * 1_000_000 / per_second as i128;
            let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(
                (micros / 1_000_000) as u32,
                ((micros % 1_000_000) * 1_000) as u32,
            )
            .ok_or_else(bad)?;
            t.format("%H:%M:%S%.6f").to_string()
        }
        Encoding::Epoch(per_second) => {
            let micros = (int()? as i128 * 1_000_000 / per_second as i128) as i64;
            chrono::DateTime::from_timestamp_micros(micros)
                .ok_or_else(bad)?
                .format("%Y-%m-%d %H:%M:%S%.6f")
                .to_string()
        }
        Encoding::Zoned => {
            let s = value.as_str().ok_or_else(bad)?;
            chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|_| bad())?
                .with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M:%S%.6f+00")
                .to_string()
        }
        Encoding::ConnectDecimal(scale) => match value {
            Json::String(b64) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|_| bad())?;
                if bytes.len() > 16 {
                    return Err(bad());
                }
                let mut unscaled: i128 = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
                    -1
                } else {
                    0
                };
                for b in bytes {
                    unscaled = (unscaled << 8) | b as i128;
                }
                format_decimal(unscaled, scale)
            }
            Json::Number(n) => n.to_string(),
            _ => return Err(bad()),
        },
        Encoding::VariableDecimal => {
            let scale = value.get("scale").and_then(Json::as_i64).ok_or_else(bad)?;
            let inner = value.get("value").cloned().unwrap_or(Json::Null);
            encode_scalar(Scalar::Text, Encoding::ConnectDecimal(scale as i8), &inner)?
        }
        Encoding::Base64 => {
            let b64 = value.as_str().ok_or_else(bad)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| bad())?;
            let mut out = String::with_capacity(2 + bytes.len() * 2);
            out.push_str("\\x");
            for b in bytes {
                out.push_str(&format!("{b:02x}"));
            }
            out
        }
        Encoding::Plain => match (scalar, value) {
            (Scalar::Bool, Json::Bool(b)) => if *b { "t" } else { "f" }.to_string(),
            (_, Json::String(s)) => s.clone(),
            (_, v) => v.to_string(),
        },
    })
}

fn format_decimal(unscaled: i128, scale: i8) -> String {
    if scale <= 0 {
        return unscaled.to_string();
    }
    let negative = unscaled < 0;
    let digits = unscaled.unsigned_abs().to_string();
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{}{whole}.{fraction}", if negative { "-" } else { "" })
}

/// A JSON value as the text form of `column`'s type (`None` for null).
fn encode(column: &DbzColumn, value: &Json) -> Result<Value, String> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    if value.as_str().is_some_and(|s| {
        s == UNAVAILABLE
            || (column.encoding == Encoding::Base64
                && base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .is_ok_and(|b| b == UNAVAILABLE.as_bytes()))
    }) {
        return Ok(Value::Unchanged);
    }
    let text = if column.column.ty.array {
        let items = value
            .as_array()
            .ok_or_else(|| format!("{value} is not an array"))?;
        let mut out = String::from("{");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if item.is_null() {
                out.push_str("NULL");
            } else {
                let text = encode_scalar(column.column.ty.scalar, column.encoding, item)?;
                out.push('"');
                out.push_str(&text.replace('\\', "\\\\").replace('"', "\\\""));
                out.push('"');
            }
        }
        out.push('}');
        out
    } else {
        encode_scalar(column.column.ty.scalar, column.encoding, value)?
    };
    Ok(Value::Text(Bytes::from(text)))
}

/// Splits a JsonConverter message into (schema, payload); without the envelope the schema is
/// `None`.
fn envelope(json: Json) -> (Option<Json>, Json) {
    match json {
        Json::Object(mut map) if map.contains_key("payload") && map.contains_key("schema") => {
            let payload = map.remove("payload").unwrap_or(Json::Null);
            (map.remove("schema"), payload)
        }
        other => (None, other),
    }
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
        let key_fields: Vec<String> = match key {
            Json::Object(map) => map.keys().cloned().collect(),
            _ => {
                return Err(format!(
                    "topic {topic}: records have no key (a table without a primary key); \
                     Floe keeps tables by key"
                ));
            }
        };
        let row_schema = schema.and_then(|s| {
            s.get("fields")?
                .as_array()?
                .iter()
                .find(|f| {
                    f.get("field").and_then(Json::as_str) == Some("after")
                        || f.get("field").and_then(Json::as_str) == Some("before")
                })
                .cloned()
        });
        let image = payload
            .get("after")
            .filter(|v| !v.is_null())
            .or_else(|| payload.get("before").filter(|v| !v.is_null()));
        let mut columns: Vec<DbzColumn> = match (&row_schema, image) {
            (Some(row), _) => row
                .get("fields")
                .and_then(Json::as_array)
                .ok_or_else(|| format!("topic {topic}: the row schema has no fields"))?
                .iter()
                .map(|f| {
                    let name = f.get("field").and_then(Json::as_str).unwrap_or_default();
                    column_from_schema(f, key_fields.iter().any(|k| k == name))
                })
                .collect::<Result<_, _>>()
                .map_err(|e| format!("topic {topic}: {e}"))?,
            (None, Some(Json::Object(row))) => row
                .iter()
                .map(|(k, v)| infer(k, v, key_fields.contains(k)))
                .collect(),
            (None, _) => {
                // A delete or tombstone first: the key is all we know.
                let key_schema_fields = key_schema
                    .and_then(|s| s.get("fields"))
                    .and_then(Json::as_array);
                match (key_schema_fields, key) {
                    (Some(fields), _) => fields
                        .iter()
                        .map(|f| column_from_schema(f, true))
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("topic {topic}: {e}"))?,
                    (None, Json::Object(map)) => {
                        map.iter().map(|(k, v)| infer(k, v, true)).collect()
                    }
                    _ => Vec::new(),
                }
            }
        };
        for c in &mut columns {
            c.column.key = key_fields.contains(&c.column.name);
        }
        if let Some(missing) = key_fields
            .iter()
            .find(|k| !columns.iter().any(|c| &c.column.name == *k))
        {
            return Err(format!(
                "topic {topic}: key field {missing} is not a column of the rows"
            ));
        }
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
                Some(("public", table)) => table.to_string(),
                Some((schema, table)) => format!("{schema}_{table}"),
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
        let mut added = Vec::new();
        if let Some(fields) = schema
            .and_then(|s| s.get("fields"))
            .and_then(Json::as_array)
            .and_then(|fields| {
                fields
                    .iter()
                    .find(|f| f.get("field").and_then(Json::as_str) == Some("after"))
            })
            .and_then(|row| row.get("fields"))
            .and_then(Json::as_array)
        {
            for f in fields {
                let name = f.get("field").and_then(Json::as_str).unwrap_or_default();
                if !table.columns.iter().any(|c| c.column.name == name) {
                    added.push(column_from_schema(f, false)?);
                }
            }
        } else if let Json::Object(row) = image {
            for (k, v) in row {
                if !v.is_null() && !table.columns.iter().any(|c| &c.column.name == k) {
                    added.push(infer(k, v, false));
                }
            }
        }
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
            .map(|t| StreamSpec {
                name: t.source_name.clone(),
                table: t.name.clone(),
                schema: Some(t.schema.clone()),
                changelog: true,
                key: key_names(&t.layout),
                time_column: None,
                partition: Vec::new(),
                bloom_filter_columns: Vec::new(),
                plain_columns: Vec::new(),
                properties: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_decimals_and_times_become_postgres_text() {
        // 12.50 at scale 2: unscaled 1250 = 0x04e2.
        assert_eq!(
            encode_scalar(
                Scalar::Decimal {
                    precision: 10,
                    scale: 2
                },
                Encoding::ConnectDecimal(2),
                &Json::String("BOI=".into())
            )
            .unwrap(),
            "12.50"
        );
        // -1 at scale 3.
        assert_eq!(
            encode_scalar(
                Scalar::Text,
                Encoding::ConnectDecimal(3),
                &Json::String("/w==".into())
            )
            .unwrap(),
            "-0.001"
        );
        assert_eq!(
            encode_scalar(Scalar::Date, Encoding::EpochDays, &Json::from(19_723)).unwrap(),
            "2024-01-01"
        );
        assert_eq!(
            encode_scalar(
                Scalar::Timestamp,
                Encoding::Epoch(1_000_000),
                &Json::from(1_704_067_200_123_456i64)
            )
            .unwrap(),
            "2024-01-01 00:00:00.123456"
        );
        assert_eq!(
            encode_scalar(
                Scalar::Timestamptz,
                Encoding::Zoned,
                &Json::String("2024-01-01T01:00:00.5+01:00".into())
            )
            .unwrap(),
            "2024-01-01 00:00:00.500000+00"
        );
        assert_eq!(
            encode_scalar(
                Scalar::Bytes,
                Encoding::Base64,
                &Json::String("AQI=".into())
            )
            .unwrap(),
            "\\x0102"
        );
    }

    #[test]
    fn placeholder_is_unchanged_and_arrays_quote() {
        let text = DbzColumn {
            column: Column {
                name: "body".into(),
                ty: PgType {
                    scalar: Scalar::Text,
                    array: false,
                },
                key: false,
            },
            encoding: Encoding::Plain,
        };
        assert_eq!(
            encode(&text, &Json::String(UNAVAILABLE.into())).unwrap(),
            Value::Unchanged
        );
        let list = DbzColumn {
            column: Column {
                name: "tags".into(),
                ty: PgType {
                    scalar: Scalar::Text,
                    array: true,
                },
                key: false,
            },
            encoding: Encoding::Plain,
        };
        let Value::Text(t) = encode(&list, &serde_json::json!(["a,b", null, "q\"x"])).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            crate::types::split_array(std::str::from_utf8(&t).unwrap()).unwrap(),
            vec![Some("a,b".into()), None, Some("q\"x".into())]
        );
    }
}
