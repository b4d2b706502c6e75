//! Building a new snapshot by hand from iceberg's public manifest writers: the route around
//! iceberg-rust 0.10's fast-append-only transaction API.
//!
//! [`prepare_row_delta`] turns a [`Delta`] — new data files and new delete files (position and
//! equality) — into one snapshot on `main`:
//!
//! * new data files go in one new data manifest, new delete files in one new delete manifest;
//!   their entries **inherit** the snapshot's sequence number from the manifest list, so data
//!   and the deletes committed with it share one sequence number. That is what makes an upsert
//!   work: an equality delete applies to data with a *smaller* sequence number (the old row), a
//!   position delete to data with a smaller *or equal* one (a row written in the same commit);
//! * every manifest of the base snapshot is carried over unchanged;
//! * the commit asserts the table UUID and that `main` still points at the base snapshot, so a
//!   concurrent writer turns it into a 409 and the caller re-plans from a fresh load.
//!
//! A delta may also carry **first** data files: they go in a snapshot of their own, committed
//! just before the delta's in the same request (both land or neither), so the delta's equality
//! deletes — a snapshot later — reach their rows. That is how rows copied from a database and
//! changed again before the checkpoint are committed without holding them until then.
//!
//! Only the table's default partition spec is accepted for new files.

use std::collections::HashMap;

use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, FormatVersion, ManifestEntry, ManifestFile,
    ManifestList, ManifestListWriter, ManifestWriter, ManifestWriterBuilder, Operation,
    PartitionSpec, Snapshot, SnapshotReference, SnapshotRetention, Summary,
};
use iceberg::{TableRequirement, TableUpdate};

use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::rest::{LoadedTable, TableCommit};

/// What one commit adds to one table.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    /// New data files.
    pub data_files: Vec<DataFile>,
    /// New position-delete and equality-delete files.
    pub delete_files: Vec<DataFile>,
    /// Extra snapshot-summary properties (commit markers).
    pub properties: HashMap<String, String>,
    /// Remove every file the table holds before adding these (a SQL `TRUNCATE`).
    pub truncate: bool,
    /// Data files committed first, in a snapshot of their own (after the truncate, if any),
    /// so that this delta's equality deletes apply to them: an equality delete reaches only
    /// data of a smaller sequence number. With no delete files they join `data_files`.
    pub first_data_files: Vec<DataFile>,
}

/// A snapshot whose files are written and whose commit is ready to send.
#[derive(Debug, Clone)]
pub struct PreparedSnapshot {
    /// The requirements and updates to send.
    pub commit: TableCommit,
    /// The new snapshot's id.
    pub snapshot_id: i64,
    /// Files this preparation wrote (manifests, manifest list); delete them if the commit
    /// definitely failed.
    pub written: Vec<String>,
}

/// A v2 manifest writer for `snapshot_id` at `path`, of delete files or of data files.
pub(crate) fn manifest_writer(
    table: &LoadedTable,
    path: &str,
    snapshot_id: i64,
    spec: &PartitionSpec,
    deletes: bool,
) -> LakeResult<ManifestWriter> {
    let builder = ManifestWriterBuilder::new(
        table.io.new_output(path)?,
        Some(snapshot_id),
        table.metadata.current_schema().clone(),
        spec.clone(),
    );
    Ok(if deletes {
        builder.build_v2_deletes()
    } else {
        builder.build_v2_data()
    })
}

