//! Windows over event time: tumbling, sliding (hop) and session windows, keyed by columns,
//! with mergeable aggregates ([`crate::aggregate`]), allowed lateness and a late side output.
//!
//! **Per source partition.** Each partition is its own event-time clock and its own state:
//! the watermark of partition *p* is the largest event time seen in *p* minus
//! `out_of_orderness`, advanced row by row, so what a window emits depends only on the rows of
//! *p* in order — never on batching or timing. A window keyed by a column that spans
//! partitions yields one **partial row per (window, key, partition)** (`source_partition`);
//! partial rows merge exactly with a `GROUP BY` (see [`crate::aggregate`]), and
//! `floe-maintenance` merges them once every partition has closed the window.
//!
//! **Semantics** (Flink's, with `W` = max event time − out_of_orderness of the partition):
//! a window `[start, end)` fires when `W ≥ end`, emitting its row (`+I`); until
//! `W ≥ end + allowed_lateness` it stays open and every later row updates it (`+U`, an upsert
//! of the rollup row); a row whose every window is past that is **late** and goes to the late
//! output with the reason, never dropped silently. A session window is `[first, last + gap)`
//! of rows less than `gap` apart; sessions that a row joins merge (an emitted session that
//! merges away is retracted with `-D`; sessions that touch merge), and the merged session is
//! late only if it is past
//! `end + allowed_lateness`. A row whose time or key is null is refused (a dead letter).
//!
//! **Behind an exchange** (`floe_core::exchange`) a partition's rows come from many source
//! partitions, interleaved by timing. There the clock is not the rows' largest event time
//! but the exchange's clock of the partition (the smallest clock of its sources, handed over
//! by [`Operator::on_event_clock`]), and a row is late by its own source's clock
//! ([`SOURCE_CLOCK_COLUMN`], minus `out_of_orderness`) or the partition's watermark,
//! whichever is later. The source clock of a row is never behind the partition's clock, so
//! what is late depends only on each source's rows — the same in every run — and no window
//! is closed while a source may still add to it. `idle_after` does not apply there.
//!
//! **Idleness.** With `idle_after`, a partition that received nothing for that long (processing
//! time) stops holding the clock: its watermark moves up to the smallest watermark of the
//! partitions still active, so its windows fire. This is the only processing-time input of the
//! operator, as with Flink's `withIdleness`.
//!
//! **State** (per partition): `0x00` → the largest event time; `0x01 end start key` → the
//! window's accumulators (tumbling and sliding); `0x03 end` → whether the windows ending there
//! fired; `0x02 key` → a key's sessions, with event-time timers at their ends.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::Array;
use arrow_array::builder::{Int8Builder, StringBuilder, TimestampMicrosecondBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use floe_core::exchange::SOURCE_CLOCK_COLUMN;
use floe_core::rollup::{MergeRule, RollupPlan};
use floe_core::{OP_COLUMN, Op, StreamBatch, StreamSpec};

use crate::aggregate::{Acc, Aggregate, Bound, Columns};
use crate::codec::{
    KeyColumns, KeyType, Reader, Writer, decoded_type, encode_key_value, integer_at, sortable,
    unsortable,
};
use crate::timers::EVENT_TIME;
use crate::{Context, FastHash, OpError, OpResult, Operator, OperatorStats};

/// The shape of a window.
#[derive(Debug, Clone, PartialEq)]
pub enum WindowKind {
    /// Fixed, back-to-back windows of `size` µs.
    Tumbling {
        /// Length (µs).
        size: i64,
    },
    /// Windows of `size` µs starting every `slide` µs.
    Sliding {
        /// Length (µs).
        size: i64,
        /// Distance between starts (µs).
        slide: i64,
    },
    /// Rows less than `gap` µs apart, per key.
    Session {
        /// Inactivity that ends a session (µs).
        gap: i64,
    },
}

/// A window operator as configured.
#[derive(Debug, Clone)]
pub struct WindowSpec {
    /// The operator's id.
    pub id: String,
    /// The window.
    pub kind: WindowKind,
    /// The input's event-time column.
    pub time_column: String,
    /// How far behind the largest event time seen rows may arrive (µs).
    pub out_of_orderness: i64,
    /// How long a fired window takes updates (µs).
    pub allowed_lateness: i64,
    /// Processing time without rows after which a partition stops holding the clock.
    pub idle_after: Option<std::time::Duration>,
    /// Key columns.
    pub key: Vec<String>,
    /// Aggregates.
    pub aggregates: Vec<Aggregate>,
    /// The rollup stream.
    pub output: String,
    /// The late-rows stream.
    pub late_output: String,
    /// Tumbling and sliding windows: a stream of each window's row once more when it can no
    /// longer change (its end plus the allowed lateness passed): append-only, final per
    /// minute of `window_start` (ADR 0010).
    pub final_output: Option<String>,
}

impl WindowSpec {
    /// A digest of what the stored state depends on.
    pub fn fingerprint(&self) -> String {
        format!(
            "window v1 {:?} time={} ooo={} key={:?} aggregates={:?}",
            self.kind, self.time_column, self.out_of_orderness, self.key, self.aggregates
        )
    }
}

/// Per-partition clock and index of open windows.
#[derive(Debug, Default)]
struct Part {
    /// Largest event time seen (µs); `None` before the first row.
    max_time: Option<i64>,
    /// Window ends present in state → whether they fired (tumbling, sliding).
    ends: BTreeMap<i64, bool>,
    /// Earliest session timer (sessions).
    next_timer: Option<i64>,
    /// Sessions open (sessions).
    sessions: u64,
    /// When rows last arrived (idleness).
    last_rows: Option<Instant>,
}

impl Part {
    fn watermark(&self, ooo: i64) -> i64 {
        self.max_time.map_or(i64::MIN, |t| t.saturating_sub(ooo))
    }
}

/// A rollup row to emit: the window, the key, its aggregates and what it does to the row.
#[derive(Debug, Clone)]
struct Rollup {
    start: i64,
    end: i64,
    key: Vec<u8>,
    accs: Vec<Acc>,
    op: Op,
}

/// A (window, key) of a segment and its partial aggregates.
type Segment = Vec<((i64, i64, Vec<u8>), Vec<Acc>)>;

/// A batch's encoded keys, end to end in one buffer: one allocation per batch, not per row.
struct RowKeys {
    bytes: Vec<u8>,
    /// Per row: its key's bytes (`None`: a key column is null).
    ranges: Vec<Option<(usize, usize)>>,
}

impl RowKeys {
    fn get(&self, row: usize) -> Option<&[u8]> {
        self.ranges[row].map(|(from, to)| &self.bytes[from..to])
    }
}

/// What processing a partition's rows produced.
#[derive(Debug, Default)]
struct Produced {
    rollups: Vec<Rollup>,
    /// Late rows (row index, the watermark they met).
    late: Vec<(usize, i64)>,
}

/// A session of one key.
#[derive(Debug, Clone)]
struct Session {
    start: i64,
    end: i64,
    fired: bool,
    accs: Vec<Acc>,
}

impl Session {
    /// The session's row of `key` as a change `op` of the output.
    fn rollup(&self, key: &[u8], op: Op) -> Rollup {
        Rollup {
            start: self.start,
            end: self.end,
            key: key.to_vec(),
            accs: self.accs.clone(),
            op,
        }
    }
}

/// The window operator.
pub struct Window {
    spec: WindowSpec,
    time_index: usize,
    time_unit: TimeUnit,
    key_indices: Vec<usize>,
    key_types: Vec<KeyType>,
    bound: Vec<Bound>,
    outputs: Vec<StreamSpec>,
    main: SchemaRef,
    input: SchemaRef,
    parts: HashMap<u32, Part>,
    late_rows: u64,
    /// The input is read back from an exchange: the clock comes from it.
    exchanged: bool,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("id", &self.spec.id)
            .field("partitions", &self.parts.len())
            .finish_non_exhaustive()
    }
}

