//! `floe-otlp`: OpenTelemetry data (OTLP protobuf or JSON, as the Collector's Kafka exporter
//! writes it: traces, logs, metrics and profiles) → Arrow batches of Floe's Iceberg tables.
//!
//! * [`decode`] turns one record's bytes into a request of its signal, or a [`DecodeError`]
//!   that names why (the record then goes to the dead-letter table); every attribute map comes
//!   out with unique keys ([`attributes`]: the last value wins);
//! * [`TableBuilders`] appends decoded requests as rows of the tables in [`schema`], each row
//!   with its Kafka lineage, and hands out one `RecordBatch` per table;
//! * [`profiles`] pins the profiles protocol version, checks a record against its dictionary
//!   and reads its OTLP JSON;
//! * [`redact`] finds personal data and secrets in every string of a decoded record and
//!   masks, hashes or drops them before any row is built, counting the findings
//!   (`[source.redaction]`, the `pii_findings` stream);
//! * [`generate`] produces realistic OTLP records for the quickstart, tests and benchmarks;
//! * [`config`] holds the job file parts it owns (`[source.generator]`, `signals`).
//!
//! The crate does no I/O.

pub mod attributes;
pub mod config;
pub mod decode;
pub mod format;
pub mod generate;
pub mod profiles;
pub mod redact;
pub mod rows;
pub mod schema;

pub use decode::{DecodeError, Decoded, Signal, decode, decode_counted};
pub use format::OtlpFormat;
pub use generate::GeneratorSource;
pub use rows::{DEFAULT_TEAM_ATTRIBUTE, Lineage, TableBuilders};
pub use schema::OtlpTable;

impl TableBuilders {
    /// Appends a decoded record; returns the rows it produced.
    pub fn append(&mut self, decoded: &Decoded, from: &Lineage<'_>) -> usize {
        match decoded {
            Decoded::Traces(data) => self.append_traces(data, from),
            Decoded::Logs(data) => self.append_logs(data, from),
            Decoded::Metrics(data) => self.append_metrics(data, from),
            Decoded::Profiles(data) => self.append_profiles(data, from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    #[test]
    fn generated_records_become_rows_of_every_table() {
        let mut generator = generate::Generator::new(7, 1_700_000_000_000_000_000);
        let mut builders = TableBuilders::new();
        let from = Lineage {
            topic: "t",
            partition: 0,
            offset: 5,
            ingested_at_us: 1,
        };
        let mut expected = 0;
        let records: Vec<_> = generator
            .requests(20)
            .into_iter()
            .chain([generator.metrics(), generator.profiles(10)])
            .collect();
        for record in records {
            let decoded = decode(record.signal, &record.bytes).unwrap();
            assert_eq!(builders.append(&decoded, &from), record.items);
            expected += record.items;
        }
        assert_eq!(builders.rows(), expected);
        let batches = builders.finish();
        assert_eq!(batches.len(), OtlpTable::ALL.len(), "every table gets rows");
        let total: usize = batches.iter().map(|(_, b)| b.num_rows()).sum();
        assert_eq!(total, expected);
        let (_, spans) = &batches[0];
        assert_eq!(spans.num_rows(), 100);
        let offsets = spans
            .column_by_name("kafka_offset")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert!(offsets.iter().all(|o| o == Some(5)));
        let roots = spans.column_by_name("is_root").unwrap().as_boolean();
        assert_eq!(roots.true_count(), 20, "one root per request");
        assert_eq!(builders.rows(), 0);
    }

    #[test]
    fn the_team_column_holds_the_configured_resource_attribute() {
        let from = Lineage {
            topic: "t",
            partition: 0,
            offset: 0,
            ingested_at_us: 1,
        };
        let teams = |builders: TableBuilders| {
            let mut builders = builders;
            let mut generator = generate::Generator::new(3, 1_700_000_000_000_000_000);
            let [traces, logs] = generator.requests(4);
            for record in [traces, logs] {
                let decoded = decode(record.signal, &record.bytes).unwrap();
                builders.append(&decoded, &from);
            }
            let mut seen = std::collections::BTreeSet::new();
            for (_, batch) in builders.finish() {
                let team = batch.column_by_name("team").unwrap().as_string::<i32>();
                let service = batch
                    .column_by_name("service_name")
                    .unwrap()
                    .as_string::<i32>();
                for row in 0..batch.num_rows() {
                    let team = team.is_valid(row).then(|| team.value(row).to_string());
                    seen.insert((team, service.value(row).to_string()));
                }
            }
            seen
        };
        let default = teams(TableBuilders::new());
        assert!(default.len() > 1, "{default:?}");
        assert!(
            default
                .iter()
                .all(|(t, _)| t.as_deref() == Some("shop-core")),
            "{default:?}"
        );
        let by_service = teams(TableBuilders::new().with_team_attribute("service.name"));
        assert!(
            by_service.iter().all(|(t, s)| t.as_deref() == Some(s)),
            "a promoted attribute can be the team too: {by_service:?}"
        );
        let absent = teams(TableBuilders::new().with_team_attribute("k8s.namespace.name"));
        assert!(absent.iter().all(|(t, _)| t.is_none()), "{absent:?}");
    }

    #[test]
    fn json_and_protobuf_give_the_same_rows() {
        let mut generator = generate::Generator::new(1, 1_700_000_000_000_000_000);
        let [traces, _] = generator.requests(3);
        let Decoded::Traces(data) = decode(Signal::Traces, &traces.bytes).unwrap() else {
            panic!("traces")
        };
        let json = serde_json::to_vec(&data).unwrap();
        assert_eq!(
            decode(Signal::Traces, &json).unwrap(),
            Decoded::Traces(data)
        );
    }
}
