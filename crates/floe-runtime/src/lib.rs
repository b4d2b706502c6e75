//! `floe-runtime`: runs one job — a [`floe_core::Source`] read through a
//! [`floe_core::Format`] into Iceberg tables, one exactly-once commit per checkpoint (see
//! [`run`] for the protocol). It names no concrete source or format; the `floe` binary wires
//! them from the job file ([`job`]).

pub mod cdc;
pub mod deadletter;
pub mod job;
pub mod metrics;
pub mod run;
pub mod tables;
mod writers;

pub use cdc::ChangeJob;
pub use job::JobConfig;
pub use metrics::JobMetrics;
pub use run::{Job, RunSummary};
