//! The job file sections of the pipeline: `[streams.<name>]` (event time) and
//! `[[operators]]`, checked into an [`OperatorConfig`] per operator and a graph without
//! cycles, every problem at `file:line:col`.
//!
//! ```toml
//! [streams.spans]
//! time_column = "ts"            # the event time (OTLP streams: ts)
//! out_of_orderness = "5s"       # how late rows may come behind the newest (default 0s)
//! idle_after = "1m"             # a partition quiet this long stops holding the clock
//!
//! [[operators]]
//! id = "errors"                 # stable: state is stored under it
//! kind = "filter"               # filter | select | window
//! input = "spans"
//! output = "error_spans"        # default: the id
//! where = "status_code = 'ERROR'"
//!
//! [[operators]]
//! id = "durations"
//! kind = "select"
//! input = "spans"
//! columns = ["*", "duration_ns / 1e6 AS duration_ms"]
//!
//! [[operators]]
//! id = "rollup_1m"
//! kind = "window"
//! input = "spans"
//! window = { type = "tumbling", size = "1m" }   # sliding: size, slide; session: gap
//! key = ["service_name", "span_name", "status_code"]
//! allowed_lateness = "30s"
//! late_output = "rollup_1m_late"               # default: <output>_late
//! aggregates = { spans = "count()", p99_ns = "quantile(duration_ns, 0.99)" }
//!
//! [[operators]]
//! id = "by_service"
//! kind = "exchange"             # re-keys the stream through a Kafka topic (ADR 0007)
//! input = "spans"
//! key = ["service_name"]        # every row of a key reaches one partition of the output
//! partitions = 12               # of the topic: the most replicas the output can spread over
//! topic = "floe.otlp.by_service"   # default floe.<job>.<id>
//! retention = "7d"              # how long the topic keeps records (default 7d)
//!
//! [[operators]]
//! id = "slo"
//! kind = "slo"                  # error budgets and burn rates of the [[slos]] (floe_ops::slo)
//! input = "by_service"          # requests, exchanged by service
//! output = "slo_status"         # default: the id
//! allowed_lateness = "1m"       # a minute is evaluated this long after it ends
//! # columns (defaults): service_column = "service_name", endpoint_column = "span_name",
//! #   error_column = "error", duration_column = "duration_ns"
//!
//! [[operators]]
//! id = "deploy_regressions"
//! kind = "regression"           # new versions against the ones they replace (floe_ops::regression)
//! input = "by_service"          # requests, exchanged by service
//! allowed_lateness = "1m"
//! # columns (defaults): service_column = "service_name", version_column = "service_version",
//! #   error_column = "error", duration_column = "duration_ns"
//! regression = { baseline = "30m", after = "10m", max_wait = "1h", min_requests = 200, alpha = 0.001, min_error_increase = 0.005, quantile = 0.99, latency_effect = 1.2 }
//!
//! [[operators]]
//! id = "service_edges"
//! kind = "edges"                # caller → callee per minute (floe_ops::edges)
//! input = "by_trace"            # spans, exchanged by trace_id
//! allowed_lateness = "1m"
//! join_window = "5m"            # a child starts at most this long after its parent (default 5m)
//! # columns (defaults): service_column = "service_name", error_column = "error",
//! #   duration_column = "duration_ns"
//!
//! [[operators]]
//! id = "service_anomalies"
//! kind = "anomaly"              # minutes far from a robust baseline (floe_ops::anomaly)
//! input = "by_service"          # exchanged by (a subset of) the key
//! key = ["service_name"]        # the columns naming a series
//! measures = { latency_p99 = "quantile(duration_ns, 0.99)", error_rate = "ratio(error)" }
//! allowed_lateness = "1m"
//! anomaly = { threshold = 4.0, alpha = 0.05, warmup = 30, min_count = 20, min_deviation = 0.05, min_delta = 0.0, seasonality = "hour_of_day", ttl = "1d", direction = "up" }
//! scores_output = "service_anomalies_scores"   # every score (default: <output>_scores)
//!
//! [[operators]]
//! id = "disk_forecasts"
//! kind = "forecast"             # a linear trend heading for a threshold (floe_ops::forecast)
//! input = "by_series"           # gauges exchanged by (a subset of) the key
//! key = ["service_name", "metric_name", "host"]
//! measures = { used = "max(value)" }
//! forecast = { threshold = 0.9, horizon = "1h", alpha = 0.2, beta = 0.05, warmup = 15, direction = "up" }
//!
//! [[slos]]
//! name = "checkout-availability"
//! service = "checkout"
//! endpoint = "POST /checkout"   # optional: every endpoint of the service
//! objective = "availability"    # or "latency", with threshold = "300ms"
//! target = 99.9                 # percent of requests good
//! period = "30d"                # the error budget's period (default 30d)
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use floe_config::{Checker, Text};
use floe_core::StreamSpec;
use serde::Deserialize;
use toml::Spanned;

use crate::Operator;
use crate::aggregate::{Aggregate, parse_aggregate};
use crate::alerts::{Alerts, AlertsSpec, Rule};
use crate::anomaly::{AnomalySettings, Direction};
use crate::edges::{Edges, EdgesSpec};
use crate::forecast::{Crossing, ForecastSettings};
use crate::regression::{DEFAULTS, Regression, RegressionSpec};
use crate::sampling::config::{self as sampling_config, RawPolicy};
use crate::sampling::operator::{SamplingSpec, TailSampling};
use crate::series::{Model, SeriesOperator, SeriesSpec, parse_measure};
use crate::slo::{Objective, Sli, Slo, SloSpec};
use crate::sql::Sql;
use crate::union::Union;
use crate::window::{Window, WindowKind, WindowSpec};

/// `[streams.<name>]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStream {
    /// The event-time column (default: the stream's own, `ts` for OTLP streams).
    pub time_column: Option<Text>,
    /// How far behind the newest event time rows may still arrive (default `0s`).
    pub out_of_orderness: Option<Text>,
    /// Processing time without rows after which a partition stops holding the clock
    /// (default: never).
    pub idle_after: Option<Text>,
}

/// `[[operators]] window = {…}` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWindow {
    /// `tumbling`, `sliding` or `session`.
    #[serde(rename = "type")]
    pub kind: Option<Text>,
    /// The length of a tumbling or sliding window.
    pub size: Option<Text>,
    /// The distance between sliding windows' starts.
    pub slide: Option<Text>,
    /// The inactivity that ends a session.
    pub gap: Option<Text>,
}

/// `[[operators]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOperator {
    /// The stable id (Flink's uid): state and watermarks are stored under it.
    pub id: Option<Text>,
    /// `filter`, `select`, `window`, `exchange`, `slo`, `regression`, `edges`, `anomaly`,
    /// `forecast` or `union`.
    pub kind: Option<Text>,
    /// The stream it reads.
    pub input: Option<Text>,
    /// `union`: the streams it reads.
    pub inputs: Option<Vec<Text>>,
    /// The stream it produces (default: the id).
    pub output: Option<Text>,
    /// `filter`, `select`: the SQL condition rows must meet.
    #[serde(rename = "where")]
    pub predicate: Option<Text>,
    /// `select`: SQL expressions, each optionally `AS name`; `*` is every input column.
    pub columns: Option<Vec<Text>>,
    /// `window`: its shape.
    pub window: Option<Spanned<RawWindow>>,
    /// `window`: key columns (default: none, one row per window).
    pub key: Option<Vec<Text>>,
    /// `window`: the event-time column, instead of the input stream's.
    pub time_column: Option<Text>,
    /// `window`: how long a fired window still takes late rows (default `0s`).
    pub allowed_lateness: Option<Text>,
    /// `window`: the stream of rows later than that (default `<output>_late`).
    pub late_output: Option<Text>,
    /// `exchange`: the topic's partition count (default 12).
    pub partitions: Option<Spanned<i64>>,
    /// `exchange`: the topic (default `floe.<job>.<id>`).
    pub topic: Option<Text>,
    /// `exchange`: how long the topic keeps records (default `7d`).
    pub retention: Option<Text>,
    /// `exchange`: copies of each partition (default: the brokers' default).
    pub replication: Option<Spanned<i64>>,
    /// `edges`: the longest a child span may start after its parent (default `5m`).
    pub join_window: Option<Text>,
    /// `slo`, `regression`, `edges`: the column naming the service (default `service_name`).
    pub service_column: Option<Text>,
    /// `regression`: the column naming the service's version (default `service_version`).
    pub version_column: Option<Text>,
    /// `regression`: how deploys are compared.
    pub regression: Option<Spanned<RawRegression>>,
    /// `slo`: the column naming the endpoint (default `span_name`).
    pub endpoint_column: Option<Text>,
    /// `slo`, `regression`: the column that is non-zero for a failed request (default `error`).
    pub error_column: Option<Text>,
    /// `slo`, `regression`: the column of a request's duration in ns (default `duration_ns`).
    pub duration_column: Option<Text>,
    /// `window`: output column → aggregate (`count()`, `sum(col)`, `min(col)`, `max(col)`,
    /// `avg(col)`, `count_distinct(col)`, `quantile(col, q)`).
    #[serde(default)]
    pub aggregates: BTreeMap<String, Text>,
    /// `anomaly`: measure name → what is scored per minute (an aggregate, `ratio(col)` or
    /// `increase(col)`).
    #[serde(default)]
    pub measures: BTreeMap<String, Text>,
    /// `anomaly`: how series are scored.
    pub anomaly: Option<Spanned<RawAnomaly>>,
    /// `forecast`: how series are forecast.
    pub forecast: Option<Spanned<RawForecast>>,
    /// `anomaly`, `forecast`: the stream of every judged minute (default `<output>_scores`).
    pub scores_output: Option<Text>,
    /// `window` (tumbling, sliding), `edges`: the stream of each window's row once more when
    /// it can no longer change (`edges`: default `<output>_final`; windows: none).
    pub final_output: Option<Text>,
    /// `alerts`: the conditions that raise alerts.
    pub rules: Option<Vec<Spanned<RawRule>>>,
    /// `alerts`: lifecycle and root-cause settings.
    pub alerts: Option<Spanned<RawAlerts>>,
    /// `tail_sampling`: when traces are decided.
    pub sampling: Option<Spanned<RawSampling>>,
    /// `tail_sampling`: what keeps a trace, in order (`[[operators.policies]]`).
    pub policies: Option<Vec<Spanned<RawPolicy>>>,
    /// `tail_sampling`: the stream of decisions (default `<output>_decisions`).
    pub decisions_output: Option<Text>,
}

