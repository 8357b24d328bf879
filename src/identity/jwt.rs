//! Verifying a bearer JWT (`identity.mode = "jwt"`) with `ring`, at a bounded cost per request.
//!
//! What an attacker controls is the token, so the work it can cause is bounded before any
//! signature is checked:
//! - a token at most `MAX_TOKEN_LEN` bytes, three strict base64url parts;
//! - one key tried at most: a token must name its key (`kid`) when several could verify it;
//! - a token seen lately is answered from a cache keyed by the whole token (a client sends the
//!   same token with every request), and so is a token whose signature failed;
//! - an ES256 signature has two spellings (`s` and `n - s`): the cache knows a token by its
//!   low-`s` spelling, so the twin of a token costs nothing more, and with
//!   `identity.es256_low_s_only` the high spelling is refused (for issuers that never sign with
//!   one; OpenSSL-based signers, most identity providers, do half the time).
//!
//! The claims are checked as `identity` configures: `exp` required, `nbf` when present (both with
//! `leeway_s`), `iss` a string (and the configured one, when set), `aud` the configured one when
//! set (a string, or an array of strings holding it), the user claim a positive integer.

use std::collections::HashMap;

use base64::Engine as _;
use parking_lot::Mutex;

use super::keys::{Key, Material};
use super::{IdentityError, JwtAlgorithm, JwtConfig};
use crate::token::B64;

/// Longer bearer tokens are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8192;

/// How long a verified token is answered from the cache (at most until it expires).
const CACHE_FOR_S: u64 = 60;

/// Tokens the cache holds at most; past it, expired entries go, then everything.
const CACHE_ENTRIES: usize = 65_536;

/// Half the order of P-256, big-endian: a valid ES256 signature's `s` is at most this.
const P256_HALF_ORDER: [u8; 32] = [
    0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31, 0x92, 0xa8,
];

const INVALID: IdentityError = IdentityError::Invalid("the token is not valid");

/// Recently seen tokens: the user a valid one names, or the refusal of one whose signature did
/// not verify, and until when (epoch seconds).
#[derive(Default)]
pub struct Cache {
    entries: Mutex<HashMap<String, Cached, ahash::RandomState>>,
}

/// A token's answer and until when it holds (epoch seconds).
type Cached = (Result<u64, IdentityError>, u64);

impl Cache {
    pub fn clear(&self) {
        self.entries.lock().clear();
    }

    fn get(&self, token: &str, now_s: u64) -> Option<Result<u64, IdentityError>> {
        let entries = self.entries.lock();
        let (answer, until) = entries.get(token)?;
        (*until > now_s).then_some(*answer)
    }

    fn put(&self, token: &str, answer: Result<u64, IdentityError>, until: u64, now_s: u64) {
        let mut entries = self.entries.lock();
        if entries.len() >= CACHE_ENTRIES {
            entries.retain(|_, (_, u)| *u > now_s);
            if entries.len() >= CACHE_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(token.to_string(), (answer, until));
    }
}

#[derive(serde::Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    /// Extensions the token says must be understood: none is, so such a token is refused.
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// The user a bearer token names, verified against `keys`.
pub fn verify(
    cfg: &JwtConfig,
    keys: &[Key],
    cache: &Cache,
    token: &str,
    now_s: u64,
) -> Result<u64, IdentityError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(IdentityError::Invalid("the token is too long"));
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(claims_b64), Some(sig_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(INVALID);
    };
    let signature = B64.decode(sig_b64).map_err(|_| INVALID)?;
    // Only a 64-byte ES256 signature has a second spelling.
    let low_s = low_s_spelling(&signature);
    if low_s.is_some() && cfg.es256_low_s_only {
        return Err(IdentityError::Invalid(
            "the token's signature is not in low-s form",
        ));
    }
    let cache_key: std::borrow::Cow<'_, str> = match &low_s {
        Some(low) => format!("{header_b64}.{claims_b64}.{}", B64.encode(low)).into(),
        None => token.into(),
    };
    if let Some(answer) = cache.get(&cache_key, now_s) {
        return answer;
    }
    let header: Header = B64
        .decode(header_b64)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or(INVALID)?;
    if header.crit.is_some() {
        return Err(INVALID);
    }
    let alg = match header.alg.as_str() {
        "HS256" => JwtAlgorithm::HS256,
        "RS256" => JwtAlgorithm::RS256,
        "ES256" => JwtAlgorithm::ES256,
        _ => {
            return Err(IdentityError::Invalid(
                "the token's algorithm is not accepted",
            ))
        }
    };
    if !cfg.algorithms.contains(&alg) {
        return Err(IdentityError::Invalid(
            "the token's algorithm is not accepted",
        ));
    }
    let key = pick_key(keys, alg, header.kid.as_deref())?;
    let signed = &token.as_bytes()[..header_b64.len() + 1 + claims_b64.len()];
    if !signature_holds(&key.material, signed, &signature) {
        cache.put(&cache_key, Err(INVALID), now_s + CACHE_FOR_S, now_s);
        return Err(INVALID);
    }
    let claims: serde_json::Map<String, serde_json::Value> = B64
        .decode(claims_b64)
        .ok()
        .and_then(|c| serde_json::from_slice(&c).ok())
        .ok_or(INVALID)?;
    let (user, exp) = check_claims(cfg, &claims, now_s)?;
    let until = exp.saturating_add(cfg.leeway_s).min(now_s + CACHE_FOR_S);
    cache.put(&cache_key, Ok(user), until, now_s);
    Ok(user)
}

