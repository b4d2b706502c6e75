//! The catalog's operations, independent of HTTP: create, load, commit, register, drop.
//!
//! A commit follows the spec's algorithm for every table it touches: load the pointer and the
//! metadata it names, check every requirement, apply the updates with iceberg's
//! `TableMetadataBuilder`, write the next metadata file, then swap all pointers in one store
//! transaction. A lost compare-and-swap deletes the files this attempt wrote and retries from a
//! fresh load (the client's requirements are re-checked, so a retry can only succeed when the
//! client's assertions still hold); after the last attempt it answers 409. Nothing a 4xx
//! reports has changed any state.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use iceberg::spec::{FormatVersion, TableMetadata, TableMetadataBuilder};
use iceberg::{MetadataLocation, TableCreation, TableRequirement, TableUpdate};
use iceberg_catalog_rest::{CreateTableRequest, LoadTableResult, RegisterTableRequest};

use crate::error::{ApiError, ApiResult, ErrorType};
use crate::idempotency::IdempotencyContext;
use crate::ident::{Namespace, TableName};
use crate::metrics::Metrics;
use crate::store::{CatalogStore, PointerSwap, SwapOutcome};
use crate::warehouse::{Warehouse, namespace_location};

/// How many times a commit is attempted when another writer wins the swap.
const COMMIT_ATTEMPTS: u32 = 8;

/// Upper bound of the random pause before retry `attempt`, so racing writers spread out.
fn retry_pause(attempt: u32) -> std::time::Duration {
    let ceiling_ms = 5 * u64::from(attempt.min(6));
    std::time::Duration::from_millis(rand::random_range(0..=ceiling_ms))
}

/// The requested changes to one table.
#[derive(Debug, Clone)]
pub struct TableChange {
    /// The table.
    pub table: TableName,
    /// Assertions about its current metadata.
    pub requirements: Vec<TableRequirement>,
    /// Changes to apply, in order.
    pub updates: Vec<TableUpdate>,
}

/// The result of one committed table.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The new metadata location.
    pub metadata_location: String,
    /// The new metadata.
    pub metadata: Arc<TableMetadata>,
}

/// The catalog: a store of pointers plus a warehouse of metadata files.
#[derive(Debug, Clone)]
pub struct Catalog {
    store: Arc<dyn CatalogStore>,
    warehouse: Warehouse,
    metrics: Metrics,
}

struct Prepared {
    swap: PointerSwap,
    metadata: Arc<TableMetadata>,
    written: bool,
    expired: Vec<String>,
}

impl Catalog {
    /// A catalog over `store` and `warehouse`.
    pub fn new(store: Arc<dyn CatalogStore>, warehouse: Warehouse, metrics: Metrics) -> Self {
        Self {
            store,
            warehouse,
            metrics,
        }
    }

    /// The pointer store.
    pub fn store(&self) -> &dyn CatalogStore {
        self.store.as_ref()
    }

    /// The warehouse.
    pub fn warehouse(&self) -> &Warehouse {
        &self.warehouse
    }

    /// A namespace's stored properties; `NoSuchNamespace` if it does not exist.
    pub async fn namespace_properties(
        &self,
        namespace: &Namespace,
    ) -> ApiResult<HashMap<String, String>> {
        self.store
            .namespace_properties(namespace)
            .await?
            .ok_or_else(|| ApiError::no_such_namespace(namespace))
    }

    /// The current metadata location and metadata of a table.
    pub async fn load(&self, table: &TableName) -> ApiResult<(String, Arc<TableMetadata>)> {
        let location = self
            .store
            .table_pointer(table)
            .await?
            .ok_or_else(|| ApiError::no_such_table(table))?;
        let metadata = self.warehouse.read_metadata(&location).await?;
        Ok((location, metadata))
    }

