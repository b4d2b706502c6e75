//! Series operators: per series (the values of `key`) and measure, one value per final
//! minute of event time, handed to a model that keeps what it learned in keyed state — the
//! machinery under [`crate::anomaly`] (a robust baseline, `kind = "anomaly"`) and
//! [`crate::forecast`] (a linear trend towards a threshold, `kind = "forecast"`).
//!
//! **Input.** Rows read back from an exchange keyed by a subset of the series key (so every
//! row of a series meets in one partition): requests for per-service latency and error
//! rate, or metric points (gauges, sums) for per-series values.
//!
//! **Minutes.** Each measure is aggregated per (series, minute of event time) and evaluated
//! once, when the minute is final ([`crate::minutes`]):
//!
//! | measure | the minute's value |
//! |---|---|
//! | `count()`, `sum(c)`, `min(c)`, `max(c)`, `avg(c)`, `quantile(c, q)` | that aggregate of the minute's values |
//! | `ratio(c)` | the share of the minute's rows whose `c` is non-zero (or true): an error rate |
//! | `ratio(c, n)` | `sum(c) / sum(n)` over rows that count already (`errors`, `requests` of a rollup) |
//! | `increase(c)` | how much a cumulative counter `c` grew since the series' previous minute, per minute |
//!
//! Over rows a window rolled up already (its final output, exchanged), `quantile(c, q)` of a
//! sketch column (`p99_ns_sketch`) merges the sketches — the same answer as over the raw rows
//! — and counts the values they hold; `ratio(errors, requests)` counts `requests`. So a
//! service's latency and error rate can be judged from a per-endpoint rollup at the cost of
//! its rows, not of every request.
//!
//! NaN and infinite values are skipped like nulls (they never reach a model). A minute with
//! fewer than `min_count` values of a measure is not shown to the model. A counter that went
//! down (a reset: the minute's smallest value is below the last one seen) is not shown that
//! minute; its next minute counts from the value after the reset.
//!
//! **Outputs.** The model's rows for every minute it judged go to the scores stream
//! (`<output>_scores`), those it flags to the main stream; rows later than their minute's
//! evaluation go to the late stream. Columns: `window_start`, `window_end`, the key columns,
//! `measure`, `observed`, the model's columns, `values` (counted in the minute).
//!
//! **State** (per partition, beside the minutes' window): `0x40 series` → the series' first
//! and last minute and, per measure, the counter's last value and the model's state. A
//! series without values for `ttl` is forgotten (an expiry timer per series, re-armed lazily)
//! and starts over when it comes back — also when its minute arrives before the timer fired,
//! so the outcome never depends on how the clock advanced.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::{StreamBatch, StreamSpec};

use crate::aggregate::{AggKind, Aggregate, parse_aggregate};
use crate::anomaly::{AnomalySettings, Baseline};
use crate::codec::{Reader, Writer, float_at, integer_at};
use crate::forecast::{ForecastSettings, Trend};
use crate::minutes::{
    Closed, MINUTE, Minutes, RequestColumns, checked_input, inner_rows, per_minute_hooks,
    strings_of,
};
use crate::timers::EXPIRY;
use crate::window::{event_times, final_stream, iceberg_schema, late_stream, timestamp};
use crate::{Context, OpError, OpResult, Operator};

/// Minutes in a day.
pub(crate) const DAY_MINUTES: i64 = 1440;

/// What a measure computes per minute.
#[derive(Debug, Clone, PartialEq)]
pub enum MeasureKind {
    /// `count()`, `sum`, `min`, `max`, `avg` or `quantile` of the minute's values.
    Aggregate(AggKind),
    /// The share of rows whose column is non-zero.
    Ratio(String),
    /// The sum of the first column over the sum of the second: a share of pre-counted rows.
    RatioOf(String, String),
    /// A cumulative counter's growth per minute.
    Increase(String),
}

impl MeasureKind {
    /// The input column, if any.
    pub fn column(&self) -> Option<&str> {
        match self {
            Self::Aggregate(a) => a.column(),
            Self::Ratio(c) | Self::RatioOf(c, _) | Self::Increase(c) => Some(c),
        }
    }

    /// The column counting the rows a `ratio(c, n)` is a share of.
    pub fn weight(&self) -> Option<&str> {
        match self {
            Self::RatioOf(_, n) => Some(n),
            _ => None,
        }
    }

    /// Whether the minute's value is a share of the values counted (a binomial proportion).
    fn is_ratio(&self) -> bool {
        matches!(self, Self::Ratio(_) | Self::RatioOf(..))
    }
}

/// A named measure of an `anomaly` operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    /// Its name (the `measure` column of the output).
    pub name: String,
    /// What it computes.
    pub kind: MeasureKind,
    /// The text it was given, for the fingerprint and `floe validate`.
    pub text: String,
}

/// Parses a measure: an aggregate ([`parse_aggregate`] but `count_distinct`), `ratio(c)`,
/// `ratio(hits, of)` or `increase(c)`.
pub fn parse_measure(name: &str, text: &str) -> Result<Measure, String> {
    let trimmed = text.trim();
    let single = |prefix: &str| {
        trimmed
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(')'))
            .map(str::trim)
            .filter(|c| !c.is_empty() && c.chars().all(|ch| ch.is_alphanumeric() || ch == '_'))
            .map(str::to_string)
    };
    let kind = if let Some(args) = trimmed.strip_prefix("ratio(") {
        let named =
            |c: &&str| !c.is_empty() && c.chars().all(|ch| ch.is_alphanumeric() || ch == '_');
        let columns: Vec<&str> = args
            .strip_suffix(')')
            .map(|args| args.split(',').map(str::trim).collect())
            .unwrap_or_default();
        match columns.as_slice() {
            [c] if named(c) => MeasureKind::Ratio(c.to_string()),
            [hits, of] if named(hits) && named(of) => {
                MeasureKind::RatioOf(hits.to_string(), of.to_string())
            }
            _ => return Err(format!("{text:?}: ratio(column) or ratio(hits, of)")),
        }
    } else if trimmed.starts_with("increase(") {
        MeasureKind::Increase(
            single("increase(").ok_or_else(|| format!("{text:?}: increase(column)"))?,
        )
    } else {
        let a = parse_aggregate(name, text).map_err(|e| {
            // A quantile out of range says so; anything else gets the list.
            if e.starts_with("quantile") {
                e
            } else {
                format!(
                    "{text:?} is not a measure: count(), sum(col), min(col), max(col), avg(col), \
                     quantile(col, 0.99), ratio(col) (the share of rows where col is non-zero), \
                     ratio(hits, of) (sum(hits) / sum(of)) or increase(col) (a cumulative counter's growth per minute)"
                )
            }
        })?;
        if matches!(a.kind, AggKind::CountDistinct(_)) {
            return Err(format!(
                "{text:?}: count_distinct is an estimate; score count(), sum, min, max, avg, \
                 quantile, ratio or increase"
            ));
        }
        MeasureKind::Aggregate(a.kind)
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
    {
        return Err(format!(
            "{name:?}: a measure's name is letters, digits and '_'"
        ));
    }
    Ok(Measure {
        name: name.to_string(),
        kind,
        text: trimmed.to_string(),
    })
}

