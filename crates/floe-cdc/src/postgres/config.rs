//! `[source.postgres]`: the job file section of the Postgres source, every field documented,
//! and its check into [`PostgresConfig`].
//!
//! ```toml
//! [source.postgres]
//! host = "${PGHOST:-localhost}"
//! port = "${PGPORT:-5432}"          # a number, or a string with ${VAR}
//! user = "replicator"
//! password = "${PGPASSWORD:-}"
//! database = "shop"
//! ssl_mode = "verify-full"          # disable | require | verify-ca | verify-full
//! ssl_root_cert = "/etc/ssl/db-ca.pem"
//! publication = "floe_shop"
//! slot = "floe_shop"
//! tables = ["public.orders", "public.customers"]
//! snapshot_parallelism = 4
//! snapshot_chunk_rows = 200000      # an added table is copied this many rows at a time
//! snapshot_chunk_delay = "0s"       # wait between an added table's chunks
//! replica_identity_full = false
//! warn_retained_wal = "1GiB"
//! ```

use std::collections::HashMap;
use std::path::PathBuf;

use floe_config::{Checker, Text};
use serde::Deserialize;
use toml::Spanned;

/// TLS to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS without verifying the certificate.
    Require,
    /// TLS, the certificate verified against `root_cert` (or the system roots).
    VerifyCa,
    /// As `VerifyCa`, and the host name checked.
    VerifyFull,
}

/// `[source.postgres]`.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Host name, or a Unix socket directory.
    pub host: String,
    /// Port.
    pub port: u16,
    /// User (needs the REPLICATION attribute).
    pub user: String,
    /// Password.
    pub password: String,
    /// Database.
    pub database: String,
    /// TLS.
    pub ssl_mode: SslMode,
    /// CA certificate file for `VerifyCa` / `VerifyFull`.
    pub ssl_root_cert: Option<std::path::PathBuf>,
    /// Publication (created if missing).
    pub publication: String,
    /// Replication slot (created if missing).
    pub slot: String,
    /// Tables (`schema.table`) the job follows; empty = all tables of a `FOR ALL TABLES`
    /// publication.
    pub tables: Vec<String>,
    /// Sessions copying tables in parallel during the initial snapshot.
    pub snapshot_parallelism: usize,
    /// Rows per chunk of an incremental snapshot.
    pub snapshot_chunk_rows: usize,
    /// The least time between two chunks of an incremental snapshot.
    pub snapshot_chunk_delay: std::time::Duration,
    /// Set `REPLICA IDENTITY FULL` on tables that need it instead of refusing them.
    pub replica_identity_full: bool,
    /// Warn when the slot retains more WAL than this (bytes).
    pub warn_retained_wal: u64,
    /// Iceberg table name of a source table (`schema.table` → name); default: the table name
    /// (`schema_table` outside `public`).
    pub table_names: HashMap<String, String>,
}

/// A port: a number, or a string (which may use `${VAR}`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawPort {
    /// `port = 5432`.
    Number(i64),
    /// `port = "${PGPORT:-5432}"`.
    Text(String),
}

/// `[source.postgres]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPostgres {
    /// Host name or Unix socket directory (default `localhost`).
    pub host: Option<Text>,
    /// Port (default 5432).
    pub port: Option<Spanned<RawPort>>,
    /// User; needs the REPLICATION attribute, and ownership of the tables (or superuser) to
    /// create the publication (default `postgres`).
    pub user: Option<Text>,
    /// Password (default empty).
    pub password: Option<Text>,
    /// Database (default `postgres`).
    pub database: Option<Text>,
    /// TLS as libpq's `sslmode`: `disable` (default), `require`, `verify-ca`, `verify-full` —
    /// for every session, replication included.
    pub ssl_mode: Option<Text>,
    /// CA certificate file for `verify-ca` / `verify-full` (default: the webpki roots).
    pub ssl_root_cert: Option<Text>,
    /// The publication, created if missing (default `floe_{job}`).
    pub publication: Option<Text>,
    /// The logical replication slot, created if missing (default `floe_{job}`).
    pub slot: Option<Text>,
    /// The tables (`schema.table`) the job follows; the publication is created for them, and
    /// a table added here later is added to it and copied by an incremental snapshot while
    /// the stream goes on. Absent: the publication is `FOR ALL TABLES`.
    pub tables: Option<Vec<Text>>,
    /// Sessions copying tables in parallel during the initial snapshot (1–64, default 2).
    pub snapshot_parallelism: Option<Spanned<i64>>,
    /// Rows per chunk of an incremental snapshot (1–10,000,000, default 200,000): a larger
    /// chunk copies faster, a smaller one holds less in memory while its watermark travels.
    /// Debezium's `incremental.snapshot.chunk.size`.
    pub snapshot_chunk_rows: Option<Spanned<i64>>,
    /// The least time between two chunks of an incremental snapshot (default `0s`): spares a
    /// busy primary, as pt-online-schema-change's `--sleep` does. The stream is not held.
    pub snapshot_chunk_delay: Option<Text>,
    /// Let Floe run `ALTER TABLE … REPLICA IDENTITY FULL` where TOASTed values need it
    /// (default false: such tables are refused with the statement to run).
    pub replica_identity_full: Option<bool>,
    /// Warn after each checkpoint while the slot retains more WAL than this (default 1GiB).
    pub warn_retained_wal: Option<Text>,
}

