//! Anomalies: per series and measure, a robust online baseline, and every final minute that
//! departs from it by more than `threshold` deviations.
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
//! | `increase(c)` | how much a cumulative counter `c` grew since the series' previous minute, per minute |
//!
//! NaN and infinite values are skipped like nulls (they never reach a baseline). A minute
//! with fewer than `min_count` values of a measure is neither scored nor learned. A counter
//! that went down (a reset: the minute's smallest value is below the last one seen) is
//! neither scored nor learned that minute; its next minute counts from the value after the
//! reset.
//!
//! **Baseline** (per series and measure) — exponentially weighted mean and variance, Holt–
//! Winters style with an additive offset per hour of day:
//!
//! * expected = level + the hour of day's offset; the offsets are learned from the series'
//!   second day on, each minute moving its hour's offset [`SEASON_WEIGHT`] of the way to the
//!   minute's (clipped) departure from the level, while the level learns what the offset
//!   does not explain — an hour that is busy every day is expected after a few days;
//! * deviation = √(max(variance, (`min_deviation` × |expected|)², `min_delta`²) + binomial),
//!   where binomial = p(1 − p)/n for a `ratio` over n rows (p smoothed towards ½ by one row
//!   each way), else 0; score = (observed − expected) / deviation;
//! * a minute learns with weight max(`alpha`, 1/(minutes learned + 1)) — an exact mean and
//!   variance over the first minutes, then exponential forgetting; after `warmup` minutes its
//!   residual is clipped to ±[`CLIP`] deviations first, so one outlier moves the baseline
//!   little while a lasting shift is adopted within tens of minutes.
//!
//! Scores are emitted from the `warmup`-th learned minute on: every scored minute to the
//! scores stream (`<output>_scores`), and those with |score| ≥ `threshold` in `direction`
//! (`up`, `down` or `both`) to the anomalies stream. Rows later than the minute's
//! evaluation go to the late stream.
//!
//! **State** (per partition, beside the minutes' window): `0x40 series` → the series' first
//! and last minute and each measure's baseline (≈ 40 bytes per measure, plus 24 × 6 bytes of
//! offsets from its second day on, when seasonality is on). A series without values for
//! `ttl` is forgotten (an expiry timer per series, re-armed lazily) and starts its warm-up
//! again when it comes back — also when its minute arrives before the timer fired, so the
//! outcome never depends on how the clock advanced.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::{StreamBatch, StreamSpec};

use crate::aggregate::{AggKind, Aggregate, parse_aggregate};
use crate::codec::{Reader, Writer, float_at, integer_at};
use crate::minutes::{
    Closed, MINUTE, Minutes, RequestColumns, checked_input, inner_rows, late_input_rows, strings_of,
};
use crate::timers::EXPIRY;
use crate::window::{event_times, iceberg_schema, late_stream, timestamp};
use crate::{Context, OpError, OpResult, Operator, OperatorStats};

/// Residuals are clipped to this many deviations before a warmed-up baseline learns them.
pub const CLIP: f64 = 3.0;

/// The weight of a minute in its hour of day's offset: an hour's offset moves 95 % of the way
/// to what it saw in one day (60 minutes), averaging about its last 20 minutes.
pub const SEASON_WEIGHT: f64 = 0.05;

/// Minutes in a day: offsets are learned from a series' second day on.
const DAY_MINUTES: i64 = 1440;

/// What a measure computes per minute.
#[derive(Debug, Clone, PartialEq)]
pub enum MeasureKind {
    /// `count()`, `sum`, `min`, `max`, `avg` or `quantile` of the minute's values.
    Aggregate(AggKind),
    /// The share of rows whose column is non-zero.
    Ratio(String),
    /// A cumulative counter's growth per minute.
    Increase(String),
}

