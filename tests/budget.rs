//! The budget survives what every deployment meets (docs/state.md), under a
//! crowd of repeat customers: users who keep polling after they bought and buy again with every
//! token they are handed.
//!
//! - A Redis outage: each user gets one token (only the replica whose slice it belongs to lets
//!   it through, with the same token at every answer), every token buys once, purchases stay
//!   within the paced budget, and nobody let through is admitted again once Redis is back.
//! - Each key of a sale deleted mid-sale, one at a time (the sequence, the mark, the bitmap of
//!   waiting seqs, the waiting set, the heartbeat windows, a paused sale's parameters, the flag,
//!   the registered sales): the
//!   bound holds, no position is shown to two users, no waiting user is told 404, and the loss
//!   is counted.
//! - Redis restarted from a snapshot seconds old: no spent token buys again, nobody gets a second
//!   token, the mark never moves back, the rollback is counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::load::{epoch_ms, max_per_window, purchase_path};
use common::*;
use serde_json::Value;

const ADMIN_TOKEN: &str = "admin-token-of-the-tests-0123456789";
const KEY: &str = "queue:{LIMITED_DROP:42}";

/// One answer the crowd saw.
#[derive(Debug, Clone)]
struct Seen {
    user: u64,
    gateway: usize,
    start_ms: u64,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `WAITING` with a position.
    Waiting {
        seq: u64,
    },
    /// A degraded `WAITING` (no position).
    Held,
    /// A token, and whether the answer was degraded.
    Token {
        token: String,
        degraded: bool,
    },
    /// `DIRECT_ADMITTED` without the store's trouble: the queue was off for the user.
    Direct,
    /// 404 `NOT_IN_QUEUE` for a user who was waiting (held a position and a ticket).
    Lost,
    /// A purchase with `token`, and its status.
    Bought {
        token: String,
        status: u16,
    },
    Other(u16),
}

struct User {
    id: u64,
    entered: bool,
    /// Not before this (epoch ms) does the user enter.
    enter_at_ms: u64,
    ticket: Option<String>,
    /// Tokens held and not tried yet.
    fresh: Vec<String>,
    tried: BTreeSet<String>,
    waiting: bool,
}

/// A crowd of repeat customers over the gateways, round-robin per request.
struct Crowd {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<Vec<Seen>>>,
}

impl Crowd {
    /// `threads` × `users` users entering and polling (about every `every_ms`; user `i` of a
    /// thread enters `i × stagger_ms` after the start), and `strangers` users per thread who
    /// never enter and only poll (they are let through only while the store cannot be used).
    /// User ids start at `base`.
    fn start(
        gateways: Vec<SocketAddr>,
        threads: u64,
        users: u64,
        strangers: u64,
        every_ms: u64,
        base: u64,
    ) -> Crowd {
        Crowd::staggered(gateways, threads, users, strangers, every_ms, base, 0)
    }

    fn staggered(
        gateways: Vec<SocketAddr>,
        threads: u64,
        users: u64,
        strangers: u64,
        every_ms: u64,
        base: u64,
        stagger_ms: u64,
    ) -> Crowd {
        let started = epoch_ms();
        let stop = Arc::new(AtomicBool::new(false));
        let counter = Arc::new(AtomicU64::new(0));
        let handles = (0..threads)
            .map(|t| {
                let (stop, counter, gateways) = (stop.clone(), counter.clone(), gateways.clone());
                std::thread::spawn(move || {
                    let mut clients: Vec<Client> =
                        gateways.iter().map(|a| Client::connect(*a)).collect();
                    let mut crowd: Vec<User> = (0..users + strangers)
                        .map(|i| User {
                            id: base + t * 1000 + i,
                            entered: i >= users,
                            // Strangers never enter.
                            enter_at_ms: if i >= users {
                                u64::MAX
                            } else {
                                started + i * stagger_ms
                            },
                            ticket: None,
                            fresh: Vec::new(),
                            tried: BTreeSet::new(),
                            waiting: false,
                        })
                        .collect();
                    let mut seen = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let round = epoch_ms();
                        for user in crowd.iter_mut() {
                            let g =
                                (counter.fetch_add(1, Ordering::Relaxed) as usize) % clients.len();
                            if let Some(s) = step(&mut clients[g], g, user) {
                                seen.push(s);
                            } else {
                                clients[g] = Client::connect(gateways[g]);
                            }
                        }
                        let spent = epoch_ms() - round;
                        std::thread::sleep(Duration::from_millis(every_ms.saturating_sub(spent)));
                    }
                    seen
                })
            })
            .collect();
        Crowd { stop, handles }
    }

    fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        self.handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    }
}

