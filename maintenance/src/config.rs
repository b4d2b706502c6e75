//! The maintenance config file (`maintenance/maintenance.toml` is the example): the catalog,
//! and policies — per table or table glob — each with a cron `schedule` and the parameters of
//! its tasks. Parsed into raw structs that refuse unknown fields, validated with every problem
//! at its file:line:col, built into a typed [`MaintenanceConfig`]. The catalog's settings and
//! the metrics address take `${VAR}` and `${VAR:-default}` from the environment.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use floe_config::{Checker, ConfigErrors, Source};
use floe_lake::expire::ExpireSnapshots;
use floe_lake::manifests::RewriteManifests;
use floe_lake::orphans::RemoveOrphans;
use floe_lake::rest::CatalogSettings;
use iceberg::TableIdent;
use serde::Deserialize;
use toml::Spanned;

use crate::compact::CompactionSettings;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    /// Format version; must be 1.
    version: Option<Spanned<i64>>,
    /// The catalog holding the tables.
    catalog: RawCatalog,
    /// How the daemon runs.
    daemon: Option<RawDaemon>,
    /// One policy per table or table glob; the first matching policy applies.
    #[serde(default, rename = "policy")]
    policies: Vec<RawPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    /// Tasks running at once, on different tables (default 2).
    concurrency: Option<Spanned<i64>>,
    /// Address of the Prometheus `/metrics` endpoint (default: none).
    metrics_listen: Option<Spanned<String>>,
    /// The table holding the daemons' leases and last runs (default floe_maintenance.state).
    state_table: Option<Spanned<String>>,
    /// How long a lease lasts unless renewed (default 5m).
    lease_ttl: Option<Spanned<String>>,
    /// How often the catalog is listed for tables (default 1m).
    discover_every: Option<Spanned<String>>,
    /// How long running tasks may take to finish on SIGTERM (default 30s).
    shutdown_grace: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    /// REST catalog URI.
    uri: Spanned<String>,
    /// Warehouse name sent to the catalog.
    warehouse: Option<Spanned<String>>,
    /// Bearer token (or FLOE_CATALOG_TOKEN).
    token: Option<Spanned<String>>,
    /// OAuth2 `id:secret` (or FLOE_CATALOG_CREDENTIAL).
    credential: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    /// `namespace.table`, with `*` matching any run of characters.
    tables: Spanned<String>,
    compact: Option<RawCompact>,
    expire: Option<RawExpire>,
    orphans: Option<RawOrphans>,
    manifests: Option<RawManifests>,
    merge: Option<RawMerge>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompact {
    /// Cron schedule (seconds minutes hours day-of-month month day-of-week).
    schedule: Spanned<String>,
    /// Target file size in MiB (default 128).
    target_file_size_mb: Option<Spanned<i64>>,
    /// Compact once a partition has this many small files (default 5).
    min_input_files: Option<Spanned<i64>>,
    /// Rewrite a partition with this many delete files (default 1).
    delete_file_threshold: Option<Spanned<i64>>,
    /// Input budget of one run in MiB (default 16384).
    max_mb_per_run: Option<Spanned<i64>>,
    /// Only partitions that received no file for this long, e.g. `1h` (default: all).
    sealed_after: Option<Spanned<String>>,
    /// Sort rewritten rows by these columns, `"name"` or `"name DESC"` (default: no sort).
    #[serde(default)]
    sort_by: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpire {
    /// Cron schedule.
    schedule: Spanned<String>,
    /// Expire snapshots older than this, e.g. `5d`, `12h` (default 5d).
    older_than: Option<Spanned<String>>,
    /// Keep at least this many snapshots (default 10).
    retain_last: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOrphans {
    /// Cron schedule.
    schedule: Spanned<String>,
    /// Only remove files older than this, e.g. `3d` (default 3d).
    min_age: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifests {
    /// Cron schedule.
    schedule: Spanned<String>,
    /// Merge manifests smaller than this many MiB (default 8).
    target_size_mb: Option<Spanned<i64>>,
    /// Only once this many small manifests exist (default 10).
    min_manifests: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMerge {
    /// Cron schedule.
    schedule: Spanned<String>,
}

/// A task with its schedule.
#[derive(Debug, Clone)]
pub struct Scheduled<T> {
    /// When it runs.
    pub schedule: cron::Schedule,
    /// Its parameters.
    pub task: T,
}

/// What to do to the tables one pattern matches.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `namespace.table` glob.
    pub tables: String,
    /// Compaction.
    pub compact: Option<Scheduled<CompactionSettings>>,
    /// Snapshot expiry (its `older_than_ms` is relative: hours before each run).
    pub expire: Option<Scheduled<ExpiryPolicy>>,
    /// Orphan removal.
    pub orphans: Option<Scheduled<RemoveOrphans>>,
    /// Manifest merging.
    pub manifests: Option<Scheduled<RewriteManifests>>,
    /// Merging the partials of closed windows (rollup tables; others have nothing to merge).
    pub merge: Option<cron::Schedule>,
}

/// Expiry relative to the time of each run.
#[derive(Debug, Clone)]
pub struct ExpiryPolicy {
    /// Age past which snapshots may go.
    pub older_than: Duration,
    /// Snapshots always kept.
    pub retain_last: usize,
}

impl Default for ExpiryPolicy {
    fn default() -> Self {
        Self {
            older_than: Duration::from_secs(5 * 86400),
            retain_last: 10,
        }
    }
}

impl ExpiryPolicy {
    /// The expiry to run now.
    pub fn at(&self, now_ms: i64) -> ExpireSnapshots {
        ExpireSnapshots {
            older_than_ms: now_ms - i64::try_from(self.older_than.as_millis()).unwrap_or(i64::MAX),
            retain_last: self.retain_last,
            protect: Vec::new(),
        }
    }
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonSettings {
    /// Tasks running at once (never two on one table).
    pub concurrency: usize,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_listen: Option<String>,
    /// The table holding leases and last runs.
    pub state_table: TableIdent,
    /// How long a lease lasts unless renewed.
    pub lease_ttl: Duration,
    /// How often the catalog is listed for tables.
    pub discover_every: Duration,
    /// How long running tasks may take to finish on SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
}

impl Default for DaemonSettings {
    fn default() -> Self {
        Self {
            concurrency: 2,
            metrics_listen: None,
            state_table: TableIdent::from_strs(["floe_maintenance", "state"])
                .expect("valid identifier"),
            lease_ttl: Duration::from_secs(300),
            discover_every: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// The validated maintenance config.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// How to reach the catalog.
    pub catalog: CatalogSettings,
    /// How the daemon runs.
    pub daemon: DaemonSettings,
    /// Policies, first match wins.
    pub policies: Vec<Policy>,
}

/// Whether `name` (`ns.table`) matches `pattern`, where `*` matches any run of characters.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return pattern == name;
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    for (i, part) in tail.iter().enumerate() {
        if i == tail.len() - 1 {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// A cron schedule (with seconds: `sec min hour day month weekday`).
fn schedule(c: &mut Checker<'_>, value: &Spanned<String>) -> Option<cron::Schedule> {
    match cron::Schedule::from_str(value.get_ref()) {
        Ok(s) => Some(s),
        Err(e) => {
            c.at(
                value,
                format!(
                    "schedule {:?} is not a cron expression (sec min hour day month weekday): {e}",
                    value.get_ref()
                ),
            );
            None
        }
    }
}

const MIB: u64 = 1024 * 1024;

impl MaintenanceConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let text = floe_config::read(path)?;
        Self::from_toml(Some(path), &text)
    }

    /// Validates config text (`file` names it in error messages).
    pub fn from_toml(file: Option<&Path>, text: &str) -> Result<Self, ConfigErrors> {
        let source = Source { file, text };
        let raw: RawFile = floe_config::parse(source)?;
        let mut c = Checker::new(source);
        c.version(raw.version.as_ref());
        let uri = c.text(&raw.catalog.uri);
        if url::Url::parse(&uri).is_err() {
            c.at(
                &raw.catalog.uri,
                format!("catalog uri {uri:?} is not a URL"),
            );
        }
        let catalog = CatalogSettings {
            uri,
            warehouse: raw.catalog.warehouse.as_ref().map(|v| c.text(v)),
            token: raw
                .catalog
                .token
                .as_ref()
                .map(|v| c.text(v))
                .or_else(floe_config::catalog_token_from_env),
            credential: raw
                .catalog
                .credential
                .as_ref()
                .map(|v| c.text(v))
                .or_else(floe_config::catalog_credential_from_env),
            ..CatalogSettings::default()
        };
        let mut daemon = DaemonSettings::default();
        if let Some(d) = &raw.daemon {
            daemon.concurrency = c.positive(
                d.concurrency.as_ref(),
                "concurrency",
                daemon.concurrency as u64,
            ) as usize;
            daemon.metrics_listen = d.metrics_listen.as_ref().map(|v| c.text(v));
            if let Some(name) = &d.state_table {
                match crate::state::table_ident(name.get_ref()) {
                    Some(ident) => daemon.state_table = ident,
                    None => c.at(
                        name,
                        format!(
                            "state_table {:?} must look like namespace.table",
                            name.get_ref()
                        ),
                    ),
                }
            }
            daemon.lease_ttl = c.duration(d.lease_ttl.as_ref(), daemon.lease_ttl);
            daemon.discover_every = c.duration(d.discover_every.as_ref(), daemon.discover_every);
            daemon.shutdown_grace = c.duration(d.shutdown_grace.as_ref(), daemon.shutdown_grace);
        }
        let mut policies = Vec::new();
        for p in &raw.policies {
            let tables = p.tables.get_ref().clone();
            if tables.is_empty() || !(tables.contains('.') || tables.contains('*')) {
                c.at(
                    &p.tables,
                    format!(
                        "tables {tables:?} must look like namespace.table (globs with * allowed)"
                    ),
                );
            }
            let compact = p.compact.as_ref().and_then(|r| {
                let schedule = schedule(&mut c, &r.schedule);
                let task = CompactionSettings {
                    target_file_size: c.positive(
                        r.target_file_size_mb.as_ref(),
                        "target_file_size_mb",
                        128,
                    ) * MIB,
                    min_input_files: c.positive(r.min_input_files.as_ref(), "min_input_files", 5)
                        as usize,
                    delete_file_threshold: c.positive(
                        r.delete_file_threshold.as_ref(),
                        "delete_file_threshold",
                        1,
                    ) as usize,
                    max_bytes_per_run: c.positive(
                        r.max_mb_per_run.as_ref(),
                        "max_mb_per_run",
                        16384,
                    ) * MIB,
                    sort_by: r.sort_by.clone(),
                    sealed_after: c.duration(r.sealed_after.as_ref(), Duration::ZERO),
                };
                schedule.map(|schedule| Scheduled { schedule, task })
            });
            let expire = p.expire.as_ref().and_then(|r| {
                let schedule = schedule(&mut c, &r.schedule);
                let default = ExpiryPolicy::default();
                let task = ExpiryPolicy {
                    older_than: c.duration(r.older_than.as_ref(), default.older_than),
                    retain_last: c.positive(
                        r.retain_last.as_ref(),
                        "retain_last",
                        default.retain_last as u64,
                    ) as usize,
                };
                schedule.map(|schedule| Scheduled { schedule, task })
            });
            let orphans = p.orphans.as_ref().and_then(|r| {
                let schedule = schedule(&mut c, &r.schedule);
                let task = RemoveOrphans {
                    older_than: c.duration(r.min_age.as_ref(), RemoveOrphans::default().older_than),
                    dry_run: false,
                };
                schedule.map(|schedule| Scheduled { schedule, task })
            });
            let manifests = p.manifests.as_ref().and_then(|r| {
                let schedule = schedule(&mut c, &r.schedule);
                let task = RewriteManifests {
                    target_bytes: (c.positive(r.target_size_mb.as_ref(), "target_size_mb", 8) * MIB)
                        as i64,
                    min_manifests: c.positive(r.min_manifests.as_ref(), "min_manifests", 10)
                        as usize,
                };
                schedule.map(|schedule| Scheduled { schedule, task })
            });
            let merge = p.merge.as_ref().and_then(|r| schedule(&mut c, &r.schedule));
            policies.push(Policy {
                tables,
                compact,
                expire,
                orphans,
                manifests,
                merge,
            });
        }
        c.finish(|| Self {
            catalog,
            daemon,
            policies,
        })
    }

    /// The first policy whose pattern matches `ns.table`.
    pub fn policy_for(&self, table: &str) -> Option<&Policy> {
        self.policies
            .iter()
            .find(|p| glob_matches(&p.tables, table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("otel.*", "otel.spans"));
        assert!(glob_matches("*.spans", "otel.spans"));
        assert!(glob_matches("otel.spans", "otel.spans"));
        assert!(glob_matches("*", "a.b"));
        assert!(glob_matches("o*l.s*s", "otel.spans"));
        assert!(!glob_matches("otel.*", "cdc.orders"));
        assert!(!glob_matches("otel.spans", "otel.spans2"));
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("maintenance.toml");
        let config = MaintenanceConfig::load(&path).unwrap();
        assert!(
            config
                .policy_for("otel.spans")
                .is_some_and(|p| p.compact.is_some())
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_position() {
        let text = "version = 1\n[catalog]\nuri = \"http://127.0.0.1:8181\"\n\n[[policy]]\ntables = \"orders\"\n[policy.compact]\nschedule = \"every day\"\nmin_input_files = 0\n";
        let err = MaintenanceConfig::from_toml(Some(Path::new("m.toml")), text).unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("m.toml:6:10: tables \"orders\""), "{shown}");
        assert!(shown.contains("m.toml:8:12: schedule"), "{shown}");
        assert!(
            shown.contains("m.toml:9:19: min_input_files must be positive"),
            "{shown}"
        );
        let err = MaintenanceConfig::from_toml(
            Some(Path::new("m.toml")),
            "version = 1\n[catalog]\nuri = \"x\"\nurl = 1\n",
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("m.toml:4:1:"), "{err}");
    }
}
