//! Committing a checkpoint: every touched table gets one snapshot carrying the checkpoint's
//! marker (preceded, in the same table commit, by one of first data files when its delta has
//! them — see [`Delta::first_data_files`]), in one `transactions/commit` when the catalog
//! advertises it, else one commit per table — and never twice.
//!
//! The outcome rules:
//! * **409** — another writer moved `main`: delete this attempt's manifests, back off, reload,
//!   re-plan on the new head (after checking the files our position deletes target still
//!   exist), retry;
//! * **unknown** (5xx, timeout, connection lost after sending) — reload and look for this
//!   checkpoint's marker in each table's ancestry; tables that have it are done, the others are
//!   re-planned. This can never commit twice: every attempt asserts the `main` head it was
//!   planned on, so if an earlier attempt lands late, the retry fails its requirement (409),
//!   and the reload then finds the marker;
//! * **unavailable** (nothing sent) — retry; anything else is returned.

use std::collections::HashSet;
use std::time::Duration;

use iceberg::TableUpdate;
use iceberg::spec::{DataContentType, ManifestContentType, SnapshotReference, SnapshotRetention};

use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::marker::{CommitMarker, checkpoint_tag, newest_marker, newest_marker_of};
use crate::rest::{CatalogClient, LoadedTable};
use crate::snapshot::{Delta, PreparedSnapshot, current_manifests, prepare_row_delta};

/// How a checkpoint reached the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMode {
    /// One atomic `transactions/commit` for all tables.
    MultiTable,
    /// One commit per table (the catalog does not advertise multi-table commits); a crash
    /// between two of them leaves some tables committed — the markers tell which.
    PerTable,
}

/// Retry settings.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts before giving up.
    pub attempts: u32,
    /// First pause; doubles each attempt.
    pub initial_backoff: Duration,
    /// Longest pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 10,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// What a checkpoint commit did.
#[derive(Debug, Clone)]
pub struct CommitReport {
    /// How the tables were committed.
    pub mode: CommitMode,
    /// The snapshot now carrying this checkpoint's marker, per table.
    pub snapshots: Vec<(iceberg::TableIdent, i64)>,
    /// Attempts it took (1 when nothing went wrong).
    pub attempts: u32,
}

async fn discard(table: &LoadedTable, written: &[String]) {
    for path in written {
        if let Err(error) = table.io.delete(path).await {
            tracing::warn!(%path, %error, "could not delete an uncommitted manifest");
        }
    }
}

/// Fails if a position delete targets a data file that is not in the delta itself and is no
/// longer live in the table (a concurrent rewrite removed it; the delete would be lost).
async fn validate_position_targets(table: &LoadedTable, delta: &Delta) -> LakeResult<()> {
    let own: HashSet<&str> = delta
        .data_files
        .iter()
        .chain(&delta.first_data_files)
        .map(|f| f.file_path())
        .collect();
    let targets: HashSet<String> = delta
        .delete_files
        .iter()
        .filter(|f| f.content_type() == DataContentType::PositionDeletes)
        .filter_map(|f| f.referenced_data_file())
        .filter(|p| !own.contains(p.as_str()))
        .collect();
    if targets.is_empty() {
        return Ok(());
    }
    let mut live = HashSet::new();
    for manifest in current_manifests(table).await? {
        if manifest.content != ManifestContentType::Data {
            continue;
        }
        for entry in manifest.load_manifest(&table.io).await?.entries() {
            if entry.is_alive() {
                live.insert(entry.file_path().to_string());
            }
        }
    }
    match targets.iter().find(|t| !live.contains(*t)) {
        Some(missing) => Err(LakeError::new(
            ErrorKind::Invalid,
            format!(
                "position deletes target {missing}, which is no longer in {}; the rows must be \
                 deleted by key instead",
                table.ident
            ),
        )),
        None => Ok(()),
    }
}

/// Commits `tables` (each with its delta) as checkpoint `marker`, exactly once.
pub async fn commit_checkpoint(
    client: &CatalogClient,
    marker: &CommitMarker,
    tables: &[(iceberg::TableIdent, Delta)],
    policy: &RetryPolicy,
) -> LakeResult<CommitReport> {
    commit_checkpoint_planned(client, marker, tables, policy, |_| Ok(marker.clone())).await
}

