//! A closed-loop load generator for fault tests: worker threads that keep a set of users of one
//! sale entering, polling and buying (once, with their token) as fast as the gateways answer,
//! round-robin over the gateways, plus drive-by enters of fresh users on a second target. Every
//! answer is recorded with its wall-clock times, so a test can line answers up with the pump's
//! epoch-aligned ticks and with the purchases the backend saw.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Client;

pub fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub gateways: Vec<SocketAddr>,
    pub threads: usize,
    /// Users of the sale each thread keeps going at once (each is polled every few requests).
    pub active_per_thread: usize,
    /// Every `drive_by_every`-th request enters a fresh user of `/virtual-queues/limited-drop/43`
    /// who never comes back (0: none).
    pub drive_by_every: u64,
    /// Spreads user ids between runs that share a Redis.
    pub user_base: u64,
    /// The sale's limited-drop id (its queue and its purchase route).
    pub sale: u64,
    /// The limited-drop id of the drive-by enters.
    pub drive_by: u64,
}

impl LoadConfig {
    pub fn new(gateways: Vec<SocketAddr>) -> LoadConfig {
        LoadConfig {
            gateways,
            threads: 6,
            active_per_thread: 20,
            drive_by_every: 4,
            user_base: 1_000_000,
            sale: 42,
            drive_by: 43,
        }
    }
}

/// The queue API of limited drop `id`.
pub fn queue_path(id: u64) -> String {
    format!("/virtual-queues/limited-drop/{id}")
}

/// The gated purchase route of limited drop `id`.
pub fn purchase_path(id: u64) -> String {
    format!("/limited-drops/{id}/orders")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Enter,
    Poll,
    Purchase,
    DriveBy,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub op: Op,
    pub gateway: usize,
    pub start_ms: u64,
    pub end_ms: u64,
    /// 0: the connection failed (refused, reset) before an answer.
    pub status: u16,
    /// Answered without the store (`"degraded": true`).
    pub degraded: bool,
    /// `DIRECT_ADMITTED`.
    pub direct: bool,
    /// A poll answered 404 for a user who held a position in the queue.
    pub lost: bool,
    /// For a purchase: when the buyer was last answered `WAITING` (the start of that request),
    /// so the buyer was admitted after it. `purchase start - waiting_ms` bounds how late the
    /// load generator bought after the admission.
    pub waiting_ms: Option<u64>,
    /// A purchase tried again with the same token after a 503 (the gateway held it back).
    pub retry: bool,
}

struct User {
    id: u64,
    entered: bool,
    seq: Option<u64>,
    /// The queue ticket of the last waiting answer, sent back with every poll.
    ticket: Option<String>,
    token: Option<String>,
    waiting_ms: Option<u64>,
    /// The last purchase with `token` was answered 503: the next one is a retry.
    held: bool,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<Vec<Event>>>,
}

impl Load {
    pub fn start(cfg: LoadConfig) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..cfg.threads)
            .map(|t| {
                let cfg = cfg.clone();
                let stop = stop.clone();
                std::thread::spawn(move || worker(&cfg, t as u64, &stop))
            })
            .collect();
        Load { stop, handles }
    }

    /// Stops the workers and returns every answer they saw, in no particular order.
    pub fn stop(self) -> Vec<Event> {
        self.stop.store(true, Ordering::Relaxed);
        self.handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    }
}

