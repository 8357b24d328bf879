//! The runtime queue flag (docs/operations.md#the-flag): TOML defaults, the `queue:flag` override
//! seen by every instance within 3 s, percentage rollout coherent between enter and the gate,
//! per-target overrides, and the `flag` command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use vq_gateway::flag::bucket;

const Q: &str = "/virtual-queues/limited-drop/42";

fn gateways(redis: &RedisServer, up: &Upstream, n: usize, enabled: bool) -> Vec<GatewayProc> {
    ticking_gateways(redis, up, n, enabled, 3_600_000)
}

/// `n` gateways on `redis` whose pump admits every `tick_ms`.
fn ticking_gateways(
    redis: &RedisServer,
    up: &Upstream,
    n: usize,
    enabled: bool,
    tick_ms: u64,
) -> Vec<GatewayProc> {
    let gws: Vec<GatewayProc> = (0..n)
        .map(|_| {
            let mut cfg = test_config(up.addr);
            cfg.store.backend = StoreKind::Redis;
            cfg.store.redis_url = redis.url();
            cfg.queue.tick_ms = tick_ms;
            cfg.flag.enabled = enabled;
            GatewayProc::start(cfg)
        })
        .collect();
    if !enabled {
        // On an empty Redis the flag is unknown (everyone queues) until a replica has waited for
        // others to write it back and created it from its file (`settings.rs`).
        for gw in &gws {
            let mut c = gw.client();
            assert!(
                wait_until(Duration::from_secs(8), || status_of(&mut c, Q, PROBE)
                    == "DIRECT_ADMITTED"),
                "the file's flag never took effect"
            );
        }
    }
    gws
}

/// A user only the set-up uses.
const PROBE: u64 = 999_999;

fn status_of(c: &mut Client, path: &str, user: u64) -> String {
    let r = c
        .request(
            "POST",
            &format!("{path}/entries"),
            &[("X-User-Id", &user.to_string())],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["status"].as_str().unwrap().to_string()
}

fn flag_cmd(gw: &GatewayProc, args: &[&str]) -> (Option<i32>, String) {
    let path = gw.dir.0.join("gateway.toml");
    let mut all = vec!["flag"];
    all.extend_from_slice(&args[..1]);
    all.extend_from_slice(&["--config", path.to_str().unwrap()]);
    all.extend_from_slice(&args[1..]);
    let (code, out, err) = run_bin(&all, &[], Duration::from_secs(15));
    (code, out + &err)
}

#[test]
fn toml_default_decides_without_redis_overrides() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let on = gateways(&redis, &up, 1, true);
    assert_eq!(status_of(&mut on[0].client(), Q, 1), "WAITING");
    let redis2 = RedisServer::start();
    let off = gateways(&redis2, &up, 1, false);
    assert_eq!(status_of(&mut off[0].client(), Q, 1), "DIRECT_ADMITTED");
    // The file's values were written into Redis with a version: every replica reads the same.
    assert_eq!(
        redis2
            .cmd(&["HGET", "queue:flag", "enabled"])
            .as_str()
            .as_deref(),
        Some("off")
    );
    assert_eq!(
        redis2
            .cmd(&["HGET", "{queue:flag}:meta", "version"])
            .as_str()
            .as_deref(),
        Some("1")
    );
}

/// A flag hash without a version (written by hand, or by an older gateway) is used at once and
/// given one.
#[test]
fn an_unversioned_flag_is_adopted_and_stamped() {
    let redis = RedisServer::start();
    redis.cmd(&["HSET", "queue:flag", "enabled", "off"]);
    let up = Upstream::start();
    let gws = gateways(&redis, &up, 1, true);
    assert_eq!(status_of(&mut gws[0].client(), Q, 1), "DIRECT_ADMITTED");
    assert!(wait_until(Duration::from_secs(3), || redis
        .cmd(&["HGET", "{queue:flag}:meta", "version"])
        .as_str()
        .is_some()));
}

#[test]
fn a_change_in_redis_reaches_every_instance_within_3s() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = gateways(&redis, &up, 2, false);
    for gw in &gws {
        assert_eq!(status_of(&mut gw.client(), Q, 1), "DIRECT_ADMITTED");
    }
    let (code, out) = flag_cmd(&gws[0], &["set", "--enabled", "on"]);
    assert_eq!(code, Some(0), "{out}");
    let started = Instant::now();
    for (i, gw) in gws.iter().enumerate() {
        let mut c = gw.client();
        assert!(
            wait_until(Duration::from_secs(3), || status_of(
                &mut c,
                Q,
                10 + i as u64
            ) == "WAITING"),
            "instance {i} never turned on"
        );
    }
    let on_after = started.elapsed();
    // Waiting users' next poll is DIRECT_ADMITTED once the queue is switched off again.
    let (code, out) = flag_cmd(&gws[1], &["set", "--enabled", "off"]);
    assert_eq!(code, Some(0), "{out}");
    let started = Instant::now();
    for gw in &gws {
        let mut c = gw.client();
        assert!(wait_until(Duration::from_secs(3), || {
            c.get(&format!("{Q}/entries/me"), &[("X-User-Id", "10")])
                .unwrap()
                .json()["status"]
                == "DIRECT_ADMITTED"
        }));
    }
    let off_after = started.elapsed();
    assert!(on_after < Duration::from_secs(3) && off_after < Duration::from_secs(3));
    eprintln!("flag on seen by both instances after {on_after:?}, off after {off_after:?}");
    let (code, out) = flag_cmd(&gws[0], &["show"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("enabled: off"), "{out}");
}

