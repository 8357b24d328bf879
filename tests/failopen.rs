//! Fail-open (SPEC §7): Redis killed, paused, restarted empty, out of memory, or absent at start.
//! Enter and poll never answer 5xx and stay fast, the gate keeps verifying HMAC, and the queue
//! comes back by itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;

const Q: &str = "/virtual-queues/limited-drop/42";

fn gateway(redis: &RedisServer, up: &Upstream, tweak: impl Fn(&mut ConfigFile)) -> GatewayProc {
    let mut cfg = test_config(up.addr);
    cfg.store.backend = "redis".into();
    cfg.store.redis_url = redis.url();
    cfg.queue.tick_ms = 200;
    cfg.queue.batch_size = 1;
    tweak(&mut cfg);
    GatewayProc::start(cfg)
}

/// One queue call, timed: (status, JSON body or null, latency).
fn timed(
    c: &mut Client,
    method: &str,
    path: &str,
    user: u64,
) -> (u16, serde_json::Value, Duration) {
    let t = Instant::now();
    let r = c
        .request(
            method,
            &format!("{Q}{path}"),
            &[("X-User-Id", &user.to_string())],
            b"",
        )
        .unwrap();
    let took = t.elapsed();
    let v = if r.status == 200 {
        r.json()
    } else {
        serde_json::Value::Null
    };
    (r.status, v, took)
}

fn enter(c: &mut Client, user: u64) -> (u16, serde_json::Value, Duration) {
    timed(c, "POST", "/entries", user)
}

fn poll(c: &mut Client, user: u64) -> (u16, serde_json::Value, Duration) {
    timed(c, "GET", "/entries/me", user)
}

fn median_max(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], *v.last().unwrap())
}

#[test]
fn redis_killed_mid_run_no_5xx_fast_answers_gate_still_holds() {
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let gw = gateway(&redis, &up, |c| c.queue.tick_ms = 3_600_000);
    let mut c = gw.client();
    for u in 1..=50 {
        assert_eq!(enter(&mut c, u).1["status"], "WAITING");
    }
    redis.kill();
    let mut latencies = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..300u64 {
        let user = 1 + i % 100;
        let (status, v, took) = if i % 2 == 0 {
            enter(&mut c, user)
        } else {
            poll(&mut c, user)
        };
        assert_eq!(status, 200, "request {i}: {v}");
        assert_eq!(v["status"], "DIRECT_ADMITTED", "request {i}");
        latencies.push(took);
        if tokens.len() < 5 {
            tokens.push((user, v["entryToken"].as_str().unwrap().to_string()));
        }
    }
    let (median, max) = median_max(latencies);
    eprintln!("redis down: enter/poll median {median:?}, max {max:?} over 300 requests");
    assert!(median < Duration::from_millis(50), "median {median:?}");
    assert!(max < Duration::from_millis(1000), "max {max:?}");
    // Stateless tokens pass the gate (HMAC only; the claim is skipped); no token, no entry.
    for (user, token) in &tokens {
        let r = c
            .request(
                "POST",
                "/limited-drops/42/orders",
                &[("X-User-Id", &user.to_string()), ("X-Entry-Token", token)],
                b"{}",
            )
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let r = c
        .request(
            "POST",
            "/limited-drops/42/orders",
            &[("X-User-Id", "1")],
            b"{}",
        )
        .unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(up.count(), tokens.len());
    let m = gw.metrics();
    assert!(
        m.contains("virtual_queue_redis_degraded_total{op=\"enter\"}"),
        "{m}"
    );
    assert!(
        m.contains("virtual_queue_redis_degraded_total{op=\"claim\"}"),
        "{m}"
    );
    // One warning for the whole outage, not one per request.
    let warnings = gw.log().matches("store failed; failing open").count();
    assert_eq!(warnings, 1, "{}", gw.log());
}

#[test]
fn paused_redis_answers_within_the_timeout() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gw = gateway(&redis, &up, |c| c.queue.tick_ms = 3_600_000);
    let mut c = gw.client();
    assert_eq!(enter(&mut c, 1).1["status"], "WAITING");
    redis.pause();
    let mut latencies = Vec::new();
    for u in 0..40u64 {
        let (status, v, took) = enter(&mut c, 100 + u);
        assert_eq!(status, 200);
        assert_eq!(v["status"], "DIRECT_ADMITTED");
        latencies.push(took);
    }
    let (median, max) = median_max(latencies);
    eprintln!(
        "redis paused: enter median {median:?}, max {max:?} over 40 requests (timeout 150 ms)"
    );
    assert!(max < Duration::from_millis(600), "max {max:?}");
    assert!(median < Duration::from_millis(200), "median {median:?}");
    redis.resume();
    // Back by itself once Redis answers again.
    assert!(wait_until(Duration::from_secs(5), || enter(&mut c, 1).1
        ["status"]
        == "WAITING"));
}

