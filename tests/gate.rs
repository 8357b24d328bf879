//! The entry-token gate over HTTP (docs/security.md) with a recording backend: what reaches a gated
//! handler, and what never does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

const ORDERS: &str = "/limited-drops/42/orders";
const OLD_SECRET: &str = "old-secret-abcdefghijklmnopqrstuvwxyz-0123";

fn valid(user: u64) -> String {
    token_for(
        TEST_SECRET,
        &format!("LIMITED_DROP|42|{user}|{}", now_s() + 200),
    )
}

fn env(tweak: impl Fn(&mut ConfigFile)) -> (GatewayProc, Upstream) {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.queue.tick_ms = 3_600_000;
    tweak(&mut cfg);
    (GatewayProc::start(cfg), up)
}

fn buy(
    c: &mut impl Http,
    path: &str,
    user: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
) -> Response {
    let mut h: Vec<(&str, &str)> = vec![("X-User-Id", user), ("Content-Type", "application/json")];
    if let Some(t) = token {
        h.push(("X-Entry-Token", t));
    }
    h.extend_from_slice(extra);
    c.request("POST", path, &h, br#"{"quantity":1}"#).unwrap()
}

fn assert_denied(r: &Response, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["code"], code);
    assert_ne!(r.header("x-upstream"), Some("recorder"));
}

#[test]
fn a_valid_token_goes_through_once_with_the_body_and_without_the_token() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    let token = valid(1001);
    let r = buy(&mut c, ORDERS, "1001", Some(&token), &[]);
    assert_eq!(r.status, 200);
    let seen = up.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].target, ORDERS);
    assert_eq!(seen[0].body, br#"{"quantity":1}"#);
    assert_eq!(seen[0].header("x-user-id"), Some("1001"));
    assert_eq!(
        seen[0].header("x-entry-token"),
        None,
        "the token must not reach the backend"
    );
    assert!(!gw.log().contains(&token), "the token leaked into the log");
    let m = gw.metrics();
    assert!(
        m.contains("virtual_queue_tokens_total{event=\"consumed\",target=\"LIMITED_DROP:42\"} 1"),
        "{m}"
    );
}

#[test]
fn every_bad_token_is_refused_and_the_backend_sees_nothing() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    let t = now_s();
    let good = valid(1001);
    // One MAC character changed: the first, since the last carries only 2 bits and most of its
    // other spellings are not valid base64 (that would be "malformed", a quarter of the runs).
    let mut mutated = good.clone().into_bytes();
    let first = good.find('.').unwrap() + 1;
    mutated[first] = if mutated[first] == b'A' { b'B' } else { b'A' };
    let mutated = String::from_utf8(mutated).unwrap();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("missing", String::new(), 403, "missing_token"),
        ("mutated", mutated, 403, "bad_signature"),
        (
            "wrong secret",
            token_for(OLD_SECRET, &format!("LIMITED_DROP|42|1001|{}", t + 200)),
            403,
            "bad_signature",
        ),
        (
            "expired",
            token_for(TEST_SECRET, &format!("LIMITED_DROP|42|1001|{}", t - 1)),
            403,
            "expired",
        ),
        (
            "wrong type",
            token_for(TEST_SECRET, &format!("TICKETING_EVENT|42|1001|{}", t + 200)),
            403,
            "wrong_target",
        ),
        (
            "wrong id",
            token_for(TEST_SECRET, &format!("LIMITED_DROP|43|1001|{}", t + 200)),
            403,
            "wrong_target",
        ),
        (
            "wrong user",
            token_for(TEST_SECRET, &format!("LIMITED_DROP|42|1002|{}", t + 200)),
            403,
            "wrong_user",
        ),
        (
            "far future",
            token_for(TEST_SECRET, &format!("LIMITED_DROP|42|1001|{}", t + 86_400)),
            403,
            "expiry_too_far",
        ),
        (
            "extra field",
            token_for(TEST_SECRET, &format!("LIMITED_DROP|42|1001|{}|x", t + 200)),
            403,
            "malformed",
        ),
        ("padded", format!("{good}="), 403, "malformed"),
        ("garbage", "not-a-token".into(), 403, "malformed"),
        ("oversized", "A".repeat(20_000), 400, "token_too_long"),
    ];
    for (name, token, status, reason) in &cases {
        let tok = (!token.is_empty()).then_some(token.as_str());
        let r = buy(&mut c, ORDERS, "1001", tok, &[]);
        let code = if *status == 403 {
            "QUEUE_BYPASS_DENIED"
        } else {
            "BAD_REQUEST"
        };
        assert_eq!(
            r.status,
            *status,
            "{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["code"], code, "{name}");
        let m = gw.metrics();
        assert!(
            m.contains(&format!("virtual_queue_bypass_attempts_total{{reason=\"{reason}\",route=\"/limited-drops/{{id}}/orders\"}}")),
            "{name}: reason {reason} not counted"
        );
    }
    // Header hygiene.
    assert_denied(
        &c.request("POST", ORDERS, &[("X-Entry-Token", &good)], b"")
            .unwrap(),
        400,
        "BAD_REQUEST",
    );
    assert_denied(
        &buy(
            &mut c,
            ORDERS,
            "1001",
            Some(&good),
            &[("X-User-Id", "1001")],
        ),
        400,
        "BAD_REQUEST",
    );
    assert_denied(
        &buy(
            &mut c,
            ORDERS,
            "1001",
            Some(&good),
            &[("X-Entry-Token", &good)],
        ),
        400,
        "BAD_REQUEST",
    );
    assert_eq!(up.count(), 0, "a refused request reached the backend");
    // And the good one still works afterwards.
    assert_eq!(buy(&mut c, ORDERS, "1001", Some(&good), &[]).status, 200);
}

