//! The shipped nginx-lb configuration (`docker/nginx.conf`), run with real nginx in front of two
//! gateway processes (`common::nginx`), with its addresses replaced by local ports: the user id comes from the
//! auth service only, a client's own `X-User-Id` never reaches the gateway, and purchases are not
//! retried on another replica.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::nginx::Nginx;
use common::*;

/// Two replicas of one configuration, each on its own ports.
fn two(cfg: ConfigFile) -> [GatewayProc; 2] {
    let mut other = cfg.clone();
    other.server.listen = format!("127.0.0.1:{}", free_port());
    other.server.admin_listen = format!("127.0.0.1:{}", free_port());
    [GatewayProc::start(cfg), GatewayProc::start(other)]
}

#[test]
fn the_user_id_comes_from_the_session_only() {
    let backend = Upstream::start();
    let auth = Upstream::start();
    let redis = RedisServer::start();
    let mut cfg = test_config(backend.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    let gws = two(cfg);
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
    let gws = two(cfg);
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

/// The gateway process with a connection established to `backend` (the one forwarding a
/// purchase now), as `ss` (iproute2) reports the sockets' processes.
fn forwarding(gws: &[GatewayProc], backend: std::net::SocketAddr) -> Option<usize> {
    let out = std::process::Command::new("ss")
        .args(["-Htnp", "state", "established", "dst", &backend.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    gws.iter()
        .position(|g| text.contains(&format!("pid={},", g.pid())))
}

/// A purchase in flight on a replica that is SIGKILLed: nginx answers 502 and does not send the
/// POST again; the claim the dead replica held lapses with its lease, and the user's retry
/// through nginx (another replica) buys with the same token.
#[test]
fn a_purchase_in_flight_on_a_killed_replica_is_tried_again_through_nginx() {
    let backend = Upstream::start();
    let auth = Upstream::start();
    let redis = RedisServer::start();
    // Each replica on its own ports (`test_config` picks them).
    let config = || {
        let mut cfg = test_config(backend.addr);
        cfg.store.backend = StoreKind::Redis;
        cfg.store.redis_url = redis.url();
        cfg.queue.tick_ms = 200;
        cfg
    };
    let mut gws = vec![GatewayProc::start(config()), GatewayProc::start(config())];
    for gw in &gws {
        gw.wait_flag_known();
    }
    let lb = Nginx::start(&[gws[0].listen, gws[1].listen], auth.addr);
    let mut c = Client::connect(lb.addr);
    let session = [("Cookie", "session=9")];
    let r = c
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &session,
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let mut token = None;
    assert!(wait_until(std::time::Duration::from_secs(10), || {
        let r = c
            .request(
                "GET",
                "/virtual-queues/limited-drop/42/entries/me",
                &session,
                b"",
            )
            .unwrap();
        token = r.json()["entryToken"].as_str().map(str::to_string);
        token.is_some()
    }));
    let token = token.unwrap();
    let buy = |extra: &[(&str, &str)]| {
        let mut h = vec![("Cookie", "session=9"), ("X-Entry-Token", token.as_str())];
        h.extend_from_slice(extra);
        Client::connect(lb.addr)
            .request("POST", "/limited-drops/42/orders", &h, b"{}")
            .unwrap()
            .status
    };
    // The backend takes 8 s over this purchase; its replica dies meanwhile. (The first request
    // to the backend: the only gateway with a connection to it is the one forwarding it.)
    let first = {
        std::thread::scope(|s| {
            let sent = common::load::epoch_ms();
            let h = s.spawn(move || buy(&[("x-upstream-delay-ms", "8000")]));
            let mut victim = None;
            let found = wait_until(std::time::Duration::from_secs(5), || {
                victim = forwarding(&gws, backend.addr);
                victim.is_some()
            });
            assert!(
                found,
                "no replica forwarding the purchase: gateways {:?}, sent at {sent} ms, the backend got it at {:?}",
                gws.iter().map(|g| g.pid()).collect::<Vec<_>>(),
                backend.requests().iter().map(|r| r.at_ms).collect::<Vec<_>>()
            );
            let victim = victim.unwrap();
            gws[victim].signal("KILL");
            let _ = gws[victim].wait_exit(std::time::Duration::from_secs(5));
            (victim, h.join().unwrap())
        })
    };
    let (victim, status) = first;
    assert_eq!(status, 502, "nginx answers the lost purchase");
    gws.remove(victim);
    let killed = std::time::Instant::now();
    // The retry reaches the other replica: refused while the dead replica's claim may still be
    // in flight, then it buys.
    let mut statuses = Vec::new();
    let bought = wait_until(std::time::Duration::from_secs(12), || {
        let s = buy(&[]);
        statuses.push(s);
        if s != 200 {
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        s == 200
    });
    assert!(
        bought,
        "the retry never bought: {statuses:?}\n{}",
        gws[0].log()
    );
    eprintln!(
        "retry bought {} ms after the kill: {statuses:?}",
        killed.elapsed().as_millis()
    );
    assert!(
        killed.elapsed() <= std::time::Duration::from_secs(7),
        "{statuses:?}"
    );
    // Refused while the claim may be in flight, or 502 where nginx tried the dead replica under
    // both of its names (this test maps three upstream names onto two replicas).
    assert!(
        statuses.iter().all(|s| [200, 403, 502].contains(s)),
        "{statuses:?}"
    );
    // One token still buys once; the backend saw the lost purchase and the retry only.
    assert_eq!(buy(&[]), 403);
    let posts = backend
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 2);
}
