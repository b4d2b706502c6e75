//! `[sinks.<id>]`: where a job's committed tables go beyond Iceberg, as the job file gives it
//! (the runtime side is [`crate::mirror`]).
//!
//! ```toml
//! [sinks.alerts_topic]
//! kind = "kafka"
//! stream = "alerts"        # a stream the job lands: its table is what the sink mirrors
//! topic = "floe_alerts"    # default: the sink's id
//! key = "alert_id"         # a column: the record key (default: none)
//! brokers = "host:9092"    # default: the [source.kafka] brokers
//! partitions = 1           # of a topic the sink creates (default 1)
//!
//! [sinks.slo_series]
//! kind = "prometheus"
//! stream = "slo"
//! url = "http://localhost:9090/api/v1/write"
//! metric = "floe_slo"      # series <metric>_<column> (default floe_<stream>)
//! values = ["burn_rate_1h", "budget_remaining"]
//! labels = ["slo"]         # default: every text column
//! time = "window_end"      # default: window_end, else window_start
//! ```
//!
//! A sink is delivered by one writer, whichever replica committed the rows: the one holding
//! its home partition — partition 0 of the nearest exchange upstream of the stream, else of
//! the source's first topic (the reader's first partition when the source is one process:
//! the generator, Postgres).

use std::collections::BTreeMap;

use floe_config::{Checker, Text};
use floe_ops::config::{OperatorKind, Pipeline};
use serde::Deserialize;
use toml::Spanned;

/// `[sinks.<id>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSink {
    /// `kafka`.
    kind: Option<Text>,
    /// The stream whose table it mirrors.
    stream: Option<Text>,
    /// Kafka: the topic (default: the sink's id).
    topic: Option<Text>,
    /// Kafka: the column whose value keys each record.
    key: Option<Text>,
    /// Kafka: `bootstrap.servers` (default: the source's).
    brokers: Option<Text>,
    /// Kafka: partitions of a topic the sink creates.
    partitions: Option<Spanned<i64>>,
    /// Kafka: other librdkafka properties (security, timeouts).
    #[serde(default)]
    properties: BTreeMap<String, Text>,
    /// Prometheus: the remote-write URL.
    url: Option<Text>,
    /// Prometheus: the metric name prefix.
    metric: Option<Text>,
    /// Prometheus: the time column.
    time: Option<Text>,
    /// Prometheus: the label columns.
    labels: Option<Vec<Text>>,
    /// Prometheus: the value columns.
    values: Option<Vec<Text>>,
}

/// Where a sink delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkTarget {
    /// A Kafka topic, one transaction per snapshot.
    Kafka {
        /// The topic.
        topic: String,
        /// The key column.
        key: Option<String>,
        /// `bootstrap.servers`, when the job file gives them.
        brokers: Option<String>,
        /// Partitions of a topic the sink creates.
        partitions: i32,
        /// Other librdkafka properties.
        properties: BTreeMap<String, String>,
    },
    /// Prometheus remote write, one request per snapshot.
    Prometheus {
        /// The remote-write URL.
        url: String,
        /// The metric name prefix.
        metric: String,
        /// The time column.
        time: Option<String>,
        /// The label columns (`None`: every text column).
        labels: Option<Vec<String>>,
        /// The value columns.
        values: Vec<String>,
    },
}

/// A checked `[sinks.<id>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// The sink's id.
    pub id: String,
    /// `file:line:col` of its section.
    pub place: String,
    /// The stream whose table it mirrors.
    pub stream: String,
    /// The partition whose holder delivers: `<topic>/0` of the nearest exchange upstream
    /// (`None`: the source's first).
    pub home: Option<String>,
    /// Where it delivers.
    pub target: SinkTarget,
}

