//! What an `Idempotency-Key` means, apart from HTTP: a key names one request (its method,
//! path and body, hashed) for [`LIFETIME_MS`]; a replay of the same request gets the first
//! outcome and applies nothing, the same key with another request is a conflict.
//!
//! The HTTP layer (`api::layers`) only reads the header and buffers bodies; the rules live
//! here and in [`Catalog::seen`] / [`Catalog::remember`], so no route reaches the store for
//! them. A commit stores its outcome inside the pointer swap's own transaction
//! ([`IdempotencyContext::record`]), so a replay can never see a commit without its response.

use sha2::{Digest, Sha256};

use crate::error::ApiResult;
use crate::service::Catalog;
use crate::store::{IdempotencyRecord, StoredResponse};

/// How long a key is remembered, as advertised in `GET /v1/config` (ISO 8601).
pub const LIFETIME: &str = "PT30M";

/// [`LIFETIME`] in milliseconds.
pub const LIFETIME_MS: i64 = 30 * 60 * 1000;

/// The idempotency key of the request being served and the hash of its content.
#[derive(Debug, Clone)]
pub struct IdempotencyContext {
    /// The client's key.
    pub key: String,
    /// Hash of method, path and body.
    pub request_hash: String,
    /// When the record may be forgotten (ms since the epoch).
    pub expires_at_ms: i64,
}

/// What the catalog remembers of a key, for the request at hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not remembered (never used, or expired): serve the request.
    New,
    /// The same request was served: answer with its first outcome.
    Replay(StoredResponse),
    /// The key was used for a different request.
    Conflict,
}

impl IdempotencyContext {
    /// The context of a request under `key` received at `now_ms`.
    pub fn new(key: String, method: &str, uri: &str, body: &[u8], now_ms: i64) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update(b" ");
        hasher.update(uri.as_bytes());
        hasher.update(b"\n");
        hasher.update(body);
        Self {
            key,
            request_hash: format!("{:x}", hasher.finalize()),
            expires_at_ms: now_ms + LIFETIME_MS,
        }
    }

    /// The record of this request's outcome.
    pub fn record(&self, status: u16, body: String) -> IdempotencyRecord {
        IdempotencyRecord {
            key: self.key.clone(),
            response: StoredResponse {
                request_hash: self.request_hash.clone(),
                status,
                body,
            },
            expires_at_ms: self.expires_at_ms,
        }
    }
}

impl Catalog {
    /// Whether `context`'s key was used, and for this request or another one.
    pub async fn seen(&self, context: &IdempotencyContext, now_ms: i64) -> ApiResult<Seen> {
        Ok(match self.store().remembered(&context.key, now_ms).await? {
            None => Seen::New,
            Some(stored) if stored.request_hash == context.request_hash => Seen::Replay(stored),
            Some(_) => Seen::Conflict,
        })
    }

    /// Remembers the outcome of a request that did not store it itself (every mutation but a
    /// commit).
    pub async fn remember(
        &self,
        context: &IdempotencyContext,
        status: u16,
        body: String,
    ) -> ApiResult<()> {
        self.store().remember(&context.record(status, body)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_names_method_path_and_body() {
        let base = IdempotencyContext::new("k".into(), "POST", "/v1/a", b"{}", 0);
        let same = IdempotencyContext::new("k".into(), "POST", "/v1/a", b"{}", 99);
        assert_eq!(base.request_hash, same.request_hash);
        for other in [
            IdempotencyContext::new("k".into(), "DELETE", "/v1/a", b"{}", 0),
            IdempotencyContext::new("k".into(), "POST", "/v1/b", b"{}", 0),
            IdempotencyContext::new("k".into(), "POST", "/v1/a", b"{ }", 0),
        ] {
            assert_ne!(base.request_hash, other.request_hash);
        }
        assert_eq!(same.expires_at_ms, 99 + LIFETIME_MS);
    }
}
