//! Service level objectives over a stream of requests: per objective and minute of event
//! time, the good and total requests, the error budget left over the objective's period, burn
//! rates over sliding windows and the multiwindow, multi-burn-rate alert conditions of
//! Google's SRE workbook (chapter 5, "Alerting on SLOs").
//!
//! **Input.** One row per request (the RED recipe's `by_service` stream) read back from an
//! exchange keyed by the service (optionally with the endpoint): an objective counts every
//! request of its service, so all of them must meet in one partition. A request counts for
//! every objective whose service (and endpoint, when it names one) it matches. Good means:
//! * `availability`: the error column is 0 (or false);
//! * `latency`: the duration column (ns) is at most the objective's threshold.
//!
//! **Minutes.** Requests are counted per minute of event time by a tumbling window (the
//! clock behind an exchange, allowed lateness, late rows aside — [`crate::minutes`]); a minute
//! is evaluated once, when its window closes (`watermark ≥ end + allowed_lateness`), so every
//! output row is final. Minutes without requests are evaluated too (burn rates fall when
//! traffic stops), from the objective's first request until nothing is left in its longest
//! window (its period, or 3 days if the period is shorter): one row per (objective, minute)
//! with any request in the trailing longest window.
//!
//! **Burn rate** over a window of length `w` ending with the minute: `(bad_w / total_w) /
//! (1 − target)`, 0 without requests; **budget remaining**: `1 − bad_P / ((1 − target) ·
//! total_P)` over the period `P` (1 without requests; negative when overspent). The alert
//! conditions, each "both windows burn faster than the factor", with the factors of a 30-day
//! period scaled to the objective's (`budget share × period / long window`):
//!
//! | column | budget share | long window | short window | factor at 30 days |
//! |---|---|---|---|---|
//! | `page_1h` | 2 % | 1 h | 5 m | 14.4 |
//! | `page_6h` | 5 % | 6 h | 30 m | 6 |
//! | `ticket_3d` | 10 % | 3 d | 6 h | 1 |
//!
//! **State** (per partition, beside the window's `0x00`–`0x03` and timers): `0x20 name` → the
//! objective's next minute to evaluate and its running sums per window; `0x21 name 0x00
//! minute` → a minute's (total, bad), kept while the longest window holds it. Sums are
//! integers, so restored, rescaled and uninterrupted runs agree exactly.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::{StreamBatch, StreamSpec};

use crate::aggregate::{AggKind, Aggregate};
use crate::codec::{Reader, Writer, integer_at, sortable};
use crate::minutes::{
    Closed, MINUTE, Minutes, ROW_COLUMN, RequestColumns, checked_input, inner_rows,
    per_minute_hooks, strings_of,
};
use crate::window::{event_times, final_stream, iceberg_schema, late_stream, timestamp};
use crate::{Context, OpError, OpResult, Operator};

/// What makes a request good.
#[derive(Debug, Clone, PartialEq)]
pub enum Sli {
    /// The request did not fail.
    Availability,
    /// The request took at most `threshold_ns`.
    Latency {
        /// The threshold (ns).
        threshold_ns: i64,
    },
}

/// One `[[slos]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    /// Its name (unique in the job).
    pub name: String,
    /// The service whose requests it counts.
    pub service: String,
    /// Only this endpoint's requests, if given.
    pub endpoint: Option<String>,
    /// What a good request is.
    pub sli: Sli,
    /// The share of good requests promised (0 < target < 1).
    pub target: f64,
    /// The budget's period (minutes).
    pub period_minutes: i64,
}

impl Objective {
    /// What its state is stored under: its name and a digest of what counts as good for it
    /// (FNV-1a, stable across versions), so a redefined objective starts afresh. Its
    /// target and period may change: the counts stay valid.
    pub fn state_key(&self) -> String {
        let definition = format!("{}|{:?}|{:?}", self.service, self.endpoint, self.sli);
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in definition.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{}#{hash:016x}", self.name)
    }

    fn kind_name(&self) -> &'static str {
        match self.sli {
            Sli::Availability => "availability",
            Sli::Latency { .. } => "latency",
        }
    }
}

/// An `slo` operator as configured.
#[derive(Debug, Clone)]
pub struct SloSpec {
    /// The operator's id.
    pub id: String,
    /// The input's event-time column.
    pub time_column: String,
    /// How far behind the largest event time rows may arrive (µs).
    pub out_of_orderness: i64,
    /// How long after its end a minute still takes requests (µs).
    pub allowed_lateness: i64,
    /// The column naming the service.
    pub service_column: String,
    /// The column naming the endpoint.
    pub endpoint_column: String,
    /// The column that is non-zero (or true) for a failed request.
    pub error_column: String,
    /// The column of the request's duration (ns).
    pub duration_column: String,
    /// The objectives.
    pub objectives: Vec<Objective>,
    /// The status stream.
    pub output: String,
    /// The late-rows stream.
    pub late_output: String,
}