/// `[[operators]] sampling = {…}` of a `tail_sampling` operator, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSampling {
    /// How long a trace stays open after its last span's end (default `30s`).
    pub decision_wait: Option<Text>,
    /// Once the root span came, how long after its end the trace is decided, if sooner
    /// (default: no such shortcut).
    pub root_grace: Option<Text>,
    /// How long a decision is kept for later spans (default `5m`).
    pub decision_ttl: Option<Text>,
}

/// `[[operators]] rules = [{…}]` of an `alerts` operator, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Unique among the operator's rules.
    pub name: Option<Text>,
    /// The union's input whose rows it reads.
    pub stream: Option<Text>,
    /// SQL condition on those rows (default: every row).
    pub when: Option<Text>,
    /// Columns naming one alert (default: the service column).
    pub key: Option<Vec<Text>>,
    /// The column naming the service (default: the operator's `service_column`).
    pub service: Option<Text>,
    /// SQL expression of the value shown.
    pub value: Option<Text>,
    /// SQL expression naming the health measure root causes follow (default: any).
    pub measure: Option<Text>,
    /// A label for routing (default `page`).
    pub severity: Option<Text>,
    /// How long the rule must hold before the alert fires (default: the operator's).
    #[serde(rename = "for")]
    pub hold: Option<Text>,
    /// How long an alert keeps firing after the rule stops holding (default: the operator's).
    pub keep_firing_for: Option<Text>,
}

/// `[[operators]] alerts = {…}` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    /// Default `for` of the rules (`2m`).
    #[serde(rename = "for")]
    pub hold: Option<Text>,
    /// Default `keep_firing_for` of the rules (`5m`).
    pub keep_firing_for: Option<Text>,
    /// An alert firing again this soon after it resolved is suppressed (`30m`).
    pub suppress_for: Option<Text>,
    /// The union's input with the service map (`caller_service`, `callee_service`).
    pub topology: Option<Text>,
    /// How long an edge of the service map is remembered (`15m`).
    pub topology_window: Option<Text>,
    /// The union's input with each service's health (`score`).
    pub health: Option<Text>,
    /// A service whose score reached this is a root-cause candidate (3).
    pub root_cause_score: Option<Spanned<f64>>,
    /// How much health before an alert is looked at (`5m`).
    pub root_cause_window: Option<Text>,
    /// The union's input with exemplar trace ids (`slowest_trace_id`, `failed_trace_id`).
    pub exemplars: Option<Text>,
    /// The union's input with error messages (`message`, `count`).
    pub messages: Option<Text>,
    /// Error messages a firing alert lists (3).
    pub top_messages: Option<Spanned<i64>>,
}

/// `[[operators]] forecast = {…}` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawForecast {
    /// The value that is saturation (required).
    pub threshold: Option<Spanned<f64>>,
    /// A series with less time than this left is forecast (default `1h`).
    pub horizon: Option<Text>,
    /// The level's weight of a new minute (default 0.2).
    pub alpha: Option<Spanned<f64>>,
    /// The trend's weight of a new minute (default 0.05).
    pub beta: Option<Spanned<f64>>,
    /// Minutes learned before a series is forecast (default 15).
    pub warmup: Option<Spanned<i64>>,
    /// Values a minute needs (default 1).
    pub min_count: Option<Spanned<i64>>,
    /// How long a series without values is remembered (default `1d`).
    pub ttl: Option<Text>,
    /// `up` (default: rising to the threshold) or `down`.
    pub direction: Option<Text>,
}

/// `[[operators]] anomaly = {…}` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAnomaly {
    /// |score| at or above this is an anomaly (default 4).
    pub threshold: Option<Spanned<f64>>,
    /// The weight of a new minute in the baseline (default 0.05).
    pub alpha: Option<Spanned<f64>>,
    /// Minutes learned before a series is scored (default 30).
    pub warmup: Option<Spanned<i64>>,
    /// Values a minute needs to be scored (default 1).
    pub min_count: Option<Spanned<i64>>,
    /// The deviation's floor as a share of the expected value (default 0.05).
    pub min_deviation: Option<Spanned<f64>>,
    /// The deviation's absolute floor (default 0).
    pub min_delta: Option<Spanned<f64>>,
    /// `hour_of_day` (default) or `none`.
    pub seasonality: Option<Text>,
    /// How long a series without values is remembered (default `1d`).
    pub ttl: Option<Text>,
    /// `up`, `down` or `both` (default).
    pub direction: Option<Text>,
}

/// `[[operators]] regression = {…}` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegression {
    /// The old version's minutes before the deploy that are compared (default `30m`).
    pub baseline: Option<Text>,
    /// The new version's minutes before the decision (default `10m`).
    pub after: Option<Text>,
    /// How long after the deploy a decision waits for traffic (default `1h`).
    pub max_wait: Option<Text>,
    /// Requests each side needs for a verdict (default 200).
    pub min_requests: Option<Spanned<i64>>,
    /// Significance of the error-rate test (default 0.001).
    pub alpha: Option<Spanned<f64>>,
    /// The smallest error-rate increase that is a regression (default 0.005).
    pub min_error_increase: Option<Spanned<f64>>,
    /// The latency quantile compared (default 0.99).
    pub quantile: Option<Spanned<f64>>,
    /// The smallest ratio of new to old quantile that is a regression (default 1.2).
    pub latency_effect: Option<Spanned<f64>>,
}

/// `[[slos]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlo {
    /// Unique in the job.
    pub name: Option<Text>,
    /// The service whose requests count.
    pub service: Option<Text>,
    /// Only this endpoint's requests (default: all of the service's).
    pub endpoint: Option<Text>,
    /// `availability` or `latency`.
    pub objective: Option<Text>,
    /// `latency`: a good request takes at most this long.
    pub threshold: Option<Text>,
    /// Percent of requests that must be good (e.g. 99.9).
    pub target: Option<Spanned<f64>>,
    /// The error budget's period (default `30d`).
    pub period: Option<Text>,
    /// The `slo` operator that evaluates it (default: the job's only one).
    pub operator: Option<Text>,
}

/// A stream's event-time settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamTime {
    /// The event-time column.
    pub time_column: Option<String>,
    /// Allowed disorder.
    pub out_of_orderness: Duration,
    /// Idleness.
    pub idle_after: Option<Duration>,
}

/// What an operator does.
#[derive(Debug, Clone)]
pub enum OperatorKind {
    /// `filter` / `select`.
    Sql {
        /// Output columns (`None`: all).
        columns: Option<Vec<String>>,
        /// The condition.
        predicate: Option<String>,
    },
    /// `window`.
    Window(WindowSpec),
    /// `slo`.
    Slo(SloSpec),
    /// `regression`.
    Regression(RegressionSpec),
    /// `edges`.
    Edges(EdgesSpec),
    /// `anomaly` and `forecast`.
    Series(SeriesSpec),
    /// `tail_sampling`.
    TailSampling(SamplingSpec),
    /// `alerts`.
    Alerts(AlertsSpec),
    /// `union`.
    Union,
    /// `exchange`: not an operator of the pipeline — its input's rows go to a topic, and the
    /// job's reader reads them back as its output stream (the runtime's `exchange` module).
    Exchange(ExchangeConfig),
}

/// An `exchange` as the job file gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeConfig {
    /// Key columns: rows with equal values go to one partition.
    pub key: Vec<String>,
    /// The topic's partitions.
    pub partitions: i32,
    /// The topic, if the job file names it.
    pub topic: Option<String>,
    /// `retention.ms` of the topic.
    pub retention_ms: i64,
    /// Copies of each partition (-1: the brokers' default).
    pub replication: i32,
}

/// The default partition count of an exchange topic: 12 spreads evenly over 1, 2, 3, 4 and 6
/// replicas.
pub const EXCHANGE_PARTITIONS: i32 = 12;

/// A checked operator, ready to build once its input's columns are known.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Its id.
    pub id: String,
    /// `file:line:col` of its id.
    pub place: String,
    /// The stream it reads (a union's first input).
    pub input: String,
    /// Every stream it reads: `input`, or a union's inputs.
    pub inputs: Vec<String>,
    /// The streams it produces (main first).
    pub outputs: Vec<String>,
    /// What it does.
    pub kind: OperatorKind,
}