/// One request of one user: a purchase with a token not tried yet, else an enter (once) or a
/// poll with the user's ticket. `None`: the connection failed.
fn step(c: &mut Client, gateway: usize, user: &mut User) -> Option<Seen> {
    let id = user.id.to_string();
    let start_ms = epoch_ms();
    if !user.entered && start_ms < user.enter_at_ms {
        return Some(Seen {
            user: user.id,
            gateway,
            start_ms,
            kind: Kind::Other(0),
        });
    }
    let seen = |kind| Seen {
        user: user.id,
        gateway,
        start_ms,
        kind,
    };
    if let Some(token) = user.fresh.pop() {
        let r = c
            .request(
                "POST",
                &purchase_path(42),
                &[("X-User-Id", &id), ("X-Entry-Token", &token)],
                b"{}",
            )
            .ok()?;
        if r.status == 503 {
            // Not forwarded: the purchase waits for the store; try again later.
            user.fresh.push(token.clone());
        } else {
            user.tried.insert(token.clone());
        }
        return Some(seen(Kind::Bought {
            token,
            status: r.status,
        }));
    }
    let r = if user.entered {
        let mut headers = vec![("X-User-Id", id.as_str())];
        if let Some(t) = &user.ticket {
            headers.push(("X-Queue-Ticket", t));
        }
        c.request(
            "GET",
            "/virtual-queues/limited-drop/42/entries/me",
            &headers,
            b"",
        )
        .ok()?
    } else {
        user.entered = true;
        c.request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("X-User-Id", &id)],
            b"",
        )
        .ok()?
    };
    if r.status == 404 {
        // Not in the queue: a client enters again (at the back).
        let lost = user.waiting;
        user.waiting = false;
        user.ticket = None;
        user.entered = user.enter_at_ms == u64::MAX;
        return Some(seen(if lost { Kind::Lost } else { Kind::Other(404) }));
    }
    if r.status != 200 {
        return Some(seen(Kind::Other(r.status)));
    }
    let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    if let Some(t) = v["queueTicket"].as_str() {
        user.ticket = Some(t.to_string());
    }
    if v["status"] == "DIRECT_ADMITTED" && v["degraded"] != true {
        return Some(seen(Kind::Direct));
    }
    if let Some(token) = v["entryToken"].as_str() {
        user.waiting = false;
        if !user.tried.contains(token) && !user.fresh.iter().any(|t| t == token) {
            user.fresh.push(token.to_string());
        }
        return Some(seen(Kind::Token {
            token: token.to_string(),
            degraded: v["degraded"] == true,
        }));
    }
    match v["position"].as_u64() {
        Some(seq) => {
            user.waiting = true;
            Some(seen(Kind::Waiting { seq }))
        }
        None => Some(seen(Kind::Held)),
    }
}

