//! Entry tokens: minting and verifying the signed, expiring pass that lets a
//! user through the waiting room to one target.
//!
//! This module owns the wire format, which must stay byte-for-byte compatible
//! with the existing Kotlin verifier:
//!
//! ```text
//! payload = "{TYPE}|{targetId}|{userId}|{expiresAtEpochSec}"
//! token   = base64url_nopad(payload) + "." + base64url_nopad(HMAC-SHA256(secret, payload))
//! ```
//!
//! It does no I/O and reads no clock: the caller passes "now" in, which keeps
//! verification deterministic and testable. Checking that the payload match the
//! requested route and user is the caller's job.

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use ring::hmac;

use crate::queue::{positive_id, TargetType};

/// Longer tokens are rejected before any decoding, so an attacker cannot make
/// us allocate or hash large inputs.
pub const MAX_TOKEN_LEN: usize = 512;

/// HMAC-SHA256 output length; anything else in the MAC part is not ours.
const MAC_LEN: usize = 32;

/// Spelled out rather than relying on `URL_SAFE_NO_PAD`'s defaults, because
/// strictness is a security property here: padding and non-zero trailing bits
/// would give one token several spellings, which the Kotlin side rejects. (The
/// bearer JWTs of `identity` are read the same way.)
pub(crate) const B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(false),
);

/// Signing keys. `current` signs and verifies; `previous` only verifies, so
/// tokens minted just before a key rotation stay valid until they expire.
#[derive(Clone)]
pub struct TokenKeys {
    current: hmac::Key,
    previous: Option<hmac::Key>,
}

impl TokenKeys {
    /// current signs and verifies; previous (rotation) only verifies.
    ///
    /// Secret strength (length, entropy) is checked by whoever loads the
    /// configuration; this constructor accepts any byte string.
    pub fn new(current: &[u8], previous: Option<&[u8]>) -> TokenKeys {
        TokenKeys {
            current: hmac::Key::new(hmac::HMAC_SHA256, current),
            previous: previous.map(|p| hmac::Key::new(hmac::HMAC_SHA256, p)),
        }
    }

    /// A key for another purpose, derived from the secrets: HMAC-SHA256 of `label` under the
    /// current secret, and under the previous one while it rotates. The secrets themselves
    /// never leave this type.
    pub fn derive(&self, label: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
        (
            hmac::sign(&self.current, label).as_ref().to_vec(),
            self.previous
                .as_ref()
                .map(|k| hmac::sign(k, label).as_ref().to_vec()),
        )
    }

    fn mac_matches(&self, payload: &[u8], mac: &[u8]) -> bool {
        // ring's verify compares in constant time, so a forger learns nothing
        // from how quickly a guess is rejected.
        hmac::verify(&self.current, payload, mac).is_ok()
            || self
                .previous
                .as_ref()
                .is_some_and(|k| hmac::verify(k, payload, mac).is_ok())
    }
}

impl std::fmt::Debug for TokenKeys {
    // Keys end up in logged config structs; only their shape may be shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKeys")
            .field("previous", &self.previous.is_some())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPayload {
    pub target_type: TargetType,
    pub target_id: u64,
    pub user_id: u64,
    /// Epoch seconds; the token is valid while `now < expires_at`.
    pub expires_at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("entry token is longer than {MAX_TOKEN_LEN} bytes")]
    TooLong,
    #[error("entry token is malformed")]
    Malformed,
    #[error("entry token signature does not verify")]
    BadSignature,
    #[error("entry token has expired")]
    Expired,
}

impl TokenError {
    /// Bounded metric label.
    pub fn reason(self) -> &'static str {
        match self {
            TokenError::TooLong => "too_long",
            TokenError::Malformed => "malformed",
            TokenError::BadSignature => "bad_signature",
            TokenError::Expired => "expired",
        }
    }
}

/// Always signs with the current key. Claims with a zero id or expiry yield a
/// token that [`verify`] rejects; the caller builds payload from validated ids.
pub fn mint(keys: &TokenKeys, payload: &TokenPayload) -> String {
    let payload = format!(
        "{}|{}|{}|{}",
        payload.target_type.as_str(),
        payload.target_id,
        payload.user_id,
        payload.expires_at
    );
    signed(keys, &payload)
}

/// `base64url(payload) "." base64url(HMAC-SHA256(current key, payload))`.
fn signed(keys: &TokenKeys, payload: &str) -> String {
    let tag = hmac::sign(&keys.current, payload.as_bytes());
    let mut out = String::with_capacity(payload.len().div_ceil(3) * 4 + 1 + 43);
    B64.encode_string(payload.as_bytes(), &mut out);
    out.push('.');
    B64.encode_string(tag.as_ref(), &mut out);
    out
}

/// Verifies format, MAC (constant-time via ring::hmac::verify, current then previous key) and expiry (`expires_at > now_epoch_secs`).
pub fn verify(
    keys: &TokenKeys,
    token: &str,
    now_epoch_secs: u64,
) -> Result<TokenPayload, TokenError> {
    let mut payload_buf = [0u8; MAX_TOKEN_LEN / 4 * 3];
    let payload = authenticated(keys, token, &mut payload_buf)?;
    let payload = parse_payload(payload).ok_or(TokenError::Malformed)?;
    if payload.expires_at <= now_epoch_secs {
        return Err(TokenError::Expired);
    }
    Ok(payload)
}

