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