impl OperatorConfig {
    /// Whether it keeps state.
    pub fn stateful(&self) -> bool {
        matches!(
            self.kind,
            OperatorKind::Window(_)
                | OperatorKind::Slo(_)
                | OperatorKind::Regression(_)
                | OperatorKind::Edges(_)
                | OperatorKind::Series(_)
                | OperatorKind::Alerts(_)
                | OperatorKind::TailSampling(_)
        )
    }

    /// For a stateful operator, the digest of everything its stored state depends on.
    pub fn fingerprint(&self) -> Option<String> {
        match &self.kind {
            OperatorKind::Window(w) => Some(w.fingerprint()),
            OperatorKind::Slo(spec) => Some(spec.fingerprint()),
            OperatorKind::Regression(spec) => Some(spec.fingerprint()),
            OperatorKind::Edges(spec) => Some(spec.fingerprint()),
            OperatorKind::Series(spec) => Some(spec.fingerprint()),
            OperatorKind::Alerts(spec) => Some(spec.fingerprint()),
            OperatorKind::TailSampling(spec) => Some(spec.fingerprint()),
            OperatorKind::Sql { .. } | OperatorKind::Exchange(_) | OperatorKind::Union => None,
        }
    }

    /// The operator over `input`; `Err` says why it cannot read it.
    pub fn build(&self, input: &StreamSpec) -> Result<Box<dyn Operator>, String> {
        self.build_over(std::slice::from_ref(input))
    }

    /// The operator over its `inputs` (in the order of [`Self::inputs`]).
    pub fn build_over(&self, inputs: &[StreamSpec]) -> Result<Box<dyn Operator>, String> {
        if let OperatorKind::Union = self.kind {
            return Ok(Box::new(Union::new(&self.id, &self.outputs[0], inputs)?));
        }
        let input = &inputs[0];
        Ok(match &self.kind {
            OperatorKind::Sql { columns, predicate } => Box::new(Sql::new(
                &self.id,
                input,
                &self.outputs[0],
                columns.clone(),
                predicate.clone(),
            )?),
            OperatorKind::Window(spec) => Box::new(Window::new(spec.clone(), input)?),
            OperatorKind::Slo(spec) => Box::new(Slo::new(spec.clone(), input)?),
            OperatorKind::Regression(spec) => Box::new(Regression::new(spec.clone(), input)?),
            OperatorKind::Edges(spec) => Box::new(Edges::new(spec.clone(), input)?),
            OperatorKind::Series(spec) => Box::new(SeriesOperator::new(spec.clone(), input)?),
            OperatorKind::Alerts(spec) => Box::new(Alerts::new(spec.clone(), input)?),
            OperatorKind::TailSampling(spec) => Box::new(TailSampling::new(spec.clone(), input)?),
            OperatorKind::Exchange(_) => {
                return Err("an exchange is the reader's, not an operator of the pipeline".into());
            }
            OperatorKind::Union => unreachable!("built above"),
        })
    }

    /// One line for `floe validate`: what it does.
    pub fn describe(&self) -> String {
        match &self.kind {
            OperatorKind::Sql {
                columns: None,
                predicate: Some(p),
            } => format!("filter where {p}"),
            OperatorKind::Sql { columns, predicate } => {
                let mut s = format!(
                    "select {}",
                    columns.as_deref().map_or("*".to_string(), |c| c.join(", "))
                );
                if let Some(p) = predicate {
                    s.push_str(&format!(" where {p}"));
                }
                s
            }
            OperatorKind::Exchange(x) => format!(
                "exchange by {} through {} partitions of {}",
                x.key.join(", "),
                x.partitions,
                x.topic.as_deref().unwrap_or("floe.<job>.<id>")
            ),
            OperatorKind::Slo(spec) => {
                let names: Vec<&str> = spec.objectives.iter().map(|o| o.name.as_str()).collect();
                format!(
                    "slo on {}: {} (out of order {}, lateness {})",
                    spec.time_column,
                    names.join(", "),
                    micros_text(spec.out_of_orderness),
                    micros_text(spec.allowed_lateness)
                )
            }
            OperatorKind::Regression(r) => format!(
                "regression of {} by {} on {}: new versions' first {} min against the {} min \
                 before (at least {} requests each; errors p < {}, +{}; p{} ×{}; lateness {})",
                r.service_column,
                r.version_column,
                r.time_column,
                r.after_minutes,
                r.baseline_minutes,
                r.min_requests,
                r.alpha,
                r.min_error_increase,
                r.quantile * 100.0,
                r.latency_effect,
                micros_text(r.allowed_lateness)
            ),
            OperatorKind::Edges(e) => format!(
                "edges by {} on {}: caller → callee per minute, children at most {} after \
                 their parent (out of order {}, lateness {})",
                e.service_column,
                e.time_column,
                micros_text(e.join_window),
                micros_text(e.out_of_orderness),
                micros_text(e.allowed_lateness)
            ),
            OperatorKind::Series(a) => a.describe(),
            OperatorKind::Alerts(a) => a.describe(),
            OperatorKind::TailSampling(t) => format!(
                "tail sampling on {}: decided {} after a trace's last span ends{}, decisions kept \
                 {} (out of order {}); policies {}",
                t.time_column,
                micros_text(t.decision_wait),
                t.root_grace
                    .map(|g| format!(" or {} after its root's", micros_text(g)))
                    .unwrap_or_default(),
                micros_text(t.decision_ttl),
                micros_text(t.out_of_orderness),
                t.policies.text
            ),
            OperatorKind::Union => format!("union of {}", self.inputs.join(", ")),
            OperatorKind::Window(w) => {
                let shape = match w.kind {
                    WindowKind::Tumbling { size } => format!("tumbling {}", micros_text(size)),
                    WindowKind::Sliding { size, slide } => {
                        format!("sliding {} every {}", micros_text(size), micros_text(slide))
                    }
                    WindowKind::Session { gap } => format!("session gap {}", micros_text(gap)),
                };
                let key = if w.key.is_empty() {
                    String::new()
                } else {
                    format!(" by {}", w.key.join(", "))
                };
                let aggregates: Vec<&str> = w.aggregates.iter().map(|a| a.name.as_str()).collect();
                format!(
                    "window {shape}{key} on {}: {} (out of order {}, lateness {})",
                    w.time_column,
                    aggregates.join(", "),
                    micros_text(w.out_of_orderness),
                    micros_text(w.allowed_lateness)
                )
            }
        }
    }
}

/// A column name the job file may set, or `default`.
fn column_or(c: &mut Checker<'_>, value: &Option<Text>, default: &str) -> String {
    c.opt(value.as_ref()).unwrap_or_else(|| default.to_string())
}

fn micros_text(us: i64) -> String {
    let d = Duration::from_micros(us.max(0) as u64);
    match d.as_secs() {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// The pipeline of a job file.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {
    /// Operators, each after the operators producing its input.
    pub operators: Vec<OperatorConfig>,
    /// Event-time settings per stream named in `[streams]`.
    pub streams: BTreeMap<String, StreamTime>,
}

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "_-.".contains(ch))
}

