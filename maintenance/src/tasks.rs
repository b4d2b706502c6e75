//! One maintenance task on one table, now: what `floe-maintenance run-once` and `plan` do, and
//! what the scheduler will call. Each task takes its parameters from the first policy matching
//! the table, or the defaults when no policy sets it.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use floe_lake::LakeResult;
use floe_lake::commit::{RetryPolicy, TableOperation, commit_operation};
use floe_lake::expire::{expire_snapshots, plan_expiry};
use floe_lake::orphans::remove_orphan_files;
use floe_lake::rest::CatalogClient;
use floe_lake::snapshot::current_manifests;

use crate::compact::{compact, plan_compaction};
use crate::config::{ExpiryPolicy, Policy};

/// A maintenance task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Bin-pack small files and apply deletes.
    Compact,
    /// Expire old snapshots and delete their files.
    Expire,
    /// Remove unreferenced files.
    Orphans,
    /// Merge small manifests.
    Manifests,
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Task::Compact => "compact",
            Task::Expire => "expire",
            Task::Orphans => "orphans",
            Task::Manifests => "manifests",
        })
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Runs `task` on `table` (or, with `dry_run`, describes what it would change) and returns a
/// one-line summary.
pub async fn run_task(
    client: &CatalogClient,
    table: &iceberg::TableIdent,
    policy: Option<&Policy>,
    task: Task,
    dry_run: bool,
) -> LakeResult<String> {
    let retry = RetryPolicy::default();
    let loaded = client.load_table(table).await?;
    match task {
        Task::Compact => {
            let settings = policy
                .and_then(|p| p.compact.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or_default();
            let Some(plan) = plan_compaction(&loaded, &settings).await? else {
                return Ok(format!("compact {table}: nothing to do"));
            };
            let files: usize = plan.groups.iter().map(|g| g.data_files.len()).sum();
            let deletes: usize = plan.groups.iter().map(|g| g.delete_files.len()).sum();
            let bytes: u64 = plan.groups.iter().map(|g| g.bytes()).sum();
            if dry_run {
                return Ok(format!(
                    "compact {table}: would rewrite {files} data files ({bytes} bytes) in {} partitions and remove {deletes} delete files",
                    plan.groups.len()
                ));
            }
            let report = compact(client, table, &plan, &settings).await?;
            Ok(format!(
                "compact {table}: rewrote {} data files ({} bytes) into {}, removed {} delete files, {} partitions committed, {} conflicted",
                report.files_rewritten,
                report.bytes_rewritten,
                report.files_written,
                report.delete_files_removed,
                report.groups_committed,
                report.groups_conflicted
            ))
        }
        Task::Expire => {
            let policy = policy
                .and_then(|p| p.expire.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or(ExpiryPolicy {
                    older_than: std::time::Duration::from_secs(120 * 3600),
                    retain_last: 10,
                });
            let settings = policy.at(now_ms());
            if dry_run {
                let ids = plan_expiry(&loaded.metadata, &settings);
                return Ok(format!(
                    "expire {table}: would expire {} snapshots {ids:?}",
                    ids.len()
                ));
            }
            let report = expire_snapshots(client, table, &settings, &retry).await?;
            Ok(format!(
                "expire {table}: expired {} snapshots, deleted {} files",
                report.expired.len(),
                report.deleted_files.len()
            ))
        }
        Task::Orphans => {
            let mut settings = policy
                .and_then(|p| p.orphans.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or_default();
            settings.dry_run = dry_run;
            let report = remove_orphan_files(client, table, &settings).await?;
            let verb = if dry_run { "would remove" } else { "removed" };
            Ok(format!(
                "orphans {table}: {verb} {} files {:?}",
                report.orphans.len(),
                report.orphans
            ))
        }
        Task::Manifests => {
            let merge = policy
                .and_then(|p| p.manifests.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or_default();
            let before = current_manifests(&loaded).await?.len();
            if dry_run {
                let small = current_manifests(&loaded)
                    .await?
                    .iter()
                    .filter(|m| m.manifest_length < merge.target_bytes)
                    .count();
                return Ok(format!(
                    "manifests {table}: {before} manifests, {small} below the target"
                ));
            }
            let merged = commit_operation(client, table, &merge, &retry).await?;
            let after = current_manifests(&client.load_table(table).await?)
                .await?
                .len();
            Ok(match merged {
                Some(_) => format!(
                    "manifests {table}: {before} -> {after} manifests ({})",
                    merge.name()
                ),
                None => format!("manifests {table}: nothing to do ({before} manifests)"),
            })
        }
    }
}
