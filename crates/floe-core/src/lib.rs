//! `floe-core`: the vocabulary the runtime and its adapters share.
//!
//! * a [`Source`] yields [`SourceRecord`]s from partitions it owns, seeks to [`Positions`] the
//!   runtime read from the catalog, and is told when positions are durably committed;
//! * a [`Format`] turns records into Arrow rows of the tables it declares, or refuses a record
//!   with a reason (the runtime dead-letters it).
//!
//! Positions are `"{topic}/{partition}" → next offset`, as decimal strings: the form stored in
//! every commit marker (`floe.positions`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;

/// Next offset to read, per `"{topic}/{partition}"`.
pub type Positions = BTreeMap<String, String>;

/// The key of a partition in [`Positions`].
pub fn position_key(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}

/// The next offset stored for a partition, if any.
pub fn position_of(positions: &Positions, topic: &str, partition: i32) -> Option<i64> {
    positions
        .get(&position_key(topic, partition))
        .and_then(|v| v.parse().ok())
}

/// Where a partition the job never committed starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest record still available.
    Earliest,
    /// Only records produced from now on.
    Latest,
}

/// One record read from a source.
#[derive(Debug, Clone)]
pub struct SourceRecord {
    /// Topic (or stream) name.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// The payload (empty for a tombstone).
    pub payload: Vec<u8>,
    /// The record's key, if it has one.
    pub key: Option<Vec<u8>>,
}

/// What a poll brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// Zero or more records (appended to the output).
    Records,
    /// The set of owned partitions changed: uncommitted work must be dropped and every owned
    /// partition sought again.
    Rebalanced,
    /// The source has no more records, ever (bounded sources).
    Finished,
}

/// How much one poll may return: memory in flight is bounded by bytes, whatever the record
/// size.
#[derive(Debug, Clone, Copy)]
pub struct PollLimit {
    /// Most records.
    pub records: usize,
    /// Most payload bytes (the record that crosses it is still returned).
    pub bytes: usize,
}

/// A source failure the job cannot continue through.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// A partitioned, replayable source.
pub trait Source: Send {
    /// Appends records to `out` until it holds `limit.records` records or `limit.bytes` of
    /// payload, waiting at most `timeout` for them.
    fn poll(
        &mut self,
        out: &mut Vec<SourceRecord>,
        limit: PollLimit,
        timeout: Duration,
    ) -> impl Future<Output = Result<Polled, SourceError>> + Send;

    /// The partitions owned now, as position keys.
    fn assignment(&self) -> Vec<String>;

    /// Reads every owned partition from `positions` (partitions missing from it start where
    /// the source's start policy says). Records before those positions are never returned.
    fn seek(&mut self, positions: &Positions) -> Result<(), SourceError>;

    /// `positions` are committed durably; tell upstream (advisory, for lag monitoring).
    fn acknowledge(&mut self, positions: &Positions);

    /// Records between the last acknowledged position and the end of each owned partition,
    /// as last seen (empty when the source cannot tell).
    fn lag(&self) -> Vec<(String, i64)> {
        Vec::new()
    }
}

/// A table a format writes.
#[derive(Debug, Clone)]
pub struct TableSpec {
    /// The key used in job files and in [`Format::take`].
    pub key: &'static str,
    /// Default table name.
    pub default_name: &'static str,
    /// Iceberg schema.
    pub schema: iceberg::spec::Schema,
    /// The timestamp column partitioned by `day` by default.
    pub time_column: &'static str,
    /// Columns that get a Parquet bloom filter.
    pub bloom_filter_columns: &'static [&'static str],
    /// Columns whose values rarely repeat (ids, nanosecond times): written without a
    /// dictionary.
    pub plain_columns: &'static [&'static str],
}

/// Records → rows of the tables a format declares.
pub trait Format: Send {
    /// The tables, in a fixed order.
    fn tables(&self) -> Vec<TableSpec>;

    /// Decodes one record and appends its rows; `Err` is the reason it cannot be decoded (no
    /// rows were appended).
    fn append(&mut self, record: &SourceRecord, ingested_at_us: i64) -> Result<usize, String>;

    /// Rows appended since the last take.
    fn buffered_rows(&self) -> usize;

    /// The appended rows per table key; the format starts empty again.
    fn take(&mut self) -> Vec<(&'static str, RecordBatch)>;
}

/// A source table a [`ChangeSource`] follows, as an Iceberg table.
#[derive(Debug, Clone)]
pub struct ChangeTable {
    /// The source's name for it (`schema.table`).
    pub source_name: String,
    /// The Iceberg table name.
    pub name: String,
    /// Its current columns; the identifier fields are the key.
    pub schema: iceberg::spec::Schema,
    /// The key columns.
    pub key: Vec<String>,
}

/// The collapsed changes of one table since the last [`ChangeSource::take`].
#[derive(Debug, Clone)]
pub struct TableChanges {
    /// Index into [`ChangeSource::tables`].
    pub table: usize,
    /// The table was emptied before these changes.
    pub truncate: bool,
    /// Key columns of rows that may exist in data committed earlier and are deleted or
    /// replaced (the equality deletes).
    pub deletes: Option<RecordBatch>,
    /// The final image of every key still present (the new data).
    pub rows: Option<RecordBatch>,
}

/// Where a [`ChangeSource`] starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeStart {
    /// Nothing was committed: the source first copies every table
    /// ([`ChangeSource::snapshot_batch`]), then streams from the copy's position.
    Snapshot,
    /// Streaming resumes after the committed positions.
    Stream,
}

/// A source of row changes (database change data capture): an optional initial copy of every
/// table, then changes buffered whole transactions at a time and handed over collapsed per
/// key at a checkpoint.
pub trait ChangeSource: Send {
    /// The tables followed, in a fixed order (a table's schema may gain columns over time).
    fn tables(&self) -> Vec<ChangeTable>;

    /// Prepares to read. `job` holds the positions of the job's newest commit (every commit
    /// includes the job's anchor table), `tables` those of the newest commit of the job on
    /// each table (same order as [`tables`](Self::tables)); `None` where nothing was
    /// committed.
    fn begin(
        &mut self,
        job: Option<&Positions>,
        tables: &[Option<Positions>],
    ) -> impl Future<Output = Result<ChangeStart, SourceError>> + Send;

    /// The next batch of the initial copy (`None` once every table is copied).
    fn snapshot_batch(
        &mut self,
    ) -> impl Future<Output = Result<Option<(usize, RecordBatch)>, SourceError>> + Send;

    /// Reads changes into the buffer for up to `timeout`, returning at a transaction boundary.
    fn poll(&mut self, timeout: Duration) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Bytes of changes buffered.
    fn buffered_bytes(&self) -> usize;

    /// The buffered changes, collapsed per key, and the positions they reach; the buffer is
    /// empty afterwards. After the snapshot this returns no changes and the snapshot's
    /// position.
    fn take(&mut self) -> Result<(Vec<TableChanges>, Positions), SourceError>;

    /// `positions` are committed durably: upstream may let go of what precedes them.
    fn acknowledge(&mut self, positions: &Positions);

    /// The source's health as named gauges (e.g. the WAL a replication slot retains), read
    /// after each checkpoint; empty when it has none.
    fn status(&mut self) -> impl Future<Output = Vec<(&'static str, i64)>> + Send {
        async { Vec::new() }
    }
}
