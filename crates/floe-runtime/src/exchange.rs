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
//!
//! **Event time.** The writing side keeps each source partition's clock (its rows' largest
//! event time, a position entry `<source partition>#clock:<exchange>` committed with the
//! checkpoint), stamps every row with the clock before it ([`SOURCE_CLOCK_COLUMN`]) and, at
//! every checkpoint, sends each clock to every exchange partition. The reading side keeps
//! per (exchange partition, source partition) the largest clock heard
//! (`<topic>/<p>#clock=<source partition>`) and hands over the partition's clock — the
//! smallest over every partition of the source topics — whenever it moves
//! ([`Format::take_clocks`]). Until every source partition has been heard of, the partition
//! has no clock: a source topic partition that never carries a row of the stream holds the
//! windows behind the exchange.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Cursor;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, BooleanArray, RecordBatch, UInt32Array};
use floe_core::exchange::{SOURCE_CLOCK_COLUMN, decode_clock, encode_clock};
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
    /// The input's event-time column, by which rows carry their source's clock.
    pub time_column: Option<String>,
    /// Whether the input is a union: each of its streams is a source of its own (rows of
    /// two streams from one source partition would break each other's lineage order).
    pub union: bool,
    /// The input's streams whose rows are final per minute: the writing side gives them their
    /// lineage (ADR 0010).
    pub finals: Finals,
}

/// Which of an exchange's input streams are final per minute, and by which column.
#[derive(Debug, Clone, Default)]
pub struct Finals {
    /// The streams (`""`: the input itself).
    pub streams: BTreeSet<String>,
    /// The column of their minute.
    pub minute: Option<String>,
}

