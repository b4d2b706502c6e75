//! The `pii_findings` stream: each record's [`Findings`] as rows of
//! [`crate::schema::findings_schema`], with the record's lineage.

use std::sync::Arc;

use arrow_array::builder::{
    Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;

use super::Findings;
use crate::rows::Lineage;
use crate::schema::{arrow_of, findings_schema};

/// The stream's key in job files (`[tables.pii_findings]`).
pub const FINDINGS_STREAM: &str = "pii_findings";
/// Its table's default name.
pub const FINDINGS_TABLE: &str = "otel_pii_findings";

/// Rows of the findings stream since the last [`finish`](Self::finish).
#[derive(Debug)]
pub struct FindingsBuilder {
    schema: SchemaRef,
    ts: TimestampMicrosecondBuilder,
    service: StringBuilder,
    signal: StringBuilder,
    field: StringBuilder,
    detector: StringBuilder,
    action: StringBuilder,
    count: Int64Builder,
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    item: Int32Builder,
    ingested: TimestampMicrosecondBuilder,
    rows: usize,
}

impl Default for FindingsBuilder {
    fn default() -> Self {
        Self {
            schema: arrow_of(&findings_schema()),
            ts: TimestampMicrosecondBuilder::new(),
            service: StringBuilder::new(),
            signal: StringBuilder::new(),
            field: StringBuilder::new(),
            detector: StringBuilder::new(),
            action: StringBuilder::new(),
            count: Int64Builder::new(),
            topic: StringBuilder::new(),
            partition: Int32Builder::new(),
            offset: Int64Builder::new(),
            item: Int32Builder::new(),
            ingested: TimestampMicrosecondBuilder::new(),
            rows: 0,
        }
    }
}

impl FindingsBuilder {
    /// The stream's Arrow schema (with Iceberg field ids).
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Appends one record's findings, in key order (`kafka_item` numbers them).
    pub fn append(&mut self, findings: &Findings, lineage: &Lineage<'_>) {
        for (item, ((minute, service, signal, field, detector, action), count)) in
            findings.0.iter().enumerate()
        {
            self.ts.append_value(*minute);
            match service.is_empty() {
                true => self.service.append_null(),
                false => self.service.append_value(service),
            }
            self.signal.append_value(signal);
            self.field.append_value(field);
            self.detector.append_value(detector);
            self.action.append_value(action.name());
            self.count.append_value(*count as i64);
            self.topic.append_value(lineage.topic);
            self.partition.append_value(lineage.partition);
            self.offset.append_value(lineage.offset);
            self.item.append_value(item as i32);
            self.ingested.append_value(lineage.ingested_at_us);
            self.rows += 1;
        }
    }

    /// Rows appended since the last finish.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The rows appended since the last finish, if any.
    pub fn finish(&mut self) -> Option<RecordBatch> {
        if self.rows == 0 {
            return None;
        }
        self.rows = 0;
        let utc = |b: &mut TimestampMicrosecondBuilder| -> ArrayRef {
            Arc::new(b.finish().with_timezone("+00:00"))
        };
        let columns: Vec<ArrayRef> = vec![
            utc(&mut self.ts),
            Arc::new(self.service.finish()),
            Arc::new(self.signal.finish()),
            Arc::new(self.field.finish()),
            Arc::new(self.detector.finish()),
            Arc::new(self.action.finish()),
            Arc::new(self.count.finish()),
            Arc::new(self.topic.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.item.finish()),
            utc(&mut self.ingested),
        ];
        Some(RecordBatch::try_new(self.schema.clone(), columns).expect("the findings schema"))
    }
}
