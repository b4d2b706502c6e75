//! RewriteManifests: merge a table's small manifests so a streaming table does not gain one
//! manifest per commit forever (planning cost grows with the manifest count).
//!
//! Manifests smaller than the target are grouped by content (data / deletes) and partition
//! spec and merged, in commit order, into manifests of about the target size; live entries are
//! carried as EXISTING with their snapshot id and sequence numbers, so no row and no delete
//! changes meaning. Entries already DELETED are dropped. The snapshot's operation is `replace`
//! and adds no data; it commits through [`crate::commit::commit_operation`] (409 → re-plan).

use std::collections::BTreeMap;

use iceberg::spec::{ManifestContentType, ManifestFile, Operation};

use crate::commit::{PreparedCommit, TableOperation};
use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::rest::LoadedTable;
use crate::snapshot::{
    Change, Planned, carry_entry, current_manifests, finish, fresh_snapshot_id, manifest_writer,
};

/// Merge manifests below `target_bytes`, when at least `min_manifests` of them exist.
#[derive(Debug, Clone)]
pub struct RewriteManifests {
    /// Manifests smaller than this are merged, into manifests of about this size.
    pub target_bytes: i64,
    /// Do nothing until this many small manifests have piled up.
    pub min_manifests: usize,
}

impl Default for RewriteManifests {
    fn default() -> Self {
        Self {
            target_bytes: 8 * 1024 * 1024,
            min_manifests: 10,
        }
    }
}

impl TableOperation for RewriteManifests {
    fn name(&self) -> &'static str {
        "rewrite-manifests"
    }

    async fn plan(&self, table: &LoadedTable) -> LakeResult<Option<PreparedCommit>> {
        let current = current_manifests(table).await?;
        let (small, mut keep): (Vec<ManifestFile>, Vec<ManifestFile>) = current
            .into_iter()
            .partition(|m| m.manifest_length < self.target_bytes);
        if small.len() < self.min_manifests.max(2) {
            return Ok(None);
        }
        let metadata = &table.metadata;
        let snapshot_id = fresh_snapshot_id(table);
        let commit_uuid = uuid::Uuid::new_v4();
        let dir = format!("{}/metadata", metadata.location().trim_end_matches('/'));
        // Groups keep commit order (the manifest list is newest first).
        let mut groups: BTreeMap<(bool, i32), Vec<ManifestFile>> = BTreeMap::new();
        for manifest in small {
            let deletes = manifest.content == ManifestContentType::Deletes;
            groups
                .entry((deletes, manifest.partition_spec_id))
                .or_default()
                .push(manifest);
        }
        let mut written = Vec::new();
        let mut merged = Vec::new();
        let mut index = 0usize;
        for ((deletes, spec_id), members) in groups {
            let spec = metadata.partition_spec_by_id(spec_id).ok_or_else(|| {
                LakeError::new(
                    ErrorKind::Invalid,
                    format!("unknown partition spec {spec_id}"),
                )
            })?;
            let mut chunk: Vec<ManifestFile> = Vec::new();
            let mut chunk_bytes = 0i64;
            let mut chunks = Vec::new();
            for manifest in members {
                if chunk_bytes + manifest.manifest_length > self.target_bytes && !chunk.is_empty() {
                    chunks.push(std::mem::take(&mut chunk));
                    chunk_bytes = 0;
                }
                chunk_bytes += manifest.manifest_length;
                chunk.push(manifest);
            }
            chunks.push(chunk);
            for chunk in chunks {
                if chunk.len() == 1 {
                    keep.extend(chunk);
                    continue;
                }
                let path = format!("{dir}/{commit_uuid}-merged{index}.avro");
                index += 1;
                let mut writer = manifest_writer(table, &path, snapshot_id, spec, deletes)?;
                for manifest in &chunk {
                    for entry in manifest.load_manifest(&table.io).await?.entries() {
                        if !entry.is_alive() {
                            continue;
                        }
                        carry_entry(&mut writer, entry, spec.spec_id(), false)?;
                    }
                }
                written.push(path);
                merged.push(writer.write_manifest_file().await?);
            }
        }
        if merged.is_empty() {
            return Ok(None);
        }
        let manifests: Vec<ManifestFile> = merged.into_iter().chain(keep).collect();
        let properties = [("manifests-created".to_string(), index.to_string())].into();
        finish(
            table,
            Planned {
                snapshot_id,
                sequence_number: metadata.next_sequence_number(),
                commit_uuid,
                manifests,
                written,
            },
            Operation::Replace,
            properties,
            // Manifests regrouped: the same live files.
            &Change::default(),
        )
        .await
        .map(|p| Some(p.into()))
    }
}
