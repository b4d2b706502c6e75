//! `kind = "tail_sampling"`: each trace kept whole, or not, by [`super::policy`] — decided
//! in event time per partition, from state committed with the data (ADR 0011).
//!
//! **Input.** OTLP spans partitioned by trace id: the source topic when the Collector's
//! Kafka exporter writes with `partition_traces_by_id: true`, or an exchange keyed by
//! `trace_id`. Columns read: `trace_id`, `start_time_unix_nano`, `end_time_unix_nano`,
//! `is_root`, `status_code`, `service_name`, `span_attributes`, `resource_attributes`.
//!
//! **When.** A trace is due when its last span's end plus `decision_wait` has passed — or,
//! once its root span came, `root_grace` after the root ended or arrived (the watermark then),
//! whichever is later, if that is sooner — and it is decided when the partition's watermark
//! passes that time. Rows are taken in order, each
//! against the watermark before it: a span that arrives once its trace is due follows the
//! decision instead of joining it, whatever the batching. The decisions due before a row are
//! taken before it, in (due time, trace id) order, so the rate limits spend their budgets in
//! the same order in every run.
//!
//! **After.** A decision is kept for `decision_ttl` of event time: later spans of the trace
//! follow it (kept with the same policy, or dropped). A span of a trace not seen before that
//! is due already when it arrives — its trace was decided longer ago than the TTL, or it
//! came later than `decision_wait` behind the watermark — goes to the late output, never
//! silently away.
//!
//! **Outputs.** 0: the kept spans, every input column and `sampling_policy` (the deciding
//! policy); 1: late spans with why; 2: one row per decision — `decided_at` (the due time),
//! `trace_id`, `sampled`, `policy`, `span_count`, `duration_ms`, `service_name`,
//! `source_partition`.
//!
//! **State** (per partition): `0x50 trace id` → the open trace (its [`Summary`], due time,
//! the time of its timer, and where its rows wait) or the decision; `0x51 segment` → rows
//! of open traces, one Arrow IPC segment per batch, `0x52 segment` → how many open traces
//! still use it; `0x5E` → the rate limits' budgets; `0x5F` → the partition's clock and next
//! segment number. Decision timers (one per open trace, re-armed lazily when it fires early)
//! and TTL timers (one per decision).

use std::collections::{BTreeMap, HashMap};
use std::io::Cursor;
use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, UInt32Array, new_null_array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::exchange::SOURCE_CLOCK_COLUMN;
use floe_core::{StreamBatch, StreamSpec};

use super::config::Policies;
use super::policy::{Budgets, Condition, Summary, Trace, decide};
use crate::codec::{Reader, Writer, integer_at, ipc_bytes};
use crate::timers::{EVENT_TIME, EXPIRY};
use crate::window::{event_times, iceberg_schema, late_rows, late_stream, timestamp};
use crate::{Context, FastHash, OpError, OpResult, Operator, OperatorStats};

/// A `tail_sampling` operator as configured.
#[derive(Debug, Clone)]
pub struct SamplingSpec {
    /// The operator's id.
    pub id: String,
    /// The input's event-time column (the watermark).
    pub time_column: String,
    /// How far behind the newest event time rows may arrive (µs).
    pub out_of_orderness: i64,
    /// How long a trace stays open after its last span's end (µs of event time).
    pub decision_wait: i64,
    /// How long after its root span's end a trace is decided, if sooner (µs).
    pub root_grace: Option<i64>,
    /// How long a decision is kept for later spans (µs).
    pub decision_ttl: i64,
    /// The policies.
    pub policies: Policies,
    /// The kept spans.
    pub output: String,
    /// One row per decision.
    pub decisions_output: String,
    /// Spans that came too late for any decision.
    pub late_output: String,
}

impl SamplingSpec {
    /// A digest of what the stored state depends on: the span conditions, whose bits open
    /// traces keep. Other settings and policies may change; they apply to later decisions.
    pub fn fingerprint(&self) -> String {
        let conditions: Vec<String> = self
            .policies
            .conditions
            .iter()
            .map(describe_condition)
            .collect();
        format!("tail_sampling:v1:{}", conditions.join(";"))
    }
}

fn describe_condition(c: &Condition) -> String {
    match c {
        Condition::Status(codes) => format!("status{codes:?}"),
        Condition::Text {
            key,
            values,
            patterns,
        } => {
            let patterns: Vec<&str> = patterns.iter().map(|p| p.as_str()).collect();
            format!("text({key}){values:?}{patterns:?}")
        }
        Condition::Number { key, min, max } => format!("number({key})[{min},{max}]"),
        Condition::Flag { key, value } => format!("flag({key})={value}"),
    }
}

/// The columns the operator reads.
const TRACE_ID: &str = "trace_id";
const START: &str = "start_time_unix_nano";
const END: &str = "end_time_unix_nano";
const ROOT: &str = "is_root";
const STATUS: &str = "status_code";
const SERVICE: &str = "service_name";
const SPAN_ATTRIBUTES: &str = "span_attributes";
const RESOURCE_ATTRIBUTES: &str = "resource_attributes";

/// The output column naming the deciding policy.
pub const POLICY_COLUMN: &str = "sampling_policy";

const TRACE: u8 = 0x50;
const SEGMENT: u8 = 0x51;
const SEGMENT_USERS: u8 = 0x52;
const BUDGETS: u8 = 0x5E;
const CLOCK: u8 = 0x5F;

fn trace_key(id: &[u8; 16]) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(TRACE);
    k.extend_from_slice(id);
    k
}

fn segment_key(kind: u8, segment: u64) -> [u8; 9] {
    let mut k = [kind; 9];
    k[1..].copy_from_slice(&segment.to_be_bytes());
    k
}

/// A trace id's 16 bytes from its hex text (`None`: not 32 hex digits, or all zero).
fn parse_id(hex: &str) -> Option<[u8; 16]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    (out != [0; 16]).then_some(out)
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// A trace in state.
#[derive(Debug, Clone, PartialEq)]
enum Entry {
    /// Waiting for its decision.
    Open {
        summary: Summary,
        /// When it is due (µs).
        due: i64,
        /// When its timer fires (µs): at or before `due`.
        timer: i64,
        /// Its rows so far: (segment, row indices in it).
        rows: Vec<(u64, Vec<u32>)>,
        /// With `root_grace`, when its root makes it due (µs).
        root_due: Option<i64>,
    },
    /// Decided: later spans follow until `until`.
    Decided {
        sampled: bool,
        policy: Option<String>,
        until: i64,
    },
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Self::Open {
                summary,
                due,
                timer,
                rows,
                root_due,
            } => {
                w.u8(0);
                summary.encode(&mut w);
                w.zigzag(*due);
                w.zigzag(*timer);
                w.zigzag(root_due.unwrap_or(i64::MIN));
                w.varint(rows.len() as u64);
                for (segment, indices) in rows {
                    w.varint(*segment);
                    w.varint(indices.len() as u64);
                    for i in indices {
                        w.varint(u64::from(*i));
                    }
                }
            }
            Self::Decided {
                sampled,
                policy,
                until,
            } => {
                w.u8(1);
                w.u8(u8::from(*sampled));
                w.short_bytes(policy.as_deref().unwrap_or("").as_bytes());
                w.zigzag(*until);
            }
        }
        w.0
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        Ok(match r.u8()? {
            0 => {
                let summary = Summary::decode(&mut r)?;
                let due = r.zigzag()?;
                let timer = r.zigzag()?;
                let root_due = Some(r.zigzag()?).filter(|d| *d != i64::MIN);
                let rows = (0..r.varint()?)
                    .map(|_| {
                        let segment = r.varint()?;
                        let indices = (0..r.varint()?)
                            .map(|_| r.varint().map(|i| i as u32))
                            .collect::<Result<Vec<_>, _>>()?;
                        Ok((segment, indices))
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Self::Open {
                    summary,
                    due,
                    timer,
                    rows,
                    root_due,
                }
            }
            1 => {
                let sampled = r.u8()? == 1;
                let policy = String::from_utf8_lossy(r.short_bytes()?).into_owned();
                Self::Decided {
                    sampled,
                    policy: (!policy.is_empty()).then_some(policy),
                    until: r.zigzag()?,
                }
            }
            other => return Err(format!("a trace entry of kind {other}")),
        })
    }
}