/// `file` as Iceberg Java writes it into a manifest of partition spec `spec_id`: a data or
/// equality-delete file without a sort order gets 0, the unsorted order. iceberg-rust's
/// writers leave it null, and Trino 476's `$entries` and `$all_entries` tables fail on a null
/// one (NullPointerException). Position deletes keep null, as the spec asks: they are sorted
/// by file and position, not by a table order.
pub(crate) fn with_sort_order(file: &DataFile, spec_id: i32) -> DataFile {
    if file.sort_order_id().is_some() || file.content_type() == DataContentType::PositionDeletes {
        return file.clone();
    }
    DataFileBuilder::default()
        .content(file.content_type())
        .file_path(file.file_path().to_string())
        .file_format(file.file_format())
        .partition(file.partition().clone())
        .record_count(file.record_count())
        .file_size_in_bytes(file.file_size_in_bytes())
        .column_sizes(file.column_sizes().clone())
        .value_counts(file.value_counts().clone())
        .null_value_counts(file.null_value_counts().clone())
        .nan_value_counts(file.nan_value_counts().clone())
        .lower_bounds(file.lower_bounds().clone())
        .upper_bounds(file.upper_bounds().clone())
        .key_metadata(file.key_metadata().map(<[u8]>::to_vec))
        .split_offsets(file.split_offsets().map(<[i64]>::to_vec))
        .equality_ids(file.equality_ids())
        .sort_order_id(0)
        .first_row_id(file.first_row_id())
        .partition_spec_id(spec_id)
        .referenced_data_file(file.referenced_data_file())
        .content_offset(file.content_offset())
        .content_size_in_bytes(file.content_size_in_bytes())
        .build()
        .expect("every field of a data file is set")
}

/// Carries a live entry into a rewritten manifest of partition spec `spec_id` with its
/// snapshot id and sequence numbers, as EXISTING — or as DELETED when `remove` (the file
/// leaves the table in this snapshot). Its sort order becomes 0 if it had none
/// ([`with_sort_order`]).
pub(crate) fn carry_entry(
    writer: &mut ManifestWriter,
    entry: &ManifestEntry,
    spec_id: i32,
    remove: bool,
) -> LakeResult<()> {
    let (Some(seq), Some(snapshot)) = (entry.sequence_number(), entry.snapshot_id()) else {
        return Err(LakeError::new(
            ErrorKind::Invalid,
            format!(
                "manifest entry {} has no sequence number",
                entry.file_path()
            ),
        ));
    };
    let file_seq = entry.file_sequence_number.or(Some(seq));
    let file = with_sort_order(entry.data_file(), spec_id);
    if remove {
        writer.add_delete_file(file, seq, file_seq)?;
    } else {
        writer.add_existing_file(file, snapshot, seq, file_seq)?;
    }
    Ok(())
}

/// Refuses data files passed as deletes and delete files passed as data.
pub(crate) fn check_contents(
    what: &str,
    data: &[&[DataFile]],
    deletes: &[&[DataFile]],
) -> LakeResult<()> {
    let misplaced = data
        .iter()
        .flat_map(|files| files.iter())
        .any(|f| f.content_type() != DataContentType::Data)
        || deletes
            .iter()
            .flat_map(|files| files.iter())
            .any(|f| f.content_type() == DataContentType::Data);
    if misplaced {
        return Err(LakeError::new(
            ErrorKind::Invalid,
            format!("data files and delete files were mixed up in a {what}"),
        ));
    }
    Ok(())
}

/// Whether the manifest list says `manifest` holds only DELETED entries.
fn holds_no_live_file(manifest: &ManifestFile) -> bool {
    manifest.added_files_count == Some(0) && manifest.existing_files_count == Some(0)
}

/// Reads the manifests of the current snapshot of `main` (none for an empty table).
pub async fn current_manifests(table: &LoadedTable) -> LakeResult<Vec<ManifestFile>> {
    let Some(snapshot) = table.metadata.snapshot_for_ref("main") else {
        return Ok(Vec::new());
    };
    let bytes = table.io.new_input(snapshot.manifest_list())?.read().await?;
    let list = ManifestList::parse_with_version(&bytes, table.metadata.format_version())?;
    Ok(list.entries().to_vec())
}

