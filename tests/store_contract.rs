//! One contract suite, run against both stores: the embedded `MemoryStore` and `RedisStore` on a
//! private `redis-server`. Then Redis-only checks of the key contract (docs/redis.md#keys): names,
//! scores, TTLs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisCluster, RedisServer, Resp, SentinelSet};
use vq_gateway::clock::now;
use vq_gateway::queue::{QueueTarget, TargetType};
use vq_gateway::sale::{Sale, SalePatch};
use vq_gateway::slice::Slice;
use vq_gateway::store::liveness::Liveness;
use vq_gateway::store::{
    Advance, AdvanceOutcome, ClaimTake, ClaimTerms, EnterOutcome, MemoryStore, Now, Part,
    PollOutcome, PresenceKind, QueueStore, RedisStore, RosterEntry, Settle, TickFigures,
    TokenCandidate,
};

const GUARD: Duration = Duration::from_millis(150);
/// The sale tick whose guard (0.95 of it) is `GUARD`.
const TICK_MS: u64 = 158;

fn target(id: u64) -> QueueTarget {
    QueueTarget::new(TargetType::LimitedDrop, id)
}

fn candidate(token: &str) -> TokenCandidate {
    TokenCandidate {
        token: token.to_string(),
        expires_at: now().epoch_ms / 1000 + 300,
    }
}

fn at(offset_ms: i64) -> Now {
    Now {
        epoch_ms: (now().epoch_ms as i64 + offset_ms) as u64,
    }
}

async fn enter(s: &dyn QueueStore, t: QueueTarget, user: u64) -> (u64, u64) {
    match s.enter(t, user, now()).await.unwrap() {
        EnterOutcome::Waiting { seq, ahead } => (seq, ahead),
        other => panic!("user {user}: expected WAITING, got {other:?}"),
    }
}

/// Sets the sale's batch and tick (created from the store's defaults if new).
async fn set_sale(s: &dyn QueueStore, t: QueueTarget, batch: u32, tick_ms: u64) -> Sale {
    let patch = SalePatch {
        batch_size: Some(batch),
        tick_ms: Some(tick_ms),
        ..SalePatch::default()
    };
    s.put_sale(t, &patch, now()).await.unwrap().unwrap()
}

/// Sets the sale's `maxCapacity`.
async fn set_capacity(s: &dyn QueueStore, t: QueueTarget, max: u64) -> Sale {
    let patch = SalePatch {
        max_capacity: Some(max),
        ..SalePatch::default()
    };
    s.put_sale(t, &patch, now()).await.unwrap().unwrap()
}

/// One admission step of the whole of a `batch` with the guard `GUARD`.
async fn advance(s: &dyn QueueStore, t: QueueTarget, batch: u32) -> Advance {
    set_sale(s, t, batch, TICK_MS).await;
    s.advance(t, &Part::whole(), now()).await.unwrap()
}

async fn poll(s: &dyn QueueStore, t: QueueTarget, user: u64, token: &str) -> PollOutcome {
    s.poll(t, user, now(), &|| Some(candidate(token)))
        .await
        .unwrap()
}

/// One test per contract scenario and store: `memory::<scenario>` and `redis::<scenario>` (a
/// private redis-server each), so a failure names the scenario and the store.
macro_rules! contract {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(&MemoryStore::new()).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let redis = RedisServer::start();
                    let store = connected_redis(&redis).await;
                    super::$scenario(store.as_ref()).await;
                }
            )*
        }
        mod sentinel {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let set = SentinelSet::start();
                    let store = Arc::new(
                        RedisStore::new(&set.url(), Duration::from_millis(1000)).unwrap(),
                    );
                    assert!(store.connect(Duration::from_secs(5)).await);
                    super::$scenario(store.as_ref()).await;
                    // Everything went to the primary the sentinels name.
                    assert!(set.primary.cmd(&["DBSIZE"]).as_int() > 0);
                }
            )*
        }
        mod cluster {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let cluster = RedisCluster::start();
                    let store = connected_cluster(&cluster).await;
                    super::$scenario(store.as_ref()).await;
                    assert_calls_stay_in_one_slot(&cluster);
                }
            )*
        }
    };
}

/// A Redis Cluster refuses a script whose keys span slots (CROSSSLOT); check it independently:
/// every script call any node ran (its slow log) has all its keys in one slot, the slot of a
/// key the node serves.
fn assert_calls_stay_in_one_slot(cluster: &RedisCluster) {
    let calls = cluster.script_calls();
    assert!(calls.len() > 3, "script calls seen: {}", calls.len());
    for (node, keys) in calls {
        let slots: std::collections::BTreeSet<i64> =
            keys.iter().map(|k| cluster.keyslot(k)).collect();
        assert_eq!(slots.len(), 1, "a call across slots: {keys:?}");
        let slot = *slots.iter().next().unwrap();
        assert_eq!(cluster.owner(slot), node, "{keys:?} ran on node {node}");
    }
}

async fn connected_cluster(cluster: &RedisCluster) -> Arc<RedisStore> {
    let store = Arc::new(RedisStore::new(&cluster.url(), Duration::from_millis(1000)).unwrap());
    assert!(
        store.connect(Duration::from_secs(5)).await,
        "could not connect to the cluster"
    );
    store
}

contract!(
    enter_is_ordered_and_idempotent,
    concurrent_duplicate_enters_waste_no_seq,
    simultaneous_calls_answer_as_one_after_another,
    ranks_follow_leaves_but_seqs_stay,
    advance_admits_live_users_only,
    advance_is_guarded_capped_and_monotonic,
    admission_mints_one_token,
    capacity_is_enforced,
    targets_are_independent,
    sweep_evicts_stale_users_up_to_the_cap,
    stats_report_the_queue,
    active_targets_list_entered_targets,
    a_claim_is_pending_spent_or_given_back,
    a_pending_claim_lapses_with_its_lease,
    the_console_history_keeps_the_last_ticks_and_goes_with_the_sale,
    the_roster_lists_its_members_with_their_last_registration,
);

/// The console's history: the last `keep` visits, oldest first, after `since`; deleting the sale
/// drops it.
async fn the_console_history_keeps_the_last_ticks_and_goes_with_the_sale(s: &dyn QueueStore) {
    let t = target(61);
    set_sale(s, t, 5, 500).await;
    let base = now().epoch_ms;
    let tick = |i: u64| TickFigures {
        at_ms: base + i * 500,
        admitted: i,
        evicted: i % 2,
        waiting: 100 - i,
        batch: 5,
        outcome: if i == 3 {
            AdvanceOutcome::Paused
        } else {
            AdvanceOutcome::Advanced
        },
    };
    assert!(s.ticks(t, 0).await.unwrap().is_empty());
    for i in 1..=4 {
        s.record_tick(t, tick(i), 3).await.unwrap();
    }
    assert_eq!(
        s.ticks(t, 0).await.unwrap(),
        vec![tick(2), tick(3), tick(4)]
    );
    assert_eq!(
        s.ticks(t, tick(3).at_ms).await.unwrap(),
        vec![tick(4)],
        "only what came after `since`"
    );
    assert!(s.ticks(target(62), 0).await.unwrap().is_empty());
    s.record_tick(target(62), tick(1), 3).await.unwrap();
    assert!(s.delete_sale(t).await.unwrap());
    assert!(s.ticks(t, 0).await.unwrap().is_empty());
    assert_eq!(
        s.ticks(target(62), 0).await.unwrap(),
        vec![tick(1)],
        "another sale's history stays"
    );
}

/// The roster for operators: each member with its slice, name and last registration; one that
/// left is gone.
async fn the_roster_lists_its_members_with_their_last_registration(s: &dyn QueueStore) {
    let before = now().epoch_ms;
    let asked = Slice::parse("0:500000").unwrap();
    let entry = RosterEntry {
        credit_ms: 1_500,
        ..registering("console-a", asked, false)
    };
    // Another member first (the memory store's roster is its one process: the last one).
    s.update_roster(registering(
        "console-b",
        Slice::parse("500000:1000000").unwrap(),
        false,
    ))
    .await
    .unwrap();
    s.update_roster(entry).await.unwrap();
    s.update_roster(entry).await.unwrap();
    let members = s.roster_members().await.unwrap();
    let member = members
        .iter()
        .find(|m| m.instance == "console-a")
        .unwrap_or_else(|| panic!("{members:?}"));
    assert_eq!(member.slice, "0:500000");
    assert_eq!(member.credit_ms, 1_500);
    assert!(member.last_seen_ms + 1_000 >= before, "{member:?}");
    assert!(member.last_seen_ms <= now().epoch_ms + 1_000, "{member:?}");
    s.update_roster(registering("console-a", asked, true))
        .await
        .unwrap();
    assert!(!s
        .roster_members()
        .await
        .unwrap()
        .iter()
        .any(|m| m.instance == "console-a"));
}

