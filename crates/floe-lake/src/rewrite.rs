//! RewriteFiles: replace data files (and the delete files that applied only to them) with new
//! files holding the same rows with those deletes applied — the commit behind compaction —
//! without ever bringing a deleted row back.
//!
//! The rules that keep rows deleted:
//! * the new files take the **starting snapshot's sequence number** as their data sequence
//!   number, so every equality delete committed after the rewrite began (a higher sequence
//!   number) still applies to them, and deletes the rewrite already applied (lower or equal)
//!   do not apply twice;
//! * the commit is **validated** against everything committed since the starting snapshot:
//!   it fails with [`ErrorKind::Conflict`] if a file it replaces is gone (another rewrite) or
//!   if a position delete that may target a replaced file was added (its positions would not
//!   carry over to the new files). The caller then plans afresh;
//! * committed through [`crate::commit::commit_operation`]: a 409 re-validates and retries on
//!   the new head; an unknown outcome looks for the rewrite's id in the ancestry first.

use std::collections::{HashMap, HashSet};

use iceberg::spec::{DataContentType, DataFile, ManifestContentType, Operation};

use crate::commit::{PreparedCommit, TableOperation};
use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::rest::LoadedTable;
use crate::snapshot::{
    Change, FileCounts, Planned, PreparedSnapshot, carry_entry, check_contents, current_manifests,
    finish, fresh_snapshot_id, manifest_writer, with_sort_order,
};

/// Summary key carrying a rewrite's unique id (found again after an unknown outcome).
pub const REWRITE_ID: &str = "floe.rewrite-id";

/// A replacement of files planned on one snapshot.
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// Unique id of this rewrite (recorded in the snapshot summary).
    pub id: uuid::Uuid,
    /// The snapshot the plan read.
    pub starting_snapshot_id: i64,
    /// Data files replaced by `added_data_files`.
    pub removed_data_files: Vec<DataFile>,
    /// Delete files that applied only to removed data files (already applied in the output).
    pub removed_delete_files: Vec<DataFile>,
    /// The new data files.
    pub added_data_files: Vec<DataFile>,
    /// Extra summary properties.
    pub properties: HashMap<String, String>,
}

fn conflict(table: &LoadedTable, what: String) -> LakeError {
    LakeError::new(
        ErrorKind::Conflict,
        format!(
            "rewrite of {} is no longer valid: {what}; plan it again",
            table.ident
        ),
    )
}

