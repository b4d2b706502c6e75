//! `floe-cdc`: change data capture sources.
//!
//! * [`postgres`] — the [`floe_core::Reader`] of a Postgres publication: a consistent
//!   initial copy, then logical replication (pgoutput over `pgwire-replication`), acknowledged
//!   only after the Iceberg commit; its sessions (and their TLS), the catalog, the slot and
//!   initial copy, and the stream are modules of their own;
//! * [`debezium`] — the [`floe_core::Format`] of Debezium change events (JSON) read from
//!   Kafka topics, exactly once through the offsets committed with the data;
//! * [`pgoutput`] — the pgoutput message decoder;
//! * [`types`] — the Postgres → Iceberg type mapping, and the Arrow column builder for
//!   values in Postgres' text or binary format (or already typed);
//! * [`changelog`] — changelog rows (`+I`/`+U`/`-D`) built from decoded tuples, shared by
//!   both; the runtime's upsert sink collapses them per key;
//! * `copy` — the binary `COPY` of one table in the initial snapshot.

pub mod changelog;
mod copy;
pub mod debezium;
pub mod pgoutput;
pub mod postgres;
pub mod types;
