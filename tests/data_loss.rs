//! Neither Redis data loss nor client overload may open the gate.
//!
//! - A Redis that restarts empty mid-sale (no persistence; a failover to an empty replica and a
//!   `FLUSHALL` look the same) loses the run-time flag and the registered sales. The replicas
//!   keep what they last read, keep gating, count the loss and write the state back
//!   (`src/settings.rs`): no purchase reaches the backend without a token, under load.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::load::{self, epoch_ms, purchase_path, Load, LoadConfig};
use common::*;

const TICK_MS: u64 = 500;
const BATCH: u64 = 5;

/// Users the attacker claims to be: never admitted, never given a token.
const ATTACKER_BASE: u64 = 900_000_000;

/// Purchases without a token, as fast as the gateways answer, from made-up users; counts the
/// ones answered 2xx (which the backend then saw).
struct Attacker {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    handle: std::thread::JoinHandle<u64>,
}

impl Attacker {
    fn start(gateways: Vec<std::net::SocketAddr>) -> Attacker {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let handle = std::thread::spawn(move || {
            let mut clients: Vec<Client> = gateways.iter().map(|a| Client::connect(*a)).collect();
            let mut passed = 0;
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) {
                i += 1;
                let g = (i as usize) % clients.len();
                let user = (ATTACKER_BASE + i).to_string();
                match clients[g].request("POST", &purchase_path(42), &[("X-User-Id", &user)], b"{}")
                {
                    Ok(r) if r.status < 300 => passed += 1,
                    Ok(_) => {}
                    Err(_) => {
                        clients[g] = Client::connect(gateways[g]);
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                n.fetch_add(1, Ordering::Relaxed);
            }
            passed
        });
        Attacker { stop, sent, handle }
    }

    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let passed = self.handle.join().unwrap();
        (passed, self.sent.load(Ordering::Relaxed))
    }
}

fn cli(gw: &GatewayProc, args: &[&str]) -> String {
    let path = gw.dir.0.join("gateway.toml");
    let mut all: Vec<&str> = args[..2].to_vec();
    all.extend_from_slice(&["--config", path.to_str().unwrap()]);
    all.extend_from_slice(&args[2..]);
    let (code, out, err) = run_bin(&all, &[], Duration::from_secs(15));
    assert_eq!(code, Some(0), "{args:?}: {out}{err}");
    out
}

