//! The waiting room API over HTTP (docs/api.md), against both store backends: the embedded memory
//! store and Redis. The backend is a recording upstream that must never see a queue call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use vq_gateway::queue::TargetType;
use vq_gateway::token::{verify, TokenKeys};

struct Env {
    gw: GatewayProc,
    up: Upstream,
    _redis: Option<RedisServer>,
}

/// A gateway on `store` with a long tick (the pump stays out of the way) unless `tick_ms` is set.
fn env(store: &str, tweak: impl Fn(&mut ConfigFile)) -> Env {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.queue.tick_ms = 3_600_000;
    let redis = (store == "redis").then(RedisServer::start);
    if let Some(r) = &redis {
        cfg.store.backend = StoreKind::Redis;
        cfg.store.redis_url = r.url();
    }
    tweak(&mut cfg);
    Env {
        gw: GatewayProc::start(cfg),
        up,
        _redis: redis,
    }
}

fn both(test: impl Fn(&str)) {
    for store in ["memory", "redis"] {
        test(store);
    }
}

const Q: &str = "/virtual-queues/limited-drop/42";

fn enter(c: &mut Client, path: &str, user: u64) -> Response {
    c.request(
        "POST",
        &format!("{path}/entries"),
        &[("X-User-Id", &user.to_string())],
        b"",
    )
    .unwrap()
}

fn poll(c: &mut Client, path: &str, user: u64) -> Response {
    c.get(
        &format!("{path}/entries/me"),
        &[("X-User-Id", &user.to_string())],
    )
    .unwrap()
}

fn leave(c: &mut Client, path: &str, user: u64) -> Response {
    c.request(
        "DELETE",
        &format!("{path}/entries/me"),
        &[("X-User-Id", &user.to_string())],
        b"",
    )
    .unwrap()
}

fn waiting(r: &Response) -> (u64, u64) {
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["status"], "WAITING", "{v}");
    (
        v["position"].as_u64().unwrap(),
        v["aheadCount"].as_u64().unwrap(),
    )
}

fn assert_error(r: &Response, status: u16, code: &str) {
    assert_eq!(r.status, status, "{:?}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["code"], code, "{v}");
    assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(r.header("content-length").is_some());
}

#[test]
fn enter_poll_leave_reenter() {
    both(|store| {
        let e = env(store, |_| {});
        let mut c = e.gw.client();
        let r = enter(&mut c, Q, 1001);
        let v = r.json();
        // Field for field as docs/api.md, nulls included.
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for k in [
            "status",
            "position",
            "aheadCount",
            "etaSeconds",
            "entryToken",
            "tokenExpiresAt",
        ] {
            assert!(keys.contains(&k), "{store}: {k} missing in {v}");
        }
        assert_eq!(v["status"], "WAITING");
        assert_eq!(v["position"], 1);
        assert_eq!(v["aheadCount"], 0);
        let eta = v["etaSeconds"].as_u64().unwrap();
        // The additive poll hint: at least a tick (1 s at least), at most the ETA.
        let tick_s = e.gw.config.queue.tick_ms.div_ceil(1000).max(1);
        assert_eq!(
            v["pollAfterSeconds"].as_u64(),
            Some(tick_s.max(eta / 2)),
            "{v}"
        );
        assert_eq!(v["entryToken"], Value::Null);
        assert_eq!(v["tokenExpiresAt"], Value::Null);
        assert_eq!(r.header("content-type"), Some("application/json"));

        assert_eq!(waiting(&enter(&mut c, Q, 1002)), (2, 1));
        assert_eq!(waiting(&enter(&mut c, Q, 1003)), (3, 2));
        assert_eq!(
            waiting(&enter(&mut c, Q, 1001)),
            (1, 0),
            "{store}: re-enter keeps the position"
        );
        assert_eq!(waiting(&poll(&mut c, Q, 1003)), (3, 2));

        let r = leave(&mut c, Q, 1002);
        assert_eq!(r.status, 204);
        assert_eq!(r.header("content-length"), Some("0"));
        assert_eq!(leave(&mut c, Q, 1002).status, 204, "leave is idempotent");
        assert_eq!(
            waiting(&poll(&mut c, Q, 1003)),
            (3, 1),
            "{store}: rank follows the leave, seq stays"
        );
        assert_error(&poll(&mut c, Q, 1002), 404, "NOT_IN_QUEUE");
        assert_error(&poll(&mut c, Q, 5555), 404, "NOT_IN_QUEUE");
        assert_eq!(
            waiting(&enter(&mut c, Q, 1002)),
            (4, 2),
            "{store}: re-entering goes to the back"
        );
        assert_eq!(e.up.count(), 0);
    });
}

#[test]
fn fifty_concurrent_enters_of_one_user_get_one_seq() {
    both(|store| {
        let e = env(store, |_| {});
        enter(&mut e.gw.client(), Q, 1);
        let listen = e.gw.listen;
        let threads: Vec<_> = (0..50)
            .map(|_| {
                std::thread::spawn(move || waiting(&enter(&mut Client::connect(listen), Q, 77)))
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), (2, 1), "{store}");
        }
        assert_eq!(
            waiting(&enter(&mut e.gw.client(), Q, 78)),
            (3, 2),
            "{store}: no seq wasted"
        );
    });
}