impl MeasureKind {
    /// The input column, if any.
    pub fn column(&self) -> Option<&str> {
        match self {
            Self::Aggregate(a) => a.column(),
            Self::Ratio(c) | Self::Increase(c) => Some(c),
        }
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

/// Parses a measure: an aggregate ([`parse_aggregate`] but `count_distinct`), `ratio(c)` or
/// `increase(c)`.
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
    let kind = if trimmed.starts_with("ratio(") {
        MeasureKind::Ratio(single("ratio(").ok_or_else(|| format!("{text:?}: ratio(column)"))?)
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
                     quantile(col, 0.99), ratio(col) (the share of rows where col is non-zero) \
                     or increase(col) (a cumulative counter's growth per minute)"
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

/// Which departures are anomalies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Above the baseline only (latency, errors).
    Up,
    /// Below only (throughput, free space).
    Down,
    /// Either way.
    Both,
}

impl Direction {
    /// Parses `up`, `down` or `both`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "up" => Some(Self::Up),
            "down" => Some(Self::Down),
            "both" => Some(Self::Both),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Down => "down",
            Self::Both => "both",
        }
    }

    fn flags(self, score: f64, threshold: f64) -> bool {
        match self {
            Self::Up => score >= threshold,
            Self::Down => score <= -threshold,
            Self::Both => score.abs() >= threshold,
        }
    }
}

/// How series are scored.
#[derive(Debug, Clone, PartialEq)]
pub struct AnomalySettings {
    /// |score| at or above this is an anomaly.
    pub threshold: f64,
    /// The weight of a new minute once warmed up.
    pub alpha: f64,
    /// Minutes learned before a series is scored.
    pub warmup: u32,
    /// Values a minute needs to be scored and learned.
    pub min_count: u64,
    /// The deviation is at least this share of the expected value.
    pub min_deviation: f64,
    /// The deviation is at least this.
    pub min_delta: f64,
    /// Whether an offset per hour of day is learned.
    pub seasonality: bool,
    /// Minutes without values after which a series is forgotten.
    pub ttl_minutes: i64,
    /// Which departures are anomalies.
    pub direction: Direction,
}

/// Defaults of the settings a job file may leave out.
pub const DEFAULTS: AnomalySettings = AnomalySettings {
    threshold: 4.0,
    alpha: 0.05,
    warmup: 30,
    min_count: 1,
    min_deviation: 0.05,
    min_delta: 0.0,
    seasonality: true,
    ttl_minutes: 1440,
    direction: Direction::Both,
};

/// An `anomaly` operator as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct AnomalySpec {
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
    /// What is scored, by name.
    pub measures: Vec<Measure>,
    /// How.
    pub settings: AnomalySettings,
    /// The anomalies stream.
    pub output: String,
    /// The stream of every score.
    pub scores_output: String,
    /// The late-rows stream.
    pub late_output: String,
}

impl AnomalySpec {
    /// A digest of what the stored state depends on: the series key and the measures. The
    /// scoring settings may change: they apply from the next minute on.
    pub fn fingerprint(&self) -> String {
        let measures: Vec<String> = self
            .measures
            .iter()
            .map(|m| format!("{}={}", m.name, m.text))
            .collect();
        format!(
            "anomaly v1 time={} ooo={} lateness={} key={} measures={}",
            self.time_column,
            self.out_of_orderness,
            self.allowed_lateness,
            self.key.join(","),
            measures.join(";")
        )
    }

    /// One line for `floe validate`.
    pub fn describe(&self) -> String {
        let s = &self.settings;
        let measures: Vec<String> = self
            .measures
            .iter()
            .map(|m| format!("{} = {}", m.name, m.text))
            .collect();
        format!(
            "anomaly by {}: {} per minute; |score| ≥ {} {} after {} min (alpha {}, floor {} × \
             expected or {}, {}seasonal, forgotten after {} min)",
            self.key.join(", "),
            measures.join(", "),
            s.threshold,
            s.direction.name(),
            s.warmup,
            s.alpha,
            s.min_deviation,
            s.min_delta,
            if s.seasonality { "" } else { "not " },
            s.ttl_minutes
        )
    }
}

