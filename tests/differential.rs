//! One queue semantics: random sequences of enter, poll, leave, advance, sweep, stats, claims
//! and clock steps run against `MemoryStore` (the executable model) and `RedisStore` (the Lua
//! scripts on a real `redis-server`), and every reply must be the same.
//!
//! Where the two differ by design, the comparison says so instead of hiding it:
//! - the tick guard: the scripts time it with Redis' own clock (so instances agree), the memory
//!   store with the caller's; the sequences run with the guard off (`min_interval` 0), and the
//!   guard is tested on its own in `store_contract.rs` and `pump.rs`;
//! - wait statistics: Redis keeps sparse enter-time checkpoints (over-estimating a wait by under
//!   a second), memory the exact times; and the admission rate is sampled on Redis' clock. Stats
//!   compare the counts exactly and the waits within that second;
//! - the cap on open queues: Redis frees a slot when the pump retires an empty target, memory at
//!   once; `targets.rs` tests both end to end, so the sequences run without a binding cap.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use vq_gateway::queue::{QueueTarget, TargetType};
use vq_gateway::sale::SaleDefaults;
use vq_gateway::store::{
    ClaimTerms, MemoryStore, Now, QueueStore, RedisStore, Settle, TokenCandidate,
};

const CAPACITY: u64 = 6;
const BASE_MS: u64 = 1_900_000_000_000;

/// Claims whose leases never lapse within a run (Redis times them by its own clock, the memory
/// store by the ops' clock), and three attempts per token.
const TERMS: ClaimTerms = ClaimTerms {
    ttl: Duration::from_secs(600),
    lease: Duration::from_secs(3600),
    max_attempts: 3,
};

