//! Record sources (Kafka, the generator, in-memory test sources) and their positions.
//!
//! Positions are `"{topic}/{partition}" → next offset`, as decimal strings: the form stored in
//! every commit marker (`floe.positions`). A reader may add entries of its own that belong to
//! a partition, named `"{topic}/{partition}#…"` (Debezium's sequence watermark), so fencing
//! treats them with the partition.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::SourceError;

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

/// The partition a position entry belongs to: `"t/3#sequence"` → `"t/3"`.
pub fn partition_of_entry(key: &str) -> &str {
    key.split_once('#').map_or(key, |(partition, _)| partition)
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

/// A partitioned, replayable source of records.
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