/// A claim is pending for one purchase attempt: that attempt may ask again (a retried call
/// whose first reply was lost), another is refused while it is in flight; a 2xx spends it, a
/// 4xx/5xx gives it back (an attempt that never reached the backend does not count), and one
/// token is tried at most `max_attempts` times.
async fn a_claim_is_pending_spent_or_given_back(s: &dyn QueueStore) {
    let terms = ClaimTerms {
        ttl: Duration::from_secs(60),
        lease: Duration::from_secs(60),
        max_attempts: 3,
    };
    let t = target(1);
    let take = |id: &'static str, owner: &'static str| async move {
        s.claim(t, id, owner, terms, now()).await.unwrap()
    };
    let settle = |id: &'static str, owner: &'static str, how: Settle| async move {
        s.settle(t, id, owner, how, terms, now()).await.unwrap()
    };
    assert_eq!(take("tok", "a").await, ClaimTake::Taken { attempts: 1 });
    assert_eq!(
        take("tok", "a").await,
        ClaimTake::Taken { attempts: 1 },
        "same attempt"
    );
    assert_eq!(take("tok", "b").await, ClaimTake::InFlight);
    assert_eq!(take("other", "b").await, ClaimTake::Taken { attempts: 1 });
    assert_eq!(
        s.claim(target(2), "tok", "a", terms, now()).await.unwrap(),
        ClaimTake::Taken { attempts: 1 },
        "per target"
    );
    assert!(!settle("tok", "b", Settle::GiveBack).await, "not b's claim");
    assert!(settle("tok", "a", Settle::Renew).await);
    assert!(settle("tok", "a", Settle::GiveBack).await, "a 409");
    assert_eq!(take("tok", "b").await, ClaimTake::Taken { attempts: 2 });
    assert!(
        settle("tok", "b", Settle::Undo).await,
        "never reached the backend"
    );
    assert_eq!(take("tok", "c").await, ClaimTake::Taken { attempts: 2 });
    assert!(settle("tok", "c", Settle::GiveBack).await);
    assert_eq!(take("tok", "d").await, ClaimTake::Taken { attempts: 3 });
    assert!(settle("tok", "d", Settle::GiveBack).await);
    assert_eq!(take("tok", "e").await, ClaimTake::Exhausted);
    // A success spends it for good.
    assert!(settle("other", "b", Settle::Spend).await);
    assert_eq!(take("other", "b").await, ClaimTake::Spent);
    assert!(
        !settle("other", "b", Settle::GiveBack).await,
        "spent stays spent"
    );
    assert_eq!(take("other", "c").await, ClaimTake::Spent);
}

/// A pending claim whose lease is not renewed lapses (its replica died): another attempt takes
/// it, and the dead attempt's late answer can no longer give it back.
async fn a_pending_claim_lapses_with_its_lease(s: &dyn QueueStore) {
    let terms = ClaimTerms {
        ttl: Duration::from_secs(60),
        lease: Duration::from_millis(200),
        max_attempts: 10,
    };
    let t = target(3);
    assert_eq!(
        s.claim(t, "tok", "dead", terms, now()).await.unwrap(),
        ClaimTake::Taken { attempts: 1 }
    );
    assert_eq!(
        s.claim(t, "tok", "retry", terms, now()).await.unwrap(),
        ClaimTake::InFlight
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!s
        .settle(t, "tok", "dead", Settle::Renew, terms, now())
        .await
        .unwrap());
    assert_eq!(
        s.claim(t, "tok", "retry", terms, now()).await.unwrap(),
        ClaimTake::Taken { attempts: 2 }
    );
    assert!(!s
        .settle(t, "tok", "dead", Settle::GiveBack, terms, now())
        .await
        .unwrap());
}

async fn enter_is_ordered_and_idempotent(s: &dyn QueueStore) {
    let t = target(1);
    for user in 1..=5 {
        assert_eq!(enter(s, t, 100 + user).await, (user, user - 1));
    }
    assert_eq!(enter(s, t, 103).await, (3, 2), "re-enter keeps the seq");
    assert_eq!(
        enter(s, t, 106).await,
        (6, 5),
        "no seq was consumed by the re-enter"
    );
    assert!(matches!(
        poll(s, t, 999, "x").await,
        PollOutcome::NotInQueue
    ));
    assert_eq!(
        poll(s, t, 104, "x").await,
        PollOutcome::Waiting { seq: 4, ahead: 3 }
    );
}

async fn concurrent_duplicate_enters_waste_no_seq(s: &dyn QueueStore) {
    let t = target(2);
    enter(s, t, 1).await;
    let calls = (0..50).map(|_| s.enter(t, 7, now()));
    let results = futures_join_all(calls).await;
    for r in results {
        assert_eq!(r.unwrap(), EnterOutcome::Waiting { seq: 2, ahead: 1 });
    }
    assert_eq!(enter(s, t, 8).await, (3, 2));
}

/// Enters and polls made at the same time answer as the same calls made one after another in
/// some order: duplicates, the capacity reached in the middle, users already waiting or
/// admitted, users never seen. (The Redis store sends the calls of one thread and target that
/// are ready together as one script call; on a multi-threaded runtime, as here, calls of
/// different threads are in no set order.)
async fn simultaneous_calls_answer_as_one_after_another(s: &dyn QueueStore) {
    let t = target(12);
    assert_eq!(enter(s, t, 8).await, (1, 0));
    assert_eq!(enter(s, t, 9).await, (2, 1));
    set_capacity(s, t, 4).await;
    let users = [1, 2, 1, 8, 3, 4, 2, 5];
    let entered = futures_join_all(users.iter().map(|u| s.enter(t, *u, now()))).await;
    let mut by_user = std::collections::BTreeMap::new();
    for (user, got) in users.iter().zip(entered) {
        let got = got.unwrap();
        // A user's simultaneous enters all answer the same.
        assert_eq!(
            *by_user.entry(*user).or_insert(got.clone()),
            got,
            "user {user}"
        );
    }
    assert_eq!(by_user[&8], EnterOutcome::Waiting { seq: 1, ahead: 0 });
    // Room for two more: two of the five newcomers got seqs 3 and 4, the rest are refused.
    let mut placed: Vec<(u64, u64)> = Vec::new();
    for user in [1, 2, 3, 4, 5] {
        match by_user[&user] {
            EnterOutcome::Waiting { seq, ahead } => placed.push((seq, ahead)),
            EnterOutcome::Full => {}
            ref other => panic!("user {user}: {other:?}"),
        }
    }
    placed.sort();
    assert_eq!(placed, vec![(3, 2), (4, 3)]);
    let polled_users = [1, 99, 2, 8, 1];
    let polled =
        futures_join_all(polled_users.map(|u| s.poll(t, u, now(), &|| Some(candidate("never")))))
            .await;
    for (user, got) in polled_users.iter().zip(polled) {
        let want = match by_user.get(user) {
            Some(EnterOutcome::Waiting { seq, ahead }) => PollOutcome::Waiting {
                seq: *seq,
                ahead: *ahead,
            },
            _ => PollOutcome::NotInQueue,
        };
        assert_eq!(got.unwrap(), want, "poll of user {user}");
    }
    // No seq went to a refused or repeated enter.
    set_capacity(s, t, 1_000).await;
    assert_eq!(enter(s, t, 6).await, (5, 4));
    // User 8 is admitted; entering again with a newcomer answers its token.
    advance(s, t, 1).await;
    let PollOutcome::Admitted { token, .. } = poll(s, t, 8, "token-8").await else {
        panic!("user 8 was not admitted");
    };
    let both = futures_join_all([8, 10].map(|u| s.enter(t, u, now()))).await;
    assert!(
        matches!(&both[0], Ok(EnterOutcome::Admitted { token: tk, .. }) if *tk == token),
        "{:?}",
        both[0]
    );
    assert!(
        matches!(both[1], Ok(EnterOutcome::Waiting { seq: 6, .. })),
        "{:?}",
        both[1]
    );
}

