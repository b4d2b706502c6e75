//! Authentication: static bearer tokens and OAuth2 client credentials.
//!
//! With auth off every request is served (and the server refuses to listen beyond loopback
//! unless told `--allow-anonymous`). With auth on, every `/v1` request except the token
//! endpoint must carry `Authorization: Bearer <token>`, where the token is one of the configured
//! static tokens or one this server issued at `POST /v1/oauth/tokens` for a configured client.
//! Issued tokens are stateless — `floe1.<client>.<expiry>.<hmac>` signed with the server's key —
//! so they survive restarts when the key is configured and work across catalog replicas that
//! share it. Secrets are compared in constant time and never logged.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// A secret string whose `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// An OAuth2 client allowed to obtain tokens.
#[derive(Debug, Clone)]
pub struct Client {
    /// The client id.
    pub id: String,
    /// The client secret.
    pub secret: Secret,
}

/// The authentication settings.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Vec<Secret>,
    clients: Vec<Client>,
    signing_key: Secret,
    token_ttl_secs: u64,
}

/// An issued access token.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// The bearer token.
    pub access_token: String,
    /// Seconds until it expires.
    pub expires_in: u64,
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (digest(a), digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl Auth {
    /// Auth with static `tokens` and OAuth2 `clients`. Without a `signing_key` a random one is
    /// generated, so issued tokens then last only as long as this process.
    pub fn new(
        tokens: Vec<Secret>,
        clients: Vec<Client>,
        signing_key: Option<Secret>,
        token_ttl_secs: u64,
    ) -> Self {
        let signing_key = signing_key.unwrap_or_else(|| {
            let bytes: [u8; 32] = rand::random();
            Secret(URL_SAFE_NO_PAD.encode(bytes))
        });
        Self {
            tokens,
            clients,
            signing_key,
            token_ttl_secs,
        }
    }

    /// Whether any credential is configured (otherwise auth is off).
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty() || !self.clients.is_empty()
    }

    /// Whether OAuth2 client credentials are configured (the token endpoint is served).
    pub fn has_clients(&self) -> bool {
        !self.clients.is_empty()
    }

    fn sign(&self, payload: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.signing_key.0.as_bytes())
            .expect("HMAC takes keys of any length");
        mac.update(payload.as_bytes());
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// Issues a token for a client whose id and secret match, else `None`.
    pub fn issue(&self, client_id: &str, client_secret: &str) -> Option<IssuedToken> {
        let known = self
            .clients
            .iter()
            .any(|c| c.id == client_id && same_secret(&c.secret.0, client_secret));
        if !known {
            return None;
        }
        let expiry = now_secs() + self.token_ttl_secs;
        let payload = format!("floe1.{}.{expiry}", URL_SAFE_NO_PAD.encode(client_id));
        let signature = self.sign(&payload);
        Some(IssuedToken {
            access_token: format!("{payload}.{signature}"),
            expires_in: self.token_ttl_secs,
        })
    }

    /// Whether a bearer token is a configured static token or a valid issued one.
    pub fn accepts(&self, token: &str) -> bool {
        if self.tokens.iter().any(|t| same_secret(&t.0, token)) {
            return true;
        }
        let Some((payload, signature)) = token.rsplit_once('.') else {
            return false;
        };
        let mut parts = payload.split('.');
        let (Some("floe1"), Some(client), Some(expiry), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        if !same_secret(&self.sign(payload), signature) {
            return false;
        }
        let still_valid = expiry.parse::<u64>().is_ok_and(|e| e > now_secs());
        // A client removed from the config loses its tokens at once.
        let client_known = URL_SAFE_NO_PAD
            .decode(client)
            .ok()
            .and_then(|id| String::from_utf8(id).ok())
            .is_some_and(|id| self.clients.iter().any(|c| c.id == id));
        still_valid && client_known
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(ttl: u64) -> Auth {
        Auth::new(
            vec![Secret("static-token".into())],
            vec![Client {
                id: "floe".into(),
                secret: Secret("s3cret".into()),
            }],
            Some(Secret("key".into())),
            ttl,
        )
    }

    #[test]
    fn static_and_issued_tokens_are_accepted_and_forgeries_are_not() {
        let auth = auth(3600);
        assert!(auth.enabled());
        assert!(auth.accepts("static-token"));
        assert!(!auth.accepts("static-token2"));
        assert!(auth.issue("floe", "wrong").is_none());
        assert!(auth.issue("other", "s3cret").is_none());
        let token = auth.issue("floe", "s3cret").unwrap();
        assert_eq!(token.expires_in, 3600);
        assert!(auth.accepts(&token.access_token));
        // Tampering with the expiry breaks the signature.
        let mut parts: Vec<&str> = token.access_token.split('.').collect();
        let later = (now_secs() + 999_999).to_string();
        parts[2] = &later;
        assert!(!auth.accepts(&parts.join(".")));
        // Another server key does not accept it.
        let other = Auth::new(vec![], auth.clients.clone(), Some(Secret("k2".into())), 60);
        assert!(!other.accepts(&token.access_token));
    }

    #[test]
    fn expired_tokens_are_refused() {
        let auth = auth(0);
        let token = auth.issue("floe", "s3cret").unwrap();
        assert!(!auth.accepts(&token.access_token));
    }

    #[test]
    fn secrets_do_not_show_in_debug_output() {
        let printed = format!("{:?}", auth(60));
        assert!(
            !printed.contains("s3cret") && !printed.contains("static-token"),
            "{printed}"
        );
    }
}