/// What the operator keeps in memory per partition (rebuilt from state on restore).
#[derive(Debug, Default)]
struct Part {
    /// The largest event time seen (µs).
    max_time: Option<i64>,
    /// An exchanged input's clock (µs, before out-of-orderness).
    clock: Option<i64>,
    /// The number of the next segment.
    next_segment: u64,
    /// No decision timer is earlier than this.
    timer_floor: i64,
    /// No TTL timer is earlier than this.
    expiry_floor: i64,
    /// The budgets, once read.
    budgets: Option<Budgets>,
}

/// A trace the batch touched.
struct Touched {
    id: [u8; 16],
    /// Its entry before the batch, or `None` when new (or past its TTL).
    entry: Option<Entry>,
    /// Rows that joined it in this batch.
    joined: Vec<usize>,
    /// Rows that came once it was due (they follow its decision).
    followers: Vec<usize>,
    /// It became due in this batch: its later rows follow the decision.
    closed: bool,
}

/// A decision to take: (position in the batch — rows.len() for after its last row —, due,
/// trace id, index into the touched traces or the loaded untouched ones).
type Candidate = (usize, i64, [u8; 16], Source);

#[derive(Debug, Clone, Copy)]
enum Source {
    Touched(usize),
    Loaded(usize),
}

/// The `tail_sampling` operator.
pub struct TailSampling {
    spec: SamplingSpec,
    outputs: Vec<StreamSpec>,
    /// The input's own columns (an exchange adds the source clock after them).
    input: SchemaRef,
    /// The kept spans' columns: the input's and the policy.
    kept: SchemaRef,
    decisions: SchemaRef,
    /// Conditions by attribute key: (condition index).
    by_key: HashMap<String, Vec<usize>>,
    exchanged: bool,
    parts: HashMap<u32, Part>,
    /// Open traces → the partition that holds them (this process, since its start): a trace
    /// seen on two partitions is split.
    homes: HashMap<[u8; 16], u32, FastHash>,
    split_traces: u64,
    late_rows: u64,
    open_traces: i64,
}

impl std::fmt::Debug for TailSampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailSampling")
            .field("id", &self.spec.id)
            .finish_non_exhaustive()
    }
}

