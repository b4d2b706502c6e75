//! Commit markers: the `floe.*` snapshot-summary properties that tie a snapshot to the job and
//! checkpoint that produced it, with the source positions it covers — and the lookup that finds
//! a job's newest marker again after a crash.
//!
//! The lookup walks `main`'s ancestry from the current snapshot, so snapshots added in between
//! by other writers or by the compactor (which carry no marker of this job) are skipped over.
//! It never trusts the current snapshot alone.
//!
//! **Checkpoint tags.** Each checkpoint also moves a tag, [`checkpoint_tag`], to the snapshot
//! it commits, in the same commit. Other engines' expiry keeps tagged snapshots: without the
//! tag, Spark's `rewrite_data_files` followed by `expire_snapshots(retain_last => 1)` removes
//! the snapshot with the job's newest marker, and the job would start over as if it had never
//! run. When `main`'s ancestry no longer reaches that marker, the lookup takes the tag's
//! snapshot — unless `main` was rolled back below it.

use std::collections::{BTreeMap, HashMap};

use iceberg::spec::{SnapshotRef, TableMetadata};

/// Summary key holding the job id.
pub const JOB_ID: &str = "floe.job-id";
/// Summary key holding the checkpoint id (decimal).
pub const CHECKPOINT_ID: &str = "floe.checkpoint-id";
/// Summary key holding the source positions, a JSON object of strings.
pub const POSITIONS: &str = "floe.positions";
/// Summary key holding the writer (one process of the job) that committed, when the job runs
/// as several replicas.
pub const WRITER: &str = "floe.writer";
/// Summary key holding the job's stateful operators and their state fingerprints, a JSON
/// object (absent when the job has none).
pub const OPERATORS: &str = "floe.operators";
/// Summary key holding the streams the job lands and the table each lands in, a JSON object
/// (absent in markers written before it existed): what a job file must not silently change.
pub const STREAMS: &str = "floe.streams";

/// Infix of a mirror's position entry, `<partition>#sink:<id>`, valued
/// `<table uuid>:<sequence>`: the newest snapshot of that table the mirror delivered. Expiry
/// keeps every later snapshot of the table (see [`crate::expire`]).
pub const MIRRORED: &str = "#sink:";

/// Prefix of the checkpoint tags.
pub const CHECKPOINT_TAG: &str = "floe-checkpoint.";

/// The tag that names the snapshot of `job_id`'s newest checkpoint (by `writer`, for a job of
/// replicas) in each table it commits to.
pub fn checkpoint_tag(job_id: &str, writer: Option<&str>) -> String {
    match writer {
        Some(writer) => format!("{CHECKPOINT_TAG}{job_id}.{writer}"),
        None => format!("{CHECKPOINT_TAG}{job_id}"),
    }
}