/// Checks `[streams]` and `[[operators]]` against the source's streams (`None`: change
/// streams named `schema.table`, known only when the source connects).
pub fn check_pipeline(
    c: &mut Checker<'_>,
    raw_streams: &BTreeMap<Text, RawStream>,
    raw_operators: &[Spanned<RawOperator>],
    raw_slos: &[Spanned<RawSlo>],
    source: Option<&[StreamSpec]>,
) -> Pipeline {
    let is_source = |name: &str| match source {
        Some(streams) => streams.iter().any(|s| s.name == name),
        None => name.contains('.'),
    };
    let mut operators: Vec<(OperatorConfig, Vec<Text>)> = Vec::new();
    let mut produced: HashMap<String, usize> = HashMap::new();
    let mut ids = BTreeSet::new();
    for spanned in raw_operators {
        let raw = spanned.get_ref();
        let Some(id_value) = &raw.id else {
            c.at(
                spanned,
                "an operator needs an `id` (its state is stored under it)",
            );
            continue;
        };
        let id = c.text(id_value);
        if !name_ok(&id) {
            c.at(
                id_value,
                "an operator id is letters, digits, '_', '-' or '.'",
            );
        } else if !ids.insert(id.clone()) {
            c.at(id_value, format!("two operators have the id {id}"));
        }
        let place = c.place(id_value);
        let Some(kind_value) = &raw.kind else {
            c.at(
                id_value,
                format!(
                    "operator {id} needs a `kind`: filter, select, window, exchange, slo, \
                     regression, edges, anomaly, forecast, union or alerts"
                ),
            );
            continue;
        };
        let kind_name = c.text(kind_value);
        let input_values: Vec<Text> = match (&raw.input, &raw.inputs) {
            (Some(_), Some(_)) => {
                c.at(
                    id_value,
                    format!("operator {id} has both `input` and `inputs`"),
                );
                continue;
            }
            (Some(one), None) if kind_name != "union" => vec![one.clone()],
            (None, Some(many)) if kind_name == "union" && many.len() >= 2 => many.clone(),
            _ if kind_name == "union" => {
                c.at(
                    id_value,
                    format!("union {id} needs `inputs`: two or more streams"),
                );
                continue;
            }
            _ => {
                c.at(id_value, format!("operator {id} needs an `input` stream"));
                continue;
            }
        };
        let inputs: Vec<String> = input_values.iter().map(|v| c.text(v)).collect();
        if let Some(twice) = input_values
            .iter()
            .enumerate()
            .find(|(i, v)| inputs[..*i].contains(v.get_ref()))
            .map(|(_, v)| v)
        {
            c.at(
                twice,
                format!("union {id} reads stream {} twice", twice.get_ref()),
            );
        }
        let input = inputs[0].clone();
        let output = c.opt(raw.output.as_ref()).unwrap_or_else(|| id.clone());
        let article = if kind_name.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        let not_for = |c: &mut Checker<'_>, field: &str, present: bool| {
            if present {
                c.at(
                    kind_value,
                    format!("`{field}` is not a setting of {article} {kind_name} operator"),
                );
            }
        };
        if !["slo", "regression", "edges", "alerts"].contains(&kind_name.as_str()) {
            not_for(c, "service_column", raw.service_column.is_some());
            not_for(c, "error_column", raw.error_column.is_some());
            not_for(c, "duration_column", raw.duration_column.is_some());
        }
        if kind_name != "slo" {
            not_for(c, "endpoint_column", raw.endpoint_column.is_some());
        }
        if kind_name != "regression" {
            not_for(c, "version_column", raw.version_column.is_some());
            not_for(c, "regression", raw.regression.is_some());
        }
        if kind_name != "edges" {
            not_for(c, "join_window", raw.join_window.is_some());
        }
        if !["window", "edges"].contains(&kind_name.as_str()) {
            not_for(c, "final_output", raw.final_output.is_some());
        }
        if kind_name != "anomaly" {
            not_for(c, "anomaly", raw.anomaly.is_some());
        }
        if kind_name != "forecast" {
            not_for(c, "forecast", raw.forecast.is_some());
        }
        if !["anomaly", "forecast"].contains(&kind_name.as_str()) {
            not_for(c, "measures", !raw.measures.is_empty());
            not_for(c, "scores_output", raw.scores_output.is_some());
        }
        if kind_name != "alerts" {
            not_for(c, "rules", raw.rules.is_some());
            not_for(c, "alerts", raw.alerts.is_some());
        }
        if kind_name != "tail_sampling" {
            not_for(c, "sampling", raw.sampling.is_some());
            not_for(c, "policies", raw.policies.is_some());
            not_for(c, "decisions_output", raw.decisions_output.is_some());
        }
        if kind_name != "exchange" {
            not_for(c, "partitions", raw.partitions.is_some());
            not_for(c, "topic", raw.topic.is_some());
            not_for(c, "retention", raw.retention.is_some());
            not_for(c, "replication", raw.replication.is_some());
        }
        let kind = match kind_name.as_str() {
            "filter" | "select" => {
                not_for(c, "window", raw.window.is_some());
                not_for(c, "key", raw.key.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                not_for(c, "allowed_lateness", raw.allowed_lateness.is_some());
                not_for(c, "late_output", raw.late_output.is_some());
                not_for(c, "time_column", raw.time_column.is_some());
                let predicate = c.opt(raw.predicate.as_ref());
                let columns = raw
                    .columns
                    .as_ref()
                    .map(|cols| cols.iter().map(|t| c.text(t)).collect::<Vec<_>>());
                if kind_name == "filter" {
                    not_for(c, "columns", raw.columns.is_some());
                    if predicate.is_none() {
                        c.at(
                            kind_value,
                            format!("filter {id} needs `where`, its condition"),
                        );
                    }
                } else if columns.as_ref().is_none_or(Vec::is_empty) {
                    c.at(kind_value, format!("select {id} needs `columns`"));
                }
                OperatorKind::Sql { columns, predicate }
            }
            "window" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                match window(c, &id, raw, kind_value) {
                    Some(spec) => OperatorKind::Window(WindowSpec {
                        output: output.clone(),
                        late_output: c
                            .opt(raw.late_output.as_ref())
                            .unwrap_or_else(|| format!("{output}_late")),
                        final_output: c.opt(raw.final_output.as_ref()),
                        ..spec
                    }),
                    None => continue,
                }
            }
            "exchange" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                not_for(c, "allowed_lateness", raw.allowed_lateness.is_some());
                not_for(c, "late_output", raw.late_output.is_some());
                not_for(c, "time_column", raw.time_column.is_some());
                match exchange(c, &id, raw, kind_value) {
                    Some(x) => OperatorKind::Exchange(x),
                    None => continue,
                }
            }
            "slo" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "key", raw.key.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                OperatorKind::Slo(SloSpec {
                    id: id.clone(),
                    // Resolved against the input stream by `resolve_time`.
                    time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
                    out_of_orderness: 0,
                    allowed_lateness: c
                        .duration_or_zero(raw.allowed_lateness.as_ref(), Duration::ZERO)
                        .as_micros() as i64,
                    service_column: column_or(c, &raw.service_column, "service_name"),
                    endpoint_column: column_or(c, &raw.endpoint_column, "span_name"),
                    error_column: column_or(c, &raw.error_column, "error"),
                    duration_column: column_or(c, &raw.duration_column, "duration_ns"),
                    objectives: Vec::new(), // from [[slos]], below
                    output: output.clone(),
                    late_output: c
                        .opt(raw.late_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_late")),
                })
            }
            "regression" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "key", raw.key.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                let Some(settings) = regression(c, raw) else {
                    continue;
                };
                OperatorKind::Regression(RegressionSpec {
                    id: id.clone(),
                    // Resolved against the input stream by `resolve_time`.
                    time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
                    out_of_orderness: 0,
                    allowed_lateness: c
                        .duration_or_zero(raw.allowed_lateness.as_ref(), Duration::ZERO)
                        .as_micros() as i64,
                    service_column: column_or(c, &raw.service_column, "service_name"),
                    version_column: column_or(c, &raw.version_column, "service_version"),
                    error_column: column_or(c, &raw.error_column, "error"),
                    duration_column: column_or(c, &raw.duration_column, "duration_ns"),
                    output: output.clone(),
                    late_output: c
                        .opt(raw.late_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_late")),
                    ..settings
                })
            }
            "edges" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "key", raw.key.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                not_for(c, "late_output", raw.late_output.is_some());
                OperatorKind::Edges(EdgesSpec {
                    id: id.clone(),
                    // Resolved against the input stream by `resolve_time`.
                    time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
                    out_of_orderness: 0,
                    allowed_lateness: c
                        .duration_or_zero(raw.allowed_lateness.as_ref(), Duration::ZERO)
                        .as_micros() as i64,
                    join_window: c
                        .duration(raw.join_window.as_ref(), Duration::from_secs(300))
                        .as_micros() as i64,
                    service_column: column_or(c, &raw.service_column, "service_name"),
                    error_column: column_or(c, &raw.error_column, "error"),
                    duration_column: column_or(c, &raw.duration_column, "duration_ns"),
                    output: output.clone(),
                    final_output: c
                        .opt(raw.final_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_final")),
                })
            }
            "union" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "key", raw.key.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                not_for(c, "allowed_lateness", raw.allowed_lateness.is_some());
                not_for(c, "late_output", raw.late_output.is_some());
                not_for(c, "time_column", raw.time_column.is_some());
                OperatorKind::Union
            }
            "alerts" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "key", raw.key.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                let Some(settings) = alerts(c, &id, raw, kind_value) else {
                    continue;
                };
                OperatorKind::Alerts(AlertsSpec {
                    // Resolved against the input stream by `resolve_time`.
                    time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
                    allowed_lateness: c
                        .duration_or_zero(raw.allowed_lateness.as_ref(), Duration::ZERO)
                        .as_micros() as i64,
                    output: output.clone(),
                    late_output: c
                        .opt(raw.late_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_late")),
                    ..settings
                })
            }
            "anomaly" | "forecast" => {
                not_for(c, "where", raw.predicate.is_some());
                not_for(c, "columns", raw.columns.is_some());
                not_for(c, "window", raw.window.is_some());
                not_for(c, "aggregates", !raw.aggregates.is_empty());
                let model = if kind_name == "anomaly" {
                    anomaly(c, raw).map(Model::Anomaly)
                } else {
                    forecast(c, raw, kind_value).map(Model::Forecast)
                };
                let Some(model) = model else {
                    continue;
                };
                let key: Vec<String> = raw.key.iter().flatten().map(|k| c.text(k)).collect();
                if key.is_empty() {
                    c.at(
                        kind_value,
                        format!("{kind_name} {id} needs `key`: the columns naming a series"),
                    );
                }
                let mut measures = Vec::new();
                for (name, text) in &raw.measures {
                    match parse_measure(name, &c.text(text)) {
                        Ok(m) => measures.push(m),
                        Err(e) => c.at(text, e),
                    }
                }
                if raw.measures.is_empty() {
                    c.at(
                        kind_value,
                        format!(
                            "{kind_name} {id} needs `measures`, e.g. {{ p99 = \"quantile(duration_ns, \
                             0.99)\", error_rate = \"ratio(error)\" }}"
                        ),
                    );
                }
                OperatorKind::Series(SeriesSpec {
                    id: id.clone(),
                    // Resolved against the input stream by `resolve_time`.
                    time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
                    out_of_orderness: 0,
                    allowed_lateness: c
                        .duration_or_zero(raw.allowed_lateness.as_ref(), Duration::ZERO)
                        .as_micros() as i64,
                    key,
                    measures,
                    model,
                    output: output.clone(),
                    scores_output: c
                        .opt(raw.scores_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_scores")),
                    late_output: c
                        .opt(raw.late_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_late")),
                })
            }
            "tail_sampling" => {
                for (field, present) in [
                    ("where", raw.predicate.is_some()),
                    ("columns", raw.columns.is_some()),
                    ("window", raw.window.is_some()),
                    ("key", raw.key.is_some()),
                    ("aggregates", !raw.aggregates.is_empty()),
                    ("allowed_lateness", raw.allowed_lateness.is_some()),
                ] {
                    not_for(c, field, present);
                }
                let empty = RawSampling::default();
                let s = raw.sampling.as_ref().map_or(&empty, |s| s.get_ref());
                let micros = |d: Duration| d.as_micros() as i64;
                let decision_wait =
                    micros(c.duration(s.decision_wait.as_ref(), Duration::from_secs(30)));
                let root_grace = s
                    .root_grace
                    .as_ref()
                    .map(|g| micros(c.duration_or_zero(Some(g), Duration::ZERO)));
                let decision_ttl =
                    micros(c.duration(s.decision_ttl.as_ref(), Duration::from_secs(300)));
                let Some(policies) = sampling_config::check(
                    c,
                    raw.policies.as_deref().unwrap_or_default(),
                    kind_value,
                ) else {
                    continue;
                };
                OperatorKind::TailSampling(SamplingSpec {
                    id: id.clone(),
                    // Resolved against the input stream by `resolve_time`.
                    time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
                    out_of_orderness: 0,
                    decision_wait,
                    root_grace,
                    decision_ttl,
                    policies,
                    output: output.clone(),
                    decisions_output: c
                        .opt(raw.decisions_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_decisions")),
                    late_output: c
                        .opt(raw.late_output.as_ref())
                        .unwrap_or_else(|| format!("{output}_late")),
                })
            }
            other => {
                c.at(
                    kind_value,
                    format!(
                        "there is no operator kind {other:?}; use filter, select, window, \
                         exchange, slo, regression, edges, anomaly, forecast, union, alerts or \
                         tail_sampling"
                    ),
                );
                continue;
            }
        };
        let mut outputs = vec![output];
        match &kind {
            OperatorKind::Window(w) => {
                outputs.push(w.late_output.clone());
                outputs.extend(w.final_output.clone());
            }
            OperatorKind::Edges(e) => outputs.push(e.final_output.clone()),
            OperatorKind::Slo(spec) => outputs.push(spec.late_output.clone()),
            OperatorKind::Regression(spec) => outputs.push(spec.late_output.clone()),
            OperatorKind::Alerts(spec) => outputs.push(spec.late_output.clone()),
            OperatorKind::Series(spec) => {
                outputs.push(spec.late_output.clone());
                outputs.push(spec.scores_output.clone());
            }
            OperatorKind::TailSampling(spec) => {
                outputs.push(spec.late_output.clone());
                outputs.push(spec.decisions_output.clone());
            }
            _ => {}
        }
        for out in &outputs {
            if !name_ok(out) {
                c.at(
                    id_value,
                    format!("stream name {out:?} is letters, digits, '_', '-' or '.'"),
                );
            } else if is_source(out) || produced.contains_key(out) {
                c.at(id_value, format!("stream {out} is produced twice"));
            }
            produced.insert(out.clone(), operators.len());
        }
        operators.push((
            OperatorConfig {
                id,
                place,
                input,
                inputs,
                outputs,
                kind,
            },
            input_values,
        ));
    }
    // Every input exists, and no operator feeds itself.
    for (op, input_values) in &operators {
        for (input, v) in op.inputs.iter().zip(input_values) {
            if is_source(input) || produced.contains_key(input) {
                continue;
            }
            let known: Vec<String> = source
                .map(|s| s.iter().map(|s| s.name.clone()).collect())
                .unwrap_or_default();
            c.at(
                v,
                format!(
                    "operator {} reads stream {input}, which nothing produces (the source's streams: {known:?})",
                    op.id
                ),
            );
        }
    }
    let order = match topological(
        &operators.iter().map(|(o, _)| o.clone()).collect::<Vec<_>>(),
        &produced,
    ) {
        Ok(order) => order,
        Err(cycle) => {
            let (_, at) = &operators[cycle[0]];
            if let Some(at) = at.first() {
                let ids: Vec<&str> = cycle.iter().map(|i| operators[*i].0.id.as_str()).collect();
                c.at(
                    at,
                    format!(
                        "operators {} read each other's output: a cycle",
                        ids.join(" → ")
                    ),
                );
            }
            (0..operators.len()).collect()
        }
    };
    let mut operators: Vec<OperatorConfig> =
        order.into_iter().map(|i| operators[i].0.clone()).collect();
    assign_slos(c, &mut operators, raw_slos);

    let mut streams = BTreeMap::new();
    for (name, raw) in raw_streams {
        let stream = name.get_ref();
        if !is_source(stream) && !produced.contains_key(stream.as_str()) {
            c.at(
                name,
                format!("[streams.{stream}]: no stream {stream} in this job"),
            );
        }
        streams.insert(
            stream.clone(),
            StreamTime {
                time_column: c.opt(raw.time_column.as_ref()),
                out_of_orderness: c.duration_or_zero(raw.out_of_orderness.as_ref(), Duration::ZERO),
                idle_after: raw
                    .idle_after
                    .as_ref()
                    .map(|v| c.duration(Some(v), Duration::from_secs(60))),
            },
        );
    }
    Pipeline { operators, streams }
}

