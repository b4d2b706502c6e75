//! The producer side of an exchange: where a job writes the rows it re-keys through a topic
//! (`kind = "exchange"`), so that another partition of the same job — or another job — reads
//! every row of a key in one place.
//!
//! The contract the runtime relies on (ADR 0007):
//! * records sent to one partition land in the order sent, with no gap: a record that fails
//!   fails every later one of its partition too (an idempotent producer);
//! * [`flush`](ExchangeProducer::flush) returns once every record sent before it is durably
//!   in the topic, or with the first failure; the runtime commits a checkpoint only after it;
//! * records of a checkpoint that is dropped may still land: the reading side drops what it
//!   has already taken, by the source lineage each row carries.
//!
//! **Event time across an exchange.** An exchange partition interleaves rows of many source
//! partitions in an order that depends on timing, so its own largest event time would make
//! a downstream window's lateness depend on timing too. Instead every row carries its source
//! partition's clock — the largest event time of that source partition before the row
//! ([`SOURCE_CLOCK_COLUMN`]), a pure function of the source's records — and at every
//! checkpoint each source partition's clock goes to every exchange partition as a clock
//! record ([`encode_clock`]). The reading side's clock of an exchange partition is the
//! smallest clock of all partitions of the source topics; a window reading the exchange
//! fires by it and judges a row late by the row's own source clock.

use std::future::Future;
use std::pin::Pin;

use crate::error::SourceError;

/// A boxed future of an exchange's send.
pub type Sending<'a> = Pin<Box<dyn Future<Output = Result<(), SourceError>> + Send + 'a>>;

/// A boxed future of an exchange's flush.
pub type Flushing<'a> = Pin<Box<dyn Future<Output = Result<u64, SourceError>> + Send + 'a>>;

/// Writes exchange records (one implementation per broker: Kafka's is in `floe-kafka`).
pub trait ExchangeProducer: Send + Sync {
    /// Queues one record for `partition` of `topic`; waits only while the queue is full.
    fn send<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        key: &'a [u8],
        payload: &'a [u8],
    ) -> Sending<'a>;

    /// Waits until every record sent so far is in the topic; returns how many were.
    fn flush(&self) -> Flushing<'_>;

    /// Stops waiting for records sent so far (their checkpoint was dropped).
    fn forget(&self);
}

/// The column of exchanged rows that holds the source partition's clock before the row
/// (largest event time, µs; null before the source's first timed row).
pub const SOURCE_CLOCK_COLUMN: &str = "__source_clock";

/// The property of a stream read back from an exchange, and of the streams filtered or
/// selected from it (its value: the exchange's id). It is also set on their tables.
pub const EXCHANGED_FROM: &str = "floe.exchanged-from";

/// The property that, beside [`EXCHANGED_FROM`], names the exchange's key columns
/// (comma-separated): every row with the same values of them is in one partition.
pub const EXCHANGED_BY: &str = "floe.exchanged-by";

/// The property of a stream whose source has a single partition (the generator), and of the
/// streams filtered or selected from it: every row is in one partition already, as if
/// exchanged by no key at all.
pub const ONE_PARTITION: &str = "floe.one-partition";

/// The property of an operator's output whose rows are final per minute of its time column
/// (the property's value): emitted once, all rows of a minute of a partition in one call, in
/// an order that does not depend on how input was batched. Such a stream can be exchanged
/// (ADR 0010): the writing side gives each row the lineage (its minute, its rank in the
/// minute), the same sequence in every run.
pub const FINAL_PER_MINUTE: &str = "floe.final-per-minute";

/// The time column of a stream that is final per minute (see [`FINAL_PER_MINUTE`]).
pub fn final_per_minute(stream: &crate::StreamSpec) -> Option<&str> {
    stream
        .properties
        .iter()
        .find(|(k, _)| k == FINAL_PER_MINUTE)
        .map(|(_, v)| v.as_str())
}

/// Whether every row of `stream` is in one partition (see [`ONE_PARTITION`]).
pub fn is_one_partition(stream: &crate::StreamSpec) -> bool {
    stream.properties.iter().any(|(k, _)| k == ONE_PARTITION)
}

/// The key columns rows of `stream` were exchanged by, if it was read back from an exchange.
pub fn exchange_key(stream: &crate::StreamSpec) -> Option<Vec<String>> {
    stream
        .properties
        .iter()
        .find(|(k, _)| k == EXCHANGED_BY)
        .map(|(_, v)| v.split(',').map(str::to_string).collect())
}

/// Whether `stream`'s rows were read back from an exchange.
pub fn is_exchanged(stream: &crate::StreamSpec) -> bool {
    stream.properties.iter().any(|(k, _)| k == EXCHANGED_FROM)
}

/// The [`EXCHANGED_FROM`], [`EXCHANGED_BY`] and [`ONE_PARTITION`] properties of `stream`,
/// for a stream derived from it row by row.
pub fn exchanged_property(stream: &crate::StreamSpec) -> Vec<(String, String)> {
    stream
        .properties
        .iter()
        .filter(|(k, _)| k == EXCHANGED_FROM || k == EXCHANGED_BY || k == ONE_PARTITION)
        .cloned()
        .collect()
}

/// What opens a clock record (never the start of an Arrow IPC stream, which opens with
/// `0xFFFFFFFF`).
const CLOCK_MAGIC: &[u8; 8] = b"floeclk1";

/// A clock record: a source partition passed `max_time` (µs); its topic has
/// `source_partitions` partitions, every one of which the reading side waits for.
pub fn encode_clock(max_time: i64, source_partitions: i32) -> Vec<u8> {
    let mut out = CLOCK_MAGIC.to_vec();
    out.extend_from_slice(&max_time.to_le_bytes());
    out.extend_from_slice(&source_partitions.to_le_bytes());
    out
}

/// `Some((max_time, source_partitions))` when `payload` is a clock record.
pub fn decode_clock(payload: &[u8]) -> Option<(i64, i32)> {
    let rest = payload.strip_prefix(CLOCK_MAGIC.as_slice())?;
    let time = i64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
    let partitions = i32::from_le_bytes(rest.get(8..12)?.try_into().ok()?);
    Some((time, partitions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_record_round_trips_and_rows_are_not_clocks() {
        let record = encode_clock(1_700_000_000_123_456, 4);
        assert_eq!(decode_clock(&record), Some((1_700_000_000_123_456, 4)));
        assert_eq!(decode_clock(&record[..15]), None);
        // An Arrow IPC stream opens with the continuation marker.
        assert_eq!(decode_clock(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]), None);
    }
}
