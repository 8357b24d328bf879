//! Who the user is: `identity.mode = "header"` trusts `X-User-Id` (set by the load balancer);
//! `"jwt"` verifies a bearer token (HS256, RS256, ES256; file or JWKS, reloaded on change) and
//! is the only source of the user id, for the queue, the gate, the rollout bucket and the
//! backend.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use common::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use vq_gateway::token::{mint, TokenKeys, TokenPayload};

const Q: &str = "/virtual-queues/limited-drop/42";
const ORDERS: &str = "/limited-drops/42/orders";

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/jwt")
        .join(name)
}

fn claims(sub: &str) -> serde_json::Value {
    serde_json::json!({
        "sub": sub, "iss": "https://auth.test", "aud": "ticketing",
        "exp": now_s() + 600, "iat": now_s(),
    })
}

fn sign(alg: Algorithm, key_file: &str, kid: Option<&str>, claims: &serde_json::Value) -> String {
    let pem = std::fs::read(data(key_file)).unwrap();
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem).unwrap(),
        Algorithm::HS256 => {
            let s = String::from_utf8(pem).unwrap();
            EncodingKey::from_secret(s.trim_end().as_bytes())
        }
        _ => unreachable!(),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(String::from);
    encode(&header, claims, &key).unwrap()
}

