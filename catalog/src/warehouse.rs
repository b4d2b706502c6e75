//! The warehouse: where table metadata (and the clients' data files) live — a local directory
//! or an S3-compatible bucket — and the catalog's reads and writes of metadata files.
//!
//! Metadata files are immutable once written (every commit writes a new file under a fresh
//! UUID), so they are cached by location. Deletion is confined to the warehouse: a purge of a
//! table whose location lies outside the warehouse root (a registered table) deletes nothing.

use std::collections::HashMap;
use std::io::Write;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use iceberg::MetadataLocation;
use iceberg::compression::CompressionCodec;
use iceberg::io::{FileIO, FileIOBuilder};
use iceberg::spec::TableMetadata;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use lru::LruCache;

use crate::error::{ApiError, ApiResult, ErrorType};
use crate::ident::{Namespace, TableName};

/// Settings for an S3-compatible warehouse. Credentials come from the environment or the
/// config file and are never logged.
#[derive(Clone, Default)]
pub struct S3Settings {
    /// Endpoint URL for S3-compatible stores (MinIO, moto); `None` for AWS.
    pub endpoint: Option<String>,
    /// The bucket's region.
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), needed by MinIO and moto.
    pub path_style: bool,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token for temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field(
                "access_key_id",
                &self.access_key_id.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// The warehouse root and the I/O to reach it.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: String,
    io: FileIO,
    client_config: HashMap<String, String>,
    cache: Arc<Mutex<LruCache<String, Arc<TableMetadata>>>>,
}

const CACHED_METADATA: usize = 1024;

fn storage_error(what: &str, location: &str, error: iceberg::Error) -> ApiError {
    ApiError::new(
        ErrorType::ServiceUnavailable,
        format!("could not {what} {location}: {error}"),
    )
}

