//! Which targets may have a queue: with `queue.targets = "any"` the cap on open queues is exact
//! under concurrency and empty queues stop counting; with `"registered"` only registered sales
//! have one (file or `vq-gateway target add`), and other sales' purchases pass or are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;

fn enter(gw: &GatewayProc, target: u64, user: u64) -> Response {
    gw.client()
        .request(
            "POST",
            &format!("/virtual-queues/limited-drop/{target}/entries"),
            &[("X-User-Id", &user.to_string())],
            b"",
        )
        .unwrap()
}

/// User 7 buys in sale LIMITED_DROP:2, without an entry token.
fn buy(gw: &GatewayProc) -> Response {
    gw.client()
        .request(
            "POST",
            "/limited-drops/2/orders",
            &[("X-User-Id", "7")],
            b"{}",
        )
        .unwrap()
}

fn gateway(
    redis: Option<&RedisServer>,
    tweak: impl Fn(&mut ConfigFile),
) -> (GatewayProc, Upstream) {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    if let Some(r) = redis {
        cfg.store.backend = StoreKind::Redis;
        cfg.store.redis_url = r.url();
    }
    cfg.queue.tick_ms = 100;
    tweak(&mut cfg);
    (GatewayProc::start(cfg), up)
}

#[test]
fn the_cap_on_open_queues_is_exact_under_concurrency() {
    for backend in ["memory", "redis"] {
        let redis = (backend == "redis").then(RedisServer::start);
        let (gw, _up) = gateway(redis.as_ref(), |c| {
            c.queue.max_active_targets = 50;
            // Twenty debug-build clients on two cores: no answer may degrade for slowness here.
            c.store.command_timeout_ms = 2000;
        });
        let addr = gw.listen;
        let handles: Vec<_> = (0..20u64)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    (0..10u64)
                        .map(|i| {
                            let target = 1000 + t * 10 + i;
                            c.request(
                                "POST",
                                &format!("/virtual-queues/limited-drop/{target}/entries"),
                                &[("X-User-Id", "1")],
                                b"",
                            )
                            .unwrap()
                            .status
                        })
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        let statuses: Vec<u16> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let opened = statuses.iter().filter(|s| **s == 200).count();
        let refused = statuses.iter().filter(|s| **s == 429).count();
        assert_eq!((opened, refused), (50, 150), "{backend}: {statuses:?}");
        if let Some(r) = &redis {
            assert_eq!(r.cmd(&["SCARD", "queue:active"]).as_int(), 50);
        }
        let m = gw.metrics();
        assert!(
            m.contains("outcome=\"too_many_targets\""),
            "{backend}: not counted\n{m}"
        );
        assert!(
            gw.log().contains("too many open queues"),
            "{backend}: not logged"
        );
    }
}

#[test]
fn empty_queues_stop_counting_against_the_cap() {
    for backend in ["memory", "redis"] {
        let redis = (backend == "redis").then(RedisServer::start);
        let (gw, _up) = gateway(redis.as_ref(), |c| c.queue.max_active_targets = 3);
        for t in 1..=3 {
            assert_eq!(enter(&gw, t, 1).status, 200, "{backend}");
        }
        assert_eq!(enter(&gw, 4, 1).status, 429, "{backend}: the cap holds");
        // Target 1 empties (its only user leaves): it no longer blocks a new sale.
        let r = gw
            .client()
            .request(
                "DELETE",
                "/virtual-queues/limited-drop/1/entries/me",
                &[("X-User-Id", "1")],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, 204);
        assert!(
            wait_until(Duration::from_secs(5), || enter(&gw, 4, 1).status == 200),
            "{backend}: an emptied queue still counts"
        );
        // And the cap still holds for the next one.
        assert_eq!(enter(&gw, 5, 1).status, 429, "{backend}");
    }
}

