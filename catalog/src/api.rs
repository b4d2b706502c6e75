//! The HTTP surface: the Iceberg REST catalog routes, `/healthz`, `/metrics`, and the
//! middleware for authentication, idempotency keys and request metrics.
//!
//! Every route listed in [`ENDPOINTS`] is served and advertised in `GET /v1/config`, and
//! nothing else is advertised. Request bodies are parsed by [`JsonBody`], which turns any
//! malformed JSON or unknown requirement / update type into a spec-shaped 400 before a handler
//! runs, so a malformed request can never change state.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{FromRequest, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use iceberg::{TableIdent, TableRequirement, TableUpdate};
use iceberg_catalog_rest::{
    CommitTableRequest, CreateTableRequest, LoadTableResult, RegisterTableRequest,
    RenameTableRequest,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::auth::Auth;
use crate::error::{ApiError, ApiResult, ErrorType};
use crate::ident::{Namespace, TableName};
use crate::metadata_json;
use crate::metrics::Metrics;
use crate::service::{Catalog, Committed, IdempotencyContext, TableChange, load_result};
use crate::store::{IdempotencyRecord, StoredResponse};

/// The endpoints this server serves, exactly as advertised in `GET /v1/config`.
pub const ENDPOINTS: &[&str] = &[
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/register",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
    "POST /v1/{prefix}/tables/rename",
    "POST /v1/{prefix}/transactions/commit",
];

/// How long a response is remembered under an `Idempotency-Key`, as advertised (ISO 8601).
pub const IDEMPOTENCY_LIFETIME: &str = "PT30M";
const IDEMPOTENCY_LIFETIME_MS: i64 = 30 * 60 * 1000;

/// Request bodies larger than this are refused (commits of wide schemas stay far below).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Everything a handler needs.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The catalog operations.
    pub catalog: Catalog,
    /// The URL prefix (the catalog's name).
    pub prefix: String,
    /// Authentication settings.
    pub auth: Arc<Auth>,
    /// Metrics.
    pub metrics: Metrics,
}

/// Builds the router.
pub fn router(state: AppState) -> Router {
    let catalog_routes = Router::new()
        .route(
            "/v1/{prefix}/namespaces",
            get(list_namespaces).post(create_namespace),
        )
        .route(
            "/v1/{prefix}/namespaces/{namespace}",
            get(load_namespace)
                .head(head_namespace)
                .delete(drop_namespace),
        )
        .route(
            "/v1/{prefix}/namespaces/{namespace}/properties",
            post(update_namespace_properties),
        )
        .route(
            "/v1/{prefix}/namespaces/{namespace}/tables",
            get(list_tables).post(create_table),
        )
        .route(
            "/v1/{prefix}/namespaces/{namespace}/tables/{table}",
            get(load_table)
                .head(head_table)
                .post(commit_table)
                .delete(drop_table),
        )
        .route(
            "/v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics",
            post(report_metrics),
        )
        .route(
            "/v1/{prefix}/namespaces/{namespace}/register",
            post(register_table),
        )
        .route("/v1/{prefix}/tables/rename", post(rename_table))
        .route("/v1/{prefix}/transactions/commit", post(commit_transaction))
        .route("/v1/config", get(config))
        .layer(middleware::from_fn_with_state(state.clone(), idempotency))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .merge(catalog_routes)
        .route("/v1/oauth/tokens", post(issue_token))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// A JSON request body whose parse errors become spec-shaped 400 responses.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("malformed request body: {e}")))
    }
}

fn check_prefix(state: &AppState, prefix: &str) -> ApiResult<()> {
    if prefix == state.prefix {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorType::NotFound,
            format!(
                "this server has no warehouse {prefix:?}; it serves {:?}",
                state.prefix
            ),
        ))
    }
}

fn namespace_of(state: &AppState, prefix: &str, namespace: &str) -> ApiResult<Namespace> {
    check_prefix(state, prefix)?;
    Namespace::from_url(namespace)
}