impl SloSpec {
    /// A digest of what the stored state depends on. Objectives are not part of it: each
    /// one's state is stored under its [`Objective::state_key`], so adding, removing or
    /// redefining one leaves the others' alone.
    pub fn fingerprint(&self) -> String {
        format!(
            "slo v1 time={} ooo={} lateness={}",
            self.time_column, self.out_of_orderness, self.allowed_lateness
        )
    }
}

/// The sliding windows every row reports (name, minutes), shortest first.
pub const BURN_WINDOWS: [(&str, i64); 5] = [
    ("5m", 5),
    ("30m", 30),
    ("1h", 60),
    ("6h", 360),
    ("3d", 3 * 24 * 60),
];

/// The alert conditions: (column, budget share, long window, short window), windows as
/// indices into [`BURN_WINDOWS`].
pub const ALERT_RULES: [(&str, f64, usize, usize); 3] = [
    ("page_1h", 0.02, 2, 0),
    ("page_6h", 0.05, 3, 1),
    ("ticket_3d", 0.10, 4, 3),
];

/// The columns [`Slo`] counts per minute beside the time and the input row.
const INNER_COLUMNS: [&str; 2] = ["slo", "good"];

/// An objective's running evaluation in one partition.
#[derive(Debug, Clone, PartialEq)]
struct Running {
    /// The next minute (µs since the epoch / 60 s) to evaluate.
    next: i64,
    /// (total, bad) per window: [`BURN_WINDOWS`], then the period.
    sums: [(u64, u64); 6],
}

impl Running {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.i64(self.next);
        for (t, b) in self.sums {
            w.u64(t);
            w.u64(b);
        }
        w.0
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let next = r.i64()?;
        let mut sums = [(0, 0); 6];
        for s in &mut sums {
            *s = (r.u64()?, r.u64()?);
        }
        Ok(Self { next, sums })
    }
}

/// The `slo` operator.
pub struct Slo {
    spec: SloSpec,
    outputs: Vec<StreamSpec>,
    status: SchemaRef,
    /// The input's own columns (an exchange adds the source clock after them).
    input: SchemaRef,
    /// Counts good and total per (minute, objective).
    minutes: Minutes,
    /// Window lengths in minutes per objective: [`BURN_WINDOWS`], then the period.
    lengths: Vec<[i64; 6]>,
    /// Each objective's state key, and back.
    keys: Vec<String>,
    by_key: HashMap<String, usize>,
    running: HashMap<u32, BTreeMap<String, Running>>,
}

impl std::fmt::Debug for Slo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slo")
            .field("id", &self.spec.id)
            .field("objectives", &self.spec.objectives.len())
            .finish_non_exhaustive()
    }
}

/// The status stream's columns.
fn status_fields() -> Vec<Field> {
    let mut fields = vec![
        Field::new("window_start", timestamp(), false),
        Field::new("window_end", timestamp(), false),
        Field::new("slo", DataType::Utf8, false),
        Field::new("service_name", DataType::Utf8, false),
        Field::new("endpoint", DataType::Utf8, true),
        Field::new("objective", DataType::Utf8, false),
        Field::new("target", DataType::Float64, false),
        Field::new("good", DataType::Int64, false),
        Field::new("total", DataType::Int64, false),
    ];
    for (name, _) in BURN_WINDOWS {
        fields.push(Field::new(format!("total_{name}"), DataType::Int64, false));
        fields.push(Field::new(format!("bad_{name}"), DataType::Int64, false));
        fields.push(Field::new(
            format!("burn_rate_{name}"),
            DataType::Float64,
            false,
        ));
    }
    fields.push(Field::new("period_total", DataType::Int64, false));
    fields.push(Field::new("period_bad", DataType::Int64, false));
    fields.push(Field::new("budget_remaining", DataType::Float64, false));
    for (name, ..) in ALERT_RULES {
        fields.push(Field::new(name, DataType::Boolean, false));
    }
    fields
}

/// `(bad / total) / (1 − target)`, 0 without requests.
pub fn burn_rate(total: u64, bad: u64, target: f64) -> f64 {
    if total == 0 {
        0.0
    } else {
        (bad as f64 / total as f64) / (1.0 - target)
    }
}

/// `1 − bad / ((1 − target) · total)`, 1 without requests.
pub fn budget_remaining(total: u64, bad: u64, target: f64) -> f64 {
    if total == 0 {
        1.0
    } else {
        1.0 - bad as f64 / ((1.0 - target) * total as f64)
    }
}

/// The burn-rate factor of an alert rule for a period: `share × period / long window`.
pub fn alert_factor(share: f64, period_minutes: i64, long_minutes: i64) -> f64 {
    share * period_minutes as f64 / long_minutes as f64
}

