//! `[source.kafka]`: the job file section of the Kafka source, every field documented, and
//! its check into [`KafkaSettings`].
//!
//! ```toml
//! [source.kafka]
//! brokers = "${KAFKA_BROKERS:-localhost:9092}"
//! topics = ["otlp_spans", "otlp_logs", "otlp_metrics"]
//! group_id = "floe-otlp"
//! start = "earliest"
//! format = "otlp"
//! signals = { my_spans = "traces" }
//! team_attribute = "team"
//! properties = { "security.protocol" = "SASL_SSL" }
//! ```
//!
//! `format`, `signals` and `team_attribute` say what the records hold; the job checks them
//! with the format they name (this crate only carries them).

use std::collections::BTreeMap;

use floe_config::{Checker, Text};
use floe_core::StartAt;
use serde::Deserialize;

use crate::KafkaSettings;

/// The Collector's default topics, read when `topics` is not given.
pub const DEFAULT_TOPICS: [&str; 3] = ["otlp_spans", "otlp_logs", "otlp_metrics"];

/// `[source.kafka]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// Bootstrap servers, `host:port[,host:port…]` (default `localhost:9092`).
    pub brokers: Option<Text>,
    /// Topics to read (default: the Collector's `otlp_spans`, `otlp_logs`, `otlp_metrics`).
    pub topics: Option<Vec<Text>>,
    /// The consumer group (default `floe-{job name}`); every replica of a job joins it, and
    /// Kafka spreads the partitions over them.
    pub group_id: Option<Text>,
    /// Where a partition the job never committed starts: `earliest` (default) or `latest`.
    /// Committed partitions always resume from the positions in Iceberg.
    pub start: Option<Text>,
    /// What the records hold: `otlp` (default; protobuf or JSON) or `debezium-json`.
    pub format: Option<Text>,
    /// For `otlp`: topic → signal (`traces`, `logs`, `metrics`, `profiles`) for topics not named like the
    /// Collector's.
    #[serde(default)]
    pub signals: BTreeMap<String, Text>,
    /// For `otlp`: the resource attribute the tables' `team` column holds (default `team`;
    /// e.g. `k8s.namespace.name`).
    pub team_attribute: Option<Text>,
    /// librdkafka properties passed through as given (security, timeouts, fetch sizes).
    #[serde(default)]
    pub properties: BTreeMap<String, Text>,
}

impl RawKafka {
    /// The typed settings of job `job`; problems go to `c`.
    pub fn check(&self, c: &mut Checker<'_>, job: &str) -> KafkaSettings {
        let topics = match &self.topics {
            Some(topics) => {
                if topics.is_empty() {
                    c.problem(None, "[source.kafka] topics is empty");
                }
                topics.iter().map(|t| c.text(t)).collect()
            }
            None => DEFAULT_TOPICS.iter().map(|t| t.to_string()).collect(),
        };
        KafkaSettings {
            brokers: c
                .opt(self.brokers.as_ref())
                .unwrap_or_else(|| "localhost:9092".into()),
            topics,
            group_id: c
                .opt(self.group_id.as_ref())
                .unwrap_or_else(|| format!("floe-{job}")),
            start: c.choice(
                self.start.as_ref(),
                "start",
                &[("earliest", StartAt::Earliest), ("latest", StartAt::Latest)],
                StartAt::Earliest,
            ),
            earliest_topics: Vec::new(),
            properties: self
                .properties
                .iter()
                .map(|(k, v)| (k.clone(), c.text(v)))
                .collect(),
        }
    }
}