impl TailSampling {
    /// The operator over `input`; `Err` says why it cannot read it.
    pub fn new(spec: SamplingSpec, input: &StreamSpec) -> Result<Self, String> {
        if input.changelog {
            return Err(format!(
                "stream {} is a changelog; tail sampling reads spans",
                input.name
            ));
        }
        let exchanged = floe_core::exchange::is_exchanged(input);
        if let Some(key) = floe_core::exchange::exchange_key(input)
            && key != [TRACE_ID]
        {
            return Err(format!(
                "stream {} is exchanged by {}: tail sampling needs every span of a trace in one \
                 partition, so exchange by trace_id (or read the source topic the Collector \
                 writes with partition_traces_by_id: true)",
                input.name,
                key.join(", ")
            ));
        }
        let iceberg = input
            .schema
            .as_ref()
            .ok_or_else(|| format!("the columns of stream {} are not known yet", input.name))?;
        let arrow: Schema =
            iceberg::arrow::schema_to_arrow_schema(iceberg).map_err(|e| e.to_string())?;
        for (column, ok) in [
            (TRACE_ID, is_string as fn(&DataType) -> bool),
            (START, DataType::is_integer),
            (END, DataType::is_integer),
            (ROOT, |t| *t == DataType::Boolean),
            (STATUS, is_string),
            (SERVICE, is_string),
            (SPAN_ATTRIBUTES, is_map),
            (RESOURCE_ATTRIBUTES, is_map),
        ] {
            let field = arrow.field_with_name(column).map_err(|_| {
                format!(
                    "stream {} has no column {column}: tail sampling reads OTLP spans",
                    input.name
                )
            })?;
            if !ok(field.data_type()) {
                return Err(format!(
                    "column {column} of stream {} is {}",
                    input.name,
                    field.data_type()
                ));
            }
        }
        if arrow.field_with_name(&spec.time_column).is_err() {
            return Err(format!(
                "stream {} has no time column {}",
                input.name, spec.time_column
            ));
        }
        let input_schema = Arc::new(arrow.clone());
        let mut kept: Vec<Field> = arrow.fields().iter().map(|f| (**f).clone()).collect();
        kept.push(Field::new(POLICY_COLUMN, DataType::Utf8, true));
        let kept = Arc::new(Schema::new(kept));
        let decisions = Arc::new(Schema::new(vec![
            Field::new("decided_at", timestamp(), false),
            Field::new("trace_id", DataType::Utf8, false),
            Field::new("sampled", DataType::Boolean, false),
            Field::new("policy", DataType::Utf8, true),
            Field::new("span_count", DataType::Int64, false),
            Field::new("duration_ms", DataType::Int64, false),
            Field::new("service_name", DataType::Utf8, false),
            Field::new("source_partition", DataType::Utf8, false),
        ]));
        let kept_stream = StreamSpec {
            name: spec.output.clone(),
            table: spec.output.clone(),
            schema: Some(iceberg_schema(&kept, &[])?),
            changelog: false,
            key: Vec::new(),
            time_column: Some(spec.time_column.clone()),
            partition: input.partition.clone(),
            bloom_filter_columns: vec![TRACE_ID.to_string()],
            plain_columns: Vec::new(),
            properties: Vec::new(),
        };
        let decisions_stream = StreamSpec {
            name: spec.decisions_output.clone(),
            table: spec.decisions_output.clone(),
            schema: Some(iceberg_schema(&decisions, &[])?),
            changelog: false,
            key: Vec::new(),
            time_column: Some("decided_at".into()),
            partition: vec![("decided_at".into(), iceberg::spec::Transform::Day)],
            bloom_filter_columns: vec![TRACE_ID.to_string()],
            plain_columns: Vec::new(),
            properties: Vec::new(),
        };
        let outputs = vec![
            kept_stream,
            late_stream(input, &arrow, &spec.late_output)?,
            decisions_stream,
        ];
        let mut by_key: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, c) in spec.policies.conditions.iter().enumerate() {
            if let Some(key) = c.key() {
                by_key.entry(key.to_string()).or_default().push(i);
            }
        }
        Ok(Self {
            spec,
            outputs,
            input: input_schema,
            kept,
            decisions,
            by_key,
            exchanged,
            parts: HashMap::new(),
            homes: HashMap::default(),
            split_traces: 0,
            late_rows: 0,
            open_traces: 0,
        })
    }

    /// The spec.
    pub fn spec(&self) -> &SamplingSpec {
        &self.spec
    }

    /// Traces seen on a second partition of this process since its start.
    pub fn split_traces(&self) -> u64 {
        self.split_traces
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    /// When a trace of `summary` is quiet: its last span's end plus `decision_wait` (µs).
    fn quiet(&self, summary: &Summary) -> i64 {
        if summary.end == i64::MIN {
            i64::MIN
        } else {
            (summary.end / 1000).saturating_add(self.spec.decision_wait)
        }
    }

    /// With `root_grace`, when row `r` (arriving at watermark `wm`) as a root makes its trace
    /// due: `root_grace` after the root ended or arrived, whichever is later — a root that
    /// arrives behind the watermark still gives the spans that come with it their grace.
    fn root_due(
        &self,
        roots: &Option<arrow_array::BooleanArray>,
        end_ns: Option<i64>,
        (r, wm): (usize, i64),
    ) -> Option<i64> {
        let grace = self.spec.root_grace?;
        root(roots, r).then(|| {
            end_ns
                .map_or(wm, |e| (e / 1000).max(wm))
                .saturating_add(grace)
        })
    }

    /// Per row: the bits of the conditions it meets.
    fn conditions(&self, rows: &RecordBatch) -> Vec<u64> {
        let n = rows.num_rows();
        let mut met = vec![0u64; n];
        let conditions = &self.spec.policies.conditions;
        if conditions.is_empty() {
            return met;
        }
        if let Some(status) = rows
            .column_by_name(STATUS)
            .and_then(|c| c.as_string_opt::<i32>())
        {
            for (i, c) in conditions.iter().enumerate() {
                if !matches!(c, Condition::Status(_)) {
                    continue;
                }
                for (r, bits) in met.iter_mut().enumerate() {
                    if status.is_valid(r) && c.status_meets(status.value(r)) {
                        *bits |= 1 << i;
                    }
                }
            }
        }
        if self.by_key.is_empty() {
            return met;
        }
        for column in [RESOURCE_ATTRIBUTES, SPAN_ATTRIBUTES] {
            let Some(maps) = rows.column_by_name(column).and_then(|c| c.as_map_opt()) else {
                continue;
            };
            let (Some(keys), Some(values)) = (
                maps.keys().as_string_opt::<i32>(),
                maps.values().as_string_opt::<i32>(),
            ) else {
                continue;
            };
            let offsets = maps.value_offsets();
            for (r, bits) in met.iter_mut().enumerate() {
                if maps.is_null(r) {
                    continue;
                }
                for e in offsets[r] as usize..offsets[r + 1] as usize {
                    let Some(found) = self.by_key.get(keys.value(e)) else {
                        continue;
                    };
                    if values.is_null(e) {
                        continue;
                    }
                    let value = values.value(e);
                    for &i in found {
                        if conditions[i].value_meets(value) {
                            *bits |= 1 << i;
                        }
                    }
                }
            }
        }
        met
    }

    fn part(&mut self, p: u32) -> &mut Part {
        self.parts.entry(p).or_insert_with(|| Part {
            timer_floor: i64::MIN,
            expiry_floor: i64::MIN,
            ..Part::default()
        })
    }

    fn budgets(&mut self, ctx: &Context<'_>, p: u32) -> OpResult<Budgets> {
        if let Some(b) = self.part(p).budgets.take() {
            return Ok(b);
        }
        Ok(match ctx.get(p, &[BUDGETS])? {
            Some(bytes) => Budgets::decode(&mut Reader(&bytes)).map_err(|e| self.invalid(e))?,
            None => Budgets::default(),
        })
    }

    /// The partition's watermark after what it has seen.
    fn watermark(&self, p: u32) -> i64 {
        let Some(part) = self.parts.get(&p) else {
            return i64::MIN;
        };
        let t = if self.exchanged {
            part.clock
        } else {
            part.max_time
        };
        t.map_or(i64::MIN, |t| t.saturating_sub(self.spec.out_of_orderness))
    }

    fn on_rows(&mut self, ctx: &mut Context<'_>, p: u32, rows: &RecordBatch) -> OpResult<()> {
        let n = rows.num_rows();
        let times = event_times(rows, &self.spec.time_column).map_err(|e| self.invalid(e))?;
        let ooo = self.spec.out_of_orderness;
        // The watermark before each row.
        let mut marks = Vec::with_capacity(n);
        let clocks = if self.exchanged {
            rows.column_by_name(SOURCE_CLOCK_COLUMN)
                .and_then(|c| c.as_primitive_opt::<arrow_array::types::Int64Type>())
                .cloned()
        } else {
            None
        };
        let mut max_time = self.part(p).max_time;
        for (r, t) in times.iter().enumerate() {
            let before = match &clocks {
                Some(c) if c.is_valid(r) => Some(c.value(r)),
                Some(_) => None,
                None => max_time,
            };
            marks.push(before.map_or(i64::MIN, |m| m.saturating_sub(ooo)));
            if let Some(t) = t {
                max_time = Some(max_time.map_or(*t, |m| m.max(*t)));
            }
        }
        self.part(p).max_time = max_time;
        let after = if self.exchanged {
            // Rows carry their sources' clocks; the partition's comes as event clocks.
            self.watermark(p)
        } else {
            max_time.map_or(i64::MIN, |m| m.saturating_sub(ooo))
        };

        let ids = rows
            .column_by_name(TRACE_ID)
            .and_then(|c| c.as_string_opt::<i32>())
            .cloned()
            .ok_or_else(|| self.invalid("no trace_id column of strings"))?;
        let mut order: Vec<[u8; 16]> = Vec::new();
        let mut by_trace: HashMap<[u8; 16], Vec<usize>, FastHash> = HashMap::default();
        for (r, time) in times.iter().enumerate() {
            let id = ids.is_valid(r).then(|| parse_id(ids.value(r))).flatten();
            match (id, time) {
                (Some(id), Some(_)) => by_trace
                    .entry(id)
                    .or_insert_with(|| {
                        order.push(id);
                        Vec::new()
                    })
                    .push(r),
                (None, _) => ctx.dead_letter(
                    p,
                    format!(
                        "operator {}: trace_id is not 32 hex digits of a valid trace id",
                        self.spec.id
                    ),
                    rows,
                    r,
                ),
                (_, None) => ctx.dead_letter(
                    p,
                    format!(
                        "operator {}: no {} value",
                        self.spec.id, self.spec.time_column
                    ),
                    rows,
                    r,
                ),
            }
        }
        let met = self.conditions(rows);
        let starts = integers(rows, START);
        let ends = integers(rows, END);
        let roots = rows
            .column_by_name(ROOT)
            .and_then(|c| c.as_boolean_opt())
            .cloned();
        let services = rows
            .column_by_name(SERVICE)
            .and_then(|c| c.as_string_opt::<i32>())
            .cloned();
        let service = |r: usize| {
            services
                .as_ref()
                .filter(|s| s.is_valid(r))
                .map_or("", |s| s.value(r))
        };

        let keys: Vec<Vec<u8>> = order.iter().map(trace_key).collect();
        let stored = {
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            ctx.get_many(p, &refs)?
        };
        let mut touched: Vec<Touched> = Vec::with_capacity(order.len());
        let mut late: Vec<(usize, i64)> = Vec::new();
        for (id, bytes) in order.iter().zip(stored) {
            let mut entry = match bytes {
                Some(b) => Some(Entry::decode(&b).map_err(|e| self.invalid(e))?),
                None => None,
            };
            let fresh = || Touched {
                id: *id,
                entry: None,
                joined: Vec::new(),
                followers: Vec::new(),
                closed: false,
            };
            let mut t = fresh();
            let ttl = self.spec.decision_ttl;
            for &r in &by_trace[id] {
                let wm = marks[r];
                // A decision past its TTL is gone — also one this batch takes before the row:
                // the span starts the trace over.
                let expired = match &entry {
                    Some(Entry::Decided { until, .. }) => *until <= wm,
                    Some(Entry::Open { due, .. }) => *due <= wm && due.saturating_add(ttl) <= wm,
                    None => false,
                };
                if expired {
                    if matches!(entry, Some(Entry::Open { .. })) {
                        t.closed = true;
                        t.entry = entry.take();
                        touched.push(std::mem::replace(&mut t, fresh()));
                    }
                    entry = None;
                }
                match &mut entry {
                    Some(Entry::Decided { .. }) => t.followers.push(r),
                    Some(Entry::Open { .. }) if t.closed => t.followers.push(r),
                    Some(Entry::Open { due, .. }) if *due <= wm => {
                        t.closed = true;
                        t.followers.push(r);
                    }
                    Some(Entry::Open {
                        summary,
                        due,
                        root_due,
                        ..
                    }) => {
                        summary.add((starts(r), ends(r)), met[r], service(r), root(&roots, r));
                        if let Some(at) = self.root_due(&roots, ends(r), (r, wm)) {
                            *root_due = Some(root_due.map_or(at, |d| d.min(at)));
                        }
                        *due = self.quiet(summary).min(root_due.unwrap_or(i64::MAX));
                        t.joined.push(r);
                        if *due <= wm {
                            // The root came and its grace has passed: due before the next row.
                            t.closed = true;
                        }
                    }
                    None => {
                        let mut summary = Summary::default();
                        summary.add((starts(r), ends(r)), met[r], service(r), root(&roots, r));
                        let quiet = self.quiet(&summary);
                        if quiet <= wm {
                            late.push((r, wm));
                            continue;
                        }
                        let root_due = self.root_due(&roots, ends(r), (r, wm));
                        entry = Some(Entry::Open {
                            summary,
                            due: quiet.min(root_due.unwrap_or(i64::MAX)),
                            timer: i64::MAX,
                            rows: Vec::new(),
                            root_due,
                        });
                        t.joined.push(r);
                        self.open_traces += 1;
                        if let Some(home) = self.homes.insert(*id, p)
                            && home != p
                        {
                            self.split_traces += 1;
                            tracing::warn!(
                                operator = %self.spec.id,
                                trace_id = %hex(id),
                                "spans of one trace on partitions {home} and {p}: each decides \
                                 its part alone; partition the spans by trace id"
                            );
                        }
                    }
                }
            }
            t.entry = entry;
            touched.push(t);
        }

        // The decisions due in this batch, each at the row it is due before: the first row,
        // after the trace's last joined one, whose watermark passed its due time (the source's
        // watermark only grows). Behind an exchange rows carry their sources' clocks, and the
        // decisions come with the partition's clock, in (due, trace) order.
        let exchanged = self.exchanged;
        let position = |due: i64, from: usize| {
            if exchanged {
                0
            } else {
                from + marks[from..].partition_point(|m| *m < due)
            }
        };
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut touched_at: HashMap<[u8; 16], usize, FastHash> = HashMap::default();
        for (i, t) in touched.iter().enumerate() {
            touched_at.insert(t.id, i);
            let Some(Entry::Open { due, .. }) = &t.entry else {
                continue;
            };
            if t.closed || *due <= after {
                let from = t.joined.last().map_or(0, |last| last + 1);
                candidates.push((position(*due, from), *due, t.id, Source::Touched(i)));
            }
        }
        let mut loaded: Vec<([u8; 16], Entry)> = Vec::new();
        let floor = self.part(p).timer_floor;
        let due_timers = EVENT_TIME.take_due(ctx, p, floor, after)?;
        self.part(p).timer_floor = after.saturating_add(1).max(floor);
        // A trace may have two timers due (one from before its root came): once each.
        let untouched: std::collections::BTreeSet<[u8; 16]> = due_timers
            .iter()
            .filter_map(|(_, tag)| <[u8; 16]>::try_from(tag.as_slice()).ok())
            .filter(|id| !touched_at.contains_key(id))
            .collect();
        let mut rearm: Vec<([u8; 16], Entry)> = Vec::new();
        if !untouched.is_empty() {
            let keys: Vec<Vec<u8>> = untouched.iter().map(trace_key).collect();
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            for (id, bytes) in untouched.iter().zip(ctx.get_many(p, &refs)?) {
                let Some(bytes) = bytes else { continue };
                let entry = Entry::decode(&bytes).map_err(|e| self.invalid(e))?;
                match &entry {
                    Entry::Open { due, .. } if *due <= after => {
                        candidates.push((
                            position(*due, 0),
                            *due,
                            *id,
                            Source::Loaded(loaded.len()),
                        ));
                        loaded.push((*id, entry));
                    }
                    // Its timer fired early: the trace got later spans since.
                    Entry::Open { .. } => rearm.push((*id, entry)),
                    Entry::Decided { .. } => {}
                }
            }
        }
        // A touched trace whose timer was taken and that stays open needs another.
        let taken: std::collections::HashSet<[u8; 16]> = due_timers
            .iter()
            .filter_map(|(_, tag)| <[u8; 16]>::try_from(tag.as_slice()).ok())
            .collect();
        candidates.sort_by_key(|c| (c.0, c.1, c.2));

        let mut budgets = if candidates.is_empty() {
            None
        } else {
            Some(self.budgets(ctx, p)?)
        };
        let mut decided = Decided::new(self);
        let partition = ctx.partition_name(p);
        for &(_, due, id, source) in &candidates {
            let (summary, stored_rows, batch_rows, followers) = match source {
                Source::Touched(i) => {
                    let t = &touched[i];
                    let Some(Entry::Open { summary, rows, .. }) = &t.entry else {
                        unreachable!("candidates are open")
                    };
                    (
                        summary.clone(),
                        rows.clone(),
                        t.joined.clone(),
                        t.followers.clone(),
                    )
                }
                Source::Loaded(i) => {
                    let Entry::Open { summary, rows, .. } = &loaded[i].1 else {
                        unreachable!("candidates are open")
                    };
                    (summary.clone(), rows.clone(), Vec::new(), Vec::new())
                }
            };
            let budgets = budgets.as_mut().expect("read for candidates");
            let decision = decide(
                &self.spec.policies.list,
                &Trace {
                    id: &id,
                    summary: &summary,
                    at: due,
                },
                budgets,
            );
            decided.decision(&id, &summary, due, &decision, &partition);
            if decision.sampled {
                decided.keep(stored_rows.clone(), &decision.policy);
                decided.keep_batch(
                    batch_rows.iter().chain(&followers).copied(),
                    &decision.policy,
                );
            }
            decided.release(&stored_rows);
            let until = due.saturating_add(self.spec.decision_ttl);
            let entry = Entry::Decided {
                sampled: decision.sampled,
                policy: decision.policy.clone(),
                until,
            };
            ctx.put(p, &trace_key(&id), &entry.encode())?;
            EXPIRY.register(ctx, p, until, &id)?;
            self.open_traces -= 1;
            self.homes.remove(&id);
            match source {
                Source::Touched(i) => {
                    touched[i].entry = Some(entry);
                    touched[i].joined.clear();
                    touched[i].followers.clear();
                }
                Source::Loaded(_) => {}
            }
        }
        if let Some(b) = budgets {
            let mut w = Writer::default();
            b.encode(&mut w);
            ctx.put(p, &[BUDGETS], &w.0)?;
            self.part(p).budgets = Some(b);
        }

        // Followers of decisions taken before this batch.
        for t in &touched {
            if let Some(Entry::Decided {
                sampled: true,
                policy,
                ..
            }) = &t.entry
                && !t.followers.is_empty()
            {
                decided.keep_batch(t.followers.iter().copied(), policy);
            }
        }

        // Open traces: their new rows in this batch's segment, their timers, their entries.
        let mut waiting: Vec<u32> = Vec::new();
        let segment = self.part(p).next_segment;
        let mut users = 0u64;
        for t in &mut touched {
            let Some(Entry::Open {
                due, timer, rows, ..
            }) = &mut t.entry
            else {
                continue;
            };
            if !t.joined.is_empty() {
                let first = waiting.len() as u32;
                waiting.extend(t.joined.iter().map(|r| *r as u32));
                rows.push((segment, (first..waiting.len() as u32).collect()));
                users += 1;
            }
            if *timer > *due || taken.contains(&t.id) {
                EVENT_TIME.register(ctx, p, *due, &t.id)?;
                *timer = *due;
            }
            let entry = t.entry.as_ref().expect("open");
            ctx.put(p, &trace_key(&t.id), &entry.encode())?;
        }
        for (id, mut entry) in rearm {
            if let Entry::Open { due, timer, .. } = &mut entry {
                EVENT_TIME.register(ctx, p, *due, &id)?;
                *timer = *due;
            }
            ctx.put(p, &trace_key(&id), &entry.encode())?;
        }
        if !waiting.is_empty() {
            let picked = arrow_select::take::take_record_batch(
                &own_columns(rows, self.input.fields().len()),
                &UInt32Array::from(waiting),
            )
            .map_err(|e| self.invalid(e.to_string()))?;
            ctx.put(
                p,
                &segment_key(SEGMENT, segment),
                &ipc_bytes(&picked).map_err(|e| self.invalid(e))?,
            )?;
            ctx.put(
                p,
                &segment_key(SEGMENT_USERS, segment),
                &users.to_le_bytes(),
            )?;
            self.part(p).next_segment = segment + 1;
        }
        decided.finish(ctx, p, rows)?;
        self.expire(ctx, p, after)?;
        if !late.is_empty() {
            self.late_rows += late.len() as u64;
            let id = self.spec.id.clone();
            let batch = late_rows(rows, self.input.fields().len(), &late, |w| {
                format!(
                    "operator {id}: its trace was due at watermark {w} µs already: decided more \
                     than decision_ttl ago, or the span came later than decision_wait behind \
                     the watermark"
                )
            })
            .map_err(|e| self.invalid(format!("late rows: {e}")))?;
            ctx.emit(1, StreamBatch::single(1, batch, p));
        }
        self.save_clock(ctx, p)
    }

    /// Forgets decisions past their TTL.
    fn expire(&mut self, ctx: &mut Context<'_>, p: u32, upto: i64) -> OpResult<()> {
        let floor = self.part(p).expiry_floor;
        let due = EXPIRY.take_due(ctx, p, floor, upto)?;
        self.part(p).expiry_floor = upto.saturating_add(1).max(floor);
        if due.is_empty() {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = due
            .iter()
            .map(|(_, tag)| {
                let mut k = vec![TRACE];
                k.extend_from_slice(tag);
                k
            })
            .collect();
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        for (key, bytes) in keys.iter().zip(ctx.get_many(p, &refs)?) {
            if let Some(bytes) = bytes
                && let Entry::Decided { until, .. } =
                    Entry::decode(&bytes).map_err(|e| self.invalid(e))?
                && until <= upto
            {
                ctx.delete(p, key)?;
            }
        }
        Ok(())
    }

    fn save_clock(&mut self, ctx: &mut Context<'_>, p: u32) -> OpResult<()> {
        let part = self.part(p);
        let mut w = Writer::default();
        w.zigzag(part.max_time.unwrap_or(i64::MIN));
        w.zigzag(part.clock.unwrap_or(i64::MIN));
        w.varint(part.next_segment);
        let bytes = w.0;
        ctx.put(p, &[CLOCK], &bytes)
    }

    /// The clock moved without rows (an exchange's clock record, an idle partition): the
    /// decisions due by it are taken.
    fn advance(&mut self, ctx: &mut Context<'_>, p: u32) -> OpResult<()> {
        let empty = RecordBatch::new_empty(self.input.clone());
        self.on_rows(ctx, p, &empty)
    }
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8)
}

