//! The dead-letter table: records the format refused, with the raw bytes (NULL when the
//! format keeps none: one that redacts personal data) and the reason.
//!
//! It is also the job's **anchor**: every checkpoint commits to it (an empty snapshot when no
//! record was refused), so its newest marker of the job always holds the positions of every
//! partition the job has committed — the one place recovery reads them from.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_array::builder::{
    Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder, TimestampMicrosecondBuilder,
};
use floe_core::DeadLetter;
use floe_lake::tables::{PartitionField, Wanted, ensure_table};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

/// Loads (creating it, and the job's namespace, if missing) the job's dead-letter table, and
/// its writer settings.
pub(crate) async fn ensure_anchor(
    client: &floe_lake::rest::CatalogClient,
    config: &crate::job::JobConfig,
) -> floe_lake::LakeResult<(
    floe_lake::rest::LoadedTable,
    floe_lake::writer::WriterOptions,
)> {
    client
        .ensure_namespace(&[config.catalog.namespace.as_str()])
        .await?;
    let options = crate::landing::writer_options(config, 128 * 1024 * 1024, &[], &[]);
    let table = ensure_table(
        client,
        &config.catalog.namespace,
        &Wanted {
            name: &config.dead_letter_table,
            schema: &schema(),
            partition: &[PartitionField::day("ts")],
            properties: &options.to_table_properties(),
            maintained: &Default::default(),
        },
    )
    .await?;
    Ok((table, options))
}

/// The dead-letter table's schema.
pub fn schema() -> Schema {
    let p = |t| Type::Primitive(t);
    Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(
                1,
                "ts",
                p(PrimitiveType::Timestamptz),
            )),
            Arc::new(NestedField::required(2, "error", p(PrimitiveType::String))),
            Arc::new(NestedField::optional(3, "raw", p(PrimitiveType::Binary))),
            Arc::new(NestedField::required(
                4,
                "kafka_topic",
                p(PrimitiveType::String),
            )),
            Arc::new(NestedField::required(
                5,
                "kafka_partition",
                p(PrimitiveType::Int),
            )),
            Arc::new(NestedField::required(
                6,
                "kafka_offset",
                p(PrimitiveType::Long),
            )),
        ])
        .build()
        .expect("a valid schema")
}

/// Refused records waiting for the next flush.
#[derive(Debug, Default)]
pub(crate) struct DeadLetters {
    ts: TimestampMicrosecondBuilder,
    error: StringBuilder,
    raw: LargeBinaryBuilder,
    topic: StringBuilder,
    partition: Int32Builder,
    offset: Int64Builder,
    rows: usize,
}

impl DeadLetters {
    pub(crate) fn push(&mut self, letter: &DeadLetter, now_us: i64) {
        self.ts.append_value(now_us);
        self.error.append_value(&letter.reason);
        // No bytes (a format that redacts keeps none, or an empty record): NULL.
        match letter.raw.is_empty() {
            true => self.raw.append_null(),
            false => self.raw.append_value(&letter.raw),
        }
        self.topic.append_value(&letter.topic);
        self.partition.append_value(letter.partition);
        self.offset.append_value(letter.offset);
        self.rows += 1;
    }

    /// The buffered rows (columns named as in [`schema`]); empty again afterwards.
    pub(crate) fn take(&mut self) -> Option<RecordBatch> {
        if self.rows == 0 {
            return None;
        }
        self.rows = 0;
        let ts = self.ts.finish().with_timezone("+00:00");
        RecordBatch::try_from_iter([
            ("ts", Arc::new(ts) as _),
            ("error", Arc::new(self.error.finish()) as _),
            ("raw", Arc::new(self.raw.finish()) as _),
            ("kafka_topic", Arc::new(self.topic.finish()) as _),
            ("kafka_partition", Arc::new(self.partition.finish()) as _),
            ("kafka_offset", Arc::new(self.offset.finish()) as _),
        ])
        .ok()
    }
}