fn table_of(state: &AppState, prefix: &str, namespace: &str, table: &str) -> ApiResult<TableName> {
    TableName::new(namespace_of(state, prefix, namespace)?, table.to_string())
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorType::NotFound, "no such route")
}

// ---------------------------------------------------------------------------------------------
// Config, health, metrics

async fn config(State(state): State<AppState>) -> Json<Value> {
    let mut overrides = HashMap::new();
    overrides.insert("prefix".to_string(), state.prefix.clone());
    Json(json!({
        "defaults": state.catalog.warehouse().client_config(),
        "overrides": overrides,
        "endpoints": ENDPOINTS,
        "idempotency-key-lifetime": IDEMPOTENCY_LIFETIME,
    }))
}

async fn healthz(State(state): State<AppState>) -> Response {
    match state.catalog.store().ping().await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------------
// Namespaces

/// Cuts a sorted listing into a page when the client asked for paging.
fn paginate<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> String,
    query: &HashMap<String, String>,
) -> ApiResult<(Vec<T>, Option<Option<String>>)> {
    let token = query.get("pageToken");
    let size = match query.get("pageSize") {
        Some(s) => Some(s.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::bad_request(format!("pageSize {s:?} is not a positive number"))
        })?),
        None => None,
    };
    if token.is_none() && size.is_none() {
        return Ok((items, None));
    }
    let after = match token.map(String::as_str) {
        None | Some("") => None,
        Some(t) => Some(
            URL_SAFE_NO_PAD
                .decode(t)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| ApiError::bad_request("pageToken is not one this server issued"))?,
        ),
    };
    let size = size.unwrap_or(100);
    let mut rest: Vec<T> = items
        .into_iter()
        .filter(|item| after.as_ref().is_none_or(|a| key(item) > *a))
        .collect();
    let more = rest.len() > size;
    rest.truncate(size);
    let next = if more {
        rest.last().map(|last| URL_SAFE_NO_PAD.encode(key(last)))
    } else {
        None
    };
    Ok((rest, Some(next)))
}

fn with_page_token(mut body: Value, next: Option<Option<String>>) -> Value {
    if let Some(next) = next {
        body["next-page-token"] = json!(next);
    }
    body
}