#[test]
fn admitted_users_get_a_valid_token_and_keep_it() {
    both(|store| {
        let e = env(store, |c| {
            c.queue.tick_ms = 100;
            c.queue.batch_size = 2;
        });
        let mut c = e.gw.client();
        for user in 1..=3 {
            enter(&mut c, Q, user);
        }
        let mut admitted = None;
        assert!(
            wait_until(Duration::from_secs(5), || {
                let v = poll(&mut c, Q, 1).json();
                let done = v["status"] == "ADMITTED";
                if done {
                    admitted = Some(v);
                }
                done
            }),
            "{store}: user 1 was never admitted"
        );
        let v = admitted.unwrap();
        assert_eq!(v["position"], Value::Null);
        assert_eq!(v["aheadCount"], Value::Null);
        assert_eq!(v["etaSeconds"], Value::Null);
        let token = v["entryToken"].as_str().unwrap().to_string();
        let expires = v["tokenExpiresAt"].as_str().unwrap();
        assert!(expires.ends_with('Z') && expires.len() == 20, "{expires}");

        let keys = TokenKeys::new(TEST_SECRET.as_bytes(), None);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = verify(&keys, &token, now).unwrap();
        assert_eq!(claims.target_type, TargetType::LimitedDrop);
        assert_eq!((claims.target_id, claims.user_id), (42, 1));
        assert!((now + 290..=now + 301).contains(&claims.expires_at));

        // The same token on every later poll and enter.
        assert_eq!(poll(&mut c, Q, 1).json()["entryToken"], token.as_str());
        let again = enter(&mut c, Q, 1).json();
        assert_eq!(again["status"], "ADMITTED");
        assert_eq!(again["entryToken"], token.as_str());
        // Everyone gets through in time, in order.
        assert!(wait_until(Duration::from_secs(5), || poll(&mut c, Q, 3)
            .json()["status"]
            == "ADMITTED"));
        let m = e.gw.metrics();
        assert!(
            m.contains("virtual_queue_tokens_total{event=\"issued\",target=\"LIMITED_DROP:42\"}"),
            "{m}"
        );
        // The pump's counter follows its advance reply by a moment.
        let counted = wait_until(Duration::from_secs(3), || {
            e.gw.metrics()
                .contains("virtual_queue_admitted_total{target=\"LIMITED_DROP:42\"} 3")
        });
        assert!(counted, "{}", e.gw.metrics());
        assert!(
            m.contains("virtual_queue_wait_seconds_count{target=\"LIMITED_DROP:42\"} 2"),
            "{m}"
        );
    });
}