/// How `floe-maintenance merge` combines each rollup column (recorded in the table's
/// properties).
fn rollup_plan(spec: &WindowSpec, bound: &[Bound]) -> RollupPlan {
    let mut columns = vec![
        ("window_start".to_string(), MergeRule::Group),
        ("window_end".to_string(), MergeRule::Group),
    ];
    columns.extend(spec.key.iter().map(|k| (k.clone(), MergeRule::Group)));
    columns.push(("source_partition".into(), MergeRule::Partition));
    for b in bound {
        columns.extend(b.merges());
    }
    RollupPlan {
        operator: spec.id.clone(),
        allowed_lateness: spec.allowed_lateness,
        columns,
    }
}

/// A UTC timestamp of µs, the type of window bounds and watermarks.
pub(crate) fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
}

/// An operator's output stream `name` of rows final per minute of `time_column`
/// ([`floe_core::exchange::FINAL_PER_MINUTE`]): append-only, partitioned by its day; in one
/// partition when the operator's `input` is (the generator's streams).
pub(crate) fn final_stream(
    name: &str,
    schema: iceberg::spec::Schema,
    time_column: &str,
    input: &StreamSpec,
) -> StreamSpec {
    let mut properties = vec![(
        floe_core::exchange::FINAL_PER_MINUTE.to_string(),
        time_column.to_string(),
    )];
    if floe_core::exchange::is_one_partition(input) {
        properties.push((
            floe_core::exchange::ONE_PARTITION.to_string(),
            "true".to_string(),
        ));
    }
    StreamSpec {
        name: name.to_string(),
        table: name.to_string(),
        schema: Some(schema),
        changelog: false,
        key: Vec::new(),
        time_column: Some(time_column.into()),
        partition: vec![(time_column.into(), iceberg::spec::Transform::Day)],
        bloom_filter_columns: Vec::new(),
        plain_columns: Vec::new(),
        properties,
    }
}

/// The late-rows stream `name` of an operator over `input` (whose columns are `arrow`): the
/// input's columns, then `late_reason` and `late_watermark`.
pub(crate) fn late_stream(
    input: &StreamSpec,
    arrow: &Schema,
    name: &str,
) -> Result<StreamSpec, String> {
    let mut fields: Vec<Field> = arrow
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), f.is_nullable()))
        .collect();
    fields.push(Field::new("late_reason", DataType::Utf8, false));
    fields.push(Field::new("late_watermark", timestamp(), false));
    Ok(StreamSpec {
        name: name.to_string(),
        table: name.to_string(),
        schema: Some(iceberg_schema(&Schema::new(fields), &[])?),
        changelog: false,
        key: Vec::new(),
        time_column: input.time_column.clone(),
        partition: input.partition.clone(),
        bloom_filter_columns: Vec::new(),
        plain_columns: Vec::new(),
        properties: Vec::new(),
    })
}

/// The late table's rows: the first `width` columns of `rows` (the input's, not what an
/// exchange adds to them) at the row indices of `late`, each with `reason(watermark)` and
/// the watermark it was late for — the columns [`late_stream`] declares.
pub(crate) fn late_rows(
    rows: &RecordBatch,
    width: usize,
    late: &[(usize, i64)],
    reason: impl Fn(i64) -> String,
) -> Result<RecordBatch, String> {
    let indices =
        arrow_array::UInt32Array::from(late.iter().map(|(r, _)| *r as u32).collect::<Vec<_>>());
    let mut columns: Vec<ArrayRef> = rows
        .columns()
        .iter()
        .take(width)
        .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut reasons = StringBuilder::new();
    let mut marks = TimestampMicrosecondBuilder::new();
    for (_, w) in late {
        reasons.append_value(reason(*w));
        marks.append_value(*w);
    }
    columns.push(Arc::new(reasons.finish()));
    columns.push(Arc::new(marks.finish().with_timezone("+00:00")));
    let fields: Vec<Field> = rows
        .schema()
        .fields()
        .iter()
        .take(width)
        .map(|f| f.as_ref().clone())
        .chain([
            Field::new("late_reason", DataType::Utf8, false),
            Field::new("late_watermark", timestamp(), false),
        ])
        .collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// The unit of an event-time column: a timestamp's, or µs for a long.
fn time_unit_of(column: &str, ty: &DataType) -> Result<TimeUnit, String> {
    match ty {
        DataType::Timestamp(unit, _) => Ok(*unit),
        DataType::Int64 => Ok(TimeUnit::Microsecond),
        other => Err(format!("time column {column} is {other}, not a timestamp")),
    }
}

/// The event time (µs) of every row of `batch` by its column `column` (a timestamp, or a
/// long of µs); `None` for a null.
pub fn event_times(batch: &RecordBatch, column: &str) -> Result<Vec<Option<i64>>, String> {
    let values = batch
        .column_by_name(column)
        .ok_or_else(|| format!("no time column {column}"))?;
    let unit = time_unit_of(column, values.data_type())?;
    Ok((0..batch.num_rows())
        .map(|r| integer_at(values.as_ref(), r).map(|v| micros(unit, v)))
        .collect())
}

/// The source clocks exchanged rows carry, if `rows` have them.
fn source_clocks(rows: &RecordBatch) -> Option<&arrow_array::Int64Array> {
    rows.column_by_name(SOURCE_CLOCK_COLUMN)
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::Int64Array>())
}

fn micros(unit: TimeUnit, v: i64) -> i64 {
    match unit {
        TimeUnit::Second => v.saturating_mul(1_000_000),
        TimeUnit::Millisecond => v.saturating_mul(1_000),
        TimeUnit::Microsecond => v,
        TimeUnit::Nanosecond => v.div_euclid(1_000),
    }
}

/// Field ids for a schema built from Arrow (the catalog assigns its own).
pub fn iceberg_schema(
    arrow: &Schema,
    identifier: &[&str],
) -> Result<iceberg::spec::Schema, String> {
    let mut next = 0;
    let fields: Vec<Field> = arrow
        .fields()
        .iter()
        .map(|f| with_ids(f, &mut next))
        .collect();
    let schema =
        iceberg::arrow::arrow_schema_to_schema(&Schema::new(fields)).map_err(|e| e.to_string())?;
    let ids: Vec<i32> = identifier
        .iter()
        .filter_map(|name| schema.field_by_name(name).map(|f| f.id))
        .collect();
    iceberg::spec::Schema::builder()
        .with_fields(schema.as_struct().fields().to_vec())
        .with_identifier_field_ids(ids)
        .build()
        .map_err(|e| e.to_string())
}

fn with_ids(field: &Field, next: &mut i32) -> Field {
    *next += 1;
    let id = *next;
    let ty = match field.data_type() {
        DataType::List(inner) => DataType::List(Arc::new(with_ids(inner, next))),
        DataType::LargeList(inner) => DataType::LargeList(Arc::new(with_ids(inner, next))),
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| Arc::new(with_ids(f, next)))
                .collect::<Vec<_>>()
                .into(),
        ),
        DataType::Map(entries, sorted) => DataType::Map(Arc::new(with_ids(entries, next)), *sorted),
        other => other.clone(),
    };
    let mut metadata = field.metadata().clone();
    metadata.insert("PARQUET:field_id".to_string(), id.to_string());
    Field::new(field.name(), ty, field.is_nullable()).with_metadata(metadata)
}