fn worker(cfg: &LoadConfig, thread: u64, stop: &AtomicBool) -> Vec<Event> {
    let mut clients: Vec<Client> = cfg.gateways.iter().map(|a| Client::connect(*a)).collect();
    let mut events = Vec::new();
    let mut users: VecDeque<User> = VecDeque::new();
    let mut next_id = cfg.user_base + thread * 10_000_000;
    let (sale, drive_by) = (queue_path(cfg.sale), queue_path(cfg.drive_by));
    let purchase = purchase_path(cfg.sale);
    let mut i: u64 = thread;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let g = (i as usize) % clients.len();
        if cfg.drive_by_every > 0 && i % cfg.drive_by_every == 0 {
            next_id += 1;
            let id = next_id.to_string();
            let start_ms = epoch_ms();
            let r = clients[g].request(
                "POST",
                &format!("{drive_by}/entries"),
                &[("X-User-Id", &id)],
                b"",
            );
            let mut e = event(Op::DriveBy, g, start_ms);
            record(&mut e, &r);
            if r.is_err() {
                clients[g] = Client::connect(cfg.gateways[g]);
            }
            events.push(e);
            continue;
        }
        let mut user = if users.len() < cfg.active_per_thread {
            next_id += 1;
            User {
                id: next_id,
                entered: false,
                seq: None,
                ticket: None,
                token: None,
                waiting_ms: None,
                held: false,
            }
        } else {
            users.pop_front().unwrap()
        };
        let id = user.id.to_string();
        let start_ms = epoch_ms();
        let (op, r) = if let Some(token) = &user.token {
            let r = clients[g].request(
                "POST",
                &purchase,
                &[("X-User-Id", &id), ("X-Entry-Token", token)],
                b"{}",
            );
            (Op::Purchase, r)
        } else if !user.entered {
            let r = clients[g].request(
                "POST",
                &format!("{sale}/entries"),
                &[("X-User-Id", &id)],
                b"",
            );
            (Op::Enter, r)
        } else {
            let mut headers = vec![("X-User-Id", id.as_str())];
            if let Some(t) = &user.ticket {
                headers.push(("X-Queue-Ticket", t));
            }
            let r = clients[g].request("GET", &format!("{sale}/entries/me"), &headers, b"");
            (Op::Poll, r)
        };
        let mut e = event(op, g, start_ms);
        if op == Op::Purchase {
            e.waiting_ms = user.waiting_ms;
            e.retry = user.held;
        }
        record(&mut e, &r);
        let mut done = false;
        match &r {
            Err(_) => {
                clients[g] = Client::connect(cfg.gateways[g]);
                // A replica that is down refuses at once; do not spin on it.
                std::thread::sleep(Duration::from_millis(2));
            }
            // Told to come back (the store's claim could not be confirmed): the user keeps the
            // token and tries again, as a client following `Retry-After` does.
            Ok(resp) if op == Op::Purchase && resp.status == 503 => user.held = true,
            Ok(_) if op == Op::Purchase => {
                user.held = false;
                done = true;
            }
            Ok(resp) if resp.status == 200 => {
                let v = resp.json();
                match v["status"].as_str() {
                    Some("WAITING") => {
                        user.entered = true;
                        user.waiting_ms = Some(start_ms);
                        if let Some(t) = v["queueTicket"].as_str() {
                            user.ticket = Some(t.to_string());
                        }
                        if let Some(seq) = v["position"].as_u64() {
                            user.seq = Some(seq);
                        }
                    }
                    Some("ADMITTED" | "DIRECT_ADMITTED") => {
                        user.token = v["entryToken"].as_str().map(String::from);
                    }
                    other => panic!("unexpected status {other:?}"),
                }
            }
            Ok(resp) if resp.status == 404 && op == Op::Poll => {
                e.lost = user.seq.is_some();
                user.entered = false;
                user.seq = None;
                user.ticket = None;
            }
            Ok(_) => {}
        }
        events.push(e);
        if !done {
            users.push_back(user);
        }
    }
    events
}

fn event(op: Op, gateway: usize, start_ms: u64) -> Event {
    Event {
        op,
        gateway,
        start_ms,
        end_ms: 0,
        status: 0,
        degraded: false,
        direct: false,
        lost: false,
        waiting_ms: None,
        retry: false,
    }
}

fn record(e: &mut Event, r: &std::io::Result<super::Response>) {
    e.end_ms = epoch_ms();
    if let Ok(resp) = r {
        e.status = resp.status;
        if resp.status == 200 && e.op != Op::Purchase {
            let v = resp.json();
            e.degraded = v["degraded"] == true;
            e.direct = v["status"] == "DIRECT_ADMITTED";
        }
    }
}

