//! ExpireSnapshots with file garbage collection: remove old snapshots from the metadata, then
//! delete the files that only they referenced (iceberg-rust 0.10's expiry deletes no files).
//!
//! What is never expired:
//! * the newest `retain_last` snapshots of `main` and every snapshot newer than `older_than_ms`;
//! * for every job whose `floe.*` marker appears on `main`, the snapshot carrying its newest
//!   marker **and every snapshot between it and the head**, so the ancestry walk of
//!   [`crate::marker::newest_marker`] still reaches it (recovery keeps working);
//! * every snapshot newer than what a job's mirror delivered (its newest marker's
//!   [`crate::marker::MIRRORED`] entry for this table): a mirror reads the rows each snapshot
//!   added;
//! * snapshots in `protect` (e.g. the starting snapshot of a running rewrite) and the chain
//!   above them;
//! * anything reachable from another branch or tag; of a job's checkpoint tag
//!   ([`crate::marker::checkpoint_tag`]), which follows `main`, the snapshot it names.
//!
//! Files are deleted only after the expiry committed, and only if no remaining snapshot —
//! including any committed meanwhile — references them. Files of commits still in flight are
//! referenced by no snapshot at all, so they are never candidates here (that is orphan
//! removal's job, with its minimum age).

use std::collections::HashSet;
use std::sync::Mutex;

use iceberg::spec::{ManifestList, TableMetadata};
use iceberg::{TableRequirement, TableUpdate};

use crate::commit::{PreparedCommit, RetryPolicy, TableOperation, commit_operation};
use crate::error::LakeResult;
use crate::marker::{self, CommitMarker, JOB_ID};
use crate::rest::{CatalogClient, LoadedTable, TableCommit};

/// Which snapshots to expire.
#[derive(Debug, Clone, Default)]
pub struct ExpireSnapshots {
    /// Snapshots older than this (ms since the epoch) may go.
    pub older_than_ms: i64,
    /// Always keep at least this many snapshots of `main`.
    pub retain_last: usize,
    /// Snapshots to keep regardless (with the chain above them).
    pub protect: Vec<i64>,
}

/// What an expiry did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpiryReport {
    /// Expired snapshot ids.
    pub expired: Vec<i64>,
    /// Files deleted because no remaining snapshot referenced them.
    pub deleted_files: Vec<String>,
}

struct Expiry<'a> {
    settings: &'a ExpireSnapshots,
    /// The metadata and ids of the last plan (the files of the expired snapshots are read from
    /// it after the commit).
    last_plan: Mutex<Option<(TableMetadata, Vec<i64>)>>,
}

fn main_chain(metadata: &TableMetadata) -> Vec<i64> {
    let mut out = Vec::new();
    let mut next = metadata.snapshot_for_ref("main").map(|s| s.snapshot_id());
    while let Some(id) = next {
        out.push(id);
        next = metadata
            .snapshot_by_id(id)
            .and_then(|s| s.parent_snapshot_id());
    }
    out
}

/// Snapshot ids to expire under `settings`.
pub fn plan_expiry(metadata: &TableMetadata, settings: &ExpireSnapshots) -> Vec<i64> {
    let chain = main_chain(metadata);
    let mut keep_through = settings
        .retain_last
        .max(1)
        .min(chain.len())
        .saturating_sub(1);
    let mut jobs_seen = HashSet::new();
    let uuid = metadata.uuid().to_string();
    // Snapshots newer than what a mirror delivered stay (ADR 0010).
    let mut mirrored_through = i64::MAX;
    for (index, id) in chain.iter().enumerate() {
        let Some(snapshot) = metadata.snapshot_by_id(*id) else {
            break;
        };
        let properties = &snapshot.summary().additional_properties;
        let newest_of_a_job = properties
            .get(JOB_ID)
            .is_some_and(|job| jobs_seen.insert(job.clone()));
        if newest_of_a_job
            && let Some(marker) = CommitMarker::from_properties(properties)
            && let Some(through) = marker::mirrored_through(&marker.positions, &uuid)
        {
            mirrored_through = mirrored_through.min(through);
        }
        if snapshot.sequence_number() > mirrored_through {
            keep_through = keep_through.max(index);
        }
        if snapshot.timestamp_ms() >= settings.older_than_ms
            || newest_of_a_job
            || settings.protect.contains(id)
        {
            keep_through = keep_through.max(index);
        }
    }
    let mut keep: HashSet<i64> = chain.iter().take(keep_through + 1).copied().collect();
    // Everything another branch or tag can reach stays — but a checkpoint tag keeps its own
    // snapshot only: it follows `main`'s head, and its history is `main`'s.
    for (name, head) in marker::other_refs(metadata) {
        if name.starts_with(marker::CHECKPOINT_TAG) {
            keep.insert(head);
            continue;
        }
        let mut next = Some(head);
        while let Some(id) = next.filter(|id| keep.insert(*id)) {
            next = metadata
                .snapshot_by_id(id)
                .and_then(|s| s.parent_snapshot_id());
        }
    }
    let mut expire: Vec<i64> = metadata
        .snapshots()
        .filter(|s| !keep.contains(&s.snapshot_id()))
        .filter(|s| s.timestamp_ms() < settings.older_than_ms || chain.contains(&s.snapshot_id()))
        .map(|s| s.snapshot_id())
        .collect();
    expire.sort();
    expire
}

