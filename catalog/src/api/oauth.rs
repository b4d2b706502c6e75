//! `POST /v1/oauth/tokens`: client-credentials tokens, answered in OAuth2's error shape.

use super::*;

#[derive(Deserialize)]
pub(super) struct TokenRequest {
    grant_type: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
}

pub(super) fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

pub(super) async fn issue_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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

pub(super) fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
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