/// The payload of a signed string (`base64url(payload) "." base64url(mac)`), decoded into
/// `payload_buf` once its format and MAC are checked: the field parsers only ever see bytes we
/// signed ourselves.
fn authenticated<'b>(
    keys: &TokenKeys,
    signed: &str,
    payload_buf: &'b mut [u8; MAX_TOKEN_LEN / 4 * 3],
) -> Result<&'b [u8], TokenError> {
    if signed.len() > MAX_TOKEN_LEN {
        return Err(TokenError::TooLong);
    }
    let (payload_b64, mac_b64) = signed.split_once('.').ok_or(TokenError::Malformed)?;
    if payload_b64.is_empty() || mac_b64.is_empty() || mac_b64.contains('.') {
        return Err(TokenError::Malformed);
    }
    // Decoded on the stack: a token is at most MAX_TOKEN_LEN bytes, so its payload decodes to
    // three quarters of that at most; a MAC part that does not decode to MAC_LEN is not ours.
    let mut mac = [0u8; MAC_LEN];
    let payload_len =
        decode_b64url(payload_b64.as_bytes(), payload_buf).ok_or(TokenError::Malformed)?;
    if decode_b64url(mac_b64.as_bytes(), &mut mac) != Some(MAC_LEN) {
        return Err(TokenError::Malformed);
    }
    let payload = &payload_buf[..payload_len];
    if !keys.mac_matches(payload, &mac) {
        return Err(TokenError::BadSignature);
    }
    Ok(payload)
}

/// A queue ticket: what an enter answer signs for a waiting user (its sale, the user and the
/// fixed seq), so that while the store is down a replica can tell users who were waiting, and in
/// which order, from fresh arrivals (`failopen::Pacer`). Useless elsewhere: bound to one user and
/// one sale, and never an entry token (its payload has six fields and starts with `TICKET`, an
/// entry token's has four).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketPayload {
    pub target_type: TargetType,
    pub target_id: u64,
    pub user_id: u64,
    pub seq: u64,
    pub expires_at: u64,
}

const TICKET_TAG: &[u8] = b"TICKET";

/// `base64url("TICKET|{TYPE}|{targetId}|{userId}|{seq}|{expiresAt}") "." base64url(HMAC)`.
pub fn mint_ticket(keys: &TokenKeys, t: &TicketPayload) -> String {
    use std::fmt::Write as _;
    // Every enter answer carries one: two allocations, the payload and the ticket.
    let mut payload = String::with_capacity(80);
    let _ = write!(
        payload,
        "TICKET|{}|{}|{}|{}|{}",
        t.target_type.as_str(),
        t.target_id,
        t.user_id,
        t.seq,
        t.expires_at
    );
    signed(keys, &payload)
}

/// Verifies a queue ticket as [`verify`] does a token.
pub fn verify_ticket(
    keys: &TokenKeys,
    ticket: &str,
    now_epoch_secs: u64,
) -> Result<TicketPayload, TokenError> {
    let mut payload_buf = [0u8; MAX_TOKEN_LEN / 4 * 3];
    let payload = authenticated(keys, ticket, &mut payload_buf)?;
    let mut fields = payload.split(|&b| b == b'|');
    let (Some(TICKET_TAG), Some(kind), Some(target), Some(user), Some(seq), Some(exp), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(TokenError::Malformed);
    };
    let payload = (|| {
        Some(TicketPayload {
            target_type: TargetType::from_enum_bytes(kind)?,
            target_id: positive_id(target)?,
            user_id: positive_id(user)?,
            seq: positive_id(seq)?,
            expires_at: positive_id(exp)?,
        })
    })()
    .ok_or(TokenError::Malformed)?;
    if payload.expires_at <= now_epoch_secs {
        return Err(TokenError::Expired);
    }
    Ok(payload)
}

/// Strict base64url without padding into `out`, by the [`B64`] engine: only the 64 characters,
/// no `=`, and the unused low bits of a last partial group zero (so each byte string has one
/// spelling). The decoded length, or `None` for any other input or one that does not fit `out`.
fn decode_b64url(input: &[u8], out: &mut [u8]) -> Option<usize> {
    B64.decode_slice(input, out).ok()
}

fn parse_payload(payload: &[u8]) -> Option<TokenPayload> {
    // Split as bytes (fields are short; no search call per field); each field is read as bytes.
    let mut fields = payload.split(|&b| b == b'|');
    let (Some(kind), Some(target), Some(user), Some(exp), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return None;
    };
    Some(TokenPayload {
        target_type: TargetType::from_enum_bytes(kind)?,
        target_id: positive_id(target)?,
        user_id: positive_id(user)?,
        // Same canonical-decimal rule as the ids: one spelling per value.
        expires_at: positive_id(exp)?,
    })
}

#[cfg(test)]
mod tests;
