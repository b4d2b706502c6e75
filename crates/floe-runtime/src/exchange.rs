//! Exchanges: a stream re-keyed through a topic, so that every row of a key reaches one
//! partition of the output stream — Flink's `keyBy` shuffle, on Kafka as Kafka Streams'
//! repartition topics are ([ADR 0007](../../../docs/adr/0007-exchange-through-kafka.md)).
//!
//! ```text
//!  input rows ─> Outbound: partition = fnv1a(key) mod P, one record per (source partition, P)
//!                   │ key = the source partition ("otlp_spans/3"), value = Arrow IPC rows
//!                   v
//!            exchange topic (P partitions) ──> the job's consumer ──> ExchangeFormat: rows of
//!                                                                     the output stream, each
//!                                                                     exchange partition its
//!                                                                     own source partition
//! ```
//!
//! **Exactly once.** The writing side flushes a checkpoint's records before the checkpoint
//! commits; a checkpoint that is dropped or replayed after a crash sends its records again.
//! The reading side keeps, per (exchange partition, source partition), the lineage
//! `(kafka_offset, kafka_item)` of the last row it took, and drops rows at or before it. That
//! mark is a position entry of the exchange partition (`<topic>/<p>#from=<source partition>`),
//! committed with the rows in the same checkpoint, so it moves with the partition on a
//! rebalance and survives kill -9. It is exact because per (source partition, exchange
//! partition) every send is the same rows in the same order (a row's partition depends only on
//! its key; the input is a pure function of the source records) and the producer lands them
//! in order without gaps.

use std::collections::{BTreeMap, HashMap};
use std::io::Cursor;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, BooleanArray, RecordBatch, UInt32Array};
use floe_core::{
    Appended, ExchangeProducer, Format, Positions, Refused, SourceError, SourceRecord, StreamBatch,
    StreamSpec,
};
use floe_ops::config::{EXCHANGE_LINEAGE, OperatorKind, Pipeline};

use crate::job::derive_streams;

/// An exchange of a job, resolved.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The operator id.
    pub id: String,
    /// The stream it reads.
    pub input: String,
    /// The stream it produces (read back from the topic).
    pub output: StreamSpec,
    /// The topic.
    pub topic: String,
    /// Its partitions.
    pub partitions: i32,
    /// `retention.ms`.
    pub retention_ms: i64,
    /// Copies of each partition (-1: the brokers' default).
    pub replication: i32,
    /// Key columns.
    pub key: Vec<String>,
}

/// The exchanges of `job`'s pipeline over the source's `known` streams (topic default
/// `floe.<job>.<id>`).
pub fn exchanges(job: &str, pipeline: &Pipeline, known: &[StreamSpec]) -> Vec<Exchange> {
    let (specs, _) = derive_streams(pipeline, known);
    pipeline
        .operators
        .iter()
        .filter_map(|op| {
            let OperatorKind::Exchange(x) = &op.kind else {
                return None;
            };
            let output = specs.iter().find(|s| s.name == op.outputs[0])?.clone();
            Some(Exchange {
                id: op.id.clone(),
                input: op.input.clone(),
                output,
                topic: x
                    .topic
                    .clone()
                    .unwrap_or_else(|| format!("floe.{job}.{}", op.id)),
                partitions: x.partitions,
                retention_ms: x.retention_ms,
                replication: x.replication,
                key: x.key.clone(),
            })
        })
        .collect()
}

/// FNV-1a, 64 bits: a hash fixed forever (a row's partition must never depend on the build).
fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The exchange partition of every row of `batch`: FNV-1a over each key column's value as
/// text (a null hashes as one 0x01 byte, a value ends with 0x00).
fn partitions_of(batch: &RecordBatch, key: &[String], partitions: i32) -> Result<Vec<u32>, String> {
    let mut hashes = vec![FNV_OFFSET; batch.num_rows()];
    for column in key {
        let values = batch
            .column_by_name(column)
            .ok_or_else(|| format!("no key column {column}"))?;
        let text = arrow_cast::cast(values, &arrow_schema::DataType::Utf8)
            .map_err(|e| format!("key column {column}: {e}"))?;
        let text = text.as_string::<i32>();
        for (row, hash) in hashes.iter_mut().enumerate() {
            *hash = if text.is_null(row) {
                fnv1a(*hash, &[1])
            } else {
                fnv1a(fnv1a(*hash, text.value(row).as_bytes()), &[0])
            };
        }
    }
    Ok(hashes
        .into_iter()
        .map(|h| (h % partitions as u64) as u32)
        .collect())
}

