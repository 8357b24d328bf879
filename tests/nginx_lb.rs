//! The shipped nginx-lb configuration (`docker/nginx.conf`), run with real nginx in front of two
//! gateway processes (`common::nginx`), with its addresses replaced by local ports: the user id comes from the
//! auth service only, a client's own `X-User-Id` never reaches the gateway, and purchases are not
//! retried on another replica.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::nginx::Nginx;
use common::*;

#[test]
fn the_user_id_comes_from_the_session_only() {
    let backend = Upstream::start();
    let auth = Upstream::start();
    let redis = RedisServer::start();
    let mut cfg = test_config(backend.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    let gws = [GatewayProc::start(cfg.clone()), GatewayProc::start(cfg)];
    let lb = Nginx::start(&[gws[0].listen, gws[1].listen], auth.addr);
    let mut c = Client::connect(lb.addr);
    // A session for user 1001; the client claims to be 5.
    let r = c
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("Cookie", "session=1001"), ("X-User-Id", "5")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], "WAITING");
    let r = c
        .request(
            "GET",
            "/virtual-queues/limited-drop/42/entries/me",
            &[("Cookie", "session=1001")],
            b"",
        )
        .unwrap();
    assert_eq!(r.json()["position"], 1, "the same user: the session's");
    // Polling "as the victim" by header alone: the header never arrives.
    let r = c
        .request(
            "GET",
            "/virtual-queues/limited-drop/42/entries/me",
            &[("X-User-Id", "1001")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 400, "no session, no user");
    // The backend sees the session's id, never the client's.
    let r = c
        .request(
            "GET",
            "/profile",
            &[("Cookie", "session=77"), ("X-User-Id", "5")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let r = c
        .request("GET", "/public", &[("X-User-Id", "5")], b"")
        .unwrap();
    assert_eq!(r.status, 200);
    let seen = backend.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers_named("x-user-id"), vec!["77"]);
    assert!(seen[1].headers_named("x-user-id").is_empty());
    // A rejected session goes nowhere.
    let r = c
        .request("GET", "/profile", &[("Cookie", "session=reject")], b"")
        .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(backend.count(), 2);
}

#[test]
fn a_failed_purchase_is_answered_not_sent_again() {
    // Only the queue API (whose POST is idempotent per user) may be sent to another replica
    // after it reached one; the rest of the site may not.
    let shipped = common::nginx::shipped_config();
    let site = shipped.split("location / {").nth(1).unwrap();
    let site = site.split('}').next().unwrap();
    let retry = site
        .lines()
        .find(|l| l.trim_start().starts_with("proxy_next_upstream "))
        .unwrap();
    assert!(!retry.contains("non_idempotent"), "{retry}");
    let backend = Upstream::start();
    let auth = Upstream::start();
    let mut cfg = test_config(backend.addr);
    cfg.flag.enabled = false;
    let gws = [GatewayProc::start(cfg.clone()), GatewayProc::start(cfg)];
    let lb = Nginx::start(&[gws[0].listen, gws[1].listen], auth.addr);
    // The backend fails after receiving the purchase: nginx hands that answer back and does not
    // send the POST to the other replica.
    let r = Client::connect(lb.addr)
        .request(
            "POST",
            "/limited-drops/42/orders",
            &[("Cookie", "session=9"), ("x-upstream-status", "500")],
            b"{}",
        )
        .unwrap();
    assert_eq!(r.status, 500);
    let posts = backend
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 1, "the purchase reached the backend twice");
}