#[test]
fn only_registered_sales_have_a_queue() {
    let redis = RedisServer::start();
    let (gw, up) = gateway(Some(&redis), |c| {
        c.queue.targets = TargetsMode::Registered;
        c.queue.registered = vec!["LIMITED_DROP:1".into()];
        c.queue.unregistered_gated = UnregisteredGated::Pass;
    });
    assert_eq!(enter(&gw, 1, 7).status, 200);
    // On an empty Redis the set of registered sales is unknown (503) until a replica has waited
    // for others to write it back and created it (`settings.rs`).
    assert!(wait_until(Duration::from_secs(8), || enter(&gw, 2, 7)
        .status
        != 503));
    let r = enter(&gw, 2, 7);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["code"], "UNKNOWN_TARGET");
    let r = gw
        .client()
        .get("/virtual-queues/limited-drop/2/stats", &[])
        .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(
        redis
            .cmd(&["EXISTS", "queue:{LIMITED_DROP:2}:seq"])
            .as_int(),
        0
    );
    // An unregistered sale's purchase is not gated (`unregistered_gated = "pass"`).
    let r = buy(&gw);
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 1);
    // Ops register it at run time; every instance follows within a couple of seconds.
    let cfg_path = gw.dir.0.join("gateway.toml");
    let cfg = cfg_path.to_str().unwrap();
    let (code, out, err) = run_bin(
        &["target", "add", "--config", cfg, "LIMITED_DROP:2"],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("LIMITED_DROP:2"), "{out}");
    assert!(wait_until(Duration::from_secs(3), || enter(&gw, 2, 7)
        .status
        == 200));
    // Now its purchases need a token.
    let r = buy(&gw);
    assert_eq!(r.status, 403);
    let (code, _, _) = run_bin(
        &["target", "remove", "--config", cfg, "LIMITED_DROP:2"],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(0));
    assert!(wait_until(Duration::from_secs(3), || enter(&gw, 2, 8)
        .status
        == 404));
    let (code, _, err) = run_bin(
        &["target", "add", "--config", cfg, "LIMITED_DROP:zero"],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(64), "{err}");
}

#[test]
fn unregistered_purchases_are_refused_by_default() {
    let (gw, up) = gateway(None, |c| {
        c.queue.targets = TargetsMode::Registered;
        c.queue.registered = vec!["LIMITED_DROP:1".into()];
    });
    let r = buy(&gw);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["code"], "UNKNOWN_TARGET");
    assert_eq!(up.count(), 0);
    assert_eq!(
        enter(&gw, 1, 7).status,
        200,
        "the memory store honours the file's list"
    );
}

#[test]
fn registered_sales_are_never_let_through_before_their_list_was_read() {
    // Redis unreachable at start: `queue:targets` cannot be read, so a sale registered there is
    // neither queued nor let through ungated; once Redis answers, it is a sale like any other.
    let mut redis = RedisServer::start();
    redis.cmd(&["SADD", "queue:targets", "LIMITED_DROP:2"]);
    let port = redis.port;
    redis.kill();
    let (gw, up) = gateway(Some(&redis), |c| {
        c.queue.targets = TargetsMode::Registered;
        c.queue.unregistered_gated = UnregisteredGated::Pass;
        c.store.startup_wait_ms = 300;
    });
    let r = buy(&gw);
    assert_eq!(r.status, 503);
    assert_eq!(enter(&gw, 2, 7).status, 503);
    assert_eq!(up.count(), 0);
    // Redis (with its data) comes back.
    redis.restart();
    assert_eq!(redis.port, port);
    redis.cmd(&["SADD", "queue:targets", "LIMITED_DROP:2"]);
    assert!(wait_until(Duration::from_secs(5), || enter(&gw, 2, 7)
        .status
        == 200));
    // Without a token the purchase waits (503) while the flag is still unknown, and is refused
    // (403) once it is known: never let through.
    assert!(
        wait_until(Duration::from_secs(8), || {
            let status = buy(&gw).status;
            assert!(matches!(status, 403 | 503), "{status}");
            status == 403
        }),
        "a registered sale needs a token"
    );
    assert_eq!(up.count(), 0);
}