fn rs256(sub: &str) -> String {
    sign(Algorithm::RS256, "rsa_a.key", None, &claims(sub))
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

fn jwt_gateway(tweak: impl Fn(&mut ConfigFile)) -> (GatewayProc, Upstream) {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.identity.mode = IdentityMode::Jwt;
    cfg.identity.algorithms = vec![JwtAlgorithm::RS256];
    cfg.identity.key_file = data("rsa_a.pub").display().to_string();
    cfg.identity.issuer = "https://auth.test".into();
    cfg.identity.audience = "ticketing".into();
    tweak(&mut cfg);
    (GatewayProc::start(cfg), up)
}

fn enter(gw: &GatewayProc, headers: &[(&str, &str)]) -> Response {
    gw.client()
        .request("POST", &format!("{Q}/entries"), headers, b"")
        .unwrap()
}

#[test]
fn a_valid_token_is_the_user_and_client_ids_are_ignored() {
    // No admission during the test: a tick boundary between the enter and the last poll would
    // admit the user, and "still in line" is what the poll checks.
    let (gw, up) = jwt_gateway(|c| c.queue.tick_ms = 3_600_000);
    let t = rs256("1001");
    let r = enter(&gw, &[("Authorization", &bearer(&t)), ("X-User-Id", "5")]);
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["position"], 1);
    // The same user again (its X-User-Id spelled otherwise): the same position.
    let r = enter(&gw, &[("Authorization", &bearer(&t))]);
    assert_eq!(r.json()["position"], 1);
    let r = enter(&gw, &[("X-User-Id", "1001")]);
    assert_eq!(r.status, 401, "a bare X-User-Id is no identity in jwt mode");
    assert_eq!(r.json()["code"], "UNAUTHORIZED");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    // Nobody else can poll the user's entry (and take its token) or remove it.
    let victim = [("X-User-Id", "1001")];
    for method in ["GET", "DELETE"] {
        let r = gw
            .client()
            .request(method, &format!("{Q}/entries/me"), &victim, b"")
            .unwrap();
        assert_eq!(r.status, 401, "{method}");
    }
    let other = bearer(&rs256("2002"));
    let r = gw
        .client()
        .request(
            "DELETE",
            &format!("{Q}/entries/me"),
            &[("Authorization", &other), ("X-User-Id", "1001")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 204, "another user leaves its own (absent) entry");
    let r = gw
        .client()
        .request(
            "GET",
            &format!("{Q}/entries/me"),
            &[("Authorization", &bearer(&t))],
            b"",
        )
        .unwrap();
    assert_eq!(r.json()["position"], 1, "the victim is still in line");
    // The backend sees the verified id only.
    let r = gw
        .client()
        .request(
            "GET",
            "/profile",
            &[("Authorization", &bearer(&t)), ("X-User-Id", "5")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let r = gw
        .client()
        .request("GET", "/public", &[("X-User-Id", "5")], b"")
        .unwrap();
    assert_eq!(r.status, 200);
    let seen = up.requests();
    assert_eq!(seen[0].headers_named("x-user-id"), vec!["1001"]);
    assert!(seen[1].headers_named("x-user-id").is_empty());
}

#[test]
fn bad_tokens_are_refused() {
    let (gw, up) = jwt_gateway(|_| {});
    let mut expired = claims("1001");
    expired["exp"] = (now_s() - 3600).into();
    let mut early = claims("1001");
    early["nbf"] = (now_s() + 3600).into();
    let mut wrong_iss = claims("1001");
    wrong_iss["iss"] = "https://evil.test".into();
    let mut wrong_aud = claims("1001");
    wrong_aud["aud"] = "other".into();
    let mut no_exp = claims("1001");
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut no_aud = claims("1001");
    no_aud.as_object_mut().unwrap().remove("aud");
    let mut no_iss = claims("1001");
    no_iss.as_object_mut().unwrap().remove("iss");
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(&serde_json::json!({"alg": "none", "typ": "JWT"})),
        b64(&claims("1001"))
    );
    // Algorithm confusion: HS256 "signed" with the RS256 public key as the secret.
    let public = String::from_utf8(std::fs::read(data("rsa_a.pub")).unwrap()).unwrap();
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &claims("1001"),
        &EncodingKey::from_secret(public.as_bytes()),
    )
    .unwrap();
    let mut tampered = rs256("1001");
    let mid = tampered.find('.').unwrap() + 5;
    tampered.replace_range(
        mid..mid + 1,
        if &tampered[mid..mid + 1] == "A" {
            "B"
        } else {
            "A"
        },
    );
    let cases = [
        (
            "expired",
            sign(Algorithm::RS256, "rsa_a.key", None, &expired),
        ),
        (
            "not yet valid",
            sign(Algorithm::RS256, "rsa_a.key", None, &early),
        ),
        (
            "wrong key",
            sign(Algorithm::RS256, "rsa_b.key", None, &claims("1001")),
        ),
        (
            "wrong issuer",
            sign(Algorithm::RS256, "rsa_a.key", None, &wrong_iss),
        ),
        (
            "wrong audience",
            sign(Algorithm::RS256, "rsa_a.key", None, &wrong_aud),
        ),
        ("no exp", sign(Algorithm::RS256, "rsa_a.key", None, &no_exp)),
        (
            "no aud (another app's token)",
            sign(Algorithm::RS256, "rsa_a.key", None, &no_aud),
        ),
        ("no iss", sign(Algorithm::RS256, "rsa_a.key", None, &no_iss)),
        ("alg none", none),
        ("alg confusion", confused),
        ("tampered", tampered),
        ("user not a number", rs256("alice")),
        ("user zero", rs256("0")),
        ("garbage", "a.b.c".into()),
    ];
    for (what, t) in &cases {
        let r = enter(&gw, &[("Authorization", &bearer(t))]);
        assert_eq!(r.status, 401, "{what}");
        assert_eq!(r.json()["code"], "UNAUTHORIZED", "{what}");
    }
    for header in ["Basic dXNlcjpwdw==", "Bearer", "bearer  ", "Token x"] {
        let r = enter(&gw, &[("Authorization", header)]);
        assert_eq!(r.status, 401, "{header}");
    }
    let good = bearer(&rs256("1"));
    let r = enter(&gw, &[("Authorization", &good), ("Authorization", &good)]);
    assert_eq!(r.status, 401, "two Authorization headers");
    assert_eq!(up.count(), 0);
}

#[test]
fn the_gate_matches_the_entry_token_to_the_verified_user() {
    let (gw, up) = jwt_gateway(|_| {});
    let keys = TokenKeys::new(TEST_SECRET.as_bytes(), None);
    let entry = mint(
        &keys,
        &TokenPayload {
            target_type: vq_gateway::queue::TargetType::LimitedDrop,
            target_id: 42,
            user_id: 1001,
            expires_at: now_s() + 300,
        },
    );
    let buy = |jwt_user: &str, claimed: &str| {
        gw.client()
            .request(
                "POST",
                ORDERS,
                &[
                    ("Authorization", &bearer(&rs256(jwt_user))),
                    ("X-User-Id", claimed),
                    ("X-Entry-Token", &entry),
                ],
                b"{}",
            )
            .unwrap()
    };
    // Another user's session with the victim's X-User-Id and token: refused.
    let r = buy("2002", "1001");
    assert_eq!(r.status, 403);
    assert_eq!(up.count(), 0);
    let r = buy("1001", "9");
    assert_eq!(r.status, 200);
    assert_eq!(up.requests()[0].headers_named("x-user-id"), vec!["1001"]);
}

#[test]
fn rollout_buckets_use_the_verified_id() {
    // Half the users queue; the other half pass without a token.
    let bucket = |u: u64| vq_gateway::flag::bucket(u);
    let inside = (1..).find(|u| bucket(*u) < 50).unwrap();
    let outside = (1..).find(|u| bucket(*u) >= 50).unwrap();
    let (gw, up) = jwt_gateway(|c| c.flag.rollout_percent = 50);
    // Claiming an id outside the rollout does not let an inside user skip the token.
    let r = gw
        .client()
        .request(
            "POST",
            ORDERS,
            &[
                ("Authorization", &bearer(&rs256(&inside.to_string()))),
                ("X-User-Id", &outside.to_string()),
            ],
            b"{}",
        )
        .unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(up.count(), 0);
    let r = gw
        .client()
        .request(
            "POST",
            ORDERS,
            &[("Authorization", &bearer(&rs256(&outside.to_string())))],
            b"{}",
        )
        .unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn hs256_from_a_secret_file() {
    let (gw, _up) = jwt_gateway(|c| {
        c.identity.algorithms = vec![JwtAlgorithm::HS256];
        c.identity.key_file = data("hs256.secret").display().to_string();
    });
    let ok = sign(Algorithm::HS256, "hs256.secret", None, &claims("77"));
    assert_eq!(enter(&gw, &[("Authorization", &bearer(&ok))]).status, 200);
    let rs = rs256("77");
    assert_eq!(enter(&gw, &[("Authorization", &bearer(&rs))]).status, 401);
}

#[test]
fn es256_from_a_jwks_file_reloaded_when_it_changes() {
    let dir = TempDir::new("jwks");
    let jwks = dir.0.join("jwks.json");
    std::fs::copy(data("jwks_a.json"), &jwks).unwrap();
    let path = jwks.display().to_string();
    let (gw, _up) = jwt_gateway(|c| {
        c.identity.algorithms = vec![JwtAlgorithm::ES256];
        c.identity.key_file = String::new();
        c.identity.jwks_file = path.clone();
    });
    let a = sign(Algorithm::ES256, "ec_a.key", Some("a"), &claims("11"));
    let b = sign(Algorithm::ES256, "ec_b.key", Some("b"), &claims("12"));
    assert_eq!(enter(&gw, &[("Authorization", &bearer(&a))]).status, 200);
    assert_eq!(enter(&gw, &[("Authorization", &bearer(&b))]).status, 401);
    // A broken file keeps the old keys.
    std::fs::write(&jwks, b"{not json").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(enter(&gw, &[("Authorization", &bearer(&a))]).status, 200);
    // Key rotation: the new set is picked up within a couple of seconds.
    std::fs::copy(data("jwks_ab.json"), &jwks).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || enter(
            &gw,
            &[("Authorization", &bearer(&b))]
        )
        .status
            == 200),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("identity keys reloaded"));
}