async fn list_namespaces(
    State(state): State<AppState>,
    Path(prefix): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_prefix(&state, &prefix)?;
    let parent = match query.get("parent").filter(|p| !p.is_empty()) {
        Some(p) => Some(Namespace::from_url(p)?),
        None => None,
    };
    let all = state.catalog.store().list_namespaces().await?;
    if let Some(parent) = &parent
        && !all.contains(parent)
    {
        return Err(ApiError::no_such_namespace(parent));
    }
    let children: Vec<Namespace> = all
        .into_iter()
        .filter(|ns| ns.is_child_of(parent.as_ref()))
        .collect();
    let (page, next) = paginate(children, |ns| ns.stored(), &query)?;
    let namespaces: Vec<&[String]> = page.iter().map(Namespace::parts).collect();
    Ok(Json(with_page_token(
        json!({ "namespaces": namespaces }),
        next,
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateNamespaceBody {
    namespace: Vec<String>,
    #[serde(default)]
    properties: HashMap<String, String>,
}

async fn create_namespace(
    State(state): State<AppState>,
    Path(prefix): Path<String>,
    JsonBody(body): JsonBody<CreateNamespaceBody>,
) -> ApiResult<Json<Value>> {
    check_prefix(&state, &prefix)?;
    let namespace = Namespace::from_parts(body.namespace)?;
    state
        .catalog
        .store()
        .create_namespace(&namespace, &body.properties)
        .await?;
    tracing::info!(%namespace, "created namespace");
    Ok(Json(json!({
        "namespace": namespace.parts(),
        "properties": body.properties,
    })))
}

async fn load_namespace(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    let mut properties = state.catalog.namespace_properties(&namespace).await?;
    // Report where the namespace's tables go, as Hive-style catalogs do. Trino needs this to
    // choose a table location and create through stage-create.
    properties
        .entry("location".to_string())
        .or_insert_with(|| state.catalog.warehouse().namespace_location(&namespace));
    Ok(Json(json!({
        "namespace": namespace.parts(),
        "properties": properties,
    })))
}

async fn head_namespace(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    state.catalog.namespace_properties(&namespace).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn drop_namespace(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    state.catalog.store().drop_namespace(&namespace).await?;
    tracing::info!(%namespace, "dropped namespace");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdatePropertiesBody {
    #[serde(default)]
    removals: Vec<String>,
    #[serde(default)]
    updates: HashMap<String, String>,
}

async fn update_namespace_properties(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
    JsonBody(body): JsonBody<UpdatePropertiesBody>,
) -> ApiResult<Json<Value>> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    if let Some(both) = body.removals.iter().find(|k| body.updates.contains_key(*k)) {
        return Err(ApiError::new(
            ErrorType::Unprocessable,
            format!("property {both:?} is both removed and updated"),
        ));
    }
    let before = state.catalog.namespace_properties(&namespace).await?;
    state
        .catalog
        .store()
        .update_namespace_properties(&namespace, &body.removals, &body.updates)
        .await?;
    let (removed, missing): (Vec<&String>, Vec<&String>) =
        body.removals.iter().partition(|k| before.contains_key(*k));
    let updated: Vec<&String> = body.updates.keys().collect();
    Ok(Json(
        json!({ "updated": updated, "removed": removed, "missing": missing }),
    ))
}

// ---------------------------------------------------------------------------------------------
// Tables

async fn list_tables(
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

fn etag(metadata_location: &str, mode: &str) -> String {
    let hash = Sha256::digest(format!("{metadata_location}\n{mode}").as_bytes());
    format!("\"{}\"", URL_SAFE_NO_PAD.encode(&hash[..18]))
}

/// A table's load result as JSON, its metadata's lists in commit order.
fn table_json(result: &LoadTableResult) -> ApiResult<Value> {
    let mut body = serde_json::to_value(result)
        .map_err(|e| ApiError::internal(format!("could not encode table metadata: {e}")))?;
    metadata_json::order(&mut body["metadata"]);
    Ok(body)
}

fn json_response(status: StatusCode, body: &impl Serialize, etag: Option<&str>) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Some(tag) = etag.and_then(|t| HeaderValue::from_str(t).ok()) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    response
}

async fn create_table(
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
fn keep_ref_snapshots(metadata: &mut Value) {
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

async fn load_table(
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

async fn head_table(
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
struct CommitBody {
    #[serde(default)]
    identifier: Option<TableIdent>,
    requirements: Vec<TableRequirement>,
    updates: Vec<TableUpdate>,
}

fn commit_response(committed: &[Committed]) -> (u16, String) {
    let body = committed.first().map(|c| {
        let mut metadata = serde_json::to_value(&*c.metadata).unwrap_or_default();
        metadata_json::order(&mut metadata);
        json!({ "metadata-location": c.metadata_location, "metadata": metadata }).to_string()
    });
    (200, body.unwrap_or_default())
}

/// A response that the handler already stored under its idempotency key (in the commit's own
/// transaction), so the middleware must not store it again.
#[derive(Debug, Clone, Copy)]
struct AlreadyRemembered;

fn stored_response(status: u16, body: String, remembered: bool) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = if body.is_empty() {
        status.into_response()
    } else {
        (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    };
    if remembered {
        response.extensions_mut().insert(AlreadyRemembered);
    }
    response
}

async fn commit_table(
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
struct TransactionBody {
    #[serde(rename = "table-changes")]
    table_changes: Vec<CommitTableRequest>,
}

async fn commit_transaction(
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

async fn drop_table(
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

async fn rename_table(
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

async fn register_table(
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

async fn report_metrics(
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
// OAuth2 token endpoint

#[derive(Deserialize)]
struct TokenRequest {
    grant_type: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

async fn issue_token(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if !state.auth.has_clients() {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "this catalog has no OAuth2 clients configured",
        );
    }
    let Ok(mut request) = serde_urlencoded::from_bytes::<TokenRequest>(&body) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "expected a form body",
        );
    };
    if request.grant_type.as_deref() != Some("client_credentials") {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "only client_credentials is supported",
        );
    }
    // Credentials may come as HTTP Basic auth instead of form fields (RFC 6749 §2.3.1).
    if let Some((id, secret)) = basic_credentials(&headers) {
        request.client_id.get_or_insert(id);
        request.client_secret.get_or_insert(secret);
    }
    let (Some(id), Some(secret)) = (request.client_id, request.client_secret) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "client_id and client_secret are required",
        );
    };
    match state.auth.issue(&id, &secret) {
        Some(token) => Json(json!({
            "access_token": token.access_token,
            "token_type": "bearer",
            "expires_in": token.expires_in,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }))
        .into_response(),
        None => {
            tracing::warn!(client_id = %id, "refused token request with bad client credentials");
            oauth_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "unknown client or wrong secret",
            )
        }
    }
}

fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    Some((id.to_string(), secret.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Middleware

async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if !state.auth.enabled() {
        return next.run(request).await;
    }
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(token) if state.auth.accepts(token.trim()) => next.run(request).await,
        _ => ApiError::new(ErrorType::NotAuthorized, "a valid bearer token is required")
            .into_response(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Honours `Idempotency-Key` on mutations: a replay of a remembered request gets the first
/// response and applies nothing; the same key with a different request gets 422. Commits store
/// their response in the swap's own transaction; other mutations are remembered here.
async fn idempotency(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mutation = matches!(*request.method(), Method::POST | Method::DELETE);
    let Some(key) = key.filter(|_| mutation) else {
        return next.run(request).await;
    };
    if key.is_empty() || key.len() > 255 {
        return ApiError::bad_request("Idempotency-Key must have 1 to 255 characters")
            .into_response();
    }
    let (parts, body) = request.into_parts();
    let bytes = match to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(format!("could not read the request body: {e}"))
                .into_response();
        }
    };
    let mut hasher = Sha256::new();
    hasher.update(parts.method.as_str().as_bytes());
    hasher.update(b" ");
    hasher.update(parts.uri.to_string().as_bytes());
    hasher.update(b"\n");
    hasher.update(&bytes);
    let request_hash = format!("{:x}", hasher.finalize());
    let now = now_ms();
    match state.catalog.store().remembered(&key, now).await {
        Ok(Some(stored)) if stored.request_hash == request_hash => {
            tracing::debug!(%key, "replaying idempotent response");
            return stored_response(stored.status, stored.body, true);
        }
        Ok(Some(_)) => {
            return ApiError::new(
                ErrorType::Unprocessable,
                "this Idempotency-Key was already used for a different request",
            )
            .into_response();
        }
        Ok(None) => {}
        Err(e) => return e.into_response(),
    }
    let context = IdempotencyContext {
        key: key.clone(),
        request_hash: request_hash.clone(),
        expires_at_ms: now + IDEMPOTENCY_LIFETIME_MS,
    };
    let mut request = Request::from_parts(parts, Body::from(bytes));
    request.extensions_mut().insert(context.clone());
    let response = next.run(request).await;
    // A 5xx may be retried with the same key and must then run again.
    if response.extensions().get::<AlreadyRemembered>().is_some()
        || response.status().is_server_error()
    {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = match to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::internal(format!("could not buffer the response: {e}"))
                .into_response();
        }
    };
    let record = IdempotencyRecord {
        key,
        response: StoredResponse {
            request_hash,
            status: parts.status.as_u16(),
            body: String::from_utf8_lossy(&bytes).into_owned(),
        },
        expires_at_ms: context.expires_at_ms,
    };
    if let Err(error) = state.catalog.store().remember(&record).await {
        tracing::warn!(%error, "could not remember an idempotent response");
    }
    Response::from_parts(parts, Body::from(bytes))
}

async fn count_requests(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let response = next.run(request).await;
    state
        .metrics
        .requests
        .with_label_values(&[&method, &route, response.status().as_str()])
        .inc();
    response
}