/// The most bytes an exchange record should hold: well under Kafka's default message limit
/// (1 MiB), so that a broker's defaults never refuse one.
const RECORD_BYTES: usize = 768 * 1024;

/// `batch` as Arrow IPC records of at most [`RECORD_BYTES`] each (a single row may exceed it),
/// the rows in order.
fn encode_split(batch: &RecordBatch, out: &mut Vec<Vec<u8>>) -> Result<(), String> {
    let encoded = encode(batch)?;
    if encoded.len() <= RECORD_BYTES || batch.num_rows() <= 1 {
        out.push(encoded);
        return Ok(());
    }
    // Rows per record from this batch's average, then checked again (rows vary in size).
    let per_row = encoded.len().div_ceil(batch.num_rows());
    let rows = (RECORD_BYTES / per_row.max(1)).clamp(1, batch.num_rows() / 2);
    let mut offset = 0;
    while offset < batch.num_rows() {
        let n = rows.min(batch.num_rows() - offset);
        encode_split(&batch.slice(offset, n), out)?;
        offset += n;
    }
    Ok(())
}

fn encode(batch: &RecordBatch) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(batch.get_array_memory_size() / 2 + 1024);
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &batch.schema())
        .map_err(|e| e.to_string())?;
    writer.write(batch).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    drop(writer);
    Ok(out)
}

/// The writing side: a job's exchanges and the producer of their topics.
pub struct Outbound {
    producer: Arc<dyn ExchangeProducer>,
    exchanges: HashMap<String, Exchange>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("exchanges", &self.exchanges.len())
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// The exchanges, writing through `producer`.
    pub fn new(producer: Arc<dyn ExchangeProducer>, exchanges: Vec<Exchange>) -> Self {
        Self {
            producer,
            exchanges: exchanges.into_iter().map(|x| (x.id.clone(), x)).collect(),
        }
    }

    /// The records of rows `batch` that exchange `id` reads: per run of a source partition,
    /// the rows going to each exchange partition, in their order, in records of at most
    /// [`RECORD_BYTES`].
    pub(crate) fn records(
        &self,
        id: &str,
        batch: &StreamBatch,
        names: &dyn Fn(u32) -> String,
    ) -> Result<Vec<(i32, String, Vec<u8>)>, String> {
        let x = self
            .exchanges
            .get(id)
            .ok_or_else(|| format!("no exchange {id}"))?;
        let mut records = Vec::new();
        for (partition, rows) in batch.slices() {
            let targets = partitions_of(&rows, &x.key, x.partitions)?;
            let mut by_target: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for (row, target) in targets.into_iter().enumerate() {
                by_target.entry(target).or_default().push(row as u32);
            }
            let source = names(partition);
            for (target, indices) in by_target {
                let picked = if indices.len() == rows.num_rows() {
                    rows.clone()
                } else {
                    arrow_select::take::take_record_batch(&rows, &UInt32Array::from(indices))
                        .map_err(|e| e.to_string())?
                };
                let mut encoded = Vec::new();
                encode_split(&picked, &mut encoded)?;
                records.extend(
                    encoded
                        .into_iter()
                        .map(|payload| (target as i32, source.clone(), payload)),
                );
            }
        }
        Ok(records)
    }

    /// Sends the records of exchange `id`.
    pub(crate) async fn send(
        &self,
        id: &str,
        records: Vec<(i32, String, Vec<u8>)>,
    ) -> Result<(), SourceError> {
        let topic = &self.exchanges[id].topic;
        for (partition, key, payload) in &records {
            self.producer
                .send(topic, *partition, key.as_bytes(), payload)
                .await?;
        }
        Ok(())
    }

    /// Waits until every record sent is in its topic (before the checkpoint commits).
    pub(crate) async fn flush(&self) -> Result<u64, SourceError> {
        self.producer.flush().await
    }

    /// The checkpoint was dropped: its records are no longer waited for.
    pub(crate) fn forget(&self) {
        self.producer.forget();
    }
}