/// Checks the rewrite against the table's current head and writes its snapshot.
pub async fn prepare_rewrite(
    table: &LoadedTable,
    rewrite: &Rewrite,
) -> LakeResult<PreparedSnapshot> {
    let metadata = &table.metadata;
    let start = metadata
        .snapshot_by_id(rewrite.starting_snapshot_id)
        .ok_or_else(|| {
            conflict(
                table,
                format!("starting snapshot {} is gone", rewrite.starting_snapshot_id),
            )
        })?;
    let start_sequence = start.sequence_number();
    check_contents(
        "rewrite",
        &[&rewrite.added_data_files, &rewrite.removed_data_files],
        &[&rewrite.removed_delete_files],
    )?;
    let removed: HashSet<&str> = rewrite
        .removed_data_files
        .iter()
        .chain(&rewrite.removed_delete_files)
        .map(DataFile::file_path)
        .collect();
    let removed_partitions: Vec<&iceberg::spec::Struct> = rewrite
        .removed_data_files
        .iter()
        .map(DataFile::partition)
        .collect();
    let removed_data: HashSet<&str> = rewrite
        .removed_data_files
        .iter()
        .map(DataFile::file_path)
        .collect();

    let snapshot_id = fresh_snapshot_id(table);
    let sequence_number = metadata.next_sequence_number();
    let commit_uuid = uuid::Uuid::new_v4();
    let metadata_dir = format!("{}/metadata", metadata.location().trim_end_matches('/'));
    let mut manifests = Vec::new();
    let mut written = Vec::new();
    let mut found: HashSet<String> = HashSet::new();

    for (index, manifest) in current_manifests(table).await?.into_iter().enumerate() {
        let loaded = manifest.load_manifest(&table.io).await?;
        let entries = loaded.entries();
        for entry in entries.iter().filter(|e| e.is_alive()) {
            if removed.contains(entry.file_path()) {
                found.insert(entry.file_path().to_string());
            }
            // A position delete added after the start may target a replaced file.
            let newer = entry.sequence_number().is_some_and(|s| s > start_sequence);
            if newer && entry.content_type() == DataContentType::PositionDeletes {
                let file = entry.data_file();
                let may_target = match file.referenced_data_file() {
                    Some(target) => removed_data.contains(target.as_str()),
                    None => removed_partitions.contains(&file.partition()),
                };
                if may_target {
                    return Err(conflict(
                        table,
                        format!(
                            "position deletes {} were committed against files it replaces",
                            file.file_path()
                        ),
                    ));
                }
            }
        }
        if !entries
            .iter()
            .any(|e| e.is_alive() && removed.contains(e.file_path()))
        {
            manifests.push(manifest);
            continue;
        }
        // Rewrite this manifest: replaced files become DELETED, the rest stay EXISTING.
        let spec = metadata
            .partition_spec_by_id(manifest.partition_spec_id)
            .ok_or_else(|| {
                LakeError::new(
                    ErrorKind::Invalid,
                    format!("unknown partition spec {}", manifest.partition_spec_id),
                )
            })?;
        let path = format!("{metadata_dir}/{commit_uuid}-r{index}.avro");
        let deletes = manifest.content == ManifestContentType::Deletes;
        let mut writer = manifest_writer(table, &path, snapshot_id, spec, deletes)?;
        for entry in entries.iter().filter(|e| e.is_alive()) {
            carry_entry(
                &mut writer,
                entry,
                spec.spec_id(),
                removed.contains(entry.file_path()),
            )?;
        }
        written.push(path);
        manifests.push(writer.write_manifest_file().await?);
    }
    if let Some(missing) = removed.iter().find(|p| !found.contains(**p)) {
        return Err(conflict(
            table,
            format!("{missing} is no longer in the table"),
        ));
    }
    if !rewrite.added_data_files.is_empty() {
        let path = format!("{metadata_dir}/{commit_uuid}-m0.avro");
        let spec = metadata.default_partition_spec();
        let mut writer = manifest_writer(table, &path, snapshot_id, spec, false)?;
        for file in &rewrite.added_data_files {
            // The starting snapshot's sequence number: later deletes still apply.
            writer.add_file(with_sort_order(file, spec.spec_id()), start_sequence)?;
        }
        written.push(path);
        manifests.insert(0, writer.write_manifest_file().await?);
    }

    let mut properties = rewrite.properties.clone();
    properties.insert(REWRITE_ID.to_string(), rewrite.id.to_string());
    let count = |files: &[DataFile]| files.len().to_string();
    let records = |files: &[DataFile]| {
        files
            .iter()
            .map(DataFile::record_count)
            .sum::<u64>()
            .to_string()
    };
    properties.insert("added-data-files".into(), count(&rewrite.added_data_files));
    properties.insert("added-records".into(), records(&rewrite.added_data_files));
    properties.insert(
        "deleted-data-files".into(),
        count(&rewrite.removed_data_files),
    );
    properties.insert(
        "deleted-records".into(),
        records(&rewrite.removed_data_files),
    );
    properties.insert(
        "removed-delete-files".into(),
        count(&rewrite.removed_delete_files),
    );
    finish(
        table,
        Planned {
            snapshot_id,
            sequence_number,
            commit_uuid,
            manifests,
            written,
        },
        Operation::Replace,
        properties,
        &Change {
            added: FileCounts::of(&rewrite.added_data_files),
            removed: FileCounts::of(
                rewrite
                    .removed_data_files
                    .iter()
                    .chain(&rewrite.removed_delete_files),
            ),
        },
    )
    .await
}

impl TableOperation for Rewrite {
    fn name(&self) -> &'static str {
        "rewrite"
    }

    async fn plan(&self, table: &LoadedTable) -> LakeResult<Option<PreparedCommit>> {
        prepare_rewrite(table, self).await.map(|p| Some(p.into()))
    }

    fn landed(&self, table: &LoadedTable) -> Option<i64> {
        let mut next = table
            .metadata
            .snapshot_for_ref("main")
            .map(|s| s.snapshot_id());
        let id = self.id.to_string();
        while let Some(snapshot_id) = next {
            let snapshot = table.metadata.snapshot_by_id(snapshot_id)?;
            if snapshot.summary().additional_properties.get(REWRITE_ID) == Some(&id) {
                return Some(snapshot_id);
            }
            if snapshot_id == self.starting_snapshot_id {
                return None;
            }
            next = snapshot.parent_snapshot_id();
        }
        None
    }
}