fn is_map(t: &DataType) -> bool {
    matches!(t, DataType::Map(..))
}

fn root(roots: &Option<arrow_array::BooleanArray>, r: usize) -> bool {
    roots.as_ref().is_some_and(|a| a.is_valid(r) && a.value(r))
}

/// Column `name` of `rows` read row by row as integers.
fn integers(rows: &RecordBatch, name: &str) -> impl Fn(usize) -> Option<i64> + use<> {
    let column = rows.column_by_name(name).cloned();
    move |r| column.as_ref().and_then(|c| integer_at(c.as_ref(), r))
}

/// The first `width` columns of `rows`: the input's own, not what an exchange adds.
fn own_columns(rows: &RecordBatch, width: usize) -> RecordBatch {
    let keep: Vec<usize> = (0..width.min(rows.num_columns())).collect();
    rows.project(&keep).expect("columns in range")
}

fn from_ipc(bytes: &[u8]) -> Result<RecordBatch, String> {
    let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| e.to_string())?;
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| e.to_string())
}

/// `batch` with exactly the columns of `schema`, by name (a column it lacks is null): rows
/// stored before the input gained a column.
fn aligned(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
            Some(c) => arrow_cast::cast(c, f.data_type()).map_err(|e| e.to_string()),
            None => Ok(new_null_array(f.data_type(), batch.num_rows())),
        })
        .collect::<Result<_, _>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// What one batch's decisions emit and release.