impl Window {
    /// A window over `input` (its schema must be known); `Err` says what is wrong with the
    /// configuration.
    pub fn new(spec: WindowSpec, input: &StreamSpec) -> Result<Self, String> {
        if input.changelog {
            return Err(format!(
                "stream {} is a changelog; windows read append streams",
                input.name
            ));
        }
        if floe_core::exchange::is_exchanged(input) {
            // Whether a late row joins a session depends on whether the session was purged
            // yet, which behind an exchange depends on timing.
            if matches!(spec.kind, WindowKind::Session { .. }) {
                return Err(format!(
                    "stream {} is read back from an exchange: session windows cannot read it \
                     (tumbling and sliding windows can); put the session window before the \
                     exchange",
                    input.name
                ));
            }
            if input.time_column.as_deref() != Some(spec.time_column.as_str()) {
                return Err(format!(
                    "stream {} is read back from an exchange, whose rows carry the clock of \
                     its time column {:?}: a window behind it uses that column, not {}",
                    input.name, input.time_column, spec.time_column
                ));
            }
        }
        let iceberg = input
            .schema
            .as_ref()
            .ok_or_else(|| format!("the columns of stream {} are not known yet", input.name))?;
        let arrow: SchemaRef =
            Arc::new(iceberg::arrow::schema_to_arrow_schema(iceberg).map_err(|e| e.to_string())?);
        let (time_index, time_field) = arrow
            .column_with_name(&spec.time_column)
            .ok_or_else(|| format!("stream {} has no column {}", input.name, spec.time_column))?;
        let time_unit = time_unit_of(&spec.time_column, time_field.data_type())?;
        let mut key_indices = Vec::new();
        let mut key_types = Vec::new();
        let mut key_fields = Vec::new();
        for k in &spec.key {
            let (i, f) = arrow
                .column_with_name(k)
                .ok_or_else(|| format!("stream {} has no key column {k}", input.name))?;
            let ty = KeyType::of(f.data_type()).ok_or_else(|| {
                format!("key column {k} is {}, which cannot be a key", f.data_type())
            })?;
            key_fields.push(Field::new(k, decoded_type(&ty), false));
            key_indices.push(i);
            key_types.push(ty);
        }
        let bound = spec
            .aggregates
            .iter()
            .map(|a| Bound::new(a, &arrow))
            .collect::<Result<Vec<_>, _>>()?;
        let mut fields = vec![
            Field::new("window_start", timestamp(), false),
            Field::new("window_end", timestamp(), false),
        ];
        fields.extend(key_fields);
        fields.push(Field::new("source_partition", DataType::Utf8, false));
        for b in &bound {
            fields.extend(b.fields());
        }
        let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
        if let Some(dup) = names
            .iter()
            .enumerate()
            .find_map(|(i, n)| names[..i].contains(n).then_some(n))
        {
            return Err(format!("two output columns are named {dup}"));
        }
        let rollup = Schema::new(fields.clone());
        let mut identifier = vec!["window_start"];
        identifier.extend(spec.key.iter().map(String::as_str));
        identifier.push("source_partition");
        let main_iceberg = iceberg_schema(&rollup, &identifier)?;
        let mut main_fields = fields;
        main_fields.push(Field::new(OP_COLUMN, DataType::Int8, false));
        let late_stream = late_stream(input, &arrow, &spec.late_output)?;
        let outputs = vec![
            StreamSpec {
                name: spec.output.clone(),
                table: spec.output.clone(),
                schema: Some(main_iceberg),
                changelog: true,
                key: identifier.iter().map(|s| s.to_string()).collect(),
                time_column: Some("window_start".into()),
                partition: vec![("window_start".into(), iceberg::spec::Transform::Day)],
                bloom_filter_columns: Vec::new(),
                plain_columns: Vec::new(),
                properties: rollup_plan(&spec, &bound).to_properties(),
            },
            late_stream,
        ];
        let mut outputs = outputs;
        if let Some(name) = &spec.final_output {
            if matches!(spec.kind, WindowKind::Session { .. }) {
                return Err("a session window has no final output".into());
            }
            outputs.push(final_stream(
                name,
                iceberg_schema(&rollup, &[])?,
                "window_start",
                input,
            ));
        }
        Ok(Self {
            time_index,
            time_unit,
            key_indices,
            key_types,
            bound,
            outputs,
            main: Arc::new(Schema::new(main_fields)),
            input: arrow,
            parts: HashMap::new(),
            late_rows: 0,
            exchanged: floe_core::exchange::is_exchanged(input),
            spec,
        })
    }

