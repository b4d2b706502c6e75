//! `alerts`: per-minute facts become alerts with a lifecycle, grouped by root cause, with the
//! ranked root-cause candidates in each (ADR 0010).
//!
//! **Input.** A `union` of streams final per minute (SLO status, deploy verdicts, anomalies,
//! forecasts, anomaly scores, the service map's final edges) read back from an exchange with
//! `partitions = 1`: every fact of the job meets in one partition. Each row names its stream
//! in the union's `stream` column.
//!
//! **Facts.** Per minute of event time, final once the input's clock passed it (plus
//! `allowed_lateness`), three kinds are gathered:
//! * a **rule** holds for (rule, key) in a minute when a row of the rule's `stream` in that
//!   minute meets its `when` (SQL; every row when absent). Rows of sparse streams (anomalies)
//!   exist only when something happened, so a rule is false in a minute without rows;
//! * the **health** of a service per measure: the largest score of the `health` stream's rows
//!   (anomaly scores: deviations from the service's own baseline, per `measure`);
//! * the **service map**: caller → callee from the `topology` stream's rows.
//!
//! **Lifecycle**, per (rule, key), evaluated once per minute in event time (Prometheus'
//! semantics): a holding rule is *pending*; after holding `for` consecutively it *fires*
//! (`for = "0m"`: the first minute); a pending rule that stops holding is dropped (flap
//! damping); a firing alert that stops holding keeps firing `keep_firing_for`, then
//! *resolves*. One open alert per (rule, key). Each transition is one row of the output.
//!
//! **Context.** When an alert fires, the service map is walked down from its service
//! (`service` column of the rule's rows), through callees seen in the last `topology_window`
//! whose health reached `root_cause_score` in the last `root_cause_window` — in the measure the
//! alert is about (the rule's `measure`: an error-rate alert follows rising error rates, not a
//! latency blip elsewhere), or in any measure when the rule names none; the services reached
//! that way, deepest first (then by score), are its root-cause candidates.
//!
//! **Alert context.** A firing alert also carries what a person opens first, for its service
//! over the last `root_cause_window`:
//! * exemplar trace ids from the `exemplars` stream, whose rows hold `max_by` picks per
//!   service and minute: `slowest_trace_id` (by `slowest_trace_id_by`, the duration) and
//!   `failed_trace_id` (by `failed_trace_id_by`); the largest pick of the window wins;
//! * the most frequent error messages from the `messages` stream (`message`, `count` per
//!   service and minute; partial rows of one minute add up; the message `''` is none): the
//!   `top_messages` largest sums, of at most ten kept per service and minute.
//!
//! **Grouping and suppression** (Alertmanager's grouping and inhibition): alerts whose first
//! candidate is the same service form one group while any of them fires; the first to fire
//! leads it and the others are `suppressed` (recorded, with `suppressed_by` naming the leader:
//! one incident notifies once). An alert that fires again within `suppress_for` after it
//! resolved is suppressed the same way, by its earlier self.
//!
//! **Determinism.** Facts are aggregated per (minute, kind, key) by a one-minute window
//! (order-independent: max and sum), minutes are evaluated in order, alerts in (rule, key)
//! order, so the output depends only on the facts, not on batching or restarts.
//!
//! **State** (partition 0 of the one-partition input): the window's facts, and `0x50` → the
//! stage: the next minute to evaluate, open alerts, groups, recent health and edges.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, ListBuilder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{Array, ArrayRef, Float64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use floe_core::exchange::is_one_partition;
use floe_core::{StreamBatch, StreamSpec};

use crate::aggregate::{AggKind, Aggregate};
use crate::codec::{Reader, Writer, float_at, integer_at};
use crate::minutes::{
    Closed, MINUTE, Minutes, ROW_COLUMN, inner_rows, per_minute_hooks, strings_of,
};
use crate::sql::Expressions;
use crate::union::STREAM_COLUMN;
use crate::window::{event_times, final_stream, iceberg_schema, late_stream, timestamp};
use crate::{Context, OpError, OpResult, Operator};

/// A condition that raises alerts.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Unique among the operator's rules.
    pub name: String,
    /// The union's input whose rows it reads.
    pub stream: String,
    /// SQL condition on those rows (`None`: every row).
    pub when: Option<String>,
    /// Columns naming one alert of the rule.
    pub key: Vec<String>,
    /// The column naming the service an alert is about.
    pub service: String,
    /// SQL expression of the value shown (`None`: no value).
    pub value: Option<String>,
    /// SQL expression of the health measure root causes are followed by (`None`: any).
    pub measure: Option<String>,
    /// A label for routing (`page`, `ticket`, …).
    pub severity: String,
    /// Minutes the rule must hold before the alert fires (0 and 1: at once).
    pub for_minutes: i64,
    /// Minutes an alert keeps firing after the rule stops holding.
    pub keep_firing_minutes: i64,
}

/// How an `alerts` operator works.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertsSpec {
    /// Its id.
    pub id: String,
    /// The input's event-time column.
    pub time_column: String,
    /// The input's allowed disorder (µs).
    pub out_of_orderness: i64,
    /// How long after a minute ends facts of it are still taken (µs).
    pub allowed_lateness: i64,
    /// Its rules.
    pub rules: Vec<Rule>,
    /// The union's input with the service map (`caller_service`, `callee_service`).
    pub topology: Option<String>,
    /// The union's input with health scores (`service_column`, `measure`, `score`).
    pub health: Option<String>,
    /// The health stream's service column.
    pub service_column: String,
    /// A service whose score reached this is a root-cause candidate.
    pub root_cause_score: f64,
    /// Minutes of health looked at when an alert fires.
    pub root_cause_minutes: i64,
    /// Minutes an edge of the service map is remembered.
    pub topology_minutes: i64,
    /// The union's input with exemplar trace ids (`max_by` picks, see the module docs).
    pub exemplars: Option<String>,
    /// The union's input with error messages (`message`, `count`).
    pub messages: Option<String>,
    /// Error messages a firing alert lists.
    pub top_messages: usize,
    /// Minutes after resolving in which the same alert firing again is suppressed.
    pub suppress_minutes: i64,
    /// The output stream (one row per transition).
    pub output: String,
    /// The stream of facts later than `allowed_lateness`.
    pub late_output: String,
}

/// Defaults of an `alerts` operator's settings.
pub const DEFAULT_FOR_MINUTES: i64 = 2;
/// See [`DEFAULT_FOR_MINUTES`].
pub const DEFAULT_KEEP_FIRING_MINUTES: i64 = 5;
/// See [`DEFAULT_FOR_MINUTES`].
pub const DEFAULT_SUPPRESS_MINUTES: i64 = 30;
/// See [`DEFAULT_FOR_MINUTES`].
pub const DEFAULT_ROOT_CAUSE_SCORE: f64 = 3.0;
/// See [`DEFAULT_FOR_MINUTES`].
pub const DEFAULT_ROOT_CAUSE_MINUTES: i64 = 5;
/// See [`DEFAULT_FOR_MINUTES`].
pub const DEFAULT_TOPOLOGY_MINUTES: i64 = 15;
/// See [`DEFAULT_FOR_MINUTES`].
pub const DEFAULT_TOP_MESSAGES: usize = 3;
/// Error messages kept per service and minute.
const KEPT_MESSAGES: usize = 10;
/// The exemplar picks an `exemplars` stream may hold, as output columns.
const EXEMPLARS: [&str; 2] = ["slowest_trace_id", "failed_trace_id"];

impl AlertsSpec {
    /// A digest of what its state depends on.
    pub fn fingerprint(&self) -> String {
        format!(
            "alerts v2 on {} lateness {}",
            self.time_column, self.allowed_lateness
        )
    }

    /// One line for `floe validate`.
    pub fn describe(&self) -> String {
        let rules: Vec<String> = self
            .rules
            .iter()
            .map(|r| {
                format!(
                    "{} on {}{} by {} (for {}m, keep {}m)",
                    r.name,
                    r.stream,
                    r.when
                        .as_deref()
                        .map(|w| format!(" where {w}"))
                        .unwrap_or_default(),
                    if r.key.is_empty() {
                        "-".into()
                    } else {
                        r.key.join(", ")
                    },
                    r.for_minutes,
                    r.keep_firing_minutes
                )
            })
            .collect();
        format!(
            "alerts on {}: {}; root causes from {} over {} (score ≥ {}, {}m), suppress {}m",
            self.time_column,
            rules.join("; "),
            self.health.as_deref().unwrap_or("no health"),
            self.topology.as_deref().unwrap_or("no service map"),
            self.root_cause_score,
            self.root_cause_minutes,
            self.suppress_minutes
        )
    }
}

/// Fact kinds, as the inner window's `fact` column holds them.
const RULE: &str = "r";
const HEALTH: &str = "h";
const EDGE: &str = "e";
const EXEMPLAR: &str = "x";
const MESSAGE: &str = "m";
/// A row that is no fact: it only carries its clock.
const NONE: &str = ".";

/// The state key of the stage.
const STAGE_KEY: &[u8] = &[0x50];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending = 0,
    Firing = 1,
    Resolved = 2,
}

