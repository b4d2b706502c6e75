//! `floe-cdc`: change data capture sources.
//!
//! * [`postgres`] — the [`floe_core::Reader`] of a Postgres publication: a consistent
//!   initial copy, then logical replication (pgoutput over `pgwire-replication`), acknowledged
//!   only after the Iceberg commit;
//! * [`debezium`] — the [`floe_core::Format`] of Debezium change events (JSON) read from
//!   Kafka topics, exactly once through the offsets committed with the data;
//! * [`pgoutput`] — the pgoutput message decoder;
//! * [`types`] — the Postgres → Iceberg type mapping and text-value parsing;
//! * [`changelog`] — changelog rows (`+I`/`+U`/`-D`) built from decoded tuples, shared by
//!   both; the runtime's upsert sink collapses them per key.

pub mod changelog;
mod copy;
pub mod debezium;
pub mod pgoutput;
pub mod postgres;
mod tls;
pub mod types;