    /// Creates a table, or stages it when `stage-create` is set (nothing visible is created
    /// then; the later `assert-create` commit creates it).
    pub async fn create(
        &self,
        namespace: &Namespace,
        request: CreateTableRequest,
    ) -> ApiResult<LoadTableResult> {
        let table = TableName::new(namespace.clone(), request.name.clone())?;
        let ns_properties = self.namespace_properties(namespace).await?;
        if self.store.table_pointer(&table).await?.is_some() {
            return Err(ApiError::new(
                ErrorType::AlreadyExists,
                format!("table {table} already exists"),
            ));
        }
        let location = match request.location {
            Some(location) => {
                let location = location.trim_end_matches('/').to_string();
                if !self.warehouse.contains(&location) {
                    return Err(ApiError::bad_request(format!(
                        "table location {location} is outside the warehouse {}",
                        self.warehouse.root()
                    )));
                }
                location
            }
            None => self
                .warehouse
                .new_table_location(&table, namespace_location(&ns_properties)),
        };
        let mut properties = request.properties;
        let format_version = take_format_version(&mut properties)?;
        let creation = TableCreation::builder()
            .name(table.name.clone())
            .location(location)
            .schema(request.schema)
            .properties(properties)
            .format_version(format_version)
            .build();
        let creation = TableCreation {
            partition_spec: request.partition_spec,
            sort_order: request.write_order,
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;

        if request.stage_create == Some(true) {
            let json = serde_json::to_string(&metadata).map_err(|e| {
                ApiError::internal(format!("could not encode staged metadata: {e}"))
            })?;
            self.store.put_staged(&table, &json).await?;
            return Ok(load_result(None, metadata, &self.warehouse));
        }

        let location = MetadataLocation::new_with_metadata(metadata.location(), &metadata);
        let written = self.warehouse.write_metadata(&metadata, &location).await?;
        let swap = PointerSwap {
            table: table.clone(),
            expected: None,
            new: written.clone(),
        };
        match self.store.swap_pointers(&[swap], None).await {
            Ok(SwapOutcome::Committed) => Ok(load_result(Some(written), metadata, &self.warehouse)),
            Ok(SwapOutcome::Lost { .. }) => {
                self.warehouse.delete_quietly(&written).await;
                Err(ApiError::new(
                    ErrorType::AlreadyExists,
                    format!("table {table} already exists"),
                ))
            }
            Err(e) => {
                if e.is_definite() {
                    self.warehouse.delete_quietly(&written).await;
                }
                Err(e)
            }
        }
    }

    /// Registers an existing metadata file (inside the warehouse) as a table.
    pub async fn register(
        &self,
        namespace: &Namespace,
        request: RegisterTableRequest,
    ) -> ApiResult<LoadTableResult> {
        let table = TableName::new(namespace.clone(), request.name.clone())?;
        if !self.warehouse.contains(&request.metadata_location) {
            return Err(ApiError::bad_request(format!(
                "metadata location {} is outside the warehouse {}",
                request.metadata_location,
                self.warehouse.root()
            )));
        }
        let metadata = self
            .warehouse
            .read_metadata(&request.metadata_location)
            .await
            .map_err(|e| ApiError::bad_request(format!("cannot register: {}", e.message)))?;
        let current = self.store.table_pointer(&table).await?;
        if current.is_some() && request.overwrite != Some(true) {
            return Err(ApiError::new(
                ErrorType::AlreadyExists,
                format!("table {table} already exists"),
            ));
        }
        let swap = PointerSwap {
            table: table.clone(),
            expected: current,
            new: request.metadata_location.clone(),
        };
        match self.store.swap_pointers(&[swap], None).await? {
            SwapOutcome::Committed => Ok(load_result(
                Some(request.metadata_location),
                (*metadata).clone(),
                &self.warehouse,
            )),
            SwapOutcome::Lost { .. } => Err(ApiError::commit_failed(format!(
                "table {table} changed while it was being registered"
            ))),
        }
    }

    /// Drops a table; with `purge`, deletes its files too (only inside the warehouse).
    pub async fn drop_table(&self, table: &TableName, purge: bool) -> ApiResult<()> {
        let location = self.store.drop_table(table).await?;
        if purge {
            match self.warehouse.read_metadata(&location).await {
                Ok(metadata) => {
                    self.warehouse.purge(metadata.location()).await?;
                }
                Err(error) => {
                    tracing::warn!(%table, %error, "dropped table but could not read its metadata to purge it");
                }
            }
        }
        Ok(())
    }

    /// Commits changes to one or more tables atomically. When `idempotency` is given, the
    /// response `respond` builds is stored in the same store transaction as the swap.
    pub async fn commit(
        &self,
        changes: &[TableChange],
        idempotency: Option<&IdempotencyContext>,
        respond: impl Fn(&[Committed]) -> (u16, String),
    ) -> ApiResult<(Vec<Committed>, u16, String)> {
        let started = std::time::Instant::now();
        let mut tables: Vec<&TableName> = changes.iter().map(|c| &c.table).collect();
        tables.sort_by_key(|t| t.to_string());
        if tables.windows(2).any(|w| w[0] == w[1]) {
            return Err(ApiError::bad_request(
                "a transaction names the same table twice",
            ));
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut prepared = Vec::with_capacity(changes.len());
            let mut failure = None;
            for change in changes {
                match self.prepare(change).await {
                    Ok(p) => prepared.push(p),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            if let Some(error) = failure {
                self.discard(&prepared).await;
                if error.kind == ErrorType::CommitFailed {
                    self.metrics.commit_conflicts.inc();
                }
                return Err(error);
            }
            let committed: Vec<Committed> = prepared
                .iter()
                .map(|p| Committed {
                    metadata_location: p.swap.new.clone(),
                    metadata: p.metadata.clone(),
                })
                .collect();
            let (status, body) = respond(&committed);
            let record = idempotency.map(|ctx| ctx.record(status, body.clone()));
            // Tables with no change keep their pointer; only written tables are swapped.
            let swaps: Vec<PointerSwap> = prepared
                .iter()
                .filter(|p| p.written)
                .map(|p| p.swap.clone())
                .collect();
            let outcome = if swaps.is_empty() && record.is_none() {
                Ok(SwapOutcome::Committed)
            } else {
                self.store.swap_pointers(&swaps, record.as_ref()).await
            };
            match outcome {
                Ok(SwapOutcome::Committed) => {
                    self.metrics
                        .commit_seconds
                        .observe(started.elapsed().as_secs_f64());
                    for p in &prepared {
                        for file in &p.expired {
                            if self.warehouse.contains(file) {
                                self.warehouse.delete_quietly(file).await;
                            }
                        }
                    }
                    return Ok((committed, status, body));
                }
                Ok(SwapOutcome::Lost { table }) => {
                    self.discard(&prepared).await;
                    self.metrics.commit_conflicts.inc();
                    if attempt >= COMMIT_ATTEMPTS {
                        return Err(ApiError::commit_failed(format!(
                            "table {table} was changed by another writer {attempt} times in a row; \
                             reload and retry"
                        )));
                    }
                    tracing::debug!(%table, attempt, "lost the pointer swap, retrying");
                    tokio::time::sleep(retry_pause(attempt)).await;
                }
                Err(error) => {
                    // A definite failure changed nothing; an unknown outcome may have moved the
                    // pointers, so the files must stay.
                    if error.is_definite() || error.kind == ErrorType::ServiceUnavailable {
                        self.discard(&prepared).await;
                    }
                    return Err(error);
                }
            }
        }
    }

    async fn discard(&self, prepared: &[Prepared]) {
        for p in prepared.iter().filter(|p| p.written) {
            self.warehouse.delete_quietly(&p.swap.new).await;
        }
    }

    /// Checks requirements, applies updates and writes the next metadata file of one table.
    async fn prepare(&self, change: &TableChange) -> ApiResult<Prepared> {
        let table = &change.table;
        let current = self.store.table_pointer(table).await?;
        let creating = change
            .requirements
            .iter()
            .any(|r| matches!(r, TableRequirement::NotExist));
        let (base, base_location) = match &current {
            Some(location) => (
                Some(self.warehouse.read_metadata(location).await?),
                Some(location),
            ),
            None => (None, None),
        };
        for requirement in &change.requirements {
            requirement.check(base.as_deref()).map_err(|e| {
                let mut error = ApiError::from(e);
                if error.kind == ErrorType::NoSuchTable {
                    error.message = format!("table {table} does not exist");
                } else if error.kind == ErrorType::CommitFailed {
                    error.message =
                        format!("requirement failed for table {table}: {}", error.message);
                }
                error
            })?;
        }
        let builder = match (&base, creating) {
            (Some(base), _) => {
                TableMetadataBuilder::new_from_metadata((**base).clone(), base_location.cloned())
            }
            (None, true) => TableMetadataBuilder::new_from_metadata(self.seed(change).await?, None),
            (None, false) => {
                return Err(ApiError::no_such_table(table));
            }
        };
        let mut builder = builder;
        for update in change.updates.iter().cloned() {
            builder = update.apply(builder).map_err(|e| {
                ApiError::new(
                    ErrorType::Validation,
                    format!("cannot apply update to table {table}: {}", e.message()),
                )
            })?;
        }
        let built = builder.build().map_err(|e| {
            ApiError::new(
                ErrorType::Validation,
                format!(
                    "the updated metadata of table {table} is invalid: {}",
                    e.message()
                ),
            )
        })?;
        if let (Some(base), Some(location)) = (&base, base_location)
            && built.changes.is_empty()
        {
            return Ok(Prepared {
                swap: PointerSwap {
                    table: table.clone(),
                    expected: Some(location.clone()),
                    new: location.clone(),
                },
                metadata: base.clone(),
                written: false,
                expired: Vec::new(),
            });
        }
        let metadata = built.metadata;
        if !self.warehouse.contains(metadata.location()) {
            return Err(ApiError::bad_request(format!(
                "table location {} is outside the warehouse {}",
                metadata.location(),
                self.warehouse.root()
            )));
        }
        let next = match base_location.map(|l| MetadataLocation::from_str(l)) {
            Some(Ok(previous)) => previous.with_next_version().with_new_metadata(&metadata),
            // A registered table whose file name does not follow the convention, or a create.
            _ => MetadataLocation::new_with_metadata(metadata.location(), &metadata),
        };
        let written = self.warehouse.write_metadata(&metadata, &next).await?;
        let delete_expired = metadata
            .properties()
            .get("write.metadata.delete-after-commit.enabled")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let expired = if delete_expired {
            built
                .expired_metadata_logs
                .iter()
                .map(|log| log.metadata_file.clone())
                .collect()
        } else {
            Vec::new()
        };
        Ok(Prepared {
            swap: PointerSwap {
                table: table.clone(),
                expected: current,
                new: written,
            },
            metadata: Arc::new(metadata),
            written: true,
            expired,
        })
    }

    /// The starting metadata of a table created by an `assert-create` commit: what was staged,
    /// or — for a client that commits a create without staging — a table built from the
    /// commit's own first schema and location (its updates then apply on top, deduplicated).
    async fn seed(&self, change: &TableChange) -> ApiResult<TableMetadata> {
        if let Some(json) = self.store.staged(&change.table).await? {
            return serde_json::from_str(&json)
                .map_err(|e| ApiError::internal(format!("staged metadata is unreadable: {e}")));
        }
        let schema = change
            .updates
            .iter()
            .find_map(|u| match u {
                TableUpdate::AddSchema { schema } => Some(schema.clone()),
                _ => None,
            })
            .ok_or_else(|| {
                ApiError::bad_request("a create commit must add a schema (`add-schema`)")
            })?;
        let location = match change.updates.iter().find_map(|u| match u {
            TableUpdate::SetLocation { location } => Some(location.clone()),
            _ => None,
        }) {
            Some(location) => location,
            None => {
                let properties = self.namespace_properties(&change.table.namespace).await?;
                self.warehouse
                    .new_table_location(&change.table, namespace_location(&properties))
            }
        };
        let format_version = change
            .updates
            .iter()
            .find_map(|u| match u {
                TableUpdate::UpgradeFormatVersion { format_version } => Some(*format_version),
                _ => None,
            })
            .unwrap_or(FormatVersion::V2);
        let creation = TableCreation::builder()
            .name(change.table.name.clone())
            .location(location)
            .schema(schema)
            .format_version(format_version)
            .build();
        Ok(TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata)
    }
}

/// Removes the reserved `format-version` property and parses it (default 2).
fn take_format_version(properties: &mut HashMap<String, String>) -> ApiResult<FormatVersion> {
    match properties.remove("format-version").as_deref() {
        None | Some("2") => Ok(FormatVersion::V2),
        Some("1") => Ok(FormatVersion::V1),
        Some("3") => Ok(FormatVersion::V3),
        Some(other) => Err(ApiError::bad_request(format!(
            "format-version {other:?} is not supported; use 1, 2 or 3"
        ))),
    }
}

/// A `LoadTableResult` carrying the storage settings clients need.
pub fn load_result(
    metadata_location: Option<String>,
    metadata: TableMetadata,
    warehouse: &Warehouse,
) -> LoadTableResult {
    LoadTableResult {
        metadata_location,
        metadata,
        config: warehouse.client_config().clone(),
        storage_credentials: None,
    }
}