#[test]
fn no_path_spelling_reaches_a_gated_handler_without_a_token() {
    let (gw, up) = env(|_| {});
    // Raw: every spelling is sent byte for byte, as an attacker would.
    let mut c = gw.raw();
    let corpus = [
        "/limited-drops/42/orders/",
        "//limited-drops/42/orders",
        "/limited-drops//42/orders",
        "/LIMITED-DROPS/42/ORDERS",
        "/Limited-Drops/42/Orders/",
        "/limited-drops/%34%32/orders",
        "/limited-drops/4%32/orders",
        "/limited%2ddrops/42/orders",
        "/limited-drops/42/%6Frders",
        "/limited-drops/042/orders",
        "/limited-drops/+42/orders",
        "/limited-drops/42%2Forders",
        "/limited-drops%2F42/orders",
        "/limited-drops/42/orders%2F",
        "/limited-drops/%2e%2e/limited-drops/42/orders",
        "/limited-drops/41/../42/orders",
        "/limited-drops/41/%2e%2e/42/orders",
        "/limited-drops/42/./orders",
        "/limited-drops/42/orders/.",
        "/limited-drops/42;x=1/orders",
        "/limited-drops/42/orders;jsessionid=abc",
        "/limited-drops/42/orders%3B",
        "/limited-drops/%2531%2532/orders",
        "/limited-drops/42/orders%00",
        "/limited-drops/42/orders%5C",
        "/limited-drops/42/orders?x=1",
        "/limited-drops/42/orders#frag",
        "http://backend.internal/limited-drops/42/orders",
        "http://gateway.test/limited-drops/42/orders",
        "http://gateway.test/limited-drops/%34%32/orders/",
        "HTTP://gateway.test//limited-drops/42/orders/",
        "/limited-drops/42/orders%C3%A9",
        "/limited-drops/00000000000000000000042/orders",
        "/events/7/seats/select",
        "/EVENTS/7/Seats/Select/",
        "/events/%37/seats/select",
    ];
    for path in corpus {
        let r = buy(&mut c, path, "1001", None, &[]);
        assert!(matches!(r.status, 400 | 403), "{path}: {}", r.status);
        assert_ne!(
            r.header("x-upstream"),
            Some("recorder"),
            "{path} reached the backend"
        );
    }
    // Raw bytes the client library would not send.
    for raw in [
        &b"POST /limited-drops/42\\orders HTTP/1.1\r\nHost: x\r\nX-User-Id: 1\r\nContent-Length: 0\r\n\r\n"[..],
        b"POST /limited-drops/42/orders\t HTTP/1.1\r\nHost: x\r\nX-User-Id: 1\r\nContent-Length: 0\r\n\r\n",
        b"POST /limited-drops/42/orders HTTP/1.0\r\nX-User-Id: 1\r\nContent-Length: 0\r\n\r\n",
    ] {
        let mut c = gw.raw();
        if let Ok(r) = c.send_raw(raw, false) {
            assert!(r.status >= 400, "{}: {}", String::from_utf8_lossy(raw), r.status);
        }
    }
    // Method-override headers on a gated path, whatever the method.
    let good = valid(1001);
    for (method, header) in [
        ("POST", "X-HTTP-Method-Override"),
        ("GET", "X-HTTP-Method-Override"),
        ("PUT", "X-Method-Override"),
        ("GET", "X-HTTP-Method"),
    ] {
        let r = c
            .request(
                method,
                ORDERS,
                &[
                    ("X-User-Id", "1001"),
                    ("X-Entry-Token", &good),
                    (header, "POST"),
                ],
                b"",
            )
            .unwrap();
        assert_denied(&r, 400, "BAD_REQUEST");
    }
    assert_eq!(up.count(), 0, "{:?}", up.requests());
}

