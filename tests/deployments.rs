//! The same gateway binary on the Redis deployments teams run, under load: a 3-master Redis
//! Cluster (targets spread over the masters; a script cache flushed, a slot migrated with
//! `redis-cli --cluster reshard`, a master killed and restarted while users poll) and a primary
//! with a replica under three Sentinels (the primary killed mid-sale). Real processes on free
//! ports; the same invariants as `tests/faults.rs`: no 5xx, nobody who held a place lost,
//! purchases at the backend within the budget, and every degraded mode ends by itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::load::{
    self, degraded_between, epoch_ms, purchase_path, queue_path, recovery_ms, Budget, Event, Load,
    LoadConfig,
};
use common::*;

const TICK_MS: u64 = 500;
const BATCH: u64 = 5;
const REPLICAS: u64 = 2;

fn gateways(url: &str, up: &Upstream) -> Vec<GatewayProc> {
    let gws: Vec<GatewayProc> = (0..REPLICAS)
        .map(|_| {
            let mut cfg = test_config(up.addr);
            cfg.store.backend = StoreKind::Redis;
            cfg.store.redis_url = url.to_string();
            cfg.queue.tick_ms = TICK_MS;
            cfg.queue.batch_size = BATCH;
            cfg.queue.heartbeat_timeout_s = 10;
            cfg.store.startup_wait_ms = 5000;
            cfg.store.command_timeout_ms = 500;
            GatewayProc::start(cfg)
        })
        .collect();
    for gw in &gws {
        assert!(
            wait_until(Duration::from_secs(10), || gw
                .metrics()
                .contains(&format!("virtual_queue_replicas {REPLICAS}"))),
            "{}",
            gw.log()
        );
    }
    gws
}

fn budget() -> Budget {
    Budget {
        tick_ms: TICK_MS,
        batch: BATCH,
    }
}

fn purchases_ms(up: &Upstream, sale: u64) -> Vec<u64> {
    let path = purchase_path(sale);
    up.requests()
        .iter()
        .filter(|r| r.target == path)
        .map(|r| r.at_ms)
        .collect()
}