fn gateway(up: &Upstream, redis: &RedisServer, tweak: impl Fn(&mut ConfigFile)) -> GatewayProc {
    let mut cfg = test_config(up.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    tweak(&mut cfg);
    GatewayProc::start_with_env(
        cfg,
        &[
            ("VQ_TOKEN_SECRET", TEST_SECRET),
            ("VQ_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    )
}

fn admin(gw: &GatewayProc, method: &str, path: &str, body: &str) -> Response {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    gw.admin_client()
        .request(method, path, &[("Authorization", &bearer)], body.as_bytes())
        .unwrap()
}

/// A series summed over the replicas.
fn metric_sum(gws: &[GatewayProc], series: &str) -> u64 {
    gws.iter().map(|g| metric(&g.metrics(), series)).sum()
}

fn losses(gws: &[GatewayProc], state: &str) -> u64 {
    metric_sum(
        gws,
        &format!("virtual_queue_store_data_loss_total{{state=\"{state}\"}}"),
    )
}

fn purchases(up: &Upstream) -> Vec<u64> {
    up.requests()
        .iter()
        .filter(|r| r.target == purchase_path(42))
        .map(|r| r.at_ms)
        .collect()
}

/// The tokens answered 2xx more than once (each token buys once).
fn bought_twice(seen: &[Seen]) -> Vec<String> {
    let mut ok: HashMap<&str, usize> = HashMap::new();
    for s in seen {
        if let Kind::Bought { token, status } = &s.kind {
            if *status < 300 {
                *ok.entry(token).or_default() += 1;
            }
        }
    }
    ok.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(t, _)| t.to_string())
        .collect()
}

/// Positions shown to more than one user.
fn shared_positions(seen: &[Seen]) -> BTreeMap<u64, BTreeSet<u64>> {
    let mut by_seq: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for s in seen {
        if let Kind::Waiting { seq } = s.kind {
            by_seq.entry(seq).or_default().insert(s.user);
        }
    }
    by_seq.retain(|_, users| users.len() > 1);
    by_seq
}

/// The most purchases in any n consecutive ticks, for n = 1..=10, against `(n + slack) × batch`.
fn assert_bound(up: &Upstream, tick_ms: u64, batch: u64, slack: u64, what: &str) -> Vec<usize> {
    let windows = max_per_window(&purchases(up), tick_ms, 10);
    for (i, max) in windows.iter().enumerate() {
        let n = i as u64 + 1;
        let bound = (n + slack) * batch;
        assert!(
            *max as u64 <= bound,
            "{what}: {max} purchases in {n} ticks, bound {bound}: {windows:?}"
        );
    }
    windows
}

#[test]
fn an_outage_hands_each_user_one_token_and_keeps_purchases_to_the_paced_budget() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    const TICK: u64 = 1000;
    const BATCH: u64 = 4;
    let gws: Vec<GatewayProc> = (0..2)
        .map(|_| {
            gateway(&up, &redis, |c| {
                c.queue.tick_ms = TICK;
                c.queue.batch_size = BATCH;
                c.queue.heartbeat_timeout_s = 20;
            })
        })
        .collect();
    for gw in &gws {
        gw.wait_flag_known();
    }
    let addrs = gws.iter().map(|g| g.listen).collect();
    let crowd = Crowd::start(addrs, 3, 12, 3, 500, 10_000);
    std::thread::sleep(Duration::from_millis(3000));
    let paused = epoch_ms();
    redis.pause();
    std::thread::sleep(Duration::from_millis(16_000));
    redis.resume();
    let resumed = epoch_ms();
    std::thread::sleep(Duration::from_millis(4000));
    let seen = crowd.stop();

    // One token per user and replica while degraded: the same one at every answer.
    let mut degraded: HashMap<(u64, usize), BTreeSet<String>> = HashMap::new();
    let mut degraded_users: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for s in &seen {
        if let Kind::Token {
            token,
            degraded: true,
        } = &s.kind
        {
            degraded
                .entry((s.user, s.gateway))
                .or_default()
                .insert(token.clone());
            degraded_users
                .entry(s.user)
                .or_default()
                .insert(token.clone());
        }
    }
    let answers = seen
        .iter()
        .filter(|s| matches!(&s.kind, Kind::Token { degraded: true, .. }))
        .count();
    assert!(
        !degraded.is_empty(),
        "nobody was let through during the outage"
    );
    let most = degraded.values().map(BTreeSet::len).max().unwrap_or(0);
    assert_eq!(most, 1, "a user got several tokens from one replica");
    // Each user belongs to one replica's slice: only that one lets it through.
    let several: Vec<(&u64, &BTreeSet<String>)> = degraded_users
        .iter()
        .filter(|(_, tokens)| tokens.len() > 1)
        .collect();
    assert!(
        several.is_empty(),
        "users with tokens from several replicas: {several:?}"
    );
    // Once back, a user let through during the outage is answered that same token, never a
    // new one: recorded in the store, not admitted again.
    let mut before: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for s in seen.iter().filter(|s| s.start_ms < resumed) {
        if let Kind::Token { token, .. } = &s.kind {
            before.entry(s.user).or_default().insert(token.clone());
        }
    }
    let mut again = Vec::new();
    for s in seen.iter().filter(|s| s.start_ms >= resumed) {
        if let Kind::Token { token, .. } = &s.kind {
            if degraded_users.contains_key(&s.user)
                && !before.get(&s.user).is_some_and(|had| had.contains(token))
            {
                again.push(s.user);
            }
        }
    }
    again.sort();
    again.dedup();
    assert!(
        again.is_empty(),
        "admitted again after the outage: {again:?}"
    );
    // Every token a user held over the whole run, wherever it came from: one.
    let mut all: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for s in &seen {
        if let Kind::Token { token, .. } = &s.kind {
            all.entry(s.user).or_default().insert(token.clone());
        }
    }
    let most_all = all.values().map(BTreeSet::len).max().unwrap_or(0);
    assert_eq!(most_all, 1, "a user held {most_all} tokens");
    let twice = bought_twice(&seen);
    assert!(
        twice.is_empty(),
        "tokens that bought twice: {}",
        twice.len()
    );
    // Each replica paces its own slice; the slices together admit the batch per tick. One tick
    // of slack for the tick the store answered in, one for the crowd's purchase lag.
    let windows = assert_bound(&up, TICK, BATCH, 2, "outage");
    let during = purchases(&up)
        .iter()
        .filter(|&&t| t >= paused && t < resumed)
        .count();
    let tokens_per_user = degraded_users
        .values()
        .map(BTreeSet::len)
        .max()
        .unwrap_or(0);
    eprintln!(
        "outage of {} ms, 2 replicas, batch {BATCH}/{TICK} ms: {} users let through, {answers} degraded token answers, at most {tokens_per_user} tokens per user during it, {} admitted again after it, {during} purchases during it, max per 1/2/5/10 ticks {:?}",
        resumed - paused,
        degraded_users.len(),
        again.len(),
        [windows[0], windows[1], windows[4], windows[9]]
    );
}

/// A registered sale of 3 per 500 ms on two replicas whose files differ, a crowd of repeat
/// customers, and one key deleted at a time.
#[test]
fn each_key_of_a_sale_deleted_mid_sale_is_found_and_repaired() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    const TICK: u64 = 500;
    const BATCH: u64 = 3;
    let gws: Vec<GatewayProc> = (0..2u64)
        .map(|i| {
            gateway(&up, &redis, |c| {
                // The files differ (a rolling change): the sale in Redis decides.
                c.queue.tick_ms = 1000 + i * 500;
                c.queue.batch_size = 50 + i * 50;
                c.queue.heartbeat_timeout_s = 30 + i * 30;
                c.queue.targets = TargetsMode::Registered;
                c.flag.enabled = false;
            })
        })
        .collect();
    // The registered sales are created by the replicas a moment after they start.
    let mut created = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let r = admin(
                &gws[0],
                "PUT",
                "/sales/limited-drop/42",
                &format!(r#"{{"batchSize": {BATCH}, "tickMs": {TICK}, "heartbeatTimeoutS": 6}}"#),
            );
            created = Some(r.status);
            r.status == 200
        }),
        "the sale was not created: {created:?}"
    );
    let r = admin(&gws[0], "PUT", "/flag", r#"{"enabled": true}"#);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    for gw in &gws {
        assert!(wait_until(Duration::from_secs(5), || {
            gw.client()
                .request("POST", &purchase_path(42), &[("X-User-Id", "1")], b"{}")
                .is_ok_and(|r| r.status == 403)
        }));
    }
    let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.listen).collect();
    let crowd = Crowd::start(addrs, 3, 40, 0, 300, 20_000);
    let wait = |ms| std::thread::sleep(Duration::from_millis(ms));
    wait(2500);
    let seq_before = redis.cmd(&["GET", &format!("{KEY}:seq")]).as_int();

    // The heartbeat windows: restarted, never read as silence.
    let windows: Vec<String> = redis
        .cmd(&["KEYS", &format!("{KEY}:alive:*")])
        .as_vec()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert!(!windows.is_empty());
    for w in &windows {
        redis.cmd(&["DEL", w]);
    }
    let evicted_series = "virtual_queue_evicted_total{target=\"LIMITED_DROP:42\"}";
    let evicted_at = metric_sum(&gws, evicted_series);
    let waiting_at = redis.cmd(&["ZCARD", &format!("{KEY}:waiting")]).as_int();
    wait(2000);
    let waiting_later = redis.cmd(&["ZCARD", &format!("{KEY}:waiting")]).as_int();
    let evicted = metric_sum(&gws, evicted_series) - evicted_at;

    // The sequence: repaired from the waiting set and the replicas' memory, never restarted.
    redis.cmd(&["DEL", &format!("{KEY}:seq")]);
    wait(1500);
    let seq_after = redis.cmd(&["GET", &format!("{KEY}:seq")]).as_int();
    assert!(seq_after >= seq_before, "seq {seq_before} -> {seq_after}");
    // The mark: set back to the highest the replicas saw.
    let mark_before = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    redis.cmd(&["DEL", &format!("{KEY}:admitted_count")]);
    wait(1500);
    let mark_after = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    assert!(
        mark_after >= mark_before,
        "mark {mark_before} -> {mark_after}"
    );
    // The bitmap of waiting seqs: made again from the waiting set.
    redis.cmd(&["DEL", &format!("{KEY}:queued")]);
    assert!(
        wait_until(Duration::from_secs(3), || {
            redis.cmd(&["STRLEN", &format!("{KEY}:queued")]).as_int() > 0
        }),
        "the queued bitmap was not made again"
    );
    let waiting_now: Vec<String> = redis
        .cmd(&["ZRANGE", &format!("{KEY}:waiting"), "0", "-1", "WITHSCORES"])
        .as_vec()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    for pair in waiting_now.chunks(2) {
        let bit = redis
            .cmd(&["GETBIT", &format!("{KEY}:queued"), &pair[1]])
            .as_int();
        // A user admitted meanwhile may have had its bit cleared: only those still waiting.
        let still = redis
            .cmd(&["ZSCORE", &format!("{KEY}:waiting"), &pair[0]])
            .as_str()
            .is_some();
        assert!(bit == 1 || !still, "seq {} not queued again", pair[1]);
    }
    // The waiting set: each user back at the place its ticket proves, at its next poll.
    let waiting_before = redis.cmd(&["ZCARD", &format!("{KEY}:waiting")]).as_int();
    redis.cmd(&["DEL", &format!("{KEY}:waiting")]);
    wait(2500);
    // A paused sale's parameters: it stays paused (a stand-in, then the replicas' write-back).
    let r = admin(
        &gws[1],
        "PUT",
        "/sales/limited-drop/42",
        r#"{"state": "paused"}"#,
    );
    assert_eq!(r.status, 200);
    wait(1200);
    let mark_paused = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    let bought_paused = purchases(&up).len();
    redis.cmd(&["DEL", &format!("{KEY}:sale")]);
    wait(2500);
    let state = redis
        .cmd(&["HGET", &format!("{KEY}:sale"), "state"])
        .as_str();
    let batch = redis
        .cmd(&["HGET", &format!("{KEY}:sale"), "batchSize"])
        .as_str();
    let mark_still = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    let bought_while_paused = purchases(&up).len() - bought_paused;
    assert_eq!(
        state.as_deref(),
        Some("paused"),
        "the paused sale came back open"
    );
    assert_eq!(
        batch.as_deref(),
        Some("3"),
        "written back from the replicas' memory"
    );
    assert_eq!(mark_still, mark_paused, "admitted while paused");
    let r = admin(
        &gws[0],
        "PUT",
        "/sales/limited-drop/42",
        r#"{"state": "open"}"#,
    );
    assert_eq!(r.status, 200);

    // The flag hash with its meta kept, and the registered sales: written back, not adopted.
    redis.cmd(&["DEL", "queue:flag"]);
    redis.cmd(&["DEL", "queue:targets"]);
    let restored = wait_until(Duration::from_secs(5), || {
        redis
            .cmd(&["HGET", "queue:flag", "enabled"])
            .as_str()
            .as_deref()
            == Some("on")
            && redis
                .cmd(&["SISMEMBER", "queue:targets", "LIMITED_DROP:42"])
                .as_int()
                == 1
    });
    let flag_back = epoch_ms();
    wait(2000);
    let seen = crowd.stop();
    assert!(
        restored,
        "the flag or the registered sales were not written back: flag {:?}, targets {:?}, logs {:#?}",
        redis.cmd(&["HGETALL", "queue:flag"]),
        redis.cmd(&["SMEMBERS", "queue:targets"]),
        gws.iter()
            .flat_map(|g| g
                .log()
                .lines()
                .filter(|l| l.contains("settings") || l.contains("flag"))
                .map(str::to_string)
                .collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );

    let shared = shared_positions(&seen);
    assert!(
        shared.is_empty(),
        "positions shown to two users: {shared:?}"
    );
    let lost: Vec<u64> = seen
        .iter()
        .filter(|s| s.kind == Kind::Lost)
        .map(|s| s.user)
        .collect();
    assert!(lost.is_empty(), "waiting users told 404: {lost:?}");
    let direct = seen.iter().filter(|s| s.kind == Kind::Direct).count();
    assert_eq!(
        direct, 0,
        "users let through without the queue (the flag read as off)"
    );
    let _ = flag_back;
    let twice = bought_twice(&seen);
    assert!(
        twice.is_empty(),
        "tokens that bought twice: {}",
        twice.len()
    );
    let windows = assert_bound(&up, TICK, BATCH, 2, "key losses");
    for state in [
        "queue_seq",
        "queue_mark",
        "queue_waiting",
        "queue_heartbeats",
        "queue_queued",
        "flag",
        "targets",
    ] {
        assert!(
            losses(&gws, state) >= 1,
            "the loss of {state} was not counted: {:?}; mark {mark_before} -> {mark_after}, seq {seq_before} -> {seq_after}; {:#?}",
            redis.cmd(&["HGETALL", &format!("{KEY}:losses")]),
            gws.iter()
                .flat_map(|g| g
                    .log()
                    .lines()
                    .filter(|l| l.contains("lost part") || l.contains("WARN") || l.contains("ERROR"))
                    .map(str::to_string)
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
    }
    // The sale's hash: found by whichever comes first, an admission step (a paused stand-in) or
    // a replica's settings refresher (written back from what it read).
    assert!(
        losses(&gws, "sale_stand_in") + losses(&gws, "sale") >= 1,
        "the loss of the sale's parameters was not counted"
    );
    assert_eq!(
        evicted, 0,
        "users evicted after the heartbeat windows were lost ({waiting_at} -> {waiting_later} waiting)"
    );
    eprintln!(
        "keys deleted mid-sale: seq {seq_before}->{seq_after}, mark {mark_before}->{mark_after}, waiting set of {waiting_before} rebuilt from tickets, windows lost with {waiting_at} waiting ({waiting_later} after), paused sale: state {state:?}, {bought_while_paused} purchases while paused; {} answers, 0 positions shared, 0 waiting users lost, {direct} let through with the queue off; max purchases per 1/2/5/10 ticks {:?}",
        seen.len(),
        [windows[0], windows[1], windows[4], windows[9]]
    );
}

/// Three replicas, a sale of 4 per 500 ms; Redis saves a snapshot, the sale goes on for 10 s, and
/// Redis comes back from that snapshot (what a failover to a lagging replica does).
#[test]
fn redis_back_from_an_old_snapshot_buys_no_spent_token_again() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    const TICK: u64 = 500;
    const BATCH: u64 = 4;
    let gws: Vec<GatewayProc> = (0..3)
        .map(|_| {
            gateway(&up, &redis, |c| {
                c.queue.tick_ms = TICK;
                c.queue.batch_size = BATCH;
                c.queue.heartbeat_timeout_s = 20;
            })
        })
        .collect();
    for gw in &gws {
        gw.wait_flag_known();
    }
    let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.listen).collect();
    // Arrivals go on through the lost seconds: 3 × 60 users, one every 200 ms per thread.
    let crowd = Crowd::staggered(addrs, 3, 60, 0, 250, 30_000, 200);
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(redis.cmd(&["SAVE"]).as_str().as_deref(), Some("OK"));
    let saved = epoch_ms();
    let snap_seq = redis.cmd(&["GET", &format!("{KEY}:seq")]).as_int();
    let snap_mark = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    std::thread::sleep(Duration::from_millis(10_000));
    let seq_at = redis.cmd(&["GET", &format!("{KEY}:seq")]).as_int();
    let mark_at = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    let bought_at = purchases(&up).len();
    let lost_ms = epoch_ms() - saved;
    redis.kill();
    redis.restart();
    let back = epoch_ms();
    assert_eq!(
        redis.cmd(&["GET", &format!("{KEY}:seq")]).as_int(),
        snap_seq,
        "Redis did not come back from the snapshot"
    );
    std::thread::sleep(Duration::from_millis(5000));
    let seen = crowd.stop();
    let mark_end = redis
        .cmd(&["GET", &format!("{KEY}:admitted_count")])
        .as_int();
    let seq_end = redis.cmd(&["GET", &format!("{KEY}:seq")]).as_int();

    let twice = bought_twice(&seen);
    assert!(
        twice.is_empty(),
        "{} spent tokens bought again after the rollback",
        twice.len()
    );
    assert!(
        mark_end >= mark_at,
        "the mark went back: {mark_at} -> {mark_end}"
    );
    assert!(
        seq_end >= seq_at,
        "the seq went back: {seq_at} -> {seq_end}"
    );
    let shared = shared_positions(&seen);
    assert!(
        shared.is_empty(),
        "positions shown to two users: {shared:?}"
    );
    // Users who entered in the lost seconds poll with their tickets and are put back.
    let lost = seen.iter().filter(|s| s.kind == Kind::Lost).count();
    let why: Vec<String> = seen
        .iter()
        .filter(|s| s.kind == Kind::Lost)
        .take(5)
        .map(|l| {
            let seq = seen
                .iter()
                .filter(|s| s.user == l.user && s.start_ms < l.start_ms)
                .filter_map(|s| match s.kind {
                    Kind::Waiting { seq } => Some(seq),
                    _ => None,
                })
                .next_back()
                .unwrap_or(0);
            let holder = redis.cmd(&[
                "ZRANGEBYSCORE",
                &format!("{KEY}:waiting"),
                &seq.to_string(),
                &seq.to_string(),
            ]);
            let story: Vec<String> = seen
                .iter()
                .filter(|s| s.user == l.user && s.start_ms + 3000 > back)
                .map(|s| format!("{:+} g{} {:?}", s.start_ms as i64 - back as i64, s.gateway, s.kind))
                .collect();
            format!(
                "user {} at {} ms after the restart, last seq {seq}: bit {}, bitmap {} bytes, held by {holder:?}, token {:?}, {story:?}",
                l.user,
                l.start_ms as i64 - back as i64,
                redis
                    .cmd(&["GETBIT", &format!("{KEY}:queued"), &seq.to_string()])
                    .as_int(),
                redis.cmd(&["STRLEN", &format!("{KEY}:queued")]).as_int(),
                redis.cmd(&["EXISTS", &format!("{KEY}:token:{}", l.user)]),
            )
        })
        .collect();
    assert_eq!(
        lost,
        0,
        "waiting users told 404 after the rollback: {why:#?} losses {:?} snapshot seq {snap_seq}",
        redis.cmd(&["HGETALL", &format!("{KEY}:losses")])
    );
    assert!(
        losses(&gws, "rollback") >= 1,
        "the rollback was not counted"
    );
    // Users admitted twice: a second, different token after the rollback.
    let mut tokens: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for s in &seen {
        if let Kind::Token { token, .. } = &s.kind {
            tokens.entry(s.user).or_default().insert(token.clone());
        }
    }
    let second = tokens.values().filter(|t| t.len() > 1).count();
    // Purchases held while Redis was restarting (answered 503, not forwarded) go through
    // together once it is back: two more ticks of slack than the admissions need.
    let windows = assert_bound(&up, TICK, BATCH, 4, "rollback");
    eprintln!(
        "rolled back {lost_ms} ms of writes (seq {seq_at} -> {snap_seq}, mark {mark_at} -> {snap_mark}; {bought_at} purchases before): 0 spent tokens bought again, mark after {mark_end}, seq after {seq_end}, {second} users with a second token, {lost} waiting users lost; max purchases per 1/2/5/10 ticks {:?}",
        [windows[0], windows[1], windows[4], windows[9]]
    );
    assert_eq!(
        second, 0,
        "{second} users got a second token after the rollback"
    );
}

