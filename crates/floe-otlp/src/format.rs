//! The OTLP [`Format`]: each record is decoded as the signal its topic carries — and, with
//! `[source.redaction]`, redacted before any row is built ([`crate::redact`]): its findings
//! become the `pii_findings` stream (after the eight tables), a refused record's reason is
//! redacted too, and its raw bytes are not kept for the dead-letter table.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use floe_core::{Appended, Format, Refused, SourceRecord, StreamSpec};

use crate::decode::{Signal, decode_counted};
use crate::redact::{FINDINGS_STREAM, FINDINGS_TABLE, Findings, FindingsBuilder, redact};
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
    /// `[source.redaction]`: the redactor and the findings stream's rows.
    redaction: Option<(floe_pii::Redactor, FindingsBuilder)>,
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
            redaction: None,
        }
    }

    /// Redacts every record with `redactor` before its rows are built; adds the
    /// `pii_findings` stream.
    pub fn redacting(mut self, redactor: floe_pii::Redactor) -> Self {
        self.redaction = Some((redactor, FindingsBuilder::default()));
        self
    }

    /// A refused record's reason, which may quote the record: with redaction on, every quoted
    /// value in it becomes its length (what a decoder quotes may be cut short, too short for
    /// a detector to recognise), and whatever the redactor finds in the rest is masked.
    fn redact_reason(&self, text: String) -> String {
        static QUOTED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new(r#""(?:[^"\\]|\\.)*"?|`[^`]*`?"#).expect("a valid pattern")
        });
        let Some((redactor, _)) = &self.redaction else {
            return text;
        };
        let text = QUOTED
            .replace_all(&text, |c: &regex::Captures<'_>| {
                format!("<{} characters withheld>", c[0].chars().count())
            })
            .into_owned();
        match redactor.redact(None, &text, &mut |_| {}) {
            floe_pii::Outcome::Replaced(new) => new,
            floe_pii::Outcome::Kept => text,
            _ => "(the reason held personal data and was withheld)".to_string(),
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
        streams(self.one_partition, self.redaction.is_some())
    }

    fn append(&mut self, record: &SourceRecord, ingested_at_us: i64) -> Result<Appended, Refused> {
        let signal = self.signal(&record.topic).ok_or_else(|| {
            format!(
                "topic {} carries no known signal; map it in [source.kafka.signals]",
                record.topic
            )
        })?;
        let (mut decoded, duplicates) = decode_counted(signal, &record.payload)
            .map_err(|e| self.redact_reason(e.to_string()))?;
        self.duplicate_keys += duplicates;
        let lineage = Lineage {
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            ingested_at_us,
        };
        if let Some((redactor, findings)) = &mut self.redaction {
            let mut found = Findings::default();
            redact(&mut decoded, redactor, &mut found);
            findings.append(&found, &lineage);
        }
        self.builders.append(&decoded, &lineage);
        Ok(Appended::Rows)
    }

    fn buffered_rows(&self) -> usize {
        self.builders.rows() + self.redaction.as_ref().map_or(0, |(_, f)| f.rows())
    }

    fn stream_rows(&self, stream: usize) -> usize {
        match OtlpTable::ALL.get(stream) {
            Some(t) => self.builders.table_rows(*t),
            None => self.redaction.as_ref().map_or(0, |(_, f)| f.rows()),
        }
    }

    fn keeps_raw(&self) -> bool {
        self.redaction.is_none()
    }

    fn status(&self) -> Vec<(&'static str, i64)> {
        vec![("otlp_duplicate_attribute_keys", self.duplicate_keys as i64)]
    }

    fn take(&mut self) -> Vec<(usize, RecordBatch)> {
        let mut batches: Vec<(usize, RecordBatch)> = self
            .builders
            .finish()
            .into_iter()
            .map(|(t, b)| (t as usize, b))
            .collect();
        if let Some(batch) = self.redaction.as_mut().and_then(|(_, f)| f.finish()) {
            batches.push((OtlpTable::ALL.len(), batch));
        }
        batches
    }
}

/// The streams of an OTLP source: the eight tables' and, when it redacts (`findings`), the
/// `pii_findings` stream after them; with `one_partition`, each says its rows are in one
/// partition.
pub fn streams(one_partition: bool, findings: bool) -> Vec<StreamSpec> {
    let properties = if one_partition {
        vec![(
            floe_core::exchange::ONE_PARTITION.to_string(),
            "true".to_string(),
        )]
    } else {
        Vec::new()
    };
    let mut streams: Vec<StreamSpec> = OtlpTable::ALL
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
            properties: properties.clone(),
        })
        .collect();
    if findings {
        streams.push(StreamSpec {
            name: FINDINGS_STREAM.to_string(),
            table: FINDINGS_TABLE.to_string(),
            schema: Some(crate::schema::findings_schema()),
            changelog: false,
            key: Vec::new(),
            time_column: Some("ts".to_string()),
            partition: vec![("ts".to_string(), iceberg::spec::Transform::Day)],
            bloom_filter_columns: Vec::new(),
            plain_columns: Vec::new(),
            properties,
        });
    }
    streams
}