/// The one key that may verify a token of `alg` naming `kid`: the key with that `kid` (or, when
/// none has it, a key without a `kid`), or the only key of that algorithm when the token names
/// none. Several candidates are refused: trying each would let a token cost one verification
/// per key.
fn pick_key<'k>(
    keys: &'k [Key],
    alg: JwtAlgorithm,
    kid: Option<&str>,
) -> Result<&'k Key, IdentityError> {
    let of_alg = || keys.iter().filter(move |k| k.alg == alg);
    let mut named: Vec<&Key> = match kid {
        Some(kid) => {
            let exact: Vec<&Key> = of_alg().filter(|k| k.kid.as_deref() == Some(kid)).collect();
            if exact.is_empty() {
                of_alg().filter(|k| k.kid.is_none()).collect()
            } else {
                exact
            }
        }
        None => of_alg().collect(),
    };
    match named.len() {
        1 => Ok(named.remove(0)),
        0 => Err(INVALID),
        _ => Err(IdentityError::Invalid(
            "the token must name its key (kid): several keys could verify it",
        )),
    }
}

fn signature_holds(material: &Material, signed: &[u8], signature: &[u8]) -> bool {
    use ring::signature::{self, UnparsedPublicKey};
    match material {
        Material::Hmac(key) => ring::hmac::verify(key, signed, signature).is_ok(),
        Material::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, signature)
            .is_ok(),
        Material::P256(point) => UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
            .verify(signed, signature)
            .is_ok(),
    }
}

/// The order of P-256, big-endian.
const P256_ORDER: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// For a 64-byte `r || s` whose `s` is above half the P-256 order: the same signature with
/// `n - s`, its other spelling. `None` for anything else (already low, or not that shape).
fn low_s_spelling(signature: &[u8]) -> Option<[u8; 64]> {
    let s: &[u8; 32] = signature.get(32..64)?.try_into().ok()?;
    if signature.len() != 64 || s[..] <= P256_HALF_ORDER[..] || s[..] >= P256_ORDER[..] {
        return None;
    }
    let mut low = [0u8; 64];
    low[..32].copy_from_slice(&signature[..32]);
    let mut borrow = 0u16;
    for i in (0..32).rev() {
        let d = u16::from(P256_ORDER[i])
            .wrapping_sub(u16::from(s[i]))
            .wrapping_sub(borrow);
        low[32 + i] = d as u8;
        borrow = u16::from(d > 0xff);
    }
    Some(low)
}

/// A NumericDate claim: a non-negative number (fractions dropped).
fn seconds(v: &serde_json::Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })
}

