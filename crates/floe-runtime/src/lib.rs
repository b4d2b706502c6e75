//! `floe-runtime`: runs one job — a [`floe_core::Reader`]'s streams into Iceberg tables, one
//! exactly-once, fenced commit per checkpoint, for every kind of job (see [`run`] for the
//! loop and [`committer`] for the protocol). It names no concrete source or format: the
//! `floe` binary wires them from the job file ([`job`]); [`RecordReader`] turns any
//! [`floe_core::Source`] and [`floe_core::Format`] into a reader.

mod committer;
pub mod deadletter;
pub mod exchange;
pub mod job;
mod landing;
pub mod metrics;
pub mod mirror;
pub mod mirror_config;
pub mod page;
mod pipeline;
mod pipeline_thread;
pub mod record;
pub mod run;
mod sink;
mod state_table;
mod upsert;

pub use job::JobConfig;
pub use metrics::JobMetrics;
pub use record::RecordReader;
pub use run::{Job, RunOptions, RunSummary};