/// One (rule, key)'s alert.
#[derive(Debug, Clone, PartialEq)]
struct Alert {
    phase: Phase,
    service: String,
    /// The health measure its root causes follow ("": any).
    measure: String,
    /// First minute of the current run of holding minutes.
    since: i64,
    /// Last minute the rule held.
    last: i64,
    /// The minute it fired (firing or resolved).
    fired: i64,
    /// The minute it resolved last, or `i64::MIN`.
    resolved: i64,
    value: Option<f64>,
    peak: Option<f64>,
    /// Its id once fired (resolved: the id it had).
    id: String,
    /// Its group's root service and id.
    root: String,
    group: String,
}

/// A group of firing alerts sharing a first root-cause candidate.
#[derive(Debug, Clone, PartialEq)]
struct Group {
    id: String,
    members: u32,
}

/// Everything the operator remembers.
#[derive(Debug, Clone, Default, PartialEq)]
struct Stage {
    /// The next minute to evaluate.
    next: Option<i64>,
    /// (rule index, key) → alert.
    alerts: BTreeMap<(u32, String), Alert>,
    /// Root service → group.
    groups: BTreeMap<String, Group>,
    /// (service, measure) → (minute, score) of recent minutes, oldest first.
    health: BTreeMap<(String, String), VecDeque<(i64, f64)>>,
    /// (caller, callee) → the last minute seen.
    edges: BTreeMap<(String, String), i64>,
    /// (service, exemplar) → (minute, by, trace id) of recent minutes, oldest first.
    exemplars: BTreeMap<(String, String), VecDeque<Pick>>,
    /// Service → (minute, its most frequent messages with counts) of recent minutes.
    messages: BTreeMap<String, VecDeque<(i64, Counts)>>,
}

/// A minute's exemplar: (minute, what it was picked by, trace id).
type Pick = (i64, f64, String);
/// Messages with their counts.
type Counts = Vec<(String, f64)>;

fn put_str(w: &mut Writer, s: &str) {
    w.short_bytes(s.as_bytes());
}

fn get_str(r: &mut Reader<'_>) -> Result<String, String> {
    String::from_utf8(r.short_bytes()?.to_vec()).map_err(|e| e.to_string())
}

fn put_opt(w: &mut Writer, v: Option<f64>) {
    match v {
        Some(v) => {
            w.u8(1);
            w.f64(v);
        }
        None => w.u8(0),
    }
}

fn get_opt(r: &mut Reader<'_>) -> Result<Option<f64>, String> {
    Ok(match r.u8()? {
        0 => None,
        _ => Some(r.f64()?),
    })
}

impl Stage {
    /// 3 added the context; a stage of version 2 is read with none.
    const VERSION: u8 = 3;

    fn encode(&self) -> Vec<u8> {
        let mut w = Writer(vec![Self::VERSION]);
        match self.next {
            Some(n) => {
                w.u8(1);
                w.zigzag(n);
            }
            None => w.u8(0),
        }
        w.varint(self.alerts.len() as u64);
        for ((rule, key), a) in &self.alerts {
            w.varint(u64::from(*rule));
            put_str(&mut w, key);
            w.u8(a.phase as u8);
            put_str(&mut w, &a.service);
            put_str(&mut w, &a.measure);
            for t in [a.since, a.last, a.fired, a.resolved] {
                w.zigzag(t);
            }
            put_opt(&mut w, a.value);
            put_opt(&mut w, a.peak);
            for s in [&a.id, &a.root, &a.group] {
                put_str(&mut w, s);
            }
        }
        w.varint(self.groups.len() as u64);
        for (root, g) in &self.groups {
            put_str(&mut w, root);
            put_str(&mut w, &g.id);
            w.varint(u64::from(g.members));
        }
        w.varint(self.health.len() as u64);
        for ((service, measure), minutes) in &self.health {
            put_str(&mut w, service);
            put_str(&mut w, measure);
            w.varint(minutes.len() as u64);
            for (m, score) in minutes {
                w.zigzag(*m);
                w.f64(*score);
            }
        }
        w.varint(self.edges.len() as u64);
        for ((caller, callee), m) in &self.edges {
            put_str(&mut w, caller);
            put_str(&mut w, callee);
            w.zigzag(*m);
        }
        w.varint(self.exemplars.len() as u64);
        for ((service, kind), minutes) in &self.exemplars {
            put_str(&mut w, service);
            put_str(&mut w, kind);
            w.varint(minutes.len() as u64);
            for (m, by, trace) in minutes {
                w.zigzag(*m);
                w.f64(*by);
                put_str(&mut w, trace);
            }
        }
        w.varint(self.messages.len() as u64);
        for (service, minutes) in &self.messages {
            put_str(&mut w, service);
            w.varint(minutes.len() as u64);
            for (m, top) in minutes {
                w.zigzag(*m);
                w.varint(top.len() as u64);
                for (message, n) in top {
                    put_str(&mut w, message);
                    w.f64(*n);
                }
            }
        }
        w.0
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if !(2..=Self::VERSION).contains(&version) {
            return Err(format!("alert stage version {version} is unknown"));
        }
        let next = match r.u8()? {
            0 => None,
            _ => Some(r.zigzag()?),
        };
        let mut stage = Stage {
            next,
            ..Stage::default()
        };
        for _ in 0..r.varint()? {
            let rule = r.varint()? as u32;
            let key = get_str(&mut r)?;
            let phase = match r.u8()? {
                0 => Phase::Pending,
                1 => Phase::Firing,
                _ => Phase::Resolved,
            };
            let service = get_str(&mut r)?;
            let measure = get_str(&mut r)?;
            let [since, last, fired, resolved] =
                [r.zigzag()?, r.zigzag()?, r.zigzag()?, r.zigzag()?];
            let (value, peak) = (get_opt(&mut r)?, get_opt(&mut r)?);
            let (id, root, group) = (get_str(&mut r)?, get_str(&mut r)?, get_str(&mut r)?);
            stage.alerts.insert(
                (rule, key),
                Alert {
                    phase,
                    service,
                    measure,
                    since,
                    last,
                    fired,
                    resolved,
                    value,
                    peak,
                    id,
                    root,
                    group,
                },
            );
        }
        for _ in 0..r.varint()? {
            let root = get_str(&mut r)?;
            let id = get_str(&mut r)?;
            let members = r.varint()? as u32;
            stage.groups.insert(root, Group { id, members });
        }
        for _ in 0..r.varint()? {
            let service = get_str(&mut r)?;
            let measure = get_str(&mut r)?;
            let mut minutes = VecDeque::new();
            for _ in 0..r.varint()? {
                minutes.push_back((r.zigzag()?, r.f64()?));
            }
            stage.health.insert((service, measure), minutes);
        }
        for _ in 0..r.varint()? {
            let caller = get_str(&mut r)?;
            let callee = get_str(&mut r)?;
            stage.edges.insert((caller, callee), r.zigzag()?);
        }
        if version < 3 {
            return Ok(stage);
        }
        for _ in 0..r.varint()? {
            let key = (get_str(&mut r)?, get_str(&mut r)?);
            let mut minutes = VecDeque::new();
            for _ in 0..r.varint()? {
                minutes.push_back((r.zigzag()?, r.f64()?, get_str(&mut r)?));
            }
            stage.exemplars.insert(key, minutes);
        }
        for _ in 0..r.varint()? {
            let service = get_str(&mut r)?;
            let mut minutes = VecDeque::new();
            for _ in 0..r.varint()? {
                let m = r.zigzag()?;
                let mut top = Vec::new();
                for _ in 0..r.varint()? {
                    top.push((get_str(&mut r)?, r.f64()?));
                }
                minutes.push_back((m, top));
            }
            stage.messages.insert(service, minutes);
        }
        Ok(stage)
    }
}

/// A fact of an input row: (row, kind, two key values, value).
type FactRow = (u32, &'static str, String, String, Option<f64>);

/// The facts of one minute.
#[derive(Debug, Default)]
struct MinuteFacts {
    /// (rule index, key) → (service, health measure, value).
    holding: BTreeMap<(u32, String), (String, String, Option<f64>)>,
    /// (service, measure) → its largest score.
    health: BTreeMap<(String, String), f64>,
    /// (caller, callee).
    edges: BTreeSet<(String, String)>,
    /// (service, exemplar) → the largest (by, trace id).
    exemplars: BTreeMap<(String, String), (f64, String)>,
    /// (service, message) → its count.
    messages: BTreeMap<(String, String), f64>,
}

/// What a firing alert shows of its service: exemplar traces and frequent error messages.
#[derive(Debug, Clone, Default, PartialEq)]
struct AlertContext {
    /// Per [`EXEMPLARS`] entry: the pick of the window, if any.
    exemplars: [Option<String>; 2],
    /// The most frequent messages with their counts, most frequent first.
    messages: Vec<(String, f64)>,
}

/// A root-cause candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The service.
    pub service: String,
    /// Calls between the alerting service and it.
    pub depth: usize,
    /// Its largest health score in the window looked at.
    pub score: f64,
}

/// One transition, as the output holds it.
struct Transition {
    minute: i64,
    rule: u32,
    key: String,
    alert: Alert,
    suppressed_by: Option<String>,
    candidates: Vec<Candidate>,
    context: AlertContext,
}