#[test]
fn identity_configuration_errors_name_their_key() {
    let cases = [
        ("[identity]\nmode = \"cookie\"\n", "identity.mode"),
        ("[identity]\nmode = \"jwt\"\n", "identity.key_file"),
        (
            "[identity]\nmode = \"jwt\"\nalgorithms = [\"PS512\"]\nkey_file = \"x\"\n",
            "identity.algorithms[0]",
        ),
        (
            "[identity]\nmode = \"jwt\"\nkey_file = \"x\"\njwks_file = \"y\"\n",
            "identity.key_file",
        ),
    ];
    let dir = TempDir::new("idcfg");
    for (i, (text, key)) in cases.iter().enumerate() {
        let path = dir.0.join(format!("{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let (code, _, err) = run_bin(
            &["check-config", "--config", path.to_str().unwrap()],
            &[],
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(64), "{text}");
        assert!(err.contains(key), "{text}: {err}");
    }
}

#[test]
fn header_mode_trusts_the_header_as_documented() {
    let up = Upstream::start();
    let gw = GatewayProc::start(test_config(up.addr));
    let r = enter(&gw, &[("X-User-Id", "31")]);
    assert_eq!(r.status, 200);
    let r = enter(&gw, &[]);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["code"], "BAD_REQUEST");
}