async fn ranks_follow_leaves_but_seqs_stay(s: &dyn QueueStore) {
    let t = target(3);
    for user in 1..=6 {
        enter(s, t, user).await;
    }
    s.leave(t, 2).await.unwrap();
    s.leave(t, 2).await.unwrap(); // idempotent
    s.leave(t, 4).await.unwrap();
    assert_eq!(
        poll(s, t, 5, "x").await,
        PollOutcome::Waiting { seq: 5, ahead: 2 }
    );
    assert_eq!(
        poll(s, t, 6, "x").await,
        PollOutcome::Waiting { seq: 6, ahead: 3 }
    );
    assert!(matches!(poll(s, t, 2, "x").await, PollOutcome::NotInQueue));
    // Leaving does not admit anyone: admission is by seq against the mark.
    assert_eq!(
        poll(s, t, 1, "x").await,
        PollOutcome::Waiting { seq: 1, ahead: 0 }
    );
    // Re-entering after a leave goes to the back with a new seq.
    assert_eq!(enter(s, t, 2).await, (7, 4));
}

async fn advance_admits_live_users_only(s: &dyn QueueStore) {
    let t = target(4);
    for user in 1..=10 {
        enter(s, t, user).await;
    }
    for user in [1, 2, 4, 6] {
        s.leave(t, user).await.unwrap();
    }
    // Live: 3 5 7 8 9 10. A batch of 3 admits 3, 5 and 7: the holes take no slot.
    let a = advance(s, t, 3).await;
    assert_eq!(a.outcome, AdvanceOutcome::Advanced);
    assert_eq!((a.admitted_count, a.admitted_now), (7, 3));
    assert!(matches!(
        poll(s, t, 7, "t7").await,
        PollOutcome::Admitted { .. }
    ));
    assert!(matches!(
        poll(s, t, 8, "t8").await,
        PollOutcome::Waiting { seq: 8, .. }
    ));
}

async fn advance_is_guarded_capped_and_monotonic(s: &dyn QueueStore) {
    let t = target(5);
    assert_eq!(advance(s, t, 5).await.outcome, AdvanceOutcome::Idle);
    for user in 1..=4 {
        enter(s, t, user).await;
    }
    let a = advance(s, t, 2).await;
    assert_eq!((a.outcome, a.admitted_count), (AdvanceOutcome::Advanced, 2));
    // A guard far longer than any pause between the two calls.
    set_sale(s, t, 2, 63_158).await;
    let g = s.advance(t, &Part::whole(), now()).await.unwrap();
    assert_eq!(
        (g.outcome, g.admitted_count),
        (AdvanceOutcome::Guarded, 2),
        "second advance within the guard"
    );
    assert!(g.retry_in_ms > 0 && g.retry_in_ms <= 60_000, "{g:?}");
    tokio::time::sleep(GUARD + Duration::from_millis(20)).await;
    // More than are waiting: capped at seq.
    let a = advance(s, t, 100).await;
    assert_eq!(
        (a.outcome, a.admitted_count, a.admitted_now),
        (AdvanceOutcome::Advanced, 4, 2)
    );
    tokio::time::sleep(GUARD + Duration::from_millis(20)).await;
    let i = advance(s, t, 100).await;
    assert_eq!((i.outcome, i.admitted_count), (AdvanceOutcome::Idle, 4));
    // Leaves never move the mark back.
    s.leave(t, 4).await.unwrap();
    enter(s, t, 9).await;
    tokio::time::sleep(GUARD + Duration::from_millis(20)).await;
    let a = advance(s, t, 100).await;
    assert_eq!(a.admitted_count, 5);
}

