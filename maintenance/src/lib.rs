//! `floe-maintenance`: the work that keeps Floe's tables fast while the writers keep
//! committing — compaction ([`compact`]) here, and snapshot expiry, orphan removal and manifest
//! merging from `floe-lake`.
//!
//! Nothing here may lose a row or bring a deleted one back while `floe run` commits to the same
//! table: every rewrite goes through `floe-lake`'s validated RewriteFiles, per partition group,
//! so one conflict costs one group, never the run.

pub mod compact;
pub mod config;
pub mod daemon;
pub mod merge;
pub mod metrics;
pub mod page;
pub mod state;
pub mod tasks;
