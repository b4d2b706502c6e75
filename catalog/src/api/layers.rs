//! The middleware around every route: authentication, `Idempotency-Key` replay (a commit
//! handler stores its own response in the commit's transaction and marks it
//! [`AlreadyRemembered`]), and request counting.

use super::*;

/// A response that the handler already stored under its idempotency key (in the commit's own
/// transaction), so the middleware must not store it again.
#[derive(Debug, Clone, Copy)]
pub(super) struct AlreadyRemembered;

pub(super) fn stored_response(status: u16, body: String, remembered: bool) -> Response {
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

pub(super) async fn authenticate(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
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

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Honours `Idempotency-Key` on mutations ([`crate::idempotency`]): a replay gets the first
/// response and applies nothing; the same key with a different request gets 422. Commits store
/// their response in the swap's own transaction; other mutations are remembered here.
pub(super) async fn idempotency(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
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
    let now = now_ms();
    let context = IdempotencyContext::new(
        key,
        parts.method.as_str(),
        &parts.uri.to_string(),
        &bytes,
        now,
    );
    match state.catalog.seen(&context, now).await {
        Ok(Seen::New) => {}
        Ok(Seen::Replay(stored)) => {
            tracing::debug!(key = %context.key, "replaying idempotent response");
            return stored_response(stored.status, stored.body, true);
        }
        Ok(Seen::Conflict) => {
            return ApiError::new(
                ErrorType::Unprocessable,
                "this Idempotency-Key was already used for a different request",
            )
            .into_response();
        }
        Err(e) => return e.into_response(),
    }
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
    let body = String::from_utf8_lossy(&bytes).into_owned();
    if let Err(error) = state
        .catalog
        .remember(&context, parts.status.as_u16(), body)
        .await
    {
        tracing::warn!(%error, "could not remember an idempotent response");
    }
    Response::from_parts(parts, Body::from(bytes))
}

pub(super) async fn count_requests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
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