/// Checks `[[slos]]` and gives each to its `slo` operator; every `slo` operator needs one.
fn assign_slos(
    c: &mut Checker<'_>,
    operators: &mut [OperatorConfig],
    raw_slos: &[Spanned<RawSlo>],
) {
    let slo_ops: Vec<String> = operators
        .iter()
        .filter(|o| matches!(o.kind, OperatorKind::Slo(_)))
        .map(|o| o.id.clone())
        .collect();
    let mut names = BTreeSet::new();
    for spanned in raw_slos {
        let raw = spanned.get_ref();
        let Some(name_value) = &raw.name else {
            c.at(spanned, "an SLO needs a `name`");
            continue;
        };
        let name = c.text(name_value);
        if !name_ok(&name) {
            c.at(
                name_value,
                "an SLO name is letters, digits, '_', '-' or '.'",
            );
        } else if !names.insert(name.clone()) {
            c.at(name_value, format!("two SLOs are named {name}"));
        }
        let Some(service) = c.opt(raw.service.as_ref()) else {
            c.at(
                name_value,
                format!("SLO {name} needs the `service` it is for"),
            );
            continue;
        };
        let sli = match c.opt(raw.objective.as_ref()).as_deref() {
            Some("availability") => {
                if let Some(t) = &raw.threshold {
                    c.at(
                        t,
                        "an availability objective has no `threshold` (latency ones do)",
                    );
                }
                Sli::Availability
            }
            Some("latency") => {
                let Some(t) = &raw.threshold else {
                    c.at(
                        name_value,
                        format!("SLO {name} is a latency objective: give its `threshold`, e.g. \"300ms\""),
                    );
                    continue;
                };
                Sli::Latency {
                    threshold_ns: c.duration(Some(t), Duration::from_millis(300)).as_nanos() as i64,
                }
            }
            other => {
                let at = raw
                    .objective
                    .as_ref()
                    .map_or(name_value.span(), |o| o.span());
                c.problem(
                    Some(at),
                    format!(
                        "SLO {name}: `objective` is \"availability\" or \"latency\", not {other:?}"
                    ),
                );
                continue;
            }
        };
        let target = match &raw.target {
            Some(t) if *t.get_ref() > 0.0 && *t.get_ref() < 100.0 => *t.get_ref() / 100.0,
            Some(t) => {
                c.at(
                    t,
                    "an SLO's `target` is a percentage above 0 and below 100, e.g. 99.9",
                );
                continue;
            }
            None => {
                c.at(
                    name_value,
                    format!("SLO {name} needs its `target`, a percentage like 99.9"),
                );
                continue;
            }
        };
        let period = c.duration(raw.period.as_ref(), Duration::from_secs(30 * 86_400));
        if let Some(p) = &raw.period
            && (!period.as_secs().is_multiple_of(60)
                || period < Duration::from_secs(3600)
                || period > Duration::from_secs(400 * 86_400))
        {
            c.at(p, "an SLO's `period` is whole minutes, from 1h to 400d");
            continue;
        }
        let operator = match (c.opt(raw.operator.as_ref()), slo_ops.as_slice()) {
            (Some(op), _) if slo_ops.contains(&op) => op,
            (Some(op), _) => {
                c.at(
                    raw.operator.as_ref().expect("given"),
                    format!("there is no slo operator {op} (slo operators: {slo_ops:?})"),
                );
                continue;
            }
            (None, [only]) => only.clone(),
            (None, []) => {
                c.at(
                    name_value,
                    format!(
                        "SLO {name}: no operator evaluates it; add one with kind = \"slo\" \
                         reading the requests"
                    ),
                );
                continue;
            }
            (None, _) => {
                c.at(
                    name_value,
                    format!(
                        "SLO {name}: the job has several slo operators; say which with `operator`"
                    ),
                );
                continue;
            }
        };
        let objective = Objective {
            name,
            service,
            endpoint: c.opt(raw.endpoint.as_ref()),
            sli,
            target,
            period_minutes: (period.as_secs() / 60) as i64,
        };
        if let Some(OperatorKind::Slo(spec)) = operators
            .iter_mut()
            .find(|o| o.id == operator)
            .map(|o| &mut o.kind)
        {
            spec.objectives.push(objective);
        }
    }
    for op in operators.iter() {
        if let OperatorKind::Slo(spec) = &op.kind
            && spec.objectives.is_empty()
        {
            c.at_place(
                &op.place,
                format!("slo operator {}: no [[slos]] for it to evaluate", op.id),
            );
        }
    }
}