/// The largest count in any `n` consecutive ticks, for each `n` in `1..=max_n`, of the given
/// epoch-ms times.
pub fn max_per_window(times: &[u64], tick_ms: u64, max_n: usize) -> Vec<usize> {
    let mut per_tick = std::collections::BTreeMap::<u64, usize>::new();
    for t in times {
        *per_tick.entry(t / tick_ms).or_default() += 1;
    }
    let (Some(first), Some(last)) = (
        per_tick.keys().next().copied(),
        per_tick.keys().last().copied(),
    ) else {
        return vec![0; max_n];
    };
    let counts: Vec<usize> = (first..=last)
        .map(|k| per_tick.get(&k).copied().unwrap_or(0))
        .collect();
    (1..=max_n)
        .map(|n| {
            counts
                .windows(n.min(counts.len()))
                .map(|w| w.iter().sum())
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// The admission budget a fault test holds the backend to.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub tick_ms: u64,
    pub batch: u64,
}

/// The time from `back_ms` (Redis answers again) to the end of the last degraded answer to a
/// request sent after it (and answered before `until_ms`, when the next fault began).
pub fn recovery_ms(events: &[Event], back_ms: u64, until_ms: u64) -> u64 {
    events
        .iter()
        .filter(|e| e.start_ms >= back_ms && e.end_ms < until_ms && e.degraded)
        .map(|e| e.end_ms.saturating_sub(back_ms))
        .max()
        .unwrap_or(0)
}

/// How many ticks, at most, the load generator bought after an admission: the largest time from
/// a buyer's last `WAITING` answer to its purchase, in ticks, rounded up. A load generator
/// starved of CPU learns of admissions late, and users admitted over several ticks then buy
/// together; the bound on purchases per window widens by exactly that lag.
pub fn purchase_lag_ticks(events: &[Event], tick_ms: u64) -> u64 {
    lag_ticks(events.iter().filter(|e| e.op == Op::Purchase), tick_ms)
}

/// The same for first attempts only: how late the load generator itself acted on admissions
/// (a purchase the gateway held back with 503 and tried again later is its lag, not the
/// generator's). Above a few ticks, the generator was starved of CPU and the run proves little.
pub fn reaction_lag_ticks(events: &[Event], tick_ms: u64) -> u64 {
    lag_ticks(
        events.iter().filter(|e| e.op == Op::Purchase && !e.retry),
        tick_ms,
    )
}

fn lag_ticks<'a>(purchases: impl Iterator<Item = &'a Event>, tick_ms: u64) -> u64 {
    purchases
        .filter_map(|e| e.waiting_ms.map(|w| e.start_ms.saturating_sub(w)))
        .max()
        .unwrap_or(0)
        .div_ceil(tick_ms)
}

pub fn degraded_between(events: &[Event], from_ms: u64, to_ms: u64) -> usize {
    events
        .iter()
        .filter(|e| e.degraded && e.start_ms >= from_ms && e.start_ms < to_ms)
        .count()
}

/// The invariants every fault must keep. `lag_ticks`: how many ticks late the load generator's
/// users may fetch their tokens (0 when it keeps pace; the bound grows by a batch per tick of
/// lag, since users admitted in earlier ticks then buy together).
pub fn assert_kept(
    events: &[Event],
    purchases: &[u64],
    budget: Budget,
    what: &str,
    lag_ticks: u64,
) {
    let Budget { tick_ms, batch } = budget;
    let total = events.len();
    let by_status = |s: u16| events.iter().filter(|e| e.status == s).count();
    // A purchase answered 503 (`Retry-After`: the single-use claim could not be confirmed in
    // the first second of an outage) is tried again by its user; every other 5xx is a failure.
    let retried = events
        .iter()
        .filter(|e| e.op == Op::Purchase && e.status == 503)
        .count();
    let five_xx = events.iter().filter(|e| e.status >= 500).count() - retried;
    assert_eq!(five_xx, 0, "{what}: 5xx answers among {total}");
    assert_eq!(by_status(0), 0, "{what}: failed connections");
    let lost = events.iter().filter(|e| e.lost).count();
    assert_eq!(lost, 0, "{what}: users who held a position were lost");
    let refused: Vec<(usize, u64, u16)> = events
        .iter()
        .filter(|e| e.op == Op::Purchase && !matches!(e.status, 200 | 503))
        .map(|e| (e.gateway, e.start_ms, e.status))
        .collect();
    assert!(
        refused.is_empty(),
        "{what}: purchases with a valid token refused (gateway, start ms, status): {refused:?}"
    );
    let windows = max_per_window(purchases, tick_ms, 20);
    for (i, max) in windows.iter().enumerate() {
        let n = i as u64 + 1;
        let bound = (n + 2 + lag_ticks) * batch;
        assert!(
            *max as u64 <= bound,
            "{what}: {max} purchases in {n} ticks, bound {bound}; per window {windows:?}"
        );
    }
    eprintln!(
        "{what}: {total} answers, {} purchases at the backend ({retried} told to come back), max per 1/2/4/20 ticks {:?} (budget {batch} per tick)",
        purchases.len(),
        [windows[0], windows[1], windows[3], windows[19]],
    );
}