/// What the series are judged by.
#[derive(Debug, Clone, PartialEq)]
pub enum Model {
    /// `kind = "anomaly"`: a robust baseline.
    Anomaly(AnomalySettings),
    /// `kind = "forecast"`: a linear trend towards a threshold.
    Forecast(ForecastSettings),
}

impl Model {
    /// The operator kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Anomaly(_) => "anomaly",
            Self::Forecast(_) => "forecast",
        }
    }

    fn min_count(&self) -> u64 {
        match self {
            Self::Anomaly(s) => s.min_count,
            Self::Forecast(s) => s.min_count,
        }
    }

    fn ttl_minutes(&self) -> i64 {
        match self {
            Self::Anomaly(s) => s.ttl_minutes,
            Self::Forecast(s) => s.ttl_minutes,
        }
    }

    /// The model's output columns, between `observed` and `values`.
    fn columns(&self) -> Vec<Field> {
        let f = |name: &str, ty: DataType, nullable| Field::new(name, ty, nullable);
        match self {
            Self::Anomaly(_) => vec![
                f("expected", DataType::Float64, false),
                f("deviation", DataType::Float64, false),
                f("score", DataType::Float64, false),
                f("direction", DataType::Utf8, false),
            ],
            Self::Forecast(_) => vec![
                f("level", DataType::Float64, false),
                f("trend_per_minute", DataType::Float64, false),
                f("threshold", DataType::Float64, false),
                f("minutes_left", DataType::Float64, true),
                f("crossing_at", timestamp(), true),
            ],
        }
    }

    fn new_state(&self) -> ModelState {
        match self {
            Self::Anomaly(_) => ModelState::Baseline(Baseline::default()),
            Self::Forecast(_) => ModelState::Trend(Trend::default()),
        }
    }

    fn decode_state(&self, r: &mut Reader<'_>) -> Result<ModelState, String> {
        Ok(match self {
            Self::Anomaly(_) => ModelState::Baseline(Baseline::decode(r)?),
            Self::Forecast(_) => ModelState::Trend(Trend::decode(r)?),
        })
    }

    /// Shows the model minute `at` of a measure: its cells when it judged the minute, and
    /// whether it flags it.
    fn observe(&self, state: &mut ModelState, at: &Observation) -> Option<(Vec<Cell>, bool)> {
        match (self, state) {
            (Self::Anomaly(s), ModelState::Baseline(b)) => b.observe(s, at),
            (Self::Forecast(s), ModelState::Trend(t)) => t.observe(s, at),
            _ => unreachable!("a series' state is decoded by its operator's model"),
        }
    }
}

/// What a model is shown of one minute of one measure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observation {
    /// Minutes since the epoch.
    pub minute: i64,
    /// The series' first minute.
    pub first: i64,
    /// Minutes since the measure's previous value (1 when none).
    pub gap: i64,
    /// The minute's value.
    pub value: f64,
    /// Values counted in the minute.
    pub count: u64,
    /// Whether the value is a `ratio` (a share of `count` rows).
    pub ratio: bool,
}

/// One output cell of a model's row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    /// A double (or null).
    F64(Option<f64>),
    /// A string.
    Text(&'static str),
    /// A UTC timestamp in µs (or null).
    Time(Option<i64>),
}

/// One measure's model state, by the operator's model.
#[derive(Debug, Clone, PartialEq)]
enum ModelState {
    Baseline(Baseline),
    Trend(Trend),
}

impl ModelState {
    fn encode(&self, w: &mut Writer) {
        match self {
            Self::Baseline(b) => b.encode(w),
            Self::Trend(t) => t.encode(w),
        }
    }
}

/// A `anomaly` or `forecast` operator as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSpec {
    /// The operator's id.
    pub id: String,
    /// The input's event-time column.
    pub time_column: String,
    /// How far behind the largest event time rows may arrive (µs).
    pub out_of_orderness: i64,
    /// How long after its end a minute still takes rows (µs).
    pub allowed_lateness: i64,
    /// The columns naming a series.
    pub key: Vec<String>,
    /// What is judged, by name.
    pub measures: Vec<Measure>,
    /// By what.
    pub model: Model,
    /// The stream of flagged minutes.
    pub output: String,
    /// The stream of every judged minute.
    pub scores_output: String,
    /// The late-rows stream.
    pub late_output: String,
}

impl SeriesSpec {
    /// A digest of what the stored state depends on: the model kind, the series key and the
    /// measures. The model's settings may change: they apply from the next minute on.
    pub fn fingerprint(&self) -> String {
        let measures: Vec<String> = self
            .measures
            .iter()
            .map(|m| format!("{}={}", m.name, m.text))
            .collect();
        format!(
            "{} v1 time={} ooo={} lateness={} key={} measures={}",
            self.model.kind(),
            self.time_column,
            self.out_of_orderness,
            self.allowed_lateness,
            self.key.join(","),
            measures.join(";")
        )
    }

    /// One line for `floe validate`.
    pub fn describe(&self) -> String {
        let measures: Vec<String> = self
            .measures
            .iter()
            .map(|m| format!("{} = {}", m.name, m.text))
            .collect();
        let settings = match &self.model {
            Model::Anomaly(s) => s.describe(),
            Model::Forecast(s) => s.describe(),
        };
        format!(
            "{} by {}: {} per minute; {settings}",
            self.model.kind(),
            self.key.join(", "),
            measures.join(", "),
        )
    }
}

/// One measure's part of a series' state.
#[derive(Debug, Clone, PartialEq)]
struct MeasureState {
    /// `increase`: the counter at the end of the last minute with values (NaN: none yet).
    counter: f64,
    /// The minute of the measure's last value shown to the model (`i64::MIN`: none).
    seen: i64,
    model: ModelState,
}

/// A series' state: its first and last minute with values and each measure's state.
#[derive(Debug, Clone, PartialEq)]
struct SeriesState {
    first: i64,
    last: i64,
    measures: Vec<MeasureState>,
}