#[test]
fn restart_and_script_flush_resume_the_queue_by_themselves() {
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let gw = gateway(&redis, &up, |_| {});
    let mut c = gw.client();
    assert_eq!(enter(&mut c, 1).1["status"], "WAITING");
    redis.restart(); // empty: no keys, no scripts
    assert!(
        wait_until(Duration::from_secs(5), || enter(&mut c, 2).1["status"]
            == "WAITING"),
        "{}",
        gw.log()
    );
    redis.cmd(&["SCRIPT", "FLUSH"]);
    let (status, v, _) = poll(&mut c, 2);
    assert_eq!(status, 200);
    assert!(v["status"] == "WAITING" || v["status"] == "ADMITTED", "{v}");
    // The pump is back too: the new user is admitted.
    assert!(wait_until(Duration::from_secs(5), || poll(&mut c, 2).1
        ["status"]
        == "ADMITTED"));
    assert!(gw.log().contains("queue resumed"), "{}", gw.log());
}

#[test]
fn out_of_memory_fails_open_without_partial_writes() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gw = gateway(&redis, &up, |c| c.queue.tick_ms = 3_600_000);
    let mut c = gw.client();
    assert_eq!(enter(&mut c, 1).1["status"], "WAITING", "{}", gw.log());
    let p = "queue:{LIMITED_DROP:42}:";
    let before = redis.cmd(&["GET", &format!("{p}seq")]).as_int();
    let checkpoints = redis.cmd(&["ZCARD", &format!("{p}seqtime")]).as_int();
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let (status, v, _) = enter(&mut c, 2);
    assert_eq!(status, 200);
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    assert_eq!(
        redis.cmd(&["GET", &format!("{p}seq")]).as_int(),
        before,
        "seq moved"
    );
    for key in ["waiting", "heartbeat"] {
        assert_eq!(
            redis.cmd(&["ZSCORE", &format!("{p}{key}"), "2"]),
            Resp::Bulk(None),
            "{key} written"
        );
    }
    assert_eq!(
        redis.cmd(&["ZCARD", &format!("{p}seqtime")]).as_int(),
        checkpoints
    );
    redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(wait_until(Duration::from_secs(3), || enter(&mut c, 2).1
        ["status"]
        == "WAITING"));
    assert_eq!(redis.cmd(&["GET", &format!("{p}seq")]).as_int(), before + 1);
}

#[test]
fn starts_without_redis_and_connects_when_it_appears() {
    let mut redis = RedisServer::start();
    redis.kill();
    let up = Upstream::start();
    let gw = gateway(&redis, &up, |c| c.queue.tick_ms = 3_600_000);
    let mut c = gw.client();
    let (status, v, took) = enter(&mut c, 1);
    assert_eq!(status, 200);
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    assert!(took < Duration::from_millis(500), "{took:?}");
    assert_eq!(
        gw.client().get("/anything", &[]).unwrap().status,
        200,
        "the proxy serves"
    );
    redis.restart();
    assert!(
        wait_until(Duration::from_secs(10), || enter(&mut c, 1).1["status"]
            == "WAITING"),
        "{}",
        gw.log()
    );
}
