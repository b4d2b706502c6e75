//! One maintenance task on one table, now: what `floe-maintenance run-once` and `plan` do, and
//! what the scheduler will call. Each task takes its parameters from the first policy matching
//! the table, or the defaults when no policy sets it.

use std::fmt;

use floe_lake::LakeResult;
use floe_lake::commit::{RetryPolicy, TableOperation, commit_operation};
use floe_lake::expire::{expire_snapshots, plan_expiry};
use floe_lake::orphans::remove_orphan_files;
use floe_lake::rest::CatalogClient;
use floe_lake::snapshot::current_manifests;

use crate::compact::{CompactionReport, compact, plan_compaction};
use crate::config::Policy;
use crate::merge::{merge, plan_merge};
use crate::state::now_ms;

/// A maintenance task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Task {
    /// Bin-pack small files and apply deletes.
    Compact,
    /// Expire old snapshots and delete their files.
    Expire,
    /// Remove unreferenced files.
    Orphans,
    /// Merge small manifests.
    Manifests,
    /// Merge the partial rows of closed windows in a rollup table.
    Merge,
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Task::Compact => "compact",
            Task::Expire => "expire",
            Task::Orphans => "orphans",
            Task::Manifests => "manifests",
            Task::Merge => "merge",
        })
    }
}

impl std::str::FromStr for Task {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "compact" => Task::Compact,
            "expire" => Task::Expire,
            "orphans" => Task::Orphans,
            "manifests" => Task::Manifests,
            "merge" => Task::Merge,
            other => return Err(format!("unknown task {other:?}")),
        })
    }
}

/// What one task did (or, dry, would do): counts for the metrics and a one-line summary.
#[derive(Debug, Clone, Default)]
pub struct TaskReport {
    /// One line for people.
    pub summary: String,
    /// Data files replaced by compaction.
    pub files_rewritten: u64,
    /// Input bytes of the replaced files.
    pub bytes_rewritten: u64,
    /// Data files written by compaction.
    pub files_written: u64,
    /// Delete files removed by compaction.
    pub delete_files_removed: u64,
    /// Compaction groups that conflicted with a writer (planned again next run).
    pub groups_conflicted: u64,
    /// Snapshots expired.
    pub snapshots_expired: u64,
    /// Files deleted by expiry or orphan removal.
    pub files_deleted: u64,
}