/// Every ref of a table but `main`, with the snapshot it names (iceberg 0.10 exposes refs only
/// through the serialized metadata).
pub fn other_refs(metadata: &TableMetadata) -> Vec<(String, i64)> {
    let json = serde_json::to_value(metadata).unwrap_or_default();
    json["refs"]
        .as_object()
        .map(|refs| {
            refs.iter()
                .filter(|(name, _)| name.as_str() != "main")
                .filter_map(|(name, r)| Some((name.clone(), r["snapshot-id"].as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// A mirror's position entry value.
pub fn mirrored_value(table_uuid: &str, sequence: i64) -> String {
    format!("{table_uuid}:{sequence}")
}

/// A mirror's position entry value read back: the table's UUID and the sequence delivered
/// (`None`: not such a value).
pub fn parse_mirrored(value: &str) -> Option<(&str, i64)> {
    let (uuid, sequence) = value.rsplit_once(':')?;
    Some((uuid, sequence.parse().ok()?))
}

/// The smallest sequence `positions` say a mirror of table `table_uuid` delivered (`None`:
/// no mirror of it).
pub fn mirrored_through(positions: &BTreeMap<String, String>, table_uuid: &str) -> Option<i64> {
    positions
        .iter()
        .filter(|(key, _)| key.contains(MIRRORED))
        .filter_map(|(_, value)| parse_mirrored(value))
        .filter(|(uuid, _)| *uuid == table_uuid)
        .map(|(_, sequence)| sequence)
        .min()
}

/// What a committed checkpoint records in each snapshot it produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitMarker {
    /// The job's stable id.
    pub job_id: String,
    /// The process of the job that commits (replicas of one job differ here); checkpoint ids
    /// increase per writer.
    pub writer: Option<String>,
    /// The checkpoint, increasing per job (per writer when there is one).
    pub checkpoint_id: u64,
    /// Source positions after this checkpoint, e.g. `"otlp_spans/0" -> "1234"` (and entries
    /// of a partition such as its watermarks, `"otlp_spans/0#wm:rollup"`).
    pub positions: BTreeMap<String, String>,
    /// The stateful operators whose state the job's state table holds as of this checkpoint:
    /// id → fingerprint of what the state depends on.
    pub operators: BTreeMap<String, String>,
    /// Every stream the job has landed and its table's name (`"shop.orders" -> "shop_orders"`),
    /// kept across checkpoints: a stream that moves to another table, or leaves the job, is a
    /// deliberate act (`floe run --rename-table` / `--stop-following`).
    pub streams: BTreeMap<String, String>,
}

/// A marker found in a table's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundMarker {
    /// The marker.
    pub marker: CommitMarker,
    /// The snapshot that carries it.
    pub snapshot_id: i64,
}

impl CommitMarker {
    /// The summary properties that encode this marker.
    pub fn to_properties(&self) -> HashMap<String, String> {
        let mut properties = HashMap::from([
            (JOB_ID.to_string(), self.job_id.clone()),
            (CHECKPOINT_ID.to_string(), self.checkpoint_id.to_string()),
            (
                POSITIONS.to_string(),
                serde_json::to_string(&self.positions).unwrap_or_else(|_| "{}".into()),
            ),
        ]);
        if let Some(writer) = &self.writer {
            properties.insert(WRITER.to_string(), writer.clone());
        }
        if !self.operators.is_empty() {
            properties.insert(
                OPERATORS.to_string(),
                serde_json::to_string(&self.operators).unwrap_or_else(|_| "{}".into()),
            );
        }
        if !self.streams.is_empty() {
            properties.insert(
                STREAMS.to_string(),
                serde_json::to_string(&self.streams).unwrap_or_else(|_| "{}".into()),
            );
        }
        properties
    }

    /// Decodes a marker from summary properties; `None` if absent or malformed.
    pub fn from_properties(properties: &HashMap<String, String>) -> Option<Self> {
        Some(Self {
            job_id: properties.get(JOB_ID)?.clone(),
            writer: properties.get(WRITER).cloned(),
            checkpoint_id: properties.get(CHECKPOINT_ID)?.parse().ok()?,
            positions: serde_json::from_str(properties.get(POSITIONS)?).ok()?,
            operators: match properties.get(OPERATORS) {
                Some(text) => serde_json::from_str(text).ok()?,
                None => BTreeMap::new(),
            },
            streams: match properties.get(STREAMS) {
                Some(text) => serde_json::from_str(text).ok()?,
                None => BTreeMap::new(),
            },
        })
    }
}

/// The newest marker of `job_id` (by any writer) along `main`'s ancestry, if any.
pub fn newest_marker(metadata: &TableMetadata, job_id: &str) -> Option<FoundMarker> {
    newest_marker_of(metadata, job_id, None)
}

/// The newest marker of `job_id` along `main`'s ancestry committed by `writer` (any writer when
/// `None`).
pub fn newest_marker_of(
    metadata: &TableMetadata,
    job_id: &str,
    writer: Option<&str>,
) -> Option<FoundMarker> {
    let marker_of = |snapshot: &SnapshotRef| {
        let properties = &snapshot.summary().additional_properties;
        if properties.get(JOB_ID).map(String::as_str) != Some(job_id) {
            return None;
        }
        let marker = CommitMarker::from_properties(properties)?;
        (writer.is_none() || marker.writer.as_deref() == writer).then(|| FoundMarker {
            marker,
            snapshot_id: snapshot.snapshot_id(),
        })
    };
    // Along `main`, the first marker found is the newest. Only when `main`'s history was cut
    // above the job's last checkpoint (another engine's expiry) do its tags name it; a tag
    // newer than `main`'s head is one `main` was rolled back from, and does not count.
    main_ancestry(metadata).find_map(marker_of).or_else(|| {
        let head = metadata
            .snapshot_for_ref("main")
            .map_or(i64::MIN, |s| s.sequence_number());
        other_refs(metadata)
            .into_iter()
            .filter(|(name, _)| name.starts_with(CHECKPOINT_TAG))
            .filter_map(|(_, id)| metadata.snapshot_by_id(id))
            .filter(|snapshot| snapshot.sequence_number() <= head)
            .filter_map(|snapshot| Some((snapshot.sequence_number(), marker_of(snapshot)?)))
            .max_by_key(|(sequence, _)| *sequence)
            .map(|(_, found)| found)
    })
}

/// The snapshots of `main`'s ancestry that `job_id` committed, newest first, as
/// (snapshot id, sequence number).
pub fn job_snapshots(metadata: &TableMetadata, job_id: &str) -> Vec<(i64, i64)> {
    main_ancestry(metadata)
        .filter(|s| {
            s.summary()
                .additional_properties
                .get(JOB_ID)
                .map(String::as_str)
                == Some(job_id)
        })
        .map(|s| (s.snapshot_id(), s.sequence_number()))
        .collect()
}

/// The job whose commit is newest along `main`'s ancestry, when `job_id` never committed
/// there (`None` when it did, or when no job did).
pub fn landed_by_other_job(metadata: &TableMetadata, job_id: &str) -> Option<String> {
    let mut other = None;
    for snapshot in main_ancestry(metadata) {
        match snapshot.summary().additional_properties.get(JOB_ID) {
            Some(job) if job == job_id => return None,
            Some(job) if other.is_none() => other = Some(job.clone()),
            _ => {}
        }
    }
    other
}

/// The snapshots of `main`, newest first, down to the oldest one still in the metadata.
fn main_ancestry(metadata: &TableMetadata) -> impl Iterator<Item = &SnapshotRef> {
    let mut next = metadata.snapshot_for_ref("main").map(|s| s.snapshot_id());
    std::iter::from_fn(move || {
        let snapshot = metadata.snapshot_by_id(next?)?;
        next = snapshot.parent_snapshot_id();
        Some(snapshot)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_s_entry_reads_back_and_the_oldest_mirror_of_a_table_counts() {
        let uuid = "0b8c0a94-5d55-4b4b-9a8e-2f6c1a3f1d2e";
        assert_eq!(parse_mirrored(&mirrored_value(uuid, 17)), Some((uuid, 17)));
        assert_eq!(parse_mirrored("no sequence"), None);
        assert_eq!(parse_mirrored("uuid:x"), None);
        let positions = BTreeMap::from([
            ("t/0".to_string(), "100".to_string()),
            (format!("t/0{MIRRORED}a"), mirrored_value(uuid, 17)),
            (format!("t/0{MIRRORED}b"), mirrored_value(uuid, 12)),
            (format!("t/0{MIRRORED}c"), mirrored_value("another", 3)),
        ]);
        assert_eq!(mirrored_through(&positions, uuid), Some(12));
        assert_eq!(mirrored_through(&positions, "none"), None);
    }

    #[test]
    fn round_trips_through_properties() {
        let marker = CommitMarker {
            job_id: "otlp".into(),
            writer: Some("replica-1".into()),
            checkpoint_id: 42,
            positions: BTreeMap::from([("otlp_spans/0".into(), "100".into())]),
            operators: BTreeMap::from([("rollup".into(), "window v1".into())]),
            streams: BTreeMap::from([("shop.orders".into(), "shop_orders".into())]),
        };
        let mut props = marker.to_properties();
        assert_eq!(CommitMarker::from_properties(&props), Some(marker));
        props.insert(CHECKPOINT_ID.into(), "x".into());
        assert_eq!(CommitMarker::from_properties(&props), None);
    }

    /// Table metadata whose `main` holds snapshots 2, 3, … committed by `jobs` in turn (the
    /// marker of snapshot `n` at checkpoint `n`), on top of snapshot 1, expired (its id stays
    /// as the first one's parent).
    fn history(jobs: &[&str]) -> TableMetadata {
        use iceberg::spec::{
            NestedField, Operation, PrimitiveType, Schema, Snapshot, SnapshotReference,
            SnapshotRetention, Summary, TableMetadataBuilder, Type,
        };
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            ])
            .build()
            .unwrap();
        let creation = iceberg::TableCreation::builder()
            .name("t".into())
            .location("file:///t".into())
            .schema(schema)
            .build();
        let mut metadata = TableMetadataBuilder::from_table_creation(creation)
            .unwrap()
            .build()
            .unwrap()
            .metadata;
        let now = metadata.last_updated_ms();
        for (i, job) in jobs.iter().enumerate() {
            let id = i as i64 + 2;
            let snapshot = Snapshot::builder()
                .with_snapshot_id(id)
                .with_parent_snapshot_id(Some(id - 1))
                .with_sequence_number(id)
                .with_timestamp_ms(now + id)
                .with_manifest_list(format!("file:///t/metadata/snap-{id}.avro"))
                .with_summary(Summary {
                    operation: Operation::Append,
                    additional_properties: CommitMarker {
                        job_id: job.to_string(),
                        writer: None,
                        checkpoint_id: id as u64,
                        positions: BTreeMap::from([("p/0".into(), id.to_string())]),
                        operators: BTreeMap::new(),
                        streams: BTreeMap::new(),
                    }
                    .to_properties(),
                })
                .with_schema_id(metadata.current_schema_id())
                .build();
            metadata = TableMetadataBuilder::new_from_metadata(metadata, None)
                .add_snapshot(snapshot)
                .unwrap()
                .set_ref(
                    "main",
                    SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
                )
                .unwrap()
                .build()
                .unwrap()
                .metadata;
        }
        metadata
    }

    #[test]
    fn another_jobs_table_is_named_down_to_its_oldest_snapshot_kept() {
        assert_eq!(landed_by_other_job(&history(&[]), "new"), None);
        assert_eq!(landed_by_other_job(&history(&["new", "old"]), "new"), None);
        assert_eq!(
            landed_by_other_job(&history(&["old", "older"]), "new"),
            Some("older".to_string())
        );
    }

    /// What Spark's `rewrite_data_files` then `expire_snapshots(retain_last => 1)` leave: a
    /// new head without a marker, every older snapshot gone but the tagged ones.
    fn rewritten_and_expired(metadata: TableMetadata, tags: &[(&str, i64)]) -> TableMetadata {
        use iceberg::spec::{
            Operation, Snapshot, SnapshotReference, SnapshotRetention, Summary,
            TableMetadataBuilder,
        };
        let head = metadata.current_snapshot().unwrap().clone();
        let id = head.snapshot_id() + 1;
        let rewrite = Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(Some(head.snapshot_id()))
            .with_sequence_number(id)
            .with_timestamp_ms(head.timestamp_ms() + 1)
            .with_manifest_list(format!("file:///t/metadata/snap-{id}.avro"))
            .with_summary(Summary {
                operation: Operation::Replace,
                additional_properties: HashMap::new(),
            })
            .with_schema_id(metadata.current_schema_id())
            .build();
        let mut builder = TableMetadataBuilder::new_from_metadata(metadata.clone(), None)
            .add_snapshot(rewrite)
            .unwrap()
            .set_ref(
                "main",
                SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
            )
            .unwrap();
        for (job, snapshot) in tags {
            let retention = SnapshotRetention::Tag {
                max_ref_age_ms: None,
            };
            builder = builder
                .set_ref(
                    &checkpoint_tag(job, None),
                    SnapshotReference::new(*snapshot, retention),
                )
                .unwrap();
        }
        let expired: Vec<i64> = metadata
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| !tags.iter().any(|(_, tagged)| tagged == id))
            .collect();
        builder.remove_snapshots(&expired).build().unwrap().metadata
    }

    #[test]
    fn a_job_s_newest_marker_survives_another_engine_s_expiry_through_its_tag() {
        let checkpoint = |metadata: &TableMetadata, job| {
            newest_marker(metadata, job)
                .map(|found| (found.snapshot_id, found.marker.checkpoint_id))
        };
        let before = history(&["a", "b", "a", "b"]);
        assert_eq!(checkpoint(&before, "a"), Some((4, 4)));
        assert_eq!(checkpoint(&before, "b"), Some((5, 5)));

        // Tagged: both jobs' newest markers stay found after main's history was cut.
        let after = rewritten_and_expired(before.clone(), &[("a", 4), ("b", 5)]);
        assert_eq!(after.snapshots().count(), 3);
        assert_eq!(checkpoint(&after, "a"), Some((4, 4)));
        assert_eq!(checkpoint(&after, "b"), Some((5, 5)));
        assert_eq!(checkpoint(&after, "c"), None);

        // Rolled back below a tag, `main` is what counts.
        let rolled_back = {
            use iceberg::spec::{SnapshotReference, SnapshotRetention, TableMetadataBuilder};
            let mut metadata = history(&["a", "b", "a", "b"]);
            for (name, id, retention) in [
                ("main", 3, SnapshotRetention::branch(None, None, None)),
                (
                    &*checkpoint_tag("a", None),
                    4,
                    SnapshotRetention::Tag {
                        max_ref_age_ms: None,
                    },
                ),
            ] {
                metadata = TableMetadataBuilder::new_from_metadata(metadata, None)
                    .set_ref(name, SnapshotReference::new(id, retention))
                    .unwrap()
                    .build()
                    .unwrap()
                    .metadata;
            }
            metadata
        };
        assert_eq!(checkpoint(&rolled_back, "a"), Some((2, 2)));

        // Untagged, the marker is gone with its snapshot: what the tags are for.
        let untagged = rewritten_and_expired(before, &[]);
        assert_eq!(checkpoint(&untagged, "a"), None);
    }
}