/// The mark entry of exchange partition `partition_key` for `source`.
fn mark_key(partition_key: &str, source: &str) -> String {
    format!("{partition_key}{MARK}{source}")
}

/// What separates an exchange partition from the source partition in a mark entry.
const MARK: &str = "#from=";

/// One exchange as the reading side knows it.
#[derive(Debug)]
struct Inbound {
    topic: String,
    spec: StreamSpec,
    batches: Vec<RecordBatch>,
    rows: usize,
}

/// A [`Format`] that reads a job's exchange topics besides what `inner` reads: their records
/// become rows of the exchanges' output streams (after `inner`'s streams), rows already taken
/// dropped by their marks.
#[derive(Debug)]
pub struct ExchangeFormat<F: Format> {
    inner: F,
    /// How many streams `inner` has (fixed: an exchange needs known streams).
    inner_streams: usize,
    inbound: Vec<Inbound>,
    /// Per (exchange topic, partition, source partition): the lineage of the last row taken.
    marks: BTreeMap<(String, i32, String), (i64, i32)>,
}

impl<F: Format> ExchangeFormat<F> {
    /// `inner` plus the output streams of `exchanges`.
    pub fn new(inner: F, exchanges: &[Exchange]) -> Self {
        let inner_streams = inner.streams().len();
        Self {
            inner,
            inner_streams,
            inbound: exchanges
                .iter()
                .map(|x| Inbound {
                    topic: x.topic.clone(),
                    spec: x.output.clone(),
                    batches: Vec::new(),
                    rows: 0,
                })
                .collect(),
            marks: BTreeMap::new(),
        }
    }

    fn take_record(&mut self, index: usize, record: &SourceRecord) -> Result<(), String> {
        let source = record
            .key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
            .ok_or("an exchange record's key must name its source partition")?
            .to_string();
        let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(&record.payload), None)
            .map_err(|e| format!("not Arrow IPC: {e}"))?;
        let mark_at = (record.topic.to_string(), record.partition, source);
        for batch in reader {
            let batch = batch.map_err(|e| format!("not Arrow IPC: {e}"))?;
            let [offset, item] = EXCHANGE_LINEAGE.map(|c| batch.column_by_name(c));
            let (Some(offset), Some(item)) = (offset, item) else {
                return Err(format!("rows without {}", EXCHANGE_LINEAGE.join(" and ")));
            };
            let (Some(offset), Some(item)) = (
                offset.as_primitive_opt::<Int64Type>(),
                item.as_primitive_opt::<Int32Type>(),
            ) else {
                return Err("kafka_offset must be a long and kafka_item an int".into());
            };
            let mut last = self.marks.get(&mark_at).copied();
            let keep: BooleanArray = (0..batch.num_rows())
                .map(|row| {
                    let lineage = (offset.value(row), item.value(row));
                    let new = last.is_none_or(|seen| lineage > seen);
                    if new {
                        last = Some(lineage);
                    }
                    Some(new)
                })
                .collect();
            if let Some(last) = last {
                self.marks.insert(mark_at.clone(), last);
            }
            let kept = if keep.true_count() == batch.num_rows() {
                batch
            } else {
                arrow_select::filter::filter_record_batch(&batch, &keep)
                    .map_err(|e| e.to_string())?
            };
            if kept.num_rows() > 0 {
                let inbound = &mut self.inbound[index];
                inbound.rows += kept.num_rows();
                inbound.batches.push(kept);
            }
        }
        Ok(())
    }
}

impl<F: Format> Format for ExchangeFormat<F> {
    fn streams(&self) -> Vec<StreamSpec> {
        let mut streams = self.inner.streams();
        streams.extend(self.inbound.iter().map(|i| i.spec.clone()));
        streams
    }

    fn streams_version(&self) -> u64 {
        self.inner.streams_version()
    }

    fn append(&mut self, record: &SourceRecord, ingested_at_us: i64) -> Result<Appended, Refused> {
        match self.inbound.iter().position(|i| *i.topic == *record.topic) {
            Some(index) => {
                self.take_record(index, record)
                    .map_err(|e| Refused::Record(format!("exchange record: {e}")))?;
                Ok(Appended::Rows)
            }
            None => self.inner.append(record, ingested_at_us),
        }
    }

    fn buffered_rows(&self) -> usize {
        self.inner.buffered_rows() + self.inbound.iter().map(|i| i.rows).sum::<usize>()
    }