impl TableOperation for Expiry<'_> {
    fn name(&self) -> &'static str {
        "expire-snapshots"
    }

    async fn plan(&self, table: &LoadedTable) -> LakeResult<Option<PreparedCommit>> {
        let expire = plan_expiry(&table.metadata, self.settings);
        if expire.is_empty() {
            return Ok(None);
        }
        let head = table
            .metadata
            .snapshot_for_ref("main")
            .map(|s| s.snapshot_id());
        if let Ok(mut last) = self.last_plan.lock() {
            *last = Some((table.metadata.clone(), expire.clone()));
        }
        Ok(Some(PreparedCommit {
            commit: TableCommit {
                ident: table.ident.clone(),
                requirements: vec![
                    TableRequirement::UuidMatch {
                        uuid: table.metadata.uuid(),
                    },
                    TableRequirement::RefSnapshotIdMatch {
                        r#ref: "main".into(),
                        snapshot_id: head,
                    },
                ],
                updates: vec![TableUpdate::RemoveSnapshots {
                    snapshot_ids: expire,
                }],
            },
            written: Vec::new(),
            snapshot_id: None,
        }))
    }
}

/// Every file `snapshots` reference: manifest lists, manifests, data and delete files.
pub(crate) async fn referenced_files(
    table: &LoadedTable,
    metadata: &TableMetadata,
    snapshots: impl Iterator<Item = i64>,
) -> LakeResult<HashSet<String>> {
    let mut files = HashSet::new();
    let mut manifests_read = HashSet::new();
    for id in snapshots {
        let Some(snapshot) = metadata.snapshot_by_id(id) else {
            continue;
        };
        files.insert(snapshot.manifest_list().to_string());
        let bytes = table.io.new_input(snapshot.manifest_list())?.read().await?;
        for manifest in
            ManifestList::parse_with_version(&bytes, metadata.format_version())?.entries()
        {
            if !manifests_read.insert(manifest.manifest_path.clone()) {
                continue;
            }
            files.insert(manifest.manifest_path.clone());
            for entry in manifest.load_manifest(&table.io).await?.entries() {
                files.insert(entry.file_path().to_string());
            }
        }
    }
    Ok(files)
}

/// Expires snapshots of `ident` and deletes the files only they referenced.
pub async fn expire_snapshots(
    client: &CatalogClient,
    ident: &iceberg::TableIdent,
    settings: &ExpireSnapshots,
    policy: &RetryPolicy,
) -> LakeResult<ExpiryReport> {
    let expiry = Expiry {
        settings,
        last_plan: Mutex::new(None),
    };
    commit_operation(client, ident, &expiry, policy).await?;
    let Some((before, expired)) = expiry.last_plan.into_inner().ok().flatten() else {
        return Ok(ExpiryReport::default());
    };
    let now = client.load_table(ident).await?;
    if expired
        .iter()
        .any(|id| now.metadata.snapshot_by_id(*id).is_some())
    {
        // The expiry did not land (the last attempt failed to plan); nothing to collect.
        return Ok(ExpiryReport::default());
    }
    let live_ids: Vec<i64> = now.metadata.snapshots().map(|s| s.snapshot_id()).collect();
    let live = referenced_files(&now, &now.metadata, live_ids.into_iter()).await?;
    let gone = referenced_files(&now, &before, expired.iter().copied()).await?;
    let mut deleted = Vec::new();
    for path in gone.into_iter().filter(|p| !live.contains(p)) {
        now.io.delete(&path).await?;
        deleted.push(path);
    }
    deleted.sort();
    tracing::info!(table = %ident, expired = expired.len(), deleted = deleted.len(), "expired snapshots");
    Ok(ExpiryReport {
        expired,
        deleted_files: deleted,
    })
}