/// An `alerts` operator.
pub struct Alerts {
    spec: AlertsSpec,
    outputs: Vec<StreamSpec>,
    input: SchemaRef,
    rows: SchemaRef,
    /// Per rule: its key columns, its service, its value, where its condition holds.
    rules: Vec<Expressions>,
    health: Option<Expressions>,
    topology: Option<Expressions>,
    /// The exemplar picks the stream has (indexes into [`EXEMPLARS`]), and their columns.
    exemplars: Option<(Vec<usize>, Expressions)>,
    messages: Option<Expressions>,
    minutes: Minutes,
    stages: HashMap<u32, Stage>,
}

impl std::fmt::Debug for Alerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alerts")
            .field("id", &self.spec.id)
            .finish_non_exhaustive()
    }
}

/// `'text'` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `"name"` as an SQL identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The output's columns.
fn output_schema() -> Schema {
    let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
    Schema::new(vec![
        Field::new("window_start", timestamp(), false),
        Field::new("window_end", timestamp(), false),
        text("alert_id", false),
        text("rule", false),
        text("severity", false),
        text("key", false),
        text("service_name", false),
        text("state", false),
        Field::new("started_at", timestamp(), false),
        Field::new("fired_at", timestamp(), false),
        Field::new("resolved_at", timestamp(), true),
        Field::new("value", DataType::Float64, true),
        Field::new("peak", DataType::Float64, true),
        text("group_id", false),
        Field::new("suppressed", DataType::Boolean, false),
        text("suppressed_by", true),
        text("root_cause", false),
        Field::new(
            "root_causes",
            DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
            false,
        ),
        text("summary", false),
        text("slowest_trace_id", true),
        text("failed_trace_id", true),
        Field::new(
            "top_errors",
            DataType::List(Arc::new(Field::new("element", DataType::Utf8, true))),
            false,
        ),
    ])
}

impl Alerts {
    /// The operator over `input`; `Err` says what is wrong with the configuration.
    pub fn new(spec: AlertsSpec, input: &StreamSpec) -> Result<Self, String> {
        if input.changelog {
            return Err(format!(
                "stream {} is a changelog; alerts read a union of facts",
                input.name
            ));
        }
        if !is_one_partition(input) {
            return Err(format!(
                "stream {} is not in one partition: alerts need every fact in one place, so \
                 read a union of facts through an exchange with partitions = 1 (ADR 0010)",
                input.name
            ));
        }
        if input.time_column.as_deref() != Some(spec.time_column.as_str()) {
            return Err(format!(
                "stream {} is timed by {:?}, not {}",
                input.name, input.time_column, spec.time_column
            ));
        }
        let iceberg = input
            .schema
            .as_ref()
            .ok_or_else(|| format!("the columns of stream {} are not known yet", input.name))?;
        let arrow: SchemaRef =
            Arc::new(iceberg::arrow::schema_to_arrow_schema(iceberg).map_err(|e| e.to_string())?);
        if arrow.field_with_name(STREAM_COLUMN).is_err() {
            return Err(format!(
                "stream {} has no column {STREAM_COLUMN}: alerts read a union of facts (kind = \
                 \"union\") through a one-partition exchange",
                input.name
            ));
        }
        let streams = crate::union::final_streams(input);
        let known = |name: &str, what: &str| -> Result<(), String> {
            if streams.is_empty() || streams.iter().any(|s| s == name) {
                Ok(())
            } else {
                Err(format!(
                    "{what} reads stream {name}, which is not one of the union's inputs ({})",
                    streams.join(", ")
                ))
            }
        };
        let of_stream = |stream: &str, when: Option<&str>| {
            let mut p = format!("{} = {}", ident(STREAM_COLUMN), literal(stream));
            if let Some(w) = when {
                p.push_str(&format!(" AND ({w})"));
            }
            p
        };
        let mut rules = Vec::new();
        for rule in &spec.rules {
            known(&rule.stream, &format!("rule {}", rule.name))?;
            let mut columns: Vec<String> = rule
                .key
                .iter()
                .enumerate()
                .map(|(i, k)| format!("{} AS __k{i}", ident(k)))
                .collect();
            columns.push(format!("{} AS __service", ident(&rule.service)));
            columns.push(match &rule.value {
                Some(v) => format!("CAST(({v}) AS DOUBLE) AS __value"),
                None => "CAST(NULL AS DOUBLE) AS __value".into(),
            });
            columns.push(match &rule.measure {
                Some(m) => format!("CAST(({m}) AS VARCHAR) AS __measure"),
                None => "CAST('' AS VARCHAR) AS __measure".into(),
            });
            let e = Expressions::new(
                &arrow,
                &columns,
                Some(&of_stream(&rule.stream, rule.when.as_deref())),
            )
            .map_err(|e| format!("rule {}: {e}", rule.name))?;
            rules.push(e);
        }
        let health = match &spec.health {
            Some(stream) => {
                known(stream, "health")?;
                let measure = if arrow.field_with_name("measure").is_ok() {
                    "CAST(measure AS VARCHAR)"
                } else {
                    "CAST('' AS VARCHAR)"
                };
                let columns = [
                    ident(&spec.service_column),
                    "CAST(score AS DOUBLE)".into(),
                    measure.to_string(),
                ];
                Some(
                    Expressions::new(&arrow, &columns, Some(&of_stream(stream, None)))
                        .map_err(|e| format!("health {stream}: {e}"))?,
                )
            }
            None => None,
        };
        let topology = match &spec.topology {
            Some(stream) => {
                known(stream, "topology")?;
                let columns = ["caller_service".to_string(), "callee_service".to_string()];
                Some(
                    Expressions::new(&arrow, &columns, Some(&of_stream(stream, None)))
                        .map_err(|e| format!("topology {stream}: {e}"))?,
                )
            }
            None => None,
        };
        let exemplars = match &spec.exemplars {
            Some(stream) => {
                known(stream, "exemplars")?;
                let picks: Vec<usize> = (0..EXEMPLARS.len())
                    .filter(|&i| {
                        arrow.field_with_name(EXEMPLARS[i]).is_ok()
                            && arrow
                                .field_with_name(&format!("{}_by", EXEMPLARS[i]))
                                .is_ok()
                    })
                    .collect();
                if picks.is_empty() {
                    return Err(format!(
                        "exemplars {stream}: no column {} with its {}_by (a window's \
                         `{} = \"max_by(trace_id, duration_ns)\"`)",
                        EXEMPLARS.join(" or "),
                        EXEMPLARS[0],
                        EXEMPLARS[0]
                    ));
                }
                let mut columns = vec![format!("CAST({} AS VARCHAR)", ident(&spec.service_column))];
                for &i in &picks {
                    columns.push(format!("CAST({} AS VARCHAR)", ident(EXEMPLARS[i])));
                    columns.push(format!(
                        "CAST({} AS DOUBLE)",
                        ident(&format!("{}_by", EXEMPLARS[i]))
                    ));
                }
                let e = Expressions::new(&arrow, &columns, Some(&of_stream(stream, None)))
                    .map_err(|e| format!("exemplars {stream}: {e}"))?;
                Some((picks, e))
            }
            None => None,
        };
        let messages = match &spec.messages {
            Some(stream) => {
                known(stream, "messages")?;
                let columns = [
                    format!("CAST({} AS VARCHAR)", ident(&spec.service_column)),
                    "CAST(message AS VARCHAR)".to_string(),
                    "CAST(\"count\" AS DOUBLE)".to_string(),
                ];
                Some(
                    Expressions::new(&arrow, &columns, Some(&of_stream(stream, None)))
                        .map_err(|e| format!("messages {stream} (message, count): {e}"))?,
                )
            }
            None => None,
        };
        let time_type = arrow
            .field_with_name(&spec.time_column)
            .map_err(|_| format!("stream {} has no column {}", input.name, spec.time_column))?
            .data_type()
            .clone();
        let text = |n: &str| Field::new(n, DataType::Utf8, false);
        let inner = Schema::new(vec![
            Field::new(&spec.time_column, time_type, false),
            text("fact"),
            text("a"),
            text("b"),
            Field::new("value", DataType::Float64, true),
            Field::new(ROW_COLUMN, DataType::Int64, false),
        ]);
        // The clock comes from the input's producers, not its rows: an exchange's clocks, or
        // in one pipeline the producers' frontiers (the runtime's `derived_clocks`).
        let clocked = StreamSpec {
            properties: [
                floe_core::exchange::exchanged_property(input),
                vec![(
                    floe_core::exchange::EXCHANGED_FROM.to_string(),
                    spec.id.clone(),
                )],
            ]
            .concat(),
            ..input.clone()
        };
        let minutes = Minutes::new(
            &spec.id,
            &inner,
            &clocked,
            (spec.out_of_orderness, spec.allowed_lateness),
            vec!["fact".into(), "a".into(), "b".into()],
            vec![
                Aggregate {
                    name: "value".into(),
                    kind: AggKind::Max("value".into()),
                },
                // Message counts of one minute come in partial rows: they add up.
                Aggregate {
                    name: "total".into(),
                    kind: AggKind::Sum("value".into()),
                },
            ],
        )?;
        let rows = output_schema();
        let outputs = vec![
            final_stream(
                &spec.output,
                iceberg_schema(&rows, &[])?,
                "window_start",
                input,
            ),
            late_stream(input, &arrow, &spec.late_output)?,
        ];
        Ok(Self {
            spec,
            outputs,
            input: arrow,
            rows: Arc::new(rows),
            rules,
            health,
            topology,
            exemplars,
            messages,
            minutes,
            stages: HashMap::new(),
        })
    }