    fn stream_rows(&self, stream: usize) -> usize {
        match stream.checked_sub(self.inner_streams) {
            Some(i) => self.inbound.get(i).map_or(0, |i| i.rows),
            None => self.inner.stream_rows(stream),
        }
    }

    fn take(&mut self) -> Vec<(usize, RecordBatch)> {
        let mut out = self.inner.take();
        for (i, inbound) in self.inbound.iter_mut().enumerate() {
            inbound.rows = 0;
            out.extend(
                inbound
                    .batches
                    .drain(..)
                    .map(|b| (self.inner_streams + i, b)),
            );
        }
        out
    }

    fn positions(&self) -> Positions {
        let mut positions = self.inner.positions();
        for ((topic, partition, source), (offset, item)) in &self.marks {
            positions.insert(
                mark_key(&floe_core::position_key(topic, *partition), source),
                format!("{offset}:{item}"),
            );
        }
        positions
    }

    fn seek(&mut self, positions: &Positions) {
        self.inner.seek(positions);
        for inbound in &mut self.inbound {
            inbound.batches.clear();
            inbound.rows = 0;
        }
        self.marks.clear();
        for (key, value) in positions {
            let Some((partition_key, source)) = key.split_once(MARK) else {
                continue;
            };
            let (Some((topic, partition)), Some((offset, item))) =
                (partition_key.rsplit_once('/'), value.split_once(':'))
            else {
                continue;
            };
            if let (Ok(partition), Ok(offset), Ok(item)) =
                (partition.parse(), offset.parse(), item.parse())
                && self.inbound.iter().any(|i| i.topic == topic)
            {
                self.marks.insert(
                    (topic.to_string(), partition, source.to_string()),
                    (offset, item),
                );
            }
        }
    }

