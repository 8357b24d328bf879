//! Micro-benchmarks of the per-request work that needs no I/O: entry-token verification, path
//! canonicalisation plus gated-route matching, the rollout bucket, and the JSON of a poll reply.
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
use vq_gateway::token::{mint, verify, TokenClaims, TokenKeys};

fn token(c: &mut Criterion) {
    let keys = TokenKeys::new(b"bench-secret-0123456789abcdefghijklmnop", None);
    let claims = TokenClaims {
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
                eta_seconds: 25,
                poll_after_seconds: 12,
            });
            serde_json::to_vec(&r)
        })
    });
}

criterion_group!(benches, token, routing, flag, reply);
criterion_main!(benches);
