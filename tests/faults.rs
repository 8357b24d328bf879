//! Faults under concurrent load (a fault without load hides the worst bugs): Redis paused for
//! 50 ms to 10 s, killed and restarted, its clients killed, filled to maxmemory; a stats flood;
//! a replica restarted. Two gateway processes share one Redis; a load generator
//! (`common/load.rs`) enters, polls and buys at full speed through both.
//!
//! For each fault: no 5xx, degraded mode ends within a second of Redis answering again, no user
//! who held a position is lost, and the purchases the backend sees stay within the documented
//! bound: in any `n` consecutive ticks at most `(n + 2) × batch` (docs/failures.md): one tick
//! of lag for users who buy the tick after their admission, and one extra batch for an advance
//! that was sent before a stall and ran when Redis resumed. (The replicas' paced slices are
//! disjoint, so together they admit at most a batch in any tick.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::load::{
    self, degraded_between, epoch_ms, max_per_window, purchase_path, recovery_ms, Budget, Event,
    Load, LoadConfig, Op,
};
use common::*;

const TICK_MS: u64 = 500;
const BATCH: u64 = 5;
const REPLICAS: u64 = 2;

struct Sale {
    redis: RedisServer,
    up: Upstream,
    gws: Vec<GatewayProc>,
}

fn config(redis: &RedisServer, up: &Upstream) -> ConfigFile {
    let mut cfg = test_config(up.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    cfg.queue.tick_ms = TICK_MS;
    cfg.queue.batch_size = BATCH;
    // Shorter than the longest outages below: users cannot heartbeat while Redis is down, and
    // must not be evicted for it once it is back.
    cfg.queue.heartbeat_timeout_s = 5;
    cfg.store.startup_wait_ms = 2000;
    cfg
}

fn sale(redis: RedisServer) -> Sale {
    let up = Upstream::start();
    let gws = (0..REPLICAS)
        .map(|_| GatewayProc::start(config(&redis, &up)))
        .collect::<Vec<_>>();
    // Both replicas know they are two before anything fails.
    for gw in &gws {
        assert!(
            wait_until(Duration::from_secs(5), || gw
                .metrics()
                .contains(&format!("virtual_queue_replicas {REPLICAS}"))),
            "{}",
            gw.log()
        );
    }
    wait_for_seats(&redis);
    Sale { redis, up, gws }
}

/// Waits until every replica holds its seat in the replica roster (a slice of `1 /
/// REPLICAS` of the batch): a replica asks for the seat its previous registration was told, and
/// the roster gives no more than the others leave, so the slices settle over the first ticks.
fn wait_for_seats(redis: &RedisServer) {
    let settled = || {
        let members = redis
            .cmd(&["ZRANGE", "queue:instances", "0", "-1"])
            .as_vec();
        members.len() == REPLICAS as usize
            && members.iter().all(|m| {
                let width = m
                    .as_str()
                    .and_then(|m| {
                        let (a, b) = m.split('|').nth(1)?.split_once(':')?;
                        Some(b.parse::<u64>().ok()? - a.parse::<u64>().ok()?)
                    })
                    .unwrap_or(0);
                width >= 1_000_000 / REPLICAS - 1
            })
    };
    assert!(
        wait_until(Duration::from_secs(10), settled),
        "{:?}",
        redis.cmd(&["ZRANGE", "queue:instances", "0", "-1"])
    );
}

impl Sale {
    fn load(&self) -> Load {
        Load::start(LoadConfig::new(self.gws.iter().map(|g| g.listen).collect()))
    }

    fn purchases_ms(&self) -> Vec<u64> {
        self.up
            .requests()
            .iter()
            .filter(|r| r.target == purchase_path(42))
            .map(|r| r.at_ms)
            .collect()
    }
}

/// Runs `load` for `ms` milliseconds of wall time.
fn run_for(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// How many ticks, at most, the load generator bought after an admission (see
/// `load::purchase_lag_ticks`).
fn purchase_lag_ticks(events: &[Event]) -> u64 {
    load::purchase_lag_ticks(events, TICK_MS)
}

/// The invariants every fault must keep (see `load::assert_kept`).
fn assert_kept(sale: &Sale, events: &[Event], what: &str, lag_ticks: u64) {
    let budget = Budget {
        tick_ms: TICK_MS,
        batch: BATCH,
    };
    let purchases = sale.purchases_ms();
    let kept =
        std::panic::catch_unwind(|| load::assert_kept(events, &purchases, budget, what, lag_ticks));
    if let Err(panic) = kept {
        // What the replicas said about the refusals, beside the failed invariant.
        for gw in &sale.gws {
            for line in gw.log().lines().filter(|l| l.contains("refused")) {
                eprintln!("{line}");
            }
        }
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn redis_pauses_under_load_end_within_a_second_and_hold_the_budget() {
    let _serial = serial();
    let s = sale(RedisServer::start());
    let load = s.load();
    run_for(1500);
    let mut pauses = Vec::new();
    for pause_ms in [50u64, 200, 1000, 10_000] {
        let from = epoch_ms();
        s.redis.pause();
        run_for(pause_ms);
        s.redis.resume();
        let back = epoch_ms();
        run_for(2000);
        pauses.push((pause_ms, from, back, epoch_ms()));
    }
    let events = load.stop();
    for (pause_ms, from, back, until) in &pauses {
        let rec = recovery_ms(&events, *back, *until);
        let degraded = degraded_between(&events, *from, back + 2000);
        let direct = events
            .iter()
            .filter(|e| e.direct && e.start_ms >= *from && e.start_ms < back + 2000)
            .count();
        eprintln!(
            "pause {pause_ms} ms: degraded answers {degraded}, direct admissions {direct}, degraded mode ended {rec} ms after Redis resumed"
        );
        assert!(
            rec <= 1000,
            "pause {pause_ms} ms: still degraded {rec} ms after resume"
        );
        if *pause_ms >= 1000 {
            assert!(degraded > 0, "pause {pause_ms} ms: never degraded?");
        }
    }
    // During the 10 s pause the replicas let through at most the batch per tick together (their
    // slices are disjoint).
    let (_, from, back, _) = pauses[3];
    let direct: Vec<u64> = events
        .iter()
        .filter(|e| e.direct && e.op != Op::DriveBy && e.start_ms >= from && e.start_ms < back)
        .map(|e| e.end_ms)
        .collect();
    let per_tick = max_per_window(&direct, TICK_MS, 4);
    eprintln!(
        "10 s pause: {} direct admissions to the sale, max per 1/2/3/4 ticks {per_tick:?}",
        direct.len()
    );
    assert!(!direct.is_empty(), "nobody admitted during a 10 s outage");
    for (i, max) in per_tick.iter().enumerate() {
        let n = i as u64 + 1;
        // Answer times straddle tick edges by a request's latency: one tick of slack.
        assert!(*max as u64 <= (n + 1) * BATCH, "{per_tick:?}");
    }
    assert_kept(&s, &events, "pauses", 0);
}

#[test]
fn redis_killed_and_restarted_under_load() {
    let _serial = serial();
    let mut s = sale(RedisServer::start_persistent());
    let load = s.load();
    run_for(1500);
    s.redis.kill();
    run_for(3000);
    s.redis.restart();
    let back = epoch_ms();
    run_for(2500);
    let events = load.stop();
    // With `appendfsync always` a disk hiccup can stall Redis for a moment later on: that is a
    // new (short) episode. What counts here is when each replica's outage episode ended: its
    // first answer from the store after the restart.
    let rec = (0..REPLICAS as usize)
        .map(|g| {
            events
                .iter()
                .filter(|e| e.gateway == g && e.start_ms >= back && e.status == 200)
                .filter(|e| matches!(e.op, Op::Enter | Op::Poll) && !e.degraded)
                .map(|e| e.end_ms.saturating_sub(back))
                .min()
                .unwrap_or(u64::MAX)
        })
        .max()
        .unwrap();
    let after: Vec<&Event> = events.iter().filter(|e| e.start_ms >= back + rec).collect();
    let later = after.iter().filter(|e| e.degraded).count();
    eprintln!(
        "killed 3 s: every replica answered from Redis again {rec} ms after it restarted; {later} of {} later answers degraded",
        after.len()
    );
    assert!(
        rec <= 1000,
        "still degraded {rec} ms after restart (restarted at {back})\n{}\n{}",
        s.gws[0].log(),
        s.gws[1].log()
    );
    assert!(
        later * 20 <= after.len(),
        "{later} of {} degraded after recovery",
        after.len()
    );
    assert!(degraded_between(&events, 0, back) > 0);
    assert_kept(&s, &events, "kill/restart", 0);
}

#[test]
fn client_kill_under_load() {
    let _serial = serial();
    let s = sale(RedisServer::start());
    let load = s.load();
    run_for(1000);
    let mut kills = Vec::new();
    for _ in 0..3 {
        let k = epoch_ms();
        s.redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
        run_for(1000);
        kills.push((k, epoch_ms()));
    }
    let events = load.stop();
    for (k, until) in &kills {
        let mut hist = [0usize; 10];
        for e in events
            .iter()
            .filter(|e| e.degraded && e.start_ms >= *k && e.start_ms < k + 1000)
        {
            hist[((e.start_ms - k) / 100) as usize] += 1;
        }
        eprintln!("degraded answers per 100 ms after CLIENT KILL: {hist:?}");
        let rec = recovery_ms(&events, *k, *until);
        eprintln!("CLIENT KILL: degraded answers until {rec} ms after the kill");
        assert!(rec <= 1000, "still degraded {rec} ms after CLIENT KILL");
    }
    assert_kept(&s, &events, "client kill", 0);
}

#[test]
fn out_of_memory_under_load_refuses_new_users_and_keeps_the_queue_moving() {
    let _serial = serial();
    let s = sale(RedisServer::start());
    let load = s.load();
    run_for(1500);
    let used = s.redis.cmd(&["INFO", "memory"]).as_str().unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A little room left: the drive-by enters fill it within a second or so.
    s.redis
        .cmd(&["CONFIG", "SET", "maxmemory", &(used + 100_000).to_string()]);
    assert!(
        wait_until(Duration::from_secs(10), || s.gws[0].metrics().contains(
            "virtual_queue_store_refused_total{op=\"enter\",reason=\"oom\"}"
        )),
        "enters never filled Redis"
    );
    let full_from = epoch_ms();
    let purchases_before = s.purchases_ms().len();
    run_for(3000);
    let full_to = epoch_ms();
    s.redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    run_for(1500);
    let events = load.stop();
    let during: Vec<&Event> = events
        .iter()
        .filter(|e| e.start_ms >= full_from + 100 && e.start_ms < full_to)
        .collect();
    let new_refused = during
        .iter()
        .filter(|e| matches!(e.op, Op::Enter | Op::DriveBy) && e.status == 429)
        .count();
    let degraded = during.iter().filter(|e| e.degraded).count();
    let polls_ok = during
        .iter()
        .filter(|e| e.op == Op::Poll && e.status == 200)
        .count();
    let bought = s
        .purchases_ms()
        .iter()
        .filter(|t| **t >= full_from && **t < full_to)
        .count();
    eprintln!(
        "Redis full for 3 s: {new_refused} new enters refused (429), {polls_ok} polls answered, {bought} purchases, {degraded} degraded answers"
    );
    assert!(new_refused > 0, "Redis never filled up?");
    assert_eq!(degraded, 0, "out of memory was treated as an outage");
    assert!(polls_ok > 0);
    assert!(bought > 0, "admissions stopped while Redis was full");
    assert!(s.purchases_ms().len() > purchases_before);
    let m = s.gws[0].metrics();
    assert!(
        m.contains("virtual_queue_store_refused_total{op=\"enter\",reason=\"oom\"}"),
        "{m}"
    );
    // 429 is not a 5xx; everything else as for every fault.
    assert_kept(&s, &events, "out of memory", 0);
}

/// Connections that ask for stats as fast as they are answered. Eight bring over a thousand
/// answers a second, against one store call a second per replica. More only starve the load
/// generator of CPU (with 24 and 48, on a slow day here, its buyers lagged 9 ticks and failed the
/// lag check below), which measures the scheduler rather than the stats cache.
const FLOODERS: usize = 8;

#[test]
fn stats_flood_leaves_enter_and_poll_alone() {
    let _serial = serial();
    let s = sale(RedisServer::start());
    // A busy sale's full wait-sample list: sorting it was the cost of every stats call.
    let key = "queue:{LIMITED_DROP:42}:waits";
    let samples: Vec<String> = (0..1024).map(|i| (1000 + i * 37).to_string()).collect();
    let mut args = vec!["RPUSH", key];
    args.extend(samples.iter().map(String::as_str));
    s.redis.cmd(&args);
    let load = s.load();
    run_for(500);
    let stats_calls = || -> u64 {
        s.gws
            .iter()
            .map(|g| {
                metric(
                    &g.metrics(),
                    "virtual_queue_store_calls_total{op=\"stats\"}",
                )
            })
            .sum()
    };
    let calls_before = stats_calls();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood_from = epoch_ms();
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|i| {
            let addr = s.gws[i % s.gws.len()].listen;
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match c.get("/virtual-queues/limited-drop/42/stats", &[]) {
                        Ok(r) => {
                            assert_eq!(r.status, 200);
                            n += 1;
                        }
                        Err(_) => c = Client::connect(addr),
                    }
                }
                n
            })
        })
        .collect();
    run_for(4000);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stats_answers: u64 = flooders.into_iter().map(|h| h.join().unwrap()).sum();
    let flood_to = epoch_ms();
    // The calls made while the flood ran (counted before the load stops).
    let store_calls = stats_calls() - calls_before;
    run_for(500);
    let events = load.stop();
    let degraded = degraded_between(&events, flood_from, flood_to);
    let secs = (flood_to - flood_from).div_ceil(1000);
    eprintln!(
        "stats flood ({FLOODERS} connections, {secs} s): {stats_answers} answers, {store_calls} store calls, {degraded} degraded enter/poll answers"
    );
    assert!(stats_answers > 1000, "the flood was not a flood");
    assert_eq!(degraded, 0, "a stats flood degraded the queue");
    // While the flood runs: one store call per second per replica (the per-replica cache), as
    // many again for the ETAs of the load's enter and poll answers (their own cache of the same
    // figures), whatever the flood; one more of each for the seconds the window cuts.
    assert!(
        store_calls <= 2 * REPLICAS * (secs + 1),
        "{store_calls} store calls for {stats_answers} stats answers"
    );
    // The flooding threads share the two cores with the load generator, whose users then fetch
    // their tokens some ticks late and buy in bunches: the admissions stay bounded, the
    // purchases per window carry that lag, measured rather than guessed (a fixed guess failed
    // on a slower machine). Past 8 ticks the check would say little: fail instead.
    let lag = purchase_lag_ticks(&events);
    let reaction = load::reaction_lag_ticks(&events, TICK_MS);
    eprintln!("stats flood: buyers bought up to {lag} ticks after their last WAITING answer");
    assert!(reaction <= 8, "the load generator lagged {reaction} ticks");
    assert_kept(&s, &events, "stats flood", lag);
}