fn run_for(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// A limited-drop id whose hash slot is the lowest slot a node serves: `redis-cli --cluster
/// reshard` moves a node's lowest slots first, so moving one slot moves exactly this sale.
fn sale_at_first_slot(cluster: &RedisCluster, node: usize) -> u64 {
    let first = cluster.first_slot(node) as u16;
    (1..5_000_000u64)
        .find(|id| fred::util::redis_keyslot(format!("{{LIMITED_DROP:{id}}}").as_bytes()) == first)
        .expect("an id in that slot")
}

fn redis_cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How many instances the roster on `redis` saw with their presence subscription on this very
/// server process (its run id: entries replicated from a former primary do not count).
fn presence_seen(redis: &RedisServer) -> usize {
    let info = redis.cmd(&["INFO", "server"]).as_str().unwrap_or_default();
    let run_id = info
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    redis
        .cmd(&["HVALS", "{queue:instances}:presence"])
        .as_vec()
        .iter()
        .filter(|v| {
            v.as_str()
                .is_some_and(|s| s.starts_with(&format!("{run_id}|")))
        })
        .count()
}

/// Degraded answers (and 5xx, failed connections) among the events that started in `[from, to)`.
fn trouble(events: &[Event], from: u64, to: u64) -> (usize, usize) {
    let in_window = |e: &&Event| e.start_ms >= from && e.start_ms < to;
    let degraded = events
        .iter()
        .filter(in_window)
        .filter(|e| e.degraded)
        .count();
    let bad = events
        .iter()
        .filter(in_window)
        .filter(|e| e.status >= 500 || e.status == 0)
        .count();
    (degraded, bad)
}

#[test]
fn cluster_targets_spread_over_every_master_and_two_gateways_keep_the_bound() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let up = Upstream::start();
    let gws = gateways(&cluster.url(), &up);
    // Each gateway's presence subscription (sharded) sits on the node of the roster's slot,
    // where roster.lua sees it.
    let registry = &cluster.nodes[cluster.owner(cluster.keyslot("queue:instances"))];
    assert!(
        wait_until(Duration::from_secs(10), || presence_seen(registry) == 2),
        "{:?}",
        registry.cmd(&["HGETALL", "{queue:instances}:presence"])
    );
    // 50 targets, 8 users each, entered through both gateways.
    let targets: Vec<u64> = (1..=50).collect();
    let mut c = [gws[0].client(), gws[1].client()];
    for (i, t) in targets.iter().enumerate() {
        for u in 1..=8u64 {
            let r = c[(i + u as usize) % 2]
                .request(
                    "POST",
                    &format!("{}/entries", queue_path(*t)),
                    &[("X-User-Id", &u.to_string())],
                    b"",
                )
                .unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }
    }
    let mut spread: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for t in &targets {
        let slot = cluster.keyslot(&format!("queue:{{LIMITED_DROP:{t}}}:waiting"));
        spread.entry(cluster.owner(slot)).or_default().push(*t);
    }
    eprintln!(
        "targets per master: {:?}",
        spread
            .iter()
            .map(|(n, ts)| (*n, ts.len()))
            .collect::<Vec<_>>()
    );
    assert_eq!(spread.len(), 3, "every master holds targets: {spread:?}");
    for (node, ts) in &spread {
        assert!(ts.len() >= 5, "node {node}: {ts:?}");
        // Each target's keys live on its master only.
        let keys = cluster.nodes[*node]
            .cmd(&["KEYS", "queue:{LIMITED_DROP:*}:waiting"])
            .as_vec()
            .len();
        assert_eq!(keys, ts.len(), "node {node}");
    }
    // Everybody keeps polling; the pumps of both gateways admit all of them, on every master.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut admitted = std::collections::BTreeSet::new();
    while admitted.len() < targets.len() * 8 && Instant::now() < deadline {
        for (i, t) in targets.iter().enumerate() {
            for u in 1..=8u64 {
                if admitted.contains(&(*t, u)) {
                    continue;
                }
                let r = c[i % 2]
                    .get(
                        &format!("{}/entries/me", queue_path(*t)),
                        &[("X-User-Id", &u.to_string())],
                    )
                    .unwrap();
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                let v = r.json();
                assert_ne!(v["degraded"], true, "degraded on a healthy cluster");
                if v["status"] == "ADMITTED" {
                    admitted.insert((*t, u));
                }
            }
        }
        run_for(100);
    }
    assert_eq!(admitted.len(), targets.len() * 8, "all admitted in time");
    // The bound per target: every advance at most a batch, never two within 0.95 tick (each
    // target's `advances` list, read on its master).
    for (node, ts) in &spread {
        for t in ts {
            let list = cluster.nodes[*node]
                .cmd(&[
                    "LRANGE",
                    &format!("queue:{{LIMITED_DROP:{t}}}:advances"),
                    "0",
                    "-1",
                ])
                .as_vec();
            let adv = parse_advances(&list);
            assert!(!adv.is_empty(), "target {t} never advanced");
            let mut prev = 0;
            for (_, mark) in &adv {
                assert!(*mark >= prev && mark - prev <= BATCH, "target {t}: {adv:?}");
                prev = *mark;
            }
            for pair in adv.windows(2) {
                assert!(
                    (pair[1].0 - pair[0].0) * 100 >= 95 * TICK_MS,
                    "target {t}: {adv:?}"
                );
            }
        }
    }
}

