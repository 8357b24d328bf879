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
use vq_gateway::token::{mint, TokenClaims, TokenKeys};

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
        &TokenClaims {
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
