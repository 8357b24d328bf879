//! Who the user is (`[identity]`). Every per-user decision (queue position, token, rollout bucket,
//! the gate's user match) hangs on it, so the source is explicit:
//!
//! - `header` (default): `X-User-Id` as the request carries it. This trusts whatever sits in
//!   front: the load balancer must set it from the authenticated session and drop client copies
//!   (the shipped `docker/nginx.conf` does). Without that, a client can be anyone.
//! - `jwt`: `Authorization: Bearer <JWT>` verified here (HS256, RS256 or ES256; `exp` required,
//!   `nbf`, `iss` and `aud` checked; `alg: none` and algorithms not configured are refused), the
//!   user id taken from a configured claim (a positive integer). A client's `X-User-Id` is
//!   dropped and the verified id is what the backend receives.
//!
//! Keys come from a PEM file (or a raw secret file for HS256) or a JWKS file, and are reloaded
//! when the file changes (checked every second by the store-independent `KeyWatcher`); a file
//! that no longer parses keeps the previous keys and is logged.

use parking_lot::RwLock;
use std::path::PathBuf;
use std::time::SystemTime;

use http::HeaderMap;

use crate::headers::{self, BadHeader};
use crate::queue::parse_positive_id;

mod jwt;
mod keys;

use keys::Key;

pub use crate::headers::USER_HEADER;

/// A validated `[identity]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityConfig {
    Header,
    Jwt(JwtConfig),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    pub algorithms: Vec<JwtAlgorithm>,
    pub key: KeySource,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub user_claim: String,
    pub leeway_s: u64,
    /// Refuse high-`s` ES256 signatures (`identity.es256_low_s_only`).
    pub es256_low_s_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A PEM public key (RS256, ES256) or a file holding the HS256 secret.
    File(PathBuf),
    /// A JWKS document (`{"keys": [...]}`), keys picked by `kid`.
    Jwks(PathBuf),
}

/// Why a request has no usable identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityError {
    /// Nothing was presented.
    Missing,
    /// Something was presented and is not acceptable (bad header, bad or expired token).
    Invalid(&'static str),
}

struct Keys {
    keys: Vec<Key>,
    modified: Option<SystemTime>,
}

pub struct Identity {
    config: IdentityConfig,
    keys: RwLock<Keys>,
    /// Recently verified (or refused) bearer tokens (`jwt.rs`).
    cache: jwt::Cache,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads the keys (for `jwt`); an unreadable or empty key file is an error at start.
    pub fn new(config: IdentityConfig) -> Result<Identity, String> {
        let keys = match &config {
            IdentityConfig::Header => Keys {
                keys: Vec::new(),
                modified: None,
            },
            IdentityConfig::Jwt(j) => load(j)?,
        };
        Ok(Identity {
            config,
            keys: RwLock::new(keys),
            cache: jwt::Cache::default(),
        })
    }

    pub fn is_jwt(&self) -> bool {
        matches!(self.config, IdentityConfig::Jwt(_))
    }

    /// An identity as resolved, or the answer a client gets when there is none (the one place
    /// that maps it): 400 for a missing or bad `X-User-Id` (header mode), 401 for a missing or
    /// invalid bearer token (jwt mode).
    pub fn required(
        &self,
        identity: Result<u64, IdentityError>,
    ) -> Result<u64, crate::error::ApiError> {
        use crate::error::ApiError;
        match (identity, self.is_jwt()) {
            (Ok(user), _) => Ok(user),
            (Err(IdentityError::Missing), false) => Err(ApiError::BadRequest(
                "exactly one X-User-Id header is required",
            )),
            (Err(IdentityError::Invalid(why)), false) => Err(ApiError::BadRequest(why)),
            (Err(IdentityError::Missing), true) => {
                Err(ApiError::Unauthorized("a bearer token is required"))
            }
            (Err(IdentityError::Invalid(why)), true) => Err(ApiError::Unauthorized(why)),
        }
    }

    /// The request's user.
    pub fn user(&self, headers: &HeaderMap) -> Result<u64, IdentityError> {
        match &self.config {
            IdentityConfig::Header => from_header(headers),
            IdentityConfig::Jwt(j) => self.verify_jwt(j, headers),
        }
    }