/// One measure's learned baseline of one series.
#[derive(Debug, Clone, PartialEq)]
struct Baseline {
    /// Minutes learned (saturating).
    learned: u32,
    level: f64,
    variance: f64,
    /// `increase`: the counter at the end of the last minute with values (NaN: none yet).
    last: f64,
    /// Empty, or an (offset, minutes learned) per hour of day.
    season: Vec<(f32, u16)>,
}

impl Default for Baseline {
    fn default() -> Self {
        Self {
            learned: 0,
            level: 0.0,
            variance: 0.0,
            last: f64::NAN,
            season: Vec::new(),
        }
    }
}

/// A minute's score against a baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scored {
    expected: f64,
    deviation: f64,
    score: f64,
}

impl Baseline {
    /// The hour of day's learned offset (0 until the series' second day).
    fn offset(&self, hour: usize) -> f64 {
        self.season
            .get(hour)
            .map_or(0.0, |&(offset, _)| f64::from(offset))
    }

    /// `observed` (from `count` values, `ratio` if a share) against the baseline.
    fn score(
        &self,
        observed: f64,
        hour: usize,
        count: u64,
        ratio: bool,
        s: &AnomalySettings,
    ) -> Scored {
        let expected = self.level + self.offset(hour);
        let floor = (s.min_deviation * expected.abs()).max(s.min_delta);
        let mut variance = self.variance.max(floor * floor);
        if ratio && count > 0 {
            let n = count as f64;
            let p = ((expected * n + 1.0) / (n + 2.0)).clamp(0.0, 1.0);
            variance += p * (1.0 - p) / n;
        }
        let deviation = variance.sqrt().max(f64::MIN_POSITIVE);
        Scored {
            expected,
            deviation,
            score: (observed - expected) / deviation,
        }
    }

    /// Learns `observed`, scored as `scored`; `seasonal`: the hour's offset learns too.
    fn learn(
        &mut self,
        observed: f64,
        hour: usize,
        scored: Scored,
        seasonal: bool,
        s: &AnomalySettings,
    ) {
        let mut residual = observed - scored.expected;
        if self.learned >= s.warmup {
            let clip = CLIP * scored.deviation;
            residual = residual.clamp(-clip, clip);
        }
        let weight = s.alpha.max(1.0 / (f64::from(self.learned) + 1.0));
        if self.learned == 0 {
            self.level = observed - self.offset(hour);
        } else {
            self.level += weight * residual;
            self.variance = (1.0 - weight) * (self.variance + weight * residual * residual);
        }
        if seasonal {
            if self.season.is_empty() {
                self.season = vec![(0.0, 0); 24];
            }
            // The hour's departure from the (updated) level, clipped like the residual.
            let target = scored.expected + residual - self.level;
            let (offset, n) = &mut self.season[hour];
            *offset += (SEASON_WEIGHT * (target - f64::from(*offset))) as f32;
            *n = n.saturating_add(1);
        }
        self.learned = self.learned.saturating_add(1);
    }

    fn encode(&self, w: &mut Writer) {
        w.varint(u64::from(self.learned));
        w.f64(self.level);
        w.f64(self.variance);
        w.f64(self.last);
        w.u8(self.season.len() as u8);
        for (offset, n) in &self.season {
            w.0.extend_from_slice(&offset.to_le_bytes());
            w.0.extend_from_slice(&n.to_le_bytes());
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let learned = r.varint()?.min(u64::from(u32::MAX)) as u32;
        let (level, variance, last) = (r.f64()?, r.f64()?, r.f64()?);
        let slots = r.u8()? as usize;
        let mut season = Vec::with_capacity(slots);
        for _ in 0..slots {
            let b = r.take(6)?;
            season.push((
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u16::from_le_bytes([b[4], b[5]]),
            ));
        }
        Ok(Self {
            learned,
            level,
            variance,
            last,
            season,
        })
    }
}

/// A series' state: its first and last minute with values and a baseline per measure.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    first: i64,
    last: i64,
    baselines: Vec<Baseline>,
}