#[test]
fn rollout_is_coherent_between_enter_and_gate() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = gateways(&redis, &up, 1, true);
    let gw = &gws[0];
    for percent in [0u8, 50, 100] {
        let (code, out) = flag_cmd(gw, &["set", "--rollout", &percent.to_string()]);
        assert_eq!(code, Some(0), "{out}");
        let mut c = gw.client();
        // Wait for this instance to pick the value up: a fresh user whose bucket only this
        // percentage (not the previous one) puts in the queue, or keeps out of it at 0 %.
        let fresh = 10_000 * (u64::from(percent) + 1);
        let (probe, expect_probe) = match percent {
            0 => (fresh, "DIRECT_ADMITTED"),
            50 => ((fresh..).find(|u| bucket(*u) < 50).unwrap(), "WAITING"),
            _ => ((fresh..).find(|u| bucket(*u) >= 50).unwrap(), "WAITING"),
        };
        assert!(
            wait_until(Duration::from_secs(3), || status_of(&mut c, Q, probe)
                == expect_probe),
            "{percent}%"
        );
        up.clear();
        let mut queued = 0;
        for user in 1..=100u64 {
            let user = user + u64::from(percent) * 1000;
            let in_queue = bucket(user) < percent;
            let status = status_of(&mut c, Q, user);
            assert_eq!(
                status == "WAITING",
                in_queue,
                "{percent}%: user {user} enter said {status}"
            );
            queued += u64::from(in_queue);
            // The gate decides alike: queued users need a token, the others pass without one.
            let r = c
                .request(
                    "POST",
                    "/limited-drops/42/orders",
                    &[("X-User-Id", &user.to_string())],
                    b"{}",
                )
                .unwrap();
            let expect = if in_queue { 403 } else { 200 };
            assert_eq!(r.status, expect, "{percent}%: user {user} at the gate");
        }
        assert_eq!(up.count() as u64, 100 - queued);
        match percent {
            0 => assert_eq!(queued, 0),
            100 => assert_eq!(queued, 100),
            _ => assert!((30..=70).contains(&queued), "{queued}"),
        }
    }
}

#[test]
fn a_per_target_override_turns_one_sale_on() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = gateways(&redis, &up, 1, false);
    let (code, out) = flag_cmd(
        &gws[0],
        &["set", "--enabled", "on", "--target", "LIMITED_DROP:42"],
    );
    assert_eq!(code, Some(0), "{out}");
    let mut c = gws[0].client();
    assert!(wait_until(Duration::from_secs(3), || status_of(
        &mut c, Q, 1
    ) == "WAITING"));
    assert_eq!(
        status_of(&mut c, "/virtual-queues/limited-drop/43", 1),
        "DIRECT_ADMITTED"
    );
    assert_eq!(
        status_of(&mut c, "/virtual-queues/ticketing-event/42", 1),
        "DIRECT_ADMITTED"
    );
}

