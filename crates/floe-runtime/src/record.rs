//! [`RecordReader`]: a [`Source`] of records decoded by a [`Format`] — the reader of every
//! Kafka job (OTLP, Debezium) and of the quickstart's generator.
//!
//! * **Positions** are the next offset of every owned partition (the committed one until a
//!   record of it is read), plus the format's own entries for those partitions.
//! * **Partitions.** Each row keeps the partition of the record it came from: after every
//!   record, the rows each stream gained are added to that stream's partition runs, so a
//!   taken batch knows which rows came from where at no per-row cost.
//! * **Bad records** are refused by the format and handed over as dead letters; a refusal
//!   that says nothing after it can be applied stops the job.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use floe_core::{
    Appended, Committed, DeadLetter, Format, PartitionRun, PollLimit, Polled, Positions, ReadItem,
    ReadOut, Reader, Refused, Source, SourceError, SourceRecord, StreamBatch, StreamSpec,
    extend_runs, partition_of_entry, position_key,
};
use prometheus::IntCounterVec;

/// What one poll may take from the source: the records waiting for decoding stay small.
const POLL: PollLimit = PollLimit {
    records: 8192,
    bytes: 8 * 1024 * 1024,
};

/// Records of a [`Source`] decoded by a [`Format`].
pub struct RecordReader<S: Source, F: Format> {
    source: S,
    format: F,
    records: Vec<SourceRecord>,
    /// Positions of the owned partitions after the records read so far.
    current: Positions,
    /// Partition position keys by index, and back.
    partitions: Vec<String>,
    partition_index: HashMap<(Arc<str>, i32), u32>,
    /// Rows of each stream taken from the format so far, and their partition runs.
    counted: Vec<usize>,
    runs: Vec<Vec<PartitionRun>>,
    dead_letters: Vec<DeadLetter>,
    /// How many streams the format has, as of `streams_version`.
    stream_count: (u64, usize),
    /// Items waiting for the next take (rows handed over early by a truncate).
    pending: Vec<ReadItem>,
    bytes: u64,
    topic_bytes: Option<IntCounterVec>,
}

impl<S: Source, F: Format> std::fmt::Debug for RecordReader<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReader")
            .field("partitions", &self.partitions.len())
            .finish_non_exhaustive()
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

impl<S: Source, F: Format> RecordReader<S, F> {
    /// Reads `source` through `format`; `topic_bytes` (labelled by topic) counts payload bytes.
    pub fn new(source: S, format: F, topic_bytes: Option<IntCounterVec>) -> Self {
        Self {
            source,
            format,
            records: Vec::with_capacity(1024),
            current: Positions::new(),
            partitions: Vec::new(),
            partition_index: HashMap::new(),
            counted: Vec::new(),
            runs: Vec::new(),
            dead_letters: Vec::new(),
            stream_count: (u64::MAX, 0),
            pending: Vec::new(),
            bytes: 0,
            topic_bytes,
        }
    }

    fn partition(&mut self, topic: &Arc<str>, partition: i32) -> u32 {
        if let Some(&index) = self.partition_index.get(&(topic.clone(), partition)) {
            return index;
        }
        let index = self.partitions.len() as u32;
        self.partitions.push(position_key(topic, partition));
        self.partition_index
            .insert((topic.clone(), partition), index);
        index
    }

    /// Adds the rows each stream gained since the last call to the streams' runs.
    fn count_rows(&mut self, partition: u32) {
        let version = self.format.streams_version();
        if self.stream_count.0 != version {
            self.stream_count = (version, self.format.streams().len());
        }
        let streams = self.stream_count.1.max(self.counted.len());
        self.counted.resize(streams, 0);
        self.runs.resize_with(streams, Vec::new);
        for stream in 0..streams {
            let now = self.format.stream_rows(stream);
            if now > self.counted[stream] {
                extend_runs(
                    &mut self.runs[stream],
                    partition,
                    now - self.counted[stream],
                );
                self.counted[stream] = now;
            }
        }
    }

    /// Takes the format's rows with their runs into `items` (a stream's rows may come as
    /// several batches, in row order: each takes its share of the runs).
    fn take_rows(&mut self, items: &mut Vec<ReadItem>) {
        for (stream, batch) in self.format.take() {
            let runs = take_runs(&mut self.runs[stream], batch.num_rows());
            items.push(ReadItem::Rows(StreamBatch {
                stream,
                batch,
                runs,
            }));
        }
        for (stream, left) in self.runs.iter_mut().enumerate() {
            if !left.is_empty() {
                tracing::error!(stream, "the format counted rows it did not hand over");
                left.clear();
            }
        }
        self.counted.iter_mut().for_each(|c| *c = 0);
        // Clocks after the rows: they hold for everything read so far.
        for (stream, topic, partition, max_time) in self.format.take_clocks() {
            let partition = self.partition(&topic, partition);
            items.push(ReadItem::Clock {
                stream,
                partition,
                max_time,
            });
        }
    }

