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

use http::{HeaderMap, HeaderName};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::headers::{self, BadHeader};
use crate::queue::parse_positive_id;

pub const USER_HEADER: HeaderName = HeaderName::from_static("x-user-id");

/// A validated `[identity]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityConfig {
    Header,
    Jwt(JwtConfig),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    pub algorithms: Vec<Algorithm>,
    pub key: KeySource,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub user_claim: String,
    pub leeway_s: u64,
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

/// One verification key and what it may verify.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    algorithm: Option<Algorithm>,
    key: DecodingKey,
}

struct Keys {
    keys: Vec<Key>,
    modified: Option<SystemTime>,
}

pub struct Identity {
    config: IdentityConfig,
    keys: RwLock<Keys>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct Claims {
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
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
        })
    }

    pub fn is_jwt(&self) -> bool {
        matches!(self.config, IdentityConfig::Jwt(_))
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
        if token.len() > 8192 {
            return Err(IdentityError::Invalid("the token is too long"));
        }
        let invalid = IdentityError::Invalid("the token is not valid");
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid)?;
        if !cfg.algorithms.contains(&header.alg) {
            return Err(IdentityError::Invalid(
                "the token's algorithm is not accepted",
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = cfg.leeway_s;
        validation.validate_nbf = true;
        // A configured `iss` or `aud` must be present, not merely right when present: another
        // application's token from the same provider often omits `aud`.
        let mut required = vec!["exp"];
        if let Some(iss) = &cfg.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        match &cfg.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        let keys = self.keys.read();
        let candidates = keys.keys.iter().filter(|k| {
            k.algorithm.is_none_or(|a| a == header.alg)
                && match (&header.kid, &k.kid) {
                    (Some(want), Some(have)) => want == have,
                    (Some(_), None) | (None, _) => true,
                }
        });
        for k in candidates {
            if let Ok(data) = jsonwebtoken::decode::<Claims>(token, &k.key, &validation) {
                return user_claim(&data.claims, &cfg.user_claim);
            }
        }
        Err(invalid)
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

fn user_claim(claims: &Claims, name: &str) -> Result<u64, IdentityError> {
    let bad = IdentityError::Invalid("the token's user claim is not a positive integer");
    match claims.rest.get(name) {
        Some(serde_json::Value::String(s)) => parse_positive_id(s).ok_or(bad),
        Some(serde_json::Value::Number(n)) => n.as_u64().filter(|v| *v > 0).ok_or(bad),
        _ => Err(IdentityError::Invalid("the token has no user claim")),
    }
}

fn load(cfg: &JwtConfig) -> Result<Keys, String> {
    let (path, jwks) = match &cfg.key {
        KeySource::File(p) => (p, false),
        KeySource::Jwks(p) => (p, true),
    };
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let keys = if jwks {
        let set: JwkSet = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not a JWKS document: {e}", path.display()))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            // Only signature keys: `use` other than `sig`, or `key_ops` without `verify`, are
            // someone else's (encryption keys published in the same set).
            let for_signatures = jwk
                .common
                .public_key_use
                .as_ref()
                .is_none_or(|u| matches!(u, jsonwebtoken::jwk::PublicKeyUse::Signature))
                && jwk.common.key_operations.as_ref().is_none_or(|ops| {
                    ops.iter()
                        .any(|o| matches!(o, jsonwebtoken::jwk::KeyOperations::Verify))
                });
            if !for_signatures {
                continue;
            }
            if let jsonwebtoken::jwk::AlgorithmParameters::OctetKey(oct) = &jwk.algorithm {
                let len = base64::Engine::decode(
                    &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                    oct.value.trim_end_matches('='),
                )
                .map_or(0, |b| b.len());
                if len < 32 {
                    return Err(format!(
                        "{}: an HS256 key must be at least 32 bytes",
                        path.display()
                    ));
                }
            }
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| format!("{}: a key does not load: {e}", path.display()))?;
            let algorithm = jwk
                .common
                .key_algorithm
                .and_then(|a| a.to_string().parse::<Algorithm>().ok());
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                algorithm,
                key,
            });
        }
        keys
    } else {
        let mut keys = Vec::new();
        for alg in &cfg.algorithms {
            let key = match alg {
                Algorithm::HS256 => {
                    let secret = trim_secret(&bytes);
                    if secret.len() < 32 {
                        return Err(format!(
                            "{}: an HS256 secret must be at least 32 bytes",
                            path.display()
                        ));
                    }
                    DecodingKey::from_secret(secret)
                }
                Algorithm::RS256 => DecodingKey::from_rsa_pem(&bytes)
                    .map_err(|e| format!("{}: not an RSA public key: {e}", path.display()))?,
                Algorithm::ES256 => DecodingKey::from_ec_pem(&bytes)
                    .map_err(|e| format!("{}: not an EC public key: {e}", path.display()))?,
                other => return Err(format!("algorithm {other:?} is not supported")),
            };
            keys.push(Key {
                kid: None,
                algorithm: Some(*alg),
                key,
            });
        }
        keys
    };
    if keys.is_empty() {
        return Err(format!("{} holds no key", path.display()));
    }
    Ok(Keys { keys, modified })
}

/// A secret file's content without a trailing newline.
fn trim_secret(bytes: &[u8]) -> &[u8] {
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &bytes[..end]
}

/// Parses an algorithm name of `identity.algorithms`.
/// The algorithms `identity.algorithms` may name. Anything else (`none`, the 384/512 variants,
/// EdDSA) is a configuration error, and a token signed with it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JwtAlgorithm {
    HS256,
    RS256,
    ES256,
}

impl From<JwtAlgorithm> for Algorithm {
    fn from(a: JwtAlgorithm) -> Algorithm {
        match a {
            JwtAlgorithm::HS256 => Algorithm::HS256,
            JwtAlgorithm::RS256 => Algorithm::RS256,
            JwtAlgorithm::ES256 => Algorithm::ES256,
        }
    }
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

    #[test]
    fn user_claims() {
        let c = |v: serde_json::Value| Claims {
            rest: serde_json::json!({ "sub": v }).as_object().unwrap().clone(),
        };
        assert_eq!(user_claim(&c(serde_json::json!("42")), "sub"), Ok(42));
        assert_eq!(user_claim(&c(serde_json::json!(42)), "sub"), Ok(42));
        for bad in [
            serde_json::json!("0"),
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!("x"),
            serde_json::json!(1.5),
            serde_json::json!(null),
        ] {
            assert!(user_claim(&c(bad.clone()), "sub").is_err(), "{bad}");
        }
        assert!(user_claim(&c(serde_json::json!("1")), "uid").is_err());
    }

    #[test]
    fn secrets_lose_their_trailing_newline() {
        assert_eq!(trim_secret(b"abc\n"), b"abc");
        assert_eq!(trim_secret(b"abc\r\n"), b"abc");
        assert_eq!(trim_secret(b"abc"), b"abc");
    }
}