struct Decided {
    /// Stored rows kept: (segment, row in it, policy), in decision order.
    stored: Vec<(u64, u32, Option<String>)>,
    /// Rows of the batch kept, with their policy.
    batch: Vec<(usize, Option<String>)>,
    /// Segments whose users decrease, by how many.
    released: BTreeMap<u64, u64>,
    decided_at: TimestampMicrosecondBuilder,
    trace_ids: StringBuilder,
    sampled: BooleanBuilder,
    policies: StringBuilder,
    span_counts: Int64Builder,
    durations: Int64Builder,
    services: StringBuilder,
    partitions: StringBuilder,
    input: SchemaRef,
    kept: SchemaRef,
    decisions: SchemaRef,
}

impl Decided {
    fn new(op: &TailSampling) -> Self {
        Self {
            stored: Vec::new(),
            batch: Vec::new(),
            released: BTreeMap::new(),
            decided_at: TimestampMicrosecondBuilder::new(),
            trace_ids: StringBuilder::new(),
            sampled: BooleanBuilder::new(),
            policies: StringBuilder::new(),
            span_counts: Int64Builder::new(),
            durations: Int64Builder::new(),
            services: StringBuilder::new(),
            partitions: StringBuilder::new(),
            input: op.input.clone(),
            kept: op.kept.clone(),
            decisions: op.decisions.clone(),
        }
    }

