//! A crash costs seconds, not minutes: three gateway processes on one Redis under load, one of
//! them SIGKILLed mid-sale. The roster tells the dead replica from a cut-off one (its presence
//! subscription closed with the process), or a restarted replica retires its predecessor by name;
//! either way the pumps stop holding its slice of the batch back. And with a batch smaller than
//! the replica count, every replica paces some ticks while Redis is down, the slices together never
//! more than the batch in a tick.
//!
//! Admissions are read from `queue:{T}:advances` ("ms:mark:live", the live users admitted so far,
//! Redis' clock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::load::{epoch_ms, Load, LoadConfig, Op};
use common::*;

const TICK_MS: u64 = 500;
const P: &str = "queue:{LIMITED_DROP:42}:";

fn config(redis_url: &str, up: &Upstream, batch: u64) -> ConfigFile {
    let mut cfg = test_config(up.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis_url.to_string();
    cfg.queue.tick_ms = TICK_MS;
    cfg.queue.batch_size = batch;
    cfg.queue.heartbeat_timeout_s = 10;
    cfg.store.startup_wait_ms = 2000;
    cfg
}

/// (Redis ms, live users admitted by that step) of every recorded advance, oldest first.
fn steps(redis: &RedisServer) -> Vec<(u64, u64)> {
    let list = redis
        .cmd(&["LRANGE", &format!("{P}advances"), "0", "-1"])
        .as_vec();
    let mut v: Vec<(u64, u64)> = list
        .iter()
        .map(|r| {
            let s = r.as_str().unwrap();
            let f: Vec<u64> = s.split(':').map(|x| x.parse().unwrap()).collect();
            (f[0], f[2])
        })
        .collect();
    v.reverse();
    let mut out = Vec::new();
    let mut prev = None;
    for (ms, live) in v {
        if let Some(p) = prev {
            out.push((ms, live - p));
        }
        prev = Some(live);
    }
    out
}

/// Redis' clock, ms.
fn redis_ms(redis: &RedisServer) -> u64 {
    let t = redis.cmd(&["TIME"]).as_vec();
    t[0].as_str().unwrap().parse::<u64>().unwrap() * 1000
        + t[1].as_str().unwrap().parse::<u64>().unwrap() / 1000
}

/// Waits until the three replicas hold their seats (thirds) in the roster.
fn wait_for_seats(redis: &RedisServer, n: usize) {
    let settled = || {
        let members = redis
            .cmd(&["ZRANGE", "queue:instances", "0", "-1"])
            .as_vec();
        let mut widths: Vec<u64> = members
            .iter()
            .filter_map(|m| {
                let m = m.as_str()?;
                let slice = m.split('|').nth(1)?;
                let (a, b) = slice.split_once(':')?;
                Some(b.parse::<u64>().ok()? - a.parse::<u64>().ok()?)
            })
            .collect();
        widths.sort();
        members.len() == n && widths.iter().all(|w| *w >= 1_000_000 / n as u64 - 1)
    };
    assert!(
        wait_until(Duration::from_secs(10), settled),
        "{:?}",
        redis.cmd(&["ZRANGE", "queue:instances", "0", "-1"])
    );
}

/// The replica holding the sale's pump lock now, by the lock's value ("pid-random").
fn leader(redis: &RedisServer, gws: &[GatewayProc]) -> usize {
    let mut holder = None;
    assert!(wait_until(Duration::from_secs(5), || {
        let owner = redis.cmd(&["GET", &format!("{P}lock")]).as_str();
        holder = owner.and_then(|o| {
            let pid: u32 = o.split('-').next()?.parse().ok()?;
            gws.iter().position(|g| g.pid() == pid)
        });
        holder.is_some()
    }));
    holder.unwrap()
}

/// Kills the pump's leader under load (on the other replicas) and returns which replica it was
/// and the steps after the kill: (ms after the kill, users admitted). The killed replica is
/// removed from `gws`.
fn kill_the_leader_under_load(
    redis: &RedisServer,
    gws: &mut Vec<GatewayProc>,
    observe_ms: u64,
) -> (usize, Vec<(u64, u64)>) {
    // A queue for the pumps to lead: a few users who never come back.
    let mut c = gws[0].client();
    for u in 1..=20u64 {
        let r = c
            .request(
                "POST",
                "/virtual-queues/limited-drop/42/entries",
                &[("X-User-Id", &u.to_string())],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let victim = leader(redis, gws);
    let others: Vec<_> = gws
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, g)| g.listen)
        .collect();
    let load = Load::start(LoadConfig {
        threads: 4,
        drive_by_every: 0,
        ..LoadConfig::new(others)
    });
    std::thread::sleep(Duration::from_millis(3000));
    let killed = redis_ms(redis);
    gws[victim].signal("KILL");
    let _ = gws[victim].wait_exit(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(observe_ms));
    let events = load.stop();
    let buys = events
        .iter()
        .filter(|e| e.op == Op::Purchase && e.status == 200)
        .count();
    eprintln!("{buys} purchases answered 200 during the run");
    gws.remove(victim);
    let after = steps(redis)
        .into_iter()
        .filter(|(ms, _)| *ms > killed)
        .map(|(ms, n)| (ms - killed, n))
        .collect();
    (victim, after)
}

/// SIGKILL of the pump's leader mid-sale: within 3 ticks every step admits the whole batch
/// again, and keeps doing so (the crashed replica's slice is not held back for
/// `fail_open.paced_for_s`, which is 120 s here).
#[test]
fn sigkill_of_the_pump_leader_gives_the_whole_budget_back_within_three_ticks() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    const BATCH: u64 = 6;
    let mut gws: Vec<GatewayProc> = (0..3)
        .map(|_| GatewayProc::start(config(&redis.url(), &up, BATCH)))
        .collect();
    wait_for_seats(&redis, 3);
    let (_, after) = kill_the_leader_under_load(&redis, &mut gws, 6000);
    eprintln!("steps after the kill (ms, admitted): {after:?}");
    let late: Vec<&(u64, u64)> = after.iter().filter(|(ms, _)| *ms > 3 * TICK_MS).collect();
    assert!(late.len() >= 8, "too few steps after the kill: {after:?}");
    assert!(
        late.iter().all(|(_, n)| *n == BATCH),
        "a step after the first 3 ticks admitted less than the batch: {after:?}"
    );
    assert!(after.iter().all(|(_, n)| *n <= BATCH), "{after:?}");
    // One of the others dropped it from the roster as dead (not as retired: no names here).
    assert!(
        gws.iter().any(|g| g
            .log()
            .lines()
            .any(|l| l.contains("replicas gone from the roster") && l.contains("dead=1"))),
        "{}",
        gws[0].log()
    );
}