/// Like [`commit_checkpoint`], for jobs whose positions live in an **anchor** table — the
/// first of `tables`, which every checkpoint of the job commits to (with an empty delta if it
/// has no rows), so its newest marker of the job holds the positions of the whole job.
///
/// On every attempt, `plan` gets the anchor's newest marker of the job (by any writer) as of
/// the head the attempt is planned on, and returns the marker to record — typically that
/// marker's positions with this writer's partitions moved forward, and its streams with this
/// writer's added — or an error to give up, e.g. because another writer committed one of this
/// writer's partitions meanwhile (fencing a replica that lost its partitions without
/// noticing). Landed attempts are recognised by `marker`'s job, writer and checkpoint id,
/// which the planned marker keeps whatever `plan` returns.
pub async fn commit_checkpoint_planned(
    client: &CatalogClient,
    marker: &CommitMarker,
    tables: &[(iceberg::TableIdent, Delta)],
    policy: &RetryPolicy,
    plan: impl Fn(Option<&CommitMarker>) -> LakeResult<CommitMarker>,
) -> LakeResult<CommitReport> {
    let mode = if client.supports_transactions() {
        CommitMode::MultiTable
    } else {
        CommitMode::PerTable
    };
    let mut done: Vec<(iceberg::TableIdent, i64)> = Vec::new();
    let mut backoff = policy.initial_backoff;
    // Whether an attempt's outcome stayed unknown: it may have landed, so whatever ends the
    // loop without finding out must say so (the caller then keeps the data files).
    let mut unknown = false;
    let unresolved = |unknown: bool, e: LakeError| {
        if unknown && e.kind() != ErrorKind::CommitStateUnknown {
            LakeError::new(
                ErrorKind::CommitStateUnknown,
                format!(
                    "checkpoint {} of job {}: an earlier attempt's outcome is unknown, then: {e}",
                    marker.checkpoint_id, marker.job_id
                ),
            )
        } else {
            e
        }
    };
    for attempt in 1..=policy.attempts.max(1) {
        // Plan every table that does not carry the marker yet, on its current head.
        let mut pending: Vec<(LoadedTable, PreparedSnapshot)> = Vec::new();
        let mut planning_error = None;
        // The marker of this attempt: its positions are decided on the anchor's head.
        let mut attempt_marker: Option<CommitMarker> = None;
        for (index, (ident, delta)) in tables.iter().enumerate() {
            let table = match client.load_table(ident).await {
                Ok(table) => table,
                Err(e) => return Err(unresolved(unknown, e)),
            };
            let own = newest_marker_of(&table.metadata, &marker.job_id, marker.writer.as_deref())
                .filter(|found| found.marker.checkpoint_id >= marker.checkpoint_id);
            if index == 0 {
                attempt_marker = Some(match &own {
                    // The anchor already has it (an earlier attempt landed on some tables).
                    Some(found) => found.marker.clone(),
                    None => {
                        let base = newest_marker(&table.metadata, &marker.job_id);
                        match plan(base.as_ref().map(|f| &f.marker)) {
                            Ok(planned) => CommitMarker {
                                job_id: marker.job_id.clone(),
                                writer: marker.writer.clone(),
                                checkpoint_id: marker.checkpoint_id,
                                ..planned
                            },
                            Err(e) => {
                                planning_error = Some(e);
                                break;
                            }
                        }
                    }
                });
            }
            if let Some(found) = own {
                if !done.iter().any(|(d, _)| d == ident) {
                    done.push((ident.clone(), found.snapshot_id));
                }
                continue;
            }
            if let Err(e) = validate_position_targets(&table, delta).await {
                planning_error = Some(e);
                break;
            }
            let mut delta = delta.clone();
            let marker = attempt_marker.as_ref().unwrap_or(marker);
            delta.properties.extend(marker.to_properties());
            match prepare_row_delta(&table, &delta).await {
                Ok(mut prepared) => {
                    prepared.commit.updates.push(TableUpdate::SetSnapshotRef {
                        ref_name: checkpoint_tag(&marker.job_id, marker.writer.as_deref()),
                        reference: SnapshotReference::new(
                            prepared.snapshot_id,
                            SnapshotRetention::Tag {
                                max_ref_age_ms: None,
                            },
                        ),
                    });
                    pending.push((table, prepared));
                }
                Err(e) => {
                    planning_error = Some(e);
                    break;
                }
            }
        }
        if let Some(error) = planning_error {
            for (table, prepared) in &pending {
                discard(table, &prepared.written).await;
            }
            return Err(unresolved(unknown, error));
        }
        if pending.is_empty() {
            return Ok(CommitReport {
                mode,
                snapshots: done,
                attempts: attempt,
            });
        }

        // A single table goes through the plain table commit in either mode.
        let result = match mode {
            CommitMode::MultiTable if pending.len() > 1 => {
                let commits: Vec<_> = pending.iter().map(|(_, p)| p.commit.clone()).collect();
                client
                    .commit_transaction(&commits)
                    .await
                    .map(|()| pending.len())
            }
            _ => {
                let mut committed = 0;
                let mut outcome = Ok(0);
                for (_, prepared) in &pending {
                    match client.commit_table(&prepared.commit).await {
                        Ok(()) => committed += 1,
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                }
                outcome.map(|_| committed)
            }
        };
        match result {
            Ok(_) => {
                done.extend(
                    pending
                        .iter()
                        .map(|(t, p)| (t.ident.clone(), p.snapshot_id)),
                );
                return Ok(CommitReport {
                    mode,
                    snapshots: done,
                    attempts: attempt,
                });
            }
            Err(error) if error.retryable() => {
                tracing::warn!(
                    checkpoint = marker.checkpoint_id,
                    attempt,
                    kind = ?error.kind(),
                    %error,
                    "checkpoint commit did not go through, reloading"
                );
                // Files of a commit whose outcome is unknown may be referenced now; keep them
                // (orphan removal collects them if not). A definite failure's files go.
                unknown |= error.kind() == ErrorKind::CommitStateUnknown;
                if error.kind() != ErrorKind::CommitStateUnknown {
                    for (table, prepared) in &pending {
                        if client
                            .load_table(&table.ident)
                            .await
                            .ok()
                            .and_then(|t| t.metadata.snapshot_by_id(prepared.snapshot_id).cloned())
                            .is_none()
                        {
                            discard(table, &prepared.written).await;
                        }
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(policy.max_backoff);
            }
            Err(error) => {
                for (table, prepared) in &pending {
                    discard(table, &prepared.written).await;
                }
                return Err(unresolved(unknown, error));
            }
        }
    }
    Err(unresolved(
        unknown,
        LakeError::new(
            ErrorKind::Conflict,
            format!(
                "checkpoint {} of job {} did not commit after {} attempts",
                marker.checkpoint_id, marker.job_id, policy.attempts
            ),
        ),
    ))
}

/// A change to one table that is planned on its current head and can be re-planned: a rewrite,
/// a manifest rewrite, an expiry.
pub trait TableOperation: Sync {
    /// A short name for logs.
    fn name(&self) -> &'static str;

    /// Plans (validates and writes the files of) the change on `table`'s current head;
    /// `None` when there is nothing to do.
    fn plan(
        &self,
        table: &LoadedTable,
    ) -> impl std::future::Future<Output = LakeResult<Option<PreparedCommit>>> + Send;

    /// The snapshot by which this operation already landed, if it did (checked before each
    /// attempt, so an unknown outcome is never applied twice).
    fn landed(&self, _table: &LoadedTable) -> Option<i64> {
        None
    }
}

/// A planned change to one table: the commit to send and the files written for it.
#[derive(Debug, Clone)]
pub struct PreparedCommit {
    /// Requirements and updates.
    pub commit: crate::rest::TableCommit,
    /// Files written for it; deleted if the commit definitely failed.
    pub written: Vec<String>,
    /// The snapshot it adds, if it adds one.
    pub snapshot_id: Option<i64>,
}

impl From<PreparedSnapshot> for PreparedCommit {
    fn from(p: PreparedSnapshot) -> Self {
        Self {
            commit: p.commit,
            written: p.written,
            snapshot_id: Some(p.snapshot_id),
        }
    }
}

/// Commits a [`TableOperation`]: retried on 409 and unknown outcomes with a fresh plan, never
/// applied twice. Returns the operation's snapshot, if it made one.
pub async fn commit_operation(
    client: &CatalogClient,
    ident: &iceberg::TableIdent,
    operation: &impl TableOperation,
    policy: &RetryPolicy,
) -> LakeResult<Option<i64>> {
    let mut backoff = policy.initial_backoff;
    for attempt in 1..=policy.attempts.max(1) {
        let table = client.load_table(ident).await?;
        if let Some(snapshot_id) = operation.landed(&table) {
            return Ok(Some(snapshot_id));
        }
        let Some(prepared) = operation.plan(&table).await? else {
            return Ok(None);
        };
        match client.commit_table(&prepared.commit).await {
            Ok(()) => return Ok(prepared.snapshot_id),
            Err(error) if error.retryable() => {
                tracing::warn!(
                    table = %ident,
                    operation = operation.name(),
                    attempt,
                    %error,
                    "commit did not go through, re-planning"
                );
                if error.kind() != ErrorKind::CommitStateUnknown {
                    discard(&table, &prepared.written).await;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(policy.max_backoff);
            }
            Err(error) => {
                discard(&table, &prepared.written).await;
                return Err(error);
            }
        }
    }
    Err(LakeError::new(
        ErrorKind::Conflict,
        format!(
            "{} of {ident} did not commit after {} attempts",
            operation.name(),
            policy.attempts
        ),
    ))
}