/// The other spelling of an ES256 signature (`s` → `n - s`): the same signature to every
/// standard verifier, and what OpenSSL-based signers produce half the time.
fn twin(token: &str) -> String {
    const N: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63,
        0x25, 0x51,
    ];
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (signed, sig) = token.rsplit_once('.').unwrap();
    let mut sig = b64.decode(sig).unwrap();
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let d = i16::from(N[i]) - i16::from(sig[32 + i]) - borrow;
        sig[32 + i] = d.rem_euclid(256) as u8;
        borrow = i16::from(d < 0);
    }
    format!("{signed}.{}", b64.encode(sig))
}

fn high_s(token: &str) -> bool {
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.rsplit_once('.').unwrap().1)
        .unwrap();
    sig[32] >= 0x80
}

#[test]
fn es256_signatures_verify_in_both_spellings_unless_low_s_only() {
    let es = |c: &mut ConfigFile| {
        c.identity.algorithms = vec![JwtAlgorithm::ES256];
        c.identity.key_file = data("ec_a.pub").display().to_string();
    };
    let (gw, _up) = jwt_gateway(es);
    let (strict, _up2) = jwt_gateway(|c| {
        es(c);
        c.identity.es256_low_s_only = true;
    });
    let mut both = (false, false);
    for user in 1..=40u64 {
        let t = sign(
            Algorithm::ES256,
            "ec_a.key",
            None,
            &claims(&user.to_string()),
        );
        let signed_high = high_s(&t);
        let (low, high) = if signed_high {
            (twin(&t), t.clone())
        } else {
            (t.clone(), twin(&t))
        };
        assert!(!high_s(&low) && high_s(&high));
        assert_eq!(enter(&gw, &[("Authorization", &bearer(&low))]).status, 200);
        assert_eq!(enter(&gw, &[("Authorization", &bearer(&high))]).status, 200);
        assert_eq!(
            enter(&strict, &[("Authorization", &bearer(&low))]).status,
            200
        );
        assert_eq!(
            enter(&strict, &[("Authorization", &bearer(&high))]).status,
            401
        );
        both = (both.0 | !signed_high, both.1 | signed_high);
    }
    assert!(both.0 && both.1, "the signer gave both spellings");
}

#[test]
fn an_issuer_that_is_not_one_string_is_refused() {
    let (gw, _up) = jwt_gateway(|_| {});
    for iss in [
        serde_json::json!(["https://auth.test"]),
        serde_json::json!(["https://evil.test", "https://auth.test"]),
        serde_json::json!({"iss": "https://auth.test"}),
        serde_json::json!(7),
    ] {
        let mut c = claims("5");
        c["iss"] = iss.clone();
        let t = sign(Algorithm::RS256, "rsa_a.key", None, &c);
        assert_eq!(
            enter(&gw, &[("Authorization", &bearer(&t))]).status,
            401,
            "{iss}"
        );
    }
}

