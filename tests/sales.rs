//! Sales as run-time objects: each sale's parameters live in Redis (`queue:{T}:sale`) and the
//! scripts read them, so replicas whose config files differ (a rolling change) apply one budget,
//! one capacity and one heartbeat window to a sale; an operator creates, changes, pauses and
//! deletes sales through the admin API or the CLI, at run time; a Redis that comes back empty
//! gets them written back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "admin-token-of-the-tests-0123456789";
const Q: &str = "/virtual-queues/limited-drop/42";
const SALE: &str = "/sales/limited-drop/42";
const KEY: &str = "queue:{LIMITED_DROP:42}";

fn start(cfg: ConfigFile) -> GatewayProc {
    GatewayProc::start_with_env(
        cfg,
        &[
            ("VQ_TOKEN_SECRET", TEST_SECRET),
            ("VQ_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    )
}

fn redis_config(up: std::net::SocketAddr, redis: &RedisServer) -> ConfigFile {
    let mut cfg = test_config(up);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    cfg
}

fn admin(gw: &GatewayProc, method: &str, path: &str, auth: Option<&str>, body: &str) -> Response {
    let bearer = auth.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("Authorization", b)])
        .unwrap_or_default();
    gw.admin_client()
        .request(method, path, &headers, body.as_bytes())
        .unwrap()
}

fn put_sale(gw: &GatewayProc, body: Value) -> Value {
    let r = admin(gw, "PUT", SALE, Some(ADMIN_TOKEN), &body.to_string());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn enter(c: &mut Client, user: u64) -> Response {
    c.request(
        "POST",
        &format!("{Q}/entries"),
        &[("X-User-Id", &user.to_string())],
        b"",
    )
    .unwrap()
}

/// An enter's status (`None`: the connection failed).
fn enter_status(c: &mut Client, user: u64) -> Option<u16> {
    c.request(
        "POST",
        &format!("{Q}/entries"),
        &[("X-User-Id", &user.to_string())],
        b"",
    )
    .ok()
    .map(|r| r.status)
}

fn poll(c: &mut Client, user: u64) -> std::io::Result<Response> {
    c.get(
        &format!("{Q}/entries/me"),
        &[("X-User-Id", &user.to_string())],
    )
}

/// The admission steps Redis recorded for sale 42: (Redis ms, live users admitted so far),
/// oldest first (the samples are "ms:mark:live", newest first).
fn advances(redis: &RedisServer) -> Vec<(u64, u64)> {
    let list = redis
        .cmd(&["LRANGE", &format!("{KEY}:advances"), "0", "-1"])
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
    v
}

/// Live users admitted by each step.
fn steps(adv: &[(u64, u64)]) -> Vec<(u64, u64)> {
    adv.windows(2).map(|w| (w[1].0, w[1].1 - w[0].1)).collect()
}

/// Three replicas whose files differ in every `[queue]` key serve one sale created with its own
/// parameters. 60 users poll every 400 ms, each through a replica chosen at random per poll;
/// ten users go silent. Nobody who polls is ever answered 404 (with the files' own heartbeat
/// timeouts, the 2 s one would have evicted everyone whose polls landed elsewhere); the silent
/// ones are evicted by the sale's 3 s timeout, not by the files' 60 s; every admission step
/// admits at most the sale's batch of 3, at most one per 0.95 of its 600 ms tick.
#[test]
fn replicas_whose_files_differ_in_every_queue_key_apply_the_sale_s_own_parameters() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let files = [
        // tick, batch, capacity, heartbeat, max evict, max active targets, targets
        (200, 1000, 5, 2, 1, 3, TargetsMode::Any),
        (1000, 1, 100_000, 60, 1000, 1000, TargetsMode::Registered),
        (450, 40, 30, 20, 7, 50, TargetsMode::Any),
    ];
    let gws: Vec<GatewayProc> = files
        .iter()
        .map(|&(tick, batch, cap, hb, evict, active, targets)| {
            let mut cfg = redis_config(up.addr, &redis);
            cfg.queue.tick_ms = tick;
            cfg.queue.batch_size = batch;
            cfg.queue.max_capacity = cap;
            cfg.queue.heartbeat_timeout_s = hb;
            cfg.queue.max_evict_per_tick = evict;
            cfg.queue.max_active_targets = active;
            cfg.queue.targets = targets;
            start(cfg)
        })
        .collect();
    gws[0].wait_flag_known();
    let sale = put_sale(
        &gws[1],
        json!({"batchSize": 3, "tickMs": 600, "maxCapacity": 500, "heartbeatTimeoutS": 3}),
    );
    assert_eq!(
        (
            &sale["batchSize"],
            &sale["tickMs"],
            &sale["heartbeatTimeoutS"]
        ),
        (&json!(3), &json!(600), &json!(3))
    );

    let publics: Vec<_> = gws.iter().map(|g| g.listen).collect();
    // Everyone enters through the replica whose file says capacity 5: the sale's 500 holds.
    let mut c = gws[0].client();
    for user in 1..=60 {
        let r = enter(&mut c, user);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let silent: Vec<u64> = (51..=60).collect();
    // The registered replica reads the sale's registration within a second.
    std::thread::sleep(Duration::from_millis(1500));
    let stop = Arc::new(AtomicBool::new(false));
    // Load: fresh users entering through every replica as fast as they are answered (they
    // never poll; the sale's capacity of 500 turns the rest away with 429).
    let flood: Vec<_> = (0..3)
        .map(|f| {
            let (stop, publics) = (stop.clone(), publics.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(publics[f]);
                let (mut user, mut answered) = (1_000_000 * (f as u64 + 1), 0u64);
                while !stop.load(Ordering::Relaxed) {
                    user += 1;
                    match enter_status(&mut c, user) {
                        Some(200 | 429) => answered += 1,
                        Some(other) => panic!("enter answered {other}"),
                        None => c = Client::connect(publics[f]),
                    }
                }
                answered
            })
        })
        .collect();
    let lost = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let pollers: Vec<_> = (0..5)
        .map(|t| {
            let (stop, lost, admitted, publics) = (
                stop.clone(),
                lost.clone(),
                admitted.clone(),
                publics.clone(),
            );
            std::thread::spawn(move || {
                let mut clients: Vec<Client> =
                    publics.iter().map(|a| Client::connect(*a)).collect();
                let mine: Vec<u64> = (1..=50).filter(|u| u % 5 == t).collect();
                let mut done: HashMap<u64, bool> = HashMap::new();
                let mut i = t as usize;
                while !stop.load(Ordering::Relaxed) {
                    for &user in &mine {
                        if done.contains_key(&user) {
                            continue;
                        }
                        i = i.wrapping_mul(31).wrapping_add(7);
                        let g = i % clients.len();
                        let Ok(r) = poll(&mut clients[g], user) else {
                            clients[g] = Client::connect(publics[g]);
                            continue;
                        };
                        match r.status {
                            200 if r.json()["status"] == "ADMITTED" => {
                                done.insert(user, true);
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                            200 => {
                                // The hint follows the sale's 3 s timeout on every replica.
                                let v = r.json();
                                assert!(v["pollAfterSeconds"].as_u64().unwrap() <= 1, "{v}");
                            }
                            404 => {
                                lost.fetch_add(1, Ordering::Relaxed);
                                done.insert(user, false);
                            }
                            other => panic!("poll answered {other}"),
                        }
                    }
                    std::thread::sleep(Duration::from_millis(400));
                }
            })
        })
        .collect();
    let started = Instant::now();
    // The silent users are gone after the sale's timeout (3 s) and a window (0.75 s) or two
    // (looked up in Redis: a poll would be a heartbeat).
    let evicted = wait_until(Duration::from_secs(9), || {
        silent
            .iter()
            .all(|u| redis.cmd(&["ZSCORE", &format!("{KEY}:waiting"), &u.to_string()]) == Resp::Nil)
    });
    let evicted_after = started.elapsed();
    std::thread::sleep(Duration::from_secs(8).saturating_sub(started.elapsed()));
    stop.store(true, Ordering::Relaxed);
    for p in pollers {
        p.join().unwrap();
    }
    let flooded: u64 = flood.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(flooded > 1_000, "the load was light: {flooded} enters");
    assert_eq!(
        lost.load(Ordering::Relaxed),
        0,
        "users who kept polling were evicted"
    );
    assert!(
        evicted,
        "silent users were not evicted by the sale's 3 s timeout"
    );
    let adv = advances(&redis);
    let st = steps(&adv);
    assert!(st.len() >= 8, "too few admission steps: {adv:?}");
    for (at, n) in &st {
        assert!(
            *n <= 3,
            "a step at {at} admitted {n} > the sale's batch of 3: {adv:?}"
        );
    }
    for w in adv.windows(2) {
        assert!(
            w[1].0 - w[0].0 >= 570,
            "two steps {} ms apart: {adv:?}",
            w[1].0 - w[0].0
        );
    }
    eprintln!(
        "files differing in every [queue] key, {flooded} enters of fresh users meanwhile: 0 of 50 polling users evicted, {} admitted; 10 silent users evicted within {:.1} s; {} steps of at most 3, spaced >= {} ms",
        admitted.load(Ordering::Relaxed),
        evicted_after.as_secs_f64(),
        st.len(),
        adv.windows(2).map(|w| w[1].0 - w[0].0).min().unwrap_or(0)
    );
}

/// The budget changed through the admin API mid-sale takes effect at the next tick whichever
/// replica leads; a paused sale admits nobody while its users keep their places and are told
/// so; resumed, it admits again.
#[test]
fn a_budget_change_and_a_pause_take_effect_at_the_next_tick_on_every_replica() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = (0..3)
        .map(|_| {
            let mut cfg = redis_config(up.addr, &redis);
            cfg.queue.tick_ms = 300;
            start(cfg)
        })
        .collect();
    gws[0].wait_flag_known();
    put_sale(
        &gws[0],
        json!({"batchSize": 2, "tickMs": 300, "heartbeatTimeoutS": 60}),
    );
    let mut c = gws[1].client();
    for user in 1..=400 {
        assert_eq!(enter(&mut c, user).status, 200);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let before = advances(&redis);
    assert!(steps(&before).iter().all(|(_, n)| *n == 2), "{before:?}");

    let changed_ms = redis_ms(&redis);
    put_sale(&gws[2], json!({"batchSize": 7}));
    std::thread::sleep(Duration::from_millis(1500));
    let after = advances(&redis);
    let new_steps: Vec<(u64, u64)> = steps(&after)
        .into_iter()
        .filter(|(at, _)| *at > changed_ms)
        .collect();
    assert!(new_steps.len() >= 3, "{after:?}");
    // The step in flight at the change may still admit the old batch; every later one the new.
    assert!(
        new_steps[1..].iter().all(|(_, n)| *n == 7),
        "steps after the change at {changed_ms}: {new_steps:?}"
    );
    let leaders: std::collections::BTreeSet<String> = gws
        .iter()
        .enumerate()
        .filter(|(_, g)| {
            g.metrics()
                .lines()
                .any(|l| l.starts_with("virtual_queue_admitted_total") && !l.ends_with(" 0"))
        })
        .map(|(i, _)| i.to_string())
        .collect();

    // Paused: the mark stops within a tick, users keep their places and hear so.
    let r = admin(
        &gws[1],
        "PUT",
        SALE,
        Some(ADMIN_TOKEN),
        r#"{"state": "paused"}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["state"], "paused");
    std::thread::sleep(Duration::from_millis(400));
    let mark = |redis: &RedisServer| {
        redis
            .cmd(&["GET", &format!("{KEY}:admitted_count")])
            .as_int()
    };
    let paused_mark = mark(&redis);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(mark(&redis), paused_mark, "admissions while paused");
    let r = poll(&mut c, 400).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "WAITING");
    let shown = admin(&gws[0], "GET", SALE, None, "").json();
    assert_eq!(shown["state"], "paused");
    assert!(shown["waitingCount"].as_u64().unwrap() > 300, "{shown}");

    admin(
        &gws[2],
        "PUT",
        SALE,
        Some(ADMIN_TOKEN),
        r#"{"state": "open"}"#,
    );
    assert!(
        wait_until(Duration::from_secs(2), || mark(&redis) >= paused_mark + 7),
        "no admission after resuming"
    );
    eprintln!(
        "budget 2 -> 7 per 300 ms tick: steps after the change {:?}; replicas that admitted: {leaders:?}; paused 1.2 s at mark {paused_mark}, then admitting again",
        new_steps.iter().map(|(_, n)| *n).collect::<Vec<_>>()
    );
}

fn redis_ms(redis: &RedisServer) -> u64 {
    let t = redis.cmd(&["TIME"]).as_vec();
    let s: u64 = t[0].as_str().unwrap().parse().unwrap();
    let us: u64 = t[1].as_str().unwrap().parse().unwrap();
    s * 1000 + us / 1000
}

/// The admin API's inputs: the token, every field, the path, the method, the body's size.
#[test]
fn the_admin_api_refuses_what_it_cannot_take_and_names_the_field() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    let gw = start(cfg);

    // Writes need the token; reads do not.
    for auth in [None, Some("wrong-token-wrong-token-wrong"), Some("")] {
        let r = admin(&gw, "PUT", SALE, auth, r#"{"batchSize": 5}"#);
        assert_eq!(r.status, 401, "{auth:?}");
        assert_eq!(admin(&gw, "DELETE", SALE, auth, "").status, 401);
    }
    assert_eq!(admin(&gw, "GET", SALE, None, "").status, 404);
    for (body, field) in [
        (r#"{"batchSize": 0}"#, "batchSize"),
        (r#"{"batchSize": "5"}"#, "batchSize"),
        (r#"{"batchSize": 1000001}"#, "batchSize"),
        (r#"{"tickMs": 5}"#, "tickMs"),
        (r#"{"maxCapacity": -1}"#, "maxCapacity"),
        (r#"{"heartbeatTimeoutS": 86401}"#, "heartbeatTimeoutS"),
        (r#"{"state": "closed"}"#, "state"),
        (r#"{"state": null}"#, "state"),
        (r#"{"budget": 5}"#, "budget"),
        (r#"{"batchSize": 5, "batchSize": 6}"#, "batchSize"),
        (r#"[5]"#, "body"),
        ("not json", "body"),
    ] {
        let r = admin(&gw, "PUT", SALE, Some(ADMIN_TOKEN), body);
        assert_eq!(r.status, 400, "{body}");
        let v = r.json();
        assert_eq!(
            (v["code"].as_str(), v["field"].as_str()),
            (Some("BAD_REQUEST"), Some(field)),
            "{body}: {v}"
        );
    }
    assert_eq!(
        admin(&gw, "GET", SALE, None, "").status,
        404,
        "a refused change created nothing"
    );
    let big = format!(r#"{{"batchSize": 5, "pad": "{}"}}"#, "x".repeat(20_000));
    assert_eq!(admin(&gw, "PUT", SALE, Some(ADMIN_TOKEN), &big).status, 413);
    for path in [
        "/sales/limited-drop/042",
        "/sales/limited-drop/0",
        "/sales/LIMITED_DROP/42",
        "/sales/limited-drop/42/",
        "/sales/limited-drop",
        "/sales/concert/42",
    ] {
        assert_eq!(
            admin(&gw, "PUT", path, Some(ADMIN_TOKEN), "{}").status,
            404,
            "{path}"
        );
    }
    assert_eq!(
        admin(&gw, "POST", SALE, Some(ADMIN_TOKEN), "{}").status,
        405
    );
    assert_eq!(
        admin(&gw, "DELETE", "/sales", Some(ADMIN_TOKEN), "").status,
        405
    );

    // Created with the file's [queue] for what is not given; merged; shown with live figures.
    let created = put_sale(&gw, json!({"batchSize": 5}));
    assert_eq!(created["batchSize"], 5);
    assert_eq!(created["tickMs"], 2000);
    assert_eq!(created["maxCapacity"], 100_000);
    assert_eq!(created["state"], "open");
    assert_eq!(created["version"], 1);
    let merged = put_sale(&gw, json!({"maxCapacity": 2}));
    assert_eq!(
        (merged["batchSize"].as_u64(), merged["maxCapacity"].as_u64()),
        (Some(5), Some(2))
    );
    assert_eq!(merged["version"], 2);
    let mut c = gw.client();
    assert_eq!(enter(&mut c, 1).status, 200);
    assert_eq!(enter(&mut c, 2).status, 200);
    let full = enter(&mut c, 3);
    assert_eq!(full.status, 429, "the sale's capacity of 2");
    let shown = admin(&gw, "GET", SALE, None, "").json();
    assert_eq!(shown["waitingCount"], 2, "{shown}");
    assert_eq!(
        (shown["type"].as_str(), shown["id"].as_str()),
        (Some("limited-drop"), Some("42"))
    );
    let list = admin(&gw, "GET", "/sales", None, "").json();
    assert_eq!(list["sales"].as_array().unwrap().len(), 1, "{list}");

    // Deleted: its users are no longer known; it is gone from the list.
    let r = admin(&gw, "DELETE", SALE, Some(ADMIN_TOKEN), "");
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_eq!(poll(&mut c, 1).unwrap().status, 404);
    assert_eq!(admin(&gw, "GET", SALE, None, "").status, 404);
    assert_eq!(
        admin(&gw, "DELETE", SALE, Some(ADMIN_TOKEN), "").status,
        404
    );
    let list = admin(&gw, "GET", "/sales", None, "").json();
    assert_eq!(list["sales"].as_array().unwrap().len(), 0, "{list}");

    // Without `server.admin_token_env`, writes are refused whatever is sent.
    let plain = GatewayProc::start(test_config(up.addr));
    let r = admin(
        &plain,
        "PUT",
        SALE,
        Some(ADMIN_TOKEN),
        r#"{"batchSize": 5}"#,
    );
    assert_eq!(r.status, 403);
    // A named variable that is unset, or too short to be a secret, stops the start.
    let mut cfg = test_config(up.addr);
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN_SHORT".into();
    let path = plain.dir.0.join("short.toml");
    std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
    for env in [vec![], vec![("VQ_ADMIN_TOKEN_SHORT", "short")]] {
        let mut all = vec![("VQ_TOKEN_SECRET", TEST_SECRET)];
        all.extend(env);
        let (code, _, err) = run_bin(
            &["serve", "--config", path.to_str().unwrap()],
            &all,
            Duration::from_secs(10),
        );
        assert_ne!(code, Some(0));
        assert!(err.contains("VQ_ADMIN_TOKEN_SHORT"), "{err}");
    }
}

fn cli(gw: &GatewayProc, args: &[&str]) -> (Option<i32>, String) {
    let path = gw.dir.0.join("gateway.toml");
    let mut all: Vec<&str> = args[..2].to_vec();
    all.extend_from_slice(&["--config", path.to_str().unwrap()]);
    all.extend_from_slice(&args[2..]);
    let (code, out, err) = run_bin(&all, &[], Duration::from_secs(20));
    (code, format!("{out}{err}"))
}

/// The CLI manages sales through Redis; a Redis that comes back empty gets every registered
/// sale's parameters written back by the replicas (not reset to anyone's file), counted as a
/// data loss.
#[test]
fn the_cli_manages_sales_and_an_empty_redis_gets_them_back() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = [(100, 60), (7, 20)]
        .iter()
        .map(|&(batch, hb)| {
            let mut cfg = redis_config(up.addr, &redis);
            cfg.queue.batch_size = batch;
            cfg.queue.heartbeat_timeout_s = hb;
            cfg.store.startup_wait_ms = 2000;
            start(cfg)
        })
        .collect();
    gws[0].wait_flag_known();
    let ok = |args: &[&str]| {
        let (code, out) = cli(&gws[0], args);
        assert_eq!(code, Some(0), "{args:?}: {out}");
        out
    };
    let out = ok(&[
        "sale",
        "create",
        "LIMITED_DROP:42",
        "batchSize=3",
        "tickMs=700",
    ]);
    assert!(out.contains("batchSize=3 tickMs=700"), "{out}");
    assert!(
        out.contains("heartbeatTimeoutS=60"),
        "the file's default: {out}"
    );
    let (code, out) = cli(&gws[0], &["sale", "create", "LIMITED_DROP:42"]);
    assert_eq!(code, Some(64), "{out}");
    assert!(out.contains("exists"), "{out}");
    for bad in [
        vec!["sale", "set", "LIMITED_DROP:42", "batchSize=0"],
        vec!["sale", "set", "LIMITED_DROP:42", "budget=3"],
        vec!["sale", "set", "LIMITED_DROP:42", "batchSize"],
        vec!["sale", "set", "LIMITED_DROP:42"],
        vec!["sale", "set", "LIMITED_DROP:042", "batchSize=3"],
        vec!["sale", "set", "LIMITED_DROP:43", "batchSize=3"],
        vec!["sale", "show", "LIMITED_DROP:43"],
    ] {
        let (code, out) = cli(&gws[0], &bad);
        assert_eq!(code, Some(64), "{bad:?}: {out}");
    }
    ok(&[
        "sale",
        "set",
        "LIMITED_DROP:42",
        "maxCapacity=900",
        "heartbeatTimeoutS=30",
    ]);
    ok(&["sale", "pause", "LIMITED_DROP:42"]);
    let out = ok(&["sale", "show", "LIMITED_DROP:42"]);
    assert!(out.contains("LIMITED_DROP:42: paused batchSize=3 tickMs=700 maxCapacity=900 heartbeatTimeoutS=30 (version 3)"), "{out}");
    ok(&["sale", "resume", "LIMITED_DROP:42"]);
    ok(&["sale", "create", "TICKETING_EVENT:8", "batchSize=9"]);
    let out = ok(&["sale", "list"]);
    assert!(out.contains("LIMITED_DROP:42: open batchSize=3"), "{out}");
    assert!(out.contains("TICKETING_EVENT:8: open batchSize=9"), "{out}");
    // Both replicas read the sales (a refresh a second).
    std::thread::sleep(Duration::from_millis(2500));

    // Redis restarted empty, users entering meanwhile (their enters create a sale from their
    // replica's file until the write-back replaces it).
    let stop = Arc::new(AtomicBool::new(false));
    let entering = {
        let (stop, a, b) = (stop.clone(), gws[0].listen, gws[1].listen);
        std::thread::spawn(move || {
            let mut cs = [Client::connect(a), Client::connect(b)];
            let mut user = 10_000u64;
            while !stop.load(Ordering::Relaxed) {
                user += 1;
                let c = &mut cs[(user % 2) as usize];
                if enter(c, user).status == 0 {
                    cs = [Client::connect(a), Client::connect(b)];
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    redis.kill();
    std::thread::sleep(Duration::from_millis(300));
    redis.restart();
    let restarted = Instant::now();
    let back = wait_until(Duration::from_secs(8), || {
        redis
            .cmd(&["HGET", &format!("{KEY}:sale"), "version"])
            .as_str()
            == Some("4".into())
            && redis
                .cmd(&["HGET", "queue:{TICKETING_EVENT:8}:sale", "batchSize"])
                .as_str()
                == Some("9".into())
    });
    let took = restarted.elapsed();
    stop.store(true, Ordering::Relaxed);
    entering.join().unwrap();
    assert!(back, "the sales were not written back");
    let sale = redis.cmd(&["HGETALL", &format!("{KEY}:sale")]).as_vec();
    let fields: HashMap<String, String> = sale
        .chunks(2)
        .map(|p| (p[0].as_str().unwrap(), p[1].as_str().unwrap()))
        .collect();
    for (k, v) in [
        ("batchSize", "3"),
        ("tickMs", "700"),
        ("maxCapacity", "900"),
        ("heartbeatTimeoutS", "30"),
        ("state", "open"),
    ] {
        assert_eq!(
            fields.get(k).map(String::as_str),
            Some(v),
            "{k}: {fields:?}"
        );
    }
    assert_eq!(
        redis.cmd(&["PTTL", &format!("{KEY}:sale")]).as_int(),
        -1,
        "a written-back sale does not expire"
    );
    let losses: u64 = gws
        .iter()
        .map(|g| {
            g.metrics()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("virtual_queue_store_data_loss_total{state=\"sale\"} ")
                        .and_then(|v| v.parse::<u64>().ok())
                })
                .unwrap_or(0)
        })
        .sum();
    assert!(losses >= 2, "data loss of two sales counted: {losses}");

    // Deleted: unregistered first, so no replica writes it back.
    ok(&["sale", "delete", "LIMITED_DROP:42"]);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(redis.cmd(&["EXISTS", &format!("{KEY}:sale")]).as_int(), 0);
    let out = ok(&["sale", "list"]);
    assert!(!out.contains("LIMITED_DROP:42"), "{out}");
    eprintln!(
        "Redis restarted empty: two sales written back {} ms after the restart",
        took.as_millis()
    );
}

/// The pre-queue and its draw, end to end on Redis through two replicas: refused (with
/// `Retry-After`) before the pre-queue opens; pre-queued users get no position and an ETA that
/// counts the time to the opening; at the opening every live pre-queued user gets exactly one of
/// the pre-queue's seqs, in the order the seed gives; the seed revealed matches the commitment
/// published before, and `vq-gateway draw verify` reproduces the order from the admin export; a
/// user arriving after the draw queues behind, with a position.
#[test]
fn the_pre_queue_is_drawn_at_the_opening_and_anyone_can_check_the_draw() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = (0..2)
        .map(|_| {
            let mut cfg = redis_config(up.addr, &redis);
            cfg.queue.tick_ms = 300;
            start(cfg)
        })
        .collect();
    gws[0].wait_flag_known();
    let now = load::epoch_ms();
    let (prequeue_at, opens_at) = (now + 1_500, now + 4_000);
    let sale = put_sale(
        &gws[0],
        json!({"batchSize": 10, "tickMs": 300, "heartbeatTimeoutS": 30,
               "prequeueOpensAt": prequeue_at, "opensAt": opens_at}),
    );
    let commitment = sale["drawCommitment"].as_str().unwrap().to_string();
    assert_eq!(commitment.len(), 64);

    let mut c = gws[1].client();
    let early = enter(&mut c, 1);
    assert_eq!(
        early.status,
        403,
        "{}",
        String::from_utf8_lossy(&early.body)
    );
    assert_eq!(early.json()["code"], "QUEUE_NOT_OPEN");
    let retry: u64 = early.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "Retry-After {retry}");
    let before = c.get(&format!("{Q}/draw"), &[]).unwrap().json();
    assert_eq!(before["commitment"], commitment.as_str());
    assert!(
        before.get("seed").is_none(),
        "the seed before the draw: {before}"
    );
    // Redis holds the nonce and the commitment, never the seed before the draw: whoever reads
    // Redis cannot grind user ids against it.
    let stored = |field: &str| {
        redis
            .cmd(&["HGET", &format!("{KEY}:sale"), field])
            .as_str()
            .unwrap_or_default()
    };
    assert_eq!(stored("drawSeed"), "", "the seed is stored before the draw");
    assert_eq!(stored("drawNonce").len(), 32);
    assert_eq!(stored("drawCommitment"), commitment);

    assert!(wait_until(Duration::from_secs(3), || load::epoch_ms() >= prequeue_at));
    let users: Vec<u64> = (1..=200).map(|i| 7_000 + i * 13).collect();
    let mut clients = [gws[0].client(), gws[1].client()];
    for (i, u) in users.iter().enumerate() {
        let r = enter(&mut clients[i % 2], *u);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["status"], "WAITING");
        assert_eq!(v["position"], Value::Null, "a place before the draw: {v}");
        assert_eq!(v["queueTicket"], Value::Null);
        assert!(v["opensAt"].as_str().is_some(), "{v}");
        let to_open = opens_at.saturating_sub(load::epoch_ms()) / 1000;
        assert!(v["etaSeconds"].as_u64().unwrap() >= to_open, "{v}");
    }
    let provisional: Vec<(u64, u64)> = users
        .iter()
        .map(|u| {
            let s = redis.cmd(&["ZSCORE", &format!("{KEY}:waiting"), &u.to_string()]);
            (*u, s.as_str().unwrap().parse().unwrap())
        })
        .collect();
    assert!(advances(&redis).is_empty(), "admissions before the opening");

    // The opening: drawn within a tick or two.
    let drawn = wait_until(Duration::from_secs(8), || {
        c.get(&format!("{Q}/draw"), &[])
            .is_ok_and(|r| r.json().get("seed").is_some())
    });
    assert!(drawn, "no draw after the opening");
    let after = c.get(&format!("{Q}/draw"), &[]).unwrap().json();
    let seed = vq_gateway::draw::unhex(after["seed"].as_str().unwrap()).unwrap();
    assert_eq!(vq_gateway::draw::commitment(&seed), commitment);
    assert_eq!(after["entrants"], 200);
    assert_eq!(
        stored("drawSeed"),
        after["seed"].as_str().unwrap(),
        "revealed with the draw"
    );

    // Every entrant holds exactly one of the pre-queue's seqs, in the seed's order.
    let ranked = redis
        .cmd(&["ZRANGE", &format!("{KEY}:waiting"), "0", "-1"])
        .as_vec();
    let ranked: Vec<u64> = ranked
        .iter()
        .map(|r| r.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ranked.len(), 200);
    assert_eq!(ranked, vq_gateway::draw::order(&seed, &users));
    let mut seqs_after: Vec<u64> = users
        .iter()
        .map(|u| {
            redis
                .cmd(&["ZSCORE", &format!("{KEY}:waiting"), &u.to_string()])
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    seqs_after.sort_unstable();
    let mut seqs_before: Vec<u64> = provisional.iter().map(|(_, s)| *s).collect();
    seqs_before.sort_unstable();
    assert_eq!(seqs_after, seqs_before, "the entrants exchanged their seqs");
    assert!(provisional
        .iter()
        .any(|(u, s)| ranked.iter().position(|x| x == u).unwrap() as u64 + 1 != *s));

    // The admin export and the CLI's check of it.
    let export = admin(&gws[0], "GET", &format!("{SALE}/draw"), None, "");
    assert_eq!(export.status, 200);
    let file = gws[0].dir.0.join("draw.json");
    std::fs::write(&file, &export.body).unwrap();
    let (code, out, err) = run_bin(
        &["draw", "verify", file.to_str().unwrap()],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("ok: "), "{out}");
    let mut forged: Value = serde_json::from_slice(&export.body).unwrap();
    forged["order"].as_array_mut().unwrap().swap(0, 199);
    std::fs::write(&file, forged.to_string()).unwrap();
    let (code, _, _) = run_bin(
        &["draw", "verify", file.to_str().unwrap()],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(1), "a forged order passed");

    // Admissions follow the draw's order; a late arrival queues behind with a position; the
    // schedule cannot change any more.
    assert!(wait_until(Duration::from_secs(3), || advances(&redis)
        .len()
        >= 2));
    let first = ranked[0];
    let r = poll(&mut c, first).unwrap().json();
    assert_eq!(r["status"], "ADMITTED", "the draw's first: {r}");
    let late = enter(&mut c, 99_999).json();
    assert_eq!(late["position"], 201, "{late}");
    assert_eq!(late["opensAt"], Value::Null);
    let r = admin(
        &gws[1],
        "PUT",
        SALE,
        Some(ADMIN_TOKEN),
        &json!({"opensAt": opens_at + 1}).to_string(),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["field"], "opensAt");
    eprintln!(
        "pre-queue of 200 drawn at the opening; commitment {commitment} matched; order verified"
    );
}

/// Uniformity over many draws made by the stores themselves (the memory store in process, and a
/// smaller run on Redis), and the same chance for a user who entered ten minutes before the
/// opening as for one who entered a millisecond before.
#[test]
fn every_entrant_has_the_same_chance_whenever_it_entered() {
    use vq_gateway::sale::SalePatch;
    use vq_gateway::store::{DrawStep, MemoryStore, Now, QueueStore, RedisStore};

    async fn one_draw(
        s: &dyn QueueStore,
        id: u64,
        entered: &[(u64, u64)],
        opens_at: u64,
    ) -> Vec<u64> {
        let t = vq_gateway::queue::QueueTarget::new(vq_gateway::queue::TargetType::LimitedDrop, id);
        let patch = SalePatch {
            opens_at_ms: Some(opens_at),
            ..SalePatch::default()
        };
        s.put_sale(
            t,
            &patch,
            Now {
                epoch_ms: opens_at - 700_000,
            },
        )
        .await
        .unwrap()
        .unwrap();
        for (user, at) in entered {
            let outcome = s.enter(t, *user, Now { epoch_ms: *at }).await.unwrap();
            assert!(
                matches!(outcome, vq_gateway::store::EnterOutcome::Waiting { .. }),
                "{outcome:?}"
            );
        }
        let at_opening = Now { epoch_ms: opens_at };
        let DrawStep::Entrants {
            draw_seq,
            seed,
            entrants,
        } = s.draw_entrants(t, at_opening).await.unwrap()
        else {
            panic!("no entrants");
        };
        let places = vq_gateway::draw::places(&vq_gateway::draw::unhex(&seed).unwrap(), &entrants);
        assert!(s
            .apply_draw(t, draw_seq, &places, at_opening)
            .await
            .unwrap());
        s.draw_order(t).await.unwrap()
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let opens_at = load::epoch_ms() + 1_000_000;
    // In process: 2,000 draws of two users, one entered 10 minutes before the opening, the
    // other 1 ms before.
    let memory = MemoryStore::new().with_max_targets(10_000);
    let early_first = rt.block_on(async {
        let mut early_first = 0u32;
        for id in 1..=2_000u64 {
            let order = one_draw(
                &memory,
                id,
                &[(1, opens_at - 600_000), (2, opens_at - 1)],
                opens_at,
            )
            .await;
            if order[0] == 1 {
                early_first += 1;
            }
        }
        early_first
    });
    // Binomial(2000, 1/2): mean 1000, standard deviation 22.4; 5 deviations either way.
    assert!(
        (888..=1112).contains(&early_first),
        "entered early and drawn first {early_first} times of 2000"
    );

    // On Redis: 300 draws of four users, each place's distribution over the users.
    let redis = RedisServer::start();
    let counts = rt.block_on(async {
        // Draw seeds derive from the token secret (`draw::DrawKeys`), as in the gateway.
        let keys = vq_gateway::token::TokenKeys::new(TEST_SECRET.as_bytes(), None);
        let store = RedisStore::new(&redis.url(), Duration::from_secs(2))
            .unwrap()
            .with_draw_keys(vq_gateway::draw::DrawKeys::from_token_keys(&keys));
        assert!(store.connect(Duration::from_secs(5)).await);
        let mut counts = vec![vec![0u32; 4]; 4];
        for id in 1..=300u64 {
            let entered: Vec<(u64, u64)> = (1..=4).map(|u| (u, opens_at - 1_000 * u)).collect();
            let order = one_draw(&store, id, &entered, opens_at).await;
            for (place, user) in order.iter().enumerate() {
                counts[place][*user as usize - 1] += 1;
            }
        }
        counts
    });
    // The largest cell's term; a 4x4 table's total has 9 degrees of freedom (0.01 %: 33.7).
    let total: f64 = {
        let expected = 300.0 / 4.0;
        counts
            .iter()
            .flat_map(|r| r.iter())
            .map(|c| (f64::from(*c) - expected).powi(2) / expected)
            .sum()
    };
    assert!(total < 33.7, "chi-square {total:.1} over {counts:?}");
    eprintln!(
        "draw uniformity: entered 10 min early and drawn first {early_first} of 2000 (memory); chi-square {total:.1} (9 df) over 300 draws of 4 on Redis: {counts:?}"
    );
}

/// The ETA of a sale with abandonment, measured by the simulator against two replicas on Redis:
/// live users ahead over the measured admission rate of live users, never rising between one
/// answer and the next, its error reported (median, p90) for docs/api.md.
#[test]
fn etas_follow_the_measured_rate_and_never_rise() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = (0..2)
        .map(|_| {
            let mut cfg = redis_config(up.addr, &redis);
            cfg.queue.tick_ms = 250;
            start(cfg)
        })
        .collect();
    gws[0].wait_flag_known();
    put_sale(
        &gws[0],
        json!({"batchSize": 15, "tickMs": 250, "heartbeatTimeoutS": 4}),
    );
    let out = TempDir::new("sim-eta");
    let output = std::process::Command::new(sim_bin())
        .args([
            "simulate",
            "--url",
            &format!("http://{}", gws[0].listen),
            "--sale",
            "limited-drop:42",
            "--spike-rate",
            "200",
            "--spike-s",
            "3",
            "--tail-rate",
            "10",
            "--tail-s",
            "3",
            "--abandon",
            "0.2",
            "--leave",
            "0.05",
            "--cheat",
            "0",
            "--batch",
            "15",
            "--tick-ms",
            "250",
            "--heartbeat-timeout-s",
            "4",
            "--max-duration-s",
            "40",
            "--first-user",
            "100000",
            "--out",
        ])
        .arg(&out.0)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{summary}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.0.join("report.json")).unwrap()).unwrap();
    let eta = &report["etaError"];
    assert!(eta["count"].as_u64().unwrap() > 100, "{eta}");
    assert_eq!(
        report["etaRises"], 0,
        "ETAs rose between answers: {summary}"
    );
    eprintln!(
        "ETA with 20 % abandoning and 5 % leaving, 15 per 250 ms: median error {:.0} %, p90 {:.0} % over {} users; 0 rises",
        eta["p50"].as_f64().unwrap() * 100.0,
        eta["p90"].as_f64().unwrap() * 100.0,
        eta["count"]
    );
}

/// Pre-queued users stay by polling: one silent past the sale's timeout before the opening is
/// dropped and takes no part in the draw (the memory store in virtual time; the Redis scripts
/// are the same steps, compared by `tests/differential.rs` and the draw test above).
#[test]
fn a_pre_queued_user_silent_past_the_timeout_misses_the_draw() {
    use vq_gateway::queue::{QueueTarget, TargetType};
    use vq_gateway::sale::SalePatch;
    use vq_gateway::store::{DrawStep, MemoryStore, Now, PollOutcome, QueueStore, TokenCandidate};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = MemoryStore::new();
        let t = QueueTarget::new(TargetType::TicketingEvent, 8);
        let base = 1_900_000_000_000u64;
        let at = |ms: u64| Now {
            epoch_ms: base + ms,
        };
        let patch = SalePatch {
            heartbeat_timeout_s: Some(2),
            opens_at_ms: Some(base + 10_000),
            prequeue_opens_at_ms: Some(base + 1_000),
            ..SalePatch::default()
        };
        s.put_sale(t, &patch, at(0)).await.unwrap().unwrap();
        assert_eq!(
            s.enter(t, 1, at(500)).await.unwrap(),
            vq_gateway::store::EnterOutcome::Early
        );
        for user in [1, 2, 3] {
            s.enter(t, user, at(1_000)).await.unwrap();
        }
        let never = || -> Option<TokenCandidate> { unreachable!() };
        // Users 1 and 2 poll every second; user 3 falls silent.
        for sec in 2..=9u64 {
            for user in [1, 2] {
                let p = s.poll(t, user, at(sec * 1_000), &never).await.unwrap();
                assert!(matches!(p, PollOutcome::Waiting { .. }), "{p:?}");
            }
            s.sweep(t, 0, 100, at(sec * 1_000)).await.unwrap();
        }
        let p = s.poll(t, 3, at(9_500), &never).await.unwrap();
        assert_eq!(
            p,
            PollOutcome::NotInQueue,
            "silent for 8.5 s with a 2 s timeout"
        );
        let DrawStep::Entrants { entrants, .. } = s.draw_entrants(t, at(10_000)).await.unwrap()
        else {
            panic!("no draw at the opening");
        };
        let mut users: Vec<u64> = entrants.iter().map(|(u, _)| *u).collect();
        users.sort_unstable();
        assert_eq!(users, vec![1, 2]);
    });
}

/// An opening set on a sale whose users already queue in arrival order would reshuffle places
/// already shown (admitted users back to waiting): refused with a 400 naming `opensAt`, on the
/// memory store and on Redis alike; an opening set before the first enter is taken.
#[test]
fn an_opening_is_refused_once_users_queue_in_arrival_order() {
    let up = Upstream::start();
    let redis = RedisServer::start();
    let mut memory = test_config(up.addr);
    memory.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    for cfg in [memory, redis_config(up.addr, &redis)] {
        let gw = start(cfg);
        gw.wait_flag_known();
        put_sale(&gw, json!({"batchSize": 2}));
        let mut c = gw.client();
        assert_eq!(enter(&mut c, 1001).status, 200);
        let opens_at = crate_now_ms() + 60_000;
        let r = admin(
            &gw,
            "PUT",
            SALE,
            Some(ADMIN_TOKEN),
            &json!({"opensAt": opens_at}).to_string(),
        );
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["field"], "opensAt", "{v}");
        assert!(
            v["detail"]
                .as_str()
                .unwrap()
                .contains("before the first enter"),
            "{v}"
        );
        let sale = admin(&gw, "GET", SALE, None, "").json();
        assert_eq!(sale["opensAt"], Value::Null, "nothing written: {sale}");
        // Another sale with nobody in it yet takes an opening.
        let other = "/sales/limited-drop/43";
        let r = admin(
            &gw,
            "PUT",
            other,
            Some(ADMIN_TOKEN),
            &json!({"opensAt": opens_at}).to_string(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
}

fn crate_now_ms() -> u64 {
    common::load::epoch_ms()
}

/// The admin listener answers its IP addresses, `localhost` and `server.admin_hosts`: a page
/// under another name (DNS rebinding) reads nothing; health checks answer any name.
#[test]
fn admin_reads_refuse_a_foreign_host() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    cfg.server.admin_hosts = vec!["gateway-1".into()];
    let gw = start(cfg);
    let port = gw.admin.port();
    let get = |path: &str, host: &str| {
        let mut raw = RawConn::connect(gw.admin);
        raw.send_raw(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
            false,
        )
        .unwrap()
        .status
    };
    for path in ["/console/state", "/sales", "/flag", "/metrics", "/console"] {
        for host in [
            "rebound.example".to_string(),
            format!("rebound.example:{port}"),
            format!("127.0.0.1.rebound.example:{port}"),
        ] {
            assert_eq!(get(path, &host), 421, "{path} {host}");
        }
        for host in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("gateway-1:{port}"),
        ] {
            assert_eq!(get(path, &host), 200, "{path} {host}");
        }
    }
    assert_eq!(get("/healthz", "rebound.example"), 200);
    // Two Host headers: refused (an error answer, or the connection closed without one).
    let mut raw = RawConn::connect(gw.admin);
    let r = raw.send_raw(
        format!("GET /sales HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: rebound.example\r\n\r\n")
            .as_bytes(),
        false,
    );
    assert!(r.as_ref().map_or(true, |r| r.status != 200), "{r:?}");
}

/// An opening commits to a seed derived from the token secret: the CLI sets one only where the
/// secret is in its environment, and says so where it is not.
#[test]
fn the_cli_sets_an_opening_only_with_the_token_secret() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gw = start(redis_config(up.addr, &redis));
    gw.wait_flag_known();
    let path = gw.dir.0.join("gateway.toml");
    let config = path.to_str().unwrap();
    let opens_at = (load::epoch_ms() + 600_000).to_string();
    let field = format!("opensAt={opens_at}");
    let args = [
        "sale",
        "create",
        "--config",
        config,
        "LIMITED_DROP:77",
        &field,
    ];
    let (code, out, err) = run_bin(&args, &[], Duration::from_secs(20));
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(format!("{out}{err}").contains("token secret"), "{out}{err}");
    assert_eq!(
        redis
            .cmd(&["EXISTS", "queue:{LIMITED_DROP:77}:sale"])
            .as_int(),
        0,
        "nothing written"
    );
    let (code, out, err) = run_bin(
        &args,
        &[("VQ_TOKEN_SECRET", TEST_SECRET)],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let stored = |f: &str| {
        redis
            .cmd(&["HGET", "queue:{LIMITED_DROP:77}:sale", f])
            .as_str()
            .unwrap_or_default()
    };
    assert_eq!(stored("opensAt"), opens_at);
    assert_eq!(stored("drawSeed"), "");
    assert_eq!(stored("drawCommitment").len(), 64);
}
