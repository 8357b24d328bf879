//! The unit tests of `token.rs`.

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