/// A pre-queued sale's parameters deleted before its opening: the stand-in admits nobody, the
/// replica writes the opening back, and the draw runs at the opening as announced.
#[test]
fn a_pre_queued_sale_lost_before_its_opening_still_opens_as_announced() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gw = gateway(&up, &redis, |c| {
        c.queue.tick_ms = 500;
        c.queue.batch_size = 50;
        c.queue.targets = TargetsMode::Registered;
    });
    let opens_at = epoch_ms() + 7_000;
    let body = format!(
        r#"{{"batchSize": 5, "tickMs": 500, "prequeueOpensAt": {}, "opensAt": {opens_at}}}"#,
        epoch_ms()
    );
    let mut status = 0;
    assert!(wait_until(Duration::from_secs(10), || {
        status = admin(&gw, "PUT", "/sales/limited-drop/42", &body).status;
        status == 200
    }));
    let commitment = redis
        .cmd(&["HGET", &format!("{KEY}:sale"), "drawCommitment"])
        .as_str();
    let crowd = Crowd::start(vec![gw.listen], 2, 10, 0, 300, 40_000);
    std::thread::sleep(Duration::from_millis(2000));
    redis.cmd(&["DEL", &format!("{KEY}:sale")]);
    let back = wait_until(Duration::from_secs(4), || {
        redis
            .cmd(&["HGET", &format!("{KEY}:sale"), "opensAt"])
            .as_str()
            .as_deref()
            == Some(opens_at.to_string().as_str())
    });
    assert!(back, "the opening was not written back");
    let drawn = wait_until(Duration::from_secs(12), || {
        redis
            .cmd(&["HGET", &format!("{KEY}:sale"), "drawnAt"])
            .as_str()
            .is_some_and(|d| d != "0")
    });
    std::thread::sleep(Duration::from_millis(1500));
    let seen = crowd.stop();
    assert!(drawn, "the draw never ran");
    let early: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.start_ms + 50 < opens_at && matches!(s.kind, Kind::Token { .. }))
        .collect();
    assert!(early.is_empty(), "admitted before the opening: {early:?}");
    assert_eq!(
        redis
            .cmd(&["HGET", &format!("{KEY}:sale"), "drawCommitment"])
            .as_str(),
        commitment,
        "the draw's commitment changed"
    );
    assert!(losses(std::slice::from_ref(&gw), "sale") >= 1);
    let shared = shared_positions(&seen);
    assert!(
        shared.is_empty(),
        "positions shown to two users: {shared:?}"
    );
    assert_bound(&up, 500, 5, 2, "pre-queue");
}