impl SeriesState {
    fn new(minute: i64, model: &Model, measures: usize) -> Self {
        Self {
            first: minute,
            last: minute,
            measures: (0..measures)
                .map(|_| MeasureState {
                    counter: f64::NAN,
                    seen: i64::MIN,
                    model: model.new_state(),
                })
                .collect(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(16 + 48 * self.measures.len()));
        w.zigzag(self.first);
        w.zigzag(self.last);
        for m in &self.measures {
            w.f64(m.counter);
            // Minutes since the series' first one; 0: never.
            w.varint(if m.seen == i64::MIN {
                0
            } else {
                (m.seen - self.first + 1) as u64
            });
            m.model.encode(&mut w);
        }
        w.0
    }

    fn decode(bytes: &[u8], model: &Model, measures: usize) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let first = r.zigzag()?;
        let last = r.zigzag()?;
        let measures = (0..measures)
            .map(|_| {
                let counter = r.f64()?;
                let seen = match r.varint()? {
                    0 => i64::MIN,
                    n => first + n as i64 - 1,
                };
                Ok(MeasureState {
                    counter,
                    seen,
                    model: model.decode_state(&mut r)?,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self {
            first,
            last,
            measures,
        })
    }
}

/// The state key of a series: `0x40`, then each key value length-prefixed.
fn series_key(values: &[&str]) -> Vec<u8> {
    let mut w = Writer(vec![0x40]);
    for v in values {
        w.short_bytes(v.as_bytes());
    }
    w.0
}

/// The key values of a series' state key.
fn series_values(key: &[u8], parts: usize) -> Result<Vec<String>, String> {
    let mut r = Reader(&key[1..]);
    (0..parts)
        .map(|_| Ok(String::from_utf8_lossy(r.short_bytes()?).into_owned()))
        .collect()
}

/// Key column `name` of `rows` as strings, a missing value as the empty string (such rows
/// still form a series). A map (metric attributes) is rendered `k=v,k=v` in key order, so a
/// series is the same whatever order its producer wrote the attributes in.
fn key_strings(rows: &RecordBatch, name: &str) -> Result<arrow_array::StringArray, String> {
    let column = rows
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name}"))?;
    if let Some(maps) = column.as_any().downcast_ref::<arrow_array::MapArray>() {
        let keys = arrow_cast::cast(maps.keys(), &DataType::Utf8).map_err(|e| e.to_string())?;
        let values = arrow_cast::cast(maps.values(), &DataType::Utf8).map_err(|e| e.to_string())?;
        let (keys, values) = (keys.as_string::<i32>(), values.as_string::<i32>());
        let offsets = maps.value_offsets();
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        return Ok((0..maps.len())
            .map(|r| {
                pairs.clear();
                if maps.is_valid(r) {
                    for i in offsets[r] as usize..offsets[r + 1] as usize {
                        let value = if values.is_null(i) {
                            ""
                        } else {
                            values.value(i)
                        };
                        pairs.push((keys.value(i), value));
                    }
                }
                pairs.sort_unstable();
                let rendered: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                Some(rendered.join(","))
            })
            .collect());
    }
    let strings = strings_of(rows, name)?;
    Ok((0..strings.len())
        .map(|r| {
            Some(if strings.is_null(r) {
                ""
            } else {
                strings.value(r)
            })
        })
        .collect())
}

/// Row `row` of a minute's count column: a count, or a merged sketch's number of values.
fn counted(column: &dyn Array, row: usize) -> u64 {
    if let Some(list) = column.as_any().downcast_ref::<arrow_array::ListArray>() {
        return floe_sketch::quantile::from_list_array(list, row)
            .ok()
            .flatten()
            .map_or(0, |s| s.count());
    }
    integer_at(column, row).unwrap_or(0).max(0) as u64
}

/// The inner column holding measure `i`'s values.
fn value_column(i: usize) -> String {
    format!("__m{i}")
}

/// The inner column holding the counts a `ratio(hits, of)` measure `i` is a share of.
fn weight_column(i: usize) -> String {
    format!("__m{i}_of")
}

/// An `anomaly` or `forecast` operator.
pub struct SeriesOperator {
    spec: SeriesSpec,
    outputs: Vec<StreamSpec>,
    rows: SchemaRef,
    /// The input's own columns (an exchange adds the source clock after them).
    input: SchemaRef,
    minutes: Minutes,
    /// Per partition: no expiry timer is earlier than this.
    expiry_floor: HashMap<u32, i64>,
}

impl std::fmt::Debug for SeriesOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeriesOperator")
            .field("id", &self.spec.id)
            .finish_non_exhaustive()
    }
}