#[test]
fn replica_restarted_under_load_never_answers_before_its_store() {
    let _serial = serial();
    let mut s = sale(RedisServer::start());
    let load = s.load();
    run_for(1500);
    // A rolling deploy: the replica stops (SIGTERM, graceful) and a new one takes its port.
    let cfg = s.gws[0].config.clone();
    s.gws[0].signal("TERM");
    assert!(s.gws[0].wait_exit(Duration::from_secs(10)).is_some());
    let restarted_at = epoch_ms();
    let fresh = GatewayProc::spawn(cfg);
    assert!(wait_until(Duration::from_secs(10), || {
        fresh.client().get("/healthz", &[]).is_ok()
    }));
    s.gws[0] = fresh;
    run_for(2000);
    let events = load.stop();
    let after: Vec<&Event> = events
        .iter()
        .filter(|e| e.gateway == 0 && e.start_ms >= restarted_at && e.status != 0)
        .collect();
    let degraded = after.iter().filter(|e| e.degraded).count();
    eprintln!(
        "replica restarted: {} answers from the new process, {degraded} degraded",
        after.len()
    );
    assert!(!after.is_empty());
    assert_eq!(
        degraded, 0,
        "the new replica answered before its store was ready"
    );
    // Connections to the stopped replica fail while it restarts (nginx routes around that);
    // everything that was answered keeps the invariants.
    let answered: Vec<Event> = events.into_iter().filter(|e| e.status != 0).collect();
    assert_kept(&s, &answered, "replica restart", 0);
}