impl Slo {
    /// An `slo` operator over `input`; `Err` says what is wrong with the configuration.
    pub fn new(spec: SloSpec, input: &StreamSpec) -> Result<Self, String> {
        let needed = if spec.objectives.iter().all(|o| o.endpoint.is_some()) {
            vec![spec.service_column.clone(), spec.endpoint_column.clone()]
        } else {
            vec![spec.service_column.clone()]
        };
        let availability = spec.objectives.iter().any(|o| o.sli == Sli::Availability);
        let latency = spec
            .objectives
            .iter()
            .any(|o| matches!(o.sli, Sli::Latency { .. }));
        let (arrow, time_type) = checked_input(
            input,
            &needed,
            "an objective",
            &RequestColumns {
                time: &spec.time_column,
                strings: &[&spec.service_column, &spec.endpoint_column],
                error: availability.then_some(spec.error_column.as_str()),
                duration: latency.then_some(spec.duration_column.as_str()),
            },
        )?;

        // Counts (time, objective, good) rows a minute at a time.
        let inner = Schema::new(vec![
            Field::new(&spec.time_column, time_type, false),
            Field::new(INNER_COLUMNS[0], DataType::Utf8, false),
            Field::new(INNER_COLUMNS[1], DataType::Int64, false),
            Field::new(ROW_COLUMN, DataType::Int64, false),
        ]);
        let minutes = Minutes::new(
            &spec.id,
            &inner,
            input,
            (spec.out_of_orderness, spec.allowed_lateness),
            vec![INNER_COLUMNS[0].into()],
            vec![
                Aggregate {
                    name: "good".into(),
                    kind: AggKind::Sum(INNER_COLUMNS[1].into()),
                },
                Aggregate {
                    name: "total".into(),
                    kind: AggKind::Count,
                },
            ],
        )?;

        let status = Schema::new(status_fields());
        let status_iceberg = iceberg_schema(&status, &[])?;
        let late_stream = late_stream(input, &arrow, &spec.late_output)?;
        let outputs = vec![
            final_stream(&spec.output, status_iceberg, "window_start", input),
            late_stream,
        ];
        let lengths = spec
            .objectives
            .iter()
            .map(|o| {
                let mut l = [0; 6];
                for (slot, (_, minutes)) in l.iter_mut().zip(BURN_WINDOWS) {
                    *slot = minutes;
                }
                l[5] = o.period_minutes;
                l
            })
            .collect();
        let keys: Vec<String> = spec.objectives.iter().map(Objective::state_key).collect();
        let by_key = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), i))
            .collect();
        Ok(Self {
            outputs,
            status: Arc::new(status),
            input: arrow,
            minutes,
            lengths,
            keys,
            by_key,
            running: HashMap::new(),
            spec,
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    fn running_key(key: &str) -> Vec<u8> {
        let mut k = vec![0x20];
        k.extend_from_slice(key.as_bytes());
        k
    }

    fn minute_key(key: &str, minute: i64) -> Vec<u8> {
        let mut k = vec![0x21];
        k.extend_from_slice(key.as_bytes());
        k.push(0);
        k.extend_from_slice(&sortable(minute));
        k
    }

    fn bucket(&self, ctx: &Context<'_>, p: u32, key: &str, minute: i64) -> OpResult<(u64, u64)> {
        match ctx.get(p, &Self::minute_key(key, minute))? {
            None => Ok((0, 0)),
            Some(bytes) => {
                let mut r = Reader(&bytes);
                Ok((
                    r.u64().map_err(|e| self.invalid(e))?,
                    r.u64().map_err(|e| self.invalid(e))?,
                ))
            }
        }
    }

    /// The expanded rows of `rows` for the inner window: one per (request, objective it
    /// counts for), with the source clock behind them. Rows that cannot count are refused.
    fn expand(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
    ) -> OpResult<Option<RecordBatch>> {
        let times = event_times(rows, &self.spec.time_column).map_err(|e| self.invalid(e))?;
        let strings = |name: &str| strings_of(rows, name).map_err(|e| self.invalid(e));
        let services = strings(&self.spec.service_column)?;
        let endpoints = strings(&self.spec.endpoint_column)?;
        let errors = rows
            .column_by_name(&self.spec.error_column)
            .map(|c| arrow_cast::cast(c, &DataType::Int64).unwrap_or_else(|_| c.clone()));
        let durations = rows.column_by_name(&self.spec.duration_column).cloned();
        let mut take = Vec::new();
        let mut names = StringBuilder::new();
        let mut goods = Int64Builder::new();
        for (row, time) in times.iter().enumerate() {
            if services.is_null(row) {
                continue;
            }
            let service = services.value(row);
            let endpoint = (!endpoints.is_null(row)).then(|| endpoints.value(row));
            // A row counts for every objective it matches, or — refused — for none.
            let mut counts: Vec<(&str, bool)> = Vec::new();
            let mut refused = None;
            for (o, key) in self.spec.objectives.iter().zip(&self.keys) {
                if o.service != service
                    || o.endpoint.as_deref().is_some_and(|e| Some(e) != endpoint)
                {
                    continue;
                }
                if time.is_none() {
                    refused = Some(format!("no event time ({})", self.spec.time_column));
                    break;
                }
                let (column, value) = match o.sli {
                    Sli::Availability => (&self.spec.error_column, &errors),
                    Sli::Latency { .. } => (&self.spec.duration_column, &durations),
                };
                let Some(v) = value.as_ref().and_then(|c| integer_at(c.as_ref(), row)) else {
                    refused = Some(format!("objective {}: no {column} value", o.name));
                    break;
                };
                let good = match o.sli {
                    Sli::Availability => v == 0,
                    Sli::Latency { threshold_ns } => v <= threshold_ns,
                };
                counts.push((key, good));
            }
            if let Some(reason) = refused {
                ctx.dead_letter(p, format!("operator {}: {reason}", self.spec.id), rows, row);
                continue;
            }
            for (key, good) in counts {
                take.push(row as u32);
                names.append_value(key);
                goods.append_value(good as i64);
            }
        }
        if take.is_empty() {
            return Ok(None);
        }
        let columns: Vec<(Field, ArrayRef)> = vec![
            (
                Field::new(INNER_COLUMNS[0], DataType::Utf8, false),
                Arc::new(names.finish()),
            ),
            (
                Field::new(INNER_COLUMNS[1], DataType::Int64, false),
                Arc::new(goods.finish()),
            ),
        ];
        inner_rows(rows, &self.spec.time_column, take, columns)
            .map(Some)
            .map_err(|e| self.invalid(format!("minute rows: {e}")))
    }

    /// Evaluates what the minutes closed: the minutes emitted, the minutes without requests
    /// the clock passed, and the late rows (as rows of `input`, when it was given rows).
    fn evaluate_closed(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        input: Option<&RecordBatch>,
        closed: Closed,
    ) -> OpResult<()> {
        let mut minutes: Vec<(String, i64, u64, u64)> = Vec::new();
        for b in &closed.rows {
            let starts = b.column_by_name("window_start").expect("window rows");
            let names = b
                .column_by_name("slo")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .expect("window rows");
            let goods = b.column_by_name("good").expect("window rows");
            let totals = b.column_by_name("total").expect("window rows");
            for r in 0..b.num_rows() {
                let start = integer_at(starts.as_ref(), r).unwrap_or_default();
                let total = integer_at(totals.as_ref(), r).unwrap_or_default() as u64;
                let good = integer_at(goods.as_ref(), r).unwrap_or_default() as u64;
                minutes.push((
                    names.value(r).to_string(),
                    start.div_euclid(MINUTE),
                    total,
                    total.saturating_sub(good),
                ));
            }
        }
        minutes.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let mut out = StatusRows::new();
        for (key, minute, total, bad) in minutes {
            self.evaluate_until(ctx, p, &key, minute, &mut out)?;
            self.evaluate(ctx, p, &key, minute, total, bad, &mut out)?;
        }
        // Minutes the clock closed without requests.
        if let Some(open) = self.minutes.open_minute(p) {
            let keys: Vec<String> = self
                .running
                .get(&p)
                .map(|r| r.keys().cloned().collect())
                .unwrap_or_default();
            for key in keys {
                self.evaluate_until(ctx, p, &key, open, &mut out)?;
            }
        }
        self.emit_status(ctx, p, out)?;
        if let Some(rows) = input {
            self.emit_late(ctx, p, rows, closed.late)?;
        }
        Ok(())
    }

    /// Evaluates the minutes of the objective stored under `key` without requests before
    /// `minute`.
    fn evaluate_until(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        key: &str,
        minute: i64,
        out: &mut StatusRows,
    ) -> OpResult<()> {
        while let Some(next) = self
            .running
            .get(&p)
            .and_then(|r| r.get(key))
            .map(|r| r.next)
            .filter(|next| *next < minute)
        {
            self.evaluate(ctx, p, key, next, 0, 0, out)?;
        }
        Ok(())
    }

    /// Evaluates minute `minute` of the objective stored under `key` ([`Objective::state_key`])
    /// with its counts.
    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        key: &str,
        minute: i64,
        total: u64,
        bad: u64,
        out: &mut StatusRows,
    ) -> OpResult<()> {
        let Some(&index) = self.by_key.get(key) else {
            return Ok(()); // an objective removed from the job file: nothing runs for it
        };
        let lengths = self.lengths[index];
        let longest = lengths.iter().copied().max().unwrap_or(1);
        let mut running = match self.running.get(&p).and_then(|r| r.get(key)) {
            Some(r) => r.clone(),
            None => Running {
                next: minute,
                sums: [(0, 0); 6],
            },
        };
        for (sum, len) in running.sums.iter_mut().zip(lengths) {
            let (t, b) = self.bucket(ctx, p, key, minute - len)?;
            sum.0 = (sum.0 + total).saturating_sub(t);
            sum.1 = (sum.1 + bad).saturating_sub(b);
        }
        if total > 0 {
            let mut w = Writer(Vec::new());
            w.u64(total);
            w.u64(bad);
            ctx.put(p, &Self::minute_key(key, minute), &w.0)?;
        }
        ctx.delete(p, &Self::minute_key(key, minute - longest))?;
        running.next = minute + 1;
        let retired = lengths
            .iter()
            .zip(running.sums)
            .all(|(len, (t, _))| *len != longest || t == 0);
        if !retired {
            out.push(&self.spec.objectives[index], minute, total, bad, &running);
        }
        let map = self.running.entry(p).or_default();
        if retired {
            map.remove(key);
            ctx.delete(p, &Self::running_key(key))?;
        } else {
            ctx.put(p, &Self::running_key(key), &running.encode())?;
            map.insert(key.to_string(), running);
        }
        Ok(())
    }

    fn emit_status(&self, ctx: &mut Context<'_>, p: u32, out: StatusRows) -> OpResult<()> {
        if out.rows == 0 {
            return Ok(());
        }
        let batch = RecordBatch::try_new(self.status.clone(), out.finish())
            .map_err(|e| self.invalid(format!("status rows: {e}")))?;
        ctx.emit(0, StreamBatch::single(0, batch, p));
        Ok(())
    }

    fn emit_late(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
        late: Vec<(usize, i64)>,
    ) -> OpResult<()> {
        let width = self.input.fields().len();
        self.minutes
            .emit_late(ctx, p, (rows, width), late)
            .map_err(|e| self.invalid(format!("late rows: {e}")))
    }
}