/// A job name as the default name of a slot or publication (`floe_{job}`, `-` and `.` as `_`).
fn default_name(job: &str) -> String {
    format!("floe_{}", job.replace(['-', '.'], "_"))
}

impl RawPostgres {
    /// The typed settings of job `job`; problems go to `c`. The Iceberg names of the job's
    /// tables are the job's to fill in ([`PostgresConfig::table_names`]).
    pub fn check(&self, c: &mut Checker<'_>, job: &str) -> PostgresConfig {
        let port = match &self.port {
            None => 5432,
            Some(port) => {
                let value = match port.get_ref() {
                    RawPort::Number(n) => Some(*n),
                    RawPort::Text(text) => match floe_config::interpolate(text) {
                        Ok(text) => text.trim().parse::<i64>().ok(),
                        Err(e) => {
                            c.at(port, e);
                            Some(5432)
                        }
                    },
                };
                match value.map(u16::try_from) {
                    Some(Ok(v)) if v > 0 => v,
                    _ => {
                        c.at(port, "a port is 1 to 65535");
                        5432
                    }
                }
            }
        };
        let ssl_mode = c.choice(
            self.ssl_mode.as_ref(),
            "ssl_mode",
            &[
                ("disable", SslMode::Disable),
                ("require", SslMode::Require),
                ("verify-ca", SslMode::VerifyCa),
                ("verify-full", SslMode::VerifyFull),
            ],
            SslMode::Disable,
        );
        let slot = c
            .opt(self.slot.as_ref())
            .unwrap_or_else(|| default_name(job));
        if let Some(raw) = &self.slot
            && !slot
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_')
        {
            c.at(
                raw,
                "a replication slot name is lower-case letters, digits and '_'",
            );
        }
        let tables = self.tables.iter().flatten().map(|t| c.text(t)).collect();
        PostgresConfig {
            host: c
                .opt(self.host.as_ref())
                .unwrap_or_else(|| "localhost".into()),
            port,
            user: c
                .opt(self.user.as_ref())
                .unwrap_or_else(|| "postgres".into()),
            password: c.opt(self.password.as_ref()).unwrap_or_default(),
            database: c
                .opt(self.database.as_ref())
                .unwrap_or_else(|| "postgres".into()),
            ssl_mode,
            ssl_root_cert: c.opt(self.ssl_root_cert.as_ref()).map(PathBuf::from),
            publication: c
                .opt(self.publication.as_ref())
                .unwrap_or_else(|| default_name(job)),
            slot,
            tables,
            snapshot_parallelism: c.integer(
                self.snapshot_parallelism.as_ref(),
                "snapshot_parallelism",
                1..=64,
                2,
            ) as usize,
            snapshot_chunk_rows: c.integer(
                self.snapshot_chunk_rows.as_ref(),
                "snapshot_chunk_rows",
                1..=10_000_000,
                200_000,
            ) as usize,
            snapshot_chunk_delay: c.duration_or_zero(
                self.snapshot_chunk_delay.as_ref(),
                std::time::Duration::ZERO,
            ),
            replica_identity_full: self.replica_identity_full.unwrap_or(false),
            warn_retained_wal: c.bytes(self.warn_retained_wal.as_ref(), 1024 * 1024 * 1024),
            table_names: HashMap::new(),
        }
    }
}