impl Series {
    fn new(minute: i64, measures: usize) -> Self {
        Self {
            first: minute,
            last: minute,
            baselines: vec![Baseline::default(); measures],
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(16 + 40 * self.baselines.len()));
        w.zigzag(self.first);
        w.zigzag(self.last);
        for b in &self.baselines {
            b.encode(&mut w);
        }
        w.0
    }

    fn decode(bytes: &[u8], measures: usize) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let first = r.zigzag()?;
        let last = r.zigzag()?;
        let baselines = (0..measures)
            .map(|_| Baseline::decode(&mut r))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            first,
            last,
            baselines,
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

/// The output streams' columns after the key columns.
const SCORE_COLUMNS: [(&str, bool); 7] = [
    ("measure", false),
    ("observed", false),
    ("expected", false),
    ("deviation", false),
    ("score", false),
    ("direction", false),
    ("values", false),
];

/// The `anomaly` operator.
pub struct Anomaly {
    spec: AnomalySpec,
    outputs: Vec<StreamSpec>,
    scores: SchemaRef,
    /// The input's own columns (an exchange adds the source clock after them).
    input: SchemaRef,
    minutes: Minutes,
    /// Per partition: no expiry timer is earlier than this.
    expiry_floor: HashMap<u32, i64>,
    late_rows: u64,
}

impl std::fmt::Debug for Anomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anomaly")
            .field("id", &self.spec.id)
            .finish_non_exhaustive()
    }
}

/// The inner column holding measure `i`'s values.
fn value_column(i: usize) -> String {
    format!("__m{i}")
}

