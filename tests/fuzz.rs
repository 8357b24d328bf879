//! Fuzzing by property tests with many cases: the path canonicaliser and the token parser take
//! untrusted bytes straight from the network, so neither may ever panic, and neither may accept
//! something it should not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use vq_gateway::config::Config;
use vq_gateway::queue::TargetType;
use vq_gateway::routing::gated::{lookalike, match_route};
use vq_gateway::routing::path::canonicalize;
use vq_gateway::token::{mint, verify, TokenKeys, TokenPayload};

/// Path-ish bytes: mostly the characters that matter for tricks, plus anything.
fn pathish() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"/".to_vec()),
        Just(b"//".to_vec()),
        Just(b"limited-drops".to_vec()),
        Just(b"LIMITED-DROPS".to_vec()),
        Just(b"42".to_vec()),
        Just(b"orders".to_vec()),
        Just(b"orders.json".to_vec()),
        Just(b"orders%2e".to_vec()),
        Just(b"orders%20".to_vec()),
        Just(b"~".to_vec()),
        Just(b"!".to_vec()),
        Just(b"-".to_vec()),
        Just(b".".to_vec()),
        Just(b"..".to_vec()),
        Just(b";".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"%".to_vec()),
        "%[0-9a-fA-F]{2}".prop_map(|s| s.into_bytes()),
        "%25[0-9a-fA-F]{2}".prop_map(|s| s.into_bytes()),
        any::<u8>().prop_map(|b| vec![b]),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn canonicalize_never_panics_and_is_a_fixed_point(raw in pathish()) {
        if let Ok(c) = canonicalize(&raw) {
            let text = c.to_path();
            let again = canonicalize(text.as_bytes()).unwrap();
            prop_assert_eq!(&again, &c);
            for s in c.segments() {
                prop_assert!(s != "." && s != "..");
                prop_assert!(!s.contains(['/', '\\', ';']));
                prop_assert!(!s.to_ascii_uppercase().contains("%2F"));
                prop_assert!(!s.to_ascii_uppercase().contains("%25"));
            }
        }
    }

    #[test]
    fn a_gated_shape_is_recognised_however_it_is_spelled(raw in pathish()) {
        // If the canonical form of a path, read the way a lenient backend would (case folded),
        // names the gated route, the gateway's matcher must say so too.
        let routes = Config::from_toml("").unwrap().gate.routes;
        if let Ok(c) = canonicalize(&raw) {
            let lower: Vec<String> = c.segments().map(str::to_ascii_lowercase).collect();
            let looks_gated = lower.len() == 3 && lower[0] == "limited-drops" && lower[2] == "orders";
            prop_assert_eq!(looks_gated, match_route(&routes, &c).is_some_and(|g| *g.route == *routes[0]));
        }
    }

    #[test]
    fn a_suffixed_purchase_route_is_gated_or_a_lookalike(raw in pathish()) {
        // A backend with suffix-pattern matching or segment trimming routes `orders.json`,
        // `orders.`, `orders%20` to the orders handler: such a path must never be neither gated
        // nor refused as a lookalike.
        let routes = Config::from_toml("").unwrap().gate.routes;
        if let Ok(c) = canonicalize(&raw) {
            let lower: Vec<String> = c.segments().map(str::to_ascii_lowercase).collect();
            let trimmed = |s: &str, lit: &str| {
                s.strip_prefix(lit).is_some_and(|rest| {
                    rest.is_empty() || !rest.starts_with(|ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
                })
            };
            let backend_reads_it_as_orders = lower.len() == 3
                && trimmed(&lower[0], "limited-drops")
                && trimmed(&lower[2], "orders");
            if backend_reads_it_as_orders {
                prop_assert!(
                    match_route(&routes, &c).is_some() || lookalike(&routes, &c),
                    "{:?} reaches a suffix-matching backend's orders handler unchecked", c
                );
            }
        }
    }

    #[test]
    fn verify_never_panics(s in ".{0,600}") {
        let keys = TokenKeys::new(b"0123456789abcdef0123456789abcdef", None);
        let _ = verify(&keys, &s, 1_000);
    }

    #[test]
    fn verify_rejects_every_mutation(
        user in 1u64..u64::MAX, id in 1u64..u64::MAX, pos in any::<prop::sample::Index>(), byte in any::<u8>()
    ) {
        let keys = TokenKeys::new(b"0123456789abcdef0123456789abcdef", None);
        let payload = TokenPayload { target_type: TargetType::LimitedDrop, target_id: id, user_id: user, expires_at: 2_000_000_000 };
        let token = mint(&keys, &payload);
        prop_assert_eq!(verify(&keys, &token, 1_000).unwrap(), payload);
        let mut bytes = token.clone().into_bytes();
        let i = pos.index(bytes.len());
        prop_assume!(bytes[i] != byte);
        bytes[i] = byte;
        let mutated = String::from_utf8_lossy(&bytes).into_owned();
        prop_assume!(mutated != token);
        prop_assert!(verify(&keys, &mutated, 1_000).is_err(), "accepted {}", mutated);
    }
}
