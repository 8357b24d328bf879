//! Neither Redis data loss nor client overload may open the gate.
//!
//! - A Redis that restarts empty mid-sale (no persistence; a failover to an empty replica and a
//!   `FLUSHALL` look the same) loses the run-time flag and the registered sales. The replicas
//!   keep what they last read, keep gating, count the loss and write the state back
//!   (`src/settings.rs`): no purchase reaches the backend without a token, under load.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::load::{self, epoch_ms, purchase_path, Load, LoadConfig};
use common::*;

const TICK_MS: u64 = 500;
const BATCH: u64 = 5;

/// Users the attacker claims to be: never admitted, never given a token.
const ATTACKER_BASE: u64 = 900_000_000;

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Purchases without a token, as fast as the gateways answer, from made-up users; counts the
/// ones answered 2xx (which the backend then saw).
struct Attacker {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    handle: std::thread::JoinHandle<u64>,
}

impl Attacker {
    fn start(gateways: Vec<std::net::SocketAddr>) -> Attacker {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let handle = std::thread::spawn(move || {
            let mut clients: Vec<Client> = gateways.iter().map(|a| Client::connect(*a)).collect();
            let mut passed = 0;
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) {
                i += 1;
                let g = (i as usize) % clients.len();
                let user = (ATTACKER_BASE + i).to_string();
                match clients[g].request("POST", &purchase_path(42), &[("X-User-Id", &user)], b"{}")
                {
                    Ok(r) if r.status < 300 => passed += 1,
                    Ok(_) => {}
                    Err(_) => {
                        clients[g] = Client::connect(gateways[g]);
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                n.fetch_add(1, Ordering::Relaxed);
            }
            passed
        });
        Attacker { stop, sent, handle }
    }

    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let passed = self.handle.join().unwrap();
        (passed, self.sent.load(Ordering::Relaxed))
    }
}

fn cli(gw: &GatewayProc, args: &[&str]) -> String {
    let path = gw.dir.0.join("gateway.toml");
    let mut all: Vec<&str> = args[..2].to_vec();
    all.extend_from_slice(&["--config", path.to_str().unwrap()]);
    all.extend_from_slice(&args[2..]);
    let (code, out, err) = run_bin(&all, &[], Duration::from_secs(15));
    assert_eq!(code, Some(0), "{args:?}: {out}{err}");
    out
}