#[test]
fn capacity_answers_429() {
    both(|store| {
        let e = env(store, |c| c.queue.max_capacity = 3);
        let mut c = e.gw.client();
        for user in 1..=3 {
            waiting(&enter(&mut c, Q, user));
        }
        assert_error(&enter(&mut c, Q, 4), 429, "QUEUE_FULL");
        assert_eq!(
            waiting(&enter(&mut c, Q, 2)),
            (2, 1),
            "users already waiting are not refused"
        );
        leave(&mut c, Q, 1);
        assert_eq!(waiting(&enter(&mut c, Q, 4)), (4, 2));
    });
}

#[test]
fn the_number_of_open_queues_is_capped() {
    both(|store| {
        let e = env(store, |c| c.queue.max_active_targets = 2);
        let mut c = e.gw.client();
        waiting(&enter(&mut c, "/virtual-queues/limited-drop/1", 1));
        waiting(&enter(&mut c, "/virtual-queues/limited-drop/2", 1));
        assert_error(
            &enter(&mut c, "/virtual-queues/limited-drop/3", 1),
            429,
            "QUEUE_FULL",
        );
        waiting(&enter(&mut c, "/virtual-queues/limited-drop/2", 7));
    });
}

#[test]
fn targets_are_independent() {
    both(|store| {
        let e = env(store, |_| {});
        let mut c = e.gw.client();
        let other_drop = "/virtual-queues/limited-drop/43";
        let event = "/virtual-queues/ticketing-event/42";
        assert_eq!(waiting(&enter(&mut c, Q, 1)), (1, 0));
        assert_eq!(waiting(&enter(&mut c, Q, 2)), (2, 1));
        assert_eq!(waiting(&enter(&mut c, other_drop, 2)), (1, 0));
        assert_eq!(waiting(&enter(&mut c, event, 2)), (1, 0));
        leave(&mut c, Q, 2);
        assert_eq!(waiting(&poll(&mut c, other_drop, 2)), (1, 0));
        assert_eq!(waiting(&poll(&mut c, event, 2)), (1, 0));
        let s = c.get(&format!("{Q}/stats"), &[]).unwrap().json();
        assert_eq!(s["waitingCount"], 1);
        let s = c.get(&format!("{event}/stats"), &[]).unwrap().json();
        assert_eq!(s["waitingCount"], 1);
    });
}

#[test]
fn stats_are_cluster_figures() {
    both(|store| {
        let e = env(store, |_| {});
        let mut c = e.gw.client();
        for user in 1..=5 {
            enter(&mut c, Q, user);
        }
        let r = c.get(&format!("{Q}/stats"), &[]).unwrap();
        assert_eq!(r.status, 200);
        let v = r.json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for k in [
            "waitingCount",
            "admittedCount",
            "admissionRatePerSec",
            "avgWaitSeconds",
            "p95WaitSeconds",
        ] {
            assert!(keys.contains(&k), "{k} missing in {v}");
        }
        assert_eq!(v["waitingCount"], 5);
        assert_eq!(v["admittedCount"], 0);
    });
}