/// The topic of exchange `id` of job `job`: the job file's, or `floe.<job>.<id>`.
pub fn exchange_topic(job: &str, id: &str, x: &floe_ops::config::ExchangeConfig) -> String {
    x.topic
        .clone()
        .unwrap_or_else(|| format!("floe.{job}.{id}"))
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
            let time_column = output.time_column.clone();
            let union = pipeline
                .operators
                .iter()
                .any(|p| p.outputs.contains(&op.input) && matches!(p.kind, OperatorKind::Union));
            let input = specs.iter().find(|s| s.name == op.input)?;
            let finals = match floe_core::exchange::final_per_minute(input) {
                Some(column) => Finals {
                    streams: BTreeSet::from([String::new()]),
                    minute: Some(column.to_string()),
                },
                None => Finals {
                    streams: floe_ops::union::final_streams(input).into_iter().collect(),
                    minute: input.time_column.clone(),
                },
            };
            Some(Exchange {
                id: op.id.clone(),
                input: op.input.clone(),
                output,
                topic: exchange_topic(job, &op.id, x),
                partitions: x.partitions,
                retention_ms: x.retention_ms,
                replication: x.replication,
                key: x.key.clone(),
                time_column,
                union,
                finals,
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

/// Rows final per minute (of `column`) with their lineage: sorted by minute (stably: a
/// minute's rows keep the operator's order), `kafka_offset` the minute and `kafka_item` the
/// rank within it, continuing after `last` (the lineage given last for their source). A row
/// of a minute before `last`'s means the operator broke its contract.
fn with_minute_lineage(
    rows: &RecordBatch,
    column: &str,
    last: Option<(i64, i32)>,
) -> Result<(RecordBatch, Option<(i64, i32)>), String> {
    use arrow_array::{Int32Array, Int64Array};
    const MINUTE: i64 = 60_000_000;
    let times = floe_ops::window::event_times(rows, column)?;
    let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
    order.sort_by_key(|r| times[*r as usize].map(|t| t.div_euclid(MINUTE)));
    let rows = arrow_select::take::take_record_batch(rows, &UInt32Array::from(order.clone()))
        .map_err(|e| e.to_string())?;
    let mut given = last;
    let (mut offsets, mut items) = (Vec::new(), Vec::new());
    for r in order {
        let minute = times[r as usize]
            .ok_or_else(|| format!("a row final per minute without its {column}"))?
            .div_euclid(MINUTE);
        let next = match given {
            Some((m, i)) if m == minute => (m, i + 1),
            Some((m, _)) if m > minute => {
                return Err(format!(
                    "rows of minute {minute} after rows of minute {m}: not final per minute"
                ));
            }
            _ => (minute, 0),
        };
        offsets.push(next.0);
        items.push(next.1);
        given = Some(next);
    }
    let schema = rows.schema();
    let mut fields: Vec<arrow_schema::FieldRef> = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in schema.fields().iter().zip(rows.columns()) {
        if !EXCHANGE_LINEAGE.contains(&field.name().as_str()) {
            fields.push(field.clone());
            columns.push(column.clone());
        }
    }
    fields.push(Arc::new(arrow_schema::Field::new(
        EXCHANGE_LINEAGE[0],
        arrow_schema::DataType::Int64,
        true,
    )));
    columns.push(Arc::new(Int64Array::from(offsets)));
    fields.push(Arc::new(arrow_schema::Field::new(
        EXCHANGE_LINEAGE[1],
        arrow_schema::DataType::Int32,
        true,
    )));
    columns.push(Arc::new(Int32Array::from(items)));
    let rows = RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), columns)
        .map_err(|e| e.to_string())?;
    Ok((rows, given))
}

/// The rows of each stream of a union's `rows` (by its stream column), in order.
fn by_stream(rows: &RecordBatch) -> Result<Vec<(String, RecordBatch)>, String> {
    let streams = rows
        .column_by_name(floe_ops::union::STREAM_COLUMN)
        .ok_or("a union's rows without their stream column")?;
    let streams = streams.as_string::<i32>();
    let mut groups: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for row in 0..rows.num_rows() {
        groups
            .entry(streams.value(row))
            .or_default()
            .push(row as u32);
    }
    if groups.len() == 1 {
        let (stream, _) = groups.into_iter().next().expect("one");
        return Ok(vec![(stream.to_string(), rows.clone())]);
    }
    groups
        .into_iter()
        .map(|(stream, indices)| {
            arrow_select::take::take_record_batch(rows, &UInt32Array::from(indices))
                .map(|b| (stream.to_string(), b))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// The most bytes an exchange record should hold: well under Kafka's default message limit
/// (1 MiB), so that a broker's defaults never refuse one.
const RECORD_BYTES: usize = 768 * 1024;

/// `batch` as Arrow IPC records of at most [`RECORD_BYTES`] each (a single row may exceed it),
/// the rows in order.
fn encode_split(batch: &RecordBatch, out: &mut Vec<Vec<u8>>) -> Result<(), String> {
    let encoded = floe_ops::codec::ipc_bytes(batch)?;
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

/// `rows` with the clock of `source` before each row as [`SOURCE_CLOCK_COLUMN`] (replacing
/// one they carry from an earlier exchange); `clock` moves past every row.
fn with_clocks(
    rows: &RecordBatch,
    time_column: &str,
    clock: &mut Option<i64>,
) -> Result<RecordBatch, String> {
    let times = floe_ops::window::event_times(rows, time_column)?;
    let before: arrow_array::Int64Array = times
        .into_iter()
        .map(|t| {
            let now = *clock;
            if let Some(t) = t {
                *clock = Some(clock.map_or(t, |c| c.max(t)));
            }
            now
        })
        .collect();
    let schema = rows.schema();
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| schema.field(i).name() != SOURCE_CLOCK_COLUMN)
        .collect();
    let rows = rows.project(&keep).map_err(|e| e.to_string())?;
    let mut fields: Vec<arrow_schema::FieldRef> = rows.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(arrow_schema::Field::new(
        SOURCE_CLOCK_COLUMN,
        arrow_schema::DataType::Int64,
        true,
    )));
    let mut columns = rows.columns().to_vec();
    columns.push(Arc::new(before));
    RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), columns)
        .map_err(|e| e.to_string())
}

/// The writing side: a job's exchanges and the producer of their topics.
pub struct Outbound {
    producer: Arc<dyn ExchangeProducer>,
    exchanges: HashMap<String, Exchange>,
    /// Per (exchange, source partition): the largest event time of its rows so far.
    clocks: BTreeMap<(String, String), i64>,
    /// Partitions of each source topic (a clock record says how many to wait for).
    source_partitions: HashMap<String, i32>,
    /// The clocks sent last: an unchanged clock is not sent again (an idle job sends
    /// nothing, so it commits nothing).
    sent: BTreeMap<(String, String), i64>,
    /// Per (exchange, source) of rows final per minute: the lineage given last. A minute's
    /// rows come in one call, so a checkpoint never splits them: nothing to commit.
    given: HashMap<(String, String), (i64, i32)>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("exchanges", &self.exchanges.len())
            .finish_non_exhaustive()
    }
}