#[test]
fn a_replica_starting_during_an_outage_waits_then_holds_everyone() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    redis.pause();
    let mut cfg = config(&redis, &up);
    cfg.store.startup_wait_ms = 800;
    let started = Instant::now();
    let gw = GatewayProc::spawn(cfg);
    // The public port stays closed during the start-up wait.
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        std::net::TcpStream::connect(gw.listen).is_err(),
        "listening before the store was tried"
    );
    assert!(wait_until(Duration::from_secs(5), || {
        std::net::TcpStream::connect(gw.listen).is_ok()
    }));
    let opened = started.elapsed();
    eprintln!("started with Redis paused: public port opened after {opened:?} (wait 800 ms)");
    assert!(opened >= Duration::from_millis(800));
    let r = gw
        .client()
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("X-User-Id", "7")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["degraded"], true);
    // It never registered, so no pump holds a share back for it: it lets nobody through.
    assert_eq!(r.json()["status"], "WAITING");
    redis.resume();
}

#[test]
fn a_replica_that_stops_registering_lowers_the_pump_batch_by_its_share() {
    let _serial = serial();
    let s = sale(RedisServer::start());
    // Replica 1 stops (as if cut off from Redis, it may be pacing its share on its own).
    s.gws[1].signal("STOP");
    let load = Load::start(LoadConfig::new(vec![s.gws[0].listen]));
    // Wait until replica 0's registry drops it from the live count.
    assert!(wait_until(Duration::from_secs(10), || s.gws[0]
        .metrics()
        .contains("virtual_queue_replicas 1")));
    let before = metric(
        &s.gws[0].metrics(),
        "virtual_queue_admitted_total{target=\"LIMITED_DROP:42\"}",
    );
    let from = epoch_ms();
    run_for(3000);
    let after = metric(
        &s.gws[0].metrics(),
        "virtual_queue_admitted_total{target=\"LIMITED_DROP:42\"}",
    );
    let ticks = (epoch_ms() - from).div_ceil(TICK_MS);
    let _ = load.stop();
    s.gws[1].signal("CONT");
    let admitted = after - before;
    // Replica 1's half of the batch admits 2 or 3 users a tick (2.5 on average).
    let lowered = BATCH - BATCH / REPLICAS;
    eprintln!("one replica silent: {admitted} admitted in {ticks} ticks (batch {BATCH} lowered to {lowered})");
    assert!(admitted > 0, "admissions stopped");
    assert!(
        admitted <= lowered * (ticks + 1),
        "{admitted} admitted in {ticks} ticks"
    );
}