#[test]
fn redis_restarted_empty_mid_sale_keeps_the_queue_on_and_writes_the_state_back() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let up = Upstream::start();
    let gws: Vec<GatewayProc> = (0..2)
        .map(|_| {
            let mut cfg = test_config(up.addr);
            cfg.store.backend = StoreKind::Redis;
            cfg.store.redis_url = redis.url();
            cfg.queue.tick_ms = TICK_MS;
            cfg.queue.batch_size = BATCH;
            cfg.queue.heartbeat_timeout_s = 5;
            // The shipped production shape: the queue off in the file, on at run time; only
            // registered sales have one, and other sales' purchases pass ungated.
            cfg.flag.enabled = false;
            cfg.queue.targets = TargetsMode::Registered;
            cfg.queue.unregistered_gated = UnregisteredGated::Pass;
            cfg.store.startup_wait_ms = 2000;
            GatewayProc::start(cfg)
        })
        .collect();
    // The replicas created the flag from their file (off) on the empty Redis; the operator
    // registers the sale and turns the queue on.
    assert!(wait_until(Duration::from_secs(8), || redis
        .cmd(&["HGET", "{queue:flag}:meta", "version"])
        .as_str()
        .is_some()));
    cli(&gws[0], &["target", "add", "LIMITED_DROP:42"]);
    cli(&gws[0], &["flag", "set", "--enabled", "on"]);
    let addrs: Vec<_> = gws.iter().map(|g| g.listen).collect();
    for gw in &gws {
        assert!(
            wait_until(Duration::from_secs(4), || {
                let r = gw
                    .client()
                    .request(
                        "POST",
                        &purchase_path(42),
                        &[("X-User-Id", "17")],
                        b"{}",
                    )
                    .unwrap();
                r.status == 403
            }),
            "the queue never came on"
        );
    }

    let load = Load::start(LoadConfig {
        threads: 3,
        drive_by_every: 0,
        ..LoadConfig::new(addrs.clone())
    });
    let attacker = Attacker::start(addrs.clone());
    std::thread::sleep(Duration::from_millis(1500));
    redis.kill();
    std::thread::sleep(Duration::from_millis(1500));
    let back = epoch_ms();
    redis.restart();
    // The replicas notice the loss at their next read (every second) and write the state back.
    let restored = wait_until(Duration::from_secs(5), || {
        redis.cmd(&["HGET", "queue:flag", "enabled"]).as_str().as_deref() == Some("on")
            && redis
                .cmd(&["SISMEMBER", "queue:targets", "LIMITED_DROP:42"])
                .as_int()
                == 1
    });
    let restored_ms = epoch_ms() - back;
    std::thread::sleep(Duration::from_millis(2000));
    let events = load.stop();
    let (passed, sent) = attacker.stop();
    assert!(restored, "the state was not written back");

    // Not one purchase without a token reached the backend.
    let attackers_at_backend = up
        .requests()
        .iter()
        .filter(|r| {
            r.header("x-user-id")
                .and_then(|u| u.parse::<u64>().ok())
                .is_some_and(|u| u >= ATTACKER_BASE)
        })
        .count();
    assert_eq!(passed, 0, "tokenless purchases answered 2xx, of {sent}");
    assert_eq!(attackers_at_backend, 0);
    assert!(sent > 100, "the attacker barely ran: {sent}");

    // The queue stayed on: nobody entering after the restart was let straight through
    // without the pump (degraded pacing during the outage is the budget's own).
    let direct_after = events
        .iter()
        .filter(|e| e.start_ms > back + 1000 && e.direct && !e.degraded)
        .count();
    assert_eq!(direct_after, 0, "users let straight through after the restart");
    let waiting_after = events
        .iter()
        .filter(|e| e.start_ms > back + 1000 && e.status == 200 && !e.direct)
        .count();
    assert!(waiting_after > 0, "no queue answers after the restart");

    // Purchases stay within the budget (one extra batch for the tick Redis came back in,
    // as in every fault, and the load generator's lag).
    let purchases: Vec<u64> = up
        .requests()
        .iter()
        .filter(|r| r.target == purchase_path(42))
        .map(|r| r.at_ms)
        .collect();
    let lag = load::purchase_lag_ticks(&events, TICK_MS);
    let windows = load::max_per_window(&purchases, TICK_MS, 10);
    for (i, max) in windows.iter().enumerate() {
        let n = i as u64 + 1;
        // Each replica paces its own share while Redis is down, and the empty Redis starts a
        // new queue whose first batch comes on top: two extra batches.
        let bound = (n + 3 + lag) * BATCH;
        assert!(*max as u64 <= bound, "{max} purchases in {n} ticks, bound {bound}: {windows:?}");
    }

    // The loss was counted (the alert's series), by whichever replica noticed it before another
    // had written the state back.
    let counted = |state: &str| -> u64 {
        gws.iter()
            .map(|gw| {
                metric(
                    &gw.metrics(),
                    &format!("virtual_queue_store_data_loss_total{{state=\"{state}\"}}"),
                )
            })
            .sum()
    };
    assert!(counted("flag") >= 1);
    assert!(counted("targets") >= 1);
    let versioned = redis.cmd(&["HGET", "{queue:flag}:meta", "version"]).as_str();
    assert!(versioned.is_some_and(|v| v != "1"), "the operator's version came back");
    eprintln!(
        "restarted empty: state written back {restored_ms} ms after the restart; {sent} tokenless purchases, 0 through; {} purchases at the backend, max per 1/2/4 ticks {:?}",
        purchases.len(),
        [windows[0], windows[1], windows[3]]
    );
}