/// The user and the expiry of verified claims.
fn check_claims(
    cfg: &JwtConfig,
    claims: &serde_json::Map<String, serde_json::Value>,
    now_s: u64,
) -> Result<(u64, u64), IdentityError> {
    let exp = claims
        .get("exp")
        .and_then(seconds)
        .ok_or(IdentityError::Invalid("the token has no valid exp"))?;
    if exp.saturating_add(cfg.leeway_s) <= now_s {
        return Err(IdentityError::Invalid("the token has expired"));
    }
    if let Some(nbf) = claims.get("nbf") {
        let nbf = seconds(nbf).ok_or(INVALID)?;
        if nbf > now_s.saturating_add(cfg.leeway_s) {
            return Err(IdentityError::Invalid("the token is not valid yet"));
        }
    }
    // `iss` is one string (RFC 7519 §4.1.1): an array of issuers names none of them.
    match (claims.get("iss"), &cfg.issuer) {
        (Some(serde_json::Value::String(iss)), Some(want)) if iss == want => {}
        (Some(serde_json::Value::String(_)), None) | (None, None) => {}
        _ => return Err(IdentityError::Invalid("the token's issuer is not accepted")),
    }
    if let Some(want) = &cfg.audience {
        let ok = match claims.get("aud") {
            Some(serde_json::Value::String(aud)) => aud == want,
            Some(serde_json::Value::Array(auds)) => {
                auds.iter().all(|a| a.is_string()) && auds.iter().any(|a| a.as_str() == Some(want))
            }
            _ => false,
        };
        if !ok {
            return Err(IdentityError::Invalid(
                "the token's audience is not accepted",
            ));
        }
    }
    let bad = IdentityError::Invalid("the token's user claim is not a positive integer");
    let user = match claims.get(&cfg.user_claim) {
        Some(serde_json::Value::String(s)) => crate::queue::parse_positive_id(s).ok_or(bad)?,
        Some(serde_json::Value::Number(n)) => n.as_u64().filter(|v| *v > 0).ok_or(bad)?,
        _ => return Err(IdentityError::Invalid("the token has no user claim")),
    };
    Ok((user, exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> JwtConfig {
        JwtConfig {
            algorithms: vec![JwtAlgorithm::HS256],
            key: super::super::KeySource::File("unused".into()),
            issuer: Some("https://auth.test".into()),
            audience: Some("ticketing".into()),
            user_claim: "sub".into(),
            leeway_s: 30,
            es256_low_s_only: false,
        }
    }

    fn claims(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn claims_are_checked_strictly() {
        let c = cfg();
        let ok = claims(
            serde_json::json!({"sub": "42", "iss": "https://auth.test", "aud": "ticketing", "exp": 1000}),
        );
        assert_eq!(check_claims(&c, &ok, 900), Ok((42, 1000)));
        assert_eq!(check_claims(&c, &ok, 1029), Ok((42, 1000)), "leeway");
        assert!(check_claims(&c, &ok, 1030).is_err());
        for bad in [
            serde_json::json!({"sub": "42", "iss": ["https://auth.test"], "aud": "ticketing", "exp": 1000}),
            serde_json::json!({"sub": "42", "iss": "https://auth.test", "aud": ["x", 7, "ticketing"], "exp": 1000}),
            serde_json::json!({"sub": "42", "iss": "https://auth.test", "aud": "ticketing"}),
            serde_json::json!({"sub": "42", "iss": "https://auth.test", "aud": "ticketing", "exp": "1000"}),
            serde_json::json!({"sub": "42", "iss": "https://auth.test", "aud": "ticketing", "exp": 1000, "nbf": 2000}),
            serde_json::json!({"sub": "042", "iss": "https://auth.test", "aud": "ticketing", "exp": 1000}),
        ] {
            assert!(
                check_claims(&c, &claims(bad.clone()), 900).is_err(),
                "{bad}"
            );
        }
        let arr = claims(
            serde_json::json!({"sub": 7, "iss": "https://auth.test", "aud": ["x", "ticketing"], "exp": 1000.5}),
        );
        assert_eq!(check_claims(&c, &arr, 900), Ok((7, 1000)));
    }

    fn key(kid: Option<&str>, alg: JwtAlgorithm) -> Key {
        Key {
            kid: kid.map(String::from),
            alg,
            material: Material::Hmac(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k")),
        }
    }

    #[test]
    fn at_most_one_key_is_tried() {
        let keys = [
            key(Some("a"), JwtAlgorithm::HS256),
            key(Some("b"), JwtAlgorithm::HS256),
            key(None, JwtAlgorithm::RS256),
        ];
        assert_eq!(
            pick_key(&keys, JwtAlgorithm::HS256, Some("b"))
                .unwrap()
                .kid
                .as_deref(),
            Some("b")
        );
        assert!(
            pick_key(&keys, JwtAlgorithm::HS256, None).is_err(),
            "ambiguous"
        );
        assert!(pick_key(&keys, JwtAlgorithm::HS256, Some("c")).is_err());
        assert!(pick_key(&keys, JwtAlgorithm::RS256, None).is_ok());
        assert!(
            pick_key(&keys, JwtAlgorithm::RS256, Some("x")).is_ok(),
            "a file key has no kid"
        );
        assert!(pick_key(&keys, JwtAlgorithm::ES256, None).is_err());
    }

    #[test]
    fn the_other_spelling_of_a_high_s_is_n_minus_s() {
        let mut sig = [7u8; 64];
        sig[32..].copy_from_slice(&P256_ORDER);
        sig[63] -= 1; // s = n - 1
        let low = low_s_spelling(&sig).unwrap();
        assert_eq!(&low[..32], &[7u8; 32]);
        let mut one = [0u8; 32];
        one[31] = 1;
        assert_eq!(&low[32..], &one, "n - (n - 1) = 1");
        assert_eq!(low_s_spelling(&low), None, "already low");
        assert_eq!(low_s_spelling(&sig[..63]), None);
    }
}
