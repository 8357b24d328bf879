//! The admission pump across processes (docs/ARCHITECTURE.md#the-admission-pump): three gateway
//! processes on one Redis with short ticks. The advance script records every advance with Redis'
//! own clock in `queue:{T}:advances` ("ms:mark:live"), which is what the bound is checked against.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const TICK: u64 = 200;
const BATCH: u64 = 5;
const P: &str = "queue:{LIMITED_DROP:7}:";
const Q: &str = "/virtual-queues/limited-drop/7";

fn cluster(
    redis: &RedisServer,
    up: &Upstream,
    n: usize,
    tweak: impl Fn(&mut ConfigFile),
) -> Vec<GatewayProc> {
    (0..n)
        .map(|_| {
            let mut cfg = test_config(up.addr);
            cfg.store.backend = StoreKind::Redis;
            cfg.store.redis_url = redis.url();
            cfg.queue.tick_ms = TICK;
            cfg.queue.batch_size = BATCH;
            tweak(&mut cfg);
            GatewayProc::start(cfg)
        })
        .collect()
}

fn enter(gw: &GatewayProc, users: std::ops::RangeInclusive<u64>) {
    let mut c = gw.client();
    for u in users {
        let r = c
            .request(
                "POST",
                &format!("{Q}/entries"),
                &[("X-User-Id", &u.to_string())],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, 200);
    }
}

fn poll_status(c: &mut Client, user: u64) -> (u16, String) {
    let r = c
        .get(
            &format!("{Q}/entries/me"),
            &[("X-User-Id", &user.to_string())],
        )
        .unwrap();
    let status = if r.status == 200 {
        r.json()["status"].as_str().unwrap().to_string()
    } else {
        String::new()
    };
    (r.status, status)
}

/// (redis ms, mark) of every recorded advance, oldest first.
fn advances(redis: &RedisServer) -> Vec<(u64, u64)> {
    parse_advances(
        &redis
            .cmd(&["LRANGE", &format!("{P}advances"), "0", "-1"])
            .as_vec(),
    )
}

/// Checks the pump's bound (docs/failures.md) on every window starting at an advance, where all
/// users are live.
fn assert_bound(adv: &[(u64, u64)]) {
    assert_bound_live(adv, |_| true);
}

/// The same, counting as admitted only the live seqs the mark moved over.
fn assert_bound_live(adv: &[(u64, u64)], live: impl Fn(u64) -> bool) {
    let mut prev_mark = 0;
    let mut steps = Vec::new();
    for (t, mark) in adv {
        assert!(*mark >= prev_mark, "mark went backwards: {adv:?}");
        let admitted = (prev_mark + 1..=*mark).filter(|s| live(*s)).count() as u64;
        assert!(
            admitted <= BATCH,
            "one advance admitted {admitted}: {adv:?}"
        );
        steps.push((*t, admitted));
        prev_mark = *mark;
    }
    for pair in adv.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(gap * 100 >= 95 * TICK, "advances {gap} ms apart: {adv:?}");
    }
    for (i, (start, _)) in steps.iter().enumerate() {
        for w in [TICK / 2, TICK, 2 * TICK, 5 * TICK, 20 * TICK] {
            let admitted: u64 = steps[i..]
                .iter()
                .take_while(|(t, _)| *t < start + w)
                .map(|(_, n)| n)
                .sum();
            let allowed = BATCH * (w * 100 / (95 * TICK) + 1);
            assert!(
                admitted <= allowed,
                "window {w} ms: {admitted} > {allowed}: {adv:?}"
            );
        }
    }
}

