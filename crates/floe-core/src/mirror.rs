//! Mirrors: systems outside the lakehouse (a Kafka topic, Prometheus) that receive the rows a
//! job committed to one of its tables, each snapshot once, after its commit (ADR 0010).
//!
//! The runtime owns the order and the bookkeeping; a [`Mirror`] only has to do two things
//! atomically with respect to its own system:
//! * [`claim`](Mirror::claim) fences every earlier writer of the same mirror and answers the
//!   newest delivery it holds — the table's UUID and the snapshot's sequence number (what a
//!   previous incarnation delivered);
//! * [`deliver`](Mirror::deliver) makes one snapshot's rows visible together with its
//!   sequence number, or none of them.
//!
//! Deliveries come in increasing sequence order, so "the newest sequence held" is exactly
//! what has been delivered, and a restart redelivers from the next one.

use std::future::Future;
use std::pin::Pin;

use arrow_array::RecordBatch;

use crate::error::SourceError;

/// A mirror's answer, later.
pub type Mirroring<'a, T> = Pin<Box<dyn Future<Output = Result<T, SourceError>> + Send + 'a>>;

/// The rows one snapshot added to a table.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The snapshot's sequence number: increasing along the table's history.
    pub sequence: i64,
    /// The snapshot's id.
    pub snapshot_id: i64,
    /// The table's UUID.
    pub table_uuid: String,
    /// The rows it added, in the order its files hold them.
    pub batches: Vec<RecordBatch>,
}

impl Delivery {
    /// Rows in the delivery.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// A system that mirrors a committed table (see the module docs).
pub trait Mirror: Send + Sync {
    /// Where it delivers, for logs (e.g. `kafka topic floe_alerts`).
    fn describe(&self) -> String;

    /// Fences earlier writers of this mirror; answers the newest delivery it holds, as
    /// (table UUID, sequence).
    fn claim(&self) -> Mirroring<'_, Option<(String, i64)>>;

    /// Delivers one snapshot's rows with its sequence, atomically.
    fn deliver(&self, delivery: Delivery) -> Mirroring<'_, ()>;
}