    fn decision(
        &mut self,
        id: &[u8; 16],
        summary: &Summary,
        due: i64,
        decision: &super::policy::Decision,
        partition: &str,
    ) {
        self.decided_at.append_value(due);
        self.trace_ids.append_value(hex(id));
        self.sampled.append_value(decision.sampled);
        self.policies.append_option(decision.policy.as_deref());
        self.span_counts.append_value(summary.spans as i64);
        self.durations.append_value(summary.duration_ms());
        self.services.append_value(summary.service());
        self.partitions.append_value(partition);
    }

    fn keep(&mut self, rows: Vec<(u64, Vec<u32>)>, policy: &Option<String>) {
        for (segment, indices) in rows {
            for i in indices {
                self.stored.push((segment, i, policy.clone()));
            }
        }
    }

    fn keep_batch(&mut self, rows: impl Iterator<Item = usize>, policy: &Option<String>) {
        self.batch.extend(rows.map(|r| (r, policy.clone())));
    }

    fn release(&mut self, rows: &[(u64, Vec<u32>)]) {
        for (segment, _) in rows {
            *self.released.entry(*segment).or_default() += 1;
        }
    }

    fn finish(mut self, ctx: &mut Context<'_>, p: u32, rows: &RecordBatch) -> OpResult<()> {
        let invalid = |m: String| OpError::Invalid {
            operator: "tail_sampling".into(),
            message: m,
        };
        // Kept rows: stored ones first (segment order), then the batch's.
        let mut parts: Vec<RecordBatch> = Vec::new();
        let mut policy_values: Vec<Option<String>> = Vec::new();
        if !self.stored.is_empty() {
            let mut by_segment: BTreeMap<u64, Vec<(u32, Option<String>)>> = BTreeMap::new();
            for (segment, row, policy) in std::mem::take(&mut self.stored) {
                by_segment.entry(segment).or_default().push((row, policy));
            }
            let keys: Vec<[u8; 9]> = by_segment
                .keys()
                .map(|s| segment_key(SEGMENT, *s))
                .collect();
            let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
            let stored = ctx.get_many(p, &refs)?;
            for ((segment, picks), bytes) in by_segment.into_iter().zip(stored) {
                let bytes =
                    bytes.ok_or_else(|| invalid(format!("segment {segment} is missing")))?;
                let batch =
                    aligned(&from_ipc(&bytes).map_err(invalid)?, &self.input).map_err(invalid)?;
                let indices = UInt32Array::from(picks.iter().map(|(r, _)| *r).collect::<Vec<_>>());
                parts.push(
                    arrow_select::take::take_record_batch(&batch, &indices)
                        .map_err(|e| invalid(e.to_string()))?,
                );
                policy_values.extend(picks.into_iter().map(|(_, p)| p));
            }
        }
        if !self.batch.is_empty() {
            let own = own_columns(rows, self.input.fields().len());
            let own = aligned(&own, &self.input).map_err(invalid)?;
            let indices = UInt32Array::from(
                self.batch
                    .iter()
                    .map(|(r, _)| *r as u32)
                    .collect::<Vec<_>>(),
            );
            parts.push(
                arrow_select::take::take_record_batch(&own, &indices)
                    .map_err(|e| invalid(e.to_string()))?,
            );
            policy_values.extend(std::mem::take(&mut self.batch).into_iter().map(|(_, p)| p));
        }
        if !parts.is_empty() {
            let all = arrow_select::concat::concat_batches(&self.input, &parts)
                .map_err(|e| invalid(e.to_string()))?;
            let mut columns = all.columns().to_vec();
            columns.push(Arc::new(StringArray::from(policy_values)));
            let kept = RecordBatch::try_new(self.kept.clone(), columns)
                .map_err(|e| invalid(e.to_string()))?;
            ctx.emit(0, StreamBatch::single(0, kept, p));
        }
        // Segments no open trace needs any more.
        for (segment, released) in std::mem::take(&mut self.released) {
            let key = segment_key(SEGMENT_USERS, segment);
            let users = ctx
                .get(p, &key)?
                .and_then(|b| b.get(..8).and_then(|b| b.try_into().ok()))
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            if users <= released {
                ctx.delete(p, &key)?;
                ctx.delete(p, &segment_key(SEGMENT, segment))?;
            } else {
                ctx.put(p, &key, &(users - released).to_le_bytes())?;
            }
        }
        if !self.sampled.is_empty() {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(self.decided_at.finish().with_timezone("+00:00")),
                Arc::new(self.trace_ids.finish()),
                Arc::new(self.sampled.finish()),
                Arc::new(self.policies.finish()),
                Arc::new(self.span_counts.finish()),
                Arc::new(self.durations.finish()),
                Arc::new(self.services.finish()),
                Arc::new(self.partitions.finish()),
            ];
            let batch = RecordBatch::try_new(self.decisions.clone(), columns)
                .map_err(|e| invalid(e.to_string()))?;
            ctx.emit(2, StreamBatch::single(2, batch, p));
        }
        Ok(())
    }
}

impl Operator for TailSampling {
    fn id(&self) -> &str {
        &self.spec.id
    }

    fn outputs(&self) -> &[StreamSpec] {
        &self.outputs
    }

    fn on_batch(&mut self, input: &StreamBatch, ctx: &mut Context<'_>) -> OpResult<()> {
        let mut offset = 0;
        for run in &input.runs {
            let rows = input.batch.slice(offset, run.rows);
            offset += run.rows;
            self.on_rows(ctx, run.partition, &rows)?;
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        partition: u32,
        watermark: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        let t = watermark.saturating_add(self.spec.out_of_orderness);
        let exchanged = self.exchanged;
        let part = self.part(partition);
        if exchanged {
            part.clock = Some(part.clock.map_or(t, |c| c.max(t)));
        } else {
            part.max_time = Some(part.max_time.map_or(t, |m| m.max(t)));
        }
        self.advance(ctx, partition)
    }

    fn on_event_clock(
        &mut self,
        partition: u32,
        max_time: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        if !self.exchanged {
            return Ok(());
        }
        let part = self.part(partition);
        part.clock = Some(part.clock.map_or(max_time, |c| c.max(max_time)));
        self.advance(ctx, partition)
    }

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        let mut part = Part {
            timer_floor: i64::MIN,
            expiry_floor: i64::MIN,
            ..Part::default()
        };
        if let Some(bytes) = ctx.get(partition, &[CLOCK])? {
            let mut r = Reader(&bytes);
            let read = |r: &mut Reader<'_>| r.zigzag().map(|t| (t != i64::MIN).then_some(t));
            part.max_time = read(&mut r).map_err(|e| self.invalid(e))?;
            part.clock = read(&mut r).map_err(|e| self.invalid(e))?;
            part.next_segment = r.varint().map_err(|e| self.invalid(e))?;
        }
        let mut open = 0;
        ctx.scan(partition, &[TRACE], Some(&[TRACE + 1]), |_, v| {
            if v.first() == Some(&0) {
                open += 1;
            }
            std::ops::ControlFlow::Continue(())
        })?;
        self.open_traces += open;
        self.parts.insert(partition, part);
        Ok(())
    }

    fn forget(&mut self) {
        self.parts.clear();
        self.homes.clear();
        self.open_traces = 0;
    }

    fn watermarks(&self) -> Vec<(u32, i64)> {
        let mut out: Vec<(u32, i64)> = self
            .parts
            .keys()
            .map(|p| (*p, self.watermark(*p)))
            .filter(|(_, w)| *w != i64::MIN)
            .collect();
        out.sort();
        out
    }

    fn fingerprint(&self) -> Option<String> {
        Some(self.spec.fingerprint())
    }