    /// The operator's configuration.
    pub fn spec(&self) -> &WindowSpec {
        &self.spec
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    /// Into `out` (emptied first): the windows `[start, end)` a row at `t` belongs to, by end
    /// (tumbling, sliding).
    fn assign(&self, t: i64, out: &mut Vec<(i64, i64)>) {
        out.clear();
        let (size, slide) = match self.spec.kind {
            WindowKind::Tumbling { size } => (size, size),
            WindowKind::Sliding { size, slide } => (size, slide),
            WindowKind::Session { .. } => return,
        };
        let last = t.div_euclid(slide) * slide;
        let mut start = last;
        while start + size > t {
            out.push((start, start + size));
            start -= slide;
        }
        out.reverse();
    }

    fn times_and_keys(&self, rows: &RecordBatch) -> (Vec<Option<i64>>, RowKeys) {
        let time = rows.column(self.time_index);
        let times = (0..rows.num_rows())
            .map(|r| integer_at(time.as_ref(), r).map(|v| micros(self.time_unit, v)))
            .collect();
        let mut keys = RowKeys {
            bytes: Vec::with_capacity(rows.num_rows() * 16),
            ranges: Vec::with_capacity(rows.num_rows()),
        };
        for r in 0..rows.num_rows() {
            let from = keys.bytes.len();
            let whole =
                self.key_indices.iter().zip(&self.key_types).all(|(i, ty)| {
                    encode_key_value(ty, rows.column(*i).as_ref(), r, &mut keys.bytes)
                });
            if whole {
                keys.ranges.push(Some((from, keys.bytes.len())));
            } else {
                keys.bytes.truncate(from);
                keys.ranges.push(None);
            }
        }
        (times, keys)
    }

    fn refuse_row(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
        row: usize,
        time: Option<i64>,
    ) {
        let reason = if time.is_none() {
            format!(
                "operator {}: the time column {} is null",
                self.spec.id, self.spec.time_column
            )
        } else {
            format!(
                "operator {}: a key column ({}) is null",
                self.spec.id,
                self.spec.key.join(", ")
            )
        };
        ctx.dead_letter(p, reason, rows, row);
    }

    fn empty_accs(&self) -> Vec<Acc> {
        self.bound.iter().map(Bound::empty).collect()
    }

    fn encode_accs(accs: &[Acc]) -> Vec<u8> {
        let mut w = Writer::default();
        for acc in accs {
            acc.encode(&mut w);
        }
        w.0
    }

    fn decode_accs(&self, bytes: &[u8]) -> OpResult<Vec<Acc>> {
        let mut r = Reader(bytes);
        self.bound
            .iter()
            .map(|b| Acc::decode(&b.empty(), &mut r).map_err(|e| self.invalid(e)))
            .collect()
    }

    fn window_key(end: i64, start: i64, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(17 + key.len());
        k.push(0x01);
        k.extend_from_slice(&sortable(end));
        k.extend_from_slice(&sortable(start));
        k.extend_from_slice(key);
        k
    }

    fn end_key(end: i64) -> Vec<u8> {
        let mut k = vec![0x03];
        k.extend_from_slice(&sortable(end));
        k
    }

    fn save_clock(&self, ctx: &mut Context<'_>, p: u32) -> OpResult<()> {
        if let Some(t) = self.parts.get(&p).and_then(|part| part.max_time) {
            ctx.put(p, &[0x00], &t.to_le_bytes())?;
        }
        Ok(())
    }

    /// Rollup rows of `(start, end, key, accs, op)` for partition `p`.
    fn rollup_batch(&self, ctx: &Context<'_>, p: u32, rows: &[Rollup]) -> OpResult<StreamBatch> {
        let mut starts = TimestampMicrosecondBuilder::with_capacity(rows.len());
        let mut ends = TimestampMicrosecondBuilder::with_capacity(rows.len());
        let mut keys = KeyColumns::new(&self.key_types);
        let mut partition = StringBuilder::new();
        let mut ops = Int8Builder::with_capacity(rows.len());
        let mut columns: Vec<Columns> = self.bound.iter().map(Columns::new).collect();
        let name = ctx.partition_name(p);
        for r in rows {
            starts.append_value(r.start);
            ends.append_value(r.end);
            keys.push(Reader(&r.key)).map_err(|e| self.invalid(e))?;
            partition.append_value(&name);
            for (c, acc) in columns.iter_mut().zip(&r.accs) {
                c.push(acc);
            }
            ops.append_value(r.op.code());
        }
        let mut arrays: Vec<ArrayRef> = vec![
            Arc::new(starts.finish().with_timezone("+00:00")),
            Arc::new(ends.finish().with_timezone("+00:00")),
        ];
        arrays.extend(keys.finish());
        arrays.push(Arc::new(partition.finish()));
        for c in &mut columns {
            arrays.extend(c.finish());
        }
        arrays.push(Arc::new(ops.finish()));
        let batch = RecordBatch::try_new(self.main.clone(), arrays)
            .map_err(|e| self.invalid(format!("rollup rows: {e}")))?;
        Ok(StreamBatch::single(0, batch, p))
    }

    fn emit_rollups(&self, ctx: &mut Context<'_>, p: u32, rows: &[Rollup]) -> OpResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut batch = self.rollup_batch(ctx, p, rows)?;
        batch.stream = 0;
        ctx.emit(0, batch);
        Ok(())
    }

    fn emit_late(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
        late: &[(usize, i64)],
    ) -> OpResult<()> {
        if late.is_empty() {
            return Ok(());
        }
        self.late_rows += late.len() as u64;
        let (id, lateness) = (&self.spec.id, self.spec.allowed_lateness);
        let batch = late_rows(rows, self.input.fields().len(), late, |w| {
            format!(
                "operator {id}: later than the allowed lateness (watermark {w} µs, allowed \
                 lateness {lateness} µs)"
            )
        })
        .map_err(|e| self.invalid(format!("late rows: {e}")))?;
        ctx.emit(1, StreamBatch::single(1, batch, p));
        Ok(())
    }

    // ---- tumbling and sliding windows ----

    /// Merges a segment's partial aggregates into state; emits updates of fired windows.
    fn flush_fixed(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        segment: &mut Segment,
    ) -> OpResult<()> {
        let mut updates = Vec::new();
        for ((start, end, key), accs) in segment.drain(..) {
            let state_key = Self::window_key(end, start, &key);
            let existing = ctx.get(p, &state_key)?;
            let mut merged = match &existing {
                Some(bytes) => self.decode_accs(bytes)?,
                None => self.empty_accs(),
            };
            for (m, a) in merged.iter_mut().zip(&accs) {
                m.merge(a);
            }
            ctx.put(p, &state_key, &Self::encode_accs(&merged))?;
            let part = self.parts.entry(p).or_default();
            // Every window a segment touches had its end recorded before the row was added.
            if part.ends.get(&end) == Some(&true) {
                let op = if existing.is_some() {
                    Op::UpdateAfter
                } else {
                    Op::Insert
                };
                updates.push(Rollup {
                    start,
                    end,
                    key,
                    accs: merged,
                    op,
                });
            }
        }
        self.save_clock(ctx, p)?;
        self.emit_rollups(ctx, p, &updates)
    }

    /// Fires windows whose end the watermark passed, and drops those past their lateness.
    fn fire_fixed(&mut self, ctx: &mut Context<'_>, p: u32) -> OpResult<()> {
        let wm = self
            .parts
            .get(&p)
            .map_or(i64::MIN, |part| part.watermark(self.spec.out_of_orderness));
        let lateness = self.spec.allowed_lateness;
        loop {
            let Some(part) = self.parts.get(&p) else {
                return Ok(());
            };
            let due = part.ends.iter().find_map(|(end, fired)| {
                let at = if *fired {
                    end.saturating_add(lateness)
                } else {
                    *end
                };
                (at <= wm).then_some((*end, *fired))
            });
            let Some((end, fired)) = due else {
                return Ok(());
            };
            let mut prefix = vec![0x01];
            prefix.extend_from_slice(&sortable(end));
            let mut to = vec![0x01];
            to.extend_from_slice(&sortable(end + 1));
            let mut rows = Vec::new();
            let mut keys = Vec::new();
            let mut failed = None;
            let finals = self.spec.final_output.is_some();
            ctx.scan(p, &prefix, Some(&to), |k, v| {
                if fired {
                    keys.push(k.to_vec());
                }
                if !fired || finals {
                    let start = unsortable(&k[9..17]);
                    match self.decode_accs(v) {
                        Ok(accs) => rows.push(Rollup {
                            start,
                            end,
                            key: k[17..].to_vec(),
                            accs,
                            op: Op::Insert,
                        }),
                        Err(e) => {
                            failed = Some(e);
                            return ControlFlow::Break(());
                        }
                    }
                }
                ControlFlow::Continue(())
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
            if fired {
                // The rows as they end: the final output's, in (start, key) order.
                for chunk in rows.chunks(16 * 1024) {
                    let mut batch = self.rollup_batch(ctx, p, chunk)?;
                    let columns = batch.batch.num_columns() - 1;
                    batch.batch = batch
                        .batch
                        .project(&(0..columns).collect::<Vec<_>>())
                        .map_err(|e| self.invalid(format!("final rows: {e}")))?;
                    batch.stream = 2;
                    ctx.emit(2, batch);
                }
                for k in keys {
                    ctx.delete(p, &k)?;
                }
                ctx.delete(p, &Self::end_key(end))?;
                self.parts.entry(p).or_default().ends.remove(&end);
            } else {
                for chunk in rows.chunks(16 * 1024) {
                    self.emit_rollups(ctx, p, chunk)?;
                }
                ctx.put(p, &Self::end_key(end), &[1])?;
                self.parts.entry(p).or_default().ends.insert(end, true);
            }
        }
    }

    fn next_due_fixed(&self, p: u32) -> i64 {
        let lateness = self.spec.allowed_lateness;
        self.parts
            .get(&p)
            .and_then(|part| {
                part.ends
                    .iter()
                    .map(|(end, fired)| {
                        if *fired {
                            end.saturating_add(lateness)
                        } else {
                            *end
                        }
                    })
                    .min()
            })
            .unwrap_or(i64::MAX)
    }

    /// The watermark row `row` of partition `p` meets: the partition's, or, behind an
    /// exchange, its source's clock if that is later.
    fn row_watermark(
        &mut self,
        p: u32,
        clocks: Option<&arrow_array::Int64Array>,
        row: usize,
    ) -> i64 {
        let ooo = self.spec.out_of_orderness;
        let wm = self.parts.entry(p).or_default().watermark(ooo);
        match clocks {
            Some(c) if c.is_valid(row) => wm.max(c.value(row).saturating_sub(ooo)),
            _ => wm,
        }
    }

    /// Behind an exchange, the source clocks the rows carry (none on records an older
    /// Floe wrote: those rows meet the partition's watermark).
    fn clocks_of<'a>(&self, rows: &'a RecordBatch) -> Option<&'a arrow_array::Int64Array> {
        if self.exchanged {
            source_clocks(rows)
        } else {
            None
        }
    }

    fn fixed_rows(&mut self, ctx: &mut Context<'_>, p: u32, rows: &RecordBatch) -> OpResult<()> {
        let (times, keys) = self.times_and_keys(rows);
        let clocks = self.clocks_of(rows);
        let ooo = self.spec.out_of_orderness;
        let lateness = self.spec.allowed_lateness;
        let mut segment: Segment = Vec::new();
        let mut index: HashMap<(i64, i64, &[u8]), usize, FastHash> = HashMap::default();
        let mut late = Vec::new();
        let mut next_due = self.next_due_fixed(p);
        let mut windows = Vec::new();
        for (row, &time) in times.iter().enumerate() {
            let (Some(t), Some(key)) = (time, keys.get(row)) else {
                self.refuse_row(ctx, p, rows, row, time);
                continue;
            };
            let wm = self.row_watermark(p, clocks, row);
            self.assign(t, &mut windows);
            let last_end = windows.last().map_or(i64::MIN, |w| w.1);
            if last_end.saturating_add(lateness) <= wm {
                late.push((row, wm));
                continue;
            }
            for &(start, end) in &windows {
                if end.saturating_add(lateness) <= wm {
                    continue; // this one is closed; the row still counts in later ones
                }
                let part = self.parts.entry(p).or_default();
                if let std::collections::btree_map::Entry::Vacant(slot) = part.ends.entry(end) {
                    // A new window: it fires now if its end already passed (a first row
                    // within the lateness), else when the watermark gets there.
                    let fired = end <= wm;
                    slot.insert(fired);
                    ctx.put(p, &Self::end_key(end), &[fired as u8])?;
                    next_due = next_due.min(if fired {
                        end.saturating_add(lateness)
                    } else {
                        end
                    });
                }
                let slot = *index.entry((start, end, key)).or_insert_with(|| {
                    segment.push((
                        (start, end, key.to_vec()),
                        self.bound.iter().map(Bound::empty).collect(),
                    ));
                    segment.len() - 1
                });
                for (b, acc) in self.bound.iter().zip(segment[slot].1.iter_mut()) {
                    b.add(acc, rows.columns(), row);
                }
            }
            if self.exchanged {
                continue; // the exchange moves the clock
            }
            let part = self.parts.entry(p).or_default();
            part.max_time = Some(part.max_time.map_or(t, |m| m.max(t)));
            if part.watermark(ooo) >= next_due {
                self.flush_fixed(ctx, p, &mut segment)?;
                index.clear();
                self.fire_fixed(ctx, p)?;
                next_due = self.next_due_fixed(p);
            }
        }
        self.flush_fixed(ctx, p, &mut segment)?;
        self.emit_late(ctx, p, rows, &late)
    }

    // ---- session windows ----

    fn session_key(key: &[u8]) -> Vec<u8> {
        let mut k = vec![0x02];
        k.extend_from_slice(key);
        k
    }

    fn load_sessions(&self, ctx: &Context<'_>, p: u32, key: &[u8]) -> OpResult<Vec<Session>> {
        let Some(bytes) = ctx.get(p, &Self::session_key(key))? else {
            return Ok(Vec::new());
        };
        let mut r = Reader(&bytes);
        let n = r.u64().map_err(|e| self.invalid(e))?;
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let start = r.i64().map_err(|e| self.invalid(e))?;
            let end = r.i64().map_err(|e| self.invalid(e))?;
            let fired = r.u8().map_err(|e| self.invalid(e))? != 0;
            let accs = self
                .bound
                .iter()
                .map(|b| Acc::decode(&b.empty(), &mut r))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| self.invalid(e))?;
            out.push(Session {
                start,
                end,
                fired,
                accs,
            });
        }
        Ok(out)
    }

    fn store_sessions(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        key: &[u8],
        sessions: &[Session],
    ) -> OpResult<()> {
        if sessions.is_empty() {
            return ctx.delete(p, &Self::session_key(key));
        }
        let mut w = Writer::default();
        w.u64(sessions.len() as u64);
        for s in sessions {
            w.i64(s.start);
            w.i64(s.end);
            w.u8(s.fired as u8);
            for acc in &s.accs {
                acc.encode(&mut w);
            }
        }
        ctx.put(p, &Self::session_key(key), &w.0)
    }

    /// The timer of a session: at its end (to fire) or end + lateness (to purge).
    fn session_timer(&self, s: &Session) -> i64 {
        if s.fired {
            s.end.saturating_add(self.spec.allowed_lateness)
        } else {
            s.end
        }
    }

    fn note_timer(&mut self, p: u32, at: i64) {
        let part = self.parts.entry(p).or_default();
        part.next_timer = Some(part.next_timer.map_or(at, |n| n.min(at)));
    }

    /// Row `row` (at `t`, of `key`) of a session window.
    fn session_row(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        (key, t): (&[u8], i64),
        (rows, row, wm): (&RecordBatch, usize, i64),
        produced: &mut Produced,
    ) -> OpResult<()> {
        let WindowKind::Session { gap } = self.spec.kind else {
            return Ok(());
        };
        let mut sessions = self.load_sessions(ctx, p, key)?;
        let mut merged = Session {
            start: t,
            end: t.saturating_add(gap),
            fired: false,
            accs: self.empty_accs(),
        };
        for (b, acc) in self.bound.iter().zip(merged.accs.iter_mut()) {
            b.add(acc, rows.columns(), row);
        }
        let mut kept = Vec::with_capacity(sessions.len());
        let mut absorbed = Vec::new();
        for s in sessions.drain(..) {
            // Touching sessions merge too, as Flink's do.
            if s.start <= merged.end && merged.start <= s.end {
                absorbed.push(s);
            } else {
                kept.push(s);
            }
        }
        for s in &absorbed {
            merged.start = merged.start.min(s.start);
            merged.end = merged.end.max(s.end);
            for (m, a) in merged.accs.iter_mut().zip(&s.accs) {
                m.merge(a);
            }
        }
        if merged.end.saturating_add(self.spec.allowed_lateness) <= wm {
            produced.late.push((row, wm));
            return Ok(());
        }
        // Retract emitted sessions that merge away; the merged one replaces them.
        let mut replaces_emitted = false;
        for s in &absorbed {
            EVENT_TIME.cancel(ctx, p, self.session_timer(s), key)?;
            if s.fired {
                if s.start == merged.start {
                    replaces_emitted = true;
                } else {
                    produced.rollups.push(s.rollup(key, Op::Delete));
                }
            }
        }
        if merged.end <= wm {
            // Its end already passed: it fires now.
            merged.fired = true;
            let op = if replaces_emitted {
                Op::UpdateAfter
            } else {
                Op::Insert
            };
            produced.rollups.push(merged.rollup(key, op));
        } else if replaces_emitted {
            // An emitted session grew past the watermark: retract it until the new end fires.
            if let Some(s) = absorbed.iter().find(|s| s.fired && s.start == merged.start) {
                produced.rollups.push(s.rollup(key, Op::Delete));
            }
        }
        let timer = self.session_timer(&merged);
        EVENT_TIME.register(ctx, p, timer, key)?;
        self.note_timer(p, timer);
        let part = self.parts.entry(p).or_default();
        part.sessions = (part.sessions + 1).saturating_sub(absorbed.len() as u64);
        kept.push(merged);
        kept.sort_by_key(|s| s.start);
        self.store_sessions(ctx, p, key, &kept)
    }

    /// Fires and purges sessions whose timers the watermark passed.
    fn fire_sessions(&mut self, ctx: &mut Context<'_>, p: u32) -> OpResult<Vec<Rollup>> {
        let wm = self
            .parts
            .get(&p)
            .map_or(i64::MIN, |part| part.watermark(self.spec.out_of_orderness));
        let mut out = Vec::new();
        // No timer is earlier than the partition's known next one (registering lowers it).
        let mut floor = self
            .parts
            .get(&p)
            .and_then(|part| part.next_timer)
            .unwrap_or(i64::MIN);
        // A firing registers the purge timer, which may be due at once (no lateness).
        loop {
            let due = EVENT_TIME.take_due(ctx, p, floor, wm)?;
            if due.is_empty() {
                break;
            }
            // The next scan starts at the latest time taken, or lower at a timer registered
            // on the way (a purge timer may be earlier than another key's firing).
            let mut registered = i64::MAX;
            floor = due.last().map_or(floor, |(at, _)| *at);
            for (at, key) in due {
                let mut sessions = self.load_sessions(ctx, p, &key)?;
                let mut purged = 0;
                let mut timers = Vec::new();
                sessions.retain_mut(|s| {
                    if self.session_timer(s) != at {
                        return true;
                    }
                    if s.fired {
                        purged += 1;
                        return false;
                    }
                    s.fired = true;
                    out.push(s.rollup(&key, Op::Insert));
                    timers.push(self.session_timer(s));
                    true
                });
                for timer in timers {
                    EVENT_TIME.register(ctx, p, timer, &key)?;
                    registered = registered.min(timer);
                }
                self.store_sessions(ctx, p, &key, &sessions)?;
                let part = self.parts.entry(p).or_default();
                part.sessions = part.sessions.saturating_sub(purged);
            }
            floor = floor.min(registered);
        }
        let next = EVENT_TIME.next(ctx, p, floor)?;
        self.parts.entry(p).or_default().next_timer = next;
        Ok(out)
    }

    fn session_rows(&mut self, ctx: &mut Context<'_>, p: u32, rows: &RecordBatch) -> OpResult<()> {
        let (times, keys) = self.times_and_keys(rows);
        let clocks = self.clocks_of(rows);
        let ooo = self.spec.out_of_orderness;
        let mut produced = Produced::default();
        for (row, &time) in times.iter().enumerate() {
            let (Some(t), Some(key)) = (time, keys.get(row)) else {
                self.refuse_row(ctx, p, rows, row, time);
                continue;
            };
            let wm = self.row_watermark(p, clocks, row);
            self.session_row(ctx, p, (key, t), (rows, row, wm), &mut produced)?;
            if self.exchanged {
                continue; // the exchange moves the clock
            }
            let part = self.parts.entry(p).or_default();
            part.max_time = Some(part.max_time.map_or(t, |m| m.max(t)));
            let wm = part.watermark(ooo);
            if part.next_timer.is_some_and(|n| n <= wm) {
                let fired = self.fire_sessions(ctx, p)?;
                produced.rollups.extend(fired);
            }
        }
        self.save_clock(ctx, p)?;
        for chunk in produced.rollups.chunks(16 * 1024) {
            self.emit_rollups(ctx, p, chunk)?;
        }
        self.emit_late(ctx, p, rows, &produced.late)
    }

    fn advance(&mut self, ctx: &mut Context<'_>, p: u32) -> OpResult<()> {
        match self.spec.kind {
            WindowKind::Session { .. } => {
                let out = self.fire_sessions(ctx, p)?;
                for chunk in out.chunks(16 * 1024) {
                    self.emit_rollups(ctx, p, chunk)?;
                }
                Ok(())
            }
            _ => self.fire_fixed(ctx, p),
        }
    }
}