#[test]
fn a_valid_token_with_an_odd_spelling_reaches_the_canonical_path() {
    let (gw, up) = env(|_| {});
    // Raw: a client library would normalise these spellings before sending them.
    let mut c = gw.raw();
    // One token for both requests (minting twice could straddle a second and differ).
    let token = valid(1001);
    let r = buy(
        &mut c,
        "//LIMITED-DROPS/%34%32/orders/?ref=app",
        "1001",
        Some(&token),
        &[],
    );
    assert_eq!(r.status, 200);
    let r = buy(
        &mut c,
        "http://gateway.test/limited-drops/%34%32/orders",
        "1001",
        Some(&token),
        &[],
    );
    assert_eq!(
        r.status,
        403,
        "a token is single use: {}",
        String::from_utf8_lossy(&r.body)
    );
    // An id with a leading zero is not sale 42 to the gate, as it is not to the queue API.
    let r = buy(
        &mut c,
        "/limited-drops/042/orders",
        "1001",
        Some(&valid(1001)),
        &[],
    );
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let t43 = token_for(
        TEST_SECRET,
        &format!("LIMITED_DROP|43|1001|{}", now_s() + 200),
    );
    let r = buy(
        &mut c,
        "http://gateway.test/limited-drops/43/orders?a=b",
        "1001",
        Some(&t43),
        &[],
    );
    assert_eq!(r.status, 200);
    // Already canonical: it goes as it came (no rebuilt URI).
    let t44 = token_for(
        TEST_SECRET,
        &format!("LIMITED_DROP|44|1001|{}", now_s() + 200),
    );
    let r = buy(&mut c, "/limited-drops/44/orders", "1001", Some(&t44), &[]);
    assert_eq!(r.status, 200);
    let seen: Vec<String> = up.requests().into_iter().map(|r| r.target).collect();
    // Origin-form, canonical path, query kept.
    assert_eq!(
        seen,
        vec![
            "/limited-drops/42/orders?ref=app",
            "/limited-drops/43/orders?a=b",
            "/limited-drops/44/orders"
        ]
    );
}

#[test]
fn ungated_routes_pass_untouched() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    for (method, path) in [
        ("POST", "/events/7/seats/purchase"),
        ("GET", "/limited-drops/42/orders"),
        ("GET", "/events/7/seats/select"),
        ("POST", "/limited-drops/42"),
        ("DELETE", "/limited-drops/42/orders"),
    ] {
        let r = c.request(method, path, &[("X-User-Id", "5")], b"").unwrap();
        assert_eq!(r.status, 200, "{method} {path}");
    }
    let seen: Vec<String> = up
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.target))
        .collect();
    assert_eq!(
        seen,
        vec![
            "POST /events/7/seats/purchase",
            "GET /limited-drops/42/orders",
            "GET /events/7/seats/select",
            "POST /limited-drops/42",
            "DELETE /limited-drops/42/orders",
        ]
    );
}

#[test]
fn single_use_and_release_when_the_backend_refuses() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    let token = valid(1001);
    // The backend failed it: the claim is given back and the user can retry.
    let r = buy(
        &mut c,
        ORDERS,
        "1001",
        Some(&token),
        &[("x-upstream-status", "503")],
    );
    assert_eq!(r.status, 503);
    let r = buy(&mut c, ORDERS, "1001", Some(&token), &[]);
    assert_eq!(r.status, 200);
    // Used once successfully: a replay is refused.
    let r = buy(&mut c, ORDERS, "1001", Some(&token), &[]);
    assert_denied(&r, 403, "QUEUE_BYPASS_DENIED");
    assert_eq!(up.count(), 2);
    assert!(gw.metrics().contains("reason=\"already_used\""));
}

