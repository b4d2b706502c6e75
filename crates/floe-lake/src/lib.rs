//! `floe-lake`: the Iceberg table operations Floe needs and iceberg-rust 0.10 lacks, behind a
//! narrow API that could be upstreamed.
//!
//! * [`rest`] — a client of any spec-conforming REST catalog for our own commits, single-table
//!   and multi-table (`transactions/commit`), with outcomes classified for exactly-once:
//!   conflict, unknown, definite failure;
//! * [`snapshot`] — snapshots built from iceberg's manifest writers: a row delta (data,
//!   equality deletes and position deletes in one snapshot, sharing one sequence number);
//! * [`writer`] — partitioned data writers, equality-delete and position-delete writers;
//! * [`location`] — file locations with partition directories escaped as Iceberg Java does;
//! * [`marker`] — `floe.*` commit markers and the ancestry walk that finds them again;
//! * [`tables`] — a writer's tables: created on first use, evolved by name, batches conformed;
//! * [`savepoint`] — named, retained checkpoints of a job as tags, and rewinding to one.
//! * [`read`] — a snapshot's live rows with position and equality deletes applied by hash
//!   lookups (iceberg-rust 0.10's reader slows with rows × deleted keys).
//!
//! Iceberg is the truth: a commit's marker rides in its own snapshot, and after a crash or an
//! unknown outcome the caller reloads and walks the history before deciding to re-commit.

pub mod commit;
pub mod error;
pub mod expire;
pub mod location;
pub mod manifests;
pub mod marker;
pub mod orphans;
pub mod read;
pub mod rest;
pub mod rewrite;
pub mod savepoint;
pub mod snapshot;
pub mod tables;
pub mod writer;

pub use error::{ErrorKind, LakeError, LakeResult};
