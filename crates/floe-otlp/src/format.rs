//! The OTLP [`Format`]: each record is decoded as the signal its topic carries.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use floe_core::{Format, SourceRecord, TableSpec};

use crate::decode::{Signal, decode};
use crate::rows::{Lineage, TableBuilders};
use crate::schema::OtlpTable;

/// OTLP records → the seven OTLP tables.
#[derive(Debug)]
pub struct OtlpFormat {
    signals: HashMap<String, Signal>,
    builders: TableBuilders,
}

impl OtlpFormat {
    /// A format reading `signals` (topic → signal); topics not listed use the Collector's
    /// default names (`otlp_spans`, `otlp_logs`, `otlp_metrics`).
    pub fn new(signals: HashMap<String, Signal>) -> Self {
        Self {
            signals,
            builders: TableBuilders::new(),
        }
    }

    fn signal(&self, topic: &str) -> Option<Signal> {
        self.signals
            .get(topic)
            .copied()
            .or_else(|| Signal::of_default_topic(topic))
    }
}

impl Format for OtlpFormat {
    fn tables(&self) -> Vec<TableSpec> {
        OtlpTable::ALL
            .iter()
            .map(|t| TableSpec {
                key: t.key(),
                default_name: t.default_name(),
                schema: t.schema(),
                time_column: "ts",
                bloom_filter_columns: match t {
                    OtlpTable::Spans | OtlpTable::Logs => &["trace_id"],
                    _ => &[],
                },
                plain_columns: t.plain_columns(),
            })
            .collect()
    }

    fn append(&mut self, record: &SourceRecord, ingested_at_us: i64) -> Result<usize, String> {
        let signal = self.signal(&record.topic).ok_or_else(|| {
            format!(
                "topic {} carries no known signal; map it in [source.kafka.signals]",
                record.topic
            )
        })?;
        let decoded = decode(signal, &record.payload).map_err(|e| e.to_string())?;
        Ok(self.builders.append(
            &decoded,
            &Lineage {
                topic: &record.topic,
                partition: record.partition,
                offset: record.offset,
                ingested_at_us,
            },
        ))
    }

    fn buffered_rows(&self) -> usize {
        self.builders.rows()
    }

    fn take(&mut self) -> Vec<(&'static str, RecordBatch)> {
        self.builders
            .finish()
            .into_iter()
            .map(|(t, b)| (t.key(), b))
            .collect()
    }
}