#[test]
fn redis_restarted_empty_mid_sale_keeps_the_queue_on_and_writes_the_state_back() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = (0..2)
        .map(|_| {
            let mut cfg = test_config(up.addr);
            cfg.store.backend = StoreKind::Redis;
            cfg.store.redis_url = redis.url();
            cfg.queue.tick_ms = TICK_MS;
            cfg.queue.batch_size = BATCH;
            cfg.queue.heartbeat_timeout_s = 5;
            // The shipped production shape: the queue off in the file, on at run time; only
            // registered sales have one, and other sales' purchases pass ungated.
            cfg.flag.enabled = false;
            cfg.queue.targets = TargetsMode::Registered;
            cfg.queue.unregistered_gated = UnregisteredGated::Pass;
            cfg.store.startup_wait_ms = 2000;
            GatewayProc::start(cfg)
        })
        .collect();
    // The replicas created the flag from their file (off) on the empty Redis; the operator
    // registers the sale and turns the queue on.
    assert!(wait_until(Duration::from_secs(8), || redis
        .cmd(&["HGET", "{queue:flag}:meta", "version"])
        .as_str()
        .is_some()));
    cli(&gws[0], &["target", "add", "LIMITED_DROP:42"]);
    cli(&gws[0], &["flag", "set", "--enabled", "on"]);
    let addrs: Vec<_> = gws.iter().map(|g| g.listen).collect();
    for gw in &gws {
        assert!(
            wait_until(Duration::from_secs(4), || {
                let r = gw
                    .client()
                    .request("POST", &purchase_path(42), &[("X-User-Id", "17")], b"{}")
                    .unwrap();
                r.status == 403
            }),
            "the queue never came on"
        );
    }

    let load = Load::start(LoadConfig {
        threads: 3,
        drive_by_every: 0,
        ..LoadConfig::new(addrs.clone())
    });
    let attacker = Attacker::start(addrs.clone());
    std::thread::sleep(Duration::from_millis(1500));
    redis.kill();
    std::thread::sleep(Duration::from_millis(1500));
    let back = epoch_ms();
    redis.restart();
    // The replicas notice the loss at their next read (every second) and write the state back.
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
    let restored_ms = epoch_ms() - back;
    std::thread::sleep(Duration::from_millis(2000));
    let events = load.stop();
    let (passed, sent) = attacker.stop();
    assert!(restored, "the state was not written back");

    // Not one purchase without a token reached the backend.
    let attackers_at_backend = up
        .requests()
        .iter()
        .filter(|r| {
            r.header("x-user-id")
                .and_then(|u| u.parse::<u64>().ok())
                .is_some_and(|u| u >= ATTACKER_BASE)
        })
        .count();
    assert_eq!(passed, 0, "tokenless purchases answered 2xx, of {sent}");
    assert_eq!(attackers_at_backend, 0);
    assert!(sent > 100, "the attacker barely ran: {sent}");

    // The queue stayed on: nobody entering after the restart was let straight through
    // without the pump (degraded pacing during the outage is the budget's own).
    let direct_after = events
        .iter()
        .filter(|e| e.start_ms > back + 1000 && e.direct && !e.degraded)
        .count();
    assert_eq!(
        direct_after, 0,
        "users let straight through after the restart"
    );
    let waiting_after = events
        .iter()
        .filter(|e| e.start_ms > back + 1000 && e.status == 200 && !e.direct)
        .count();
    assert!(waiting_after > 0, "no queue answers after the restart");

    // Purchases stay within the budget (one extra batch for the tick Redis came back in,
    // as in every fault, and the load generator's lag).
    let purchases: Vec<u64> = up
        .requests()
        .iter()
        .filter(|r| r.target == purchase_path(42))
        .map(|r| r.at_ms)
        .collect();
    let lag = load::purchase_lag_ticks(&events, TICK_MS);
    let windows = load::max_per_window(&purchases, TICK_MS, 10);
    for (i, max) in windows.iter().enumerate() {
        let n = i as u64 + 1;
        // Each replica paces its own share while Redis is down, and the empty Redis starts a
        // new queue whose first batch comes on top: two extra batches.
        let bound = (n + 3 + lag) * BATCH;
        assert!(
            *max as u64 <= bound,
            "{max} purchases in {n} ticks, bound {bound}: {windows:?}"
        );
    }

    // The loss was counted (the alert's series), by whichever replica noticed it before another
    // had written the state back.
    let counted = |state: &str| -> u64 {
        gws.iter()
            .map(|gw| {
                metric(
                    &gw.metrics(),
                    &format!("virtual_queue_store_data_loss_total{{state=\"{state}\"}}"),
                )
            })
            .sum()
    };
    assert!(counted("flag") >= 1);
    assert!(counted("targets") >= 1);
    let versioned = redis
        .cmd(&["HGET", "{queue:flag}:meta", "version"])
        .as_str();
    assert!(
        versioned.is_some_and(|v| v != "1"),
        "the operator's version came back"
    );
    eprintln!(
        "restarted empty: state written back {restored_ms} ms after the restart; {sent} tokenless purchases, 0 through; {} purchases at the backend, max per 1/2/4 ticks {:?}",
        purchases.len(),
        [windows[0], windows[1], windows[3]]
    );
}

