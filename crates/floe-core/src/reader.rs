//! Readers: what feeds a job's pipeline — rows of named streams, tagged with their source
//! partitions, and the positions they reach.
//!
//! The runtime drives a reader like this: [`seek`](Reader::seek) to the committed positions,
//! then [`read`](Reader::read) repeatedly; [`take`](Reader::take) hands over what was read (at
//! a flush and at every barrier). A barrier is only placed where [`barrier`](Reader::barrier)
//! allows it, so a source transaction or an initial copy is never split across checkpoints.
//! After a commit the reader is told its positions are durable
//! ([`acknowledge`](Reader::acknowledge)).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::SourceError;
use crate::source::{Polled, Positions};
use crate::stream::{StreamBatch, StreamSpec};

/// What the job committed last: where a reader resumes.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// The positions of the job's newest checkpoint (every partition it ever committed).
    pub job: Option<Positions>,
    /// Per stream (in [`Reader::streams`] order), the positions of the newest checkpoint of
    /// the job in that stream's table — only when the reader asks
    /// ([`Reader::wants_table_positions`]); `None` where nothing was committed.
    pub tables: Vec<Option<Positions>>,
}

/// One thing read, in order.
#[derive(Debug, Clone)]
pub enum ReadItem {
    /// Rows of one stream.
    Rows(StreamBatch),
    /// The stream (a table) was emptied: rows of it taken before are dropped.
    Truncate(usize),
    /// The event-time clock of a partition of a stream moved (µs, the largest event time
    /// every source of the partition has passed): a stream read back from an exchange.
    Clock {
        /// The stream.
        stream: usize,
        /// The partition.
        partition: u32,
        /// The clock.
        max_time: i64,
    },
}

/// A record the reader could not turn into rows.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Where it came from.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset (-1 when the source has none).
    pub offset: i64,
    /// The bytes as read.
    pub raw: Vec<u8>,
    /// Why it was refused.
    pub reason: String,
}

/// What [`Reader::take`] hands over.
#[derive(Debug, Default)]
pub struct ReadOut {
    /// Rows and truncates, in the order read.
    pub items: Vec<ReadItem>,
    /// Refused records.
    pub dead_letters: Vec<DeadLetter>,
}

impl ReadOut {
    /// Whether nothing was taken.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.dead_letters.is_empty()
    }
}

/// Whether a checkpoint may be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Barrier {
    /// Any time.
    Allowed,
    /// Not now (inside a source transaction or an initial copy).
    NotNow,
    /// Now, please: what was read should be committed without waiting for the interval (an
    /// initial copy is complete, or an incremental snapshot read its last chunk). The runtime
    /// takes it once no commit is in flight; a reader answers `Wanted` until a commit holds
    /// what it wanted committed, or until [`take`](Reader::take) hands it over.
    Wanted,
}

/// A source of stream rows with positions.
pub trait Reader: Send {
    /// The streams, in a fixed order; later ones may be appended, and a stream's schema may
    /// become known or gain columns ([`streams_version`](Self::streams_version) changes).
    fn streams(&self) -> Vec<StreamSpec>;

    /// Changes whenever [`streams`](Self::streams) would return something else.
    fn streams_version(&self) -> u64;

    /// The name of a source partition index used in [`StreamBatch::runs`] (its position key,
    /// e.g. `otlp_spans/3`).
    fn partition_name(&self, partition: u32) -> String;

    /// The index of a partition named `name` (as [`partition_name`](Self::partition_name)
    /// gives it), made up if the reader has not read it yet (state restored for it).
    fn partition_index(&mut self, name: &str) -> Option<u32>;

    /// Whether [`streams`](Self::streams) is every stream the reader will ever have, known from
    /// the start (a CDC job's listed tables): then a stream the job committed that is missing
    /// was taken out of the job, which the runtime refuses unless told. `false` (the default)
    /// for readers that meet streams as data arrives.
    fn knows_all_streams(&self) -> bool {
        false
    }

    /// Whether [`Committed::tables`] should be filled in for [`seek`](Self::seek).
    fn wants_table_positions(&self) -> bool {
        false
    }

    /// Reads from the committed positions (after a start, a rebalance or a dropped
    /// checkpoint); anything read and not committed is forgotten.
    fn seek(
        &mut self,
        committed: &Committed,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Reads for up to about `timeout`, buffering rows.
    fn read(
        &mut self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Polled, SourceError>> + Send;

    /// Rows buffered since the last take.
    fn buffered_rows(&self) -> usize;

    /// Bytes read since the reader was created (payloads; WAL for a database).
    fn bytes_read(&self) -> u64;

    /// Hands over what was read since the last take.
    fn take(&mut self, out: &mut ReadOut);

    /// Whether a checkpoint may be taken now.
    fn barrier(&self) -> Barrier {
        Barrier::Allowed
    }

    /// The positions of every owned partition after everything read so far.
    fn positions(&self) -> Positions;

    /// `positions` are committed durably.
    fn acknowledge(&mut self, positions: &Positions);

    /// Records behind the end of each owned partition (empty when unknown).
    fn lag(&self) -> Vec<(String, i64)> {
        Vec::new()
    }

    /// The source's own gauges (e.g. the WAL a replication slot retains), read every
    /// checkpoint interval.
    fn status(&mut self) -> impl Future<Output = Vec<(&'static str, i64)>> + Send {
        async { Vec::new() }
    }
}
