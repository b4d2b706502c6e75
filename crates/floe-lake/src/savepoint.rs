//! Savepoints: named checkpoints of a job that are kept, and that a job can go back to.
//!
//! A savepoint is an Iceberg **tag** on every table of the job (the tables whose history
//! carries the job's markers: its outputs, its dead-letter anchor, its state table), each at
//! its head of one consistent moment — the anchor's head did not move while the heads were
//! read, and the tags commit with the anchor's head asserted. Expiry and orphan removal keep
//! what a tag reaches, so the savepoint's data and state stay readable; `SELECT … FOR
//! VERSION AS OF` with the tag reads the tables as of it.
//!
//! **Rewinding** to a savepoint moves each table's `main` back to its tag in one commit (every
//! table asserting its head), so the job resumes from the savepoint's positions and state and
//! its later output is produced again. A table that another job committed to after the
//! savepoint is refused: rewinding it would undo that job's rows too.

use std::collections::HashMap;

use iceberg::spec::{SnapshotReference, SnapshotRetention, TableMetadata};
use iceberg::{NamespaceIdent, TableIdent, TableRequirement, TableUpdate};

use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::marker::{self, CommitMarker, JOB_ID, newest_marker};
use crate::rest::{CatalogClient, LoadedTable, TableCommit};

/// The tag of savepoint `name` of `job`.
pub fn tag(job: &str, name: &str) -> String {
    format!("floe-savepoint.{job}.{name}")
}

/// A savepoint of a job.
#[derive(Debug, Clone)]
pub struct Savepoint {
    /// Its name.
    pub name: String,
    /// The anchor's snapshot it names.
    pub snapshot_id: i64,
    /// When that snapshot was committed (ms since the epoch).
    pub timestamp_ms: i64,
    /// The job's checkpoint there.
    pub marker: Option<CommitMarker>,
    /// Every table tagged, at which snapshot.
    pub tables: Vec<(TableIdent, i64)>,
}

/// Tags (and branches but `main`) of a table: name → snapshot.
fn tags(metadata: &TableMetadata) -> HashMap<String, i64> {
    marker::other_refs(metadata).into_iter().collect()
}

fn invalid(message: impl Into<String>) -> LakeError {
    LakeError::new(ErrorKind::Invalid, message)
}

/// The tables of `namespace` whose `main` carries a marker of `job`, the anchor first.
pub async fn job_tables(
    client: &CatalogClient,
    anchor: &TableIdent,
    job: &str,
) -> LakeResult<Vec<LoadedTable>> {
    let namespace: Vec<String> = anchor.namespace().as_ref().clone();
    let mut out = vec![client.load_table(anchor).await?];
    for ident in client.list_tables(&namespace).await? {
        if &ident == anchor {
            continue;
        }
        let table = client.load_table(&ident).await?;
        if newest_marker(&table.metadata, job).is_some() {
            out.push(table);
        }
    }
    Ok(out)
}

fn head(table: &LoadedTable) -> Option<i64> {
    table
        .metadata
        .snapshot_for_ref("main")
        .map(|s| s.snapshot_id())
}

async fn commit_all(client: &CatalogClient, commits: Vec<TableCommit>) -> LakeResult<()> {
    if commits.is_empty() {
        return Ok(());
    }
    if client.supports_transactions() && commits.len() > 1 {
        client.commit_transaction(&commits).await
    } else {
        for c in &commits {
            client.commit_table(c).await?;
        }
        Ok(())
    }
}

/// Tags the job's tables as savepoint `name` of the job's newest checkpoint.
pub async fn create(
    client: &CatalogClient,
    anchor: &TableIdent,
    job: &str,
    name: &str,
) -> LakeResult<Savepoint> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(invalid(format!(
            "savepoint name {name:?}: letters, digits, '-', '_' or '.'"
        )));
    }
    let tag_name = tag(job, name);
    for _ in 0..10 {
        let tables = job_tables(client, anchor, job).await?;
        let again = client.load_table(anchor).await?;
        if head(&again) != head(&tables[0]) {
            continue; // the job committed meanwhile: read the heads again
        }
        let Some(found) = newest_marker(&tables[0].metadata, job) else {
            return Err(invalid(format!(
                "job {job} has committed no checkpoint to {anchor}"
            )));
        };
        if tags(&tables[0].metadata).contains_key(&tag_name) {
            return Err(invalid(format!(
                "savepoint {name} of job {job} exists; delete it first (floe savepoint --delete)"
            )));
        }
        let mut commits = Vec::new();
        let mut tagged = Vec::new();
        for table in &tables {
            let Some(at) = head(table) else {
                continue;
            };
            commits.push(TableCommit {
                ident: table.ident.clone(),
                requirements: vec![
                    TableRequirement::UuidMatch {
                        uuid: table.metadata.uuid(),
                    },
                    TableRequirement::RefSnapshotIdMatch {
                        r#ref: "main".into(),
                        snapshot_id: Some(at),
                    },
                ],
                updates: vec![TableUpdate::SetSnapshotRef {
                    ref_name: tag_name.clone(),
                    reference: SnapshotReference::new(
                        at,
                        SnapshotRetention::Tag {
                            max_ref_age_ms: None,
                        },
                    ),
                }],
            });
            tagged.push((table.ident.clone(), at));
        }
        match commit_all(client, commits).await {
            Ok(()) => {
                let snapshot = tables[0].metadata.snapshot_by_id(found.snapshot_id);
                return Ok(Savepoint {
                    name: name.to_string(),
                    snapshot_id: found.snapshot_id,
                    timestamp_ms: snapshot.map_or(0, |s| s.timestamp_ms()),
                    marker: Some(found.marker),
                    tables: tagged,
                });
            }
            Err(e) if e.kind() == ErrorKind::Conflict => continue,
            Err(e) => return Err(e),
        }
    }
    Err(LakeError::new(
        ErrorKind::Conflict,
        "the job kept committing while the savepoint was taken; try again",
    ))
}