/// Operator indices, producers first; `Err(cycle)` when inputs loop.
fn topological(
    operators: &[OperatorConfig],
    produced: &HashMap<String, usize>,
) -> Result<Vec<usize>, Vec<usize>> {
    // 0 = unvisited, 1 = on the path, 2 = done.
    fn visit(
        i: usize,
        operators: &[OperatorConfig],
        produced: &HashMap<String, usize>,
        marks: &mut [u8],
        path: &mut Vec<usize>,
        order: &mut Vec<usize>,
    ) -> Result<(), Vec<usize>> {
        match marks[i] {
            2 => return Ok(()),
            1 => {
                let from = path.iter().position(|p| *p == i).unwrap_or(0);
                return Err(path[from..].to_vec());
            }
            _ => {}
        }
        marks[i] = 1;
        path.push(i);
        for input in &operators[i].inputs {
            if let Some(&producer) = produced.get(input) {
                visit(producer, operators, produced, marks, path, order)?;
            }
        }
        path.pop();
        marks[i] = 2;
        order.push(i);
        Ok(())
    }
    let mut marks = vec![0u8; operators.len()];
    let mut order = Vec::new();
    for i in 0..operators.len() {
        visit(
            i,
            operators,
            produced,
            &mut marks,
            &mut Vec::new(),
            &mut order,
        )?;
    }
    Ok(order)
}

fn window(c: &mut Checker<'_>, id: &str, raw: &RawOperator, at: &Text) -> Option<WindowSpec> {
    let Some(w) = &raw.window else {
        c.at(
            at,
            format!("window {id} needs `window`, e.g. {{ type = \"tumbling\", size = \"1m\" }}"),
        );
        return None;
    };
    let shape = w.get_ref();
    let micros = |c: &mut Checker<'_>, v: Option<&Text>, what: &str| -> Option<i64> {
        match v {
            Some(v) => Some(c.duration(Some(v), Duration::from_secs(60)).as_micros() as i64),
            None => {
                c.at(
                    w,
                    format!(
                        "a {what} window needs its `{}`",
                        if what == "session" { "gap" } else { "size" }
                    ),
                );
                None
            }
        }
    };
    let kind = match c.opt(shape.kind.as_ref()).as_deref() {
        Some("tumbling") => WindowKind::Tumbling {
            size: micros(c, shape.size.as_ref(), "tumbling")?,
        },
        Some("sliding") => {
            let size = micros(c, shape.size.as_ref(), "sliding")?;
            let Some(slide_value) = &shape.slide else {
                c.at(w, "a sliding window needs its `slide`");
                return None;
            };
            let slide = c
                .duration(Some(slide_value), Duration::from_secs(60))
                .as_micros() as i64;
            if slide > size || size % slide != 0 {
                c.at(
                    slide_value,
                    "a sliding window's size must be a multiple of its slide",
                );
                return None;
            }
            WindowKind::Sliding { size, slide }
        }
        Some("session") => WindowKind::Session {
            gap: micros(c, shape.gap.as_ref(), "session")?,
        },
        other => {
            c.at(
                w,
                format!("window type {other:?}: use \"tumbling\", \"sliding\" or \"session\""),
            );
            return None;
        }
    };
    let mut aggregates: Vec<Aggregate> = Vec::new();
    for (name, text) in &raw.aggregates {
        match parse_aggregate(name, &c.text(text)) {
            Ok(a) => aggregates.push(a),
            Err(e) => c.at(text, e),
        }
    }
    if raw.aggregates.is_empty() {
        c.at(
            at,
            format!("window {id} needs `aggregates`, e.g. {{ n = \"count()\" }}"),
        );
    }
    Some(WindowSpec {
        id: id.to_string(),
        kind,
        // Resolved against the input stream by `resolve_time`.
        time_column: c.opt(raw.time_column.as_ref()).unwrap_or_default(),
        out_of_orderness: 0,
        allowed_lateness: c
            .duration_or_zero(raw.allowed_lateness.as_ref(), Duration::ZERO)
            .as_micros() as i64,
        idle_after: None,
        key: raw.key.iter().flatten().map(|k| c.text(k)).collect(),
        aggregates,
        output: String::new(),
        late_output: String::new(),
        final_output: None,
    })
}

/// The lineage columns an exchange's input must carry: each row's source offset and its
/// ordinal within the record, by which the reading side drops rows it already took.
pub const EXCHANGE_LINEAGE: [&str; 2] = ["kafka_offset", "kafka_item"];

/// The stream an exchange produces from `input`: the same rows and columns under the
/// exchange's output name, an append stream landing in a table of that name. `Err` says why
/// the input cannot be exchanged.
pub fn exchange_output(op: &OperatorConfig, input: &StreamSpec) -> Result<StreamSpec, String> {
    let OperatorKind::Exchange(x) = &op.kind else {
        return Err(format!("{} is not an exchange", op.id));
    };
    if input.changelog {
        return Err(format!(
            "stream {} is a changelog; an exchange re-keys append streams",
            input.name
        ));
    }
    let derived = floe_core::exchange::final_per_minute(input).is_some()
        || !crate::union::final_streams(input).is_empty();
    if floe_core::exchange::is_exchanged(input)
        && floe_core::exchange::final_per_minute(input).is_none()
    {
        return Err(format!(
            "stream {} is read back from an exchange: exchange the stream it came from by the \
             new key instead",
            input.name
        ));
    }
    let schema = input
        .schema
        .as_ref()
        .ok_or_else(|| format!("the columns of stream {} are not known", input.name))?;
    // Rows final per minute get their lineage from the writing side (ADR 0010).
    let schema = if derived {
        &with_lineage_columns(schema)?
    } else {
        schema
    };
    for column in EXCHANGE_LINEAGE {
        if schema.field_by_name(column).is_none() {
            return Err(format!(
                "stream {} has no column {column}: an exchange reads a stream decoded from \
                 Kafka (or filtered or selected from one, keeping {})",
                input.name,
                EXCHANGE_LINEAGE.join(" and ")
            ));
        }
    }
    for column in &x.key {
        if schema.field_by_name(column).is_none() {
            return Err(format!("stream {} has no key column {column}", input.name));
        }
    }
    let name = op.outputs[0].clone();
    let mut properties = vec![
        (
            floe_core::exchange::EXCHANGED_FROM.to_string(),
            op.id.clone(),
        ),
        (
            floe_core::exchange::EXCHANGED_BY.to_string(),
            x.key.join(","),
        ),
    ];
    if x.partitions == 1 {
        // Every row in one partition: what a global stage (alerts) needs.
        properties.push((
            floe_core::exchange::ONE_PARTITION.to_string(),
            "true".to_string(),
        ));
    }
    // Which of a union's inputs are final per minute (alerts check their rules' streams).
    properties.extend(
        input
            .properties
            .iter()
            .filter(|(k, _)| k == crate::union::FINAL_STREAMS)
            .cloned(),
    );
    Ok(StreamSpec {
        table: name.clone(),
        name,
        schema: Some(schema.clone()),
        properties,
        ..input.clone()
    })
}

/// `schema` with the lineage columns an exchange needs (`kafka_offset` long, `kafka_item`
/// int) added where it lacks them.
pub fn with_lineage_columns(
    schema: &iceberg::spec::Schema,
) -> Result<iceberg::spec::Schema, String> {
    use iceberg::spec::{NestedField, PrimitiveType, Type};
    let mut fields: Vec<_> = schema.as_struct().fields().to_vec();
    let mut next = schema.highest_field_id() + 1;
    for (column, ty) in EXCHANGE_LINEAGE
        .into_iter()
        .zip([PrimitiveType::Long, PrimitiveType::Int])
    {
        if schema.field_by_name(column).is_none() {
            fields.push(std::sync::Arc::new(NestedField::optional(
                next,
                column,
                Type::Primitive(ty),
            )));
            next += 1;
        }
    }
    iceberg::spec::Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|e| e.to_string())
}