impl SeriesOperator {
    /// The operator over `input`; `Err` says what is wrong with the configuration.
    pub fn new(spec: SeriesSpec, input: &StreamSpec) -> Result<Self, String> {
        let kind = spec.model.kind();
        if spec.key.is_empty() {
            return Err(format!(
                "an {kind} operator needs a `key`: the columns naming a series"
            ));
        }
        let (arrow, time_type) = checked_input(
            input,
            &spec.key,
            "judging a series",
            &RequestColumns {
                time: &spec.time_column,
                strings: &[],
                error: None,
                duration: None,
            },
        )?;
        for column in spec
            .key
            .iter()
            .map(String::as_str)
            .chain(spec.measures.iter().filter_map(|m| m.kind.column()))
            .chain(spec.measures.iter().filter_map(|m| m.kind.weight()))
        {
            if arrow.field_with_name(column).is_err() {
                return Err(format!("stream {} has no column {column}", input.name));
            }
        }
        let mut inner = vec![Field::new(&spec.time_column, time_type, false)];
        for k in &spec.key {
            inner.push(Field::new(k, DataType::Utf8, false));
        }
        let mut aggregates = Vec::new();
        let agg = |name: String, kind| Aggregate { name, kind };
        for (i, m) in spec.measures.iter().enumerate() {
            let n = format!("m{i}_n");
            let Some(source) = m.kind.column() else {
                aggregates.push(agg(n, AggKind::Count));
                continue;
            };
            let ty = arrow
                .field_with_name(source)
                .expect("checked")
                .data_type()
                .clone();
            let sketches = matches!(m.kind, MeasureKind::Aggregate(AggKind::Quantile(..)))
                && floe_sketch::quantile::is_sketch_type(&ty);
            let numeric = match m.kind {
                MeasureKind::Ratio(_) => ty.is_integer() || ty == DataType::Boolean,
                MeasureKind::RatioOf(..) => ty.is_integer(),
                _ => ty.is_numeric() || sketches,
            };
            if !numeric {
                return Err(format!(
                    "measure {}: column {source} is {ty}, not a number",
                    m.name
                ));
            }
            if let Some(weight) = m.kind.weight() {
                let ty = arrow.field_with_name(weight).expect("checked").data_type();
                if !ty.is_integer() {
                    return Err(format!(
                        "measure {}: column {weight} is {ty}, not an integer count",
                        m.name
                    ));
                }
            }
            let column = value_column(i);
            match &m.kind {
                MeasureKind::Aggregate(kind) => {
                    let kind = match kind {
                        AggKind::Sum(_) => AggKind::Sum(column.clone()),
                        AggKind::Min(_) => AggKind::Min(column.clone()),
                        AggKind::Max(_) => AggKind::Max(column.clone()),
                        AggKind::Avg(_) => AggKind::Avg(column.clone()),
                        AggKind::Quantile(_, q) => AggKind::Quantile(column.clone(), *q),
                        AggKind::CountColumn(_) => AggKind::CountColumn(column.clone()),
                        other => {
                            return Err(format!("measure {}: {other:?} is not judged", m.name));
                        }
                    };
                    aggregates.push(agg(format!("m{i}"), kind));
                    if sketches {
                        // Merged as they come; the merged sketch counts its values.
                        inner.push(Field::new(&column, ty, true));
                        continue;
                    }
                    inner.push(Field::new(&column, DataType::Float64, true));
                }
                MeasureKind::Ratio(_) => {
                    aggregates.push(agg(format!("m{i}_hits"), AggKind::Sum(column.clone())));
                    inner.push(Field::new(&column, DataType::Int64, true));
                }
                MeasureKind::RatioOf(..) => {
                    let of = weight_column(i);
                    aggregates.push(agg(format!("m{i}_hits"), AggKind::Sum(column.clone())));
                    aggregates.push(agg(format!("m{i}_n"), AggKind::Sum(of.clone())));
                    inner.push(Field::new(&column, DataType::Int64, true));
                    inner.push(Field::new(&of, DataType::Int64, true));
                    continue;
                }
                MeasureKind::Increase(_) => {
                    aggregates.push(agg(format!("m{i}_max"), AggKind::Max(column.clone())));
                    aggregates.push(agg(format!("m{i}_min"), AggKind::Min(column.clone())));
                    inner.push(Field::new(&column, DataType::Float64, true));
                }
            }
            aggregates.push(agg(n, AggKind::CountColumn(column)));
        }
        inner.push(Field::new(
            crate::minutes::ROW_COLUMN,
            DataType::Int64,
            false,
        ));
        let minutes = Minutes::new(
            &spec.id,
            &Schema::new(inner),
            input,
            (spec.out_of_orderness, spec.allowed_lateness),
            spec.key.clone(),
            aggregates,
        )?;
        let mut fields = vec![
            Field::new("window_start", timestamp(), false),
            Field::new("window_end", timestamp(), false),
        ];
        for k in &spec.key {
            fields.push(Field::new(k, DataType::Utf8, false));
        }
        fields.push(Field::new("measure", DataType::Utf8, false));
        fields.push(Field::new("observed", DataType::Float64, false));
        fields.extend(spec.model.columns());
        fields.push(Field::new("values", DataType::Int64, false));
        let rows = Schema::new(fields);
        let stream = |name: &str| -> Result<StreamSpec, String> {
            Ok(final_stream(
                name,
                iceberg_schema(&rows, &[])?,
                "window_start",
                input,
            ))
        };
        let outputs = vec![
            stream(&spec.output)?,
            late_stream(input, &arrow, &spec.late_output)?,
            stream(&spec.scores_output)?,
        ];
        Ok(Self {
            outputs,
            rows: Arc::new(rows),
            input: arrow,
            minutes,
            expiry_floor: HashMap::new(),
            spec,
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    /// The rows of `rows` for the minutes: time, key values, each measure's value (null when
    /// missing or not finite), row. Rows without a time are dead-lettered.
    fn inner(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
    ) -> OpResult<Option<RecordBatch>> {
        let times = event_times(rows, &self.spec.time_column).map_err(|e| self.invalid(e))?;
        let mut take = Vec::with_capacity(rows.num_rows());
        for (row, time) in times.iter().enumerate() {
            if time.is_some() {
                take.push(row as u32);
            } else {
                let reason = format!(
                    "operator {}: no {} value",
                    self.spec.id, self.spec.time_column
                );
                ctx.dead_letter(p, reason, rows, row);
            }
        }
        if take.is_empty() {
            return Ok(None);
        }
        let indices = arrow_array::UInt32Array::from(take.clone());
        let pick = |a: &ArrayRef| {
            arrow_select::take::take(a.as_ref(), &indices, None)
                .map_err(|e| self.invalid(e.to_string()))
        };
        let mut columns: Vec<(Field, ArrayRef)> = Vec::new();
        for k in &self.spec.key {
            let filled: ArrayRef = Arc::new(key_strings(rows, k).map_err(|e| self.invalid(e))?);
            columns.push((Field::new(k, DataType::Utf8, false), pick(&filled)?));
        }
        for (i, m) in self.spec.measures.iter().enumerate() {
            let Some(column) = m.kind.column() else {
                continue;
            };
            let source = rows
                .column_by_name(column)
                .ok_or_else(|| self.invalid(format!("no column {column}")))?;
            let source = pick(source)?;
            let integers = |source: ArrayRef| -> OpResult<ArrayRef> {
                crate::minutes::integers_of(
                    &RecordBatch::try_from_iter([("c", source)])
                        .map_err(|e| self.invalid(e.to_string()))?,
                    "c",
                )
                .map_err(|e| self.invalid(e))
            };
            let values: ArrayRef = match m.kind {
                MeasureKind::Aggregate(AggKind::Quantile(..))
                    if floe_sketch::quantile::is_sketch_type(source.data_type()) =>
                {
                    source
                }
                MeasureKind::RatioOf(_, ref of) => {
                    let counts = rows
                        .column_by_name(of)
                        .ok_or_else(|| self.invalid(format!("no column {of}")))?;
                    columns.push((
                        Field::new(value_column(i), DataType::Int64, true),
                        integers(source)?,
                    ));
                    columns.push((
                        Field::new(weight_column(i), DataType::Int64, true),
                        integers(pick(counts)?)?,
                    ));
                    continue;
                }
                MeasureKind::Ratio(_) => {
                    let ints = integers(source)?;
                    Arc::new(
                        (0..ints.len())
                            .map(|r| integer_at(ints.as_ref(), r).map(|v| i64::from(v != 0)))
                            .collect::<Int64Array>(),
                    )
                }
                _ => Arc::new(
                    (0..source.len())
                        .map(|r| float_at(source.as_ref(), r).filter(|v| v.is_finite()))
                        .collect::<Float64Array>(),
                ),
            };
            let ty = values.data_type().clone();
            columns.push((Field::new(value_column(i), ty, true), values));
        }
        inner_rows(rows, &self.spec.time_column, take, columns)
            .map(Some)
            .map_err(|e| self.invalid(format!("minute rows: {e}")))
    }

    /// Judges the minutes closed, then forgets series past their ttl and sends late rows aside.
    fn evaluate_closed(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        input: Option<&RecordBatch>,
        closed: Closed,
    ) -> OpResult<()> {
        // series key → minute → each measure's aggregates
        let mut closing: BTreeMap<Vec<u8>, BTreeMap<i64, Vec<MinuteValues>>> = BTreeMap::new();
        for b in &closed.rows {
            let keys: Vec<arrow_array::StringArray> = self
                .spec
                .key
                .iter()
                .map(|k| strings_of(b, k).map_err(|e| self.invalid(e)))
                .collect::<Result<_, _>>()?;
            let starts = b.column_by_name("window_start").expect("window rows");
            let column = |name: String| b.column_by_name(&name).cloned();
            let per_measure: Vec<[Option<ArrayRef>; 3]> = (0..self.spec.measures.len())
                .map(|i| {
                    [
                        column(format!("m{i}"))
                            .or_else(|| column(format!("m{i}_hits")))
                            .or_else(|| column(format!("m{i}_max"))),
                        column(format!("m{i}_min")),
                        // A merged sketch counts its own values.
                        column(format!("m{i}_n")).or_else(|| column(format!("m{i}_sketch"))),
                    ]
                })
                .collect();
            for r in 0..b.num_rows() {
                let values: Vec<&str> = keys.iter().map(|k| k.value(r)).collect();
                let minute = integer_at(starts.as_ref(), r)
                    .unwrap_or_default()
                    .div_euclid(MINUTE);
                let measured = per_measure
                    .iter()
                    .map(|[value, min, n]| {
                        let at =
                            |a: &Option<ArrayRef>| a.as_ref().and_then(|a| float_at(a.as_ref(), r));
                        MinuteValues {
                            value: at(value),
                            min: at(min),
                            count: n.as_ref().map_or(0, |a| counted(a.as_ref(), r)),
                        }
                    })
                    .collect();
                closing
                    .entry(series_key(&values))
                    .or_default()
                    .insert(minute, measured);
            }
        }
        let width = self.spec.key.len();
        let extra = self.spec.model.columns();
        let mut every = SeriesRows::new(width, &extra);
        let mut flagged = SeriesRows::new(width, &extra);
        if !closing.is_empty() {
            let keys: Vec<&[u8]> = closing.keys().map(Vec::as_slice).collect();
            let stored = ctx.get_many(p, &keys)?;
            let (model, measures) = (&self.spec.model, self.spec.measures.len());
            let ttl = model.ttl_minutes();
            let mut updates: Vec<(Vec<u8>, SeriesState, bool)> = Vec::with_capacity(closing.len());
            for ((key, minutes), stored) in closing.into_iter().zip(stored) {
                let mut series = match stored {
                    Some(bytes) => Some(
                        SeriesState::decode(&bytes, model, measures)
                            .map_err(|e| self.invalid(e))?,
                    ),
                    None => None,
                };
                let values = series_values(&key, width).map_err(|e| self.invalid(e))?;
                let mut new = series.is_none();
                for (minute, measured) in minutes {
                    let s = match &mut series {
                        // Past its ttl: forgotten, whether or not its timer fired yet.
                        Some(s) if minute - s.last > ttl => {
                            *s = SeriesState::new(minute, model, measures);
                            new = true;
                            s
                        }
                        Some(s) => s,
                        None => series.insert(SeriesState::new(minute, model, measures)),
                    };
                    self.judge_minute(s, minute, &values, &measured, &mut every, &mut flagged);
                }
                updates.push((key, series.expect("judged"), new));
            }
            for (key, series, new) in updates {
                ctx.put(p, &key, &series.encode())?;
                if new {
                    EXPIRY.register(ctx, p, (series.last + ttl + 1) * MINUTE, &key)?;
                }
            }
        }
        if let Some(open) = self.minutes.open_minute(p) {
            self.expire(ctx, p, open)?;
        }
        for (output, rows) in [(0, flagged), (2, every)] {
            if rows.rows > 0 {
                let batch = RecordBatch::try_new(self.rows.clone(), rows.finish())
                    .map_err(|e| self.invalid(format!("output rows: {e}")))?;
                ctx.emit(output, StreamBatch::single(output, batch, p));
            }
        }
        if let Some(rows) = input {
            let width = self.input.fields().len();
            self.minutes
                .emit_late(ctx, p, (rows, width), closed.late)
                .map_err(|e| self.invalid(format!("late rows: {e}")))?;
        }
        Ok(())
    }

    /// Shows the model one final minute of series `s`.
    fn judge_minute(
        &self,
        s: &mut SeriesState,
        minute: i64,
        key: &[String],
        measured: &[MinuteValues],
        every: &mut SeriesRows,
        flagged: &mut SeriesRows,
    ) {
        let min_count = self.spec.model.min_count();
        s.last = minute;
        let first = s.first;
        for ((m, values), state) in self.spec.measures.iter().zip(measured).zip(&mut s.measures) {
            let observed = match m.kind {
                MeasureKind::Aggregate(AggKind::Count) => Some(values.count as f64),
                MeasureKind::Ratio(_) | MeasureKind::RatioOf(..) => {
                    values.value.map(|hits| hits / values.count.max(1) as f64)
                }
                MeasureKind::Increase(_) => {
                    let (Some(max), Some(min)) = (values.value, values.min) else {
                        continue;
                    };
                    let last = std::mem::replace(&mut state.counter, max);
                    let since = std::mem::replace(&mut state.seen, minute);
                    // The first value, or a reset: nothing to compare yet.
                    if last.is_nan() || min < last {
                        continue;
                    }
                    Some((max - last) / (minute - since).max(1) as f64)
                }
                MeasureKind::Aggregate(_) => values.value,
            };
            let Some(value) = observed.filter(|v| v.is_finite()) else {
                continue;
            };
            if values.count < min_count {
                continue;
            }
            let gap = if state.seen == i64::MIN || matches!(m.kind, MeasureKind::Increase(_)) {
                1
            } else {
                (minute - state.seen).max(1)
            };
            state.seen = minute;
            let at = Observation {
                minute,
                first,
                gap,
                value,
                count: values.count,
                ratio: m.kind.is_ratio(),
            };
            if let Some((cells, flag)) = self.spec.model.observe(&mut state.model, &at) {
                every.push(minute, key, &m.name, value, &cells, values.count);
                if flag {
                    flagged.push(minute, key, &m.name, value, &cells, values.count);
                }
            }
        }
    }

    /// Forgets the series of partition `p` without values for `ttl` before minute `open`.
    fn expire(&mut self, ctx: &mut Context<'_>, p: u32, open: i64) -> OpResult<()> {
        let floor = self.expiry_floor.get(&p).copied().unwrap_or(i64::MIN);
        let due = EXPIRY.take_due(ctx, p, floor, open * MINUTE)?;
        self.expiry_floor.insert(p, open * MINUTE + 1);
        if due.is_empty() {
            return Ok(());
        }
        let keys: Vec<&[u8]> = due.iter().map(|(_, k)| k.as_slice()).collect();
        let stored = ctx.get_many(p, &keys)?;
        let (model, measures) = (&self.spec.model, self.spec.measures.len());
        let ttl = model.ttl_minutes();
        for ((_, key), stored) in due.iter().zip(stored) {
            let Some(bytes) = stored else {
                continue;
            };
            let series =
                SeriesState::decode(&bytes, model, measures).map_err(|e| self.invalid(e))?;
            if series.last + ttl < open {
                ctx.delete(p, key)?;
            } else {
                EXPIRY.register(ctx, p, (series.last + ttl + 1) * MINUTE, key)?;
            }
        }
        Ok(())
    }
}

/// One measure's aggregates of one closed minute.
struct MinuteValues {
    /// The aggregate (`ratio`: the rows flagged; `increase`: the largest value).
    value: Option<f64>,
    /// `increase`: the smallest value.
    min: Option<f64>,
    /// Values counted.
    count: u64,
}

/// A column of a model's cells being built.
enum CellBuilder {
    F64(Float64Builder),
    Text(StringBuilder),
    Time(TimestampMicrosecondBuilder),
}

/// Output rows being built.
struct SeriesRows {
    rows: usize,
    starts: TimestampMicrosecondBuilder,
    ends: TimestampMicrosecondBuilder,
    keys: Vec<StringBuilder>,
    measures: StringBuilder,
    observed: Float64Builder,
    cells: Vec<CellBuilder>,
    counts: Int64Builder,
}

impl SeriesRows {
    fn new(keys: usize, model: &[Field]) -> Self {
        Self {
            rows: 0,
            starts: TimestampMicrosecondBuilder::new(),
            ends: TimestampMicrosecondBuilder::new(),
            keys: (0..keys).map(|_| StringBuilder::new()).collect(),
            measures: StringBuilder::new(),
            observed: Float64Builder::new(),
            cells: model
                .iter()
                .map(|f| match f.data_type() {
                    DataType::Utf8 => CellBuilder::Text(StringBuilder::new()),
                    DataType::Timestamp(..) => {
                        CellBuilder::Time(TimestampMicrosecondBuilder::new())
                    }
                    _ => CellBuilder::F64(Float64Builder::new()),
                })
                .collect(),
            counts: Int64Builder::new(),
        }
    }

    fn push(
        &mut self,
        minute: i64,
        key: &[String],
        measure: &str,
        observed: f64,
        cells: &[Cell],
        count: u64,
    ) {
        self.rows += 1;
        self.starts.append_value(minute * MINUTE);
        self.ends.append_value((minute + 1) * MINUTE);
        for (builder, value) in self.keys.iter_mut().zip(key) {
            builder.append_value(value);
        }
        self.measures.append_value(measure);
        self.observed.append_value(observed);
        for (builder, cell) in self.cells.iter_mut().zip(cells) {
            match (builder, cell) {
                (CellBuilder::F64(b), Cell::F64(v)) => b.append_option(*v),
                (CellBuilder::Text(b), Cell::Text(v)) => b.append_value(v),
                (CellBuilder::Time(b), Cell::Time(v)) => b.append_option(*v),
                _ => unreachable!("a model's cells follow its columns"),
            }
        }
        self.counts.append_value(count as i64);
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        let mut out: Vec<ArrayRef> = vec![
            Arc::new(self.starts.finish().with_timezone("+00:00")),
            Arc::new(self.ends.finish().with_timezone("+00:00")),
        ];
        for mut k in self.keys {
            out.push(Arc::new(k.finish()));
        }
        out.push(Arc::new(self.measures.finish()));
        out.push(Arc::new(self.observed.finish()));
        for builder in &mut self.cells {
            out.push(match builder {
                CellBuilder::F64(b) => Arc::new(b.finish()),
                CellBuilder::Text(b) => Arc::new(b.finish()),
                CellBuilder::Time(b) => Arc::new(b.finish().with_timezone("+00:00")),
            });
        }
        out.push(Arc::new(self.counts.finish()));
        out
    }
}

impl Operator for SeriesOperator {
    per_minute_hooks!(inner, evaluate_closed);

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        self.expiry_floor.remove(&partition);
        self.minutes.on_restore(ctx, partition)
    }

    fn forget(&mut self) {
        self.expiry_floor.clear();
        self.minutes.forget();
    }

    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        self.minutes.frontiers()
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, TimestampMicrosecondType};
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    };
    use arrow_schema::{DataType, Field, Schema};
    use floe_core::exchange::SOURCE_CLOCK_COLUMN;
    use floe_core::{StreamBatch, StreamSpec};
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;
    use crate::anomaly::{DEFAULTS, Direction};