/// Where Redis refuses `CONFIG` (a managed Redis), a crash cannot be told from a partition:
/// the crashed replica's slice is held back until it restarts under the same replica name,
/// whose first registrations retire its predecessor; then every step admits the whole batch.
#[test]
fn a_restarted_replica_retires_its_predecessor_by_name() {
    let _serial = serial();
    let redis = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let up = Upstream::start();
    const BATCH: u64 = 6;
    let start = |i: usize| {
        let mut cfg = config(&redis.url(), &up, BATCH);
        cfg.server.replica_name_env = "VQ_REPLICA_NAME".into();
        let name = format!("gateway-{i}");
        GatewayProc::start_with_env(
            cfg,
            &[("VQ_TOKEN_SECRET", TEST_SECRET), ("VQ_REPLICA_NAME", &name)],
        )
    };
    let mut gws: Vec<GatewayProc> = (0..3).map(start).collect();
    wait_for_seats(&redis, 3);
    // Replica i is named gateway-i; the victim's index is its name's.
    let (victim, after) = kill_the_leader_under_load(&redis, &mut gws, 4000);
    eprintln!("steps after the kill, no presence (ms, admitted): {after:?}");
    // Held back once the live window (2 s) is over: no presence to tell it dead.
    let held: Vec<&(u64, u64)> = after.iter().filter(|(ms, _)| *ms > 2600).collect();
    assert!(
        held.iter().any(|(_, n)| *n < BATCH),
        "the crashed replica's slice was not held back without presence: {after:?}"
    );
    let restarted = redis_ms(&redis);
    gws.push(start(victim));
    let load = Load::start(LoadConfig {
        threads: 4,
        drive_by_every: 0,
        ..LoadConfig::new(gws.iter().map(|g| g.listen).collect())
    });
    std::thread::sleep(Duration::from_millis(4000));
    let _ = load.stop();
    let back: Vec<(u64, u64)> = steps(&redis)
        .into_iter()
        .filter(|(ms, _)| *ms > restarted)
        .map(|(ms, n)| (ms - restarted, n))
        .collect();
    eprintln!("steps after the restart (ms, admitted): {back:?}");
    let late: Vec<&(u64, u64)> = back.iter().filter(|(ms, _)| *ms > 3 * TICK_MS).collect();
    assert!(late.len() >= 4, "{back:?}");
    assert!(late.iter().all(|(_, n)| *n == BATCH), "{back:?}");
    let log = gws.last().unwrap().log();
    assert!(log.contains("replicas gone from the roster"), "{log}");
}

