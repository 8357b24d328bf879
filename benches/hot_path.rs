//! Micro-benchmarks of the per-request work that needs no I/O: entry-token verification, path
//! canonicalisation plus gated-route matching, the rollout bucket, the JSON of a poll reply, the
//! queue ticket of an enter answer, and a bearer JWT's verification (RS256 and ES256, a token
//! seen before and a bogus one).
//!
//! `cargo bench --bench hot_path` (criterion; each figure is the time of one call).

#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vq_gateway::config::GateSection;
use vq_gateway::flag::bucket;
use vq_gateway::queue::{EntryStatus, QueueEntryResponse, TargetType};
use vq_gateway::routing::gated::{match_route, GateRoute};
use vq_gateway::routing::path::canonicalize;
use vq_gateway::token::{mint, mint_ticket, verify, TicketPayload, TokenKeys, TokenPayload};

fn token(c: &mut Criterion) {
    let keys = TokenKeys::new(b"bench-secret-0123456789abcdefghijklmnop", None);
    let claims = TokenPayload {
        target_type: TargetType::LimitedDrop,
        target_id: 42,
        user_id: 1001,
        expires_at: 2_000_000_000,
    };
    let t = mint(&keys, &claims);
    c.bench_function("token verify", |b| {
        b.iter(|| verify(&keys, black_box(&t), 1_900_000_000))
    });
    c.bench_function("token mint", |b| b.iter(|| mint(&keys, black_box(&claims))));
    let ticket = TicketPayload {
        target_type: TargetType::LimitedDrop,
        target_id: 42,
        user_id: 1001,
        seq: 41_234,
        expires_at: 2_000_000_000,
    };
    c.bench_function("queue ticket mint", |b| {
        b.iter(|| mint_ticket(&keys, black_box(&ticket)))
    });
}

/// A JWT identity over one key file of `tests/data/jwt`, and a token signed with its private key
/// (by `openssl`, as an identity provider would).
fn jwt_identity(alg: &str, key: &str) -> (vq_gateway::identity::Identity, String) {
    use base64::Engine as _;
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jwt");
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#));
    let claims = b64.encode(r#"{"sub":"1001","exp":4000000000}"#);
    let signed = format!("{header}.{claims}");
    let out = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(data.join(format!("{key}.key")))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(signed.as_bytes())?;
            child.wait_with_output()
        })
        .expect("openssl signs");
    let mut sig = out.stdout;
    if alg == "ES256" {
        // DER (r, s) to the JWS form r || s.
        let int = |d: &[u8]| -> (Vec<u8>, usize) {
            let len = d[1] as usize;
            let v = &d[2..2 + len];
            let v = if v.len() > 32 { &v[v.len() - 32..] } else { v };
            let mut out = vec![0u8; 32 - v.len()];
            out.extend_from_slice(v);
            (out, 2 + len)
        };
        let (r, used) = int(&sig[2..]);
        let (s, _) = int(&sig[2 + used..]);
        sig = [r, s].concat();
    }
    let token = format!("{signed}.{}", b64.encode(sig));
    let config = vq_gateway::identity::IdentityConfig::Jwt(vq_gateway::identity::JwtConfig {
        algorithms: vec![if alg == "ES256" {
            vq_gateway::identity::JwtAlgorithm::ES256
        } else {
            vq_gateway::identity::JwtAlgorithm::RS256
        }],
        key: vq_gateway::identity::KeySource::File(data.join(format!("{key}.pub"))),
        issuer: None,
        audience: None,
        user_claim: "sub".into(),
        leeway_s: 30,
        es256_low_s_only: false,
    });
    let id = vq_gateway::identity::Identity::new(config).expect("keys load");
    (id, token)
}

fn jwt(c: &mut Criterion) {
    for (alg, key) in [("RS256", "rsa_a"), ("ES256", "ec_a")] {
        let (id, token) = jwt_identity(alg, key);
        let headers = |t: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                http::header::AUTHORIZATION,
                format!("Bearer {t}").parse().expect("header"),
            );
            h
        };
        let valid = headers(&token);
        assert_eq!(id.user(&valid), Ok(1001), "{alg} token verifies");
        c.bench_function(&format!("jwt {alg}, a token seen before"), |b| {
            b.iter(|| id.user(black_box(&valid)))
        });
        // A new bogus signature every call: one verification each (the cache never hits).
        let (signed, sig) = token.rsplit_once('.').expect("jws");
        let mut n = 0u64;
        c.bench_function(&format!("jwt {alg}, a bogus token"), |b| {
            b.iter(|| {
                use base64::Engine as _;
                n += 1;
                // The first 8 bytes of the signature replaced by a counter (11 characters).
                let unique =
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(n.to_be_bytes());
                let t = format!("{signed}.{unique}{}", &sig[11..]);
                id.user(&headers(&t))
            })
        });
    }
}

fn routing(c: &mut Criterion) {
    let routes: Vec<Arc<GateRoute>> = GateSection::default()
        .routes
        .iter()
        .map(|r| Arc::new(GateRoute::compile(&r.method, &r.path, r.target_type).expect("route")))
        .collect();
    // The gateway cuts the query off before canonicalising, so these paths have none.
    for (name, path) in [
        (
            "canonicalise + match a gated path",
            &b"/limited-drops/42/orders"[..],
        ),
        (
            "canonicalise + match a respelled gated path",
            b"/Limited-Drops/%34%32/orders/",
        ),
        (
            "canonicalise + match a passthrough path",
            b"/products/1234/reviews",
        ),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                let p = canonicalize(black_box(path)).expect("path");
                match_route(&routes, &p).map(|g| (g.target, g.canonical.len()))
            })
        });
    }
}

fn flag(c: &mut Criterion) {
    c.bench_function("rollout bucket", |b| {
        b.iter(|| bucket(black_box(123_456_789)))
    });
}

fn reply(c: &mut Criterion) {
    c.bench_function("poll reply JSON (waiting)", |b| {
        b.iter(|| {
            let r = QueueEntryResponse::from(EntryStatus::Waiting {
                seq: black_box(41_234),
                ahead: 1_234,
                eta_seconds: Some(25),
                poll_after_seconds: 12,
            });
            serde_json::to_vec(&r)
        })
    });
}

criterion_group!(benches, token, routing, flag, reply, jwt);
criterion_main!(benches);