/// The comparison settings of a `regression` operator (columns and streams left empty).
fn regression(c: &mut Checker<'_>, raw: &RawOperator) -> Option<RegressionSpec> {
    let empty = RawRegression::default();
    let r = raw.regression.as_ref().map_or(&empty, |r| r.get_ref());
    let minutes = |c: &mut Checker<'_>, v: Option<&Text>, default: i64| -> Option<i64> {
        let d = c.duration(v, Duration::from_secs(default as u64 * 60));
        if !d.as_micros().is_multiple_of(60_000_000) {
            if let Some(v) = v {
                c.at(
                    v,
                    "a whole number of minutes: deploys are compared minute by minute",
                );
            }
            return None;
        }
        Some((d.as_secs() / 60) as i64)
    };
    let baseline = minutes(c, r.baseline.as_ref(), DEFAULTS.baseline_minutes);
    let after = minutes(c, r.after.as_ref(), DEFAULTS.after_minutes);
    let max_wait = minutes(c, r.max_wait.as_ref(), DEFAULTS.max_wait_minutes);
    if let (Some(after), Some(max_wait), Some(v)) = (after, max_wait, r.max_wait.as_ref())
        && max_wait < after
    {
        c.at(v, "`max_wait` is at least `after`");
    }
    let min_requests = match &r.min_requests {
        None => Some(DEFAULTS.min_requests),
        Some(n) if *n.get_ref() >= 1 => Some(*n.get_ref() as u64),
        Some(n) => {
            c.at(n, "`min_requests` is at least 1");
            None
        }
    };
    let mut fraction = |v: &Option<Spanned<f64>>, default: f64, name: &str, max: f64| match v {
        None => Some(default),
        Some(x) if *x.get_ref() > 0.0 && *x.get_ref() < max => Some(*x.get_ref()),
        Some(x) => {
            c.at(x, format!("`{name}` is between 0 and {max}, exclusive"));
            None
        }
    };
    let alpha = fraction(&r.alpha, DEFAULTS.alpha, "alpha", 1.0);
    let increase = fraction(
        &r.min_error_increase,
        DEFAULTS.min_error_increase,
        "min_error_increase",
        1.0,
    );
    let quantile = fraction(&r.quantile, DEFAULTS.quantile, "quantile", 1.0);
    let effect = match &r.latency_effect {
        None => Some(DEFAULTS.latency_effect),
        Some(x) if *x.get_ref() > 1.0 && x.get_ref().is_finite() => Some(*x.get_ref()),
        Some(x) => {
            c.at(x, "`latency_effect` is a ratio above 1 (1.2: 20 % slower)");
            None
        }
    };
    Some(RegressionSpec {
        id: String::new(),
        time_column: String::new(),
        out_of_orderness: 0,
        allowed_lateness: 0,
        service_column: String::new(),
        version_column: String::new(),
        error_column: String::new(),
        duration_column: String::new(),
        baseline_minutes: baseline?,
        after_minutes: after?,
        max_wait_minutes: max_wait?.max(after?),
        min_requests: min_requests?,
        alpha: alpha?,
        min_error_increase: increase?,
        quantile: quantile?,
        latency_effect: effect?,
        output: String::new(),
        late_output: String::new(),
    })
}

/// The scoring settings of an `anomaly` operator.
fn anomaly(c: &mut Checker<'_>, raw: &RawOperator) -> Option<AnomalySettings> {
    let empty = RawAnomaly::default();
    let a = raw.anomaly.as_ref().map_or(&empty, |a| a.get_ref());
    let d = crate::anomaly::DEFAULTS;
    let mut ok = true;
    let mut float =
        |v: &Option<Spanned<f64>>, default: f64, valid: fn(f64) -> bool, rule: &str| match v {
            None => default,
            Some(x) if valid(*x.get_ref()) => *x.get_ref(),
            Some(x) => {
                c.at(x, rule.to_string());
                ok = false;
                default
            }
        };
    let threshold = float(
        &a.threshold,
        d.threshold,
        |x| x > 0.0 && x.is_finite(),
        "`threshold` is a number of deviations above 0",
    );
    let alpha = float(
        &a.alpha,
        d.alpha,
        |x| x > 0.0 && x < 1.0,
        "`alpha` is between 0 and 1, exclusive",
    );
    let min_deviation = float(
        &a.min_deviation,
        d.min_deviation,
        |x| (0.0..1e6).contains(&x),
        "`min_deviation` is a share of the expected value, 0 or more",
    );
    let min_delta = float(
        &a.min_delta,
        d.min_delta,
        |x| x >= 0.0 && x.is_finite(),
        "`min_delta` is 0 or more",
    );
    let mut int = |v: &Option<Spanned<i64>>, default: i64, min: i64, name: &str| match v {
        None => Some(default),
        Some(n) if *n.get_ref() >= min && *n.get_ref() <= u32::MAX as i64 => Some(*n.get_ref()),
        Some(n) => {
            c.at(n, format!("`{name}` is a whole number from {min}"));
            None
        }
    };
    let warmup = int(&a.warmup, i64::from(d.warmup), 1, "warmup");
    let min_count = int(&a.min_count, d.min_count as i64, 1, "min_count");
    let seasonality = match c.opt(a.seasonality.as_ref()).as_deref() {
        None | Some("hour_of_day") => true,
        Some("none") => false,
        Some(other) => {
            c.at(
                a.seasonality.as_ref().expect("given"),
                format!("`seasonality` is \"hour_of_day\" or \"none\", not {other:?}"),
            );
            return None;
        }
    };
    let direction = match c.opt(a.direction.as_ref()) {
        None => d.direction,
        Some(text) => match Direction::parse(&text) {
            Some(dir) => dir,
            None => {
                c.at(
                    a.direction.as_ref().expect("given"),
                    format!("`direction` is \"up\", \"down\" or \"both\", not {text:?}"),
                );
                return None;
            }
        },
    };
    let ttl = whole_minutes(c, a.ttl.as_ref(), d.ttl_minutes, "ttl")?;
    if !ok {
        return None;
    }
    Some(AnomalySettings {
        threshold,
        alpha,
        warmup: warmup? as u32,
        min_count: min_count? as u64,
        min_deviation,
        min_delta,
        seasonality,
        ttl_minutes: ttl,
        direction,
    })
}

/// The settings of a `forecast` operator.
fn forecast(c: &mut Checker<'_>, raw: &RawOperator, at: &Text) -> Option<ForecastSettings> {
    let Some(spanned) = &raw.forecast else {
        c.at(
            at,
            "a forecast operator needs `forecast = { threshold = … }`: the value that is \
             saturation",
        );
        return None;
    };
    let f = spanned.get_ref();
    let d = crate::forecast::DEFAULTS;
    let threshold = match &f.threshold {
        Some(t) if t.get_ref().is_finite() => *t.get_ref(),
        Some(t) => {
            c.at(t, "`threshold` is a finite number");
            return None;
        }
        None => {
            c.at(
                spanned,
                "a forecast needs its `threshold`, the value that is saturation",
            );
            return None;
        }
    };
    let mut ok = true;
    let mut weight = |v: &Option<Spanned<f64>>, default: f64, name: &str| match v {
        None => default,
        Some(x) if *x.get_ref() > 0.0 && *x.get_ref() < 1.0 => *x.get_ref(),
        Some(x) => {
            c.at(x, format!("`{name}` is between 0 and 1, exclusive"));
            ok = false;
            default
        }
    };
    let alpha = weight(&f.alpha, d.alpha, "alpha");
    let beta = weight(&f.beta, d.beta, "beta");
    let mut int = |v: &Option<Spanned<i64>>, default: i64, name: &str| match v {
        None => default,
        Some(n) if *n.get_ref() >= 1 && *n.get_ref() <= i64::from(u32::MAX) => *n.get_ref(),
        Some(n) => {
            c.at(n, format!("`{name}` is a whole number from 1"));
            ok = false;
            default
        }
    };
    let warmup = int(&f.warmup, i64::from(d.warmup), "warmup");
    let min_count = int(&f.min_count, d.min_count as i64, "min_count");
    let horizon = whole_minutes(c, f.horizon.as_ref(), d.horizon_minutes, "horizon")?;
    let ttl = whole_minutes(c, f.ttl.as_ref(), d.ttl_minutes, "ttl")?;
    let direction = match c.opt(f.direction.as_ref()) {
        None => d.direction,
        Some(text) => match Crossing::parse(&text) {
            Some(dir) => dir,
            None => {
                c.at(
                    f.direction.as_ref().expect("given"),
                    format!("`direction` is \"up\" or \"down\", not {text:?}"),
                );
                return None;
            }
        },
    };
    ok.then_some(ForecastSettings {
        threshold,
        horizon_minutes: horizon,
        alpha,
        beta,
        warmup: warmup as u32,
        min_count: min_count as u64,
        ttl_minutes: ttl,
        direction,
    })
}

