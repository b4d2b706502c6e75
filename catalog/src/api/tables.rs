//! Table routes: list, create (and stage), load (with ETags and `snapshots=refs`), head,
//! commit, multi-table transactions, drop, rename, register, and metrics reports.

use super::*;

pub(super) async fn list_tables(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    let names = state.catalog.store().list_tables(&namespace).await?;
    let (page, next) = paginate(names, String::clone, &query)?;
    let identifiers: Vec<Value> = page
        .iter()
        .map(|name| json!({ "namespace": namespace.parts(), "name": name }))
        .collect();
    Ok(Json(with_page_token(
        json!({ "identifiers": identifiers }),
        next,
    )))
}

pub(super) async fn create_table(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
    JsonBody(body): JsonBody<CreateTableRequest>,
) -> ApiResult<Response> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    let staged = body.stage_create == Some(true);
    let result = state.catalog.create(&namespace, body).await?;
    let tag = result.metadata_location.as_deref().map(|l| etag(l, "all"));
    if !staged {
        tracing::info!(%namespace, location = ?result.metadata_location, "created table");
    }
    Ok(json_response(
        StatusCode::OK,
        &table_json(&result)?,
        tag.as_deref(),
    ))
}

/// Keeps only the snapshots that a branch or tag points at (`snapshots=refs`).
pub(super) fn keep_ref_snapshots(metadata: &mut Value) {
    let referenced: HashSet<i64> = metadata["refs"]
        .as_object()
        .map(|refs| {
            refs.values()
                .filter_map(|r| r["snapshot-id"].as_i64())
                .collect()
        })
        .unwrap_or_default();
    if let Some(snapshots) = metadata["snapshots"].as_array_mut() {
        snapshots.retain(|s| {
            s["snapshot-id"]
                .as_i64()
                .is_some_and(|id| referenced.contains(&id))
        });
    }
}

pub(super) async fn load_table(
    State(state): State<AppState>,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let table = table_of(&state, &prefix, &namespace, &table)?;
    let mode = match query.get("snapshots").map(String::as_str) {
        None | Some("all") => "all",
        Some("refs") => "refs",
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "snapshots={other:?} is not one of all, refs"
            )));
        }
    };
    let (location, metadata) = state.catalog.load(&table).await?;
    let tag = etag(&location, mode);
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    if unchanged {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        if let Ok(value) = HeaderValue::from_str(&tag) {
            response.headers_mut().insert(header::ETAG, value);
        }
        return Ok(response);
    }
    let result = load_result(
        Some(location),
        (*metadata).clone(),
        state.catalog.warehouse(),
    );
    let mut body = table_json(&result)?;
    if mode == "refs" {
        keep_ref_snapshots(&mut body["metadata"]);
    }
    Ok(json_response(StatusCode::OK, &body, Some(&tag)))
}

pub(super) async fn head_table(
    State(state): State<AppState>,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let table = table_of(&state, &prefix, &namespace, &table)?;
    match state.catalog.store().table_pointer(&table).await? {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(ApiError::no_such_table(&table)),
    }
}

/// The body of a table commit. Parsed strictly: an unknown requirement or update type fails
/// here, as a 400.
#[derive(Deserialize)]
pub(super) struct CommitBody {
    #[serde(default)]
    identifier: Option<TableIdent>,
    requirements: Vec<TableRequirement>,
    updates: Vec<TableUpdate>,
}

pub(super) fn commit_response(committed: &[Committed]) -> (u16, String) {
    let body = committed.first().map(|c| {
        let mut metadata = serde_json::to_value(&*c.metadata).unwrap_or_default();
        metadata_json::order(&mut metadata);
        json!({ "metadata-location": c.metadata_location, "metadata": metadata }).to_string()
    });
    (200, body.unwrap_or_default())
}