impl Warehouse {
    /// Opens the warehouse at `url` (`file:///abs/path` or `s3://bucket/prefix`).
    pub fn open(url: &str, s3: &S3Settings) -> ApiResult<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| ApiError::bad_request(format!("warehouse {url:?} is not a URL: {e}")))?;
        let mut props = HashMap::new();
        let mut client_config = HashMap::new();
        match parsed.scheme() {
            "file" => {
                let path = parsed.to_file_path().map_err(|()| {
                    ApiError::bad_request(format!("warehouse {url:?} is not an absolute file path"))
                })?;
                std::fs::create_dir_all(&path).map_err(|e| {
                    ApiError::internal(format!(
                        "could not create warehouse {}: {e}",
                        path.display()
                    ))
                })?;
            }
            "s3" | "s3a" => {
                if parsed.host_str().unwrap_or_default().len() < 3 {
                    return Err(ApiError::bad_request(format!(
                        "warehouse {url:?} needs a bucket name"
                    )));
                }
                let mut shared = Vec::new();
                if let Some(endpoint) = &s3.endpoint {
                    shared.push(("s3.endpoint", endpoint.clone()));
                }
                if let Some(region) = &s3.region {
                    shared.push(("s3.region", region.clone()));
                    shared.push(("client.region", region.clone()));
                }
                shared.push(("s3.path-style-access", s3.path_style.to_string()));
                for (k, v) in shared {
                    props.insert(k.to_string(), v.clone());
                    // Clients reading the data need the same endpoint; they bring their own
                    // credentials.
                    client_config.insert(k.to_string(), v);
                }
                if let Some(v) = &s3.access_key_id {
                    props.insert("s3.access-key-id".into(), v.clone());
                }
                if let Some(v) = &s3.secret_access_key {
                    props.insert("s3.secret-access-key".into(), v.clone());
                }
                if let Some(v) = &s3.session_token {
                    props.insert("s3.session-token".into(), v.clone());
                }
                props.insert("s3.disable-ec2-metadata".into(), "true".into());
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "warehouse scheme {other:?} is not supported; use file:// or s3://"
                )));
            }
        }
        let io = FileIOBuilder::new(Arc::new(OpenDalResolvingStorageFactory::new()))
            .with_props(props)
            .build();
        let cache = LruCache::new(NonZeroUsize::new(CACHED_METADATA).unwrap_or(NonZeroUsize::MIN));
        Ok(Self {
            root: url.trim_end_matches('/').to_string(),
            io,
            client_config,
            cache: Arc::new(Mutex::new(cache)),
        })
    }

    /// The warehouse root URL, without a trailing `/`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// Storage settings clients need to read the warehouse (never credentials).
    pub fn client_config(&self) -> &HashMap<String, String> {
        &self.client_config
    }

    /// The I/O handle (for tests and purge).
    pub fn io(&self) -> &FileIO {
        &self.io
    }

    /// Where the tables of a namespace without a `location` property live.
    pub fn namespace_location(&self, namespace: &Namespace) -> String {
        format!("{}/{}", self.root, namespace.path())
    }

    /// A fresh location for a new table: under the namespace's `location` property when set,
    /// else `{root}/{ns…}/{table}-{uuid}`. The UUID keeps a re-created table from sharing a
    /// directory — and a later purge — with a dropped one of the same name.
    pub fn new_table_location(
        &self,
        table: &TableName,
        namespace_location: Option<&str>,
    ) -> String {
        let base = match namespace_location {
            Some(loc) => loc.trim_end_matches('/').to_string(),
            None => self.namespace_location(&table.namespace),
        };
        format!("{base}/{}-{}", table.name, uuid::Uuid::new_v4().simple())
    }

    /// Whether `location` lies inside the warehouse root.
    pub fn contains(&self, location: &str) -> bool {
        location
            .strip_prefix(&self.root)
            .is_some_and(|rest| rest.starts_with('/') && !rest.contains("/../"))
    }

    /// Reads a metadata file, from the cache when it was read or written before.
    pub async fn read_metadata(&self, location: &str) -> ApiResult<Arc<TableMetadata>> {
        if let Some(hit) = self.cache_get(location) {
            return Ok(hit);
        }
        let metadata = TableMetadata::read_from(&self.io, location)
            .await
            .map_err(|e| storage_error("read table metadata", location, e))?;
        let metadata = Arc::new(metadata);
        self.cache_put(location, metadata.clone());
        Ok(metadata)
    }

    /// Writes a new metadata file at `location` (which must be fresh), its lists in commit
    /// order ([`crate::metadata_json`]), gzipped when the location says so.
    pub async fn write_metadata(
        &self,
        metadata: &TableMetadata,
        location: &MetadataLocation,
    ) -> ApiResult<String> {
        let json = serde_json::to_vec(&crate::metadata_json::to_value(metadata)?)
            .map_err(|e| ApiError::internal(format!("could not encode table metadata: {e}")))?;
        let bytes = match location.compression_codec() {
            CompressionCodec::None => json,
            CompressionCodec::Gzip(level) => {
                let mut encoder = flate2::write::GzEncoder::new(
                    Vec::new(),
                    flate2::Compression::new(level.into()),
                );
                encoder
                    .write_all(&json)
                    .and_then(|()| encoder.finish())
                    .map_err(|e| {
                        ApiError::internal(format!("could not gzip table metadata: {e}"))
                    })?
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "metadata compression {other:?} is not supported; use none or gzip"
                )));
            }
        };
        let location = location.to_string();
        self.io
            .new_output(&location)
            .map_err(|e| storage_error("write table metadata", &location, e))?
            .write(bytes.into())
            .await
            .map_err(|e| storage_error("write table metadata", &location, e))?;
        self.cache_put(&location, Arc::new(metadata.clone()));
        Ok(location)
    }

    /// Deletes one file the catalog wrote and lost (a lost race, a failed multi-table commit).
    /// Failure only leaves an unreferenced file, so it is logged, not raised.
    pub async fn delete_quietly(&self, location: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.pop(location);
        }
        if let Err(error) = self.io.delete(location).await {
            tracing::warn!(%location, %error, "could not delete orphaned metadata file");
        }
    }

    /// Deletes every file under a dropped table's location, if it lies in the warehouse.
    pub async fn purge(&self, table_location: &str) -> ApiResult<bool> {
        if !self.contains(table_location) {
            tracing::warn!(location = %table_location, "not purging a table outside the warehouse");
            return Ok(false);
        }
        let prefix = format!("{}/", table_location.trim_end_matches('/'));
        self.io
            .delete_prefix(&prefix)
            .await
            .map_err(|e| storage_error("purge", &prefix, e))?;
        Ok(true)
    }

    fn cache_get(&self, location: &str) -> Option<Arc<TableMetadata>> {
        self.cache.lock().ok()?.get(location).cloned()
    }

    fn cache_put(&self, location: &str, metadata: Arc<TableMetadata>) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.put(location.to_string(), metadata);
        }
    }
}

/// The namespace's `location` property, used as the base of new tables.
pub fn namespace_location(properties: &HashMap<String, String>) -> Option<&str> {
    properties
        .get("location")
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_locations_are_unique_and_inside() {
        let dir = std::env::temp_dir().join(format!("floe-wh-{}", uuid::Uuid::new_v4()));
        let url = format!("file://{}", dir.display());
        let wh = Warehouse::open(&url, &S3Settings::default()).unwrap();
        let t = TableName::new(Namespace::from_url("a\u{1f}b").unwrap(), "t".into()).unwrap();
        let one = wh.new_table_location(&t, None);
        let two = wh.new_table_location(&t, None);
        assert_ne!(one, two);
        assert!(one.starts_with(&format!("{url}/a/b/t-")), "{one}");
        assert!(wh.contains(&one));
        assert!(!wh.contains("file:///etc/passwd"));
        assert!(!wh.contains(&format!("{url}/../escape")));
        assert!(!wh.contains(&format!("{url}-sibling/t")));
        std::fs::remove_dir_all(dir).ok();
    }
}
