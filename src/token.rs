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
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use proptest::prelude::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OLD_SECRET: &[u8] = b"fedcba9876543210fedcba9876543210";
    const NOW: u64 = 1_783_590_000;

    /// Computed independently with Python's hmac/hashlib/base64 for SECRET and
    /// payload "LIMITED_DROP|42|1001|1783591200".
    const KNOWN_ANSWER: &str =
        "TElNSVRFRF9EUk9QfDQyfDEwMDF8MTc4MzU5MTIwMA.C8JMmOGKHuQz5cra4zobxUcnzOPn8C2sMScrUiBAXds";

    fn keys() -> TokenKeys {
        TokenKeys::new(SECRET, None)
    }

    fn payload() -> TokenPayload {
        TokenPayload {
            target_type: TargetType::LimitedDrop,
            target_id: 42,
            user_id: 1001,
            expires_at: 1_783_591_200,
        }
    }

    /// Independent implementation straight from the format, not using `mint`.
    fn sign_raw(secret: &[u8], payload: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let tag = hmac::sign(&key, payload);
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    #[test]
    fn round_trip() {
        let token = mint(&keys(), &payload());
        assert_eq!(verify(&keys(), &token, NOW), Ok(payload()));
        let ticket = TokenPayload {
            target_type: TargetType::TicketingEvent,
            target_id: u64::MAX,
            user_id: 1,
            expires_at: u64::MAX,
        };
        let token = mint(&keys(), &ticket);
        assert_eq!(verify(&keys(), &token, NOW), Ok(ticket));
    }

    #[test]
    fn known_answer_vector() {
        assert_eq!(mint(&keys(), &payload()), KNOWN_ANSWER);
        assert_eq!(verify(&keys(), KNOWN_ANSWER, NOW), Ok(payload()));
    }

    #[test]
    fn independent_implementation_interoperates() {
        let token = sign_raw(SECRET, b"TICKETING_EVENT|7|99|1783591200");
        let expected = TokenPayload {
            target_type: TargetType::TicketingEvent,
            target_id: 7,
            user_id: 99,
            expires_at: 1_783_591_200,
        };
        assert_eq!(verify(&keys(), &token, NOW), Ok(expected.clone()));
        assert_eq!(mint(&keys(), &expected), token);
        assert_eq!(
            mint(&keys(), &payload()),
            sign_raw(SECRET, b"LIMITED_DROP|42|1001|1783591200")
        );
    }

    #[test]
    fn every_single_byte_mutation_is_rejected() {
        let token = mint(&keys(), &payload());
        let original = token.as_bytes();
        let alternatives: &[u8] = b"Aa0zZ9-_.=+/| \x00~%";
        let mut variants: Vec<Vec<u8>> = Vec::new();
        for i in 0..original.len() {
            let mut candidates: Vec<u8> = alternatives.to_vec();
            // Neighbouring values flip only the low bits, which is what
            // catches lax handling of base64 trailing bits.
            candidates.extend([
                original[i] ^ 0x01,
                original[i] ^ 0x02,
                original[i] ^ 0x20,
                original[i].wrapping_add(1),
            ]);
            for c in candidates {
                if c != original[i] && c.is_ascii() {
                    let mut v = original.to_vec();
                    v[i] = c;
                    variants.push(v);
                }
            }
            let mut deleted = original.to_vec();
            deleted.remove(i);
            variants.push(deleted);
        }
        for &c in alternatives {
            let mut appended = original.to_vec();
            appended.push(c);
            variants.push(appended);
            let mut prepended = vec![c];
            prepended.extend_from_slice(original);
            variants.push(prepended);
        }
        assert!(variants.len() > original.len() * 10);
        for v in variants {
            let s = String::from_utf8(v).unwrap();
            assert_ne!(s, token);
            assert!(verify(&keys(), &s, NOW).is_err(), "accepted mutation {s:?}");
        }
    }

    #[test]
    fn wrong_secret_is_rejected() {
        let token = mint(
            &TokenKeys::new(b"another secret entirely", None),
            &payload(),
        );
        assert_eq!(verify(&keys(), &token, NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn previous_key_verifies_but_never_signs() {
        let rotated = TokenKeys::new(SECRET, Some(OLD_SECRET));
        let old_token = mint(&TokenKeys::new(OLD_SECRET, None), &payload());
        assert_eq!(verify(&rotated, &old_token, NOW), Ok(payload()));
        assert_eq!(
            verify(&keys(), &old_token, NOW),
            Err(TokenError::BadSignature)
        );

        let minted = mint(&rotated, &payload());
        assert_ne!(minted, old_token);
        assert_eq!(minted, mint(&keys(), &payload()));
        let only_old = TokenKeys::new(OLD_SECRET, None);
        assert_eq!(
            verify(&only_old, &minted, NOW),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn expiry_is_exclusive() {
        let token = mint(&keys(), &payload());
        let exp = payload().expires_at;
        assert_eq!(verify(&keys(), &token, exp), Err(TokenError::Expired));
        assert_eq!(verify(&keys(), &token, exp + 1), Err(TokenError::Expired));
        assert_eq!(verify(&keys(), &token, u64::MAX), Err(TokenError::Expired));
        assert_eq!(verify(&keys(), &token, exp - 1), Ok(payload()));
    }

    #[test]
    fn future_dated_within_ttl_is_accepted() {
        let now = 1_700_000_000;
        let c = TokenPayload {
            expires_at: now + 300,
            ..payload()
        };
        assert_eq!(verify(&keys(), &mint(&keys(), &c), now), Ok(c));
    }

    #[test]
    fn padding_and_standard_alphabet_are_rejected() {
        let token = mint(&keys(), &payload());
        for bad in [
            format!("{token}="),
            format!("{token}=="),
            token.replace('.', "=."),
        ] {
            assert_eq!(
                verify(&keys(), &bad, NOW),
                Err(TokenError::Malformed),
                "{bad}"
            );
        }
        // A payload whose encoding contains '-'/'_' must not be accepted in
        // the standard alphabet's '+'/'/' spelling.
        let payload = b"LIMITED_DROP|42|1001|1783591200\xfb\xff";
        let raw = sign_raw(SECRET, payload);
        let std_spelling = raw.replace('-', "+").replace('_', "/");
        assert_ne!(raw, std_spelling);
        assert_eq!(
            verify(&keys(), &std_spelling, NOW),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn structural_errors_are_malformed() {
        let token = mint(&keys(), &payload());
        let (p, m) = token.split_once('.').unwrap();
        for bad in [
            String::new(),
            ".".to_string(),
            p.to_string(),
            format!("{p}."),
            format!(".{m}"),
            format!("{p}.{m}.{m}"),
            format!("{p}..{m}"),
            format!("{p}.{}", URL_SAFE_NO_PAD.encode([0u8; 31])),
            format!("{p}.{}", URL_SAFE_NO_PAD.encode([0u8; 33])),
        ] {
            assert_eq!(
                verify(&keys(), &bad, NOW),
                Err(TokenError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn correctly_signed_odd_payloads_are_rejected() {
        let bad_payloads: &[&[u8]] = &[
            b"LIMITED_DROP|42|1001|1783591200|x",
            b"LIMITED_DROP|42|1001|1783591200|",
            b"LIMITED_DROP|42|1001",
            b"|42|1001|1783591200",
            b"LIMITED_DROP||1001|1783591200",
            b"LIMITED_DROP|42||1783591200",
            b"LIMITED_DROP|42|1001|",
            b"|||",
            b"LIMITED_DROP|042|1001|1783591200",
            b"LIMITED_DROP|42|01001|1783591200",
            b"LIMITED_DROP|42|1001|01783591200",
            b"LIMITED_DROP|+42|1001|1783591200",
            b"LIMITED_DROP|42|+1001|1783591200",
            b"LIMITED_DROP|42|1001|+1783591200",
            b"LIMITED_DROP| 42|1001|1783591200",
            b"LIMITED_DROP|42 |1001|1783591200",
            b"LIMITED_DROP|42|1001| 1783591200",
            b"LIMITED_DROP|-42|1001|1783591200",
            b"LIMITED_DROP|0|1001|1783591200",
            b"LIMITED_DROP|42|0|1783591200",
            b"LIMITED_DROP|42|1001|0",
            b"LIMITED_DROP|18446744073709551616|1001|1783591200",
            b"LIMITED_DROP|42|1001|99999999999999999999",
            b"limited_drop|42|1001|1783591200",
            b"LimitedDrop|42|1001|1783591200",
            b" LIMITED_DROP|42|1001|1783591200",
            b"OTHER|42|1001|1783591200",
            b"LIMITED_DROP|4\xff2|1001|1783591200",
            b"LIMITED_DROP|\xd9\xa42|1001|1783591200",
        ];
        for payload in bad_payloads {
            let token = sign_raw(SECRET, payload);
            assert_eq!(
                verify(&keys(), &token, NOW),
                Err(TokenError::Malformed),
                "{:?}",
                String::from_utf8_lossy(payload)
            );
        }
    }

    #[test]
    fn bad_payload_with_bad_mac_reports_bad_signature() {
        let token = sign_raw(b"wrong", b"LIMITED_DROP|042|1001|1783591200");
        assert_eq!(verify(&keys(), &token, NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn oversized_token_is_too_long() {
        let huge = "A".repeat(20 * 1024);
        assert_eq!(verify(&keys(), &huge, NOW), Err(TokenError::TooLong));
        let just_over = format!("{}.{}", "A".repeat(MAX_TOKEN_LEN), "A");
        assert_eq!(verify(&keys(), &just_over, NOW), Err(TokenError::TooLong));
    }

    #[test]
    fn reasons_are_bounded_labels() {
        let all = [
            TokenError::TooLong,
            TokenError::Malformed,
            TokenError::BadSignature,
            TokenError::Expired,
        ];
        let labels: Vec<_> = all.iter().map(|e| e.reason()).collect();
        assert_eq!(
            labels,
            ["too_long", "malformed", "bad_signature", "expired"]
        );
    }

    #[test]
    fn debug_shows_no_key_material() {
        let k = TokenKeys::new(SECRET, Some(OLD_SECRET));
        let shown = format!("{k:?} {:?}", keys());
        assert_eq!(
            shown,
            "TokenKeys { previous: true } TokenKeys { previous: false }"
        );
    }

    fn arb_payload() -> impl Strategy<Value = (TokenPayload, u64)> {
        (
            prop_oneof![
                Just(TargetType::LimitedDrop),
                Just(TargetType::TicketingEvent)
            ],
            1..=u64::MAX,
            1..=u64::MAX,
            0..u64::MAX,
        )
            .prop_flat_map(|(target_type, target_id, user_id, now)| {
                ((now + 1)..=u64::MAX).prop_map(move |expires_at| {
                    (
                        TokenPayload {
                            target_type,
                            target_id,
                            user_id,
                            expires_at,
                        },
                        now,
                    )
                })
            })
    }

    proptest! {
        #[test]
        fn verify_never_panics_on_strings(s in any::<String>()) {
            let _ = verify(&keys(), &s, NOW);
        }

        #[test]
        fn verify_never_panics_on_tokenish_strings(s in "[A-Za-z0-9_=+/.|-]{0,600}") {
            let _ = verify(&keys(), &s, NOW);
        }

        #[test]
        fn verify_never_panics_on_lossy_bytes(b in proptest::collection::vec(any::<u8>(), 0..700)) {
            let _ = verify(&keys(), &String::from_utf8_lossy(&b), NOW);
        }

        #[test]
        fn signed_arbitrary_payloads_never_panic(p in proptest::collection::vec(any::<u8>(), 1..200)) {
            let r = verify(&keys(), &sign_raw(SECRET, &p), NOW);
            prop_assert_ne!(r, Err(TokenError::BadSignature));
        }

        #[test]
        fn decoding_round_trips(b in proptest::collection::vec(any::<u8>(), 0..60)) {
            let mut out = [0u8; 60];
            let n = decode_b64url(B64.encode(&b).as_bytes(), &mut out);
            prop_assert_eq!(n.map(|n| &out[..n]), Some(&b[..]));
            // One byte short of room is refused, not truncated.
            if !b.is_empty() {
                prop_assert_eq!(decode_b64url(B64.encode(&b).as_bytes(), &mut out[..b.len() - 1]), None);
            }
        }

        #[test]
        fn mint_verify_round_trips((c, now) in arb_payload()) {
            let token = mint(&keys(), &c);
            prop_assert!(token.len() <= MAX_TOKEN_LEN);
            prop_assert_eq!(verify(&keys(), &token, now), Ok(c));
        }
    }

    #[test]
    fn tickets_round_trip_and_are_never_tokens() {
        let keys = TokenKeys::new(b"0123456789abcdef0123456789abcdef", None);
        let t = TicketPayload {
            target_type: TargetType::LimitedDrop,
            target_id: 42,
            user_id: 1001,
            seq: 17,
            expires_at: 2_000,
        };
        let ticket = mint_ticket(&keys, &t);
        assert_eq!(verify_ticket(&keys, &ticket, 1_000), Ok(t.clone()));
        assert_eq!(
            verify_ticket(&keys, &ticket, 2_000),
            Err(TokenError::Expired)
        );
        assert_eq!(verify(&keys, &ticket, 1_000), Err(TokenError::Malformed));
        let token = mint(
            &keys,
            &TokenPayload {
                target_type: TargetType::LimitedDrop,
                target_id: 42,
                user_id: 1001,
                expires_at: 2_000,
            },
        );
        assert_eq!(
            verify_ticket(&keys, &token, 1_000),
            Err(TokenError::Malformed)
        );
        let other = TokenKeys::new(b"another-secret-0123456789abcdef!", None);
        assert_eq!(
            verify_ticket(&other, &ticket, 1_000),
            Err(TokenError::BadSignature)
        );
    }
}
