//! The operator console in a real browser (headless Chromium over its DevTools protocol) against
//! two real gateway processes on one real Redis, during a sale under load: the page served by
//! one replica steers the sale that both run, and every action is checked where it matters, in
//! the admissions the pump makes (read from the other replica).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::browser::Browser;
use common::load::epoch_ms;
use common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "admin-token-of-the-console-0123456789";
const TICK_MS: u64 = 500;
const A: &str = "#sale-LIMITED-DROP-42";
const B: &str = "#sale-TICKETING-EVENT-7";

fn start(redis: &RedisServer, up: std::net::SocketAddr) -> GatewayProc {
    let mut cfg = test_config(up);
    cfg.store.backend = StoreKind::Redis;
    cfg.store.redis_url = redis.url();
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    cfg.queue.tick_ms = TICK_MS;
    GatewayProc::start_with_env(
        cfg,
        &[
            ("VQ_TOKEN_SECRET", TEST_SECRET),
            ("VQ_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    )
}

fn put(gw: &GatewayProc, path: &str, body: Value) -> Value {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let r = gw
        .admin_client()
        .request(
            "PUT",
            path,
            &[("Authorization", &auth)],
            body.to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn console_state(gw: &GatewayProc) -> Value {
    let r = gw.admin_client().get("/console/state", &[]).unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Sale `key`'s ticks after `since` as the other replica reads them from the store.
fn ticks_after(gw: &GatewayProc, key: &str, since: u64) -> Vec<Value> {
    let state = console_state(gw);
    let sale = state["sales"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {state}"))
        .clone();
    sale["ticks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["at"].as_u64().unwrap() > since)
        .cloned()
        .collect()
}

/// Waits for `n` ticks of `key` after `since`.
fn wait_ticks(gw: &GatewayProc, key: &str, since: u64, n: usize) -> Vec<Value> {
    let mut ticks = Vec::new();
    assert!(
        wait_until(Duration::from_secs(15), || {
            ticks = ticks_after(gw, key, since);
            ticks.len() >= n
        }),
        "{n} ticks of {key} after {since}: {ticks:?}"
    );
    ticks
}

fn message(browser: &mut Browser, expected: &str) -> String {
    let js = format!(
        "(() => {{ const m = document.getElementById('message'); \
         return !m.hidden && m.textContent.includes({expected:?}) ? m.textContent : ''; }})()"
    );
    browser
        .wait_for(&js, Duration::from_secs(10))
        .as_str()
        .unwrap()
        .to_string()
}

fn text(browser: &mut Browser, selector: &str) -> String {
    browser
        .eval(&format!(
            "document.querySelector({selector:?})?.textContent ?? ''"
        ))
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn an_operator_steers_a_live_sale_from_the_console() {
    let _serial = serial();
    let redis = RedisServer::start();
    let up = Upstream::start();
    let gws = [start(&redis, up.addr), start(&redis, up.addr)];
    for gw in &gws {
        gw.wait_flag_known();
    }
    put(
        &gws[0],
        "/sales/limited-drop/42",
        json!({"batchSize": 5, "tickMs": TICK_MS, "heartbeatTimeoutS": 60}),
    );
    put(
        &gws[0],
        "/sales/ticketing-event/7",
        json!({"batchSize": 3, "tickMs": TICK_MS, "heartbeatTimeoutS": 60}),
    );
    // The sale's crowd: 400 users in sale A at once, then users arriving in sale B and everyone
    // in B polling, through the other replica, for the whole test.
    let mut client = gws[1].client();
    for user in 1..=400u64 {
        let r = client
            .request(
                "POST",
                "/virtual-queues/limited-drop/42/entries",
                &[("X-User-Id", &user.to_string())],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let mut client = gws[1].client();
        std::thread::spawn(move || {
            let mut user = 10_000u64;
            while !stop.load(Ordering::Relaxed) {
                user += 1;
                let _ = client.request(
                    "POST",
                    "/virtual-queues/ticketing-event/7/entries",
                    &[("X-User-Id", &user.to_string())],
                    b"",
                );
                for polled in (10_001..=user).rev().take(20) {
                    let _ = client.get(
                        "/virtual-queues/ticketing-event/7/entries/me",
                        &[("X-User-Id", &polled.to_string())],
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    let mut browser = Browser::start(1280, 1000);
    browser.open(&format!("http://{}/console", gws[0].admin));
    browser.wait_for(
        "document.querySelectorAll('article.sale').length === 2",
        Duration::from_secs(10),
    );
    browser.wait_for(
        &format!("document.querySelector('{A} .figures').textContent.includes('5 users per 500 ms tick')"),
        Duration::from_secs(5),
    );
    assert!(
        text(&mut browser, "#replicas tbody")
            .matches("live")
            .count()
            >= 2
    );
    assert_eq!(browser.take_errors(), Vec::<String>::new());

    // A wrong token: refused, said so, and the sale keeps its budget.
    browser.fill("#token", "not-the-admin-token-0000000");
    browser.press("Enter");
    browser.fill("#batch-LIMITED-DROP-42", "9");
    browser.press("Enter");
    let said = message(&mut browser, "Refused (401)");
    assert!(said.contains("Nothing was changed"), "{said}");
    // The browser logs the refused request itself; nothing else went wrong.
    let errors = browser.take_errors();
    assert!(
        errors.len() == 1 && errors[0].contains("401 (Unauthorized)"),
        "{errors:?}"
    );
    let refused_at = epoch_ms();
    for tick in wait_ticks(&gws[1], "LIMITED_DROP:42", refused_at, 3) {
        assert_eq!(tick["batch"], 5, "{tick}");
        assert_eq!(tick["admitted"], 5, "{tick}");
    }

    // The budget, changed in the page: the next tick admits the new budget.
    browser.fill("#token", ADMIN_TOKEN);
    browser.press("Enter");
    browser.fill("#batch-LIMITED-DROP-42", "9");
    browser.press("Enter");
    message(&mut browser, "budget 9 users");
    let changed_at = epoch_ms();
    let ticks = wait_ticks(&gws[1], "LIMITED_DROP:42", changed_at, 4);
    // The first tick after the answer may have begun before the write; the one after it not.
    let first = ticks.iter().position(|t| t["batch"] == 9).unwrap();
    assert!(first <= 1, "{ticks:?}");
    assert!(
        ticks[first]["at"].as_u64().unwrap() <= changed_at + TICK_MS + 300,
        "the new budget took more than a tick: {ticks:?}"
    );
    for tick in &ticks[first..] {
        assert_eq!(tick["batch"], 9, "{ticks:?}");
        assert_eq!(tick["admitted"], 9, "{ticks:?}");
    }
    browser.wait_for(
        &format!("document.querySelector('{A} .figures').textContent.includes('9 users per 500 ms tick')"),
        Duration::from_secs(5),
    );

    // A pause cancelled in its dialog (Escape) changes nothing.
    browser.click(&format!("{A} [data-action=pause]"));
    browser.wait_for(
        "document.getElementById('confirm').open",
        Duration::from_secs(5),
    );
    browser.press("Escape");
    browser.wait_for(
        "!document.getElementById('confirm').open",
        Duration::from_secs(5),
    );
    let cancelled_at = epoch_ms();
    let ticks = wait_ticks(&gws[1], "LIMITED_DROP:42", cancelled_at, 2);
    assert!(ticks.iter().all(|t| t["admitted"] == 9), "{ticks:?}");

    // Pause, confirmed with the keyboard: no admissions from the next tick, nobody loses a place.
    browser.click(&format!("{A} [data-action=pause]"));
    browser.wait_for(
        "document.getElementById('confirm').open",
        Duration::from_secs(5),
    );
    assert_eq!(browser.eval("document.activeElement.id"), "confirm-cancel");
    browser.press("Tab");
    assert_eq!(browser.eval("document.activeElement.id"), "confirm-ok");
    browser.press("Enter");
    message(&mut browser, "paused");
    let paused_at = epoch_ms();
    let waiting_then = wait_ticks(&gws[1], "LIMITED_DROP:42", paused_at, 1)[0]["waiting"].clone();
    let ticks = wait_ticks(&gws[1], "LIMITED_DROP:42", paused_at + TICK_MS, 4);
    for tick in &ticks {
        assert_eq!(tick["outcome"], "paused", "{ticks:?}");
        assert_eq!(tick["admitted"], 0, "{ticks:?}");
        assert_eq!(tick["waiting"], waiting_then, "{ticks:?}");
    }
    browser.wait_for(
        &format!("document.querySelector('{A} header .badge').textContent === 'paused'"),
        Duration::from_secs(5),
    );
    // Resume (no question asked): admissions go on at the budget.
    browser.click(&format!("{A} [data-action=pause]"));
    message(&mut browser, "resumed");
    let resumed_at = epoch_ms();
    let ticks = wait_ticks(&gws[1], "LIMITED_DROP:42", resumed_at + TICK_MS, 2);
    assert!(ticks.iter().all(|t| t["admitted"] == 9), "{ticks:?}");

    // The queue switched off for sale B, confirmed with a click: its users go straight through,
    // on the other replica too, within the flag's refresh.
    browser.click(&format!("{B} [data-action=queue]"));
    browser.wait_for(
        "document.getElementById('confirm').open",
        Duration::from_secs(5),
    );
    browser.click("#confirm-ok");
    message(&mut browser, "The queue is off for TICKETING_EVENT:7");
    let mut direct = Value::Null;
    assert!(wait_until(Duration::from_secs(3), || {
        let r = gws[1]
            .client()
            .request(
                "POST",
                "/virtual-queues/ticketing-event/7/entries",
                &[("X-User-Id", "999999")],
                b"",
            )
            .unwrap();
        direct = r.json();
        direct["status"] == "DIRECT_ADMITTED"
    }));
    // Sale A keeps its queue.
    let r = gws[1]
        .client()
        .request(
            "POST",
            "/virtual-queues/limited-drop/42/entries",
            &[("X-User-Id", "999999")],
            b"",
        )
        .unwrap();
    assert_eq!(r.json()["status"], "WAITING", "{}", r.json());
    browser.wait_for(
        &format!("document.querySelector('{B} header .badge.off') !== null"),
        Duration::from_secs(5),
    );

    // A sale created with a schedule: the draw's commitment is on the page before the opening.
    let opens = epoch_ms() + 3_600_000;
    browser.fill("#c-id", "77");
    browser.fill("#c-batch", "50");
    browser.fill("#c-tick", "1000");
    browser.eval(&format!(
        "(() => {{ const d = new Date({opens}); d.setSeconds(0, 0); \
         const local = new Date(d.getTime() - d.getTimezoneOffset() * 60000); \
         document.getElementById('c-opens').value = local.toISOString().slice(0, 16); return true; }})()"
    ));
    browser.click("#create-form button[type=submit]");
    message(&mut browser, "Sale limited-drop 77 saved");
    browser.wait_for(
        "document.querySelectorAll('article.sale').length === 3",
        Duration::from_secs(5),
    );
    let stored = gws[1]
        .admin_client()
        .get("/sales/limited-drop/77", &[])
        .unwrap()
        .json();
    assert_eq!(stored["batchSize"], 50);
    assert_eq!(stored["tickMs"], 1000);
    assert_eq!(
        stored["opensAt"].as_u64().unwrap(),
        opens / 60_000 * 60_000,
        "{stored}"
    );
    let commitment = stored["drawCommitment"].as_str().unwrap().to_string();
    assert_eq!(commitment.len(), 64);
    browser.wait_for(
        &format!(
            "document.querySelector('#sale-LIMITED-DROP-77 .draw').textContent.includes('{commitment}')"
        ),
        Duration::from_secs(5),
    );

    // Redis stops answering: the page still answers with what the replica knows and says so,
    // keeps the sales it showed, and recovers by itself when Redis is back.
    redis.pause();
    browser.wait_for(
        "document.getElementById('summary').textContent.includes('not answering')",
        Duration::from_secs(10),
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('article.sale').length"),
        3
    );
    redis.resume();
    browser.wait_for(
        "!document.getElementById('summary').textContent.includes('not answering')",
        Duration::from_secs(10),
    );

    // Every control is reached with the keyboard.
    browser.eval("document.activeElement.blur(); window.scrollTo(0, 0); true");
    let mut reached = Vec::new();
    for _ in 0..60 {
        browser.press("Tab");
        reached.push(
            browser
                .eval(
                    "(() => { const e = document.activeElement; \
                     return e.id || e.dataset.action || e.textContent.trim(); })()",
                )
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    for control in [
        "token",
        "queue-on",
        "queue-off",
        "rollout",
        "batch-LIMITED-DROP-42",
        "budget",
        "pause",
        "queue",
        "c-id",
    ] {
        assert!(
            reached.iter().any(|r| r == control),
            "{control}: {reached:?}"
        );
    }

    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    browser.eval("window.scrollTo(0, 0); true");
    browser.screenshot(&shots.join("console-1280.png"));
    // A phone: one column, nothing wider than the screen.
    browser.viewport(390, 844, true);
    browser.wait_for(
        "document.documentElement.scrollWidth <= window.innerWidth + 1",
        Duration::from_secs(5),
    );
    browser.screenshot(&shots.join("console-phone.png"));
    assert_eq!(browser.take_errors(), Vec::<String>::new());
    eprintln!("screenshots in {}", shots.display());

    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
}

#[test]
fn the_console_serves_its_page_with_a_strict_policy_and_refuses_writes_without_the_token() {
    let up = Upstream::start();
    let mut cfg = test_config(up.addr);
    cfg.server.admin_token_env = "VQ_ADMIN_TOKEN".into();
    let gw = GatewayProc::start_with_env(
        cfg,
        &[
            ("VQ_TOKEN_SECRET", TEST_SECRET),
            ("VQ_ADMIN_TOKEN", ADMIN_TOKEN),
        ],
    );
    let page = gw.admin_client().get("/console", &[]).unwrap();
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").unwrap().to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
    for (path, kind) in [
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let r = gw.admin_client().get(path, &[]).unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
    }
    // The flag: read by anyone on the admin listener, written only with the token.
    let flag = gw.admin_client().get("/flag", &[]).unwrap().json();
    assert_eq!(flag["enabled"], true);
    for auth in [
        None,
        Some("Bearer nope"),
        Some("admin-token-of-the-console-0123456789"),
    ] {
        let headers: Vec<(&str, &str)> =
            auth.map(|a| vec![("Authorization", a)]).unwrap_or_default();
        let r = gw
            .admin_client()
            .request("PUT", "/flag", &headers, br#"{"enabled":false}"#)
            .unwrap();
        assert_eq!(r.status, 401, "{auth:?}");
    }
    let auth = format!("Bearer {ADMIN_TOKEN}");
    for bad in [
        &br#"{"enabled":"no"}"#[..],
        br#"{"rolloutPercent":101}"#,
        br#"{"rolloutPercent":5,"target":"LIMITED_DROP:1"}"#,
        br#"{"target":"LIMITED_DROP:01","enabled":true}"#,
        br#"{"enabled":true,"extra":1}"#,
        br#"{"enabled":null,"rolloutPercent":5}"#,
        br#"{"enabled":true,"enabled":false}"#,
        br#"[true]"#,
        br#"{}"#,
    ] {
        let r = gw
            .admin_client()
            .request("PUT", "/flag", &[("Authorization", &auth)], bad)
            .unwrap();
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(bad));
    }
    assert_eq!(
        gw.admin_client().get("/flag", &[]).unwrap().json()["enabled"],
        true
    );
    // The memory store: the local flag is the one, and it changes at once.
    let r = gw
        .admin_client()
        .request(
            "PUT",
            "/flag",
            &[("Authorization", &auth)],
            br#"{"enabled":true,"rolloutPercent":40}"#,
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["rolloutPercent"], 40);
    let state = gw.admin_client().get("/console/state", &[]).unwrap().json();
    assert_eq!(state["flag"]["rolloutPercent"], 40);
    assert_eq!(state["store"], "memory");
    // The audit line names the token by its id, never by itself.
    let log = gw.log();
    assert!(log.contains("flag changed through the admin API"), "{log}");
    assert!(log.contains("who=\"sha256:"), "{log}");
    assert!(!log.contains(ADMIN_TOKEN));
}