impl Outbound {
    /// The exchanges, writing through `producer`; `source_partitions` are the partition
    /// counts of the source topics.
    pub fn new(
        producer: Arc<dyn ExchangeProducer>,
        exchanges: Vec<Exchange>,
        source_partitions: HashMap<String, i32>,
    ) -> Self {
        Self {
            producer,
            exchanges: exchanges.into_iter().map(|x| (x.id.clone(), x)).collect(),
            clocks: BTreeMap::new(),
            source_partitions,
            sent: BTreeMap::new(),
            given: HashMap::new(),
        }
    }

    /// The clocks of the last commit (none before the first), after a seek.
    pub(crate) fn restore(&mut self, committed: Option<&Positions>) {
        self.clocks.clear();
        self.sent.clear();
        self.given.clear();
        for (key, value) in committed.into_iter().flatten() {
            if let (Some((source, id)), Ok(clock)) = (key.split_once(CLOCK), value.parse())
                && self.exchanges.contains_key(id)
            {
                self.clocks
                    .insert((id.to_string(), source.to_string()), clock);
            }
        }
    }

    /// Moves the clocks of rows final per minute to their producers' `frontiers` (per stream,
    /// per partition: no row before it is still to come), so that a sparse stream does not
    /// hold the clock of the exchange partitions behind it.
    pub(crate) fn advance(
        &mut self,
        frontiers: &[(String, Vec<(u32, i64)>)],
        names: &dyn Fn(u32) -> String,
    ) {
        for x in self.exchanges.values() {
            for (stream, partitions) in frontiers {
                let tag = if x.union {
                    if !x.finals.streams.contains(stream) {
                        continue;
                    }
                    Some(stream)
                } else if *stream == x.input && x.finals.streams.contains("") {
                    None
                } else {
                    continue;
                };
                for (p, frontier) in partitions {
                    let source = names(*p);
                    let source = match tag {
                        Some(stream) => tagged(&source, stream),
                        None => source,
                    };
                    let clock = self
                        .clocks
                        .entry((x.id.clone(), source))
                        .or_insert(i64::MIN);
                    // No row before the frontier is to come: a window ending there is whole.
                    *clock = (*clock).max(*frontier);
                }
            }
        }
    }

    /// The clock entries of the source partitions `held`, for the checkpoint.
    pub(crate) fn positions(&self, held: &std::collections::BTreeSet<String>) -> Positions {
        self.clocks
            .iter()
            .filter(|((_, source), _)| held.contains(untagged(source)))
            .map(|((id, source), clock)| (format!("{source}{CLOCK}{id}"), clock.to_string()))
            .collect()
    }

    /// Every held source partition's clock that moved since it was last sent, to every
    /// partition of each exchange.
    pub(crate) async fn send_clocks(
        &mut self,
        held: &std::collections::BTreeSet<String>,
    ) -> Result<(), SourceError> {
        for ((id, source), clock) in &self.clocks {
            let at = (id.clone(), source.clone());
            if !held.contains(untagged(source)) || self.sent.get(&at) == Some(clock) {
                continue;
            }
            let (Some(&count), Some(x)) = (
                self.source_partitions
                    .get(topic_of(untagged(source)))
                    .filter(|n| **n > 0),
                self.exchanges.get(id),
            ) else {
                continue;
            };
            self.sent.insert(at, *clock);
            let payload = encode_clock(*clock, count);
            for partition in 0..x.partitions {
                self.producer
                    .send(&x.topic, partition, source.as_bytes(), &payload)
                    .await?;
            }
        }
        Ok(())
    }