    const S: i64 = 1_000_000;
    /// 2025-10-09T08:53:00Z, a minute's start.
    const T0: i64 = 1_759_999_980 * S;

    fn input() -> StreamSpec {
        let p = |t| Type::Primitive(t);
        let field = |id, name, t| Arc::new(NestedField::optional(id, name, p(t)));
        let schema = iceberg::spec::Schema::builder()
            .with_fields(vec![
                field(1, "ts", PrimitiveType::Timestamptz),
                field(2, "service_name", PrimitiveType::String),
                field(3, "error", PrimitiveType::Int),
                field(4, "value", PrimitiveType::Double),
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
            ..StreamSpec::append("rows", "rows", schema)
        }
    }

    fn spec(measures: &[(&str, &str)], settings: AnomalySettings) -> SeriesSpec {
        judged_by(measures, Model::Anomaly(settings))
    }

    fn judged_by(measures: &[(&str, &str)], model: Model) -> SeriesSpec {
        SeriesSpec {
            id: "anomalies".into(),
            time_column: "ts".into(),
            out_of_orderness: 5 * S,
            allowed_lateness: 30 * S,
            key: vec!["service_name".into()],
            measures: measures
                .iter()
                .map(|(n, t)| parse_measure(n, t).unwrap())
                .collect(),
            model,
            output: "anomalies".into(),
            scores_output: "anomalies_scores".into(),
            late_output: "anomalies_late".into(),
        }
    }

    /// A row: (time µs, service, error, value), and its source's clock.
    type Row = (i64, &'static str, i32, f64, Option<i64>);

    fn batch(rows: &[Row]) -> StreamBatch {
        let schema = Schema::new(vec![
            Field::new("ts", timestamp(), true),
            Field::new("service_name", DataType::Utf8, true),
            Field::new("error", DataType::Int32, true),
            Field::new("value", DataType::Float64, true),
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
            Arc::new(arrow_array::Int32Array::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.4).collect::<Vec<_>>(),
            )),
        ];
        StreamBatch::single(
            0,
            RecordBatch::try_new(Arc::new(schema), columns).unwrap(),
            0,
        )
    }

    /// A score row: (minute since T0, service, measure, observed, score bits rounded).
    type Score = (i64, String, String, i64, i64);

    fn scores(emitted: Vec<(usize, StreamBatch)>, out: &mut [Vec<Score>; 3]) {
        for (output, b) in emitted {
            let b = b.batch;
            if output == 1 {
                out[1].extend((0..b.num_rows()).map(|_| (0, String::new(), String::new(), 0, 0)));
                continue;
            }
            let text = |n: &str, r| {
                b.column_by_name(n)
                    .unwrap()
                    .as_string::<i32>()
                    .value(r)
                    .to_string()
            };
            // An anomaly's score, or a forecast's minutes left (-1: none).
            let judged = if b.column_by_name("score").is_some() {
                "score"
            } else {
                "minutes_left"
            };
            let float = |n: &str, r| {
                let c = b.column_by_name(n).unwrap().as_primitive::<Float64Type>();
                if c.is_null(r) { -1.0 } else { c.value(r) }
            };
            let starts = b
                .column_by_name("window_start")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>();
            for r in 0..b.num_rows() {
                out[output].push((
                    (starts.value(r) - T0) / MINUTE,
                    text("service_name", r),
                    text("measure", r),
                    (float("observed", r) * 1e6).round() as i64,
                    (float(judged, r) * 1e6).round() as i64,
                ));
            }
        }
    }

    /// Runs `rows` in chunks of `size` (the exchange's clock after each), then moves the clock
    /// a day on; with `restart`, a fresh operator restores the state halfway. Anomalies, late
    /// rows and scores.
    fn run(spec: &SeriesSpec, rows: &[Row], size: usize, restart: bool) -> [Vec<Score>; 3] {
        let dir = std::env::temp_dir().join(format!(
            "floe-anomaly-{}-{}-{}-{}-{}",
            std::process::id(),
            rows.len(),
            size,
            restart,
            spec.measures.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut op = SeriesOperator::new(spec.clone(), &input()).unwrap();
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        let mut clock = i64::MIN;
        let chunks = rows.len().div_ceil(size);
        for (i, chunk) in rows.chunks(size).enumerate() {
            if restart && i == chunks / 2 {
                op = SeriesOperator::new(spec.clone(), &input()).unwrap();
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                op.on_restore(0, &mut ctx).unwrap();
            }
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            op.on_batch(&batch(chunk), &mut ctx).unwrap();
            clock = chunk.iter().map(|r| r.0).fold(clock, i64::max);
            op.on_event_clock(0, clock, &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty());
            scores(emitted, &mut out);
        }
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_event_clock(0, clock + 86_400 * S, &mut ctx).unwrap();
        scores(ctx.finish().0, &mut out);
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        }
    }

    /// `minutes` of requests, two a second per service, up to 20 s out of order: latency
    /// 50–150 ms, 0.5 % errors. `checkout` is three times slower in minutes 90–94; `search`
    /// fails 30 % of its requests in minutes 100–104.
    fn requests(minutes: i64) -> Vec<Row> {
        let mut next = lcg(11);
        let mut out = Vec::new();
        let mut clock: Option<i64> = None;
        for i in 0..minutes * 60 * 2 {
            let nominal = T0 + i * S / 2;
            let minute = (nominal - T0) / MINUTE;
            for service in ["checkout", "search"] {
                let t = nominal - (next() % 20) as i64 * S;
                let slow = service == "checkout" && (90..95).contains(&minute);
                let failing = service == "search" && (100..105).contains(&minute);
                let error = i32::from(next() % 1000 < if failing { 300 } else { 5 });
                let mut ms = 50.0 + (next() % 100) as f64;
                if slow {
                    ms *= 3.0;
                }
                out.push((t, service, error, ms, clock));
                clock = Some(clock.map_or(t, |c| c.max(t)));
            }
        }
        out
    }

    fn service_spec() -> SeriesSpec {
        spec(
            &[
                ("latency_p99", "quantile(value, 0.99)"),
                ("error_rate", "ratio(error)"),
            ],
            AnomalySettings {
                min_count: 20,
                direction: Direction::Up,
                ..DEFAULTS
            },
        )
    }

    #[test]
    fn a_slow_service_and_a_failing_one_are_flagged_whatever_the_batching() {
        let rows = requests(130);
        let spec = service_spec();
        let out = run(&spec, &rows, 700, false);
        let flagged: Vec<(i64, &str, &str)> = out[0]
            .iter()
            .map(|(m, s, measure, _, _)| (*m, s.as_str(), measure.as_str()))
            .collect();
        // The slowdown's first minute and the failures' first minute are flagged.
        assert!(
            flagged.contains(&(90, "checkout", "latency_p99")),
            "{flagged:?}"
        );
        assert!(
            flagged.contains(&(100, "search", "error_rate")),
            "{flagged:?}"
        );
        // Nothing outside the incidents (rows come up to 20 s early, so an incident's rows
        // reach into the minute before it).
        for (m, s, measure) in &flagged {
            let incident = (*s == "checkout" && *measure == "latency_p99" && (89..95).contains(m))
                || (*s == "search" && *measure == "error_rate" && (99..105).contains(m));
            assert!(incident, "a false anomaly: {m} {s} {measure}");
        }
        // Scores start after the warm-up: 30 learned minutes of each measure.
        let first = out[2].iter().map(|s| s.0).min().unwrap();
        assert!(first >= 30, "scored from minute {first}");
        // The same rows whatever the batching, across a restore.
        let sorted = |rows: &[Score]| {
            let mut rows = rows.to_vec();
            rows.sort();
            rows
        };
        for (size, restart) in [(97, false), (2500, true), (331, true)] {
            let again = run(&spec, &rows, size, restart);
            assert_eq!(
                sorted(&again[0]),
                sorted(&out[0]),
                "anomalies, {size} {restart}"
            );
            assert_eq!(
                sorted(&again[2]),
                sorted(&out[2]),
                "scores, {size} {restart}"
            );
            assert_eq!(again[1].len(), out[1].len(), "late rows, {size} {restart}");
        }
    }

    /// `rows` rolled up per (minute, service, endpoint) as a window's final output holds them
    /// — `requests`, `errors`, the latency sketch `value_sketch` — three endpoints per
    /// service, read back from an exchange by service: the batches of each minute, in order,
    /// with the exchange's row clocks, and the producer's frontier after each.
    fn rollup(rows: &[Row]) -> (StreamSpec, Vec<(RecordBatch, i64)>) {
        use floe_sketch::QuantileSketch;
        let mut per: BTreeMap<(i64, &str, usize), (i64, i64, QuantileSketch)> = BTreeMap::new();
        for (i, r) in rows.iter().enumerate() {
            let cell = per
                .entry((r.0.div_euclid(MINUTE), r.1, i % 3))
                .or_insert_with(|| (0, 0, QuantileSketch::new()));
            cell.0 += 1;
            cell.1 += i64::from(r.2);
            cell.2.add(r.3).unwrap();
        }
        let sketch_type = floe_sketch::quantile::data_type();
        let schema = Arc::new(Schema::new(vec![
            Field::new("window_start", timestamp(), false),
            Field::new("service_name", DataType::Utf8, false),
            Field::new("span_name", DataType::Utf8, false),
            Field::new("requests", DataType::Int64, false),
            Field::new("errors", DataType::Int64, false),
            Field::new("value_sketch", sketch_type, true),
        ]));
        let spec = StreamSpec {
            time_column: Some("window_start".into()),
            properties: input().properties,
            ..StreamSpec::append("red", "red", iceberg_schema(&schema, &[]).unwrap())
        };
        let mut with_clock: Vec<Field> = schema.fields().iter().map(|f| (**f).clone()).collect();
        with_clock.push(Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true));
        let with_clock = Arc::new(Schema::new(with_clock));
        let minutes: std::collections::BTreeSet<i64> = per.keys().map(|k| k.0).collect();
        let mut clock: Option<i64> = None;
        let mut batches = Vec::new();
        for minute in minutes {
            let cells: Vec<_> = per.range((minute, "", 0)..(minute + 1, "", 0)).collect();
            let start = minute * MINUTE;
            let n = cells.len();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(TimestampMicrosecondArray::from(vec![start; n]).with_timezone("+00:00")),
                Arc::new(StringArray::from_iter_values(
                    cells.iter().map(|(k, _)| k.1),
                )),
                Arc::new(StringArray::from_iter_values(
                    cells.iter().map(|(k, _)| format!("endpoint-{}", k.2)),
                )),
                Arc::new(Int64Array::from_iter_values(cells.iter().map(|(_, v)| v.0))),
                Arc::new(Int64Array::from_iter_values(cells.iter().map(|(_, v)| v.1))),
                Arc::new(
                    floe_sketch::quantile::to_list_array(cells.iter().map(|(_, v)| &v.2)).unwrap(),
                ),
                Arc::new(Int64Array::from(
                    (0..n).map(|_| clock.replace(start)).collect::<Vec<_>>(),
                )),
            ];
            let batch = RecordBatch::try_new(with_clock.clone(), columns).unwrap();
            batches.push((batch, start + MINUTE));
        }
        (spec, batches)
    }