#[derive(Debug, Clone)]
enum Op {
    Enter {
        target: u64,
        user: u64,
    },
    Poll {
        target: u64,
        user: u64,
    },
    Leave {
        target: u64,
        user: u64,
    },
    Advance {
        target: u64,
        batch: u32,
    },
    Sweep {
        target: u64,
        credit_ms: u64,
        max: u32,
    },
    Stats {
        target: u64,
    },
    Claim {
        target: u64,
        token: u8,
        owner: u8,
    },
    Settle {
        target: u64,
        token: u8,
        owner: u8,
        how: u8,
    },
    Step {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let target = 1u64..=2;
    let user = 1u64..=8;
    prop_oneof![
        4 => (target.clone(), user.clone()).prop_map(|(target, user)| Op::Enter { target, user }),
        4 => (target.clone(), user.clone()).prop_map(|(target, user)| Op::Poll { target, user }),
        1 => (target.clone(), user).prop_map(|(target, user)| Op::Leave { target, user }),
        2 => (target.clone(), 1u32..=3).prop_map(|(target, batch)| Op::Advance { target, batch }),
        1 => (target.clone(), 0u64..12_000, 1u32..=3)
            .prop_map(|(target, credit_ms, max)| Op::Sweep { target, credit_ms, max }),
        1 => target.clone().prop_map(|target| Op::Stats { target }),
        1 => (target.clone(), 0u8..3, 0u8..2)
            .prop_map(|(target, token, owner)| Op::Claim { target, token, owner }),
        1 => (target, 0u8..3, 0u8..2, 0u8..3)
            .prop_map(|(target, token, owner, how)| Op::Settle { target, token, owner, how }),
        2 => (0u64..2_500).prop_map(|ms| Op::Step { ms }),
    ]
}

/// The sales both stores create on a first enter: one-second heartbeat windows (a 4 s timeout:
/// the clock steps below cross several, and sweeps reach from the timeout to beyond the farthest
/// a sweep reads, then nobody is evicted); a batch of a million, so that an advance's share in
/// millionths is the batch it admits; no guard between advances (a tick of 0, which no file or
/// operator may set: the memory store's guard runs on the ops' clock, Redis' on its own).
fn defaults() -> SaleDefaults {
    SaleDefaults {
        batch_size: 1_000_000,
        tick_ms: 0,
        max_capacity: CAPACITY,
        heartbeat_timeout_s: 4,
    }
}

fn target(id: u64) -> QueueTarget {
    QueueTarget::new(TargetType::LimitedDrop, id)
}

/// One op on one store, its reply rendered for comparison.
async fn apply(s: &dyn QueueStore, op: &Op, now: Now) -> String {
    match *op {
        Op::Enter { target: t, user } => {
            format!("{:?}", s.enter(target(t), user, now).await.unwrap())
        }
        Op::Poll { target: t, user } => {
            let c = TokenCandidate {
                token: format!("tok-{t}-{user}-{}", now.epoch_ms),
                expires_at: now.epoch_ms / 1000 + 600,
            };
            let reply = s
                .poll(target(t), user, now, &|| Some(c.clone()))
                .await
                .unwrap();
            // The wait reported on admission is checkpointed in Redis: compared in stats.
            match reply {
                vq_gateway::store::PollOutcome::Admitted {
                    token, expires_at, ..
                } => format!("Admitted {{ token: {token:?}, expires_at: {expires_at} }}"),
                other => format!("{other:?}"),
            }
        }
        Op::Leave { target: t, user } => {
            format!("{:?}", s.leave(target(t), user).await.unwrap())
        }
        Op::Advance { target: t, batch } => {
            let a = s
                .advance(target(t), &vq_gateway::store::Part::ppm(batch), now)
                .await
                .unwrap();
            format!(
                "{:?} mark {} admitted {} waiting {}",
                a.outcome, a.admitted_count, a.admitted_now, a.waiting
            )
        }
        Op::Sweep {
            target: t,
            credit_ms,
            max,
        } => {
            format!(
                "{:?}",
                s.sweep(target(t), credit_ms, max, now).await.unwrap()
            )
        }
        Op::Stats { target: t } => {
            let st = s.stats(target(t), now).await.unwrap();
            format!(
                "waiting {} admitted {}",
                st.waiting_count, st.admitted_count
            )
        }
        Op::Claim {
            target: t,
            token,
            owner,
        } => {
            format!(
                "{:?}",
                s.claim(
                    target(t),
                    &format!("c{token}"),
                    &format!("o{owner}"),
                    TERMS,
                    now
                )
                .await
                .unwrap()
            )
        }
        Op::Settle {
            target: t,
            token,
            owner,
            how,
        } => {
            let how = [Settle::Spend, Settle::GiveBack, Settle::Undo][usize::from(how)];
            format!(
                "{:?}",
                s.settle(
                    target(t),
                    &format!("c{token}"),
                    &format!("o{owner}"),
                    how,
                    TERMS,
                    now
                )
                .await
                .unwrap()
            )
        }
        Op::Step { .. } => String::new(),
    }
}

/// Waits agree within the checkpoint resolution (Redis over-estimates by under a second).
async fn compare_waits(memory: &dyn QueueStore, redis: &dyn QueueStore, now: Now) {
    for t in 1..=2 {
        let m = memory.stats(target(t), now).await.unwrap();
        let r = redis.stats(target(t), now).await.unwrap();
        assert!(
            r.avg_wait_seconds >= m.avg_wait_seconds - 1e-9
                && r.avg_wait_seconds <= m.avg_wait_seconds + 1.0 + 1e-9,
            "avg wait: memory {m:?}, redis {r:?}"
        );
        assert!(
            r.p95_wait_seconds <= m.p95_wait_seconds + 1.0 + 1e-9,
            "p95 wait: memory {m:?}, redis {r:?}"
        );
    }
}

async fn run(ops: &[Op], redis: &RedisServer, store: &RedisStore) -> Result<(), TestCaseError> {
    redis.cmd(&["FLUSHALL"]);
    // Emptied on purpose between cases: no loss to repair (docs/state.md).
    store.forget_all_seen();
    let memory = MemoryStore::new().with_sale_defaults(defaults());
    let mut now_ms = BASE_MS;
    for (i, op) in ops.iter().enumerate() {
        if let Op::Step { ms } = op {
            now_ms += ms;
            continue;
        }
        let now = Now { epoch_ms: now_ms };
        let m = apply(&memory, op, now).await;
        let r = apply(store, op, now).await;
        prop_assert_eq!(&m, &r, "op {} {:?} after {:?}", i, op, &ops[..i]);
    }
    compare_waits(&memory, store, Now { epoch_ms: now_ms }).await;
    Ok(())
}

#[test]
fn memory_and_redis_give_the_same_replies() {
    let redis = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store: Arc<RedisStore> = rt.block_on(async {
        let s = Arc::new(
            RedisStore::new(&redis.url(), Duration::from_secs(2))
                .unwrap()
                .with_max_targets(1_000)
                .with_sale_defaults(defaults()),
        );
        assert!(s.connect(Duration::from_secs(5)).await);
        s
    });
    let cases: u32 = std::env::var("DIFFERENTIAL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
        rt.block_on(run(&ops, &redis, store.as_ref()))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