/// The overload replay: a replica flooded by 4,096 connections of polls while 600 tokens that
/// were spent through another replica are replayed through it. Its claim calls time out because
/// the replica is overloaded, not because Redis is down: they must not fall back to local claims
/// (which cannot see the uses Redis recorded).
#[test]
fn spent_tokens_replayed_under_overload_never_reach_the_backend() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let config = || {
        let mut cfg = test_config(up.addr);
        cfg.store.backend = StoreKind::Redis;
        cfg.store.redis_url = redis.url();
        cfg.queue.tick_ms = 3_600_000;
        cfg
    };
    let (spender, flooded) = (GatewayProc::start(config()), GatewayProc::start(config()));
    spender.wait_flag_known();
    flooded.wait_flag_known();
    let exp = now_s() + 250;
    let tokens: Vec<(String, String)> = (1..=600u64)
        .map(|u| {
            let t = token_for(TEST_SECRET, &format!("LIMITED_DROP|42|{u}|{exp}"));
            (u.to_string(), t)
        })
        .collect();
    let mut c = spender.client();
    for (user, token) in &tokens {
        let r = c
            .request(
                "POST",
                &purchase_path(42),
                &[("X-User-Id", user), ("X-Entry-Token", token)],
                b"{}",
            )
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let bought = || {
        up.requests()
            .iter()
            .filter(|r| r.target == purchase_path(42))
            .count()
    };
    assert_eq!(bought(), 600);

    let flood = common::flood::Flood::start(flooded.listen, 4096, |i, _| {
        format!(
            "GET /virtual-queues/limited-drop/42/entries/me HTTP/1.1\r\nHost: t\r\nX-User-Id: {}\r\n\r\n",
            2_000_000 + i
        )
    });
    assert!(wait_until(Duration::from_secs(20), || flood.answers() > 20_000));
    let stop = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(tokens);
    let replayers: Vec<_> = (0..64)
        .map(|k| {
            let (stop, tokens) = (stop.clone(), tokens.clone());
            let addr = flooded.listen;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
                let mut i = k * 10;
                while !stop.load(Ordering::Relaxed) {
                    let (user, token) = &tokens[i % tokens.len()];
                    i += 1;
                    let status = match c.request(
                        "POST",
                        &purchase_path(42),
                        &[("X-User-Id", user), ("X-Entry-Token", token)],
                        b"{}",
                    ) {
                        Ok(r) => r.status,
                        Err(_) => {
                            c = Client::connect(addr);
                            0
                        }
                    };
                    *statuses.entry(status).or_default() += 1;
                }
                statuses
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(12));
    stop.store(true, Ordering::Relaxed);
    let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
    for r in replayers {
        for (s, n) in r.join().unwrap() {
            *statuses.entry(s).or_default() += n;
        }
    }
    let answers = flood.answers();
    let counts = flood.stop();
    let m = flooded.metrics();
    let series = |s: &str| metric(&m, s);
    eprintln!(
        "overload replay: {answers} flood answers ({} 5xx, {} reconnects); replays by status {statuses:?}; claim calls failed {}, refused unconfirmed {}, saturated {}",
        counts.errors.load(Ordering::Relaxed),
        counts.reconnects.load(Ordering::Relaxed),
        series("virtual_queue_redis_degraded_total{op=\"claim\"}"),
        series("virtual_queue_bypass_attempts_total{reason=\"claim_unconfirmed\",route=\"/limited-drops/{id}/orders\"}"),
        series("virtual_queue_bypass_attempts_total{reason=\"claim_saturated\",route=\"/limited-drops/{id}/orders\"}"),
    );
    assert_eq!(bought(), 600, "a spent token reached the backend again");
    // Enough replays to matter (each waits on the slowed link and the flooded replica: 450–530
    // answered in 12 s in the runs so far).
    assert!(statuses.values().sum::<u64>() >= 300, "{statuses:?}");
    assert!(
        statuses.keys().all(|s| matches!(s, 403 | 503 | 0)),
        "{statuses:?}"
    );
    // The overload was real: claim calls timed out while Redis answered (each would have been a
    // local claim, and a spent token at the backend, before).
    assert!(
        series("virtual_queue_bypass_attempts_total{reason=\"claim_unconfirmed\",route=\"/limited-drops/{id}/orders\"}") > 0,
        "no claim call timed out: the flood did not overload the replica"
    );
}

/// Shedding is not silence: a replica that refuses polls for saturation (its in-flight limit)
/// tells the registry for how long its users could not heartbeat, and no pump evicts them for it,
/// even when another replica leads the sweep.
#[test]
fn polls_refused_for_saturation_never_evict_the_users_who_sent_them() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    // The flooded replica reaches Redis through a relay that delays every reply by 40 ms: each
    // call holds one of its two in-flight permits that long, so it refuses most polls.
    let relay = common::relay::Relay::start(format!("127.0.0.1:{}", redis.port).parse().unwrap());
    let config = |max_in_flight: u64, url: String| {
        let mut cfg = test_config(up.addr);
        cfg.store.backend = StoreKind::Redis;
        cfg.store.redis_url = url;
        cfg.queue.tick_ms = 500;
        cfg.queue.batch_size = 1;
        cfg.queue.heartbeat_timeout_s = 2;
        cfg.store.max_in_flight = max_in_flight;
        cfg
    };
    // The leader sweeps; the flooded replica takes the users' polls and sheds most of them.
    let leader = GatewayProc::start(config(256, redis.url()));
    let flooded = GatewayProc::start(config(2, relay.url()));
    for gw in [&leader, &flooded] {
        assert!(wait_until(Duration::from_secs(5), || gw
            .metrics()
            .contains("virtual_queue_replicas 2")));
    }
    // 200 users ahead keep the tracked ones waiting (they poll through the leader).
    let mut c = leader.client();
    let enter = |c: &mut Client, user: u64| {
        let r = c
            .request(
                "POST",
                "/virtual-queues/limited-drop/42/entries",
                &[("X-User-Id", &user.to_string())],
                b"",
            )
            .unwrap();
        assert_eq!(r.json()["status"], "WAITING");
    };
    for user in 1..=200 {
        enter(&mut c, user);
    }
    let ahead = std::thread::spawn({
        let addr = leader.listen;
        move || {
            let mut c = Client::connect(addr);
            let until = std::time::Instant::now() + Duration::from_secs(11);
            while std::time::Instant::now() < until {
                for user in 1..=200u64 {
                    let _ = c.get(
                        "/virtual-queues/limited-drop/42/entries/me",
                        &[("X-User-Id", &user.to_string())],
                    );
                }
            }
        }
    });
    for user in 1001..=1020 {
        enter(&mut c, user);
    }
    relay.slow(40);
    let flood = common::flood::Flood::start(flooded.listen, 128, |i, _| {
        format!(
            "GET /virtual-queues/limited-drop/42/entries/me HTTP/1.1\r\nHost: t\r\nX-User-Id: {}\r\n\r\n",
            5_000_000 + i
        )
    });
    // The tracked users poll every 900 ms (twice per heartbeat timeout) through the flooded
    // replica only, for 8 s.
    let mut c = flooded.client();
    let mut lost = Vec::new();
    let mut shed_answers = 0;
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        for user in 1001..=1020u64 {
            let r = c
                .get(
                    "/virtual-queues/limited-drop/42/entries/me",
                    &[("X-User-Id", &user.to_string())],
                )
                .unwrap();
            if r.status == 404 {
                lost.push(user);
            } else if r.json()["degraded"] == true {
                shed_answers += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(900));
    }
    flood.stop();
    relay.slow(0);
    ahead.join().unwrap();
    let refused = metric(
        &flooded.metrics(),
        "virtual_queue_store_refused_total{op=\"poll\",reason=\"saturated\"}",
    );
    let evicted = metric(
        &leader.metrics(),
        "virtual_queue_evicted_total{target=\"LIMITED_DROP:42\"}",
    );
    eprintln!(
        "shedding: {refused} polls refused for saturation on the flooded replica ({shed_answers} of the tracked users'); {evicted} evicted by the leader; tracked users lost: {lost:?}"
    );
    let polls = 20 * 8_000 / 900;
    assert!(
        shed_answers * 2 > polls,
        "the tracked users' polls were hardly shed: {shed_answers} of about {polls}"
    );
    assert!(
        lost.is_empty(),
        "users evicted while their polls were shed: {lost:?}"
    );
}