impl Anomaly {
    /// An `anomaly` operator over `input`; `Err` says what is wrong with the configuration.
    pub fn new(spec: AnomalySpec, input: &StreamSpec) -> Result<Self, String> {
        if spec.key.is_empty() {
            return Err("an anomaly operator needs a `key`: the columns naming a series".into());
        }
        let (arrow, time_type) = checked_input(
            input,
            &spec.key,
            "scoring a series",
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
        {
            if arrow.field_with_name(column).is_err() {
                return Err(format!("stream {} has no column {column}", input.name));
            }
        }
        for m in &spec.measures {
            let Some(column) = m.kind.column() else {
                continue;
            };
            let ty = arrow
                .field_with_name(column)
                .expect("checked")
                .data_type()
                .clone();
            let ok = match m.kind {
                MeasureKind::Ratio(_) => ty.is_integer() || ty == DataType::Boolean,
                _ => ty.is_numeric(),
            };
            if !ok {
                return Err(format!(
                    "measure {}: column {column} is {ty}, not a number",
                    m.name
                ));
            }
        }
        let mut inner = vec![Field::new(&spec.time_column, time_type, false)];
        for k in &spec.key {
            inner.push(Field::new(k, DataType::Utf8, false));
        }
        let mut aggregates = Vec::new();
        let agg = |name: String, kind| Aggregate { name, kind };
        for (i, m) in spec.measures.iter().enumerate() {
            let column = value_column(i);
            let n = format!("m{i}_n");
            match &m.kind {
                MeasureKind::Aggregate(AggKind::Count) => {
                    aggregates.push(agg(n, AggKind::Count));
                    continue;
                }
                MeasureKind::Aggregate(kind) => {
                    let kind = match kind {
                        AggKind::Sum(_) => AggKind::Sum(column.clone()),
                        AggKind::Min(_) => AggKind::Min(column.clone()),
                        AggKind::Max(_) => AggKind::Max(column.clone()),
                        AggKind::Avg(_) => AggKind::Avg(column.clone()),
                        AggKind::Quantile(_, q) => AggKind::Quantile(column.clone(), *q),
                        AggKind::CountColumn(_) => AggKind::CountColumn(column.clone()),
                        other => {
                            return Err(format!("measure {}: {other:?} is not scored", m.name));
                        }
                    };
                    aggregates.push(agg(format!("m{i}"), kind));
                    inner.push(Field::new(&column, DataType::Float64, true));
                }
                MeasureKind::Ratio(_) => {
                    aggregates.push(agg(format!("m{i}_hits"), AggKind::Sum(column.clone())));
                    inner.push(Field::new(&column, DataType::Int64, true));
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
        for (name, nullable) in SCORE_COLUMNS {
            let ty = match name {
                "measure" | "direction" => DataType::Utf8,
                "values" => DataType::Int64,
                _ => DataType::Float64,
            };
            fields.push(Field::new(name, ty, nullable));
        }
        let scores = Schema::new(fields);
        let stream = |name: &str| -> Result<StreamSpec, String> {
            Ok(StreamSpec {
                name: name.to_string(),
                table: name.to_string(),
                schema: Some(iceberg_schema(&scores, &[])?),
                changelog: false,
                key: Vec::new(),
                time_column: Some("window_start".into()),
                partition: vec![("window_start".into(), iceberg::spec::Transform::Day)],
                bloom_filter_columns: Vec::new(),
                plain_columns: Vec::new(),
                properties: Vec::new(),
            })
        };
        let outputs = vec![
            stream(&spec.output)?,
            late_stream(input, &arrow, &spec.late_output)?,
            stream(&spec.scores_output)?,
        ];
        Ok(Self {
            outputs,
            scores: Arc::new(scores),
            input: arrow,
            minutes,
            expiry_floor: HashMap::new(),
            late_rows: 0,
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
            let strings = strings_of(rows, k).map_err(|e| self.invalid(e))?;
            // A missing key value is the empty string: such rows still form a series.
            let filled: arrow_array::StringArray = (0..strings.len())
                .map(|r| {
                    Some(if strings.is_null(r) {
                        ""
                    } else {
                        strings.value(r)
                    })
                })
                .collect();
            let filled: ArrayRef = Arc::new(filled);
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
            let values: ArrayRef = match m.kind {
                MeasureKind::Ratio(_) => {
                    let ints = crate::minutes::integers_of(
                        &RecordBatch::try_from_iter([("c", source)])
                            .map_err(|e| self.invalid(e.to_string()))?,
                        "c",
                    )
                    .map_err(|e| self.invalid(e))?;
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

    /// Scores the minutes closed, then forgets series past their ttl and sends late rows aside.
    fn evaluate_closed(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        input: Option<&RecordBatch>,
        closed: Closed,
    ) -> OpResult<()> {
        // series key → minute → (values per measure: observed and count, or none)
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
                        column(format!("m{i}_n")),
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
                            count: n
                                .as_ref()
                                .and_then(|a| integer_at(a.as_ref(), r))
                                .unwrap_or(0)
                                .max(0) as u64,
                        }
                    })
                    .collect();
                closing
                    .entry(series_key(&values))
                    .or_default()
                    .insert(minute, measured);
            }
        }
        let mut out = ScoreRows::new(self.spec.key.len());
        let mut anomalies = ScoreRows::new(self.spec.key.len());
        if !closing.is_empty() {
            let keys: Vec<&[u8]> = closing.keys().map(Vec::as_slice).collect();
            let stored = ctx.get_many(p, &keys)?;
            let measures = self.spec.measures.len();
            let mut updates: Vec<(Vec<u8>, Series, bool)> = Vec::with_capacity(closing.len());
            for ((key, minutes), stored) in closing.into_iter().zip(stored) {
                let mut series = match stored {
                    Some(bytes) => {
                        Some(Series::decode(&bytes, measures).map_err(|e| self.invalid(e))?)
                    }
                    None => None,
                };
                let values =
                    series_values(&key, self.spec.key.len()).map_err(|e| self.invalid(e))?;
                let mut new = series.is_none();
                for (minute, measured) in minutes {
                    let s = match &mut series {
                        // Past its ttl: forgotten, whether or not its timer fired yet.
                        Some(s) if minute - s.last > self.spec.settings.ttl_minutes => {
                            *s = Series::new(minute, measures);
                            new = true;
                            s
                        }
                        Some(s) => s,
                        None => series.insert(Series::new(minute, measures)),
                    };
                    self.score_minute(s, minute, &values, &measured, &mut out, &mut anomalies);
                }
                updates.push((key, series.expect("scored"), new));
            }
            for (key, series, new) in updates {
                ctx.put(p, &key, &series.encode())?;
                if new {
                    let at = (series.last + self.spec.settings.ttl_minutes + 1) * MINUTE;
                    EXPIRY.register(ctx, p, at, &key)?;
                }
            }
        }
        if let Some(open) = self.minutes.open_minute(p) {
            self.expire(ctx, p, open)?;
        }
        for (output, rows) in [(0, anomalies), (2, out)] {
            if rows.rows > 0 {
                let batch = RecordBatch::try_new(self.scores.clone(), rows.finish())
                    .map_err(|e| self.invalid(format!("score rows: {e}")))?;
                ctx.emit(output, StreamBatch::single(output, batch, p));
            }
        }
        if let Some(rows) = input {
            let (id, lateness) = (&self.spec.id, self.spec.allowed_lateness);
            if let Some(batch) =
                late_input_rows(id, lateness, rows, self.input.fields().len(), closed.late)
                    .map_err(|e| self.invalid(format!("late rows: {e}")))?
            {
                self.late_rows += batch.num_rows() as u64;
                ctx.emit(1, StreamBatch::single(1, batch, p));
            }
        }
        Ok(())
    }

    /// Scores and learns one final minute of series `s`.
    fn score_minute(
        &self,
        s: &mut Series,
        minute: i64,
        key: &[String],
        measured: &[MinuteValues],
        out: &mut ScoreRows,
        anomalies: &mut ScoreRows,
    ) {
        let settings = &self.spec.settings;
        let hour = minute.rem_euclid(DAY_MINUTES) as usize / 60;
        let seasonal = settings.seasonality && minute - s.first >= DAY_MINUTES;
        let gap = (minute - s.last).max(1);
        s.last = minute;
        for ((m, values), baseline) in self
            .spec
            .measures
            .iter()
            .zip(measured)
            .zip(&mut s.baselines)
        {
            let observed = match m.kind {
                MeasureKind::Aggregate(AggKind::Count) => Some(values.count as f64),
                MeasureKind::Ratio(_) => values.value.map(|hits| hits / values.count.max(1) as f64),
                MeasureKind::Increase(_) => {
                    let (Some(max), Some(min)) = (values.value, values.min) else {
                        continue;
                    };
                    let last = std::mem::replace(&mut baseline.last, max);
                    // The first value, or a reset: nothing to compare yet.
                    if last.is_nan() || min < last {
                        continue;
                    }
                    Some((max - last) / gap as f64)
                }
                MeasureKind::Aggregate(_) => values.value,
            };
            let Some(observed) = observed.filter(|v| v.is_finite()) else {
                continue;
            };
            if values.count < settings.min_count {
                continue;
            }
            let ratio = matches!(m.kind, MeasureKind::Ratio(_));
            let scored = baseline.score(observed, hour, values.count, ratio, settings);
            if baseline.learned >= settings.warmup {
                let row = ScoreRow {
                    minute,
                    key,
                    measure: &m.name,
                    observed,
                    scored,
                    count: values.count,
                };
                out.push(&row);
                if settings.direction.flags(scored.score, settings.threshold) {
                    anomalies.push(&row);
                }
            }
            baseline.learn(observed, hour, scored, seasonal, settings);
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
        let ttl = self.spec.settings.ttl_minutes;
        for ((_, key), stored) in due.iter().zip(stored) {
            let Some(bytes) = stored else {
                continue;
            };
            let series =
                Series::decode(&bytes, self.spec.measures.len()).map_err(|e| self.invalid(e))?;
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

/// A scored minute of one series and measure.
struct ScoreRow<'a> {
    minute: i64,
    key: &'a [String],
    measure: &'a str,
    observed: f64,
    scored: Scored,
    count: u64,
}

/// Score rows being built.
struct ScoreRows {
    rows: usize,
    starts: TimestampMicrosecondBuilder,
    ends: TimestampMicrosecondBuilder,
    keys: Vec<StringBuilder>,
    measures: StringBuilder,
    observed: Float64Builder,
    expected: Float64Builder,
    deviations: Float64Builder,
    scores: Float64Builder,
    directions: StringBuilder,
    counts: Int64Builder,
}

impl ScoreRows {
    fn new(keys: usize) -> Self {
        Self {
            rows: 0,
            starts: TimestampMicrosecondBuilder::new(),
            ends: TimestampMicrosecondBuilder::new(),
            keys: (0..keys).map(|_| StringBuilder::new()).collect(),
            measures: StringBuilder::new(),
            observed: Float64Builder::new(),
            expected: Float64Builder::new(),
            deviations: Float64Builder::new(),
            scores: Float64Builder::new(),
            directions: StringBuilder::new(),
            counts: Int64Builder::new(),
        }
    }

    fn push(&mut self, row: &ScoreRow<'_>) {
        self.rows += 1;
        self.starts.append_value(row.minute * MINUTE);
        self.ends.append_value((row.minute + 1) * MINUTE);
        for (builder, value) in self.keys.iter_mut().zip(row.key) {
            builder.append_value(value);
        }
        self.measures.append_value(row.measure);
        self.observed.append_value(row.observed);
        self.expected.append_value(row.scored.expected);
        self.deviations.append_value(row.scored.deviation);
        self.scores.append_value(row.scored.score);
        self.directions.append_value(if row.scored.score >= 0.0 {
            "up"
        } else {
            "down"
        });
        self.counts.append_value(row.count as i64);
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
        out.push(Arc::new(self.expected.finish()));
        out.push(Arc::new(self.deviations.finish()));
        out.push(Arc::new(self.scores.finish()));
        out.push(Arc::new(self.directions.finish()));
        out.push(Arc::new(self.counts.finish()));
        out
    }
}

impl Operator for Anomaly {
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
        for (p, rows) in input.slices() {
            let inner = self.inner(ctx, p, &rows)?;
            let closed = self.minutes.on_rows(ctx, p, inner)?;
            self.evaluate_closed(ctx, p, Some(&rows), closed)?;
        }
        Ok(())
    }

    fn on_watermark(
        &mut self,
        partition: u32,
        watermark: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        let closed = self.minutes.on_watermark(ctx, partition, watermark)?;
        self.evaluate_closed(ctx, partition, None, closed)
    }

    fn on_event_clock(
        &mut self,
        partition: u32,
        max_time: i64,
        ctx: &mut Context<'_>,
    ) -> OpResult<()> {
        let closed = self.minutes.on_event_clock(ctx, partition, max_time)?;
        self.evaluate_closed(ctx, partition, None, closed)
    }

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        self.expiry_floor.remove(&partition);
        self.minutes.on_restore(ctx, partition)
    }

    fn forget(&mut self) {
        self.expiry_floor.clear();
        self.minutes.forget();
    }

    fn watermarks(&self) -> Vec<(u32, i64)> {
        self.minutes.watermarks()
    }

    fn fingerprint(&self) -> Option<String> {
        Some(self.spec.fingerprint())
    }

    fn stats(&self) -> OperatorStats {
        let inner = self.minutes.stats();
        OperatorStats {
            open_windows: inner.open_windows,
            late_rows: self.late_rows,
            timers: inner.timers,
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, TimestampMicrosecondType};
    use arrow_array::{StringArray, TimestampMicrosecondArray};
    use floe_core::exchange::SOURCE_CLOCK_COLUMN;
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

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

    fn spec(measures: &[(&str, &str)], settings: AnomalySettings) -> AnomalySpec {
        AnomalySpec {
            id: "anomalies".into(),
            time_column: "ts".into(),
            out_of_orderness: 5 * S,
            allowed_lateness: 30 * S,
            key: vec!["service_name".into()],
            measures: measures
                .iter()
                .map(|(n, t)| parse_measure(n, t).unwrap())
                .collect(),
            settings,
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
            let float = |n: &str, r| {
                b.column_by_name(n)
                    .unwrap()
                    .as_primitive::<Float64Type>()
                    .value(r)
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
                    (float("score", r) * 1e6).round() as i64,
                ));
            }
        }
    }

    /// Runs `rows` in chunks of `size` (the exchange's clock after each), then moves the clock
    /// a day on; with `restart`, a fresh operator restores the state halfway. Anomalies, late
    /// rows and scores.
    fn run(spec: &AnomalySpec, rows: &[Row], size: usize, restart: bool) -> [Vec<Score>; 3] {
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
        let mut op = Anomaly::new(spec.clone(), &input()).unwrap();
        let mut out = [Vec::new(), Vec::new(), Vec::new()];
        let mut clock = i64::MIN;
        let chunks = rows.len().div_ceil(size);
        for (i, chunk) in rows.chunks(size).enumerate() {
            if restart && i == chunks / 2 {
                op = Anomaly::new(spec.clone(), &input()).unwrap();
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

    fn service_spec() -> AnomalySpec {
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
    fn the_baseline_is_exact_at_first_then_forgets_and_resists_outliers() {
        let s = AnomalySettings {
            warmup: 3,
            seasonality: false,
            ..DEFAULTS
        };
        let mut b = Baseline::default();
        for x in [10.0, 12.0, 14.0] {
            let scored = b.score(x, 0, 1, false, &s);
            b.learn(x, 0, scored, false, &s);
        }
        assert!((b.level - 12.0).abs() < 1e-12, "{}", b.level);
        // Population variance of 10, 12, 14.
        assert!((b.variance - 8.0 / 3.0).abs() < 1e-12, "{}", b.variance);
        let before = b.level;
        let scored = b.score(1000.0, 0, 1, false, &s);
        assert!(scored.score > 100.0);
        b.learn(1000.0, 0, scored, false, &s);
        // Clipped to 3 deviations, weighted alpha (max(0.05, 1/4) = 0.25).
        let moved = b.level - before;
        assert!(
            (moved - 0.25 * CLIP * scored.deviation).abs() < 1e-9,
            "{moved}"
        );
        // A round trip through the state encoding.
        let mut w = Writer(Vec::new());
        b.season = vec![(1.5, 7); 24];
        b.last = 5.0;
        b.encode(&mut w);
        assert_eq!(Baseline::decode(&mut Reader(&w.0)).unwrap(), b);
    }

    #[test]
    fn an_hour_that_is_always_busy_is_expected_once_learned() {
        // Day after day, the hour 03:00–04:00 UTC runs at 200 instead of 100.
        let s = AnomalySettings {
            seasonality: true,
            ..DEFAULTS
        };
        let mut series = Series::new(0, 1);
        let mut next = lcg(9);
        let mut last_busy_score = f64::NAN;
        for minute in 0..5 * DAY_MINUTES {
            let hour = (minute.rem_euclid(DAY_MINUTES) / 60) as usize;
            let x = if hour == 3 { 200.0 } else { 100.0 } + (next() % 5) as f64;
            let seasonal = minute - series.first >= DAY_MINUTES;
            let b = &mut series.baselines[0];
            let scored = b.score(x, hour, 1, false, &s);
            if hour == 3 && minute % 60 == 0 {
                last_busy_score = scored.score;
            }
            b.learn(x, hour, scored, seasonal, &s);
        }
        // On day five the busy hour's first minute is expected.
        assert!(last_busy_score.abs() < s.threshold, "{last_busy_score}");
    }
}
