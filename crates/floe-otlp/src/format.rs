//! The OTLP [`Format`]: each record is decoded as the signal its topic carries.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use floe_core::{Appended, Format, Refused, SourceRecord, StreamSpec};

use crate::decode::{Signal, decode_counted};
use crate::rows::{Lineage, TableBuilders};
use crate::schema::OtlpTable;

/// OTLP records → the eight OTLP tables.
#[derive(Debug)]
pub struct OtlpFormat {
    signals: HashMap<String, Signal>,
    builders: TableBuilders,
    /// Attribute entries dropped for a later one of the same key, since the start.
    duplicate_keys: u64,
    /// The source has one partition: its streams say so ([`floe_core::exchange::ONE_PARTITION`]).
    one_partition: bool,
}

impl OtlpFormat {
    /// A format reading `signals` (topic → signal); topics not listed use the Collector's
    /// default names (`otlp_spans`, `otlp_logs`, `otlp_metrics`, `otlp_profiles`).
    pub fn new(signals: HashMap<String, Signal>) -> Self {
        Self {
            signals,
            builders: TableBuilders::new(),
            duplicate_keys: 0,
            one_partition: false,
        }
    }

    /// The format of a source with a single partition (the generator): every row of a
    /// stream is in one partition, which operators needing a key's rows in one place accept.
    pub fn one_partition(mut self) -> Self {
        self.one_partition = true;
        self
    }

    /// The `team` column holds resource attribute `name` (default `team`).
    pub fn team_attribute(mut self, name: impl Into<String>) -> Self {
        self.builders = std::mem::take(&mut self.builders).with_team_attribute(name);
        self
    }

    fn signal(&self, topic: &str) -> Option<Signal> {
        self.signals
            .get(topic)
            .copied()
            .or_else(|| Signal::of_default_topic(topic))
    }
}

impl Format for OtlpFormat {
    fn streams(&self) -> Vec<StreamSpec> {
        OtlpTable::ALL
            .iter()
            .map(|t| StreamSpec {
                name: t.key().to_string(),
                table: t.default_name().to_string(),
                schema: Some(t.schema()),
                changelog: false,
                key: Vec::new(),
                time_column: Some("ts".to_string()),
                partition: vec![("ts".to_string(), iceberg::spec::Transform::Day)],
                bloom_filter_columns: match t {
                    OtlpTable::Spans | OtlpTable::Logs | OtlpTable::Profiles => {
                        vec!["trace_id".to_string()]
                    }
                    _ => Vec::new(),
                },
                plain_columns: t.plain_columns().iter().map(|c| c.to_string()).collect(),
                properties: if self.one_partition {
                    vec![(
                        floe_core::exchange::ONE_PARTITION.to_string(),
                        "true".to_string(),
                    )]
                } else {
                    Vec::new()
                },
            })
            .collect()
    }

    fn append(&mut self, record: &SourceRecord, ingested_at_us: i64) -> Result<Appended, Refused> {
        let signal = self.signal(&record.topic).ok_or_else(|| {
            format!(
                "topic {} carries no known signal; map it in [source.kafka.signals]",
                record.topic
            )
        })?;
        let (decoded, duplicates) =
            decode_counted(signal, &record.payload).map_err(|e| e.to_string())?;
        self.duplicate_keys += duplicates;
        self.builders.append(
            &decoded,
            &Lineage {
                topic: &record.topic,
                partition: record.partition,
                offset: record.offset,
                ingested_at_us,
            },
        );
        Ok(Appended::Rows)
    }

    fn buffered_rows(&self) -> usize {
        self.builders.rows()
    }

    fn stream_rows(&self, stream: usize) -> usize {
        OtlpTable::ALL
            .get(stream)
            .map_or(0, |t| self.builders.table_rows(*t))
    }

    fn status(&self) -> Vec<(&'static str, i64)> {
        vec![("otlp_duplicate_attribute_keys", self.duplicate_keys as i64)]
    }

    fn take(&mut self) -> Vec<(usize, RecordBatch)> {
        self.builders
            .finish()
            .into_iter()
            .map(|(t, b)| (t as usize, b))
            .collect()
    }
}