#[test]
fn three_instances_admit_within_the_bound_in_order_at_the_ideal_rate() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = cluster(&redis, &up, 3, |_| {});
    enter(&gws[0], 1..=300);
    let started = Instant::now();
    // Users 31..=40 leave (before the mark gets there): they must take no admission slot.
    let mut c = gws[1].client();
    for u in 31..=40 {
        c.request(
            "DELETE",
            &format!("{Q}/entries/me"),
            &[("X-User-Id", &u.to_string())],
            b"",
        )
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(12 * TICK));
    let elapsed = started.elapsed().as_millis() as u64;
    let adv = advances(&redis);
    let leaver = |u: u64| (31..=40).contains(&u);
    assert_bound_live(&adv, |s| !leaver(s));
    let mark = adv.last().unwrap().1;
    // Progress: about one batch per tick (allow for start-up and scheduling noise).
    let ideal = elapsed / TICK;
    assert!(
        adv.len() as u64 * 10 >= ideal * 7,
        "{} advances in {elapsed} ms",
        adv.len()
    );
    // FIFO over live users: exactly the lowest seqs are admitted; the leavers took no slot.
    let mut c = gws[2].client();
    let mark_now = || redis.cmd(&["GET", &format!("{P}admitted_count")]).as_int() as u64;
    for u in 1..=mark + 20 {
        if leaver(u) {
            continue;
        }
        // The pump keeps running: read the mark around each poll.
        let before = mark_now();
        let (_, status) = poll_status(&mut c, u);
        let after = mark_now();
        if u <= before {
            assert_eq!(status, "ADMITTED", "user {u} with mark {before}");
        } else if u > after {
            assert_eq!(status, "WAITING", "user {u} with mark {after}");
        }
    }
    // The instances' admitted counters add up to the live users under the mark (read around the
    // scrape, since the pump keeps running; a counter lags its script by a moment).
    let live_under = |m: u64| (1..=m).filter(|u| !leaver(*u)).count() as u64;
    let before = live_under(mark_now());
    let total: u64 = gws
        .iter()
        .map(|g| {
            metric(
                &g.metrics(),
                "virtual_queue_admitted_total{target=\"LIMITED_DROP:7\"}",
            )
        })
        .sum();
    let after = live_under(mark_now());
    assert!(
        total + BATCH >= before && total <= after,
        "{before} <= {total} <= {after}"
    );
}

#[test]
fn killing_the_lock_holder_hands_over_within_about_a_tick() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let mut gws = cluster(&redis, &up, 3, |_| {});
    enter(&gws[0], 1..=500);
    // Find the current holder from the lock's value ("pid-random").
    let mut holder = None;
    assert!(wait_until(Duration::from_secs(5), || {
        let owner = redis.cmd(&["GET", &format!("{P}lock")]).as_str();
        holder = owner.and_then(|o| {
            let pid: u32 = o.split('-').next()?.parse().ok()?;
            gws.iter().position(|g| g.pid() == pid)
        });
        holder.is_some()
    }));
    let victim = gws.remove(holder.unwrap());
    victim.signal("KILL");
    let killed_at = advances(&redis).last().unwrap().0;
    drop(victim);
    // The next advances come from the others, within about one tick of the kill.
    assert!(wait_until(Duration::from_secs(5), || advances(&redis)
        .iter()
        .filter(|(t, _)| *t > killed_at)
        .count()
        >= 3));
    let adv = advances(&redis);
    let next = adv.iter().find(|(t, _)| *t > killed_at).unwrap().0;
    assert!(
        next - killed_at <= 3 * TICK,
        "took {} ms to hand over",
        next - killed_at
    );
    assert_bound(&adv);
}

#[test]
fn the_bound_holds_with_the_lock_deleted_continuously() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = cluster(&redis, &up, 3, |_| {});
    enter(&gws[0], 1..=500);
    let stop = Arc::new(AtomicBool::new(false));
    let port = redis.port;
    let deleter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let conn = common::redis::RedisConn::connect(port).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                conn.cmd(&["DEL", &format!("{P}lock")]).unwrap();
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(10 * TICK));
    stop.store(true, Ordering::Relaxed);
    let deletes = deleter.join().unwrap();
    assert!(deletes > 100, "only {deletes} deletes");
    let adv = advances(&redis);
    assert!(adv.len() >= 5, "{adv:?}");
    assert_bound(&adv);
    drop(gws);
}

#[test]
fn users_who_stop_polling_are_evicted_others_keep_their_place() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = cluster(&redis, &up, 1, |c| {
        c.queue.heartbeat_timeout_s = 2;
        c.queue.batch_size = 1;
        c.queue.tick_ms = 1_000;
    });
    let gw = &gws[0];
    enter(gw, 1..=6);
    // Users 2..=6 keep polling from their own thread; user 1 never polls again.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, listen) = (stop.clone(), gw.listen);
        std::thread::spawn(move || {
            let mut c = Client::connect(listen);
            let mut lost = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for u in 2..=6 {
                    if poll_status(&mut c, u).0 != 200 {
                        lost.push(u);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            lost
        })
    };
    let evicted = wait_until(Duration::from_secs(8), || {
        redis.cmd(&["ZSCORE", &format!("{P}waiting"), "1"]) == Resp::Nil
            && redis.cmd(&["GET", &format!("{P}token:1")]) == Resp::Nil
    });
    stop.store(true, Ordering::Relaxed);
    let lost = poller.join().unwrap();
    assert!(evicted, "user 1 was not evicted");
    assert!(
        lost.is_empty(),
        "users who kept polling lost their place: {lost:?}"
    );
    let mut c = gw.client();
    assert_eq!(poll_status(&mut c, 1).0, 404);
    for u in 2..=6 {
        assert_eq!(poll_status(&mut c, u).0, 200);
    }
    assert!(
        metric(
            &gw.metrics(),
            "virtual_queue_evicted_total{target=\"LIMITED_DROP:7\"}"
        ) >= 1
    );
}