async fn admission_mints_one_token(s: &dyn QueueStore) {
    let t = target(6);
    enter(s, t, 1).await;
    enter(s, t, 2).await;
    advance(s, t, 1).await;
    let first = poll(s, t, 1, "token-one").await;
    let PollOutcome::Admitted {
        token,
        expires_at,
        waited_ms,
    } = first
    else {
        panic!("expected ADMITTED, got {first:?}");
    };
    assert_eq!(token, "token-one");
    assert!(waited_ms.is_some_and(|ms| ms < 60_000), "{waited_ms:?}");
    assert!(expires_at > now().epoch_ms / 1000);
    // Later polls and enters answer the same token, not the new candidate.
    assert_eq!(
        poll(s, t, 1, "token-two").await,
        PollOutcome::Admitted {
            token: "token-one".into(),
            expires_at,
            waited_ms: None,
        }
    );
    assert_eq!(
        s.enter(t, 1, now()).await.unwrap(),
        EnterOutcome::Admitted {
            token: "token-one".into(),
            expires_at
        }
    );
    // The gate's lookup answers the stored token, and nothing for a user holding none.
    assert_eq!(
        s.stored_token(t, 1, now()).await.unwrap().as_deref(),
        Some("token-one")
    );
    assert_eq!(s.stored_token(t, 2, now()).await.unwrap(), None);
    assert_eq!(s.stored_token(target(99), 1, now()).await.unwrap(), None);
    // Concurrent polls of an admitted user store one token.
    tokio::time::sleep(GUARD + Duration::from_millis(20)).await;
    advance(s, t, 1).await;
    let results = futures_join_all((0..20).map(|i| {
        let c = candidate(&format!("race-{i}"));
        async move { s.poll(t, 2, now(), &|| Some(c.clone())).await.unwrap() }
    }))
    .await;
    let tokens: std::collections::BTreeSet<String> = results
        .into_iter()
        .map(|r| match r {
            PollOutcome::Admitted { token, .. } => token,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    // Leave drops the token: the user is out.
    s.leave(t, 1).await.unwrap();
    assert!(matches!(poll(s, t, 1, "x").await, PollOutcome::NotInQueue));
    assert_eq!(s.stored_token(t, 1, now()).await.unwrap(), None);
}

async fn capacity_is_enforced(s: &dyn QueueStore) {
    let t = target(7);
    set_capacity(s, t, 3).await;
    for user in 1..=3 {
        assert!(matches!(
            s.enter(t, user, now()).await.unwrap(),
            EnterOutcome::Waiting { .. }
        ));
    }
    assert_eq!(s.enter(t, 4, now()).await.unwrap(), EnterOutcome::Full);
    assert_eq!(
        s.enter(t, 2, now()).await.unwrap(),
        EnterOutcome::Waiting { seq: 2, ahead: 1 },
        "a user already waiting is not refused"
    );
    s.leave(t, 1).await.unwrap();
    assert_eq!(
        s.enter(t, 4, now()).await.unwrap(),
        EnterOutcome::Waiting { seq: 4, ahead: 2 }
    );
}

async fn targets_are_independent(s: &dyn QueueStore) {
    let a = target(8);
    let b = QueueTarget::new(TargetType::TicketingEvent, 8);
    assert_eq!(enter(s, a, 1).await, (1, 0));
    assert_eq!(enter(s, a, 2).await, (2, 1));
    assert_eq!(enter(s, b, 2).await, (1, 0));
    advance(s, a, 10).await;
    assert!(matches!(
        poll(s, a, 2, "x").await,
        PollOutcome::Admitted { .. }
    ));
    assert_eq!(
        poll(s, b, 2, "x").await,
        PollOutcome::Waiting { seq: 1, ahead: 0 }
    );
}

async fn sweep_evicts_stale_users_up_to_the_cap(s: &dyn QueueStore) {
    let t = target(9);
    // Users 1..=5 last seen 120 s ago; 6 and 7 now.
    for user in 1..=5 {
        s.enter(t, user, at(-120_000)).await.unwrap();
    }
    enter(s, t, 6).await;
    enter(s, t, 7).await;
    assert_eq!(s.sweep(t, 0, 3, now()).await.unwrap(), 3, "capped at max");
    assert_eq!(s.sweep(t, 0, 3, now()).await.unwrap(), 2);
    assert_eq!(s.sweep(t, 0, 3, now()).await.unwrap(), 0);
    for user in 1..=5 {
        assert!(
            matches!(poll(s, t, user, "x").await, PollOutcome::NotInQueue),
            "{user}"
        );
    }
    assert_eq!(
        poll(s, t, 6, "x").await,
        PollOutcome::Waiting { seq: 6, ahead: 0 }
    );
    // A poll refreshes the heartbeat: an old user who polls is kept.
    s.enter(t, 20, at(-120_000)).await.unwrap();
    poll(s, t, 20, "x").await;
    assert_eq!(s.sweep(t, 0, 10, now()).await.unwrap(), 0);
    // Evicted users re-enter at the back.
    assert_eq!(enter(s, t, 1).await, (9, 3));
}

async fn stats_report_the_queue(s: &dyn QueueStore) {
    let t = target(10);
    for user in 1..=4 {
        s.enter(t, user, at(-3_000)).await.unwrap();
    }
    advance(s, t, 2).await;
    poll(s, t, 1, "a").await;
    poll(s, t, 2, "b").await;
    tokio::time::sleep(GUARD + Duration::from_millis(20)).await;
    advance(s, t, 1).await;
    let st = s.stats(t, now()).await.unwrap();
    assert_eq!(st.waiting_count, 2, "{st:?}");
    assert_eq!(st.admitted_count, 3);
    assert!(st.admission_rate_per_sec > 0.0, "{st:?}");
    assert!((2.9..10.0).contains(&st.avg_wait_seconds), "{st:?}");
    assert!(st.p95_wait_seconds >= st.avg_wait_seconds - 0.01, "{st:?}");
    let empty = s.stats(target(11), now()).await.unwrap();
    assert_eq!((empty.waiting_count, empty.admitted_count), (0, 0));
    assert_eq!(empty.avg_wait_seconds, 0.0);
}

async fn active_targets_list_entered_targets(s: &dyn QueueStore) {
    let event = QueueTarget::new(TargetType::TicketingEvent, 8);
    for t in [target(1), target(2), target(3), event] {
        enter(s, t, 1).await;
    }
    let active = s.active_targets(now()).await.unwrap();
    for t in [target(1), target(2), target(3), event] {
        assert!(active.contains(&t), "{t} missing from {active:?}");
    }
    assert!(!active.contains(&target(4)), "never entered: {active:?}");
}

/// Runs futures concurrently on the current task (no extra dependency for `join_all`).
async fn futures_join_all<F: std::future::Future>(
    futs: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let handles: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out = Vec::with_capacity(handles.len());
    let mut pending: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().map(Option::unwrap));
    out
}

pub async fn connected_redis(redis: &RedisServer) -> Arc<RedisStore> {
    let store = RedisStore::new(&redis.url(), Duration::from_millis(500)).unwrap();
    connect(store, redis).await
}

async fn connect(store: RedisStore, redis: &RedisServer) -> Arc<RedisStore> {
    let store = Arc::new(store);
    store.connect(Duration::from_secs(2)).await;
    for _ in 0..200 {
        if store.ping().await.is_ok() {
            return store;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("could not connect to redis on {}", redis.port);
}

async fn target_cap(s: Arc<dyn QueueStore>) {
    for id in 100..103 {
        enter(s.as_ref(), target(id), 1).await;
    }
    assert_eq!(
        s.enter(target(103), 1, now()).await.unwrap(),
        EnterOutcome::TooManyTargets
    );
    assert_eq!(
        enter(s.as_ref(), target(101), 2).await,
        (2, 1),
        "existing targets still work"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_stores_cap_the_number_of_targets() {
    target_cap(Arc::new(MemoryStore::new().with_max_targets(3))).await;
    let redis = RedisServer::start();
    let store = RedisStore::new(&redis.url(), Duration::from_millis(500)).unwrap();
    target_cap(connect(store.with_max_targets(3), &redis).await).await;
}

/// A slot migrated by hand, step by step, as `redis-cli --cluster reshard` does it, with calls in
/// each state: a single-key call whose key is already gone from the source is sent on with
/// `ASK` (and `ASKING` on the importing node), a multi-key call during the move gets `TRYAGAIN`
/// and is retried, and once the slot is assigned the `MOVED` reply sends calls to the new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_calls_follow_a_slot_migration_step_by_step() {
    let cluster = RedisCluster::start();
    let s = connected_cluster(&cluster).await;
    let t = target(7);
    for u in 1..=5 {
        enter(s.as_ref(), t, u).await;
    }
    let slot = cluster.keyslot("{LIMITED_DROP:7}");
    let src = cluster.owner(slot);
    let dst = (src + 1) % 3;
    let (src_id, dst_id) = (cluster.node_id(src), cluster.node_id(dst));
    let slot_s = slot.to_string();
    let ok = Resp::Str("OK".into());
    assert_eq!(
        cluster.nodes[dst].cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]),
        ok
    );
    assert_eq!(
        cluster.nodes[src].cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]),
        ok
    );
    // The pump lock does not exist anywhere: the source answers ASK, the importing node takes it.
    assert!(s
        .try_lock(t, "owner-a", Duration::from_secs(5))
        .await
        .unwrap());
    assert_eq!(cluster.nodes[dst].cmd(&["ASKING"]), ok);
    assert_eq!(
        cluster.nodes[dst]
            .cmd(&["GET", "queue:{LIMITED_DROP:7}:lock"])
            .as_str()
            .as_deref(),
        Some("owner-a"),
        "the lock was written on the importing node"
    );
    // Move every key, then poll: the poll's keys are split between "moved" and "absent", which
    // both nodes answer with TRYAGAIN until the slot is assigned.
    let keys: Vec<String> = cluster.nodes[src]
        .cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "1000"])
        .as_vec()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(keys.len() >= 5, "{keys:?}");
    let dst_port = cluster.nodes[dst].port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &dst_port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(cluster.nodes[src].cmd(&migrate), ok);
    let poller = {
        let s = s.clone();
        tokio::spawn(async move { poll(s.as_ref(), t, 3, "tok-3").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!poller.is_finished(), "the poll waits out the migration");
    for node in &cluster.nodes {
        assert_eq!(
            node.cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]),
            ok
        );
    }
    assert_eq!(
        poller.await.unwrap(),
        PollOutcome::Waiting { seq: 3, ahead: 2 },
        "answered by the new owner"
    );
    assert_eq!(cluster.owner(slot), dst);
    assert_eq!(
        enter(s.as_ref(), t, 6).await,
        (6, 5),
        "the sequence moved with the slot"
    );
    assert!(
        !s.try_lock(t, "owner-b", Duration::from_secs(5))
            .await
            .unwrap(),
        "the lock moved with the slot"
    );
}

/// `queue:active` and a target's keys live in different slots, so retiring an empty target and a
/// user entering it race. Two replicas: A remembers T as admitted (and skips `open.lua`), B's
/// pump retires it. Whatever the order, a target with waiting users ends up listed, and the cap
/// still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_target_is_listed_again_when_users_return() {
    let redis = RedisServer::start();
    let a = connect(
        RedisStore::new(&redis.url(), Duration::from_millis(500))
            .unwrap()
            .with_max_targets(1),
        &redis,
    )
    .await;
    let b = connect(
        RedisStore::new(&redis.url(), Duration::from_millis(500))
            .unwrap()
            .with_max_targets(1),
        &redis,
    )
    .await;
    let active = || {
        let mut v: Vec<String> = redis
            .cmd(&["SMEMBERS", "queue:active"])
            .as_vec()
            .iter()
            .filter_map(|r| r.as_str())
            .collect();
        v.sort();
        v
    };
    let (t1, t2) = (target(1), target(2));
    enter(a.as_ref(), t1, 1).await;
    assert_eq!(active(), vec!["LIMITED_DROP:1"]);

    // Retired while a user waits (the pump's emptiness check was stale): listed again at once.
    b.retire_target(t1).await.unwrap();
    assert_eq!(
        active(),
        vec!["LIMITED_DROP:1"],
        "a target with users stays"
    );

    // Retired empty; A still remembers it and skips open.lua, but its enter opens the empty
    // room and lists it again.
    a.leave(t1, 1).await.unwrap();
    b.retire_target(t1).await.unwrap();
    assert!(active().is_empty());
    assert_eq!(enter(a.as_ref(), t1, 2).await, (2, 0));
    assert_eq!(
        active(),
        vec!["LIMITED_DROP:1"],
        "re-listed by the opening enter"
    );

    // Retired empty again and its slot taken by another target: A's enter is refused by the cap
    // and leaves no user behind.
    a.leave(t1, 2).await.unwrap();
    b.retire_target(t1).await.unwrap();
    enter(b.as_ref(), t2, 3).await;
    assert_eq!(
        a.enter(t1, 4, now()).await.unwrap(),
        EnterOutcome::TooManyTargets
    );
    assert_eq!(active(), vec!["LIMITED_DROP:2"]);
    assert_eq!(
        redis
            .cmd(&["ZCARD", "queue:{LIMITED_DROP:1}:waiting"])
            .as_int(),
        0,
        "the refused user holds no place"
    );
}