pub(crate) fn fresh_snapshot_id(table: &LoadedTable) -> i64 {
    loop {
        let id = rand::random_range(1..i64::MAX);
        if table.metadata.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// What a snapshot adds to or removes from a table, file by file: the `total-*` summary
/// properties move by these.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FileCounts {
    data_files: u64,
    records: u64,
    delete_files: u64,
    position_deletes: u64,
    equality_deletes: u64,
    files_size: u64,
}

impl FileCounts {
    /// The counts of `files`.
    pub(crate) fn of<'a>(files: impl IntoIterator<Item = &'a DataFile>) -> Self {
        let mut counts = Self::default();
        for file in files {
            counts.add(file);
        }
        counts
    }

    /// Counts one more file.
    pub(crate) fn add(&mut self, file: &DataFile) {
        let rows = file.record_count();
        match file.content_type() {
            DataContentType::Data => {
                self.data_files += 1;
                self.records += rows;
            }
            DataContentType::PositionDeletes => {
                self.delete_files += 1;
                self.position_deletes += rows;
            }
            DataContentType::EqualityDeletes => {
                self.delete_files += 1;
                self.equality_deletes += rows;
            }
        }
        self.files_size += file.file_size_in_bytes();
    }

    fn by_key(&self) -> [(&'static str, u64); 6] {
        [
            ("total-data-files", self.data_files),
            ("total-records", self.records),
            ("total-delete-files", self.delete_files),
            ("total-position-deletes", self.position_deletes),
            ("total-equality-deletes", self.equality_deletes),
            ("total-files-size", self.files_size),
        ]
    }
}

/// What a snapshot does to the table's live files, for its `total-*` summary properties.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Change {
    pub(crate) added: FileCounts,
    pub(crate) removed: FileCounts,
}

/// The `total-*` properties of a snapshot making `change` on top of `parent`, as Iceberg Java
/// keeps them: the parent's totals moved by what was added and removed; on an empty table
/// (no parent) what was added; a total the parent does not carry (an older writer left it
/// out) stays unknown, and is left out again.
fn totals(parent: Option<&Snapshot>, change: &Change) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let (added, removed) = (change.added.by_key(), change.removed.by_key());
    for ((key, plus), (_, minus)) in added.into_iter().zip(removed) {
        let base = match parent {
            None => Some(0),
            Some(p) => p
                .summary()
                .additional_properties
                .get(key)
                .and_then(|v| v.parse::<u64>().ok()),
        };
        if let Some(base) = base {
            out.insert(
                key.to_string(),
                (base + plus).saturating_sub(minus).to_string(),
            );
        }
    }
    out
}

/// Summary counters in the form Java and PyIceberg write them.
fn counters(delta: &Delta) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut put = |key: &str, value: u64| {
        if value > 0 {
            out.insert(key.to_string(), value.to_string());
        }
    };
    let data_records: u64 = delta.data_files.iter().map(DataFile::record_count).sum();
    let bytes: u64 = delta
        .data_files
        .iter()
        .chain(&delta.delete_files)
        .map(DataFile::file_size_in_bytes)
        .sum();
    let (mut pos, mut eq) = (0u64, 0u64);
    for f in &delta.delete_files {
        match f.content_type() {
            DataContentType::PositionDeletes => pos += f.record_count(),
            _ => eq += f.record_count(),
        }
    }
    put("added-data-files", delta.data_files.len() as u64);
    put("added-records", data_records);
    put("added-delete-files", delta.delete_files.len() as u64);
    put("added-position-deletes", pos);
    put("added-equality-deletes", eq);
    put("added-files-size", bytes);
    out
}