#[test]
fn an_interim_100_continue_does_not_give_the_claim_back() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    let token = valid(1001);
    let r = buy(
        &mut c,
        ORDERS,
        "1001",
        Some(&token),
        &[("x-upstream-continue", "1")],
    );
    assert_eq!(r.status, 200);
    let mut c = gw.client();
    assert_denied(
        &buy(&mut c, ORDERS, "1001", Some(&token), &[]),
        403,
        "QUEUE_BYPASS_DENIED",
    );
    assert_eq!(up.count(), 1);
}

#[test]
fn a_client_that_hangs_up_after_sending_keeps_its_token_used() {
    let (gw, up) = env(|_| {});
    let token = valid(1001);
    let req = format!(
        "POST {ORDERS} HTTP/1.1\r\nHost: gateway.test\r\nX-User-Id: 1001\r\nX-Entry-Token: {token}\r\nx-upstream-delay-ms: 300\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let mut s = std::net::TcpStream::connect(gw.listen).unwrap();
    std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
    let reached = wait_until(std::time::Duration::from_secs(3), || up.count() == 1);
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    assert!(reached, "the request never reached the backend");
    // Wait until the gateway has finished with the abandoned request (its access line).
    let finished = wait_until(std::time::Duration::from_secs(5), || {
        gw.log().contains("route_class=\"gated\"")
    });
    assert!(finished, "{}", gw.log());
    let r = buy(&mut gw.client(), ORDERS, "1001", Some(&token), &[]);
    assert_denied(&r, 403, "QUEUE_BYPASS_DENIED");
    assert_eq!(up.count(), 1, "the backend acted on one token twice");
}

#[test]
fn protocol_upgrades_other_than_websocket_are_refused() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    let r = c
        .request(
            "GET",
            "/",
            &[
                ("Upgrade", "h2c"),
                ("Connection", "Upgrade, HTTP2-Settings"),
                ("HTTP2-Settings", "AAMAAABkAAQAAP__"),
            ],
            b"",
        )
        .unwrap();
    assert_denied(&r, 400, "BAD_REQUEST");
    assert_eq!(up.count(), 0);
}

#[test]
fn absolute_form_reaches_the_backend_in_origin_form() {
    let (gw, up) = env(|_| {});
    let r = gw
        .raw()
        .get("http://gateway.test/products/%31?x=1", &[])
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(up.requests()[0].target, "/products/1?x=1");
}

#[test]
fn single_use_can_be_switched_off() {
    let (gw, up) = env(|c| c.token.single_use = false);
    let mut c = gw.client();
    let token = valid(7);
    for _ in 0..3 {
        assert_eq!(buy(&mut c, ORDERS, "7", Some(&token), &[]).status, 200);
    }
    assert_eq!(up.count(), 3);
}

#[test]
fn single_use_holds_across_instances_on_redis() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = (0..2)
        .map(|_| {
            let mut cfg = test_config(up.addr);
            cfg.store.backend = StoreKind::Redis;
            cfg.store.redis_url = redis.url();
            GatewayProc::start(cfg)
        })
        .collect();
    // On an empty Redis the flag is unknown for a few seconds: every token is then checked
    // against the store's (`settings.rs`).
    for gw in &gws {
        gw.wait_flag_known();
    }
    let token = valid(9);
    assert_eq!(
        buy(&mut gws[0].client(), ORDERS, "9", Some(&token), &[]).status,
        200
    );
    assert_denied(
        &buy(&mut gws[1].client(), ORDERS, "9", Some(&token), &[]),
        403,
        "QUEUE_BYPASS_DENIED",
    );
    assert_eq!(up.count(), 1);
}

