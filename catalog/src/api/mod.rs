//! The HTTP surface: the Iceberg REST catalog routes, `/healthz`, `/metrics`, the status
//! pages ([`pages`]: `/` and `/tables/…`, not REST routes, so not advertised), and the
//! middleware for authentication, idempotency keys and request metrics.
//!
//! Every route listed in [`ENDPOINTS`] is served and advertised in `GET /v1/config`, and
//! nothing else is advertised. Request bodies are parsed by [`JsonBody`], which turns any
//! malformed JSON or unknown requirement / update type into a spec-shaped 400 before a handler
//! runs, so a malformed request can never change state.
//!
//! This module holds the router, the shared extractors and response helpers, and the
//! service routes (`config`, `healthz`, `metrics`); the routes live by resource in
//! [`namespaces`] and [`tables`], the token endpoint in [`oauth`], and the layers every route
//! passes through (authentication, idempotency, request counting) in [`layers`].

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
use crate::idempotency::{self, IdempotencyContext, Seen};
use crate::ident::{Namespace, TableName};
use crate::metadata_json;
use crate::metrics::Metrics;
use crate::service::{Catalog, Committed, TableChange, load_result};

mod layers;
mod namespaces;
mod oauth;
mod pages;
mod tables;

use layers::*;
use namespaces::*;
use oauth::*;
use tables::*;

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
        .route("/", get(pages::home))
        .route("/tables/{namespace}/{table}", get(pages::table_page))
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
        "idempotency-key-lifetime": idempotency::LIFETIME,
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