/// `EVALSHA` calls Redis has run so far.
fn evalsha_calls(redis: &RedisServer) -> i64 {
    let info = redis.cmd(&["INFO", "commandstats"]).as_str().unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// On one thread (a proxy worker's runtime), the first of the enters of one target that are ready
/// together goes to Redis at once, and the others, which came while it was in flight, share one
/// script call; the same for polls. Each caller gets the answer it would have got alone, in the
/// order the calls were made.
#[tokio::test]
async fn simultaneous_enters_and_polls_of_a_target_are_one_script_call() {
    let redis = RedisServer::start();
    let store = connected_redis(&redis).await;
    let s = store.as_ref();
    let t = target(1);
    assert_eq!(enter(s, t, 1000).await, (1, 0)); // admits the target to queue:active first
    let before = evalsha_calls(&redis);
    let entered = futures_join_all((1..=40).map(|u| s.enter(t, u, now()))).await;
    assert_eq!(evalsha_calls(&redis) - before, 2);
    for (u, r) in (1..=40).zip(entered) {
        assert_eq!(
            r.unwrap(),
            EnterOutcome::Waiting {
                seq: u + 1,
                ahead: u
            }
        );
    }
    let before = evalsha_calls(&redis);
    let polled =
        futures_join_all((1..=40).map(|u| s.poll(t, u, now(), &|| Some(candidate("never"))))).await;
    assert_eq!(evalsha_calls(&redis) - before, 2);
    for (u, r) in (1..=40).zip(polled) {
        assert_eq!(
            r.unwrap(),
            PollOutcome::Waiting {
                seq: u + 1,
                ahead: u
            }
        );
    }

    // One call with duplicates, users already waiting and the capacity reached in the middle
    // (41 waiting, room for 2 more).
    set_capacity(s, t, 43).await;
    let users = [50, 51, 50, 7, 52, 53, 51];
    let before = evalsha_calls(&redis);
    let entered = futures_join_all(users.map(|u| s.enter(t, u, now()))).await;
    assert_eq!(evalsha_calls(&redis) - before, 2);
    let waiting = |seq, ahead| EnterOutcome::Waiting { seq, ahead };
    let expected = [
        waiting(42, 41),
        waiting(43, 42),
        waiting(42, 41),
        waiting(8, 7),
        EnterOutcome::Full,
        EnterOutcome::Full,
        waiting(43, 42),
    ];
    for ((user, got), want) in users.iter().zip(entered).zip(expected) {
        assert_eq!(got.unwrap(), want, "enter of user {user}");
    }
    set_capacity(s, t, 1_000).await;
    assert_eq!(
        enter(s, t, 54).await,
        (44, 43),
        "no seq went to a refused or repeated enter"
    );

    // Another target's calls do not share.
    let before = evalsha_calls(&redis);
    let other = target(2);
    enter(s, other, 1).await;
    let both = futures_join_all(
        [(t, 1), (other, 1)].map(|(t, u)| s.poll(t, u, now(), &|| Some(candidate("x")))),
    )
    .await;
    assert_eq!(
        both[0].as_ref().unwrap(),
        &PollOutcome::Waiting { seq: 2, ahead: 1 }
    );
    assert_eq!(
        both[1].as_ref().unwrap(),
        &PollOutcome::Waiting { seq: 1, ahead: 0 }
    );
    // The new target's enter: open.lua, enter.lua, and open.lua again for the room it opened.
    assert_eq!(evalsha_calls(&redis) - before, 3 + 2);
}

/// The new users of one script call get consecutive seqs, whose queued and heartbeat bits
/// `enter.lua` writes as runs of up to 32 bits: the bits cover exactly those seqs. Around a
/// batch of newcomers (one alone, then 39 in one call: runs of 32 and 7 bits) stand two users
/// whose last heartbeat is two minutes old, one just before the batch and one just after it: a
/// sweep evicts those two and nobody else, on both stores; on Redis the queued bitmap holds
/// exactly the waiting seqs.
#[tokio::test]
async fn batched_newcomers_hold_exactly_their_own_bits() {
    async fn scenario(s: &dyn QueueStore, redis: Option<&RedisServer>) {
        let t = target(14);
        let old = at(-120_000);
        assert!(matches!(
            s.enter(t, 1, old).await.unwrap(),
            EnterOutcome::Waiting { seq: 1, .. }
        ));
        let batch: Vec<u64> = (100..140).collect();
        let calls_before = redis.map(evalsha_calls);
        let entered = futures_join_all(batch.iter().map(|u| s.enter(t, *u, now()))).await;
        if let (Some(redis), Some(before)) = (redis, calls_before) {
            // One newcomer alone, then 39 in one call.
            assert_eq!(evalsha_calls(redis) - before, 2);
        }
        let mut seqs: Vec<u64> = entered
            .into_iter()
            .map(|r| match r.unwrap() {
                EnterOutcome::Waiting { seq, .. } => seq,
                other => panic!("{other:?}"),
            })
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (2..=41).collect::<Vec<u64>>());
        assert!(matches!(
            s.enter(t, 2, old).await.unwrap(),
            EnterOutcome::Waiting { seq: 42, .. }
        ));
        assert_eq!(s.sweep(t, 0, 100, now()).await.unwrap(), 2);
        for user in [1, 2] {
            assert_eq!(
                poll(s, t, user, "x").await,
                PollOutcome::NotInQueue,
                "{user}"
            );
        }
        for user in batch {
            assert!(
                matches!(poll(s, t, user, "x").await, PollOutcome::Waiting { .. }),
                "{user}"
            );
        }
    }
    scenario(&MemoryStore::new(), None).await;
    let redis = RedisServer::start();
    let store = connected_redis(&redis).await;
    scenario(store.as_ref(), Some(&redis)).await;
    let queued: Vec<i64> = (0..=45)
        .map(|seq| {
            redis
                .cmd(&["GETBIT", "queue:{LIMITED_DROP:14}:queued", &seq.to_string()])
                .as_int()
        })
        .collect();
    let want: Vec<i64> = (0..=45)
        .map(|seq| i64::from((2..=41).contains(&seq)))
        .collect();
    assert_eq!(queued, want, "queued bits by seq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_follow_the_contract() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 42);
    let before = now().epoch_ms;
    enter(s.as_ref(), t, 1001).await;
    enter(s.as_ref(), t, 1002).await;
    let p = "queue:{LIMITED_DROP:42}:";
    assert_eq!(
        redis
            .cmd(&["ZSCORE", &format!("{p}waiting"), "1002"])
            .as_int(),
        2
    );
    // The heartbeat is the seq's bit in the bitmap of the current window (15 s by default), which
    // expires on its own; the queued bitmap holds the seqs that wait.
    let liveness = Liveness::default();
    let windows = [liveness.window(before), liveness.window(now().epoch_ms)];
    let alive = |seq: &str| {
        windows.iter().any(|w| {
            redis
                .cmd(&["GETBIT", &format!("{p}alive:15000:{w}"), seq])
                .as_int()
                == 1
        })
    };
    assert!(alive("1") && alive("2"), "enter heartbeats");
    let window_ttl = redis
        .cmd(&["PTTL", &format!("{p}alive:15000:{}", windows[1])])
        .as_int();
    assert!(
        window_ttl > 0 && window_ttl as u64 <= liveness.key_ttl_ms(),
        "window ttl {window_ttl}"
    );
    for seq in ["1", "2"] {
        assert_eq!(
            redis.cmd(&["GETBIT", &format!("{p}queued"), seq]).as_int(),
            1
        );
    }
    assert_eq!(redis.cmd(&["GET", &format!("{p}seq")]).as_int(), 2);
    for key in ["waiting", "queued", "seq", "seqtime"] {
        let ttl = redis.cmd(&["TTL", &format!("{p}{key}")]).as_int();
        assert!((1790..=1800).contains(&ttl), "{key}: ttl {ttl}");
    }
    assert_eq!(
        redis
            .cmd(&["SISMEMBER", "queue:active", "LIMITED_DROP:42"])
            .as_int(),
        1
    );

    advance(s.as_ref(), t, 1).await;
    assert_eq!(
        redis.cmd(&["GET", &format!("{p}admitted_count")]).as_int(),
        1
    );
    let ttl = redis.cmd(&["TTL", &format!("{p}admitted_count")]).as_int();
    assert!((1790..=1800).contains(&ttl), "admitted_count ttl {ttl}");
    // A waiting poll: five commands (below), no token signed, no TTL extended.
    for key in ["waiting", "queued", "seq", "admitted_count", "seqtime"] {
        redis.cmd(&["PEXPIRE", &format!("{p}{key}"), "100000"]);
    }
    // (The first poll on an instance also re-registers the target in `queue:active`, at most
    // once per 10 s per instance and target; the poll measured here is the steady one.)
    s.poll(t, 1002, now(), &|| Some(candidate("never")))
        .await
        .unwrap();
    redis.cmd(&["CONFIG", "RESETSTAT"]);
    let signed = std::sync::atomic::AtomicBool::new(false);
    let waiting = s
        .poll(t, 1002, now(), &|| {
            signed.store(true, std::sync::atomic::Ordering::Relaxed);
            Some(candidate("never"))
        })
        .await
        .unwrap();
    assert_eq!(waiting, PollOutcome::Waiting { seq: 2, ahead: 1 });
    assert!(
        !signed.load(std::sync::atomic::Ordering::Relaxed),
        "a waiting poll signed a token"
    );
    let stats = redis.cmd(&["INFO", "commandstats"]).as_str().unwrap();
    let calls: Vec<(String, i64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_string(), rest.split(',').next()?.parse().ok()?))
        })
        .filter(|(name, _)| {
            !["evalsha", "info"].contains(&name.as_str()) && !name.starts_with("config")
        })
        .collect();
    let total: i64 = calls.iter().map(|(_, n)| n).sum();
    // ZMSCORE, HGET (the sale's heartbeat window width), GET (the mark), ZRANK, BITFIELD.
    assert!(total <= 5, "a waiting poll ran {total} commands: {calls:?}");
    for key in ["waiting", "queued", "seq", "admitted_count", "seqtime"] {
        let ttl = redis.cmd(&["TTL", &format!("{p}{key}")]).as_int();
        assert!(
            (95..=100).contains(&ttl),
            "{key}: a waiting poll moved the ttl to {ttl}"
        );
    }

    // The admitted user's poll signs and stores the token and refreshes the target's keys.
    let c = candidate("tok");
    s.poll(t, 1001, now(), &|| Some(c.clone())).await.unwrap();
    for key in ["waiting", "queued", "seq", "admitted_count", "seqtime"] {
        let ttl = redis.cmd(&["TTL", &format!("{p}{key}")]).as_int();
        assert!(
            (1790..=1800).contains(&ttl),
            "{key}: ttl {ttl} after the token was issued"
        );
    }
    let stored = redis
        .cmd(&["GET", &format!("{p}token:1001")])
        .as_str()
        .unwrap();
    assert_eq!(stored, format!("{}|tok", c.expires_at));
    let ttl = redis.cmd(&["TTL", &format!("{p}token:1001")]).as_int();
    assert!((295..=300).contains(&ttl), "token ttl {ttl}");
    assert_eq!(
        redis.cmd(&["ZSCORE", &format!("{p}waiting"), "1001"]),
        common::Resp::Nil
    );
    assert_eq!(
        redis.cmd(&["GETBIT", &format!("{p}queued"), "1"]).as_int(),
        0,
        "an admitted seq is no longer queued"
    );

    // A sweep gives the window bitmaps their lifetime, creates the next window's ahead of the
    // polls, and leaves no scratch key behind.
    let now_ms = now().epoch_ms;
    assert_eq!(s.sweep(t, 0, 10, now()).await.unwrap(), 0);
    let next = liveness.window(now_ms) + 1;
    let ttl = redis
        .cmd(&["PTTL", &format!("{p}alive:15000:{next}")])
        .as_int();
    assert!(
        ttl > 0 && ttl as u64 <= liveness.key_ttl_ms(),
        "next window ttl {ttl}"
    );
    assert_eq!(redis.cmd(&["EXISTS", &format!("{p}sweep")]).as_int(), 0);

    // The pump lock: SET NX PX, owned, released only by its owner.
    assert!(s
        .try_lock(t, "a", Duration::from_millis(500))
        .await
        .unwrap());
    assert!(!s
        .try_lock(t, "b", Duration::from_millis(500))
        .await
        .unwrap());
    let pttl = redis.cmd(&["PTTL", &format!("{p}lock")]).as_int();
    assert!((1..=500).contains(&pttl), "lock pttl {pttl}");
    s.unlock(t, "b").await.unwrap();
    assert_eq!(
        redis.cmd(&["GET", &format!("{p}lock")]).as_str().unwrap(),
        "a"
    );
    s.unlock(t, "a").await.unwrap();
    assert_eq!(redis.cmd(&["EXISTS", &format!("{p}lock")]).as_int(), 0);

    // Expired targets stay listed until the pump, finding them empty twice, retires them
    // (tests/targets.rs runs that end to end); retiring takes them off queue:active.
    for key in [
        "waiting",
        "queued",
        "seq",
        "admitted_count",
        "seqtime",
        "advances",
        "last_advance",
    ] {
        redis.cmd(&["DEL", &format!("{p}{key}")]);
    }
    assert!(s.active_targets(now()).await.unwrap().contains(&t));
    s.retire_target(t).await.unwrap();
    assert!(!s.active_targets(now()).await.unwrap().contains(&t));
    assert_eq!(
        redis
            .cmd(&["SISMEMBER", "queue:active", "LIMITED_DROP:42"])
            .as_int(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_time_checkpoints_are_sparse_and_trimmed() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 45);
    let key = "queue:{LIMITED_DROP:45}:seqtime";
    let same_ms = now();
    for user in 1..=40 {
        s.enter(t, user, same_ms).await.unwrap();
    }
    // One checkpoint per 16 seqs within the same second: seqs 1, 17 and 33.
    let members: Vec<String> = redis
        .cmd(&["ZRANGE", key, "0", "-1"])
        .as_vec()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let ms = same_ms.epoch_ms;
    assert_eq!(
        members,
        vec![format!("1:{ms}"), format!("17:{ms}"), format!("33:{ms}")]
    );
    // The keys' TTL is extended by the first checkpoint of each second, not by every one: the
    // checkpoint of seq 49, in the same second, leaves it alone.
    let keys =
        ["waiting", "queued", "seq", "seqtime"].map(|k| format!("queue:{{LIMITED_DROP:45}}:{k}"));
    let ttls = || {
        keys.iter()
            .map(|k| redis.cmd(&["TTL", k]).as_int())
            .collect::<Vec<_>>()
    };
    for k in &keys {
        redis.cmd(&["EXPIRE", k, "100"]);
    }
    for user in 41..=50 {
        s.enter(t, user, same_ms).await.unwrap();
    }
    assert_eq!(redis.cmd(&["ZCARD", key]).as_int(), 4);
    assert!(
        ttls().iter().all(|t| (95..=100).contains(t)),
        "{:?}",
        ttls()
    );
    // A second later, the next enter gets its own checkpoint, which extends the TTL.
    s.enter(
        t,
        51,
        Now {
            epoch_ms: ms + 1_000,
        },
    )
    .await
    .unwrap();
    assert_eq!(redis.cmd(&["ZCARD", key]).as_int(), 5);
    assert!(
        ttls().iter().all(|t| (1790..=1800).contains(t)),
        "{:?}",
        ttls()
    );
    // Once everyone below seq 20 has left the waiting set, checkpoints below 17 go.
    advance(s.as_ref(), t, 19).await;
    for user in 1..=19 {
        poll(s.as_ref(), t, user, "x").await;
    }
    tokio::time::sleep(GUARD + Duration::from_millis(20)).await;
    advance(s.as_ref(), t, 1).await;
    let first = redis.cmd(&["ZRANGE", key, "0", "0"]).as_vec()[0]
        .as_str()
        .unwrap();
    assert_eq!(first, format!("17:{ms}"));
    // The wait recorded at admission is measured from the covering checkpoint.
    let waits = redis
        .cmd(&["LRANGE", "queue:{LIMITED_DROP:45}:waits", "0", "-1"])
        .as_vec();
    assert_eq!(waits.len(), 19);
}