/// Writes the manifests and manifest list of a snapshot that adds `delta` on top of the
/// table's current `main` — two snapshots when the delta has first data files and deletes that
/// must reach them — and returns the commit to send.
pub async fn prepare_row_delta(table: &LoadedTable, delta: &Delta) -> LakeResult<PreparedSnapshot> {
    if delta.first_data_files.is_empty() {
        return prepare_snapshot(table, delta).await;
    }
    if delta.delete_files.is_empty() {
        // Nothing in the delta deletes: one snapshot holds them all.
        let mut merged = delta.clone();
        let mut data_files = std::mem::take(&mut merged.first_data_files);
        data_files.append(&mut merged.data_files);
        merged.data_files = data_files;
        return prepare_snapshot(table, &merged).await;
    }
    let first = Delta {
        data_files: delta.first_data_files.clone(),
        truncate: delta.truncate,
        ..Delta::default()
    };
    let first = prepare_snapshot(table, &first).await?;
    let rest = Delta {
        first_data_files: Vec::new(),
        truncate: false,
        ..delta.clone()
    };
    let second = match with_updates(table, &first.commit.updates) {
        Ok(after) => prepare_snapshot(&after, &rest).await,
        Err(e) => Err(e),
    };
    let second = match second {
        Ok(second) => second,
        Err(e) => {
            for path in &first.written {
                let _ = table.io.delete(path).await;
            }
            return Err(e);
        }
    };
    let PreparedSnapshot {
        commit: mut combined,
        mut written,
        ..
    } = first;
    combined.updates.extend(second.commit.updates);
    written.extend(second.written);
    Ok(PreparedSnapshot {
        commit: combined,
        snapshot_id: second.snapshot_id,
        written,
    })
}

/// `table` as it will be once `updates` are applied (for planning a second snapshot on a
/// first one of the same commit).
fn with_updates(table: &LoadedTable, updates: &[TableUpdate]) -> LakeResult<LoadedTable> {
    let mut builder = table
        .metadata
        .clone()
        .into_builder(table.metadata_location.clone());
    for update in updates {
        builder = update.clone().apply(builder)?;
    }
    Ok(LoadedTable {
        metadata: builder.build()?.metadata,
        ..table.clone()
    })
}

/// One snapshot adding `delta` (its first data files excepted) on top of `table`'s `main`.
async fn prepare_snapshot(table: &LoadedTable, delta: &Delta) -> LakeResult<PreparedSnapshot> {
    let metadata = &table.metadata;
    if metadata.format_version() != FormatVersion::V2 {
        return Err(LakeError::new(
            ErrorKind::Invalid,
            format!(
                "table {} is format version {:?}; floe-lake writes v2 tables",
                table.ident,
                metadata.format_version()
            ),
        ));
    }
    // iceberg 0.10 does not expose a file's spec id; files must come from writers built for the
    // table's default spec (this crate's writers are).
    let spec = metadata.default_partition_spec();
    check_contents("delta", &[&delta.data_files], &[&delta.delete_files])?;

    let snapshot_id = fresh_snapshot_id(table);
    let sequence_number = metadata.next_sequence_number();
    let metadata_dir = format!("{}/metadata", metadata.location().trim_end_matches('/'));
    let commit_uuid = uuid::Uuid::new_v4();
    let mut written = Vec::new();
    let mut manifests = Vec::new();

    for (index, (files, deletes)) in [(&delta.data_files, false), (&delta.delete_files, true)]
        .into_iter()
        .enumerate()
    {
        if files.is_empty() {
            continue;
        }
        let path = format!("{metadata_dir}/{commit_uuid}-m{index}.avro");
        let mut writer = manifest_writer(table, &path, snapshot_id, spec, deletes)?;
        for file in files {
            // A negative sequence number leaves it unassigned: the entry inherits the
            // snapshot's from the manifest list.
            writer.add_file(with_sort_order(file, spec.spec_id()), -1)?;
        }
        written.push(path);
        manifests.push(writer.write_manifest_file().await?);
    }
    // A manifest with no live file (every entry DELETED, e.g. by a compaction) has nothing
    // for later snapshots: readers would only skip its entries.
    let base = current_manifests(table)
        .await?
        .into_iter()
        .filter(|m| !holds_no_live_file(m));
    let mut removed = FileCounts::default();
    if delta.truncate {
        // Every live file of the base leaves the table: each manifest is rewritten with its
        // live entries marked DELETED (later snapshots drop the manifest).
        for (index, manifest) in base.enumerate() {
            let spec = metadata
                .partition_spec_by_id(manifest.partition_spec_id)
                .ok_or_else(|| {
                    LakeError::new(
                        ErrorKind::Invalid,
                        format!(
                            "{} has no partition spec {}",
                            table.ident, manifest.partition_spec_id
                        ),
                    )
                })?;
            let deletes = manifest.content == iceberg::spec::ManifestContentType::Deletes;
            let path = format!("{metadata_dir}/{commit_uuid}-t{index}.avro");
            let mut writer = manifest_writer(table, &path, snapshot_id, spec, deletes)?;
            for entry in manifest.load_manifest(&table.io).await?.entries() {
                if entry.is_alive() {
                    removed.add(entry.data_file());
                    carry_entry(&mut writer, entry, spec.spec_id(), true)?;
                }
            }
            written.push(path);
            manifests.push(writer.write_manifest_file().await?);
        }
    } else {
        manifests.extend(base);
    }

    let operation = match (delta.data_files.is_empty(), delta.delete_files.is_empty()) {
        _ if delta.truncate => Operation::Overwrite,
        (_, true) => Operation::Append,
        (true, false) => Operation::Delete,
        (false, false) => Operation::Overwrite,
    };
    let mut properties = counters(delta);
    properties.extend(delta.properties.clone());
    let change = Change {
        added: FileCounts::of(delta.data_files.iter().chain(&delta.delete_files)),
        removed,
    };
    finish(
        table,
        Planned {
            snapshot_id,
            sequence_number,
            commit_uuid,
            manifests,
            written,
        },
        operation,
        properties,
        &change,
    )
    .await
}