/// A token used just before it expires stays claimed for the clock difference the gate allows
/// between instances (60 s): a replica whose clock is behind still takes it until then.
#[test]
fn a_claim_outlives_its_token_by_the_clock_skew_allowance() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    let gw = GatewayProc::start(cfg);
    gw.wait_flag_known();
    let token = token_for(TEST_SECRET, &format!("LIMITED_DROP|42|9|{}", now_s() + 3));
    assert_eq!(
        buy(&mut gw.client(), ORDERS, "9", Some(&token), &[]).status,
        200
    );
    let keys = redis.cmd(&["KEYS", "*used*"]).as_vec();
    assert_eq!(keys.len(), 1, "one claim");
    let key = keys[0].as_str().unwrap();
    let ttl_ms = redis.cmd(&["PTTL", &key]).as_int();
    // 2-3 s of the token's life left, plus the 60 s allowance.
    assert!((61_000..=63_000).contains(&ttl_ms), "claim TTL {ttl_ms} ms");
}

#[test]
fn rotation_accepts_the_previous_secret_for_verification_only() {
    let up = Upstream::start();
    let cfg = test_config(up.addr);
    let gw = GatewayProc::start_with_env(
        cfg,
        &[
            ("VQ_TOKEN_SECRET", TEST_SECRET),
            ("VQ_TOKEN_SECRET_PREVIOUS", OLD_SECRET),
        ],
    );
    let mut c = gw.client();
    let old = token_for(OLD_SECRET, &format!("LIMITED_DROP|42|5|{}", now_s() + 100));
    assert_eq!(buy(&mut c, ORDERS, "5", Some(&old), &[]).status, 200);
    let new = valid(6);
    assert_eq!(buy(&mut c, ORDERS, "6", Some(&new), &[]).status, 200);
    // New tokens are signed with the current secret.
    let v = c
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("X-User-Id", "8")],
            b"",
        )
        .unwrap()
        .json();
    assert_eq!(v["status"], "WAITING");
    let (gw2, _up2) = env(|c| c.flag.enabled = false);
    let v = gw2
        .client()
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("X-User-Id", "8")],
            b"",
        )
        .unwrap()
        .json();
    let t = v["entryToken"].as_str().unwrap();
    let keys = vq_gateway::token::TokenKeys::new(TEST_SECRET.as_bytes(), None);
    assert!(vq_gateway::token::verify(&keys, t, now_s()).is_ok());
    assert!(!gw.log().contains(OLD_SECRET) && !gw.log().contains(TEST_SECRET));
}

#[test]
fn tokens_from_the_queue_open_the_gate() {
    let (gw, up) = env(|c| {
        c.queue.tick_ms = 100;
    });
    let mut c = gw.client();
    c.request(
        "POST",
        "/virtual-queues/limited-drop/42/entries",
        &[("X-User-Id", "31")],
        b"",
    )
    .unwrap();
    let mut token = None;
    assert!(wait_until(std::time::Duration::from_secs(5), || {
        let v = c
            .get(
                "/virtual-queues/limited-drop/42/entries/me",
                &[("X-User-Id", "31")],
            )
            .unwrap()
            .json();
        token = v["entryToken"].as_str().map(String::from);
        token.is_some()
    }));
    let token = token.unwrap();
    assert_eq!(buy(&mut c, ORDERS, "31", Some(&token), &[]).status, 200);
    assert_denied(
        &buy(&mut c, ORDERS, "32", Some(&token), &[]),
        403,
        "QUEUE_BYPASS_DENIED",
    );
    assert_eq!(up.count(), 1);
}

#[test]
fn the_gate_skips_users_the_flag_leaves_out() {
    let (gw, up) = env(|c| c.flag.enabled = false);
    assert_eq!(buy(&mut gw.client(), ORDERS, "77", None, &[]).status, 200);
    assert_eq!(up.count(), 1);
}