/// Batch 2 and three replicas, Redis killed: each replica paces some ticks (its slice rotates),
/// and in no tick do the three let more than 2 users through together.
#[test]
fn with_a_batch_smaller_than_the_replicas_every_replica_admits_while_redis_is_down() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    const BATCH: u64 = 2;
    let gws: Vec<GatewayProc> = (0..3)
        .map(|_| {
            let mut cfg = config(&redis.url(), &up, BATCH);
            cfg.fail_open.paced_for_s = Some(20);
            GatewayProc::start(cfg)
        })
        .collect();
    wait_for_seats(&redis, 3);
    let load = Load::start(LoadConfig {
        threads: 6,
        drive_by_every: 0,
        ..LoadConfig::new(gws.iter().map(|g| g.listen).collect())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let killed = epoch_ms();
    redis.kill();
    std::thread::sleep(Duration::from_millis(12_000));
    redis.restart();
    std::thread::sleep(Duration::from_millis(2000));
    let back = epoch_ms();
    let events = load.stop();
    let direct: Vec<_> = events
        .iter()
        .filter(|e| e.direct && e.start_ms >= killed && e.end_ms <= back)
        .collect();
    let mut per_replica = [0usize; 3];
    let mut per_tick: std::collections::BTreeMap<u64, usize> = Default::default();
    for e in &direct {
        per_replica[e.gateway] += 1;
        // Decided between the request's start and its answer's end: both in one tick here.
        let (a, b) = (e.start_ms / TICK_MS, e.end_ms / TICK_MS);
        if a == b {
            *per_tick.entry(a).or_default() += 1;
        }
    }
    eprintln!("paced admissions per replica: {per_replica:?}; per tick: {per_tick:?}");
    assert!(
        per_replica.iter().all(|n| *n > 0),
        "a replica never admitted: {per_replica:?}"
    );
    assert!(
        per_tick.values().all(|n| *n as u64 <= BATCH),
        "more than the batch in a tick: {per_tick:?}"
    );
    let degraded_late = events
        .iter()
        .filter(|e| e.degraded && e.start_ms > back - 500)
        .count();
    assert_eq!(degraded_late, 0, "still degraded after Redis came back");
}

/// `serve` refuses to start when the replica name's variable is unset or holds no name; the other
/// commands (an operator's CLI on another machine) never read it.
#[test]
fn serve_refuses_a_replica_name_variable_that_is_unset_or_not_a_name() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.replica_name_env = "VQ_REPLICA_NAME".into();
    let dir = TempDir::new("name");
    let path = dir.0.join("gateway.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    let path = path.to_str().unwrap();
    for name in [None, Some("two words"), Some(&"x".repeat(65)[..])] {
        let mut env = vec![("VQ_TOKEN_SECRET", TEST_SECRET)];
        if let Some(n) = name {
            env.push(("VQ_REPLICA_NAME", n));
        }
        let (code, _, err) = run_bin(&["serve", "--config", path], &env, Duration::from_secs(10));
        assert_ne!(code, Some(0), "{name:?}");
        assert!(err.contains("server.replica_name_env"), "{name:?}: {err}");
    }
    let (code, out, err) = run_bin(
        &["check-config", "--config", path],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("OK"), "{out}");
}