    fn invalid(&self, message: impl Into<String>) -> OpError {
        OpError::Invalid {
            operator: self.spec.id.clone(),
            message: message.into(),
        }
    }

    /// The facts of `rows` for the minutes: time, kind, two key values, value, row. Rows
    /// without a time are dead-lettered.
    fn facts(
        &self,
        ctx: &mut Context<'_>,
        p: u32,
        rows: &RecordBatch,
    ) -> OpResult<Option<RecordBatch>> {
        let times = event_times(rows, &self.spec.time_column).map_err(|e| self.invalid(e))?;
        let mut out: Vec<FactRow> = Vec::new();
        let mut matched = vec![false; rows.num_rows()];
        let text = |a: &ArrayRef| -> OpResult<StringArray> {
            let batch = RecordBatch::try_from_iter([("c", a.clone())])
                .map_err(|e| self.invalid(e.to_string()))?;
            strings_of(&batch, "c").map_err(|e| self.invalid(e))
        };
        let value_of = |s: &StringArray, r: usize| {
            if s.is_null(r) {
                String::new()
            } else {
                s.value(r).to_string()
            }
        };
        for (i, (rule, e)) in self.spec.rules.iter().zip(&self.rules).enumerate() {
            let (at, columns) = e.evaluate(rows).map_err(|e| self.invalid(e))?;
            let keys: Vec<StringArray> = columns[..rule.key.len()]
                .iter()
                .map(text)
                .collect::<Result<_, _>>()?;
            let service = text(&columns[rule.key.len()])?;
            let values = &columns[rule.key.len() + 1];
            let measures = text(&columns[rule.key.len() + 2])?;
            for (j, row) in at.iter().enumerate() {
                matched[*row as usize] = true;
                let key: Vec<String> = rule
                    .key
                    .iter()
                    .zip(&keys)
                    .map(|(k, a)| format!("{k}={}", value_of(a, j)))
                    .collect();
                // The rule's index and key, and its service, in the two key columns.
                out.push((
                    *row,
                    RULE,
                    format!(
                        "{i:04}\u{1f}{}\u{1f}{}",
                        value_of(&measures, j),
                        key.join(",")
                    ),
                    value_of(&service, j),
                    float_at(values.as_ref(), j).filter(|v| v.is_finite()),
                ));
            }
        }
        if let Some(e) = &self.health {
            let (at, columns) = e.evaluate(rows).map_err(|e| self.invalid(e))?;
            let (service, measure) = (text(&columns[0])?, text(&columns[2])?);
            for (j, row) in at.iter().enumerate() {
                matched[*row as usize] = true;
                let score = float_at(columns[1].as_ref(), j).filter(|v| v.is_finite());
                if score.is_some() {
                    let (a, b) = (value_of(&service, j), value_of(&measure, j));
                    out.push((*row, HEALTH, a, b, score));
                }
            }
        }
        if let Some(e) = &self.topology {
            let (at, columns) = e.evaluate(rows).map_err(|e| self.invalid(e))?;
            let (callers, callees) = (text(&columns[0])?, text(&columns[1])?);
            for (j, row) in at.iter().enumerate() {
                matched[*row as usize] = true;
                let (a, b) = (value_of(&callers, j), value_of(&callees, j));
                if a != b && !a.is_empty() && !b.is_empty() {
                    out.push((*row, EDGE, a, b, None));
                }
            }
        }
        if let Some((picks, e)) = &self.exemplars {
            let (at, columns) = e.evaluate(rows).map_err(|e| self.invalid(e))?;
            let service = text(&columns[0])?;
            for (n, &pick) in picks.iter().enumerate() {
                let traces = text(&columns[1 + 2 * n])?;
                let by = &columns[2 + 2 * n];
                for (j, row) in at.iter().enumerate() {
                    matched[*row as usize] = true;
                    let by = float_at(by.as_ref(), j).filter(|v| v.is_finite());
                    if by.is_some() && !traces.is_null(j) {
                        let b = format!("{}\u{1f}{}", EXEMPLARS[pick], traces.value(j));
                        out.push((*row, EXEMPLAR, value_of(&service, j), b, by));
                    }
                }
            }
        }
        if let Some(e) = &self.messages {
            let (at, columns) = e.evaluate(rows).map_err(|e| self.invalid(e))?;
            let (service, message) = (text(&columns[0])?, text(&columns[1])?);
            for (j, row) in at.iter().enumerate() {
                matched[*row as usize] = true;
                let count = float_at(columns[2].as_ref(), j).filter(|v| v.is_finite() && *v > 0.0);
                // '' is no message: rows of it only carry the clock.
                if count.is_some() && !message.is_null(j) && !message.value(j).is_empty() {
                    let (a, b) = (value_of(&service, j), value_of(&message, j));
                    out.push((*row, MESSAGE, a, b, count));
                }
            }
        }
        for (row, m) in matched.iter().enumerate() {
            if !m {
                out.push((row as u32, NONE, String::new(), String::new(), None));
            }
        }
        // Rows without a time are dead letters, once.
        let mut dead = vec![false; rows.num_rows()];
        out.retain(|(row, ..)| {
            let r = *row as usize;
            if times[r].is_some() {
                return true;
            }
            if !dead[r] {
                dead[r] = true;
                let reason = format!(
                    "operator {}: no {} value",
                    self.spec.id, self.spec.time_column
                );
                ctx.dead_letter(p, reason, rows, r);
            }
            false
        });
        if out.is_empty() {
            return Ok(None);
        }
        // In the input's order: the window's clock moves with the rows.
        out.sort_by_key(|f| f.0);
        let take: Vec<u32> = out.iter().map(|f| f.0).collect();
        let column = |f: for<'a> fn(&'a FactRow) -> &'a str| {
            Arc::new(out.iter().map(|o| Some(f(o))).collect::<StringArray>()) as ArrayRef
        };
        let columns = vec![
            (Field::new("fact", DataType::Utf8, false), column(|o| o.1)),
            (
                Field::new("a", DataType::Utf8, false),
                column(|o| o.2.as_str()),
            ),
            (
                Field::new("b", DataType::Utf8, false),
                column(|o| o.3.as_str()),
            ),
            (
                Field::new("value", DataType::Float64, true),
                Arc::new(out.iter().map(|o| o.4).collect::<Float64Array>()) as ArrayRef,
            ),
        ];
        inner_rows(rows, &self.spec.time_column, take, columns)
            .map(Some)
            .map_err(|e| self.invalid(format!("fact rows: {e}")))
    }

    /// The closed minutes' facts, by minute.
    fn gather(&self, closed: &Closed) -> OpResult<BTreeMap<i64, MinuteFacts>> {
        let mut facts: BTreeMap<i64, MinuteFacts> = BTreeMap::new();
        for b in &closed.rows {
            let starts = b.column_by_name("window_start").expect("window rows");
            let [kinds, a, bs] = ["fact", "a", "b"].map(|c| strings_of(b, c));
            let (kinds, a, bs) = (
                kinds.map_err(|e| self.invalid(e))?,
                a.map_err(|e| self.invalid(e))?,
                bs.map_err(|e| self.invalid(e))?,
            );
            let values = b.column_by_name("value").expect("window rows");
            let totals = b.column_by_name("total").expect("window rows");
            for r in 0..b.num_rows() {
                let minute = integer_at(starts.as_ref(), r)
                    .unwrap_or_default()
                    .div_euclid(MINUTE);
                let f = facts.entry(minute).or_default();
                let value = float_at(values.as_ref(), r);
                match kinds.value(r) {
                    RULE => {
                        let mut parts = a.value(r).splitn(3, '\u{1f}');
                        let (Some(index), Some(measure), Some(key)) =
                            (parts.next(), parts.next(), parts.next())
                        else {
                            return Err(self.invalid("a rule fact without its rule"));
                        };
                        let index: u32 = index
                            .parse()
                            .map_err(|_| self.invalid("a rule fact without its rule"))?;
                        f.holding.insert(
                            (index, key.to_string()),
                            (bs.value(r).to_string(), measure.to_string(), value),
                        );
                    }
                    HEALTH => {
                        if let Some(v) = value {
                            let key = (a.value(r).to_string(), bs.value(r).to_string());
                            f.health.insert(key, v);
                        }
                    }
                    EDGE => {
                        f.edges
                            .insert((a.value(r).to_string(), bs.value(r).to_string()));
                    }
                    EXEMPLAR => {
                        let (Some((kind, trace)), Some(by)) =
                            (bs.value(r).split_once('\u{1f}'), value)
                        else {
                            return Err(self.invalid("an exemplar fact without its pick"));
                        };
                        let pick = (by, trace.to_string());
                        let best = f
                            .exemplars
                            .entry((a.value(r).to_string(), kind.to_string()))
                            .or_insert_with(|| pick.clone());
                        if (pick.0, &pick.1) > (best.0, &best.1) {
                            *best = pick;
                        }
                    }
                    MESSAGE => {
                        if let Some(n) = float_at(totals.as_ref(), r) {
                            let key = (a.value(r).to_string(), bs.value(r).to_string());
                            *f.messages.entry(key).or_default() += n;
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(facts)
    }

    /// Evaluates every minute the clock of `p` finished, then sends late facts aside.
    fn advance(
        &mut self,
        ctx: &mut Context<'_>,
        p: u32,
        input: Option<&RecordBatch>,
        closed: Closed,
    ) -> OpResult<()> {
        let mut facts = self.gather(&closed)?;
        if !self.stages.contains_key(&p) {
            let stage = match ctx.get(p, STAGE_KEY)? {
                Some(bytes) => Stage::decode(&bytes).map_err(|e| self.invalid(e))?,
                None => Stage::default(),
            };
            self.stages.insert(p, stage);
        }
        let open = self.minutes.open_minute(p);
        let mut stage = self.stages.remove(&p).expect("loaded");
        let before = stage.clone();
        let mut transitions = Vec::new();
        if let Some(open) = open {
            let mut m = match (stage.next, facts.keys().next()) {
                (Some(n), _) => n,
                (None, Some(first)) => *first,
                (None, None) => open,
            };
            if let Some(first) = facts.keys().next()
                && *first < m
            {
                self.stages.insert(p, before);
                return Err(self.invalid(format!(
                    "facts of minute {first} came after it was evaluated (next {m})"
                )));
            }
            while m < open {
                if stage.alerts.is_empty() && !facts.contains_key(&m) {
                    // Nothing can change in minutes without facts or alerts.
                    m = facts.keys().next().copied().unwrap_or(open).min(open);
                    continue;
                }
                let minute = facts.remove(&m).unwrap_or_default();
                self.evaluate(&mut stage, m, minute, &mut transitions);
                m += 1;
            }
            stage.next = Some(open.max(m));
        }
        if stage != before {
            ctx.put(p, STAGE_KEY, &stage.encode())?;
        }
        self.stages.insert(p, stage);
        if !transitions.is_empty() {
            let batch = self.output_rows(&transitions)?;
            ctx.emit(0, StreamBatch::single(0, batch, p));
        }
        if let Some(rows) = input {
            let width = self.input.fields().len();
            self.minutes
                .emit_late(ctx, p, (rows, width), closed.late)
                .map_err(|e| self.invalid(format!("late rows: {e}")))?;
        }
        Ok(())
    }

    /// Evaluates minute `m` of `stage` with its facts.
    fn evaluate(&self, stage: &mut Stage, m: i64, facts: MinuteFacts, out: &mut Vec<Transition>) {
        let spec = &self.spec;
        for (series, score) in facts.health {
            let recent = stage.health.entry(series).or_default();
            recent.push_back((m, score));
        }
        let old = m - spec.root_cause_minutes;
        keep_after(&mut stage.health, old, |(at, _)| *at);
        for edge in facts.edges {
            stage.edges.insert(edge, m);
        }
        for ((service, kind), (by, trace)) in facts.exemplars {
            let recent = stage.exemplars.entry((service, kind)).or_default();
            recent.push_back((m, by, trace));
        }
        let mut by_service: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
        for ((service, message), n) in facts.messages {
            by_service.entry(service).or_default().push((message, n));
        }
        for (service, counts) in by_service {
            let top = most_frequent(counts, KEPT_MESSAGES);
            stage
                .messages
                .entry(service)
                .or_default()
                .push_back((m, top));
        }
        keep_after(&mut stage.exemplars, old, |(at, ..)| *at);
        keep_after(&mut stage.messages, old, |(at, _)| *at);
        stage
            .edges
            .retain(|_, last| *last > m - spec.topology_minutes);

        let mut firing_now: Vec<(u32, String)> = Vec::new();
        // Rules holding this minute.
        for ((rule, key), (service, measure, value)) in &facts.holding {
            let Some(r) = spec.rules.get(*rule as usize) else {
                continue;
            };
            let a = stage
                .alerts
                .entry((*rule, key.clone()))
                .or_insert_with(|| Alert {
                    phase: Phase::Resolved,
                    service: service.clone(),
                    measure: measure.clone(),
                    since: m,
                    last: m - 1,
                    fired: i64::MIN,
                    resolved: i64::MIN,
                    value: None,
                    peak: None,
                    id: String::new(),
                    root: String::new(),
                    group: String::new(),
                });
            a.value = *value;
            match a.phase {
                Phase::Firing => {
                    a.peak = max_of(a.peak, *value);
                }
                Phase::Pending | Phase::Resolved => {
                    if a.phase == Phase::Resolved || a.last != m - 1 {
                        a.phase = Phase::Pending;
                        a.since = m;
                        a.peak = *value;
                        a.service = service.clone();
                        a.measure = measure.clone();
                    } else {
                        a.peak = max_of(a.peak, *value);
                    }
                    if m - a.since + 1 >= r.for_minutes.max(1) {
                        firing_now.push((*rule, key.clone()));
                    }
                }
            }
            a.last = m;
        }
        // Rules not holding: pending alerts are dropped, firing ones resolve after their
        // keep-firing time, resolved ones are forgotten after the suppression window.
        let mut gone = Vec::new();
        for ((rule, key), a) in stage.alerts.iter_mut() {
            if a.last == m {
                continue;
            }
            let r = &spec.rules[*rule as usize];
            match a.phase {
                Phase::Pending => {
                    a.phase = Phase::Resolved;
                    if a.resolved == i64::MIN {
                        gone.push((*rule, key.clone()));
                    }
                }
                Phase::Firing if m - a.last > r.keep_firing_minutes => {
                    a.phase = Phase::Resolved;
                    a.resolved = m;
                    if let Some(g) = stage.groups.get_mut(&a.root) {
                        g.members = g.members.saturating_sub(1);
                        if g.members == 0 {
                            stage.groups.remove(&a.root);
                        }
                    }
                    out.push(Transition {
                        minute: m,
                        rule: *rule,
                        key: key.clone(),
                        alert: a.clone(),
                        suppressed_by: None,
                        candidates: Vec::new(),
                        context: AlertContext::default(),
                    });
                }
                Phase::Resolved if m - a.resolved > spec.suppress_minutes => {
                    gone.push((*rule, key.clone()));
                }
                _ => {}
            }
        }
        for k in gone {
            stage.alerts.remove(&k);
        }
        // Alerts firing this minute: those at their own root cause lead their groups.
        let mut fired: Vec<(bool, u32, String, Vec<Candidate>)> = firing_now
            .into_iter()
            .map(|(rule, key)| {
                let a = &stage.alerts[&(rule, key.clone())];
                let service = &a.service;
                let candidates = self.root_causes(stage, (service, &a.measure), m);
                let at_root = candidates.first().is_none_or(|c| &c.service == service);
                (!at_root, rule, key, candidates)
            })
            .collect();
        fired.sort_by(|x, y| (x.0, x.1, &x.2).cmp(&(y.0, y.1, &y.2)));
        for (_, rule, key, candidates) in fired {
            let a = stage.alerts.get_mut(&(rule, key.clone())).expect("holding");
            let earlier = (a.resolved != i64::MIN && m - a.resolved <= spec.suppress_minutes)
                .then(|| a.id.clone());
            a.phase = Phase::Firing;
            a.fired = m;
            a.id = format!(
                "{}/{}@{}",
                spec.rules[rule as usize].name,
                key,
                minute_text(m)
            );
            a.root = candidates
                .first()
                .map_or_else(|| a.service.clone(), |c| c.service.clone());
            let suppressed_by = match stage.groups.get_mut(&a.root) {
                Some(g) => {
                    g.members += 1;
                    a.group = g.id.clone();
                    Some(g.id.clone())
                }
                None => {
                    stage.groups.insert(
                        a.root.clone(),
                        Group {
                            id: a.id.clone(),
                            members: 1,
                        },
                    );
                    a.group = a.id.clone();
                    earlier
                }
            };
            let alert = a.clone();
            out.push(Transition {
                minute: m,
                rule,
                key,
                context: self.context(stage, &alert.service),
                alert,
                suppressed_by,
                candidates,
            });
        }
    }

    /// The context of an alert on `service` from the recent minutes `stage` holds.
    fn context(&self, stage: &Stage, service: &str) -> AlertContext {
        let mut context = AlertContext::default();
        for (i, kind) in EXEMPLARS.iter().enumerate() {
            let key = (service.to_string(), kind.to_string());
            context.exemplars[i] = stage.exemplars.get(&key).and_then(|recent| {
                recent
                    .iter()
                    .max_by(|x, y| floe_core::rollup::pick_order((x.1, &x.2), (y.1, &y.2)))
                    .map(|(_, _, trace)| trace.clone())
            });
        }
        let mut counts: BTreeMap<&str, f64> = BTreeMap::new();
        for (_, top) in stage.messages.get(service).into_iter().flatten() {
            for (message, n) in top {
                *counts.entry(message).or_default() += n;
            }
        }
        let counts = counts
            .into_iter()
            .map(|(m, n)| (m.to_string(), n))
            .collect();
        context.messages = most_frequent(counts, self.spec.top_messages);
        context
    }

    /// The root-cause candidates of an alert on `service` about health `measure` ("": any)
    /// in minute `m`, best first.
    fn root_causes(
        &self,
        stage: &Stage,
        (service, measure): (&str, &str),
        m: i64,
    ) -> Vec<Candidate> {
        let threshold = self.spec.root_cause_score;
        let score = |s: &str| {
            let from = (s.to_string(), String::new());
            stage
                .health
                .range(from..)
                .take_while(|((x, _), _)| x == s)
                .filter(|((_, k), _)| measure.is_empty() || k == measure)
                .flat_map(|(_, recent)| recent.iter())
                .filter(|(at, _)| *at <= m)
                .map(|(_, v)| *v)
                .reduce(f64::max)
                .unwrap_or(f64::NEG_INFINITY)
        };
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        seen.insert(service.to_string(), 0);
        let mut queue = VecDeque::from([service.to_string()]);
        while let Some(caller) = queue.pop_front() {
            let depth = seen[&caller];
            let from = (caller.clone(), String::new());
            for ((c, callee), _) in stage.edges.range(from..) {
                if *c != caller {
                    break;
                }
                if seen.contains_key(callee) || score(callee) < threshold {
                    continue;
                }
                seen.insert(callee.clone(), depth + 1);
                queue.push_back(callee.clone());
            }
        }
        let mut candidates: Vec<Candidate> = seen
            .into_iter()
            .map(|(service, depth)| Candidate {
                score: score(&service),
                service,
                depth,
            })
            .filter(|c| c.score >= threshold)
            .collect();
        candidates.sort_by(|x, y| {
            y.depth
                .cmp(&x.depth)
                .then(y.score.total_cmp(&x.score))
                .then(x.service.cmp(&y.service))
        });
        candidates
    }

    fn output_rows(&self, transitions: &[Transition]) -> OpResult<RecordBatch> {
        let n = transitions.len();
        let mut starts = TimestampMicrosecondBuilder::with_capacity(n);
        let mut ends = TimestampMicrosecondBuilder::with_capacity(n);
        let mut texts: Vec<StringBuilder> = (0..7).map(|_| StringBuilder::new()).collect();
        let mut started = TimestampMicrosecondBuilder::with_capacity(n);
        let mut fired = TimestampMicrosecondBuilder::with_capacity(n);
        let mut resolved = TimestampMicrosecondBuilder::with_capacity(n);
        let mut values = Float64Builder::with_capacity(n);
        let mut peaks = Float64Builder::with_capacity(n);
        let mut groups = StringBuilder::new();
        let mut suppressed = BooleanBuilder::with_capacity(n);
        let mut suppressed_by = StringBuilder::new();
        let mut root = StringBuilder::new();
        let mut roots = ListBuilder::new(StringBuilder::new()).with_field(Arc::new(Field::new(
            "element",
            DataType::Utf8,
            true,
        )));
        let mut summaries = StringBuilder::new();
        let mut exemplars = [StringBuilder::new(), StringBuilder::new()];
        let mut errors = ListBuilder::new(StringBuilder::new()).with_field(Arc::new(Field::new(
            "element",
            DataType::Utf8,
            true,
        )));
        for t in transitions {
            let rule = &self.spec.rules[t.rule as usize];
            let a = &t.alert;
            let firing = a.phase == Phase::Firing;
            starts.append_value(t.minute * MINUTE);
            ends.append_value((t.minute + 1) * MINUTE);
            let state = if firing { "firing" } else { "resolved" };
            for (b, v) in texts.iter_mut().zip([
                a.id.as_str(),
                rule.name.as_str(),
                rule.severity.as_str(),
                t.key.as_str(),
                a.service.as_str(),
                state,
            ]) {
                b.append_value(v);
            }
            started.append_value(a.since * MINUTE);
            fired.append_value(a.fired * MINUTE);
            resolved.append_option((!firing).then(|| a.resolved * MINUTE));
            values.append_option(a.value);
            peaks.append_option(a.peak);
            groups.append_value(&a.group);
            suppressed.append_value(t.suppressed_by.is_some());
            suppressed_by.append_option(t.suppressed_by.as_deref());
            root.append_value(&a.root);
            for c in &t.candidates {
                roots.values().append_value(&c.service);
            }
            roots.append(true);
            summaries.append_value(summary(rule, t));
            for (b, pick) in exemplars.iter_mut().zip(&t.context.exemplars) {
                b.append_option(pick.as_deref());
            }
            for (message, _) in &t.context.messages {
                errors.values().append_value(message);
            }
            errors.append(true);
        }
        let tz = |b: &mut TimestampMicrosecondBuilder| -> ArrayRef {
            Arc::new(b.finish().with_timezone("+00:00"))
        };
        let mut columns: Vec<ArrayRef> = vec![tz(&mut starts), tz(&mut ends)];
        for b in texts.iter_mut().take(6) {
            columns.push(Arc::new(b.finish()));
        }
        columns.extend([tz(&mut started), tz(&mut fired), tz(&mut resolved)]);
        columns.push(Arc::new(values.finish()));
        columns.push(Arc::new(peaks.finish()));
        columns.push(Arc::new(groups.finish()));
        columns.push(Arc::new(suppressed.finish()));
        columns.push(Arc::new(suppressed_by.finish()));
        columns.push(Arc::new(root.finish()));
        columns.push(Arc::new(roots.finish()));
        columns.push(Arc::new(summaries.finish()));
        for b in &mut exemplars {
            columns.push(Arc::new(b.finish()));
        }
        columns.push(Arc::new(errors.finish()));
        RecordBatch::try_new(self.rows.clone(), columns)
            .map_err(|e| self.invalid(format!("alert rows: {e}")))
    }
}

/// Drops the entries of minutes up to `old` from each series (oldest first), and series left
/// empty.
fn keep_after<K: Ord, T>(
    series: &mut BTreeMap<K, VecDeque<T>>,
    old: i64,
    minute: impl Fn(&T) -> i64,
) {
    series.retain(|_, recent| {
        while recent.front().is_some_and(|e| minute(e) <= old) {
            recent.pop_front();
        }
        !recent.is_empty()
    });
}

/// The `n` largest counts, most frequent first (ties: by message).
fn most_frequent(mut counts: Counts, n: usize) -> Counts {
    counts.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    counts.truncate(n);
    counts
}

fn max_of(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

/// `2026-12-06T10:31Z` of a minute since the epoch.
fn minute_text(m: i64) -> String {
    chrono::DateTime::from_timestamp(m * 60, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%MZ").to_string())
        .unwrap_or_else(|| m.to_string())
}

/// A line a person reads.
fn summary(rule: &Rule, t: &Transition) -> String {
    let a = &t.alert;
    let what = if t.key.is_empty() {
        format!("{} on {}", rule.name, a.service)
    } else {
        format!("{} on {} ({})", rule.name, a.service, t.key)
    };
    if a.phase != Phase::Firing {
        return format!(
            "{what} resolved after {} min",
            (a.resolved - a.fired).max(0)
        );
    }
    let mut s = match a.value {
        Some(v) => format!("{what} firing: {v:.4}"),
        None => format!("{what} firing"),
    };
    if !t.candidates.is_empty() {
        let ranked: Vec<String> = t
            .candidates
            .iter()
            .map(|c| format!("{} (depth {}, score {:.1})", c.service, c.depth, c.score))
            .collect();
        s.push_str(&format!("; root-cause candidates: {}", ranked.join(", ")));
    }
    if let Some((message, n)) = t.context.messages.first() {
        s.push_str(&format!("; top error: {message:?} ×{n}"));
    }
    if let Some(trace) = &t.context.exemplars[1] {
        s.push_str(&format!("; failed trace {trace}"));
    }
    if let Some(by) = &t.suppressed_by {
        s.push_str(&format!("; suppressed by {by}"));
    }
    s
}

impl Operator for Alerts {
    per_minute_hooks!(facts, advance);

    fn on_restore(&mut self, partition: u32, ctx: &mut Context<'_>) -> OpResult<()> {
        self.stages.remove(&partition);
        self.minutes.on_restore(ctx, partition)
    }

    fn forget(&mut self) {
        self.stages.clear();
        self.minutes.forget();
    }

    fn final_frontiers(&self) -> Vec<(u32, i64)> {
        self.minutes.frontiers()
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::TimestampMicrosecondType;
    use arrow_array::{BooleanArray, Int64Array, TimestampMicrosecondArray};
    use floe_core::exchange::{ONE_PARTITION, SOURCE_CLOCK_COLUMN};
    use floe_state::StateStore;
    use iceberg::spec::{NestedField, PrimitiveType, Type};

    use super::*;

    const S: i64 = 1_000_000;
    /// 2025-10-09T08:53:00Z, a minute's start.
    const T0: i64 = 1_759_999_980 * S;

    /// The union's columns: each fact stream fills some.
    const COLUMNS: [(&str, PrimitiveType); 13] = [
        ("window_start", PrimitiveType::Timestamptz),
        ("service_name", PrimitiveType::String),
        ("measure", PrimitiveType::String),
        ("score", PrimitiveType::Double),
        ("slo", PrimitiveType::String),
        ("page_1h", PrimitiveType::Boolean),
        ("caller_service", PrimitiveType::String),
        ("callee_service", PrimitiveType::String),
        ("stream", PrimitiveType::String),
        ("failed_trace_id", PrimitiveType::String),
        ("failed_trace_id_by", PrimitiveType::Double),
        ("message", PrimitiveType::String),
        ("count", PrimitiveType::Long),
    ];

    fn input() -> StreamSpec {
        let fields = COLUMNS
            .iter()
            .enumerate()
            .map(|(i, (n, t))| {
                Arc::new(NestedField::optional(
                    i as i32 + 1,
                    *n,
                    Type::Primitive(t.clone()),
                ))
            })
            .collect::<Vec<_>>();
        let schema = iceberg::spec::Schema::builder()
            .with_fields(fields)
            .build()
            .unwrap();
        StreamSpec {
            time_column: Some("window_start".into()),
            properties: vec![
                (ONE_PARTITION.into(), "true".into()),
                (
                    crate::union::FINAL_STREAMS.into(),
                    "anomalies,scores,slo,edges,exemplars,messages".into(),
                ),
            ],
            ..StreamSpec::append("facts", "facts", schema)
        }
    }

    fn rule(name: &str, stream: &str, when: Option<&str>, key: &[&str], hold: i64) -> Rule {
        Rule {
            name: name.into(),
            stream: stream.into(),
            when: when.map(Into::into),
            key: key.iter().map(|k| k.to_string()).collect(),
            service: "service_name".into(),
            value: (stream == "anomalies").then(|| "score".into()),
            measure: (stream == "anomalies").then(|| "measure".into()),
            severity: "page".into(),
            for_minutes: hold,
            keep_firing_minutes: 3,
        }
    }

    fn spec() -> AlertsSpec {
        AlertsSpec {
            id: "alerts".into(),
            time_column: "window_start".into(),
            out_of_orderness: 0,
            allowed_lateness: 0,
            rules: vec![
                rule("slo-burn", "slo", Some("page_1h"), &["slo"], 2),
                rule(
                    "anomaly",
                    "anomalies",
                    None,
                    &["service_name", "measure"],
                    1,
                ),
            ],
            topology: Some("edges".into()),
            health: Some("scores".into()),
            service_column: "service_name".into(),
            root_cause_score: DEFAULT_ROOT_CAUSE_SCORE,
            root_cause_minutes: DEFAULT_ROOT_CAUSE_MINUTES,
            topology_minutes: DEFAULT_TOPOLOGY_MINUTES,
            exemplars: Some("exemplars".into()),
            messages: Some("messages".into()),
            top_messages: 2,
            suppress_minutes: DEFAULT_SUPPRESS_MINUTES,
            output: "alerts".into(),
            late_output: "alerts_late".into(),
        }
    }

    /// A fact row: minute, stream, service, and the stream's values.
    #[derive(Clone)]
    struct Fact {
        minute: i64,
        stream: &'static str,
        service: &'static str,
        measure: Option<&'static str>,
        score: Option<f64>,
        slo: Option<&'static str>,
        page: Option<bool>,
        callee: Option<&'static str>,
        /// A failed trace's id and duration, or a message and its count.
        text: Option<String>,
        number: Option<f64>,
    }

    fn fact(minute: i64, stream: &'static str, service: &'static str) -> Fact {
        Fact {
            minute,
            stream,
            service,
            measure: None,
            score: None,
            slo: None,
            page: None,
            callee: None,
            text: None,
            number: None,
        }
    }

    const GRAPH: [(&str, &str); 3] = [
        ("frontend", "checkout"),
        ("checkout", "inventory"),
        ("frontend", "search"),
    ];

    /// 60 minutes: inventory fails in minutes 20–29, its errors raise checkout's and
    /// frontend's; frontend's SLO pages in 21–30; a one-minute page of search's SLO at 45
    /// (a blip); inventory fails again at 50, within the suppression window.
    fn incident() -> Vec<Fact> {
        let mut out = Vec::new();
        for m in 0..60 {
            for (caller, callee) in GRAPH {
                out.push(Fact {
                    callee: Some(callee),
                    ..fact(m, "edges", caller)
                });
            }
            for service in ["frontend", "checkout", "inventory", "search"] {
                let score = match service {
                    "inventory" if (20..30).contains(&m) || m == 50 => 9.0,
                    "checkout" if (21..29).contains(&m) => 5.0,
                    "frontend" if (21..31).contains(&m) => 4.0,
                    _ => 0.5,
                };
                out.push(Fact {
                    measure: Some("error_rate"),
                    score: Some(score),
                    ..fact(m, "scores", service)
                });
                if score >= 4.5 {
                    out.push(Fact {
                        measure: Some("error_rate"),
                        score: Some(score),
                        ..fact(m, "anomalies", service)
                    });
                }
            }
            // Exemplars: the failed trace picked per minute, longest in minute 18. Messages of
            // the failing inventory, each minute in two partial rows that add up.
            for service in ["checkout", "inventory"] {
                out.push(Fact {
                    text: Some(format!("{service}-{m}")),
                    number: Some(if m == 18 { 900.0 } else { 100.0 + m as f64 }),
                    ..fact(m, "exemplars", service)
                });
            }
            if (20..30).contains(&m) {
                for (message, n) in [("stock failed", 3), ("timeout", 4), ("stock failed", 2)] {
                    out.push(Fact {
                        text: Some(message.into()),
                        number: Some(n as f64),
                        ..fact(m, "messages", "inventory")
                    });
                }
                out.push(Fact {
                    text: Some("rare".into()),
                    number: Some(1.0),
                    ..fact(m, "messages", "inventory")
                });
            }
            for (slo, service, paging) in [
                ("frontend-availability", "frontend", (21..31).contains(&m)),
                ("search-availability", "search", m == 45),
            ] {
                out.push(Fact {
                    slo: Some(slo),
                    page: Some(paging),
                    ..fact(m, "slo", service)
                });
            }
        }
        out
    }

    fn batch(facts: &[Fact], clock: Option<i64>) -> StreamBatch {
        let mut fields: Vec<Field> = COLUMNS
            .iter()
            .map(|(n, _)| {
                let ty = match *n {
                    "window_start" => timestamp(),
                    "score" => DataType::Float64,
                    "page_1h" => DataType::Boolean,
                    "failed_trace_id_by" => DataType::Float64,
                    "count" => DataType::Int64,
                    _ => DataType::Utf8,
                };
                Field::new(*n, ty, true)
            })
            .collect();
        fields.push(Field::new(SOURCE_CLOCK_COLUMN, DataType::Int64, true));
        let texts = |f: fn(&Fact) -> Option<&'static str>| -> ArrayRef {
            Arc::new(facts.iter().map(f).collect::<StringArray>())
        };
        let of = |stream: &str| -> (ArrayRef, ArrayRef) {
            let text = facts
                .iter()
                .map(|f| f.text.as_deref().filter(|_| f.stream == stream))
                .collect::<StringArray>();
            let numbers = facts
                .iter()
                .map(|f| f.number.filter(|_| f.stream == stream));
            let numbers: ArrayRef = if stream == "messages" {
                Arc::new(numbers.map(|n| n.map(|n| n as i64)).collect::<Int64Array>())
            } else {
                Arc::new(numbers.collect::<Float64Array>())
            };
            (Arc::new(text), numbers)
        };
        let (traces, durations) = of("exemplars");
        let (messages, counts) = of("messages");
        let columns: Vec<ArrayRef> = vec![
            Arc::new(
                TimestampMicrosecondArray::from(
                    facts
                        .iter()
                        .map(|f| T0 + f.minute * MINUTE)
                        .collect::<Vec<_>>(),
                )
                .with_timezone("+00:00"),
            ),
            texts(|f| (f.stream != "edges").then_some(f.service)),
            texts(|f| f.measure),
            Arc::new(facts.iter().map(|f| f.score).collect::<Float64Array>()),
            texts(|f| f.slo),
            Arc::new(facts.iter().map(|f| f.page).collect::<BooleanArray>()),
            texts(|f| (f.stream == "edges").then_some(f.service)),
            texts(|f| f.callee),
            texts(|f| Some(f.stream)),
            traces,
            durations,
            messages,
            counts,
            Arc::new(Int64Array::from(vec![clock; facts.len()])),
        ];
        StreamBatch::single(
            0,
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap(),
            0,
        )
    }

    /// A transition: (minute, alert id, state, suppressed by, root causes).
    type Row = (i64, String, String, Option<String>, Vec<String>);
    /// Its context: failed trace, top errors.
    type Shown = (Option<String>, Vec<String>);

    fn rows(emitted: Vec<(usize, StreamBatch)>, out: &mut Vec<(Row, Shown)>) {
        for (output, b) in emitted {
            assert_eq!(
                output,
                0,
                "no late facts: {}",
                crate::render_row(&b.batch, 0)
            );
            let b = b.batch;
            let text = |n: &str| b.column_by_name(n).unwrap().as_string::<i32>().clone();
            let (ids, states, by) = (text("alert_id"), text("state"), text("suppressed_by"));
            let starts = b
                .column_by_name("window_start")
                .unwrap()
                .as_primitive::<TimestampMicrosecondType>();
            let list = |n: &str, r: usize| -> Vec<String> {
                let list = b.column_by_name(n).unwrap().as_list::<i32>().value(r);
                let list = list.as_string::<i32>();
                (0..list.len()).map(|i| list.value(i).to_string()).collect()
            };
            let failed = text("failed_trace_id");
            for r in 0..b.num_rows() {
                let row = (
                    (starts.value(r) - T0) / MINUTE,
                    ids.value(r).to_string(),
                    states.value(r).to_string(),
                    (!by.is_null(r)).then(|| by.value(r).to_string()),
                    list("root_causes", r),
                );
                let shown = (
                    (!failed.is_null(r)).then(|| failed.value(r).to_string()),
                    list("top_errors", r),
                );
                out.push((row, shown));
            }
        }
    }

    /// Runs `facts` in chunks of `size`, the clock at each chunk's start; with `restart`, a
    /// fresh operator restores the state halfway.
    fn run(facts: &[Fact], size: usize, restart: bool) -> Vec<(Row, Shown)> {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("floe-alerts-{}-{run}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = StateStore::open(&dir, 8 << 20).unwrap();
        let names = |p: u32| format!("x/{p}");
        let mut op = Alerts::new(spec(), &input()).unwrap();
        let mut out = Vec::new();
        let mut clock = None;
        let chunks = facts.len().div_ceil(size);
        for (i, chunk) in facts.chunks(size).enumerate() {
            if restart && i == chunks / 2 {
                op = Alerts::new(spec(), &input()).unwrap();
                let mut ctx = Context::new(Some(&mut store), 0, &names);
                op.on_restore(0, &mut ctx).unwrap();
            }
            let mut ctx = Context::new(Some(&mut store), 0, &names);
            op.on_batch(&batch(chunk, clock), &mut ctx).unwrap();
            let (emitted, dead) = ctx.finish();
            assert!(dead.is_empty());
            rows(emitted, &mut out);
            clock = chunk.iter().map(|f| T0 + f.minute * MINUTE).max();
        }
        let mut ctx = Context::new(Some(&mut store), 0, &names);
        op.on_event_clock(0, T0 + 1000 * MINUTE, &mut ctx).unwrap();
        rows(ctx.finish().0, &mut out);
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    fn id(rule: &str, key: &str, minute: i64) -> String {
        format!("{rule}/{key}@{}", minute_text((T0 / MINUTE) + minute))
    }

    #[test]
    fn a_failing_dependency_raises_one_group_led_by_it_and_alerts_resolve_after_keep_firing() {
        let out: Vec<Row> = run(&incident(), usize::MAX, false)
            .into_iter()
            .map(|(row, _)| row)
            .collect();
        let inventory = id("anomaly", "service_name=inventory,measure=error_rate", 20);
        let checkout = id("anomaly", "service_name=checkout,measure=error_rate", 21);
        let slo = id("slo-burn", "slo=frontend-availability", 22);
        let again = id("anomaly", "service_name=inventory,measure=error_rate", 50);
        let causes = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let expected: Vec<Row> = vec![
            // The dependency fires first and leads its group.
            (
                20,
                inventory.clone(),
                "firing".into(),
                None,
                causes(&["inventory"]),
            ),
            // Its callers' alerts name it first, deepest first, and are suppressed by it.
            (
                21,
                checkout.clone(),
                "firing".into(),
                Some(inventory.clone()),
                causes(&["inventory", "checkout"]),
            ),
            // `for = 2m`: the SLO paged at 21 and 22.
            (
                22,
                slo.clone(),
                "firing".into(),
                Some(inventory.clone()),
                causes(&["inventory", "checkout", "frontend"]),
            ),
            // Last held at 28, 29 and 30; kept firing 3 minutes.
            (32, checkout, "resolved".into(), None, vec![]),
            (33, inventory.clone(), "resolved".into(), None, vec![]),
            (34, slo, "resolved".into(), None, vec![]),
            // search's one-minute page at 45 never fires (`for = 2m`). inventory fails again
            // 17 minutes after it resolved: suppressed by its earlier self.
            (
                50,
                again.clone(),
                "firing".into(),
                Some(inventory),
                causes(&["inventory"]),
            ),
            (54, again, "resolved".into(), None, vec![]),
        ];
        assert_eq!(out, expected);
    }

    #[test]
    fn firing_alerts_show_the_failed_trace_and_the_most_frequent_errors_of_their_service() {
        let out = run(&incident(), usize::MAX, false);
        let shown = |minute: i64, id: &str| -> Shown {
            out.iter()
                .find(|(row, _)| row.0 == minute && row.1.starts_with(id))
                .map(|(_, shown)| shown.clone())
                .unwrap_or_else(|| panic!("no {id} at {minute}"))
        };
        let top = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Partial counts add up (stock 3 + 2 beats timeout 4); two messages are shown. The
        // failed trace is the longest of the last five minutes (16–20): minute 18's.
        assert_eq!(
            shown(20, "anomaly/service_name=inventory"),
            (
                Some("inventory-18".into()),
                top(&["stock failed", "timeout"])
            )
        );
        // The longest pick of the last five minutes (17–21), not the latest.
        assert_eq!(
            shown(21, "anomaly/service_name=checkout").0,
            Some("checkout-18".into())
        );
        // Resolved rows carry no context; a service without messages shows none.
        assert_eq!(shown(32, "anomaly/service_name=checkout"), (None, vec![]));
        assert_eq!(
            shown(22, "slo-burn/").1,
            Vec::<String>::new(),
            "frontend logged no errors"
        );
    }

    #[test]
    fn the_same_alerts_whatever_the_batching_and_across_a_restore() {
        let facts = incident();
        let whole = run(&facts, usize::MAX, false);
        assert!(!whole.is_empty());
        for (size, restart) in [(1, false), (7, true), (100, true), (333, false)] {
            assert_eq!(
                run(&facts, size, restart),
                whole,
                "chunks of {size}, restart {restart}"
            );
        }
    }

    #[test]
    fn the_stage_survives_its_encoding() {
        let mut stage = Stage {
            next: Some(42),
            ..Stage::default()
        };
        stage.alerts.insert(
            (1, "service_name=a".into()),
            Alert {
                phase: Phase::Firing,
                service: "a".into(),
                measure: "error_rate".into(),
                since: 40,
                last: 41,
                fired: 41,
                resolved: i64::MIN,
                value: Some(2.5),
                peak: None,
                id: "r/a@x".into(),
                root: "b".into(),
                group: "r/b@x".into(),
            },
        );
        stage.groups.insert(
            "b".into(),
            Group {
                id: "r/b@x".into(),
                members: 2,
            },
        );
        stage.health.insert(
            ("b".into(), "latency_p99".into()),
            VecDeque::from([(40, 3.5), (41, -1.0)]),
        );
        stage.edges.insert(("a".into(), "b".into()), 41);
        stage.exemplars.insert(
            ("a".into(), "failed_trace_id".into()),
            VecDeque::from([(40, 12.5, "t1".into()), (41, 3.0, "t2".into())]),
        );
        stage.messages.insert(
            "a".into(),
            VecDeque::from([(41, vec![("timeout".into(), 7.0), ("refused".into(), 1.0)])]),
        );
        assert_eq!(Stage::decode(&stage.encode()).unwrap(), stage);
        // A stage of version 2 (before the context) is read with none.
        let mut old = stage.clone();
        old.exemplars.clear();
        old.messages.clear();
        let mut bytes = old.encode();
        bytes[0] = 2;
        bytes.truncate(bytes.len() - 2);
        assert_eq!(Stage::decode(&bytes).unwrap(), old);
    }

    #[test]
    fn an_input_that_is_not_a_one_partition_union_is_refused() {
        let spread = StreamSpec {
            properties: vec![],
            ..input()
        };
        let e = Alerts::new(spec(), &spread).unwrap_err();
        assert!(e.contains("partitions = 1"), "{e}");
        let mut bad = spec();
        bad.rules[0].stream = "nowhere".into();
        let e = Alerts::new(bad, &input()).unwrap_err();
        assert!(e.contains("not one of the union's inputs"), "{e}");
        let mut bad = spec();
        bad.rules[0].when = Some("no_such_column > 1".into());
        let e = Alerts::new(bad, &input()).unwrap_err();
        assert!(e.contains("rule slo-burn"), "{e}");
        let mut bad = spec();
        bad.exemplars = Some("slo".into());
        let mut plain = input();
        plain.schema = Some(
            iceberg::spec::Schema::builder()
                .with_fields(
                    COLUMNS[..9]
                        .iter()
                        .enumerate()
                        .map(|(i, (n, t))| {
                            NestedField::optional(i as i32 + 1, *n, Type::Primitive(t.clone()))
                                .into()
                        })
                        .collect::<Vec<_>>(),
                )
                .build()
                .unwrap(),
        );
        bad.messages = None;
        let e = Alerts::new(bad, &plain).unwrap_err();
        assert!(
            e.contains("no column slowest_trace_id or failed_trace_id"),
            "{e}"
        );
    }
}