/// Status rows being built.
struct StatusRows {
    rows: usize,
    starts: TimestampMicrosecondBuilder,
    ends: TimestampMicrosecondBuilder,
    names: StringBuilder,
    services: StringBuilder,
    endpoints: StringBuilder,
    objectives: StringBuilder,
    targets: Float64Builder,
    good: Int64Builder,
    total: Int64Builder,
    windows: Vec<(Int64Builder, Int64Builder, Float64Builder)>,
    period: (Int64Builder, Int64Builder, Float64Builder),
    alerts: Vec<BooleanBuilder>,
}

impl StatusRows {
    fn new() -> Self {
        Self {
            rows: 0,
            starts: TimestampMicrosecondBuilder::new(),
            ends: TimestampMicrosecondBuilder::new(),
            names: StringBuilder::new(),
            services: StringBuilder::new(),
            endpoints: StringBuilder::new(),
            objectives: StringBuilder::new(),
            targets: Float64Builder::new(),
            good: Int64Builder::new(),
            total: Int64Builder::new(),
            windows: BURN_WINDOWS
                .iter()
                .map(|_| {
                    (
                        Int64Builder::new(),
                        Int64Builder::new(),
                        Float64Builder::new(),
                    )
                })
                .collect(),
            period: (
                Int64Builder::new(),
                Int64Builder::new(),
                Float64Builder::new(),
            ),
            alerts: ALERT_RULES.iter().map(|_| BooleanBuilder::new()).collect(),
        }
    }