/// Three replicas that stopped registering without a trace of their death (no presence, no
/// name) hold the whole batch back: the pump admits nobody, and still evicts a silent user
/// every tick.
#[test]
fn silent_users_are_evicted_while_every_slice_is_held_back() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    // Three members that registered 3.5 s ago (the live window is 3 ticks here): recent, not
    // live, and their slices cover the whole batch.
    let time = redis.cmd(&["TIME"]).as_vec();
    let then = (time[0].as_str().unwrap().parse::<u64>().unwrap() * 1000 - 3500).to_string();
    redis.cmd(&[
        "ZADD",
        "queue:instances",
        &then,
        "x1|0:333333|1",
        &then,
        "x2|333333:666666|1",
        &then,
        "x3|666666:1000000|1",
    ]);
    let gws = cluster(&redis, &up, 1, |c| {
        c.queue.heartbeat_timeout_s = 2;
        c.queue.batch_size = 1;
        c.queue.tick_ms = 1_000;
    });
    let gw = &gws[0];
    enter(gw, 1..=3);
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, listen) = (stop.clone(), gw.listen);
        std::thread::spawn(move || {
            let mut c = Client::connect(listen);
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for u in 2..=3 {
                    seen.push(poll_status(&mut c, u));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        })
    };
    let evicted = wait_until(Duration::from_secs(8), || {
        redis.cmd(&["ZSCORE", &format!("{P}waiting"), "1"]) == Resp::Nil
    });
    stop.store(true, Ordering::Relaxed);
    let seen = poller.join().unwrap();
    assert!(evicted, "the silent user was not evicted:\n{}", gw.log());
    assert!(
        seen.iter()
            .all(|(status, s)| *status == 200 && s == "WAITING"),
        "the polling users were admitted or lost: {seen:?}"
    );
    let marks: Vec<u64> = advances(&redis).iter().map(|(_, m)| *m).collect();
    assert!(
        marks.iter().all(|m| *m == 0),
        "admitted while held back: {marks:?}"
    );
}

#[test]
fn a_stopping_instance_releases_its_lock() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    // A long tick: the lock (0.9 × tick) would otherwise stay for 4.5 s.
    let mut gws = cluster(&redis, &up, 1, |c| c.queue.tick_ms = 5_000);
    enter(&gws[0], 1..=3);
    let lock = format!("{P}lock");
    assert!(wait_until(Duration::from_secs(8), || redis
        .cmd(&["EXISTS", &lock])
        .as_int()
        == 1));
    let owner = redis.cmd(&["GET", &lock]).as_str().unwrap();
    assert!(owner.starts_with(&format!("{}-", gws[0].pid())), "{owner}");
    gws[0].signal("TERM");
    let released = wait_until(Duration::from_secs(2), || {
        redis.cmd(&["EXISTS", &lock]).as_int() == 0
    });
    let pttl = redis.cmd(&["PTTL", &lock]).as_int();
    assert!(released, "lock still held after SIGTERM (pttl {pttl} ms)");
    assert_eq!(gws[0].wait_exit(Duration::from_secs(10)), Some(Some(0)));
    gws.clear();
}

#[test]
fn memory_store_pump_admits_too() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.queue.tick_ms = TICK;
    cfg.queue.batch_size = BATCH;
    let gw = GatewayProc::start(cfg);
    enter(&gw, 1..=12);
    let mut c = gw.client();
    assert!(wait_until(Duration::from_secs(5), || poll_status(
        &mut c, 12
    )
    .1 == "ADMITTED"));
    // The counter follows the advance script's reply by a moment.
    let counted = wait_until(Duration::from_secs(3), || {
        metric(
            &gw.metrics(),
            "virtual_queue_admitted_total{target=\"LIMITED_DROP:7\"}",
        ) == 12
    });
    assert!(counted, "{}", gw.metrics());
}