pub(super) async fn commit_table(
    State(state): State<AppState>,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
    idempotency: Option<axum::Extension<IdempotencyContext>>,
    JsonBody(body): JsonBody<CommitBody>,
) -> ApiResult<Response> {
    let table = table_of(&state, &prefix, &namespace, &table)?;
    if let Some(ident) = &body.identifier {
        let named = TableName::from_ident(ident)?;
        if named != table {
            return Err(ApiError::bad_request(format!(
                "the body names table {named}, the path {table}"
            )));
        }
    }
    let change = TableChange {
        table,
        requirements: body.requirements,
        updates: body.updates,
    };
    let context = idempotency.map(|e| e.0);
    let (_, status, body) = state
        .catalog
        .commit(
            std::slice::from_ref(&change),
            context.as_ref(),
            commit_response,
        )
        .await?;
    Ok(stored_response(status, body, context.is_some()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TransactionBody {
    #[serde(rename = "table-changes")]
    table_changes: Vec<CommitTableRequest>,
}

pub(super) async fn commit_transaction(
    State(state): State<AppState>,
    Path(prefix): Path<String>,
    idempotency: Option<axum::Extension<IdempotencyContext>>,
    JsonBody(body): JsonBody<TransactionBody>,
) -> ApiResult<Response> {
    check_prefix(&state, &prefix)?;
    if body.table_changes.is_empty() {
        return Err(ApiError::bad_request(
            "a transaction needs at least one table change",
        ));
    }
    let mut changes = Vec::with_capacity(body.table_changes.len());
    for change in body.table_changes {
        let ident = change.identifier.ok_or_else(|| {
            ApiError::bad_request("every change of a transaction must name its table")
        })?;
        changes.push(TableChange {
            table: TableName::from_ident(&ident)?,
            requirements: change.requirements,
            updates: change.updates,
        });
    }
    let context = idempotency.map(|e| e.0);
    let (committed, status, body) = state
        .catalog
        .commit(&changes, context.as_ref(), |_| (204, String::new()))
        .await?;
    tracing::info!(tables = committed.len(), "committed transaction");
    Ok(stored_response(status, body, context.is_some()))
}

pub(super) async fn drop_table(
    State(state): State<AppState>,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<StatusCode> {
    let table = table_of(&state, &prefix, &namespace, &table)?;
    // PyIceberg sends Python's `True` / `False`.
    let purge = match query.get("purgeRequested").map(|v| v.to_ascii_lowercase()) {
        None => false,
        Some(v) if v == "false" => false,
        Some(v) if v == "true" => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "purgeRequested={other:?} is not true or false"
            )));
        }
    };
    state.catalog.drop_table(&table, purge).await?;
    tracing::info!(%table, purge, "dropped table");
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn rename_table(
    State(state): State<AppState>,
    Path(prefix): Path<String>,
    JsonBody(body): JsonBody<RenameTableRequest>,
) -> ApiResult<StatusCode> {
    check_prefix(&state, &prefix)?;
    let from = TableName::from_ident(&body.source)?;
    let to = TableName::from_ident(&body.destination)?;
    state.catalog.store().rename_table(&from, &to).await?;
    tracing::info!(%from, %to, "renamed table");
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn register_table(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
    JsonBody(body): JsonBody<RegisterTableRequest>,
) -> ApiResult<Response> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    let result = state.catalog.register(&namespace, body).await?;
    let tag = result.metadata_location.as_deref().map(|l| etag(l, "all"));
    Ok(json_response(
        StatusCode::OK,
        &table_json(&result)?,
        tag.as_deref(),
    ))
}

pub(super) async fn report_metrics(
    State(state): State<AppState>,
    Path((prefix, namespace, table)): Path<(String, String, String)>,
    JsonBody(_report): JsonBody<Value>,
) -> ApiResult<StatusCode> {
    let table = table_of(&state, &prefix, &namespace, &table)?;
    if state.catalog.store().table_pointer(&table).await?.is_none() {
        return Err(ApiError::no_such_table(&table));
    }
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------------------------------------