    fn stats(&self) -> OperatorStats {
        OperatorStats {
            open_windows: self.open_traces.max(0) as u64,
            late_rows: self.late_rows,
            timers: 0,
            split_traces: Some(self.split_traces),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use arrow_array::builder::{MapBuilder, MapFieldNames};
    use floe_state::StateStore;

    use super::super::policy::{Named, Policy};
    use super::super::probabilistic;
    use super::*;

    const MS: i64 = 1_000;
    /// 2025-10-09T08:53:20Z, µs.
    const T0: i64 = 1_760_000_000_000_000;

    /// A span: trace number, start and end µs, root, status, service, `tier` attribute.
    #[derive(Debug, Clone)]
    struct Span {
        trace: u64,
        start: i64,
        end: i64,
        root: bool,
        status: &'static str,
        service: String,
        tier: Option<&'static str>,
    }

    fn trace_id(n: u64) -> [u8; 16] {
        // Random-looking ids (FNV-1a mixes a counter's low bytes little).
        let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        let mut id = [0u8; 16];
        for chunk in id.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        id
    }

    fn arrow_schema() -> Schema {
        let map = |name: &str| {
            Field::new(
                name,
                DataType::Map(
                    Arc::new(Field::new(
                        "key_value",
                        DataType::Struct(
                            vec![
                                Field::new("key", DataType::Utf8, false),
                                Field::new("value", DataType::Utf8, true),
                            ]
                            .into(),
                        ),
                        false,
                    )),
                    false,
                ),
                true,
            )
        };
        Schema::new(vec![
            Field::new("ts", timestamp(), true),
            Field::new("trace_id", DataType::Utf8, true),
            Field::new("start_time_unix_nano", DataType::Int64, true),
            Field::new("end_time_unix_nano", DataType::Int64, true),
            Field::new("is_root", DataType::Boolean, true),
            Field::new("status_code", DataType::Utf8, true),
            Field::new("service_name", DataType::Utf8, true),
            map("span_attributes"),
            map("resource_attributes"),
        ])
    }

    fn input() -> StreamSpec {
        StreamSpec {
            time_column: Some("ts".into()),
            ..StreamSpec::append(
                "spans",
                "spans",
                iceberg_schema(&arrow_schema(), &[]).unwrap(),
            )
        }
    }

    fn batch(spans: &[Span]) -> StreamBatch {
        let names = MapFieldNames {
            entry: "key_value".into(),
            key: "key".into(),
            value: "value".into(),
        };
        let mut attributes = MapBuilder::new(
            Some(names.clone()),
            StringBuilder::new(),
            StringBuilder::new(),
        );
        let mut resources =
            MapBuilder::new(Some(names), StringBuilder::new(), StringBuilder::new());
        for s in spans {
            if let Some(tier) = s.tier {
                attributes.keys().append_value("tier");
                attributes.values().append_value(tier);
            }
            attributes.append(true).unwrap();
            resources.keys().append_value("service.name");
            resources.values().append_value(&s.service);
            resources.append(true).unwrap();
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                arrow_array::TimestampMicrosecondArray::from_iter_values(
                    spans.iter().map(|s| s.start),
                )
                .with_timezone("+00:00"),
            ),
            Arc::new(StringArray::from_iter_values(
                spans.iter().map(|s| hex(&trace_id(s.trace))),
            )),
            Arc::new(arrow_array::Int64Array::from_iter_values(
                spans.iter().map(|s| s.start * 1000),
            )),
            Arc::new(arrow_array::Int64Array::from_iter_values(
                spans.iter().map(|s| s.end * 1000),
            )),
            Arc::new(arrow_array::BooleanArray::from_iter(
                spans.iter().map(|s| Some(s.root)),
            )),
            Arc::new(StringArray::from_iter_values(
                spans.iter().map(|s| s.status),
            )),
            Arc::new(StringArray::from_iter_values(
                spans.iter().map(|s| s.service.as_str()),
            )),
            Arc::new(attributes.finish()),
            Arc::new(resources.finish()),
        ];
        let rows = RecordBatch::try_new(Arc::new(arrow_schema()), columns).unwrap();
        let own = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(input().schema.as_ref().unwrap()).unwrap(),
        );
        StreamBatch::single(0, aligned(&rows, &own).unwrap(), 0)
    }

    /// `traces` traces a twentieth of a second apart, 1 to 5 spans each, sent as they end:
    /// trace `i` fails in its last span when `i % 7 == 0`, is slow (900 ms) when `i % 13 == 0`,
    /// and has a gold customer when `i % 11 == 0`.
    fn traces(traces: u64) -> Vec<Span> {
        let mut spans = Vec::new();
        for i in 0..traces {
            let start = T0 + i as i64 * 50 * MS;
            let m = 1 + i % 5;
            let duration = if i % 13 == 0 {
                900 * MS
            } else {
                (20 + (i * 37) % 200) as i64 * MS
            };
            for k in 0..m {
                let s = start + k as i64 * 2 * MS;
                spans.push(Span {
                    trace: i,
                    start: s,
                    end: if k == 0 {
                        start + duration
                    } else {
                        s + duration / 3
                    },
                    root: k == 0,
                    status: if i % 7 == 0 && k == m - 1 {
                        "ERROR"
                    } else {
                        "UNSET"
                    },
                    service: format!("svc{k}"),
                    tier: (i % 11 == 0 && k + 1 == m).then_some("gold"),
                });
            }
        }
        spans.sort_by_key(|s| (s.end, s.trace, s.start));
        spans
    }

    fn spec(list: Vec<Named>, conditions: Vec<Condition>) -> SamplingSpec {
        SamplingSpec {
            id: "sampling".into(),
            time_column: "ts".into(),
            out_of_orderness: 0,
            decision_wait: 2_000 * MS,
            root_grace: None,
            decision_ttl: 60_000 * MS,
            policies: Policies {
                list,
                conditions,
                slots: (1, 0),
                text: String::new(),
            },
            output: "sampled".into(),
            decisions_output: "decisions".into(),
            late_output: "sampled_late".into(),
        }
    }

    fn named(name: &str, policy: Policy) -> Named {
        Named {
            name: name.into(),
            policy,
        }
    }

    fn shop() -> SamplingSpec {
        spec(
            vec![
                named(
                    "errors",
                    Policy::Met {
                        condition: 0,
                        invert: false,
                    },
                ),
                named(
                    "slow",
                    Policy::Latency {
                        min: 500,
                        max: None,
                    },
                ),
                named(
                    "gold",
                    Policy::Met {
                        condition: 1,
                        invert: false,
                    },
                ),
                named(
                    "tenth",
                    Policy::Probabilistic {
                        salt: probabilistic::DEFAULT_SALT.into(),
                        threshold: probabilistic::threshold(10.0),
                    },
                ),
            ],
            vec![
                Condition::Status(["ERROR".to_string()].into()),
                Condition::Text {
                    key: "tier".into(),
                    values: ["gold".to_string()].into(),
                    patterns: Vec::new(),
                },
            ],
        )
    }

    /// What came out: kept spans (trace, start, policy), decisions (trace, sampled, policy,
    /// spans, duration ms), late spans (trace, start).
    #[derive(Debug, Default, PartialEq)]
    struct Out {
        kept: BTreeSet<(String, i64, String)>,
        decisions: BTreeSet<(String, bool, String, i64, i64)>,
        late: BTreeSet<(String, i64)>,
    }