/// A snapshot whose manifests are written; what is left is the manifest list and the commit.
pub(crate) struct Planned {
    pub(crate) snapshot_id: i64,
    pub(crate) sequence_number: i64,
    pub(crate) commit_uuid: uuid::Uuid,
    pub(crate) manifests: Vec<ManifestFile>,
    pub(crate) written: Vec<String>,
}

/// Writes the manifest list and builds the commit: `main` moves from its current head to the
/// new snapshot, asserting the table UUID and that head. The summary gets `properties` and the
/// `total-*` counts after `change`.
pub(crate) async fn finish(
    table: &LoadedTable,
    planned: Planned,
    operation: Operation,
    mut properties: HashMap<String, String>,
    change: &Change,
) -> LakeResult<PreparedSnapshot> {
    let metadata = &table.metadata;
    let Planned {
        snapshot_id,
        sequence_number,
        commit_uuid,
        manifests,
        mut written,
    } = planned;
    let head = metadata.snapshot_for_ref("main");
    properties.extend(totals(head.map(|s| s.as_ref()), change));
    let parent = head.map(|s| s.snapshot_id());
    let metadata_dir = format!("{}/metadata", metadata.location().trim_end_matches('/'));
    let list_path = format!("{metadata_dir}/snap-{snapshot_id}-1-{commit_uuid}.avro");
    let mut list = ManifestListWriter::v2(
        table.io.new_output(&list_path)?.writer().await?,
        snapshot_id,
        parent,
        sequence_number,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await?;
    written.push(list_path.clone());
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(now_ms())
        .with_manifest_list(list_path)
        .with_summary(Summary {
            operation,
            additional_properties: properties,
        })
        .with_schema_id(metadata.current_schema_id())
        .build();
    let commit = TableCommit {
        ident: table.ident.clone(),
        requirements: vec![
            TableRequirement::UuidMatch {
                uuid: metadata.uuid(),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: "main".to_string(),
                snapshot_id: parent,
            },
        ],
        updates: vec![
            TableUpdate::AddSnapshot { snapshot },
            TableUpdate::SetSnapshotRef {
                ref_name: "main".to_string(),
                reference: SnapshotReference::new(
                    snapshot_id,
                    SnapshotRetention::Branch {
                        min_snapshots_to_keep: None,
                        max_snapshot_age_ms: None,
                        max_ref_age_ms: None,
                    },
                ),
            },
        ],
    };
    Ok(PreparedSnapshot {
        commit,
        snapshot_id,
        written,
    })
}