/// Runs `task` on `table` (or, with `dry_run`, describes what it would change). Compaction
/// reports its progress to `progress` after each partition group.
pub async fn run_task(
    client: &CatalogClient,
    table: &iceberg::TableIdent,
    policy: Option<&Policy>,
    task: Task,
    dry_run: bool,
    progress: &(dyn Fn(&CompactionProgress) + Send + Sync),
) -> LakeResult<TaskReport> {
    let retry = RetryPolicy::default();
    let loaded = client.load_table(table).await?;
    match task {
        Task::Compact => {
            let settings = policy
                .and_then(|p| p.compact.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or_default();
            let Some(plan) = plan_compaction(&loaded, &settings).await? else {
                return Ok(summary(format!("compact {table}: nothing to do")));
            };
            let files: usize = plan.groups.iter().map(|g| g.data_files.len()).sum();
            let deletes: usize = plan.groups.iter().map(|g| g.delete_files.len()).sum();
            let bytes: u64 = plan.groups.iter().map(|g| g.bytes()).sum();
            if dry_run {
                return Ok(summary(format!(
                    "compact {table}: would rewrite {files} data files ({bytes} bytes) in {} partitions and remove {deletes} delete files",
                    plan.groups.len()
                )));
            }
            let total = CompactionProgress {
                groups: plan.groups.len(),
                bytes,
                done: CompactionReport::default(),
            };
            let report = compact(client, table, &plan, &settings, &|done| {
                progress(&CompactionProgress {
                    done: done.clone(),
                    ..total.clone()
                })
            })
            .await?;
            Ok(TaskReport {
                summary: format!(
                    "compact {table}: rewrote {} data files ({} bytes) into {}, removed {} delete files, {} partitions committed, {} conflicted{}",
                    report.files_rewritten,
                    report.bytes_rewritten,
                    report.files_written,
                    report.delete_files_removed,
                    report.groups_committed,
                    report.groups_conflicted,
                    if report.manifests_merged {
                        ", manifests merged"
                    } else {
                        ""
                    }
                ),
                files_rewritten: report.files_rewritten as u64,
                bytes_rewritten: report.bytes_rewritten,
                files_written: report.files_written as u64,
                delete_files_removed: report.delete_files_removed as u64,
                groups_conflicted: report.groups_conflicted as u64,
                ..TaskReport::default()
            })
        }
        Task::Expire => {
            let policy = policy
                .and_then(|p| p.expire.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or_default();
            let settings = policy.at(now_ms());
            if dry_run {
                let ids = plan_expiry(&loaded.metadata, &settings);
                return Ok(summary(format!(
                    "expire {table}: would expire {} snapshots {ids:?}",
                    ids.len()
                )));
            }
            let report = expire_snapshots(client, table, &settings, &retry).await?;
            Ok(TaskReport {
                summary: format!(
                    "expire {table}: expired {} snapshots, deleted {} files",
                    report.expired.len(),
                    report.deleted_files.len()
                ),
                snapshots_expired: report.expired.len() as u64,
                files_deleted: report.deleted_files.len() as u64,
                ..TaskReport::default()
            })
        }
        Task::Orphans => {
            let mut settings = policy
                .and_then(|p| p.orphans.as_ref())
                .map(|s| s.task.clone())
                .unwrap_or_default();
            settings.dry_run = dry_run;
            let report = remove_orphan_files(client, table, &settings).await?;
            let verb = if dry_run { "would remove" } else { "removed" };
            Ok(TaskReport {
                summary: format!(
                    "orphans {table}: {verb} {} files {:?}",
                    report.orphans.len(),
                    report.orphans
                ),
                files_deleted: if dry_run {
                    0
                } else {
                    report.orphans.len() as u64
                },
                ..TaskReport::default()
            })
        }
        Task::Merge => merge_task(client, table, &loaded, dry_run).await,
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
                return Ok(summary(format!(
                    "manifests {table}: {before} manifests, {small} below the target"
                )));
            }
            let merged = commit_operation(client, table, &merge, &retry).await?;
            let after = current_manifests(&client.load_table(table).await?)
                .await?
                .len();
            Ok(summary(match merged {
                Some(_) => format!(
                    "manifests {table}: {before} -> {after} manifests ({})",
                    merge.name()
                ),
                None => format!("manifests {table}: nothing to do ({before} manifests)"),
            }))
        }
    }
}

/// The merge task: plans on the current snapshot, then rewrites partition by partition.
async fn merge_task(
    client: &CatalogClient,
    table: &iceberg::TableIdent,
    loaded: &floe_lake::rest::LoadedTable,
    dry_run: bool,
) -> LakeResult<TaskReport> {
    let Some(plan) = plan_merge(loaded).await? else {
        return Ok(summary(format!(
            "merge {table}: nothing to do (no rollup, or no watermark committed yet)"
        )));
    };
    let closed = plan
        .watermarks
        .iter()
        .map(|(p, w)| format!("{p} at {w}"))
        .collect::<Vec<_>>()
        .join(", ");
    if dry_run {
        return Ok(summary(format!(
            "merge {table}: would read {} partitions ({} data files) of job {}'s operator {} (watermarks {closed})",
            plan.groups.len(),
            plan.groups
                .iter()
                .map(|g| g.data_files.len())
                .sum::<usize>(),
            plan.job,
            plan.rollup.operator,
        )));
    }
    let report = merge(client, table, &plan).await?;
    Ok(TaskReport {
        summary: format!(
            "merge {table}: {} partial rows merged into {} rows in {} partitions ({} unchanged, {} conflicted), {} data files and {} delete files replaced",
            report.rows_merged,
            report.rows_written,
            report.partitions_committed,
            report.partitions_unchanged,
            report.partitions_conflicted,
            report.files_rewritten,
            report.delete_files_removed,
        ),
        files_rewritten: report.files_rewritten as u64,
        files_written: report.files_written as u64,
        delete_files_removed: report.delete_files_removed as u64,
        groups_conflicted: report.partitions_conflicted as u64,
        ..TaskReport::default()
    })
}

fn summary(line: String) -> TaskReport {
    TaskReport {
        summary: line,
        ..TaskReport::default()
    }
}

/// How far a compaction run is.
#[derive(Debug, Clone)]
pub struct CompactionProgress {
    /// Partition groups planned.
    pub groups: usize,
    /// Input bytes planned.
    pub bytes: u64,
    /// What is done so far.
    pub done: CompactionReport,
}