/// The gateway's CPU time (user + system) so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// With 16 keys, a token must name its key (one verification at most), and a flood of bogus
/// tokens costs the gateway at most twice the CPU of as many ordinary requests.
#[test]
fn a_bogus_token_costs_at_most_two_ordinary_requests() {
    let _serial = serial();
    let dir = TempDir::new("jwks16");
    let jwks = dir.0.join("jwks.json");
    // rsa_a's public key under 16 key ids.
    let pem = std::fs::read_to_string(data("rsa_a.pub")).unwrap();
    let der = base64::engine::general_purpose::STANDARD
        .decode(
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .unwrap();
    // SubjectPublicKeyInfo of a 2048-bit key: the modulus starts 33 bytes in, the exponent is
    // the last three bytes.
    let (n, e) = (&der[33..33 + 256], &der[der.len() - 3..]);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let keys: Vec<serde_json::Value> = (0..16)
        .map(|i| {
            serde_json::json!({"kty": "RSA", "alg": "RS256", "use": "sig", "kid": format!("k{i}"),
                "n": b64.encode(n), "e": b64.encode(e)})
        })
        .collect();
    std::fs::write(&jwks, serde_json::json!({ "keys": keys }).to_string()).unwrap();
    let path = jwks.display().to_string();
    let (gw, _up) = jwt_gateway(|c| {
        c.identity.key_file = String::new();
        c.identity.jwks_file = path.clone();
    });
    let named = sign(Algorithm::RS256, "rsa_a.key", Some("k7"), &claims("31"));
    let unnamed = sign(Algorithm::RS256, "rsa_a.key", None, &claims("31"));
    assert_eq!(
        enter(&gw, &[("Authorization", &bearer(&named))]).status,
        200
    );
    let r = enter(&gw, &[("Authorization", &bearer(&unnamed))]);
    assert_eq!(r.status, 401);
    assert!(
        r.json()["detail"].as_str().unwrap().contains("kid"),
        "{}",
        r.json()
    );

    // Bogus tokens: well-formed, naming a key, each with its own random signature.
    let (signed, _) = named.rsplit_once('.').unwrap();
    let bogus: Vec<String> = (0..1500u32)
        .map(|i| {
            let sig: Vec<u8> = (0..256u32)
                .map(|j| (i.wrapping_mul(31) ^ j.wrapping_mul(7)) as u8)
                .collect();
            format!("{signed}.{}", b64.encode(sig))
        })
        .collect();
    let mut c = gw.client();
    let mut run = |tokens: &mut dyn Iterator<Item = &String>| {
        let before = cpu_ticks(gw.pid());
        let mut n = 0u64;
        for t in tokens {
            let r = c
                .request(
                    "POST",
                    &format!("{Q}/entries"),
                    &[("Authorization", &bearer(t))],
                    b"",
                )
                .unwrap();
            assert!(matches!(r.status, 200 | 401));
            n += 1;
        }
        (cpu_ticks(gw.pid()) - before) as f64 / n as f64
    };
    // The same bogus tokens without a key id: with 16 candidate keys, each would have cost up
    // to 16 verifications.
    let (unsigned_header, _) = signed.split_once('.').unwrap();
    let header: serde_json::Value =
        serde_json::from_slice(&b64.decode(unsigned_header).unwrap()).unwrap();
    let mut no_kid = header.clone();
    no_kid.as_object_mut().unwrap().remove("kid");
    let no_kid_header = b64.encode(no_kid.to_string());
    let anonymous: Vec<String> = bogus
        .iter()
        .map(|t| t.replacen(unsigned_header, &no_kid_header, 1))
        .collect();
    let ordinary = run(&mut std::iter::repeat_n(&named, 1500));
    let attack = run(&mut bogus.iter());
    let anonymous_attack = run(&mut anonymous.iter());
    let ordinary_again = run(&mut std::iter::repeat_n(&named, 1500));
    let ordinary = ordinary.max(ordinary_again);
    eprintln!(
        "JWT cost, CPU ticks per request: ordinary {ordinary:.4}, bogus token naming a key {attack:.4} ({:.2}x), naming none {anonymous_attack:.4} ({:.2}x)",
        attack / ordinary,
        anonymous_attack / ordinary
    );
    assert!(
        attack <= 2.0 * ordinary,
        "bogus {attack} vs ordinary {ordinary}"
    );
    assert!(
        anonymous_attack <= 2.0 * ordinary,
        "bogus without kid {anonymous_attack} vs ordinary {ordinary}"
    );
}