#[test]
fn a_replica_cut_off_from_redis_paces_only_while_the_others_reserve_its_share() {
    let _serial = serial();
    let redis = RedisServer::start();
    let relay = common::relay::Relay::start(format!("127.0.0.1:{}", redis.port).parse().unwrap());
    let up = Upstream::start();
    // Replica 1 reaches Redis through the relay. Tick 500 ms: the live window is 2 s, so a
    // replica cut off paces from 4 × 150 ms + 2 s + 500 ms after its last registration until two
    // ticks before `paced_for_s`; the other pump lowers its batch by the cut-off replica's share
    // from 2 s after that registration until `paced_for_s` after it.
    let mut cfgs = vec![config(&redis, &up), config(&redis, &up)];
    cfgs[1].store.redis_url = relay.url();
    for c in &mut cfgs {
        c.fail_open.paced_for_s = Some(6);
    }
    let gws: Vec<GatewayProc> = cfgs.into_iter().map(GatewayProc::start).collect();
    for gw in &gws {
        assert!(wait_until(Duration::from_secs(5), || gw
            .metrics()
            .contains(&format!("virtual_queue_replicas {REPLICAS}"))));
    }
    wait_for_seats(&redis);
    let s = Sale { redis, up, gws };
    let load = s.load();
    run_for(1500);
    let admitted = || {
        metric(
            &s.gws[0].metrics(),
            "virtual_queue_admitted_total{target=\"LIMITED_DROP:42\"}",
        )
    };
    let before = admitted();
    let cut = epoch_ms();
    relay.cut();
    run_for(1000);
    // Replica 1's last registration (Redis' clock, this machine's): the older of the two
    // members now that replica 0 registers every tick and replica 1 cannot.
    let scores = s
        .redis
        .cmd(&["ZRANGE", "queue:instances", "0", "-1", "WITHSCORES"])
        .as_vec();
    let last_registration = scores
        .iter()
        .skip(1)
        .step_by(2)
        .map(|v| v.as_str().unwrap().parse::<u64>().unwrap())
        .min()
        .unwrap();
    run_for(7000);
    let healed = epoch_ms();
    let pumped = admitted() - before;
    relay.heal();
    run_for(3000);
    let events = load.stop();

    let direct: Vec<&Event> = events
        .iter()
        .filter(|e| e.gateway == 1 && e.direct && e.op != Op::DriveBy)
        .filter(|e| e.start_ms >= cut && e.start_ms < healed)
        .collect();
    // Decided no earlier than its answer's end and no later than its request's start.
    let first = direct.iter().map(|e| e.end_ms).min();
    let last = direct.iter().map(|e| e.start_ms).max();
    let held = events
        .iter()
        .filter(|e| e.gateway == 1 && e.degraded && !e.direct && e.op != Op::DriveBy)
        .filter(|e| e.start_ms >= last_registration + 5100 && e.start_ms < healed)
        .count();
    let ticks = (healed - cut).div_ceil(TICK_MS);
    let rec = recovery_ms(&events, healed, u64::MAX);
    eprintln!(
        "replica 1 cut off for {} ms, its last registration {} ms before the cut: the pump admitted {pumped}, replica 1 let {} through (from {:?} to {:?} ms after that registration), {held} degraded answers after its window; degraded mode ended {rec} ms after the heal",
        healed - cut,
        cut as i64 - last_registration as i64,
        direct.len(),
        first.map(|t| t as i64 - last_registration as i64),
        last.map(|t| t as i64 - last_registration as i64),
    );
    // Not while the other pump may still count it live (the live window, 2 s, and a tick after
    // that registration landed; it waits 4 × 150 ms more for a registration that may still land),
    // and not once that pump forgets it (two ticks before `paced_for_s`).
    let (first, last) = (first.expect("replica 1 never paced"), last.unwrap_or(0));
    assert!(
        first >= last_registration + 2500,
        "paced {} ms after its last registration",
        first as i64 - last_registration as i64
    );
    assert!(
        last <= last_registration + 5000,
        "still pacing {} ms after its last registration",
        last as i64 - last_registration as i64
    );
    assert!(held > 0, "no degraded answers after the pacing window");
    // Together, at most the batch per tick.
    let together = pumped + direct.len() as u64;
    assert!(
        together <= (ticks + 1) * BATCH,
        "{together} admitted in {ticks} ticks (pump {pumped}, paced {})",
        direct.len()
    );
    assert!(rec <= 2000, "still degraded {rec} ms after the heal");
    assert_kept(&s, &events, "one replica cut off", 0);
}