    fn collect(emitted: Vec<(usize, StreamBatch)>, out: &mut Out) {
        for (output, b) in emitted {
            let b = b.batch;
            let text = |name: &str, r: usize| {
                let c = b.column_by_name(name).unwrap().as_string::<i32>();
                if c.is_null(r) {
                    String::new()
                } else {
                    c.value(r).to_string()
                }
            };
            let int =
                |name: &str, r| integer_at(b.column_by_name(name).unwrap().as_ref(), r).unwrap();
            for r in 0..b.num_rows() {
                match output {
                    0 => {
                        let new = out.kept.insert((
                            text("trace_id", r),
                            int("ts", r),
                            text(POLICY_COLUMN, r),
                        ));
                        assert!(new, "a span kept twice");
                    }
                    1 => {
                        out.late.insert((text("trace_id", r), int("ts", r)));
                    }
                    _ => {
                        let sampled = b.column_by_name("sampled").unwrap().as_boolean().value(r);
                        let new = out.decisions.insert((
                            text("trace_id", r),
                            sampled,
                            text("policy", r),
                            int("span_count", r),
                            int("duration_ms", r),
                        ));
                        assert!(new, "a trace decided twice");
                    }
                }
            }
        }
    }

    /// Runs `spans` in batches of `size`, restoring a fresh operator from the state before
    /// batch `restart_at`, then moves the watermark far on.
    fn run(spec: &SamplingSpec, spans: &[Span], size: usize, restart_at: Option<usize>) -> Out {
        let dir = std::env::temp_dir().join(format!(
            "floe-sampling-{}-{}-{size}-{restart_at:?}",
            std::process::id(),
            spans.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("spans/{p}");
        let mut op = TailSampling::new(spec.clone(), &input()).unwrap();
        let mut out = Out::default();
        for (i, chunk) in spans.chunks(size).enumerate() {
            if restart_at == Some(i) {
                op = TailSampling::new(spec.clone(), &input()).unwrap();
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                op.on_restore(0, &mut ctx).unwrap();
            }
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            op.on_batch(&batch(chunk), &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty(), "{dead:?}");
            collect(emitted, &mut out);
        }
        let last = spans.iter().map(|s| s.start).max().unwrap();
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_watermark(0, last + 3_600_000 * MS, &mut ctx).unwrap();
        collect(ctx.finish().0, &mut out);
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    #[test]
    fn whole_traces_are_kept_by_the_first_policy_that_samples_whatever_the_batching() {
        let spans = traces(400);
        let spec = shop();
        let out = run(&spec, &spans, 64, None);
        assert_eq!(out.decisions.len(), 400, "every trace decided once");
        assert!(out.late.is_empty());
        for (id, sampled, policy, count, duration) in &out.decisions {
            let i = (0..400).find(|i| hex(&trace_id(*i)) == *id).unwrap();
            let expected = if i % 7 == 0 {
                "errors"
            } else if i % 13 == 0 {
                "slow"
            } else if i % 11 == 0 {
                "gold"
            } else if probabilistic::keeps(
                probabilistic::DEFAULT_SALT,
                probabilistic::threshold(10.0),
                &trace_id(i),
            ) {
                "tenth"
            } else {
                ""
            };
            assert_eq!(
                (policy.as_str(), *sampled),
                (expected, !expected.is_empty()),
                "trace {i}"
            );
            assert_eq!(*count, 1 + i as i64 % 5, "trace {i}");
            if i % 13 == 0 {
                assert_eq!(*duration, 900, "trace {i}");
            }
            // A kept trace is kept whole, with its policy on every span.
            let kept = out.kept.iter().filter(|(t, ..)| t == id).count() as i64;
            assert_eq!(kept, if *sampled { *count } else { 0 }, "trace {i}");
        }
        assert!(
            out.kept
                .iter()
                .all(|(t, _, p)| out.decisions.iter().any(|d| &d.0 == t && &d.2 == p))
        );
        for (size, restart) in [
            (1, Some(150)),
            (7, None),
            (100, Some(2)),
            (spans.len(), None),
            (33, Some(20)),
        ] {
            assert_eq!(
                run(&spec, &spans, size, restart),
                out,
                "batches of {size}, restart {restart:?}"
            );
        }
    }

    #[test]
    fn later_spans_follow_the_decision_and_spans_past_its_ttl_are_late() {
        let spans = traces(30);
        let spec = shop();
        let mut all = spans.clone();
        let last = spans.iter().map(|s| s.end).max().unwrap();
        // Traces 0 (an error: kept) and 1 (not kept) get a span once they are decided, trace
        // 2 one past its decision's 60 s TTL; a span 2 h behind is late.
        let straggler = |trace, start: i64| Span {
            trace,
            start,
            end: start + MS,
            root: false,
            status: "UNSET",
            service: "late".into(),
            tier: None,
        };
        // A span of another trace moves the watermark past every decision first; a second
        // one, past trace 2's TTL.
        all.push(straggler(1_000, last + 10_000 * MS));
        all.push(straggler(0, last + 11_000 * MS));
        all.push(straggler(1, last + 11_000 * MS));
        all.push(straggler(1_001, last + 100_000 * MS));
        all.push(straggler(2, last + 120_000 * MS));
        all.push(straggler(3, T0 - 7_200_000 * MS));
        let decided_1 = {
            let out = run(&spec, &spans, 10, None);
            out.decisions
                .iter()
                .find(|d| d.0 == hex(&trace_id(1)))
                .unwrap()
                .1
        };
        assert!(!decided_1, "trace 1 is not kept");
        for size in [1, 5, all.len()] {
            let out = run(&spec, &all, size, None);
            let kept_of = |i: u64| out.kept.iter().filter(|k| k.0 == hex(&trace_id(i))).count();
            // Trace 0: its one span and the straggler, both under "errors".
            assert_eq!(kept_of(0), 2, "batches of {size}");
            assert_eq!(kept_of(1), 0, "batches of {size}");
            // Trace 2's straggler came after its decision was forgotten: a trace of its own.
            let twos: Vec<_> = out
                .decisions
                .iter()
                .filter(|d| d.0 == hex(&trace_id(2)))
                .collect();
            assert_eq!(twos.len(), 2, "batches of {size}: {twos:?}");
            assert_eq!(
                out.late,
                BTreeSet::from([(hex(&trace_id(3)), T0 - 7_200_000 * MS)])
            );
        }
    }

    #[test]
    fn rate_limits_spend_their_budget_in_the_same_order_whatever_the_batching() {
        let spans = traces(300);
        let mut spec = spec(
            vec![named(
                "budget",
                Policy::RateLimit {
                    slot: 0,
                    per_second: 30,
                    burst: 30,
                    per_service: false,
                },
            )],
            Vec::new(),
        );
        spec.root_grace = Some(500 * MS);
        let out = run(&spec, &spans, 50, None);
        let kept = out.decisions.iter().filter(|d| d.1).count();
        // 300 traces of 3 spans on average over 15 s: about 30 spans a second fit.
        assert!((100..250).contains(&kept), "{kept} kept");
        for (size, restart) in [(1, None), (13, Some(9)), (spans.len(), None)] {
            assert_eq!(run(&spec, &spans, size, restart), out, "batches of {size}");
        }
        // Stored state: a decision and an open trace round-trip.
        for entry in [
            Entry::Decided {
                sampled: true,
                policy: Some("budget".into()),
                until: 9,
            },
            Entry::Open {
                summary: Summary::default(),
                due: 4,
                timer: 3,
                rows: vec![(2, vec![0, 5])],
                root_due: Some(4),
            },
        ] {
            assert_eq!(Entry::decode(&entry.encode()).unwrap(), entry);
        }
    }
}