    fn status(&self) -> Vec<(&'static str, i64)> {
        self.inner.status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use floe_core::PartitionRun;

    /// A format with no streams of its own.
    #[derive(Debug, Default)]
    struct Nothing;

    impl Format for Nothing {
        fn streams(&self) -> Vec<StreamSpec> {
            Vec::new()
        }
        fn append(&mut self, _: &SourceRecord, _: i64) -> Result<Appended, Refused> {
            Err("not here".into())
        }
        fn buffered_rows(&self) -> usize {
            0
        }
        fn stream_rows(&self, _: usize) -> usize {
            0
        }
        fn take(&mut self) -> Vec<(usize, RecordBatch)> {
            Vec::new()
        }
    }

    fn rows(services: &[&str], offsets: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("service_name", DataType::Utf8, true),
            Field::new("kafka_offset", DataType::Int64, true),
            Field::new("kafka_item", DataType::Int32, true),
        ]));
        let items: Vec<i32> = (0..offsets.len() as i32).collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(services.to_vec())),
                Arc::new(Int64Array::from(offsets.to_vec())),
                Arc::new(Int32Array::from(items)),
            ],
        )
        .unwrap()
    }

    fn exchange(partitions: i32) -> Exchange {
        let schema = iceberg::spec::Schema::builder().build().unwrap();
        Exchange {
            id: "x".into(),
            input: "spans".into(),
            output: StreamSpec::append("by_service", "by_service", schema),
            topic: "x-topic".into(),
            partitions,
            retention_ms: 1,
            replication: -1,
            key: vec!["service_name".into()],
        }
    }

    /// A producer that keeps nothing: `records` is what is under test.
    struct Discard;

    impl ExchangeProducer for Discard {
        fn send<'a>(
            &'a self,
            _: &'a str,
            _: i32,
            _: &'a [u8],
            _: &'a [u8],
        ) -> floe_core::exchange::Sending<'a> {
            Box::pin(async { Ok(()) })
        }
        fn flush(&self) -> floe_core::exchange::Flushing<'_> {
            Box::pin(async { Ok(0) })
        }
        fn forget(&self) {}
    }

    fn record(partition: i32, source: &str, payload: Vec<u8>, offset: i64) -> SourceRecord {
        SourceRecord {
            topic: Arc::from("x-topic"),
            partition,
            offset,
            payload,
            key: Some(source.as_bytes().to_vec()),
        }
    }

    #[test]
    fn the_partition_of_a_key_is_fixed_forever() {
        // FNV-1a of "checkout\0": a change here moves every committed key.
        let batch = rows(&["checkout", "checkout", "cart"], &[1, 1, 2]);
        let p = partitions_of(&batch, &["service_name".into()], 12).unwrap();
        assert_eq!(p[0], p[1]);
        assert_eq!(
            u64::from(p[0]),
            fnv1a(fnv1a(FNV_OFFSET, b"checkout"), &[0]) % 12
        );
    }

    #[test]
    fn rows_sent_twice_are_taken_once_and_marks_survive_a_seek() {
        let outbound = Outbound::new(Arc::new(Discard), vec![exchange(3)]);
        let batch = StreamBatch {
            stream: 0,
            batch: rows(&["a", "b", "c", "a", "b", "c"], &[10, 10, 11, 11, 12, 12]),
            runs: vec![
                PartitionRun {
                    partition: 0,
                    rows: 4,
                },
                PartitionRun {
                    partition: 1,
                    rows: 2,
                },
            ],
        };
        let names = |p: u32| format!("spans/{p}");
        let records = outbound.records("x", &batch, &names).unwrap();
        let targets = partitions_of(&batch.batch, &["service_name".into()], 3).unwrap();
        let pairs: std::collections::BTreeSet<(u32, u32)> = targets
            .iter()
            .enumerate()
            .map(|(row, t)| (u32::from(row >= 4), *t))
            .collect();
        assert_eq!(
            records.len(),
            pairs.len(),
            "one record per (source partition, target)"
        );

        let mut format = ExchangeFormat::new(Nothing, &[exchange(3)]);
        // Sent, then sent again (a replay after a crash), then only the second half again.
        let mut offset = 0;
        for round in [&records[..], &records[..], &records[records.len() / 2..]] {
            for (p, key, payload) in round {
                format
                    .append(&record(*p, key, payload.clone(), offset), 0)
                    .unwrap();
                offset += 1;
            }
        }
        assert_eq!(format.buffered_rows(), 6, "every row once");
        let positions = format.positions();
        assert!(
            positions
                .keys()
                .any(|k| k.starts_with("x-topic/") && k.contains("#from=spans/")),
            "{positions:?}"
        );
        let taken: usize = format.take().iter().map(|(_, b)| b.num_rows()).sum();
        assert_eq!(taken, 6);

        // A restart from the committed marks: the same records are all dropped.
        let mut restarted = ExchangeFormat::new(Nothing, &[exchange(3)]);
        restarted.seek(&positions);
        for (p, key, payload) in &records {
            restarted
                .append(&record(*p, key, payload.clone(), 0), 0)
                .unwrap();
        }
        assert_eq!(restarted.buffered_rows(), 0);
        // Without marks, they are all taken.
        restarted.seek(&Positions::new());
        for (p, key, payload) in &records {
            restarted
                .append(&record(*p, key, payload.clone(), 0), 0)
                .unwrap();
        }
        assert_eq!(restarted.buffered_rows(), 6);
    }

    #[test]
    fn large_batches_go_as_several_records_under_the_limit_all_taken() {
        let service = "s".repeat(1000);
        let services = vec![service.as_str(); 3000];
        let offsets: Vec<i64> = (0..3000).collect();
        let batch = StreamBatch::single(0, rows(&services, &offsets), 0);
        let outbound = Outbound::new(Arc::new(Discard), vec![exchange(3)]);
        let records = outbound
            .records("x", &batch, &|p| format!("spans/{p}"))
            .unwrap();
        assert!(records.len() >= 4, "{} records", records.len());
        assert!(records.iter().all(|(_, _, r)| r.len() <= RECORD_BYTES));
        let mut format = ExchangeFormat::new(Nothing, &[exchange(3)]);
        for (i, (p, key, payload)) in records.iter().enumerate() {
            format
                .append(&record(*p, key, payload.clone(), i as i64), 0)
                .unwrap();
        }
        assert_eq!(format.buffered_rows(), 3000);
    }

    #[test]
    fn a_record_that_is_not_arrow_is_refused() {
        let mut format = ExchangeFormat::new(Nothing, &[exchange(3)]);
        let refused = format.append(&record(0, "spans/0", b"{}".to_vec(), 0), 0);
        assert!(matches!(refused, Err(Refused::Record(r)) if r.contains("Arrow IPC")));
    }
}
