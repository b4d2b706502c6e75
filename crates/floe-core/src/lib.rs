//! `floe-core`: the vocabulary the runtime and its adapters share.
//!
//! * [`source`] — a [`Source`] yields [`SourceRecord`]s from partitions it owns, seeks to the
//!   [`Positions`] the runtime read from the catalog, and is told when positions are durably
//!   committed;
//! * [`format`] — a [`Format`] turns records into rows of the streams it declares, or refuses
//!   a record with a reason (the runtime dead-letters it);
//! * [`stream`] — named streams ([`StreamSpec`]), append or changelog ([`Op`]), and batches of
//!   them tagged with their source partitions ([`StreamBatch`]);
//! * [`reader`] — a [`Reader`] is what feeds a job: records through a format, or a database's
//!   change stream; it owns positions and says where a barrier may go;
//! * [`exchange`] — an [`ExchangeProducer`] writes the records a job re-keys through a topic;
//! * [`mirror`] — a [`Mirror`] receives the rows a job committed to a table, each snapshot
//!   once, after its commit (a Kafka topic, Prometheus);
//! * [`rollup`] — what a window records in its rollup table for the maintenance merge;
//! * [`error`] — [`SourceError`], the one error of all of them: whose fault, retryable or not.
//!
//! A new source implements [`Source`] (records) or [`Reader`] (rows); its configuration lives
//! in its own crate, next to it.

pub mod error;
pub mod exchange;
pub mod format;
pub mod mirror;
pub mod reader;
pub mod rollup;
pub mod source;
pub mod stream;

pub use error::{Fault, SourceError, SourceResult};
pub use exchange::ExchangeProducer;
pub use format::{Appended, Format, Refused};
pub use mirror::{Delivery, Mirror};
pub use reader::{Barrier, Committed, DeadLetter, ReadItem, ReadOut, Reader};
pub use source::{
    PollLimit, Polled, Positions, Source, SourceRecord, StartAt, partition_of_entry, position_key,
    position_of,
};
pub use stream::{
    OP_COLUMN, Op, PartitionRun, StreamBatch, StreamSpec, UNCHANGED_COLUMN, extend_runs,
};