    fn decode(&mut self, record: &SourceRecord, ingested_at: i64) -> Result<(), SourceError> {
        let partition = self.partition(&record.topic, record.partition);
        match self.format.append(record, ingested_at) {
            Ok(Appended::Rows) => self.count_rows(partition),
            Ok(Appended::Truncate(stream)) => {
                self.count_rows(partition);
                let mut items = std::mem::take(&mut self.pending);
                self.take_rows(&mut items);
                items.push(ReadItem::Truncate(stream));
                self.pending = items;
            }
            Err(Refused::Record(reason)) => {
                tracing::debug!(topic = %record.topic, offset = record.offset, %reason, "dead letter");
                self.dead_letters.push(DeadLetter {
                    topic: record.topic.clone(),
                    partition: record.partition,
                    offset: record.offset,
                    raw: match self.format.keeps_raw() {
                        true => record.payload.clone(),
                        false => Vec::new(),
                    },
                    reason,
                });
            }
            Err(Refused::Stop(e)) => {
                return Err(e.context(format!(
                    "{} partition {} offset {}",
                    record.topic, record.partition, record.offset
                )));
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        let _ = self.format.take();
        let _ = self.format.take_clocks();
        self.counted.iter_mut().for_each(|c| *c = 0);
        self.runs.iter_mut().for_each(Vec::clear);
        self.dead_letters.clear();
        self.pending.clear();
        self.records.clear();
    }
}

/// The first `rows` rows of `runs` (splitting a run if needed); they leave `runs`.
fn take_runs(runs: &mut Vec<PartitionRun>, mut rows: usize) -> Vec<PartitionRun> {
    let mut taken = Vec::new();
    let mut used = 0;
    for run in runs.iter_mut() {
        if rows == 0 {
            break;
        }
        let n = run.rows.min(rows);
        taken.push(PartitionRun {
            partition: run.partition,
            rows: n,
        });
        run.rows -= n;
        rows -= n;
        if run.rows == 0 {
            used += 1;
        }
    }
    runs.drain(..used);
    if rows > 0 {
        // A format whose counts disagree with its batches: keep the rows, credit them to
        // the last partition seen.
        tracing::error!(rows, "row runs do not cover the batch");
        let partition = taken.last().map_or(0, |r| r.partition);
        extend_runs(&mut taken, partition, rows);
    }
    taken
}

impl<S: Source, F: Format> Reader for RecordReader<S, F> {
    fn streams(&self) -> Vec<StreamSpec> {
        self.format.streams()
    }

    fn streams_version(&self) -> u64 {
        self.format.streams_version()
    }

    fn partition_name(&self, partition: u32) -> String {
        self.partitions
            .get(partition as usize)
            .cloned()
            .unwrap_or_default()
    }

    fn partition_index(&mut self, name: &str) -> Option<u32> {
        let (topic, partition) = name.rsplit_once('/')?;
        let partition: i32 = partition.parse().ok()?;
        Some(self.partition(&Arc::from(topic), partition))
    }

    async fn seek(&mut self, committed: &Committed) -> Result<(), SourceError> {
        self.reset();
        let positions = committed.job.clone().unwrap_or_default();
        self.source.seek(&positions)?;
        self.format.seek(&positions);
        let owned = self.source.assignment();
        // Offsets only: the format keeps its own entries (and reports them in `positions`).
        self.current = positions
            .into_iter()
            .filter(|(k, _)| !k.contains('#') && owned.iter().any(|o| o == k))
            .collect();
        Ok(())
    }

    async fn read(&mut self, timeout: Duration) -> Result<Polled, SourceError> {
        let mut records = std::mem::take(&mut self.records);
        let polled = self.source.poll(&mut records, POLL, timeout).await;
        let polled = match polled {
            Ok(p) => p,
            Err(e) => {
                self.records = records;
                return Err(e);
            }
        };
        if polled == Polled::Rebalanced {
            records.clear();
            self.records = records;
            return Ok(Polled::Rebalanced);
        }
        let ingested_at = now_us();
        let mut result = Ok(());
        for record in records.drain(..) {
            self.bytes += record.payload.len() as u64;
            if let Some(bytes) = &self.topic_bytes {
                bytes
                    .with_label_values(&[&*record.topic])
                    .inc_by(record.payload.len() as u64);
            }
            if let Err(e) = self.decode(&record, ingested_at) {
                result = Err(e);
                break;
            }
            self.current.insert(
                position_key(&record.topic, record.partition),
                (record.offset + 1).to_string(),
            );
        }
        records.clear();
        self.records = records;
        result.map(|()| polled)
    }

    fn buffered_rows(&self) -> usize {
        self.format.buffered_rows()
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn take(&mut self, out: &mut ReadOut) {
        out.items.append(&mut self.pending);
        self.take_rows(&mut out.items);
        out.dead_letters.append(&mut self.dead_letters);
    }

    /// The offsets of the partitions held (sought, or read since) and the format's entries
    /// of those partitions — never the source's assignment of the moment, which a rebalance
    /// the loop has not heard of yet may have changed.
    fn positions(&self) -> Positions {
        let mut positions = self.current.clone();
        for (key, value) in self.format.positions() {
            if self.current.contains_key(partition_of_entry(&key)) {
                positions.insert(key, value);
            }
        }
        positions
    }

    fn acknowledge(&mut self, positions: &Positions) {
        self.source.acknowledge(positions);
    }

    fn lag(&self) -> Vec<(String, i64)> {
        self.source.lag()
    }

    async fn status(&mut self) -> Vec<(&'static str, i64)> {
        self.format.status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(partition: u32, rows: usize) -> PartitionRun {
        PartitionRun { partition, rows }
    }

    #[test]
    fn batches_of_one_stream_share_its_runs_in_row_order() {
        // A stream handed over as two batches (its columns changed in between): 4 + 6 rows.
        let mut runs = vec![run(0, 3), run(1, 5), run(0, 2)];
        assert_eq!(take_runs(&mut runs, 4), vec![run(0, 3), run(1, 1)]);
        assert_eq!(take_runs(&mut runs, 6), vec![run(1, 4), run(0, 2)]);
        assert!(runs.is_empty());
    }
}