/// Checks the `[sinks]` of job `job`: `lands` says whether a stream lands in a table.
pub(crate) fn check(
    c: &mut Checker<'_>,
    raw: &BTreeMap<Text, RawSink>,
    job: &str,
    pipeline: &Pipeline,
    lands: impl Fn(&str) -> Option<bool>,
) -> Vec<SinkConfig> {
    let mut sinks = Vec::new();
    for (id, r) in raw {
        let name = id.get_ref().clone();
        let kind = c.choice(
            r.kind.as_ref(),
            "a sink's `kind`",
            &[
                ("kafka", Some(Kind::Kafka)),
                ("prometheus", Some(Kind::Prometheus)),
            ],
            None,
        );
        if r.kind.is_none() {
            c.at(
                id,
                format!("sink {name}: `kind` is required (\"kafka\" or \"prometheus\")"),
            );
        }
        let Some(stream) = r.stream.as_ref() else {
            c.at(
                id,
                format!("sink {name}: `stream` is required (the stream whose table it mirrors)"),
            );
            continue;
        };
        let stream_name = c.text(stream);
        match lands(&stream_name) {
            None => c.at(
                stream,
                format!("sink {name}: no stream {stream_name:?} in this job"),
            ),
            Some(false) => c.at(
                stream,
                format!(
                    "sink {name}: stream {stream_name:?} does not land in a table \
                     ([tables.{stream_name}] land = false); a sink mirrors a committed table"
                ),
            ),
            Some(true) => {}
        }
        let home = home_of(job, pipeline, &stream_name);
        let target = match kind {
            None => continue,
            Some(Kind::Kafka) => kafka(c, &name, r),
            Some(Kind::Prometheus) => prometheus(c, id, &stream_name, r),
        };
        sinks.push(SinkConfig {
            id: name.clone(),
            place: c.place(id),
            stream: stream_name,
            home,
            target,
        });
    }
    sinks
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Kafka,
    Prometheus,
}

/// Refuses the settings of the other kind.
fn only(
    c: &mut Checker<'_>,
    name: &str,
    kind: &str,
    fields: &[(&str, Option<std::ops::Range<usize>>)],
) {
    for (field, span) in fields {
        if let Some(span) = span {
            c.problem(
                Some(span.clone()),
                format!("sink {name}: `{field}` is not a setting of a {kind} sink"),
            );
        }
    }
}

fn kafka(c: &mut Checker<'_>, name: &str, r: &RawSink) -> SinkTarget {
    only(
        c,
        name,
        "kafka",
        &[
            ("url", r.url.as_ref().map(Spanned::span)),
            ("metric", r.metric.as_ref().map(Spanned::span)),
            ("time", r.time.as_ref().map(Spanned::span)),
            (
                "labels",
                r.labels.as_ref().and_then(|l| l.first()).map(Spanned::span),
            ),
            (
                "values",
                r.values.as_ref().and_then(|l| l.first()).map(Spanned::span),
            ),
        ],
    );
    SinkTarget::Kafka {
        topic: c.opt(r.topic.as_ref()).unwrap_or_else(|| name.to_string()),
        key: c.opt(r.key.as_ref()),
        brokers: c.opt(r.brokers.as_ref()),
        partitions: c.integer(r.partitions.as_ref(), "`partitions`", 1..=10_000, 1) as i32,
        properties: r
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), c.text(v)))
            .collect(),
    }
}

fn prometheus(c: &mut Checker<'_>, id: &Text, stream: &str, r: &RawSink) -> SinkTarget {
    let name = id.get_ref();
    only(
        c,
        name,
        "prometheus",
        &[
            ("topic", r.topic.as_ref().map(Spanned::span)),
            ("key", r.key.as_ref().map(Spanned::span)),
            ("brokers", r.brokers.as_ref().map(Spanned::span)),
            ("partitions", r.partitions.as_ref().map(Spanned::span)),
        ],
    );
    let url = c.opt(r.url.as_ref()).unwrap_or_default();
    match &r.url {
        None => c.at(id, format!("sink {name}: `url` is required (the remote-write endpoint, e.g. http://localhost:9090/api/v1/write)")),
        Some(u) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            c.at(u, "the remote-write url must start with http:// or https://")
        }
        Some(_) => {}
    }
    let values = names(c, r.values.as_ref()).unwrap_or_default();
    if values.is_empty() {
        c.at(id, format!("sink {name}: `values` names the numeric columns to send, e.g. values = [\"burn_rate_1h\"]"));
    }
    SinkTarget::Prometheus {
        url,
        metric: c
            .opt(r.metric.as_ref())
            .unwrap_or_else(|| format!("floe_{stream}")),
        time: c.opt(r.time.as_ref()),
        labels: names(c, r.labels.as_ref()),
        values,
    }
}

/// The column names of a list setting.
fn names(c: &mut Checker<'_>, list: Option<&Vec<Text>>) -> Option<Vec<String>> {
    list.map(|l| l.iter().map(|t| c.text(t)).collect())
}

/// Partition 0 of the nearest exchange upstream of `stream`, `<topic>/0` (`None`: none).
pub fn home_of(job: &str, pipeline: &Pipeline, stream: &str) -> Option<String> {
    let mut todo = vec![stream.to_string()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        for op in pipeline
            .operators
            .iter()
            .filter(|o| o.outputs.contains(&name))
        {
            if let OperatorKind::Exchange(x) = &op.kind {
                return Some(format!(
                    "{}/0",
                    crate::exchange::exchange_topic(job, &op.id, x)
                ));
            }
            todo.extend(op.inputs.iter().cloned());
        }
    }
    None
}