/// The job's savepoints, oldest first.
pub async fn list(
    client: &CatalogClient,
    anchor: &TableIdent,
    job: &str,
) -> LakeResult<Vec<Savepoint>> {
    let table = client.load_table(anchor).await?;
    let prefix = tag(job, "");
    let mut out: Vec<Savepoint> = tags(&table.metadata)
        .into_iter()
        .filter_map(|(name, id)| {
            let name = name.strip_prefix(&prefix)?.to_string();
            let snapshot = table.metadata.snapshot_by_id(id);
            Some(Savepoint {
                name,
                snapshot_id: id,
                timestamp_ms: snapshot.map_or(0, |s| s.timestamp_ms()),
                marker: snapshot
                    .and_then(|s| CommitMarker::from_properties(&s.summary().additional_properties))
                    .filter(|m| m.job_id == job),
                tables: vec![(anchor.clone(), id)],
            })
        })
        .collect();
    out.sort_by_key(|s| s.timestamp_ms);
    Ok(out)
}

/// Removes savepoint `name` from every table of the job that has it.
pub async fn delete(
    client: &CatalogClient,
    anchor: &TableIdent,
    job: &str,
    name: &str,
) -> LakeResult<usize> {
    let tag_name = tag(job, name);
    let mut commits = Vec::new();
    for table in job_tables(client, anchor, job).await? {
        if tags(&table.metadata).contains_key(&tag_name) {
            commits.push(TableCommit {
                ident: table.ident.clone(),
                requirements: vec![TableRequirement::UuidMatch {
                    uuid: table.metadata.uuid(),
                }],
                updates: vec![TableUpdate::RemoveSnapshotRef {
                    ref_name: tag_name.clone(),
                }],
            });
        }
    }
    if commits.is_empty() {
        return Err(invalid(format!("job {job} has no savepoint {name}")));
    }
    let n = commits.len();
    commit_all(client, commits).await?;
    Ok(n)
}

/// What a rewind did.
#[derive(Debug, Clone)]
pub struct Rewound {
    /// Tables whose `main` moved back, and how many snapshots each left behind.
    pub tables: Vec<(TableIdent, usize)>,
}

/// Moves every table of the job back to savepoint `name` (nothing to do when the job has not
/// committed since).
pub async fn rewind(
    client: &CatalogClient,
    anchor: &TableIdent,
    job: &str,
    name: &str,
) -> LakeResult<Rewound> {
    let tag_name = tag(job, name);
    let tables = job_tables(client, anchor, job).await?;
    if !tags(&tables[0].metadata).contains_key(&tag_name) {
        return Err(invalid(format!(
            "job {job} has no savepoint {name} in {anchor}"
        )));
    }
    let mut commits = Vec::new();
    let mut rewound = Vec::new();
    for table in &tables {
        let Some(now) = head(table) else {
            continue;
        };
        let target = tags(&table.metadata).get(&tag_name).copied();
        // The snapshots since the savepoint (all of them when the table was made after it).
        let mut since = Vec::new();
        let mut next = Some(now);
        while let Some(id) = next {
            if Some(id) == target {
                break;
            }
            let Some(snapshot) = table.metadata.snapshot_by_id(id) else {
                break;
            };
            since.push(snapshot);
            next = snapshot.parent_snapshot_id();
        }
        if target.is_some() && next != target {
            return Err(invalid(format!(
                "{}: main no longer descends from savepoint {name} (was the table rolled back?)",
                table.ident
            )));
        }
        if since.is_empty() {
            continue;
        }
        if let Some(other) = since.iter().find_map(|s| {
            s.summary()
                .additional_properties
                .get(JOB_ID)
                .filter(|j| j.as_str() != job)
        }) {
            return Err(invalid(format!(
                "{}: job {other} committed to it after savepoint {name}; rewinding would undo \
                 its rows too (give each job its own tables, e.g. its own dead_letter table)",
                table.ident
            )));
        }
        let mut requirements = vec![
            TableRequirement::UuidMatch {
                uuid: table.metadata.uuid(),
            },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: "main".into(),
                snapshot_id: Some(now),
            },
        ];
        // The job's checkpoint tags name snapshots being rewound: they go too (the markers
        // along `main` are the job's checkpoints again).
        let tag = marker::checkpoint_tag(job, None);
        let writers = format!("{tag}.");
        let checkpoint_tags = tags(&table.metadata)
            .into_keys()
            .filter(|name| *name == tag || name.starts_with(&writers));
        let mut updates: Vec<TableUpdate> = checkpoint_tags
            .map(|ref_name| TableUpdate::RemoveSnapshotRef { ref_name })
            .collect();
        updates.extend(match target {
            Some(at) => vec![TableUpdate::SetSnapshotRef {
                ref_name: "main".into(),
                reference: SnapshotReference::new(
                    at,
                    SnapshotRetention::Branch {
                        min_snapshots_to_keep: None,
                        max_snapshot_age_ms: None,
                        max_ref_age_ms: None,
                    },
                ),
            }],
            None => {
                requirements.truncate(1);
                vec![TableUpdate::RemoveSnapshotRef {
                    ref_name: "main".into(),
                }]
            }
        });
        commits.push(TableCommit {
            ident: table.ident.clone(),
            requirements,
            updates,
        });
        rewound.push((table.ident.clone(), since.len()));
    }
    commit_all(client, commits).await?;
    Ok(Rewound { tables: rewound })
}

/// A namespace's table by name.
pub fn ident(namespace: &str, table: &str) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::new(namespace.to_string()),
        table.to_string(),
    )
}