    /// The records of rows `batch` that exchange `id` reads: per run of a source partition,
    /// the rows going to each exchange partition, in their order, in records of at most
    /// [`RECORD_BYTES`].
    pub(crate) fn records(
        &mut self,
        id: &str,
        batch: &StreamBatch,
        names: &dyn Fn(u32) -> String,
    ) -> Result<Vec<(i32, String, Vec<u8>)>, String> {
        let x = self
            .exchanges
            .get(id)
            .ok_or_else(|| format!("no exchange {id}"))?;
        let mut records = Vec::new();
        let mut slices = Vec::new();
        for (partition, rows) in batch.slices() {
            let source = names(partition);
            if x.union {
                for (stream, rows) in by_stream(&rows)? {
                    let derived = x.finals.streams.contains(&stream);
                    slices.push((tagged(&source, &stream), rows, derived));
                }
            } else {
                slices.push((source, rows, x.finals.streams.contains("")));
            }
        }
        for (source, rows, derived) in slices {
            let rows = match (&x.finals.minute, derived) {
                (Some(column), true) => {
                    let at = (id.to_string(), source.clone());
                    let (rows, last) =
                        with_minute_lineage(&rows, column, self.given.get(&at).copied())?;
                    if let Some(last) = last {
                        self.given.insert(at, last);
                    }
                    rows
                }
                _ => rows,
            };
            let rows = match &x.time_column {
                Some(column) => {
                    let at = (id.to_string(), source.clone());
                    let mut clock = self.clocks.get(&at).copied();
                    let rows = with_clocks(&rows, column, &mut clock)?;
                    if let Some(clock) = clock {
                        self.clocks.insert(at, clock);
                    }
                    rows
                }
                None => rows,
            };
            let targets = partitions_of(&rows, &x.key, x.partitions)?;
            let mut by_target: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for (row, target) in targets.into_iter().enumerate() {
                by_target.entry(target).or_default().push(row as u32);
            }
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

/// The source name of a union's `stream` rows from source partition `source`
/// (`topic/p` → `topic/p#stream`): a source of its own, with the partitions of `topic`. Its
/// position entries still belong to `topic/p` (`floe_core::partition_of_entry`), so they
/// move, and are fenced, with the partition.
fn tagged(source: &str, stream: &str) -> String {
    format!("{source}#{stream}")
}

/// The source partition a (possibly [`tagged`]) source name is of.
fn untagged(source: &str) -> &str {
    floe_core::partition_of_entry(source)
}

/// The group of sources a clock waits for all of: a topic's partitions (`topic`), or one
/// stream's of them (`topic#stream`).
fn source_group(source: &str) -> String {
    match source.split_once('#') {
        Some((partition, stream)) => format!("{}#{stream}", topic_of(partition)),
        None => topic_of(source).to_string(),
    }
}

/// Source `p` of a [`source_group`].
fn group_source(group: &str, p: i32) -> String {
    match group.split_once('#') {
        Some((topic, stream)) => format!("{}#{stream}", floe_core::position_key(topic, p)),
        None => floe_core::position_key(group, p),
    }
}

/// The mark entry of exchange partition `partition_key` for `source`.
fn mark_key(partition_key: &str, source: &str) -> String {
    format!("{partition_key}{MARK}{source}")
}

/// The topic of a source partition named `topic/partition`.
fn topic_of(source: &str) -> &str {
    source.rsplit_once('/').map_or(source, |(topic, _)| topic)
}

/// What separates an exchange partition from the source partition in a mark entry.
const MARK: &str = "#from=";

/// What separates an exchange partition from the source partition in a clock entry of the
/// reading side.
const HEARD: &str = "#clock=";

/// What separates a source partition from the exchange in a clock entry of the writing side.
const CLOCK: &str = "#clock:";

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
    /// Per (exchange topic, partition, source partition): the largest source clock heard.
    heard: BTreeMap<(String, i32, String), i64>,
    /// Per (exchange topic, source topic heard of): its partitions, every one of which the
    /// exchange's clocks wait for.
    sources: BTreeMap<(String, String), i32>,
    /// Exchange partitions whose sources' clocks moved since the last take: (inbound, topic,
    /// partition).
    moved: std::collections::BTreeSet<(usize, Arc<str>, i32)>,
    /// The clock last handed over per (exchange topic, partition).
    told: HashMap<(Arc<str>, i32), i64>,
}

impl<F: Format> ExchangeFormat<F> {
    /// The (exchange topic, partition, source partition) of a position entry `key` of kind
    /// `separator` ([`MARK`] or [`HEARD`]) of one of this format's exchanges.
    fn entry_of<'k>(&self, key: &'k str, separator: &str) -> Option<(&'k str, i32, &'k str)> {
        let (partition_key, source) = key.split_once(separator)?;
        let (topic, partition) = partition_key.rsplit_once('/')?;
        let partition = partition.parse().ok()?;
        self.inbound
            .iter()
            .any(|i| i.topic == topic)
            .then_some((topic, partition, source))
    }

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
            heard: BTreeMap::new(),
            sources: BTreeMap::new(),
            moved: Default::default(),
            told: HashMap::new(),
        }
    }

    /// A source's clock reached `clock` in a partition of an exchange topic.
    fn hear(&mut self, index: usize, record: &SourceRecord, source: &str, clock: i64) {
        let at = (
            record.topic.to_string(),
            record.partition,
            source.to_string(),
        );
        let known = self.heard.entry(at).or_insert(clock);
        *known = (*known).max(clock);
        self.moved
            .insert((index, record.topic.clone(), record.partition));
    }

    /// The clock of a partition of an exchange topic: the smallest clock of every partition
    /// of the source topics heard of; `None` until each has been heard.
    fn clock(&self, topic: &str, partition: i32) -> Option<i64> {
        let mut clock = None;
        for ((_, group), count) in self
            .sources
            .iter()
            .filter(|((exchange, _), _)| exchange == topic)
        {
            for p in 0..*count {
                let at = (topic.to_string(), partition, group_source(group, p));
                let heard = *self.heard.get(&at)?;
                clock = Some(clock.map_or(heard, |c: i64| c.min(heard)));
            }
        }
        clock
    }

    fn take_record(&mut self, index: usize, record: &SourceRecord) -> Result<(), String> {
        let source = record
            .key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
            .ok_or("an exchange record's key must name its source partition")?
            .to_string();
        if let Some((clock, count)) = decode_clock(&record.payload) {
            let known = self
                .sources
                .entry((record.topic.to_string(), source_group(&source)))
                .or_insert(count);
            *known = (*known).max(count);
            self.hear(index, record, &source, clock);
            return Ok(());
        }
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
            let clocks = batch
                .column_by_name(SOURCE_CLOCK_COLUMN)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .and_then(|c| c.iter().flatten().max());
            if let Some(clock) = clocks {
                self.hear(index, record, &mark_at.2, clock);
            }
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

    fn take_clocks(&mut self) -> Vec<(usize, Arc<str>, i32, i64)> {
        let mut out = self.inner.take_clocks();
        for (index, topic, partition) in std::mem::take(&mut self.moved) {
            let Some(clock) = self.clock(&topic, partition) else {
                continue;
            };
            let told = self
                .told
                .entry((topic.clone(), partition))
                .or_insert(i64::MIN);
            if clock > *told {
                *told = clock;
                out.push((self.inner_streams + index, topic, partition, clock));
            }
        }
        out
    }

    fn positions(&self) -> Positions {
        let mut positions = self.inner.positions();
        for ((topic, partition, source), clock) in &self.heard {
            // With the partition count of the source's topic, so that a restart waits for
            // the same sources: `clock/partitions`.
            let count = self
                .sources
                .get(&(topic.clone(), source_group(source)))
                .map_or(String::new(), |n| format!("/{n}"));
            positions.insert(
                format!(
                    "{}{HEARD}{source}",
                    floe_core::position_key(topic, *partition)
                ),
                format!("{clock}{count}"),
            );
        }
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
        self.heard.clear();
        self.moved.clear();
        self.told.clear();
        for (key, value) in positions {
            if let Some((topic, partition, source)) = self.entry_of(key, HEARD) {
                let (clock, count) = value.split_once('/').unwrap_or((value, ""));
                if let Ok(clock) = clock.parse() {
                    self.heard
                        .insert((topic.to_string(), partition, source.to_string()), clock);
                }
                if let Ok(count) = count.parse::<i32>() {
                    let known = self
                        .sources
                        .entry((topic.to_string(), source_group(source)))
                        .or_insert(count);
                    *known = (*known).max(count);
                }
            } else if let Some((topic, partition, source)) = self.entry_of(key, MARK)
                && let Some((offset, item)) = value.split_once(':')
                && let (Ok(offset), Ok(item)) = (offset.parse(), item.parse())
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
            time_column: None,
            union: false,
            finals: Finals::default(),
        }
    }

    #[test]
    fn rows_final_per_minute_get_their_minute_and_rank_as_lineage() {
        const M: i64 = 60_000_000;
        let rows = |minutes: &[i64], names: &[&str]| {
            RecordBatch::try_from_iter([
                (
                    "window_start",
                    Arc::new(Int64Array::from(
                        minutes.iter().map(|m| m * M).collect::<Vec<_>>(),
                    )) as arrow_array::ArrayRef,
                ),
                ("name", Arc::new(StringArray::from(names.to_vec()))),
            ])
            .unwrap()
        };
        let lineage = |b: &RecordBatch| -> Vec<(i64, i32, String)> {
            let offsets = b
                .column_by_name("kafka_offset")
                .unwrap()
                .as_primitive::<Int64Type>();
            let items = b
                .column_by_name("kafka_item")
                .unwrap()
                .as_primitive::<Int32Type>();
            let names = b.column_by_name("name").unwrap().as_string::<i32>();
            (0..b.num_rows())
                .map(|r| (offsets.value(r), items.value(r), names.value(r).to_string()))
                .collect()
        };
        // Two minutes in one call, a series' minutes together: sorted by minute, stably.
        let (b, last) = with_minute_lineage(
            &rows(&[7, 8, 7, 8], &["a", "a", "b", "b"]),
            "window_start",
            None,
        )
        .unwrap();
        assert_eq!(
            lineage(&b),
            [
                (7, 0, "a".into()),
                (7, 1, "b".into()),
                (8, 0, "a".into()),
                (8, 1, "b".into())
            ]
        );
        // The same minutes one call each give the same sequence.
        let (b7, last7) =
            with_minute_lineage(&rows(&[7, 7], &["a", "b"]), "window_start", None).unwrap();
        let (b8, last8) =
            with_minute_lineage(&rows(&[8, 8], &["a", "b"]), "window_start", last7).unwrap();
        assert_eq!([lineage(&b7), lineage(&b8)].concat(), lineage(&b));
        assert_eq!(last8, last);
        // A minute after a later one breaks the contract.
        let e = with_minute_lineage(&rows(&[7], &["c"]), "window_start", last).unwrap_err();
        assert!(e.contains("not final per minute"), "{e}");
    }

    #[test]
    fn each_stream_of_a_union_is_a_source_of_its_own() {
        assert_eq!(tagged("otlp_spans/3", "errors"), "otlp_spans/3#errors");
        assert_eq!(untagged("otlp_spans/3#errors"), "otlp_spans/3");
        assert_eq!(untagged("otlp_spans/3"), "otlp_spans/3");
        assert_eq!(source_group("otlp_spans/3#errors"), "otlp_spans#errors");
        assert_eq!(source_group("otlp_spans/3"), "otlp_spans");
        assert_eq!(group_source("otlp_spans#errors", 3), "otlp_spans/3#errors");
        assert_eq!(group_source("otlp_spans", 3), "otlp_spans/3");
        // The writer's clock entries belong to the source partition, for fencing.
        assert_eq!(
            floe_core::partition_of_entry("otlp_spans/3#errors#clock:x"),
            "otlp_spans/3"
        );
        let x = Exchange {
            union: true,
            ..exchange(1)
        };
        let mut outbound = Outbound::new(Arc::new(Discard), vec![x], HashMap::new());
        let rows = RecordBatch::try_from_iter([
            (
                "service_name",
                Arc::new(arrow_array::StringArray::from(vec!["a", "b", "c"]))
                    as arrow_array::ArrayRef,
            ),
            (
                floe_ops::union::STREAM_COLUMN,
                Arc::new(arrow_array::StringArray::from(vec![
                    "logs", "requests", "logs",
                ])),
            ),
        ])
        .unwrap();
        let names = |p: u32| format!("spans/{p}");
        let records = outbound
            .records("x", &StreamBatch::single(0, rows, 2), &names)
            .unwrap();
        let sources: Vec<&str> = records.iter().map(|(_, s, _)| s.as_str()).collect();
        assert_eq!(sources, ["spans/2#logs", "spans/2#requests"]);
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
        let mut outbound = Outbound::new(Arc::new(Discard), vec![exchange(3)], HashMap::new());
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
        let mut outbound = Outbound::new(Arc::new(Discard), vec![exchange(3)], HashMap::new());
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

    /// A producer that keeps what it is sent.
    #[derive(Default)]
    struct Keep(std::sync::Mutex<Vec<(i32, String, Vec<u8>)>>);

    impl ExchangeProducer for Keep {
        fn send<'a>(
            &'a self,
            _: &'a str,
            partition: i32,
            key: &'a [u8],
            payload: &'a [u8],
        ) -> floe_core::exchange::Sending<'a> {
            self.0.lock().unwrap().push((
                partition,
                String::from_utf8_lossy(key).into_owned(),
                payload.to_vec(),
            ));
            Box::pin(async { Ok(()) })
        }
        fn flush(&self) -> floe_core::exchange::Flushing<'_> {
            Box::pin(async { Ok(0) })
        }
        fn forget(&self) {}
    }

    /// Rows with an event time (`ts`, µs).
    fn timed(services: &[&str], offsets: &[i64], times: &[i64]) -> RecordBatch {
        let plain = rows(services, offsets);
        let mut fields: Vec<arrow_schema::FieldRef> = plain.schema().fields().to_vec();
        fields.push(Arc::new(Field::new("ts", DataType::Int64, true)));
        let mut columns = plain.columns().to_vec();
        columns.push(Arc::new(Int64Array::from(times.to_vec())));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    fn carried(payload: &[u8]) -> Vec<Option<i64>> {
        let reader = arrow_ipc::reader::StreamReader::try_new(Cursor::new(payload), None).unwrap();
        reader
            .flat_map(|b| {
                let b = b.unwrap();
                let c = b.column_by_name(SOURCE_CLOCK_COLUMN).unwrap();
                c.as_primitive::<Int64Type>().iter().collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn rows_carry_their_sources_clock_and_a_partition_waits_for_every_source() {
        let x = Exchange {
            time_column: Some("ts".into()),
            ..exchange(2)
        };
        let keep = Arc::new(Keep::default());
        let sources = HashMap::from([("spans".to_string(), 2)]);
        let mut outbound = Outbound::new(keep.clone(), vec![x.clone()], sources);
        let batch = StreamBatch {
            stream: 0,
            batch: timed(&["a", "a", "a", "a"], &[1, 2, 3, 7], &[100, 300, 200, 50]),
            runs: vec![
                PartitionRun {
                    partition: 0,
                    rows: 3,
                },
                PartitionRun {
                    partition: 1,
                    rows: 1,
                },
            ],
        };
        let records = outbound
            .records("x", &batch, &|p| format!("spans/{p}"))
            .unwrap();
        // The clock before each row of its own source: nothing yet, then the largest so far.
        let of = |source: &str| -> Vec<Option<i64>> {
            records
                .iter()
                .filter(|(_, s, _)| s == source)
                .flat_map(|(_, _, payload)| carried(payload))
                .collect()
        };
        assert_eq!(of("spans/0"), vec![None, Some(100), Some(300)]);
        assert_eq!(of("spans/1"), vec![None]);

        let mut format = ExchangeFormat::new(Nothing, std::slice::from_ref(&x));
        let mut offset = 0;
        let mut deliver = |format: &mut ExchangeFormat<Nothing>, rs: &[(i32, String, Vec<u8>)]| {
            for (p, key, payload) in rs {
                format
                    .append(&record(*p, key, payload.clone(), offset), 0)
                    .unwrap();
                offset += 1;
            }
        };
        deliver(&mut format, &records);
        assert!(
            format.take_clocks().is_empty(),
            "no source has said its clock"
        );

        let mut send = |held: &[&str]| {
            let held = held.iter().map(|s| s.to_string()).collect();
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(outbound.send_clocks(&held)).unwrap();
            std::mem::take(&mut *keep.0.lock().unwrap())
        };
        let first = send(&["spans/0"]);
        assert_eq!(first.len(), 2, "one clock record per exchange partition");
        deliver(&mut format, &first);
        assert!(
            format.take_clocks().is_empty(),
            "spans/1 has not been heard in every partition"
        );
        assert!(
            send(&["spans/0"]).is_empty(),
            "an unchanged clock is not sent again"
        );
        let second = send(&["spans/1"]);
        deliver(&mut format, &second);
        let mut clocks = format.take_clocks();
        clocks.sort_by_key(|c| c.2);
        let told: Vec<(i32, i64)> = clocks.iter().map(|c| (c.2, c.3)).collect();
        assert_eq!(told, vec![(0, 50), (1, 50)], "the slowest source's clock");
        assert!(format.take_clocks().is_empty(), "told once");

        // Both sides' clocks are position entries that survive a restart.
        let held = ["spans/0".to_string(), "spans/1".to_string()].into();
        let committed = outbound.positions(&held);
        assert_eq!(
            committed.get("spans/0#clock:x").map(String::as_str),
            Some("300")
        );
        let mut restarted = Outbound::new(keep.clone(), vec![x.clone()], HashMap::new());
        restarted.restore(Some(&committed));
        assert_eq!(restarted.positions(&held), committed);
        let heard = format.positions();
        let mut again = ExchangeFormat::new(Nothing, &[x]);
        again.seek(&heard);
        assert_eq!(again.positions(), heard);
    }
}