    fn verify_jwt(&self, cfg: &JwtConfig, headers: &HeaderMap) -> Result<u64, IdentityError> {
        let value = match headers::single(headers, http::header::AUTHORIZATION) {
            Ok(Some(v)) => v,
            Ok(None) => return Err(IdentityError::Missing),
            Err(BadHeader::Repeated) => {
                return Err(IdentityError::Invalid("more than one Authorization header"))
            }
            Err(BadHeader::NotAscii) => {
                return Err(IdentityError::Invalid("Authorization is not ASCII"))
            }
        };
        let token = match value.split_once(' ') {
            Some((scheme, t)) if scheme.eq_ignore_ascii_case("bearer") => t.trim(),
            _ => {
                return Err(IdentityError::Invalid(
                    "Authorization is not a Bearer token",
                ))
            }
        };
        let now_s = crate::clock::now().epoch_ms / 1000;
        let keys = self.keys.read();
        jwt::verify(cfg, &keys.keys, &self.cache, token, now_s)
    }

    /// Reloads the key file when it changed since the last load. Returns whether keys changed.
    pub fn reload_if_changed(&self) -> bool {
        let IdentityConfig::Jwt(cfg) = &self.config else {
            return false;
        };
        let path = match &cfg.key {
            KeySource::File(p) | KeySource::Jwks(p) => p,
        };
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let current = self.keys.read().modified;
        if modified.is_none() || modified == current {
            return false;
        }
        match load(cfg) {
            Ok(keys) => {
                let n = keys.keys.len();
                *self.keys.write() = keys;
                // A token verified by a key that is gone must not pass from the cache.
                self.cache.clear();
                tracing::info!(path = %path.display(), keys = n, "identity keys reloaded");
                true
            }
            Err(e) => {
                // Keep the previous keys; do not try the same broken file again until it changes.
                self.keys.write().modified = modified;
                tracing::warn!(path = %path.display(), error = %e, "identity keys not reloaded; keeping the previous ones");
                false
            }
        }
    }
}

fn from_header(headers: &HeaderMap) -> Result<u64, IdentityError> {
    let value = match headers::single(headers, USER_HEADER) {
        Ok(Some(v)) => Some(v),
        Ok(None) => return Err(IdentityError::Missing),
        Err(BadHeader::Repeated) => {
            return Err(IdentityError::Invalid(
                "exactly one X-User-Id header is required",
            ))
        }
        Err(BadHeader::NotAscii) => None,
    };
    value
        .and_then(parse_positive_id)
        .ok_or(IdentityError::Invalid(
            "X-User-Id must be a positive integer",
        ))
}

fn load(cfg: &JwtConfig) -> Result<Keys, String> {
    let (path, jwks) = match &cfg.key {
        KeySource::File(p) => (p, false),
        KeySource::Jwks(p) => (p, true),
    };
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let in_file = |e: String| format!("{}: {e}", path.display());
    let keys = if jwks {
        keys::from_jwks(&bytes).map_err(in_file)?
    } else {
        cfg.algorithms
            .iter()
            .map(|alg| keys::from_file(&bytes, *alg).map_err(in_file))
            .collect::<Result<Vec<Key>, String>>()?
    };
    if keys.is_empty() {
        return Err(format!("{} holds no key", path.display()));
    }
    Ok(Keys { keys, modified })
}

/// The algorithms `identity.algorithms` may name. Anything else (`none`, the 384/512 variants,
/// EdDSA) is a configuration error, and a token signed with it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JwtAlgorithm {
    HS256,
    RS256,
    ES256,
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_util::headers as h;

    #[test]
    fn header_mode_is_strict() {
        let id = Identity::new(IdentityConfig::Header).unwrap();
        assert_eq!(id.user(&h(&[("x-user-id", "1001")])), Ok(1001));
        assert_eq!(id.user(&h(&[])), Err(IdentityError::Missing));
        for bad in ["0", "01", "+1", "abc", " 1", "-5"] {
            assert!(matches!(
                id.user(&h(&[("x-user-id", bad)])),
                Err(IdentityError::Invalid(_))
            ));
        }
        let two = h(&[("x-user-id", "1"), ("x-user-id", "2")]);
        assert!(matches!(id.user(&two), Err(IdentityError::Invalid(_))));
    }
}
