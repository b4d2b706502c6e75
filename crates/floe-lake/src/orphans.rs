//! Orphan-file removal: delete files under a table's location that no snapshot and no
//! metadata file references and that are older than a minimum age (default 3 days).
//!
//! Orphans come from commits that failed or whose outcome was unknown, and from writers that
//! crashed between writing files and committing them. The minimum age is what keeps the files
//! of a commit still in flight safe: they are referenced by nothing yet, but they are new.
//! Listing goes through OpenDAL (iceberg's `Storage` has no list), local or S3.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use opendal::{EntryMode, Operator};

use crate::error::{ErrorKind, LakeError, LakeResult};
use crate::expire::referenced_files;
use crate::rest::{CatalogClient, LoadedTable};

/// Settings of an orphan sweep.
#[derive(Debug, Clone)]
pub struct RemoveOrphans {
    /// Only files older than this are removed.
    pub older_than: Duration,
    /// List what would be removed without removing it.
    pub dry_run: bool,
}

impl Default for RemoveOrphans {
    fn default() -> Self {
        Self {
            older_than: Duration::from_secs(3 * 24 * 3600),
            dry_run: false,
        }
    }
}

/// What a sweep found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanReport {
    /// Unreferenced files old enough to remove (full locations).
    pub orphans: Vec<String>,
    /// Whether they were deleted (false for a dry run).
    pub deleted: bool,
}

fn storage(what: &str, error: opendal::Error) -> LakeError {
    LakeError::new(ErrorKind::Unavailable, format!("could not {what}")).with_source(error)
}

/// An operator rooted at the table location, from the table's FileIO properties.
fn operator(table: &LoadedTable) -> LakeResult<Operator> {
    let location = table.metadata.location().trim_end_matches('/');
    let url = url::Url::parse(location).map_err(|e| {
        LakeError::new(
            ErrorKind::Invalid,
            format!("table location {location} is not a URL"),
        )
        .with_source(e)
    })?;
    let props = table.io.config().props();
    let op = match url.scheme() {
        "file" => {
            let root = url.to_file_path().map_err(|()| {
                LakeError::new(
                    ErrorKind::Invalid,
                    format!("{location} is not a local path"),
                )
            })?;
            Operator::new(opendal::services::Fs::default().root(&root.to_string_lossy()))
                .map_err(|e| storage("open the local warehouse", e))?
                .finish()
        }
        "s3" | "s3a" => {
            let mut builder = opendal::services::S3::default()
                .bucket(url.host_str().unwrap_or_default())
                .root(url.path());
            if let Some(v) = props.get("s3.endpoint") {
                builder = builder.endpoint(v);
            }
            if let Some(v) = props.get("s3.region").or(props.get("client.region")) {
                builder = builder.region(v);
            }
            if let Some(v) = props.get("s3.access-key-id") {
                builder = builder.access_key_id(v);
            }
            if let Some(v) = props.get("s3.secret-access-key") {
                builder = builder.secret_access_key(v);
            }
            if let Some(v) = props.get("s3.session-token") {
                builder = builder.session_token(v);
            }
            if props.get("s3.path-style-access").map(String::as_str) == Some("false") {
                builder = builder.enable_virtual_host_style();
            }
            Operator::new(builder)
                .map_err(|e| storage("open the S3 warehouse", e))?
                .finish()
        }
        other => {
            return Err(LakeError::new(
                ErrorKind::Invalid,
                format!("orphan removal does not support {other}:// locations"),
            ));
        }
    };
    Ok(op)
}

/// Finds (and unless `dry_run`, deletes) the orphan files of `ident`.
pub async fn remove_orphan_files(
    client: &CatalogClient,
    ident: &iceberg::TableIdent,
    settings: &RemoveOrphans,
) -> LakeResult<OrphanReport> {
    let table = client.load_table(ident).await?;
    let location = table.metadata.location().trim_end_matches('/').to_string();
    let ids: Vec<i64> = table
        .metadata
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let mut referenced = referenced_files(&table, &table.metadata, ids.into_iter()).await?;
    referenced.extend(table.metadata_location.clone());
    referenced.extend(
        table
            .metadata
            .metadata_log()
            .iter()
            .map(|m| m.metadata_file.clone()),
    );
    // Compare by path relative to the table location (URI spellings of the root may differ).
    let relative: HashSet<String> = referenced
        .iter()
        .filter_map(|p| p.strip_prefix(&location))
        .map(|p| p.trim_start_matches('/').to_string())
        .collect();

    let op = operator(&table)?;
    let cutoff = SystemTime::now() - settings.older_than;
    let mut lister = op
        .lister_with("/")
        .recursive(true)
        .await
        .map_err(|e| storage("list the table location", e))?;
    let mut orphans = Vec::new();
    while let Some(entry) = lister
        .try_next()
        .await
        .map_err(|e| storage("list the table location", e))?
    {
        if entry.metadata().mode() != EntryMode::FILE {
            continue;
        }
        let path = entry.path().trim_start_matches('/').to_string();
        if relative.contains(&path) {
            continue;
        }
        let modified = match entry.metadata().last_modified() {
            Some(t) => t,
            None => op
                .stat(entry.path())
                .await
                .map_err(|e| storage("read a file's age", e))?
                .last_modified()
                .ok_or_else(|| {
                    LakeError::new(
                        ErrorKind::Unavailable,
                        format!("{path} has no modification time"),
                    )
                })?,
        };
        if SystemTime::from(modified) < cutoff {
            orphans.push(path);
        }
    }
    orphans.sort();
    if !settings.dry_run {
        for path in &orphans {
            op.delete(path)
                .await
                .map_err(|e| storage("delete an orphan file", e))?;
        }
    }
    Ok(OrphanReport {
        orphans: orphans
            .into_iter()
            .map(|p| format!("{location}/{p}"))
            .collect(),
        deleted: !settings.dry_run,
    })
}