impl Operator for Window {
    fn id(&self) -> &str {
        &self.spec.id
    }

    fn outputs(&self) -> &[StreamSpec] {
        &self.outputs
    }

    fn on_batch(&mut self, input: &StreamBatch, ctx: &mut Context<'_>) -> OpResult<()> {
        if input.batch.schema().fields().len() < self.input.fields().len() {
            return Err(self.invalid("rows without the input's columns"));
        }
        let now = Instant::now();
        for (p, rows) in input.slices() {
            self.parts.entry(p).or_default().last_rows = Some(now);
            match self.spec.kind {
                WindowKind::Session { .. } => self.session_rows(ctx, p, &rows)?,
                _ => self.fixed_rows(ctx, p, &rows)?,
            }
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        partition: u32,
        watermark: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        let ooo = self.spec.out_of_orderness;
        let part = self.parts.entry(partition).or_default();
        if part.watermark(ooo) >= watermark {
            return Ok(());
        }
        part.max_time = Some(watermark.saturating_add(ooo));
        self.save_clock(ctx, partition)?;
        self.advance(ctx, partition)
    }

    fn on_event_clock(
        &mut self,
        partition: u32,
        max_time: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        let watermark = max_time.saturating_sub(self.spec.out_of_orderness);
        self.on_watermark(partition, watermark, ctx)
    }

    fn on_tick(&mut self, _now_ms: i64, ctx: &mut Context<'_>) -> OpResult<()> {
        let Some(idle_after) = self.spec.idle_after else {
            return Ok(());
        };
        if self.exchanged {
            return Ok(()); // behind an exchange the clock waits for every source
        }
        let ooo = self.spec.out_of_orderness;
        let idle = |part: &Part| part.last_rows.is_none_or(|t| t.elapsed() >= idle_after);
        let active = self
            .parts
            .values()
            .filter(|part| !idle(part) && part.max_time.is_some())
            .map(|part| part.watermark(ooo))
            .min();
        let Some(clock) = active else {
            return Ok(());
        };
        let behind: Vec<u32> = self
            .parts
            .iter()
            .filter(|(_, part)| {
                idle(part) && part.watermark(ooo) < clock && part.max_time.is_some()
            })
            .map(|(p, _)| *p)
            .collect();
        for p in behind {
            tracing::debug!(operator = %self.spec.id, partition = p, clock, "idle partition follows the job's clock");
            self.on_watermark(p, clock, ctx)?;
        }
        Ok(())
    }

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        let mut part = Part::default();
        if let Some(bytes) = ctx.get(partition, &[0x00])? {
            let t = i64::from_le_bytes(
                bytes
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| self.invalid("a stored clock of the wrong size"))?,
            );
            part.max_time = Some(t);
        }
        ctx.scan(partition, &[0x03], Some(&[0x04]), |k, v| {
            part.ends
                .insert(unsortable(&k[1..9]), v.first() == Some(&1));
            ControlFlow::Continue(())
        })?;
        part.next_timer = EVENT_TIME.next(ctx, partition, i64::MIN)?;
        ctx.scan(partition, &[0x02], Some(&[0x03]), |_, _| {
            part.sessions += 1;
            ControlFlow::Continue(())
        })?;
        part.last_rows = Some(Instant::now());
        self.parts.insert(partition, part);
        Ok(())
    }

    fn forget(&mut self) {
        self.parts.clear();
    }

    fn watermarks(&self) -> Vec<(u32, i64)> {
        let mut out: Vec<(u32, i64)> = self
            .parts
            .iter()
            .filter(|(_, part)| part.max_time.is_some())
            .map(|(p, part)| (*p, part.watermark(self.spec.out_of_orderness)))
            .collect();
        out.sort();
        out
    }

    fn fingerprint(&self) -> Option<String> {
        Some(self.spec.fingerprint())
    }

    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        let size = match self.spec.kind {
            WindowKind::Tumbling { size } | WindowKind::Sliding { size, .. } => size,
            WindowKind::Session { .. } => return Vec::new(),
        };
        if self.spec.final_output.is_none() {
            return Vec::new();
        }
        // Windows with end + lateness ≤ W were purged, their final rows emitted: every
        // window starting at or before W − lateness − size.
        self.parts
            .iter()
            .filter_map(|(p, part)| {
                part.max_time?;
                let wm = part.watermark(self.spec.out_of_orderness);
                Some((
                    *p,
                    wm.saturating_sub(self.spec.allowed_lateness)
                        .saturating_sub(size)
                        .saturating_add(1),
                ))
            })
            .collect()
    }

    fn stats(&self) -> OperatorStats {
        OperatorStats {
            open_windows: self
                .parts
                .values()
                .map(|part| part.ends.len() as u64 + part.sessions)
                .sum(),
            late_rows: self.late_rows,
            timers: self
                .parts
                .values()
                .map(|part| part.ends.len() as u64 + part.sessions)
                .sum(),
            split_traces: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int8Type, Int64Type, TimestampMicrosecondType};
    use arrow_array::{StringArray, TimestampMicrosecondArray};
    use floe_core::PartitionRun;
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;
    use crate::aggregate::parse_aggregate;

    const S: i64 = 1_000_000;

    fn input() -> StreamSpec {
        let p = |t| Type::Primitive(t);
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::optional(1, "k", p(PrimitiveType::String))),
                Arc::new(NestedField::optional(
                    2,
                    "ts",
                    p(PrimitiveType::Timestamptz),
                )),
            ])
            .build()
            .unwrap();
        StreamSpec {
            time_column: Some("ts".into()),
            ..StreamSpec::append("events", "events", schema)
        }
    }

    fn spec(kind: WindowKind, lateness: i64) -> WindowSpec {
        WindowSpec {
            id: "w".into(),
            kind,
            time_column: "ts".into(),
            out_of_orderness: 2 * S,
            allowed_lateness: lateness,
            idle_after: None,
            key: vec!["k".into()],
            aggregates: vec![
                parse_aggregate("n", "count()").unwrap(),
                parse_aggregate("first", "min(ts)").unwrap(),
            ],
            output: "rollup".into(),
            late_output: "late".into(),
            final_output: None,
        }
    }

    #[test]
    fn a_window_s_final_row_comes_once_when_it_can_no_longer_change() {
        let dir = std::env::temp_dir().join(format!("floe-window-{}", uuid_like()));
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let spec = WindowSpec {
            final_output: Some("final".into()),
            ..spec(WindowKind::Tumbling { size: 10 * S }, 5 * S)
        };
        let mut w = Window::new(spec, &input()).unwrap();
        assert_eq!(w.outputs()[2].name, "final");
        assert!(!w.outputs()[2].changelog);
        let names = |p: u32| format!("t/{p}");
        let (mut images, mut late) = (Images::new(), Vec::new());
        let mut finals = Vec::new();
        for chunk in workload().chunks(3) {
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            w.on_batch(&batch(chunk, 0), &mut ctx).unwrap();
            let (emitted, _) = ctx.finish();
            let (rollups, last): (Vec<_>, Vec<_>) =
                emitted.into_iter().partition(|(output, _)| *output < 2);
            apply(&mut images, &mut late, rollups);
            for (_, b) in last {
                let b = b.batch;
                assert!(b.column_by_name(OP_COLUMN).is_none());
                let start = b
                    .column_by_name("window_start")
                    .unwrap()
                    .as_primitive::<TimestampMicrosecondType>();
                let key = b.column_by_name("k").unwrap().as_string::<i32>();
                let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
                for i in 0..b.num_rows() {
                    finals.push((start.value(i) / S, key.value(i).to_string(), n.value(i)));
                }
            }
        }
        // Window [0, 10) closed (W = 16 ≥ 10 + 5), with its last image; [10, 20) did not.
        let closed: Vec<(i64, String, i64)> = images
            .iter()
            .filter(|((start, _, _), _)| *start == 0)
            .map(|((start, key, _), (n, _))| (*start, key.clone(), *n))
            .collect();
        assert_eq!(finals, closed);
        assert_eq!(finals.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn batch(rows: &[(Option<&str>, Option<i64>)], partition: u32) -> StreamBatch {
        let k: ArrayRef = Arc::new(StringArray::from(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        ));
        let ts: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(
                rows.iter().map(|r| r.1.map(|s| s * S)).collect::<Vec<_>>(),
            )
            .with_timezone("+00:00"),
        );
        let batch = RecordBatch::try_from_iter([("k", k), ("ts", ts)]).unwrap();
        StreamBatch {
            stream: 0,
            runs: vec![PartitionRun {
                partition,
                rows: batch.num_rows(),
            }],
            batch,
        }
    }

    /// The final image per (start, key, partition) after applying the changelog, and the late
    /// rows' times.
    type Images = BTreeMap<(i64, String, String), (i64, i64)>;

    fn apply(images: &mut Images, late: &mut Vec<i64>, emitted: Vec<(usize, StreamBatch)>) {
        for (output, b) in emitted {
            let rows = &b.batch;
            if output == 1 {
                let ts = rows
                    .column_by_name("ts")
                    .unwrap()
                    .as_primitive::<TimestampMicrosecondType>();
                late.extend(ts.values().iter().map(|t| t / S));
                continue;
            }
            let start = rows
                .column_by_name("window_start")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>();
            let key = rows.column_by_name("k").unwrap().as_string::<i32>();
            let part = rows
                .column_by_name("source_partition")
                .unwrap()
                .as_string::<i32>();
            let n = rows
                .column_by_name("n")
                .unwrap()
                .as_primitive::<Int64Type>();
            let end = rows
                .column_by_name("window_end")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>();
            let ops = rows
                .column_by_name(OP_COLUMN)
                .unwrap()
                .as_primitive::<Int8Type>();
            for i in 0..rows.num_rows() {
                let id = (
                    start.value(i) / S,
                    key.value(i).to_string(),
                    part.value(i).to_string(),
                );
                match Op::from_code(ops.value(i)).unwrap() {
                    Op::Delete | Op::UpdateBefore => {
                        assert!(images.remove(&id).is_some(), "{id:?} deleted but not there");
                    }
                    Op::Insert => {
                        assert!(
                            images
                                .insert(id.clone(), (n.value(i), end.value(i) / S))
                                .is_none(),
                            "{id:?} inserted twice"
                        );
                    }
                    Op::UpdateAfter => {
                        assert!(
                            images
                                .insert(id.clone(), (n.value(i), end.value(i) / S))
                                .is_some(),
                            "{id:?} updated before insert"
                        );
                    }
                }
            }
        }
    }

    /// Runs `rows` (one partition) through a fresh window in batches of `size` rows.
    fn run(
        kind: WindowKind,
        lateness: i64,
        rows: &[(Option<&str>, Option<i64>)],
        size: usize,
    ) -> (Images, Vec<i64>, usize) {
        let dir = std::env::temp_dir().join(format!("floe-window-{}", uuid_like()));
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let mut w = Window::new(spec(kind, lateness), &input()).unwrap();
        let names = |p: u32| format!("t/{p}");
        let (mut images, mut late, mut dead) = (Images::new(), Vec::new(), 0);
        for chunk in rows.chunks(size) {
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            w.on_batch(&batch(chunk, 0), &mut ctx).unwrap();
            let (emitted, refused) = ctx.finish();
            dead += refused.len();
            apply(&mut images, &mut late, emitted);
        }
        let _ = std::fs::remove_dir_all(&dir);
        (images, late, dead)
    }

    fn uuid_like() -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// Times with disorder within the bound, one row later than the lateness, a null time and
    /// a null key; 10 s tumbling windows, 2 s out of order, 5 s lateness.
    fn workload() -> Vec<(Option<&'static str>, Option<i64>)> {
        vec![
            (Some("a"), Some(1)),
            (Some("b"), Some(3)),
            (Some("a"), Some(2)),
            (Some("a"), Some(11)),
            (Some("a"), Some(9)), // within the disorder bound: window 0 has not fired (W = 9)
            (Some("b"), Some(13)), // W = 11: window [0, 10) fires
            (Some("a"), Some(8)), // W = 11 < 10 + 5: an update of the fired window (+U)
            (None, Some(14)),
            (Some("a"), None),
            (Some("b"), Some(18)), // W = 16: window [0, 10) closes
            (Some("b"), Some(4)),  // later than the lateness: the late output
            (Some("a"), Some(25)), // W = 23: window [10, 20) fires
        ]
    }

    /// Rows of key `k` read back from an exchange: (time s, the source clock before it s).
    fn clocked(rows: &[(i64, Option<i64>)]) -> StreamBatch {
        let plain = batch(
            &rows
                .iter()
                .map(|r| (Some("k"), Some(r.0)))
                .collect::<Vec<_>>(),
            0,
        );
        let clocks: ArrayRef = Arc::new(arrow_array::Int64Array::from(
            rows.iter().map(|r| r.1.map(|c| c * S)).collect::<Vec<_>>(),
        ));
        let mut columns = plain.batch.columns().to_vec();
        columns.push(clocks);
        let mut fields: Vec<arrow_schema::FieldRef> = plain.batch.schema().fields().to_vec();
        fields.push(Arc::new(Field::new(
            SOURCE_CLOCK_COLUMN,
            DataType::Int64,
            true,
        )));
        StreamBatch {
            batch: RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap(),
            ..plain
        }
    }

    /// Rows read back from an exchange (time, source clock), then the exchange's clock.
    type Step = (Vec<(i64, Option<i64>)>, Option<i64>);

    #[test]
    fn behind_an_exchange_lateness_follows_each_source_not_the_interleaving() {
        let exchanged = StreamSpec {
            properties: vec![(floe_core::exchange::EXCHANGED_FROM.into(), "x".into())],
            ..input()
        };
        // Source A runs ahead of source B. Each row with its own source's clock before it.
        let a = [(1, None), (12, Some(1)), (25, Some(12)), (3, Some(25))];
        let b = [(2, None), (4, Some(2)), (14, Some(4)), (9, Some(14))];
        // Two interleavings of the same sources, and the exchange's clocks (the smaller of
        // the two sources', once both are heard) at different moments.
        let a_first: Vec<Step> = vec![
            (a.to_vec(), None),
            (b.to_vec(), Some(14)),
            (vec![], Some(100)),
        ];
        let mixed: Vec<Step> = vec![
            (vec![b[0], a[0]], None),
            (vec![a[1], b[1]], Some(2)),
            (vec![b[2], a[2], b[3]], Some(12)),
            (vec![a[3]], Some(25)),
            (vec![], Some(100)),
        ];
        let mut outcomes = Vec::new();
        for steps in [a_first, mixed] {
            let dir = std::env::temp_dir().join(format!("floe-window-{}", uuid_like()));
            let mut store = StateStore::open(&dir, 8 << 20).unwrap();
            let mut w = Window::new(
                spec(WindowKind::Tumbling { size: 10 * S }, 5 * S),
                &exchanged,
            )
            .unwrap();
            let names = |p: u32| format!("x/{p}");
            let (mut images, mut late) = (Images::new(), Vec::new());
            for (rows, clock) in steps {
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                if !rows.is_empty() {
                    w.on_batch(&clocked(&rows), &mut ctx).unwrap();
                }
                if let Some(clock) = clock {
                    w.on_event_clock(0, clock * S, &mut ctx).unwrap();
                }
                apply(&mut images, &mut late, ctx.finish().0);
            }
            let _ = std::fs::remove_dir_all(&dir);
            outcomes.push((images, late));
        }
        let p = "x/0".to_string();
        let expected = Images::from([
            ((0, "k".into(), p.clone()), (4, 10)),
            ((10, "k".into(), p.clone()), (2, 20)),
            ((20, "k".into(), p.clone()), (1, 30)),
        ]);
        // B's 2, 4 and 9 count although A's rows passed them; A's 3 is late by A's clock.
        assert_eq!(outcomes[0], (expected.clone(), vec![3]));
        assert_eq!(outcomes[1], (expected, vec![3]));

        // What depends on timing behind an exchange is refused: session windows (a late
        // row joins a session or not as it was purged yet) and another time column than the
        // one the clocks are of.
        let session = Window::new(spec(WindowKind::Session { gap: 10 * S }, 0), &exchanged);
        assert!(
            matches!(&session, Err(e) if e.contains("session")),
            "{:?}",
            session.err()
        );
        let other = WindowSpec {
            time_column: "k".into(),
            ..spec(WindowKind::Tumbling { size: 10 * S }, 0)
        };
        let other = Window::new(other, &exchanged);
        assert!(
            matches!(&other, Err(e) if e.contains("time column")),
            "{:?}",
            other.err()
        );
    }

    #[test]
    fn tumbling_windows_fire_update_close_and_send_late_rows_aside() {
        let (images, late, dead) = run(
            WindowKind::Tumbling { size: 10 * S },
            5 * S,
            &workload(),
            100,
        );
        let p = "t/0".to_string();
        assert_eq!(
            images,
            Images::from([
                ((0, "a".into(), p.clone()), (4, 10)),
                ((0, "b".into(), p.clone()), (1, 10)),
                ((10, "a".into(), p.clone()), (1, 20)),
                ((10, "b".into(), p.clone()), (2, 20)),
            ])
        );
        assert_eq!(late, vec![4]);
        assert_eq!(dead, 2, "a null time and a null key are refused");
    }

    #[test]
    fn outputs_do_not_depend_on_batching() {
        for kind in [
            WindowKind::Tumbling { size: 10 * S },
            WindowKind::Sliding {
                size: 10 * S,
                slide: 5 * S,
            },
            WindowKind::Session { gap: 4 * S },
        ] {
            let whole = run(kind.clone(), 5 * S, &workload(), 100);
            for size in [1, 2, 3, 5] {
                assert_eq!(
                    run(kind.clone(), 5 * S, &workload(), size),
                    whole,
                    "{kind:?} in batches of {size}"
                );
            }
        }
    }

    #[test]
    fn sliding_windows_count_a_row_in_each_window_it_falls_in() {
        let rows = [(Some("a"), Some(7)), (Some("a"), Some(30))];
        let (images, _, _) = run(
            WindowKind::Sliding {
                size: 10 * S,
                slide: 5 * S,
            },
            0,
            &rows,
            10,
        );
        let starts: Vec<i64> = images.keys().map(|k| k.0).collect();
        // 7 s is in [0, 10) and [5, 15); 30 s's windows have not fired.
        assert_eq!(starts, vec![0, 5]);
    }

    #[test]
    fn sessions_merge_and_retract_the_sessions_they_absorb() {
        // gap 4 s, lateness 20 s: sessions [1, 5) and [8, 12) fire, then a row at 5 s
        // bridges them: [8, 12) is retracted and [1, 12) replaces [1, 5).
        let rows = [
            (Some("a"), Some(1)),
            (Some("a"), Some(8)),
            (Some("a"), Some(20)), // W = 18: both sessions fire
            (Some("a"), Some(5)),  // joins them
            (Some("a"), Some(40)), // W = 38: everything closes
        ];
        let (images, late, _) = run(WindowKind::Session { gap: 4 * S }, 20 * S, &rows, 10);
        let p = "t/0".to_string();
        assert_eq!(
            images,
            Images::from([
                ((1, "a".into(), p.clone()), (3, 12)),
                ((20, "a".into(), p.clone()), (1, 24)),
            ])
        );
        assert!(late.is_empty());
    }
}