#[test]
fn cluster_sale_under_load_rides_through_a_script_flush_a_slot_migration_and_a_master_restart() {
    let _serial = serial();
    let mut cluster = RedisCluster::start_persistent();
    let src = 1;
    let dst = 2;
    let sale = sale_at_first_slot(&cluster, src);
    let slot = cluster.first_slot(src);
    let up = Upstream::start();
    let gws = gateways(&cluster.url(), &up);
    let mut cfg = LoadConfig::new(gws.iter().map(|g| g.listen).collect());
    cfg.sale = sale;
    cfg.drive_by = sale + 1;
    let load = Load::start(cfg);
    run_for(1500);

    // 1. The sale's node loses its script cache: calls reload there (EVAL), nothing degrades.
    let flush_at = epoch_ms();
    assert_eq!(
        cluster.nodes[src].cmd(&["SCRIPT", "FLUSH"]),
        Resp::Str("OK".into())
    );
    run_for(1500);
    let flush_end = epoch_ms();

    // 2. The sale's slot moves to another master while its users poll.
    let migrate_at = epoch_ms();
    let started = Instant::now();
    redis_cli(&[
        "--cluster",
        "reshard",
        &format!("127.0.0.1:{}", cluster.nodes[src].port),
        "--cluster-from",
        &cluster.node_id(src),
        "--cluster-to",
        &cluster.node_id(dst),
        "--cluster-slots",
        "1",
        "--cluster-yes",
    ]);
    let migrate_ms = started.elapsed().as_millis();
    assert_eq!(cluster.owner(slot), dst, "the sale's slot moved");
    run_for(1500);
    let migrate_end = epoch_ms();

    // 3. The master that now holds the sale is killed, then restarted from its append-only file.
    let kill_at = epoch_ms();
    cluster.nodes[dst].kill();
    run_for(1500);
    cluster.nodes[dst].restart();
    let back = epoch_ms();
    cluster.wait_ok();
    let ok_after = epoch_ms() - back;
    run_for(3000);
    let end = epoch_ms();
    let events = load.stop();

    let (flush_degraded, flush_bad) = trouble(&events, flush_at, flush_end);
    // Requests still in flight when the master was killed belong to the kill.
    let before_kill: Vec<Event> = events
        .iter()
        .filter(|e| e.end_ms < kill_at)
        .cloned()
        .collect();
    let (migrate_degraded, migrate_bad) = trouble(&before_kill, migrate_at, migrate_end);
    let kill_degraded = degraded_between(&events, kill_at, back);
    let rec = recovery_ms(&events, back, end);
    eprintln!(
        "script flush: {flush_degraded} degraded; slot migration ({migrate_ms} ms): {migrate_degraded} degraded; master down 1.5 s: {kill_degraded} degraded answers, cluster ok {ok_after} ms after the restart, degraded mode ended {rec} ms after it"
    );
    assert_eq!((flush_degraded, flush_bad), (0, 0), "script flush");
    let degraded_events: Vec<String> = events
        .iter()
        .filter(|e| e.degraded && e.start_ms >= migrate_at && e.end_ms < kill_at)
        .map(|e| {
            format!(
                "{:?} +{} ms took {} ms",
                e.op,
                e.start_ms - migrate_at,
                e.end_ms - e.start_ms
            )
        })
        .collect();
    eprintln!("degraded during the migration: {degraded_events:?}");
    let errors: Vec<String> = gws
        .iter()
        .flat_map(|g| {
            g.log()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .take(40)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        (migrate_degraded, migrate_bad),
        (0, 0),
        "slot migration; gateway errors: {errors:#?}"
    );
    assert!(
        kill_degraded > 0,
        "the sale's master was down: never degraded?"
    );
    assert!(rec <= 3000, "still degraded {rec} ms after the restart");
    let lag = load::purchase_lag_ticks(&events, TICK_MS);
    let reaction = load::reaction_lag_ticks(&events, TICK_MS);
    assert!(reaction <= 8, "load generator lagged {reaction} ticks");
    load::assert_kept(
        &events,
        &purchases_ms(&up, sale),
        budget(),
        "cluster faults",
        lag,
    );
}

#[test]
fn sentinel_primary_killed_mid_sale_the_gateways_follow_the_new_primary() {
    sentinel_switch(Switch::Kill);
}

/// `SENTINEL FAILOVER`: the old primary lives on as a replica of the new one (writes to it are
/// refused with `READONLY`); the gateways must move by themselves.
#[test]
fn sentinel_manual_failover_mid_sale_the_gateways_leave_the_demoted_primary() {
    sentinel_switch(Switch::Failover);
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Switch {
    Kill,
    Failover,
}

fn sentinel_switch(switch: Switch) {
    let _serial = serial();
    let mut set = SentinelSet::start();
    let old_primary = set.primary.port;
    let up = Upstream::start();
    let gws = gateways(&set.url(), &up);
    let load = Load::start(LoadConfig::new(gws.iter().map(|g| g.listen).collect()));
    run_for(2000);

    let kill_at = epoch_ms();
    match switch {
        Switch::Kill => set.primary.kill(),
        Switch::Failover => {
            let conn = common::redis::RedisConn::connect(set.sentinels[0].port).unwrap();
            let r = conn.cmd(&["SENTINEL", "FAILOVER", "vq"]).unwrap();
            assert_eq!(r, Resp::Str("OK".into()));
        }
    }
    let promoted = wait_until(Duration::from_secs(15), || {
        set.primary_port().is_some_and(|p| p != old_primary)
    });
    assert!(promoted, "the sentinels did not promote the replica");
    let promoted_ms = epoch_ms() - kill_at;
    assert_eq!(set.primary_port(), Some(set.replica.port));
    // The presence subscriptions follow to the new primary (the roster there sees them again,
    // so a replica that crashes now is still told from a cut-off one).
    set.replica.forget_connection();
    let followed = wait_until(Duration::from_secs(20), || {
        presence_seen(&set.replica) == gws.len()
    });
    assert!(
        followed,
        "{:?}",
        set.replica.cmd(&["HGETALL", "{queue:instances}:presence"])
    );
    // Serving from the new primary: an enter through each gateway, answered by the store (not
    // degraded), is found on the promoted replica. (Sentinel closed our old connection to it.)
    set.replica.forget_connection();
    let mut probe_user = 777_000_000u64;
    let served = wait_until(Duration::from_secs(10), || {
        gws.iter().all(|g| {
            probe_user += 1;
            let user = probe_user.to_string();
            let r = g
                .client()
                .request(
                    "POST",
                    &format!("{}/entries", queue_path(42)),
                    &[("X-User-Id", &user)],
                    b"",
                )
                .unwrap();
            r.status == 200
                && r.json()["degraded"] != true
                && matches!(
                    set.replica
                        .cmd(&["ZSCORE", "queue:{LIMITED_DROP:42}:waiting", &user]),
                    Resp::Str(_)
                )
        })
    });
    assert!(served, "the gateways did not move to the new primary");
    let served_ms = epoch_ms() - kill_at;
    run_for(3000);
    let end = epoch_ms();
    let events = load.stop();

    let degraded = degraded_between(&events, kill_at, end);
    let back = kill_at + promoted_ms;
    let rec = recovery_ms(&events, back, end);
    let purchases = purchases_ms(&up, 42);
    let after = purchases
        .iter()
        .filter(|t| **t > kill_at + served_ms)
        .count();
    let direct = events
        .iter()
        .filter(|e| e.direct && e.start_ms >= kill_at && e.start_ms < back)
        .count();
    eprintln!(
        "sentinel {switch:?}: replica promoted {promoted_ms} ms after the switch began; gateways served from it {served_ms} ms after; {degraded} degraded answers, {direct} admitted while degraded; degraded mode ended {rec} ms after the promotion; {after} purchases after it"
    );
    assert!(after > 0, "the sale went on after the failover");
    assert!(rec <= 3000, "still degraded {rec} ms after the promotion");
    // A switch with the old primary alive: writes it accepted between the promotion and the
    // gateways' move (the sentinels are asked every 100 ms) are thrown away when it resyncs as a
    // replica. Those users are told to enter again; nobody is lost before the switch, and with a
    // dead primary nobody at all.
    let lost_before = events
        .iter()
        .filter(|e| e.lost && e.start_ms < kill_at)
        .count();
    let lost_after = events.iter().filter(|e| e.lost).count() - lost_before;
    eprintln!("sentinel {switch:?}: {lost_after} polls found their user gone after the switch");
    assert_eq!(lost_before, 0);
    if switch == Switch::Kill {
        assert_eq!(lost_after, 0, "a dead primary loses nothing here");
    }
    assert_kept_but_lost(events, &purchases, &format!("sentinel {switch:?}"));
}

/// `load::assert_kept` for a sale whose lost users were counted (and checked) by the caller.
fn assert_kept_but_lost(events: Vec<Event>, purchases: &[u64], what: &str) {
    let events: Vec<Event> = events
        .into_iter()
        .map(|mut e| {
            e.lost = false;
            e
        })
        .collect();
    let lag = load::purchase_lag_ticks(&events, TICK_MS);
    let reaction = load::reaction_lag_ticks(&events, TICK_MS);
    assert!(
        reaction <= 8,
        "{what}: load generator lagged {reaction} ticks"
    );
    load::assert_kept(&events, purchases, budget(), what, lag);
}

/// Asynchronous replication, shown: the replica is cut off from the primary (stopped, its link
/// killed) for a second of the sale, then the primary dies and Sentinel promotes the replica,
/// which never saw that second. Enters acknowledged in it are gone from Redis, and so are the
/// admission steps of it, but not from the replicas (docs/state.md): the users show their queue
/// tickets and take their places back, the mark and the sequence are set forward to what the
/// replicas saw, and the backend still sees at most the budget.
#[test]
fn sentinel_failover_to_a_stale_replica_loses_the_last_writes_not_the_bound() {
    let _serial = serial();
    let mut set = SentinelSet::start();
    let old_primary = set.primary.port;
    let up = Upstream::start();
    let gws = gateways(&set.url(), &up);
    let load = Load::start(LoadConfig::new(gws.iter().map(|g| g.listen).collect()));
    run_for(2000);

    let key = |k: &str| format!("queue:{{LIMITED_DROP:42}}:{k}");
    let read = |r: &RedisServer, k: &str| r.cmd(&["GET", &key(k)]).as_int();
    set.replica.pause();
    set.primary.cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
    let cut_at = epoch_ms();
    run_for(1000);
    let (seq_before, mark_before) = (
        read(&set.primary, "seq"),
        read(&set.primary, "admitted_count"),
    );
    let kill_at = epoch_ms();
    set.primary.kill();
    set.replica.resume();
    // Read what the replica holds now, while it is still a replica: nobody writes to it until
    // it is promoted, and from then on the gateways' new enters move its counters on.
    let (seq_after, mark_after) = (
        read(&set.replica, "seq"),
        read(&set.replica, "admitted_count"),
    );
    assert!(
        wait_until(Duration::from_secs(20), || set
            .primary_port()
            .is_some_and(|p| p != old_primary)),
        "the sentinels did not promote the replica"
    );
    let promoted_ms = epoch_ms() - kill_at;
    // Sentinel closes every client connection of the instance it promotes.
    set.replica.forget_connection();
    run_for(4000);
    let events = load.stop();

    let lost = events.iter().filter(|e| e.lost).count();
    let lost_before_failover = events
        .iter()
        .filter(|e| e.lost && e.start_ms < kill_at)
        .count();
    let purchases = purchases_ms(&up, 42);
    eprintln!(
        "stale replica promoted {promoted_ms} ms after the kill: seq {seq_before} -> {seq_after}, mark {mark_before} -> {mark_after} ({} seqs and {} admissions of the last {} ms lost); {lost} polls found their user gone (their tickets put the others back); {} purchases",
        seq_before - seq_after,
        mark_before - mark_after,
        kill_at - cut_at,
        purchases.len()
    );
    assert!(seq_after < seq_before, "the replica had missed enters");
    assert!(mark_after <= mark_before);
    assert_eq!(
        lost_before_failover, 0,
        "nobody was lost before the failover"
    );
    // Users who entered in the lost second show their tickets and take their places back.
    assert_eq!(
        lost, 0,
        "users entered in the lost second were told to enter again"
    );
    // The sale goes on: users admitted after the failover buy.
    assert!(purchases.iter().any(|t| *t > kill_at + promoted_ms));
    assert_kept_but_lost(events, &purchases, "stale replica");
}

/// `rediss://`: the gateway talks TLS to Redis and checks its certificate. Trusting the CA
/// (`SSL_CERT_FILE`), the queue works and its keys are in that Redis; a gateway that does not
/// trust it never reaches the store (degraded answers, a certificate error in its log), and
/// nothing falls back to plain text.
#[test]
fn tls_redis_is_verified_and_serves_the_queue() {
    let tls = TlsRedis::start();
    let up = Upstream::start();
    let config = || {
        let mut cfg = test_config(up.addr);
        cfg.store.backend = StoreKind::Redis;
        cfg.store.redis_url = tls.url();
        cfg.store.startup_wait_ms = 2000;
        cfg
    };
    let ca = tls.ca.to_string_lossy().into_owned();
    let trusted = GatewayProc::start_with_env(
        config(),
        &[("SSL_CERT_FILE", &ca), ("VQ_TOKEN_SECRET", TEST_SECRET)],
    );
    let enter = |gw: &GatewayProc, user: &str| {
        let r = gw
            .client()
            .request(
                "POST",
                &format!("{}/entries", queue_path(42)),
                &[("X-User-Id", user)],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, 200);
        r.json()
    };
    for user in ["1", "2", "3"] {
        let v = enter(&trusted, user);
        assert_ne!(v["degraded"], true, "{v}");
        assert_eq!(v["status"], "WAITING");
    }
    assert_eq!(
        tls.redis
            .cmd(&["ZCARD", "queue:{LIMITED_DROP:42}:waiting"])
            .as_int(),
        3,
        "the queue lives in the TLS Redis"
    );
    // Without the CA: the system's roots do not know it.
    let untrusted = GatewayProc::start_with_env(
        config(),
        &[
            ("SSL_CERT_FILE", "/dev/null"),
            ("VQ_TOKEN_SECRET", TEST_SECRET),
        ],
    );
    let v = enter(&untrusted, "4");
    assert_eq!(v["degraded"], true, "{v}");
    assert!(
        untrusted.log().to_lowercase().contains("certificate"),
        "{}",
        untrusted.log()
    );
    assert_eq!(
        tls.redis
            .cmd(&["ZCARD", "queue:{LIMITED_DROP:42}:waiting"])
            .as_int(),
        3
    );
}