#[test]
fn the_flag_command_explains_what_it_cannot_do() {
    let up = Upstream::start();
    let gw = GatewayProc::start(test_config(up.addr)); // memory store
    let (code, out) = flag_cmd(&gw, &["set", "--enabled", "on"]);
    assert_eq!(code, Some(64));
    assert!(out.contains("memory"), "{out}");

    let mut redis = RedisServer::start();
    let gws = gateways(&redis, &up, 1, false);
    for bad in [
        vec!["set"],
        vec!["set", "--rollout", "101"],
        vec!["set", "--enabled", "maybe"],
        vec!["set", "--target", "LIMITED_DROP:42"],
        vec!["set", "--enabled", "on", "--target", "CONCERT:1"],
        vec![
            "set",
            "--enabled",
            "on",
            "--target",
            "LIMITED_DROP:42",
            "--rollout",
            "5",
        ],
    ] {
        let (code, out) = flag_cmd(&gws[0], &bad);
        assert_ne!(code, Some(0), "{bad:?}: {out}");
        assert!(!out.is_empty());
    }
    redis.kill();
    let started = Instant::now();
    let (code, out) = flag_cmd(&gws[0], &["show"]);
    assert_eq!(code, Some(69), "{out}");
    assert!(out.contains("cannot reach Redis"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn bad_fields_in_the_hash_keep_the_default() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = gateways(&redis, &up, 1, true);
    redis.cmd(&[
        "HSET",
        "queue:flag",
        "enabled",
        "maybe",
        "rollout_percent",
        "250",
    ]);
    // The refresh has read the bad fields once it complains about them...
    assert!(wait_until(Duration::from_secs(3), || gws[0]
        .log()
        .contains("ignoring a bad runtime flag field")));
    // ...and the TOML default (on, 100 %) still decides.
    assert_eq!(status_of(&mut gws[0].client(), Q, 5), "WAITING");
}

/// POSTs an order for `user` with `token` to `gw`.
fn order(gw: &GatewayProc, user: u64, token: &str) -> Response {
    gw.client()
        .request(
            "POST",
            "/limited-drops/42/orders",
            &[
                ("X-User-Id", &user.to_string()),
                ("X-Entry-Token", token),
                ("Content-Type", "application/json"),
            ],
            br#"{"quantity":1}"#,
        )
        .unwrap()
}

/// Enters `user` and polls until the queue admits it; its token.
fn admitted_token(gw: &GatewayProc, user: u64) -> String {
    let mut c = gw.client();
    let id = user.to_string();
    assert_eq!(status_of(&mut c, Q, user), "WAITING");
    let mut token = None;
    assert!(wait_until(Duration::from_secs(5), || {
        let v = c
            .get(&format!("{Q}/entries/me"), &[("X-User-Id", &id)])
            .unwrap()
            .json();
        token = v["entryToken"].as_str().map(String::from);
        token.is_some()
    }));
    token.unwrap()
}

/// Tokens handed out while the queue let users straight through (flag off: a new one every
/// second for the asking) do not pass the gate once the queue is on: only the token the queue
/// holds for the user does, even when it was issued before a later flag change.
#[test]
fn tokens_handed_out_before_the_queue_opened_do_not_pass_it() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = ticking_gateways(&redis, &up, 2, false, 200);
    // Flag off: straight through, with a token from either replica.
    let direct = |gw: &GatewayProc, user: u64| {
        let r = gw
            .client()
            .request(
                "POST",
                &format!("{Q}/entries"),
                &[("X-User-Id", &user.to_string())],
                b"",
            )
            .unwrap();
        assert_eq!(r.json()["status"], "DIRECT_ADMITTED");
        r.json()["entryToken"].as_str().unwrap().to_string()
    };
    let stockpiled = [direct(&gws[0], 5), direct(&gws[1], 5), direct(&gws[0], 9)];

    let (code, out) = flag_cmd(&gws[0], &["set", "--enabled", "on"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("queued_since="), "{out}");
    for (i, gw) in gws.iter().enumerate() {
        let mut c = gw.client();
        assert!(wait_until(Duration::from_secs(3), || status_of(
            &mut c,
            Q,
            100 + i as u64
        ) == "WAITING"));
    }
    let (_, shown) = flag_cmd(&gws[1], &["show"]);
    assert!(shown.contains("queued since:"), "{shown}");
    for (gw, (user, token)) in gws.iter().cycle().zip([
        (5, &stockpiled[0]),
        (5, &stockpiled[1]),
        (9, &stockpiled[2]),
    ]) {
        let r = order(gw, user, token);
        assert_eq!(r.status, 403, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["code"], "QUEUE_BYPASS_DENIED");
    }
    assert_eq!(
        up.count(),
        0,
        "a token from before the queue opened reached the backend"
    );
    assert!(gws[0].metrics().contains("reason=\"issued_before_queue\""));

    // The queue's own tokens pass, issued right after the change (checked against the store)...
    let fresh = admitted_token(&gws[0], 21);
    assert_eq!(order(&gws[1], 21, &fresh).status, 200);
    // ...and issued before a later change that turns the queue on for more users.
    let before = admitted_token(&gws[1], 22);
    let (code, out) = flag_cmd(&gws[0], &["set", "--rollout", "100"]);
    assert_eq!(code, Some(0), "{out}");
    // Both replicas took the new queued_since (the rollout was 100 already).
    for gw in &gws {
        assert!(wait_until(Duration::from_secs(3), || gw
            .log()
            .matches("runtime flag changed")
            .count()
            >= 2));
    }
    assert_eq!(order(&gws[0], 22, &before).status, 200);
    // The stockpiled tokens still do not.
    assert_eq!(order(&gws[1], 5, &stockpiled[0]).status, 403);
    assert_eq!(up.count(), 2);
}