fn registering(instance: &str, asked: Slice, leave: bool) -> RosterEntry<'_> {
    RosterEntry {
        instance,
        name: "",
        asked,
        batch: 10,
        min_replicas: 1,
        presence: None,
        live_window: Duration::from_millis(300),
        recent_window: Duration::from_secs(3),
        leave,
        credit_ms: 0,
        clock_seen: 0,
        rollbacks_known: 0,
    }
}

const THIRD: u32 = 333_333;
const TWO_THIRDS: u32 = 666_666;
const HALF: u32 = 500_000;

/// The heartbeat credit travels through the roster: every registration answers the largest
/// credit a live instance reported, and an instance that leaves or reports none withdraws it.
async fn the_registry_carries_the_largest_heartbeat_credit(s: &dyn QueueStore) {
    let reg = |i: &'static str, credit_ms: u64| async move {
        let r = RosterEntry {
            credit_ms,
            ..registering(i, Slice::WHOLE, false)
        };
        s.update_roster(r).await.unwrap().credit_ms
    };
    assert_eq!(reg("a", 0).await, 0);
    assert_eq!(reg("b", 4_000).await, 4_000);
    assert_eq!(
        reg("a", 1_000).await,
        4_000,
        "b's shedding counts for a's sweep"
    );
    assert_eq!(reg("b", 0).await, 1_000);
    s.update_roster(registering("a", Slice::EMPTY, true))
        .await
        .unwrap();
    assert_eq!(reg("b", 0).await, 0);
}