#[test]
fn every_error_code() {
    both(|store| {
        let e = env(store, |_| {});
        let mut c = e.gw.client();
        let entries = format!("{Q}/entries");
        // X-User-Id: missing, duplicate, non-numeric, zero, signed, padded.
        assert_error(
            &c.request("POST", &entries, &[], b"").unwrap(),
            400,
            "BAD_REQUEST",
        );
        assert_error(
            &c.request(
                "POST",
                &entries,
                &[("X-User-Id", "1"), ("X-User-Id", "2")],
                b"",
            )
            .unwrap(),
            400,
            "BAD_REQUEST",
        );
        for bad in ["abc", "0", "-1", "+1", "01", "1.5", "99999999999999999999"] {
            assert_error(
                &c.request("POST", &entries, &[("X-User-Id", bad)], b"")
                    .unwrap(),
                400,
                "BAD_REQUEST",
            );
        }
        // Bad target ids and malformed paths.
        for path in [
            "/virtual-queues/limited-drop/0/entries",
            "/virtual-queues/limited-drop/abc/entries",
            "/virtual-queues/limited-drop/042/entries",
            "/virtual-queues/limited-drop/-4/entries",
            "/virtual-queues/limited-drop/42/tickets",
            "/virtual-queues/limited-drop/42/entries/you",
            "/virtual-queues/limited-drop",
            "/virtual-queues",
        ] {
            assert_error(
                &c.request("POST", path, &[("X-User-Id", "1")], b"").unwrap(),
                400,
                "BAD_REQUEST",
            );
        }
        assert_error(
            &c.request(
                "POST",
                "/virtual-queues/concert/42/entries",
                &[("X-User-Id", "1")],
                b"",
            )
            .unwrap(),
            404,
            "UNKNOWN_TARGET_TYPE",
        );
        assert_error(&poll(&mut c, Q, 9), 404, "NOT_IN_QUEUE");
        for (method, path) in [
            ("GET", "/entries"),
            ("PUT", "/entries"),
            ("POST", "/entries/me"),
            ("PATCH", "/entries/me"),
            ("POST", "/stats"),
            ("DELETE", "/stats"),
        ] {
            let r = c
                .request(method, &format!("{Q}{path}"), &[("X-User-Id", "1")], b"")
                .unwrap();
            assert_error(&r, 405, "METHOD_NOT_ALLOWED");
        }
        assert_eq!(e.up.count(), 0, "no queue call reaches the backend");
    });
}

#[test]
fn nothing_under_virtual_queues_reaches_the_backend() {
    let e = env("memory", |_| {});
    // Raw: the spellings are sent byte for byte.
    let mut c = e.gw.raw();
    for path in [
        "/VIRTUAL-QUEUES/limited-drop/42/stats",
        "//virtual-queues/limited-drop/42/stats",
        "/virtual-queues/",
        "/virtual-queues/anything/else/entirely",
        "/virtual%2Dqueues/limited-drop/42/stats",
        "http://evil.example/virtual-queues/limited-drop/42/stats",
    ] {
        let r = c.get(path, &[]).unwrap();
        assert_ne!(
            r.header("x-upstream"),
            Some("recorder"),
            "{path} reached the backend"
        );
    }
    assert_eq!(e.up.count(), 0);
}

#[test]
fn flag_off_admits_directly() {
    let e = env("memory", |c| c.flag.enabled = false);
    let mut c = e.gw.client();
    let v = enter(&mut c, Q, 5).json();
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    assert_eq!(v["position"], Value::Null);
    let token = v["entryToken"].as_str().unwrap();
    let keys = TokenKeys::new(TEST_SECRET.as_bytes(), None);
    let claims = verify(&keys, token, 0).unwrap();
    assert_eq!((claims.target_id, claims.user_id), (42, 5));
    assert_eq!(poll(&mut c, Q, 5).json()["status"], "DIRECT_ADMITTED");
}

#[test]
fn stats_answer_503_while_redis_is_down_and_enter_fails_open() {
    let mut e = env("redis", |c| c.fail_open.mode = FailOpenMode::Open);
    let mut c = e.gw.client();
    waiting(&enter(&mut c, Q, 1));
    e._redis.as_mut().unwrap().kill();
    assert_error(
        &c.get(&format!("{Q}/stats"), &[]).unwrap(),
        503,
        "QUEUE_UNAVAILABLE",
    );
    let v = enter(&mut c, Q, 2).json();
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    assert!(e
        .gw
        .metrics()
        .contains("virtual_queue_redis_degraded_total{op=\"enter\"} 1"));
}