/// A duration of whole minutes, at least one, or `default` minutes when not given.
/// The rules and settings of an `alerts` operator (time, lateness and streams left empty).
fn alerts(c: &mut Checker<'_>, id: &str, raw: &RawOperator, at: &Text) -> Option<AlertsSpec> {
    use crate::alerts as d;
    let empty = RawAlerts::default();
    let a = raw.alerts.as_ref().map_or(&empty, |a| a.get_ref());
    let minutes = |c: &mut Checker<'_>, v: Option<&Text>, default: i64, name: &str| {
        let d = c.duration_or_zero(v, Duration::from_secs(default as u64 * 60));
        if let Some(v) = v
            && !d.as_secs().is_multiple_of(60)
        {
            c.at(v, format!("`{name}` is whole minutes"));
            return None;
        }
        Some((d.as_secs() / 60) as i64)
    };
    let hold = minutes(c, a.hold.as_ref(), d::DEFAULT_FOR_MINUTES, "for")?;
    let keep = minutes(
        c,
        a.keep_firing_for.as_ref(),
        d::DEFAULT_KEEP_FIRING_MINUTES,
        "keep_firing_for",
    )?;
    let suppress = minutes(
        c,
        a.suppress_for.as_ref(),
        d::DEFAULT_SUPPRESS_MINUTES,
        "suppress_for",
    )?;
    let topology_minutes = whole_minutes(
        c,
        a.topology_window.as_ref(),
        d::DEFAULT_TOPOLOGY_MINUTES,
        "topology_window",
    )?;
    let root_cause_minutes = whole_minutes(
        c,
        a.root_cause_window.as_ref(),
        d::DEFAULT_ROOT_CAUSE_MINUTES,
        "root_cause_window",
    )?;
    let root_cause_score = match &a.root_cause_score {
        None => d::DEFAULT_ROOT_CAUSE_SCORE,
        Some(x) if x.get_ref().is_finite() => *x.get_ref(),
        Some(x) => {
            c.at(x, "`root_cause_score` is a number");
            return None;
        }
    };
    let top_messages = match &a.top_messages {
        None => d::DEFAULT_TOP_MESSAGES,
        Some(n) if (0..=100).contains(n.get_ref()) => *n.get_ref() as usize,
        Some(n) => {
            c.at(n, "`top_messages` is between 0 and 100");
            return None;
        }
    };
    let service_column = column_or(c, &raw.service_column, "service_name");
    let Some(raw_rules) = raw.rules.as_ref().filter(|r| !r.is_empty()) else {
        c.at(
            at,
            format!(
                "alerts {id} needs `rules`, e.g. [{{ name = \"error-anomaly\", stream = \
                 \"service_anomalies\", when = \"measure = 'error_rate'\" }}]"
            ),
        );
        return None;
    };
    let mut rules = Vec::new();
    let mut names = BTreeSet::new();
    let mut ok = true;
    for spanned in raw_rules {
        let r = spanned.get_ref();
        let (Some(name), Some(stream)) = (&r.name, &r.stream) else {
            c.at(spanned, "a rule needs a `name` and the `stream` it reads");
            ok = false;
            continue;
        };
        let name_text = c.text(name);
        if !name_ok(&name_text) {
            c.at(name, "a rule's name is letters, digits, '_', '-' or '.'");
            ok = false;
        } else if !names.insert(name_text.clone()) {
            c.at(name, format!("two rules are named {name_text}"));
            ok = false;
        }
        let service = column_or(c, &r.service, &service_column);
        let key = match &r.key {
            Some(k) => k.iter().map(|k| c.text(k)).collect(),
            None => vec![service.clone()],
        };
        let (Some(for_minutes), Some(keep_firing_minutes)) = (
            minutes(c, r.hold.as_ref(), hold, "for"),
            minutes(c, r.keep_firing_for.as_ref(), keep, "keep_firing_for"),
        ) else {
            ok = false;
            continue;
        };
        rules.push(Rule {
            name: name_text,
            stream: c.text(stream),
            when: c.opt(r.when.as_ref()),
            key,
            service,
            value: c.opt(r.value.as_ref()),
            measure: c.opt(r.measure.as_ref()),
            severity: c.opt(r.severity.as_ref()).unwrap_or_else(|| "page".into()),
            for_minutes,
            keep_firing_minutes,
        });
    }
    ok.then(|| AlertsSpec {
        id: id.to_string(),
        time_column: String::new(),
        out_of_orderness: 0,
        allowed_lateness: 0,
        rules,
        topology: c.opt(a.topology.as_ref()),
        health: c.opt(a.health.as_ref()),
        service_column,
        root_cause_score,
        root_cause_minutes,
        topology_minutes,
        exemplars: c.opt(a.exemplars.as_ref()),
        messages: c.opt(a.messages.as_ref()),
        top_messages,
        suppress_minutes: suppress,
        output: String::new(),
        late_output: String::new(),
    })
}

fn whole_minutes(c: &mut Checker<'_>, v: Option<&Text>, default: i64, name: &str) -> Option<i64> {
    let d = c.duration(v, Duration::from_secs(default as u64 * 60));
    if let Some(v) = v
        && (!d.as_secs().is_multiple_of(60) || d < Duration::from_secs(60))
    {
        c.at(v, format!("`{name}` is whole minutes, at least 1m"));
        return None;
    }
    Some((d.as_secs() / 60) as i64)
}

fn exchange(c: &mut Checker<'_>, id: &str, raw: &RawOperator, at: &Text) -> Option<ExchangeConfig> {
    let key: Vec<String> = raw.key.iter().flatten().map(|k| c.text(k)).collect();
    if key.is_empty() {
        c.at(
            at,
            format!("exchange {id} needs `key`: the columns whose rows must meet in one partition"),
        );
        return None;
    }
    let partitions = match &raw.partitions {
        None => EXCHANGE_PARTITIONS,
        Some(p) if (1..=10_000).contains(p.get_ref()) => *p.get_ref() as i32,
        Some(p) => {
            c.at(p, "an exchange's `partitions` is between 1 and 10000");
            return None;
        }
    };
    let replication = match &raw.replication {
        None => -1,
        Some(r) if (1..=32).contains(r.get_ref()) => *r.get_ref() as i32,
        Some(r) => {
            c.at(r, "an exchange's `replication` is between 1 and 32");
            return None;
        }
    };
    let topic = c.opt(raw.topic.as_ref());
    if let (Some(t), Some(at)) = (&topic, &raw.topic)
        && (t.is_empty()
            || t.len() > 249
            || !t
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch)))
    {
        c.at(
            at,
            "a Kafka topic name is up to 249 letters, digits, '.', '_' or '-'",
        );
    }
    let retention = c.duration(raw.retention.as_ref(), Duration::from_secs(7 * 24 * 3600));
    Some(ExchangeConfig {
        key,
        partitions,
        topic,
        retention_ms: retention.as_millis() as i64,
        replication,
    })
}

/// Fills in each window's event time from its input stream (the operator's `time_column`, or
/// the stream's `[streams]` setting, or the stream's own), following `select`/`filter`
/// operators back to a source stream; returns the windows that have none, with their place.
pub fn resolve_time(pipeline: &mut Pipeline, source: &[StreamSpec]) -> Vec<(String, String)> {
    let mut missing = Vec::new();
    let lookup = |stream: &str, pipeline: &Pipeline| -> StreamTime {
        let mut name = stream.to_string();
        let mut time = StreamTime::default();
        let mut seen = 0;
        loop {
            if let Some(t) = pipeline.streams.get(&name) {
                if time.time_column.is_none() {
                    time.time_column = t.time_column.clone();
                }
                if time.out_of_orderness.is_zero() {
                    time.out_of_orderness = t.out_of_orderness;
                }
                if time.idle_after.is_none() {
                    time.idle_after = t.idle_after;
                }
            }
            if let Some(s) = source.iter().find(|s| s.name == name) {
                if time.time_column.is_none() {
                    time.time_column = s.time_column.clone();
                }
                return time;
            }
            let Some(producer) = pipeline
                .operators
                .iter()
                .find(|o| o.outputs.contains(&name))
            else {
                return time;
            };
            // A late output has its input's columns; other derived rows are timed by their
            // window (a verdict by its decision).
            let late = match &producer.kind {
                OperatorKind::Window(w) => w.late_output == name,
                OperatorKind::Slo(spec) => spec.late_output == name,
                OperatorKind::Regression(spec) => spec.late_output == name,
                OperatorKind::Series(spec) => spec.late_output == name,
                OperatorKind::Alerts(spec) => spec.late_output == name,
                // The kept spans are the input's rows too.
                OperatorKind::TailSampling(spec) => spec.decisions_output != name,
                _ => false,
            };
            let derived = match &producer.kind {
                OperatorKind::Sql { .. } | OperatorKind::Exchange(_) | OperatorKind::Union => None,
                _ if late => None,
                OperatorKind::Regression(_) | OperatorKind::TailSampling(_) => Some("decided_at"),
                _ => Some("window_start"),
            };
            if let Some(column) = derived {
                if time.time_column.is_none() {
                    time.time_column = Some(column.to_string());
                }
                return time;
            }
            if seen >= 64 {
                return time;
            }
            name = producer.input.clone();
            seen += 1;
        }
    };
    let times: Vec<StreamTime> = pipeline
        .operators
        .iter()
        .map(|o| lookup(&o.input, pipeline))
        .collect();
    for (op, time) in pipeline.operators.iter_mut().zip(times) {
        let (column, ooo) = match &mut op.kind {
            OperatorKind::Window(w) => {
                w.idle_after = time.idle_after;
                (&mut w.time_column, &mut w.out_of_orderness)
            }
            OperatorKind::Slo(spec) => (&mut spec.time_column, &mut spec.out_of_orderness),
            OperatorKind::Regression(spec) => (&mut spec.time_column, &mut spec.out_of_orderness),
            OperatorKind::Edges(spec) => (&mut spec.time_column, &mut spec.out_of_orderness),
            OperatorKind::Series(spec) => (&mut spec.time_column, &mut spec.out_of_orderness),
            OperatorKind::Alerts(spec) => (&mut spec.time_column, &mut spec.out_of_orderness),
            OperatorKind::TailSampling(spec) => (&mut spec.time_column, &mut spec.out_of_orderness),
            _ => continue,
        };
        *ooo = time.out_of_orderness.as_micros() as i64;
        if column.is_empty() {
            match time.time_column {
                Some(t) => *column = t,
                None => missing.push((op.place.clone(), op.id.clone())),
            }
        }
    }
    missing
}