/// The replica roster (`roster.lua`): each instance asks for the seat the roster told
/// it and is recorded with the largest piece of it no other member holds (containing what it
/// held of it), so the recorded slices never overlap; the slices of instances that stopped
/// registering (recent, not live) are held back by the pumps.
async fn the_registry_records_disjoint_slices(s: &dyn QueueStore) {
    // (instance, slice asked) -> (live, recent, held back, recorded, desired)
    let reg = |i: &'static str, asked: Slice| async move {
        let n = s.update_roster(registering(i, asked, false)).await.unwrap();
        assert_eq!(n.held_back_legacy, 0);
        (n.live, n.recent, n.held_back, n.recorded, n.desired)
    };
    let sl = Slice::new;
    let none: Vec<Slice> = Vec::new();
    assert_eq!(
        reg("a", Slice::EMPTY).await,
        (1, 1, none.clone(), Slice::EMPTY, Slice::WHOLE)
    );
    assert_eq!(
        reg("a", Slice::WHOLE).await,
        (1, 1, none.clone(), Slice::WHOLE, Slice::WHOLE)
    );
    // b's seat is the upper half, which a still holds.
    assert_eq!(reg("b", Slice::EMPTY).await.4, sl(HALF, 1_000_000));
    assert_eq!(reg("b", sl(HALF, 1_000_000)).await.3, Slice::EMPTY);
    // a moves to its seat; then b gets its own.
    assert_eq!(reg("a", Slice::WHOLE).await.4, sl(0, HALF));
    assert_eq!(reg("a", sl(0, HALF)).await.3, sl(0, HALF));
    assert_eq!(reg("b", sl(HALF, 1_000_000)).await.3, sl(HALF, 1_000_000));
    // c joins: thirds.
    assert_eq!(reg("c", Slice::EMPTY).await.4, sl(TWO_THIRDS, 1_000_000));
    assert_eq!(reg("a", sl(0, HALF)).await.4, sl(0, THIRD));
    assert_eq!(reg("a", sl(0, THIRD)).await.3, sl(0, THIRD));
    // b asks for its new seat: it keeps what it held of it and grows into what a left.
    assert_eq!(reg("b", sl(HALF, 1_000_000)).await.4, sl(THIRD, TWO_THIRDS));
    assert_eq!(
        reg("b", sl(THIRD, TWO_THIRDS)).await.3,
        sl(THIRD, TWO_THIRDS)
    );
    assert_eq!(
        reg("c", sl(TWO_THIRDS, 1_000_000)).await.3,
        sl(TWO_THIRDS, 1_000_000)
    );
    // b and c go silent: their slices are held back.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (live, recent, mut held, rec, _) = reg("a", sl(0, THIRD)).await;
    held.sort_by_key(|s| s.start);
    assert_eq!(
        (live, recent, held, rec),
        (
            1,
            3,
            vec![sl(THIRD, TWO_THIRDS), sl(TWO_THIRDS, 1_000_000)],
            sl(0, THIRD)
        )
    );
    // a may grow only into what b and c leave.
    assert_eq!(reg("a", Slice::WHOLE).await.3, sl(0, THIRD));
    // b leaves cleanly: a may take what it held.
    let left = s
        .update_roster(registering("b", Slice::EMPTY, true))
        .await
        .unwrap();
    assert_eq!(left.recorded, Slice::EMPTY);
    let (_, recent, held, rec, _) = reg("a", sl(0, TWO_THIRDS)).await;
    assert_eq!(
        (recent, held, rec),
        (2, vec![sl(TWO_THIRDS, 1_000_000)], sl(0, TWO_THIRDS))
    );
    // A smaller request is recorded as asked (a replica that lost the answer paces with it).
    assert_eq!(reg("a", sl(0, 100_000)).await.3, sl(0, 100_000));
}

/// Members of older versions: one without a share ("old") holds its ceil share of the batch,
/// one with a share of the file's batch ("legacy|2") holds that; both at the top of the unit,
/// and both are held back once silent. Their own next registration replaces them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_members_of_older_versions() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = redis.cmd(&["TIME"]).as_vec();
    let now_ms = t[0].as_str().unwrap().parse::<u64>().unwrap() * 1000;
    let old = (now_ms - 1000).to_string();
    redis.cmd(&["ZADD", "queue:instances", &old, "old", &old, "legacy|2"]);
    let n = s
        .update_roster(registering("a", Slice::WHOLE, false))
        .await
        .unwrap();
    // "old" holds ⌈10 / 3⌉ = 4, "legacy" 2: 6 of 10 at the top of the unit.
    assert_eq!(
        (n.live, n.recent, n.held_back_legacy, n.recorded),
        (1, 3, 6, Slice::new(0, 400_000))
    );
    let members = redis
        .cmd(&["ZRANGE", "queue:instances", "0", "-1"])
        .as_vec();
    let names: Vec<String> = members.iter().map(|m| m.as_str().unwrap()).collect();
    assert!(
        names.contains(&"a|0:400000|4".to_string()),
        "the trailing number is the whole users per tick an older gateway reads: {names:?}"
    );
    s.update_roster(registering("old", Slice::EMPTY, false))
        .await
        .unwrap();
    assert!(redis.cmd(&["PTTL", "queue:instances"]).as_int() > 0);
}

/// A silent member whose presence subscription closed is dropped at once (dead), one whose
/// subscription is still open is held back (maybe cut off), and a newer instance with a
/// member's replica name retires it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_drops_dead_and_retired_instances() {
    use std::io::{Read, Write};
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let subscribe = |instance: &str| {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
        let channel = vq_gateway::store::presence_channel(instance);
        write!(c, "SUBSCRIBE {channel}\r\n").unwrap();
        let mut buf = [0u8; 256];
        let _ = c.read(&mut buf).unwrap();
        c
    };
    let with_presence = |i: &'static str, asked: Slice| RosterEntry {
        presence: Some(PresenceKind::Classic),
        ..registering(i, asked, false)
    };
    let sub_b = subscribe("b");
    let _sub_c = subscribe("c");
    for i in ["a", "b", "c"] {
        let n = s
            .update_roster(with_presence(i, Slice::EMPTY))
            .await
            .unwrap();
        assert_eq!(n.presence_seen, i != "a", "{i}: only b and c subscribed");
    }
    for i in ["a", "b", "c"] {
        let n = s
            .update_roster(with_presence(i, Slice::EMPTY))
            .await
            .unwrap();
        s.update_roster(with_presence(i, n.desired)).await.unwrap();
    }
    // b's process dies (its connections close); c is cut off (they stay open).
    drop(sub_b);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let n = s
        .update_roster(with_presence("a", Slice::EMPTY))
        .await
        .unwrap();
    assert_eq!((n.dead, n.recent), (1, 2), "{n:?}");
    assert_eq!(
        n.held_back,
        vec![Slice::new(TWO_THIRDS, 1_000_000)],
        "c may be pacing"
    );
    // A registration without presence is never dropped as dead.
    s.update_roster(registering("d", Slice::EMPTY, false))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let n = s
        .update_roster(with_presence("a", Slice::EMPTY))
        .await
        .unwrap();
    assert_eq!((n.dead, n.recent), (0, 3), "{n:?}");

    // Names: "r-1" restarts as a new instance id; the new one retires the old at once.
    let named = |i: &'static str| RosterEntry {
        name: "r-1",
        ..registering(i, Slice::WHOLE, false)
    };
    s.update_roster(named("old-r1")).await.unwrap();
    let n = s.update_roster(named("new-r1")).await.unwrap();
    assert_eq!(n.retired_others, 1, "{n:?}");
    let n = s.update_roster(named("old-r1")).await.unwrap();
    assert!(n.retired, "the old instance learns it was retired");
    assert_eq!(n.recorded, Slice::EMPTY, "and is never recorded again");
    let n = s.update_roster(named("new-r1")).await.unwrap();
    assert_eq!(n.retired_others, 0, "{n:?}");
}