#[test]
fn a_2xx_or_3xx_spends_the_token_a_4xx_or_5xx_gives_it_back() {
    let (gw, up) = env(|_| {});
    let mut sent = 0;
    // A completed order answers 2xx, or a redirect (Post/Redirect/Get).
    for (i, status) in ["200", "201", "204", "302", "303"].iter().enumerate() {
        let user = (2000 + i).to_string();
        let token = valid(2000 + i as u64);
        let r = buy(
            &mut gw.client(),
            ORDERS,
            &user,
            Some(&token),
            &[("x-upstream-status", status)],
        );
        assert_eq!(r.status.to_string(), *status);
        sent += 1;
        for _ in 0..3 {
            let r = buy(&mut gw.client(), ORDERS, &user, Some(&token), &[]);
            assert_denied(&r, 403, "QUEUE_BYPASS_DENIED");
        }
    }
    // A refused or failed purchase (the seat was taken, the backend failed) gives the token back.
    for (i, status) in ["400", "408", "409", "429", "500", "502", "503"]
        .iter()
        .enumerate()
    {
        let user = (3000 + i).to_string();
        let token = valid(3000 + i as u64);
        let r = buy(
            &mut gw.client(),
            ORDERS,
            &user,
            Some(&token),
            &[("x-upstream-status", status)],
        );
        assert_eq!(r.status.to_string(), *status);
        let r = buy(&mut gw.client(), ORDERS, &user, Some(&token), &[]);
        assert_eq!(r.status, 200, "after {status}");
        let r = buy(&mut gw.client(), ORDERS, &user, Some(&token), &[]);
        assert_denied(&r, 403, "QUEUE_BYPASS_DENIED");
        sent += 2;
    }
    assert_eq!(up.count(), sent);
}

/// Seat selection: the seat was taken (409), the user picks another with the same token (200).
#[test]
fn seat_selection_409_then_200_with_one_token() {
    let (gw, up) = env(|_| {});
    let token = token_for(
        TEST_SECRET,
        &format!("TICKETING_EVENT|7|5001|{}", now_s() + 200),
    );
    let seats = "/events/7/seats/select";
    let r = buy(
        &mut gw.client(),
        seats,
        "5001",
        Some(&token),
        &[("x-upstream-status", "409")],
    );
    assert_eq!(r.status, 409);
    let r = buy(&mut gw.client(), seats, "5001", Some(&token), &[]);
    assert_eq!(r.status, 200);
    assert_denied(
        &buy(&mut gw.client(), seats, "5001", Some(&token), &[]),
        403,
        "QUEUE_BYPASS_DENIED",
    );
    assert_eq!(up.count(), 2);
}

/// A client that makes the backend fail on purpose gets `token.max_attempts` tries in all.
#[test]
fn twenty_tries_on_a_failing_route_reach_the_backend_at_most_max_attempts_times() {
    let (gw, up) = env(|c| c.token.max_attempts = 4);
    let token = valid(6001);
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let r = buy(
            &mut gw.client(),
            ORDERS,
            "6001",
            Some(&token),
            &[("x-upstream-status", "500")],
        );
        statuses.push(r.status);
    }
    assert_eq!(up.count(), 4, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 500).count(), 4);
    assert!(statuses[4..].iter().all(|s| *s == 403), "{statuses:?}");
    assert!(gw.metrics().contains("reason=\"attempts_exhausted\""));
}