    #[test]
    fn a_rollup_s_sketches_and_counts_score_like_the_requests_they_hold() {
        let rows = requests(130);
        let raw = run(&service_spec(), &rows, 700, false);
        let (input, batches) = rollup(&rows);
        let mut spec = spec(
            &[
                ("latency_p99", "quantile(value_sketch, 0.99)"),
                ("error_rate", "ratio(errors, requests)"),
            ],
            AnomalySettings {
                min_count: 20,
                direction: Direction::Up,
                ..DEFAULTS
            },
        );
        (
            spec.time_column,
            spec.out_of_orderness,
            spec.allowed_lateness,
        ) = ("window_start".into(), 0, 0);
        let dir = std::env::temp_dir().join(format!("floe-anomaly-rollup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut op = SeriesOperator::new(spec, &input).unwrap();
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        for (batch, frontier) in batches {
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            op.on_batch(&StreamBatch::single(0, batch, 0), &mut ctx)
                .unwrap();
            op.on_event_clock(0, frontier, &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty());
            scores(emitted, &mut out);
        }
        let _ = std::fs::remove_dir_all(&dir);
        // Every minute is judged, none late, and the scores are the requests' own.
        assert!(raw[1].is_empty() && out[1].is_empty());
        assert!(out[2].len() > 150, "{} scores", out[2].len());
        let sorted = |rows: &[Score]| {
            let mut rows = rows.to_vec();
            rows.sort();
            rows
        };
        assert_eq!(sorted(&out[2]), sorted(&raw[2]));
        assert_eq!(sorted(&out[0]), sorted(&raw[0]));
        assert_eq!(
            parse_measure("e", "ratio( errors ,requests)").unwrap().kind,
            MeasureKind::RatioOf("errors".into(), "requests".into())
        );
        for text in ["ratio(a, b, c)", "ratio(a,)", "ratio(a b)", "ratio(a, b"] {
            assert!(parse_measure("e", text).is_err(), "{text}");
        }
        // A count that is not an integer is refused with the column named.
        let bad = parse_measure("e", "ratio(errors, value_sketch)").unwrap();
        let mut spec = service_spec();
        (spec.time_column, spec.measures) = ("window_start".into(), vec![bad]);
        let e = SeriesOperator::new(spec, &input).unwrap_err();
        assert!(e.contains("value_sketch"), "{e}");
    }

    /// One gauge value a minute per service: (minute, value) → rows.
    fn gauge(points: &[(i64, &'static str, f64)]) -> Vec<Row> {
        let mut clock: Option<i64> = None;
        points
            .iter()
            .map(|(m, s, v)| {
                let t = T0 + m * MINUTE + 10 * S;
                let row = (t, *s, 0, *v, clock);
                clock = Some(clock.map_or(t, |c| c.max(t)));
                row
            })
            .collect()
    }

    #[test]
    fn nan_infinities_and_counter_resets_never_raise_an_anomaly() {
        let mut next = lcg(3);
        let mut points = Vec::new();
        let mut counter = 0.0;
        for m in 0..120 {
            // A gauge with noise, NaN in minute 60 and ±∞ in 61–62.
            let v = match m {
                60 => f64::NAN,
                61 => f64::INFINITY,
                62 => f64::NEG_INFINITY,
                _ => 100.0 + (next() % 10) as f64,
            };
            points.push((m, "gauge", v));
            // A counter growing ~100 a minute that resets to 0 at minute 70 and 95.
            counter = if m == 70 || m == 95 {
                (next() % 10) as f64
            } else {
                counter + 95.0 + (next() % 10) as f64
            };
            points.push((m, "counter", counter));
        }
        let rows = gauge(&points);
        let spec = spec(
            &[("v", "avg(value)"), ("rate", "increase(value)")],
            DEFAULTS,
        );
        let out = run(&spec, &rows, 13, false);
        assert!(
            out[0].iter().all(|s| s.1 != "counter" || s.2 != "rate"),
            "{:?}",
            out[0]
        );
        let gauge_flags: Vec<_> = out[0]
            .iter()
            .filter(|s| s.1 == "gauge" && s.2 == "v")
            .collect();
        assert!(gauge_flags.is_empty(), "{gauge_flags:?}");
        // The reset minutes are not scored; the counter's other minutes are.
        let rate_minutes: Vec<i64> = out[2]
            .iter()
            .filter(|s| s.1 == "counter" && s.2 == "rate")
            .map(|s| s.0)
            .collect();
        assert!(!rate_minutes.contains(&70) && !rate_minutes.contains(&95));
        assert!(rate_minutes.contains(&71) && rate_minutes.contains(&119));
        // The non-finite minutes are not scored.
        let v_minutes: Vec<i64> = out[2]
            .iter()
            .filter(|s| s.1 == "gauge" && s.2 == "v")
            .map(|s| s.0)
            .collect();
        assert!(!v_minutes.contains(&60) && !v_minutes.contains(&61) && v_minutes.contains(&63));
        // A step of the gauge far outside its noise is flagged, once warmed up.
        let mut stepped = points.clone();
        stepped.push((120, "gauge", 400.0));
        let out = run(&spec, &gauge(&stepped), 13, false);
        assert!(
            out[0].iter().any(|s| s.0 == 120 && s.1 == "gauge"),
            "{:?}",
            out[0]
        );
    }

    #[test]
    fn a_series_that_stops_is_forgotten_and_warms_up_again() {
        let mut next = lcg(5);
        let mut points = Vec::new();
        for m in (0..40).chain(200..240) {
            points.push((m, "gauge", 10.0 + (next() % 3) as f64));
        }
        // A second series keeps the clock going meanwhile.
        for m in 0..240 {
            points.push((m, "other", 5.0));
        }
        points.sort_by_key(|p| p.0);
        let settings = AnomalySettings {
            ttl_minutes: 60,
            ..DEFAULTS
        };
        let spec = spec(&[("v", "avg(value)")], settings);
        let out = run(&spec, &gauge(&points), 17, false);
        let scored: Vec<i64> = out[2]
            .iter()
            .filter(|s| s.1 == "gauge")
            .map(|s| s.0)
            .collect();
        // Scored minutes 30–39, then after the return only once warmed up again (230–239).
        let expected: Vec<i64> = (30..40).chain(230..240).collect();
        assert_eq!(scored, expected);
        // The same when the clock jumps past the ttl in one step.
        let out = run(&spec, &gauge(&points), 10_000, false);
        let scored: Vec<i64> = out[2]
            .iter()
            .filter(|s| s.1 == "gauge")
            .map(|s| s.0)
            .collect();
        assert_eq!(scored, expected);
    }

    #[test]
    fn a_gauge_heading_for_its_threshold_is_forecast_through_the_operator() {
        // A pool filling 1 point a minute from 20 (80.5 minutes to 100.5), a steady one at 50.
        let mut points = Vec::new();
        for m in 0..70 {
            points.push((m, "filling", 20.0 + m as f64));
            points.push((m, "steady", 50.0 + (m % 3) as f64));
        }
        let model = Model::Forecast(ForecastSettings {
            threshold: 100.5,
            horizon_minutes: 25,
            ..crate::forecast::DEFAULTS
        });
        let spec = judged_by(&[("used", "max(value)")], model);
        let out = run(&spec, &gauge(&points), 11, false);
        // Rows from the warm-up's end (15 minutes) for both series.
        assert_eq!(out[2].iter().filter(|s| s.1 == "filling").count(), 70 - 15);
        // Forecast once under 25 minutes left: from minute 56 (100.5 − 76 = 24.5 left).
        let forecast: Vec<i64> = out[0]
            .iter()
            .map(|s| {
                assert_eq!(s.1, "filling");
                s.0
            })
            .collect();
        assert_eq!(forecast, (56..70).collect::<Vec<_>>(), "{:?}", out[0]);
        // The time left is the distance at the trend's pace.
        let last = out[2]
            .iter()
            .find(|s| s.0 == 69 && s.1 == "filling")
            .unwrap();
        assert!((last.4 as f64 / 1e6 - 11.5).abs() < 0.5, "{last:?}");
    }

    #[test]
    fn a_map_key_is_one_series_whatever_its_attributes_order() {
        use arrow_array::builder::{MapBuilder, StringBuilder};
        let mut maps = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        for pairs in [
            vec![("host", Some("a")), ("disk", Some("sda"))],
            vec![("disk", Some("sda")), ("host", Some("a"))],
            vec![("host", None)],
        ] {
            for (k, v) in pairs {
                maps.keys().append_value(k);
                maps.values().append_option(v);
            }
            maps.append(true).unwrap();
        }
        maps.append(false).unwrap();
        let rows =
            RecordBatch::try_from_iter([("attributes", Arc::new(maps.finish()) as ArrayRef)])
                .unwrap();
        let keys = key_strings(&rows, "attributes").unwrap();
        let got: Vec<&str> = (0..keys.len()).map(|r| keys.value(r)).collect();
        assert_eq!(got, vec!["disk=sda,host=a", "disk=sda,host=a", "host=", ""]);
    }
}