    fn push(&mut self, o: &Objective, minute: i64, total: u64, bad: u64, running: &Running) {
        self.rows += 1;
        self.starts.append_value(minute * MINUTE);
        self.ends.append_value((minute + 1) * MINUTE);
        self.names.append_value(&o.name);
        self.services.append_value(&o.service);
        self.endpoints.append_option(o.endpoint.as_deref());
        self.objectives.append_value(o.kind_name());
        self.targets.append_value(o.target);
        self.good.append_value((total - bad) as i64);
        self.total.append_value(total as i64);
        let mut burns = [0.0; 5];
        for (i, (t, b, r)) in self.windows.iter_mut().enumerate() {
            let (total, bad) = running.sums[i];
            burns[i] = burn_rate(total, bad, o.target);
            t.append_value(total as i64);
            b.append_value(bad as i64);
            r.append_value(burns[i]);
        }
        let (pt, pb) = running.sums[5];
        self.period.0.append_value(pt as i64);
        self.period.1.append_value(pb as i64);
        self.period
            .2
            .append_value(budget_remaining(pt, pb, o.target));
        for (builder, (_, share, long, short)) in self.alerts.iter_mut().zip(ALERT_RULES) {
            let factor = alert_factor(share, o.period_minutes, BURN_WINDOWS[long].1);
            builder.append_value(burns[long] > factor && burns[short] > factor);
        }
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.starts.finish().with_timezone("+00:00")),
            Arc::new(self.ends.finish().with_timezone("+00:00")),
            Arc::new(self.names.finish()),
            Arc::new(self.services.finish()),
            Arc::new(self.endpoints.finish()),
            Arc::new(self.objectives.finish()),
            Arc::new(self.targets.finish()),
            Arc::new(self.good.finish()),
            Arc::new(self.total.finish()),
        ];
        for (t, b, r) in &mut self.windows {
            columns.push(Arc::new(t.finish()));
            columns.push(Arc::new(b.finish()));
            columns.push(Arc::new(r.finish()));
        }
        columns.push(Arc::new(self.period.0.finish()));
        columns.push(Arc::new(self.period.1.finish()));
        columns.push(Arc::new(self.period.2.finish()));
        for a in &mut self.alerts {
            columns.push(Arc::new(a.finish()));
        }
        columns
    }
}