/// While a purchase is in flight, the same token is refused; once the first answer gives it
/// back, it may be tried again.
#[test]
fn a_token_in_flight_is_refused_until_its_purchase_answers() {
    let (gw, up) = env(|_| {});
    let token = valid(7001);
    let first = {
        let (addr, token) = (gw.listen, token.clone());
        std::thread::spawn(move || {
            buy(
                &mut Client::connect(addr),
                ORDERS,
                "7001",
                Some(&token),
                &[("x-upstream-status", "503"), ("x-upstream-delay-ms", "800")],
            )
            .status
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let r = buy(&mut gw.client(), ORDERS, "7001", Some(&token), &[]);
    assert_denied(&r, 403, "QUEUE_BYPASS_DENIED");
    assert_eq!(first.join().unwrap(), 503);
    let r = buy(&mut gw.client(), ORDERS, "7001", Some(&token), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 2);
    assert!(gw.metrics().contains("reason=\"in_flight\""));
}

#[test]
fn fifty_concurrent_uses_after_a_redirect_let_none_through_again() {
    let (gw, up) = env(|_| {});
    let token = valid(4242);
    let r = buy(
        &mut gw.client(),
        ORDERS,
        "4242",
        Some(&token),
        &[("x-upstream-status", "303")],
    );
    assert_eq!(r.status, 303);
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let addr = gw.listen;
            let token = token.clone();
            std::thread::spawn(move || {
                buy(
                    &mut Client::connect(addr),
                    ORDERS,
                    "4242",
                    Some(&token),
                    &[],
                )
                .status
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 403);
    }
    assert_eq!(up.count(), 1);
}

#[test]
fn an_older_files_release_on_loads_with_a_warning_and_max_attempts_is_validated() {
    let (code, out, err) = run_bin(
        &[
            "check-config",
            "--config",
            &write_config("[token]\nrelease_on = [503, 303]\n"),
        ],
        &[],
        std::time::Duration::from_secs(10),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("token.release_on is ignored"), "{out}");
    for bad in ["0", "1001"] {
        let (code, _, err) = run_bin(
            &[
                "check-config",
                "--config",
                &write_config(&format!("[token]\nmax_attempts = {bad}\n")),
            ],
            &[],
            std::time::Duration::from_secs(10),
        );
        assert_eq!(code, Some(64));
        assert!(err.contains("token.max_attempts"), "{err}");
    }
}

fn write_config(text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("vq-gate-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.toml", text.len()));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn upgrades_only_on_configured_websocket_paths() {
    let ws = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    // Default: no upgrade anywhere.
    let (gw, up) = env(|_| {});
    for path in ["/", "/ws/chat", "/products/1"] {
        let r = gw.client().request("GET", path, &ws, b"").unwrap();
        assert_denied(&r, 400, "BAD_REQUEST");
    }
    let r = gw
        .client()
        .request("GET", "/x", &[("Connection", "keep-alive, upgrade")], b"")
        .unwrap();
    assert_denied(&r, 400, "BAD_REQUEST");
    assert_eq!(up.count(), 0);
    // Configured: websocket under the prefix reaches the backend; never a gated route or h2c.
    let (gw, up) = env(|c| {
        c.upgrade.paths = vec![vq_gateway::config::UpgradePathEntry {
            prefix: "/ws".into(),
        }];
    });
    let r = gw.client().request("GET", "/ws/chat", &ws, b"").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 1);
    let r = gw
        .client()
        .request(
            "GET",
            "/ws/chat",
            &[("Upgrade", "h2c"), ("Connection", "Upgrade")],
            b"",
        )
        .unwrap();
    assert_denied(&r, 400, "BAD_REQUEST");
    let mut h = ws.to_vec();
    let token = valid(1001);
    h.extend([("X-User-Id", "1001"), ("X-Entry-Token", token.as_str())]);
    let r = gw.client().request("POST", ORDERS, &h, b"{}").unwrap();
    assert_denied(&r, 400, "BAD_REQUEST");
    assert_eq!(up.count(), 1);
}

#[test]
fn a_backend_that_switches_protocols_unasked_is_cut_off() {
    let (gw, up) = env(|_| {});
    let mut c = gw.client();
    let r = c
        .request("GET", "/anything", &[("x-upstream-status", "101")], b"")
        .unwrap();
    assert_eq!(r.status, 502);
    // Nothing sent afterwards on that connection reaches the backend as a tunnel.
    let _ = c.request("POST", ORDERS, &[("X-User-Id", "1001")], b"{}");
    assert_eq!(
        up.requests().iter().filter(|r| r.method == "POST").count(),
        0,
        "a gated POST went through the tunnel"
    );
}

#[test]
fn hop_by_hop_and_length_tricks_are_refused() {
    let (gw, up) = env(|_| {});
    let token = valid(7);
    let mut c = gw.client();
    let r = c
        .request(
            "POST",
            ORDERS,
            &[
                ("X-User-Id", "7"),
                ("X-Entry-Token", &token),
                ("Connection", "X-User-Id"),
            ],
            b"{}",
        )
        .unwrap();
    assert_denied(&r, 400, "BAD_REQUEST");
    for cl in [
        "84, 84",
        "9223372036854775808",
        "18446744073709551616",
        "+2",
    ] {
        let raw = format!(
            "POST /products HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: {cl}\r\n\r\n{{}}"
        );
        let r = gw.raw().send_raw(raw.as_bytes(), false);
        if let Ok(r) = r {
            assert_eq!(r.status, 400, "Content-Length: {cl}");
        }
    }
    let raw = "POST /products HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}";
    if let Ok(r) = gw.raw().send_raw(raw.as_bytes(), false) {
        assert_eq!(r.status, 400);
    }
    assert_eq!(up.count(), 0, "{:?}", up.requests());
    // The token was never consumed by the refused requests.
    let r = buy(&mut gw.client(), ORDERS, "7", Some(&token), &[]);
    assert_eq!(r.status, 200);
}

#[test]
fn lookalike_routes_and_lower_case_methods_are_refused() {
    let (gw, up) = env(|_| {});
    for path in [
        "/limited-drops/42/orders.json",
        "/limited-drops/42/orders.",
        "/limited-drops/42/orders%2e",
        "/limited-drops/42/orders%20",
        "/limited-drops/42/Orders.XML",
        "/events/7/seats/select.json",
    ] {
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            let r = gw
                .client()
                .request(method, path, &[("X-User-Id", "1")], b"{}")
                .unwrap();
            assert_denied(&r, 400, "BAD_REQUEST");
        }
    }
    for method in ["post", "Post", "pOST"] {
        let raw = format!(
            "{method} {ORDERS} HTTP/1.1\r\nHost: gateway.test\r\nX-User-Id: 1\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let r = gw.raw().send_raw(raw.as_bytes(), false).unwrap();
        assert_eq!(r.status, 400, "{method}");
    }
    assert_eq!(up.count(), 0, "{:?}", up.requests());
    // Reading a lookalike stays possible (GET is not a purchase).
    let r = gw
        .client()
        .get("/limited-drops/42/orders.json", &[])
        .unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn other_state_changing_methods_on_a_purchase_path_are_refused() {
    let (gw, up) = env(|_| {});
    for method in ["PUT", "PATCH", "BUY"] {
        let r = gw
            .client()
            .request(method, ORDERS, &[("X-User-Id", "1")], b"{}")
            .unwrap();
        assert_denied(&r, 405, "METHOD_NOT_ALLOWED");
    }
    // Reading stays possible; an override header on a lookalike is refused whatever the method.
    assert_eq!(gw.client().get(ORDERS, &[]).unwrap().status, 200);
    let r = gw
        .client()
        .get(
            "/limited-drops/42/orders.json",
            &[("X-HTTP-Method-Override", "POST")],
        )
        .unwrap();
    assert_denied(&r, 400, "BAD_REQUEST");
    assert_eq!(up.count(), 1);
}

#[test]
fn ambiguous_framing_closes_the_connection() {
    let (gw, up) = env(|_| {});
    // Content-Length beside Transfer-Encoding: Pingora drops the length and will not keep the
    // connection; the gateway must not turn keep-alive back on.
    let raw = "POST /products HTTP/1.1\r\nHost: gateway.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let mut c = gw.raw();
    let r = c.send_raw(raw.as_bytes(), false);
    if let Ok(r) = r {
        assert_eq!(
            r.header("connection").map(str::to_ascii_lowercase),
            Some("close".into())
        );
    }
    assert!(c.server_closed(), "the connection stayed open");
    let _ = up;
}

/// A refused request is answered at once, whatever body it announces: a small one that has
/// arrived is read and the connection kept; a huge one, or one held back for `100 Continue`,
/// is not waited for, and the connection closes after the answer (no slot held by a trickle).
#[test]
fn a_refusal_does_not_wait_for_a_large_or_held_back_body() {
    let (gw, up) = env(|_| {});
    let head = |extra: &str| {
        format!("POST {ORDERS} HTTP/1.1\r\nHost: gateway.test\r\nX-User-Id: 7\r\n{extra}\r\n")
    };
    for extra in [
        "Content-Length: 1000000000000\r\n",
        "Content-Length: 14\r\nExpect: 100-continue\r\n",
    ] {
        let mut c = gw.raw();
        let started = std::time::Instant::now();
        let r = c.send_raw(head(extra).as_bytes(), false).unwrap();
        assert_eq!(r.status, 403, "{extra}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{extra}: answered after {:?}",
            started.elapsed()
        );
        assert!(c.server_closed(), "{extra}: the connection stayed open");
    }
    // A small body is read: the connection serves the next request.
    let mut c = gw.raw();
    let small = format!("{}{{\"quantity\":1}}", head("Content-Length: 14\r\n"));
    assert_eq!(c.send_raw(small.as_bytes(), false).unwrap().status, 403);
    let port = c.local_port();
    assert_eq!(c.send_raw(small.as_bytes(), false).unwrap().status, 403);
    assert_eq!(c.local_port(), port, "the connection was not kept");
    assert_eq!(up.count(), 0);
}