/// `advance.lua` admits what `Part::users` says (the cells of `slice.rs`), with slices held
/// back and with an only slice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advance_admits_the_cells_of_its_part() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let parts = [
        Part {
            held_back: vec![Slice::new(0, THIRD), Slice::new(TWO_THIRDS, 1_000_000)],
            ..Part::whole()
        },
        Part {
            only: Some(Slice::new(THIRD, TWO_THIRDS)),
            ..Part::whole()
        },
        Part {
            held_back: vec![Slice::new(100_000, 900_000)],
            ..Part::ppm(HALF)
        },
    ];
    let mut id = 500;
    let mut checked = 0;
    while checked < 24 {
        id += 1;
        let t = target(id);
        set_sale(s.as_ref(), t, 37, TICK_MS).await;
        for u in 1..=50 {
            enter(s.as_ref(), t, u).await;
        }
        let part = &parts[checked % parts.len()];
        let tick_of = || {
            let time = redis.cmd(&["TIME"]).as_vec();
            let ms = time[0].as_str().unwrap().parse::<u64>().unwrap() * 1000
                + time[1].as_str().unwrap().parse::<u64>().unwrap() / 1000;
            ms / TICK_MS
        };
        let before = tick_of();
        let a = s.advance(t, part, now()).await.unwrap();
        if tick_of() != before {
            continue;
        }
        let want = part.users(a.batch_size, before);
        assert_eq!(a.admitted_now, u64::from(want), "{part:?} tick {before}");
        checked += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_on_redis() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    the_registry_records_disjoint_slices(s.as_ref()).await;
    let fresh = RedisServer::start();
    let s = connected_redis(&fresh).await;
    the_registry_carries_the_largest_heartbeat_credit(s.as_ref()).await;
    assert!(fresh.cmd(&["PTTL", "{queue:instances}:credit"]).as_int() != -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_on_a_cluster() {
    let cluster = RedisCluster::start();
    let s = connected_cluster(&cluster).await;
    the_registry_records_disjoint_slices(s.as_ref()).await;
    s.update_roster(registering("a", Slice::EMPTY, true))
        .await
        .unwrap();
    s.update_roster(registering("b", Slice::EMPTY, true))
        .await
        .unwrap();
    s.update_roster(registering("c", Slice::EMPTY, true))
        .await
        .unwrap();
    the_registry_carries_the_largest_heartbeat_credit(s.as_ref()).await;
}

/// The first admission of a sequence creates the list of waits: it expires with the target's
/// other keys, not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_wait_recorded_expires_with_the_target() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 46);
    enter(s.as_ref(), t, 1).await;
    advance(s.as_ref(), t, 1).await;
    assert!(matches!(
        poll(s.as_ref(), t, 1, "x").await,
        PollOutcome::Admitted { .. }
    ));
    let ttl = redis
        .cmd(&["PTTL", "queue:{LIMITED_DROP:46}:waits"])
        .as_int();
    assert!(ttl > 0, "the list of waits has no TTL: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_sequence_ignores_a_stale_mark() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 43);
    // Left over from an expired sequence: admitted_count without seq.
    redis.cmd(&["SET", "queue:{LIMITED_DROP:43}:admitted_count", "500"]);
    enter(s.as_ref(), t, 1).await;
    assert!(matches!(
        poll(s.as_ref(), t, 1, "x").await,
        PollOutcome::Waiting { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_a_flush() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = target(44);
    enter(s.as_ref(), t, 1).await;
    redis.cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(enter(s.as_ref(), t, 2).await, (2, 1));
    assert_eq!(
        redis
            .cmd(&[
                "SCRIPT",
                "EXISTS",
                "0000000000000000000000000000000000000000"
            ])
            .as_vec()
            .len(),
        1
    );
}

/// The script calls' own connections (one per thread, pipelined) log in as the URL says: an ACL
/// user with a password and a database number; a wrong password fails the call at once, with
/// an error that does not carry the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_urls_with_a_user_password_and_database() {
    let redis = RedisServer::start();
    redis.cmd(&[
        "ACL",
        "SETUSER",
        "gw",
        "on",
        ">gw-secret-password",
        "~*",
        "+@all",
    ]);
    let url = format!("redis://gw:gw-secret-password@127.0.0.1:{}/3", redis.port);
    let s = connect(
        RedisStore::new(&url, Duration::from_millis(500)).unwrap(),
        &redis,
    )
    .await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 77);
    assert_eq!(enter(s.as_ref(), t, 1).await, (1, 0));
    assert_eq!(
        poll(s.as_ref(), t, 1, "x").await,
        PollOutcome::Waiting { seq: 1, ahead: 0 }
    );

    let wrong = format!("redis://gw:not-the-password@127.0.0.1:{}/3", redis.port);
    let bad = Arc::new(RedisStore::new(&wrong, Duration::from_millis(500)).unwrap());
    bad.connect(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let err = bad
        .enter(t, 2, now())
        .await
        .expect_err("a wrong password must fail");
    assert!(started.elapsed() < Duration::from_millis(400), "{err:?}");
    assert!(!format!("{err:?}").contains("not-the-password"), "{err:?}");

    // The keys are in database 3, not 0.
    assert_eq!(
        redis
            .cmd(&["EXISTS", "queue:{LIMITED_DROP:77}:waiting"])
            .as_int(),
        0
    );
    redis.cmd(&["SELECT", "3"]);
    assert_eq!(
        redis
            .cmd(&["ZSCORE", "queue:{LIMITED_DROP:77}:waiting", "1"])
            .as_int(),
        1
    );
}

/// A spend is recorded twice (the token's claim and the sale's spent tokens): losing either key
/// alone never lets the spent token through again (docs/state.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_token_stays_spent_when_either_of_its_records_is_lost() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 42);
    let terms = ClaimTerms {
        ttl: Duration::from_secs(300),
        lease: Duration::from_secs(5),
        max_attempts: 10,
    };
    for (id, lost) in [("aa01", "used:aa01"), ("aa02", "spent")] {
        assert!(matches!(
            s.claim(t, id, "p1", terms, now()).await.unwrap(),
            ClaimTake::Taken { .. }
        ));
        assert!(s
            .settle(t, id, "p1", Settle::Spend, terms, now())
            .await
            .unwrap());
        redis.cmd(&["DEL", &format!("queue:{{LIMITED_DROP:42}}:{lost}")]);
        assert!(
            matches!(
                s.claim(t, id, "p2", terms, now()).await.unwrap(),
                ClaimTake::Spent
            ),
            "spent token {id} taken again after losing {lost}"
        );
    }
    // A token never spent is taken as before.
    assert!(matches!(
        s.claim(t, "aa03", "p3", terms, now()).await.unwrap(),
        ClaimTake::Taken { .. }
    ));
}

/// Redis lost the queue's counter, waiting set and heartbeat windows (back from a snapshot taken
/// before these users entered). The first user back with its ticket holds the highest seq: the
/// counter moves forward to it and the seqs below are marked standing. The heartbeat windows
/// restart with it, so a sweep right after evicts none of the standing places (their users'
/// heartbeats were lost, not missing), and each user takes its place back at its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn places_taken_back_above_a_lost_counter_outlive_the_next_sweep() {
    let redis = RedisServer::start();
    let s = connected_redis(&redis).await;
    let t = QueueTarget::new(TargetType::LimitedDrop, 48);
    for user in 1..=10 {
        enter(s.as_ref(), t, user).await;
    }
    let prefix = "queue:{LIMITED_DROP:48}";
    for key in redis
        .cmd(&["KEYS", &format!("{prefix}:alive:*")])
        .as_vec()
        .iter()
        .filter_map(|k| k.as_str())
    {
        redis.cmd(&["DEL", &key]);
    }
    for key in ["waiting", "seq", "queued"] {
        redis.cmd(&["DEL", &format!("{prefix}:{key}")]);
    }
    let mint = || Some(candidate("x"));
    let back = s.rejoin(t, 10, 10, now(), &mint).await.unwrap();
    assert!(
        matches!(back, PollOutcome::Waiting { seq: 10, .. }),
        "{back:?}"
    );
    // Long after the sale's timeout as the windows would have it, with no credit.
    assert_eq!(s.sweep(t, 0, 100, at(1_000)).await.unwrap(), 0);
    for user in 1..10 {
        let back = s.rejoin(t, user, user, now(), &mint).await.unwrap();
        assert!(
            matches!(back, PollOutcome::Waiting { seq, .. } if seq == user),
            "user {user}: {back:?}"
        );
    }
    assert_eq!(
        redis
            .cmd(&["HGET", &format!("{prefix}:losses"), "seq"])
            .as_int(),
        1
    );
}