impl Operator for Slo {
    per_minute_hooks!(expand, evaluate_closed);

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        self.minutes.on_restore(ctx, partition)?;
        let mut loaded = BTreeMap::new();
        let mut failed = None;
        ctx.scan(partition, &[0x20], Some(&[0x21]), |k, v| {
            match Running::decode(v) {
                Ok(r) => {
                    loaded.insert(String::from_utf8_lossy(&k[1..]).into_owned(), r);
                }
                Err(e) => failed = Some(e),
            }
            std::ops::ControlFlow::Continue(())
        })?;
        if let Some(e) = failed {
            return Err(self.invalid(format!("a stored objective: {e}")));
        }
        // Objectives no longer in the job file (or redefined) leave their state.
        let gone: Vec<String> = loaded
            .keys()
            .filter(|k| !self.by_key.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            loaded.remove(&key);
            ctx.delete(partition, &Self::running_key(&key))?;
            let mut from = vec![0x21];
            from.extend_from_slice(key.as_bytes());
            from.push(0);
            let mut to = from.clone();
            *to.last_mut().expect("not empty") = 1;
            let mut stale = Vec::new();
            ctx.scan(partition, &from, Some(&to), |k, _| {
                stale.push(k.to_vec());
                std::ops::ControlFlow::Continue(())
            })?;
            for k in stale {
                ctx.delete(partition, &k)?;
            }
        }
        self.running.insert(partition, loaded);
        Ok(())
    }

    fn forget(&mut self) {
        self.minutes.forget();
        self.running.clear();
    }

    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        self.minutes.frontiers()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, TimestampMicrosecondType};
    use arrow_array::{Int64Array, TimestampMicrosecondArray};
    use floe_core::exchange::SOURCE_CLOCK_COLUMN;
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    const S: i64 = 1_000_000;
    const OOO: i64 = 5 * S;
    const LATENESS: i64 = 30 * S;
    /// 2025-10-09T08:53:20Z, a minute boundary.
    const T0: i64 = 1_760_000_000 * S;

    fn input() -> StreamSpec {
        let p = |t| Type::Primitive(t);
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::optional(
                    1,
                    "ts",
                    p(PrimitiveType::Timestamptz),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "service_name",
                    p(PrimitiveType::String),
                )),
                Arc::new(NestedField::optional(
                    3,
                    "span_name",
                    p(PrimitiveType::String),
                )),
                Arc::new(NestedField::optional(4, "error", p(PrimitiveType::Int))),
                Arc::new(NestedField::optional(
                    5,
                    "duration_ns",
                    p(PrimitiveType::Long),
                )),
            ])
            .build()
            .unwrap();
        StreamSpec {
            time_column: Some("ts".into()),
            properties: vec![
                (floe_core::exchange::EXCHANGED_FROM.into(), "x".into()),
                (
                    floe_core::exchange::EXCHANGED_BY.into(),
                    "service_name".into(),
                ),
            ],
            ..StreamSpec::append("requests", "requests", schema)
        }
    }

    fn objectives() -> Vec<Objective> {
        vec![
            Objective {
                name: "checkout-availability".into(),
                service: "checkout".into(),
                endpoint: None,
                sli: Sli::Availability,
                target: 0.99,
                period_minutes: 30 * 24 * 60,
            },
            Objective {
                name: "checkout-latency".into(),
                service: "checkout".into(),
                endpoint: None,
                sli: Sli::Latency {
                    threshold_ns: 250_000_000,
                },
                target: 0.95,
                period_minutes: 120,
            },
            Objective {
                name: "search-query".into(),
                service: "search".into(),
                endpoint: Some("GET /q".into()),
                sli: Sli::Availability,
                target: 0.999,
                period_minutes: 24 * 60,
            },
        ]
    }

    fn spec() -> SloSpec {
        SloSpec {
            id: "slo".into(),
            time_column: "ts".into(),
            out_of_orderness: OOO,
            allowed_lateness: LATENESS,
            service_column: "service_name".into(),
            endpoint_column: "span_name".into(),
            error_column: "error".into(),
            duration_column: "duration_ns".into(),
            objectives: objectives(),
            output: "status".into(),
            late_output: "status_late".into(),
        }
    }

    /// A request: (time µs, service, endpoint, error, duration ns), and its source's clock.
    type Request = (i64, &'static str, &'static str, i32, i64, Option<i64>);

    /// Three hours of requests a second apart with up to 40 s of disorder (and 2 % two minutes
    /// late, past the lateness), errors in bursts
    /// (a fast burn in the second hour), and a source clock on each.
    fn requests() -> Vec<Request> {
        let mut seed: u64 = 42;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            seed >> 33
        };
        let mut out = Vec::new();
        let mut clock: Option<i64> = None;
        for i in 0..3 * 3600 {
            let straggler = if next() % 50 == 0 { 120 * S } else { 0 };
            let t = T0 + i * S - (next() % 40) as i64 * S - straggler;
            let service = if next() % 3 == 0 {
                "search"
            } else {
                "checkout"
            };
            let endpoint = if next() % 2 == 0 {
                "GET /q"
            } else {
                "POST /buy"
            };
            let burst = (3600..4200).contains(&i);
            let error = i32::from(next() % if burst { 4 } else { 200 } == 0);
            let duration = (next() % 400) as i64 * 1_000_000;
            out.push((t, service, endpoint, error, duration, clock));
            clock = Some(clock.map_or(t, |c| c.max(t)));
        }
        out
    }

    fn batch(rows: &[Request]) -> StreamBatch {
        let schema = Schema::new(vec![
            Field::new("ts", timestamp(), true),
            Field::new("service_name", DataType::Utf8, true),
            Field::new("span_name", DataType::Utf8, true),
            Field::new("error", DataType::Int32, true),
            Field::new("duration_ns", DataType::Int64, true),
            Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true),
        ]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampMicrosecondArray::from(rows.iter().map(|r| r.0).collect::<Vec<_>>())
                    .with_timezone("+00:00"),
            ),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(arrow_array::Int32Array::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.4).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.5).collect::<Vec<_>>(),
            )),
        ];
        StreamBatch::single(
            0,
            RecordBatch::try_new(Arc::new(schema), columns).unwrap(),
            0,
        )
    }

    /// One status row: (objective, minute start), its counts and sums, its rates, its alerts.
    type Status = ((String, i64), Vec<i64>, Vec<f64>, Vec<bool>);

    fn statuses(emitted: Vec<(usize, StreamBatch)>, out: &mut Vec<Status>, late: &mut usize) {
        for (output, b) in emitted {
            let b = b.batch;
            if output == 1 {
                *late += b.num_rows();
                continue;
            }
            let names = b.column_by_name("slo").unwrap().as_string::<i32>();
            let starts = b
                .column_by_name("window_start")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>();
            for r in 0..b.num_rows() {
                let (mut ints, mut floats, mut flags) = (Vec::new(), Vec::new(), Vec::new());
                for (f, c) in b.schema().fields().iter().zip(b.columns()).skip(7) {
                    match f.data_type() {
                        DataType::Int64 => ints.push(c.as_primitive::<Int64Type>().value(r)),
                        DataType::Float64 => floats.push(c.as_primitive::<Float64Type>().value(r)),
                        DataType::Boolean => flags.push(c.as_boolean().value(r)),
                        other => panic!("{other}"),
                    }
                }
                out.push((
                    (names.value(r).to_string(), starts.value(r)),
                    ints,
                    floats,
                    flags,
                ));
            }
        }
    }

    /// Runs the requests through in chunks of `size` (the exchange's clock after each), then
    /// moves the clock `then` further; with `restart`, a fresh operator restores the state
    /// halfway. Returns the status rows (sorted) and the late rows.
    fn run(size: usize, restart: bool, then: i64) -> (Vec<Status>, usize) {
        let dir = std::env::temp_dir().join(format!(
            "floe-slo-{}-{}-{}",
            std::process::id(),
            size,
            restart
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut slo = Slo::new(spec(), &input()).unwrap();
        let (mut out, mut late) = (Vec::new(), 0);
        let rows = requests();
        let mut clock = i64::MIN;
        for (i, chunk) in rows.chunks(size).enumerate() {
            if restart && i == rows.len() / size / 2 {
                slo = Slo::new(spec(), &input()).unwrap();
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                slo.on_restore(0, &mut ctx).unwrap();
            }
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            slo.on_batch(&batch(chunk), &mut ctx).unwrap();
            clock = chunk.iter().map(|r| r.0).fold(clock, i64::max);
            slo.on_event_clock(0, clock, &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty());
            statuses(emitted, &mut out, &mut late);
        }
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        slo.on_event_clock(0, clock + then, &mut ctx).unwrap();
        statuses(ctx.finish().0, &mut out, &mut late);
        let _ = std::fs::remove_dir_all(&dir);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        (out, late)
    }

    /// The status rows computed directly from the requests, by the definitions of the module
    /// docs, with the final clock `end`.
    fn oracle(end: i64) -> (Vec<Status>, usize) {
        let rows = requests();
        let closed = (end - OOO - LATENESS).div_euclid(MINUTE); // minutes before it are final
        let mut late = 0;
        let mut out = Vec::new();
        let mut counted: Vec<BTreeMap<i64, (u64, u64)>> = vec![BTreeMap::new(); 3];
        for r in &rows {
            let minute = r.0.div_euclid(MINUTE);
            let wm = r.5.map_or(i64::MIN, |c| c - OOO - LATENESS);
            let matching: Vec<usize> = objectives()
                .iter()
                .enumerate()
                .filter(|(_, o)| o.service == r.1 && o.endpoint.as_deref().is_none_or(|e| e == r.2))
                .map(|(i, _)| i)
                .collect();
            if matching.is_empty() {
                continue;
            }
            if (minute + 1) * MINUTE <= wm {
                late += 1;
                continue;
            }
            for i in matching {
                let bad = match objectives()[i].sli {
                    Sli::Availability => r.3 != 0,
                    Sli::Latency { threshold_ns } => r.4 > threshold_ns,
                };
                let e = counted[i].entry(minute).or_default();
                e.0 += 1;
                e.1 += u64::from(bad);
            }
        }
        for (i, o) in objectives().iter().enumerate() {
            let lengths = [5, 30, 60, 360, 4320, o.period_minutes];
            let longest = *lengths.iter().max().unwrap();
            let sum = |m: i64, len: i64| {
                counted[i]
                    .range(m - len + 1..=m)
                    .fold((0u64, 0u64), |a, (_, c)| (a.0 + c.0, a.1 + c.1))
            };
            let Some(&first) = counted[i].keys().next() else {
                continue;
            };
            for m in first..closed {
                if sum(m, longest).0 == 0 {
                    continue;
                }
                let (t, b) = counted[i].get(&m).copied().unwrap_or_default();
                let mut ints = vec![(t - b) as i64, t as i64];
                let mut burns = Vec::new();
                for len in &lengths[..5] {
                    let (t, b) = sum(m, *len);
                    ints.extend([t as i64, b as i64]);
                    let burn = if t == 0 {
                        0.0
                    } else {
                        b as f64 / t as f64 / (1.0 - o.target)
                    };
                    burns.push(burn);
                }
                let (pt, pb) = sum(m, o.period_minutes);
                ints.extend([pt as i64, pb as i64]);
                // As `statuses` reads a row: the burn rates in window order, then the budget.
                let mut floats = burns.clone();
                floats.push(if pt == 0 {
                    1.0
                } else {
                    1.0 - pb as f64 / ((1.0 - o.target) * pt as f64)
                });
                let period = o.period_minutes as f64;
                let hot = |long: usize, short: usize, share: f64| {
                    let factor = share * period / lengths[long] as f64;
                    burns[long] > factor && burns[short] > factor
                };
                let flags = vec![hot(2, 0, 0.02), hot(3, 1, 0.05), hot(4, 3, 0.10)];
                out.push(((o.name.clone(), m * MINUTE), ints, floats, flags));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        (out, late)
    }

    /// Equal rows, or a panic naming the first difference.
    fn same(got: &[Status], expected: &[Status]) {
        if let Some((g, e)) = got.iter().zip(expected).find(|(g, e)| g != e) {
            panic!("first difference:\n got      {g:?}\n expected {e:?}");
        }
        assert_eq!(got.len(), expected.len(), "as many rows");
    }

    #[test]
    fn status_rows_equal_the_definitions_whatever_the_batching_and_restarts() {
        let end = requests().iter().map(|r| r.0).max().unwrap();
        let (expected, expected_late) = oracle(end);
        assert!(expected_late > 0, "the workload has late rows");
        assert!(
            expected.iter().any(|r| r.3[0]),
            "the burst trips the fast-burn page"
        );
        assert!(expected.iter().any(|r| !r.3[0]), "and not always");
        let (got, late) = run(97, false, 0);
        same(&got, &expected);
        assert_eq!(late, expected_late);
        for (size, restart) in [(1, false), (500, true)] {
            let (again, late_again) = run(size, restart, 0);
            same(&again, &got);
            assert_eq!(late_again, late);
        }
    }

    #[test]
    fn an_objective_without_requests_reports_until_its_longest_window_is_empty() {
        let four_days = 4 * 24 * 3600 * S;
        let end = requests().iter().map(|r| r.0).max().unwrap() + four_days;
        let (expected, _) = oracle(end);
        let (got, _) = run(1000, false, four_days);
        same(&got, &expected);
        let last = |name: &str| got.iter().filter(|r| r.0.0 == name).map(|r| r.0.1).max();
        // The 3-day longest windows emptied; the 30-day one still reports.
        let traffic_end = T0 + 3 * 3600 * S;
        assert!(last("checkout-latency").unwrap() < traffic_end + 3 * 24 * 3600 * S + MINUTE);
        assert!(last("checkout-availability").unwrap() > traffic_end + 3 * 24 * 3600 * S + MINUTE);
    }

    #[test]
    fn it_needs_its_service_in_one_partition() {
        let mut by_endpoint = input();
        by_endpoint.properties[1].1 = "span_name".into();
        let e = Slo::new(spec(), &by_endpoint).unwrap_err();
        assert!(e.contains("exchange by service_name"), "{e}");
        let mut plain = input();
        plain.properties.clear();
        let e = Slo::new(spec(), &plain).unwrap_err();
        assert!(e.contains("not read back from an exchange"), "{e}");
    }
}
