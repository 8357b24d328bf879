//! One virtual user of `simulate`: its plan (when it arrives, what it will do) and the run of it,
//! recorded request by request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;

use super::{Identity, Sale, SimArgs};

/// splitmix64: a tiny seeded generator, so a seed replays the same users.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// What the user will do once in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Polls until admitted, then buys.
    Stay,
    /// Stops polling without a word after this many polls.
    Abandon { after_polls: u32 },
    /// Leaves (`DELETE`) after this many polls.
    Leave { after_polls: u32 },
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub user: u64,
    /// Index into the sales.
    pub sale: usize,
    /// Since the start of the run.
    pub arrive: Duration,
    pub fate: Fate,
    /// Tries the purchase route without a token and with a forged one before entering.
    pub cheat: bool,
    pub rng: Rng,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Enter,
    Poll,
    Leave,
    Purchase,
    /// A purchase without a valid token (a cheating user's try).
    Bypass,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Enter => "enter",
            Op::Poll => "poll",
            Op::Leave => "leave",
            Op::Purchase => "purchase",
            Op::Bypass => "bypass",
        }
    }
}

/// One request and its answer.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    pub op: Op,
    /// Since the start of the run.
    pub start_ms: u64,
    pub latency_us: u64,
    /// How long the request waited for one of the simulator's connections before it was sent
    /// (not in `latency_us`): above a few milliseconds the simulator, not the target, is the
    /// limit.
    pub queued_us: u64,
    /// 0: no answer (refused, reset, timed out).
    pub status: u16,
    /// Answered without the shared store (`"degraded": true`).
    pub degraded: bool,
}

/// Everything one user did and saw. Times are milliseconds since the start of the run.
#[derive(Debug, Clone)]
pub struct UserTrace {
    pub user: u64,
    pub sale: usize,
    pub fate: Fate,
    pub cheat: bool,
    pub arrived_ms: u64,
    /// The position of the user's current entry (a re-entry after a 404 gets a new one).
    pub seq: Option<u64>,
    /// The first `etaSeconds` shown with a position, and when that answer came.
    pub first_eta: Option<(u64, u64)>,
    /// When the last poll answered `WAITING` for the current position was sent.
    pub last_waiting_sent_ms: Option<u64>,
    /// When the first answer with a token came, and whether it was `DIRECT_ADMITTED`.
    pub admitted_ms: Option<u64>,
    pub direct: bool,
    /// When a purchase was answered 2xx.
    pub purchased_ms: Option<u64>,
    /// The backend said this user had bought already (409).
    pub duplicate: bool,
    /// When the user abandoned or left.
    pub gone_ms: Option<u64>,
    /// Polls answered 404 after the user had a position (then it entered again).
    pub lost: u32,
    pub requests: Vec<Req>,
}

/// Live counts for the progress bar.
#[derive(Debug, Default)]
pub struct Counts {
    pub done: AtomicU64,
    pub waiting: AtomicU64,
    pub admitted: AtomicU64,
    pub purchased: AtomicU64,
    pub errors: AtomicU64,
}

/// What every user shares.
pub struct Ctx {
    pub client: reqwest::Client,
    /// The URL without a trailing `/`.
    pub base: String,
    identity: Identity,
    permits: Semaphore,
    jitter: f64,
    poll_interval_s: Option<f64>,
    pub t0: Instant,
    deadline: Instant,
    pub counts: Counts,
    sampling_stopped: AtomicBool,
}

impl Ctx {
    pub fn new(client: reqwest::Client, args: &SimArgs, t0: Instant, deadline: Instant) -> Ctx {
        Ctx {
            client,
            base: args.url.trim_end_matches('/').to_string(),
            identity: args.identity.clone(),
            permits: Semaphore::new(args.connections),
            jitter: args.jitter,
            poll_interval_s: args.poll_interval_s,
            t0,
            deadline,
            counts: Counts::default(),
            sampling_stopped: AtomicBool::new(false),
        }
    }

    pub fn stop_sampling(&self) {
        self.sampling_stopped.store(true, Ordering::Relaxed);
    }

    pub fn sampling_stopped(&self) -> bool {
        self.sampling_stopped.load(Ordering::Relaxed)
    }

    fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// Sleeps `d`, or until the deadline; false when the deadline came first.
    async fn wait(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        if until >= self.deadline {
            tokio::time::sleep_until(self.deadline.into()).await;
            return false;
        }
        tokio::time::sleep_until(until.into()).await;
        true
    }

    /// One request; the answer's status and JSON body (Null when there is none).
    async fn call(
        &self,
        trace: &mut UserTrace,
        op: Op,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
    ) -> (u16, Value) {
        let asked = Instant::now();
        let Ok(_permit) = self.permits.acquire().await else {
            return (0, Value::Null);
        };
        let queued_us = asked.elapsed().as_micros() as u64;
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        req = match &self.identity {
            Identity::Header => req.header("x-user-id", trace.user.to_string()),
            Identity::Cookie(name) => req.header("cookie", format!("{name}={}", trace.user)),
        };
        if let Some(t) = token {
            req = req.header("x-entry-token", t);
        }
        if matches!(op, Op::Purchase | Op::Bypass) {
            req = req
                .header("content-type", "application/json")
                .body(r#"{"quantity":1}"#);
        }
        let start_ms = self.ms();
        let started = Instant::now();
        let (status, body) = match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                match r.bytes().await {
                    Ok(b) => (status, serde_json::from_slice(&b).unwrap_or(Value::Null)),
                    Err(_) => (0, Value::Null),
                }
            }
            Err(_) => (0, Value::Null),
        };
        if status == 0 || status >= 500 {
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
        }
        trace.requests.push(Req {
            op,
            start_ms,
            latency_us: started.elapsed().as_micros() as u64,
            queued_us,
            status,
            degraded: body["degraded"] == true,
        });
        (status, body)
    }

    /// When to poll after a `WAITING` answer: the answer's `pollAfterSeconds` (1 s without
    /// one) or the fixed `--poll-interval-s`, with the configured jitter.
    fn next_poll(&self, answer: &Value, rng: &mut Rng) -> Duration {
        let base = self
            .poll_interval_s
            .unwrap_or_else(|| answer["pollAfterSeconds"].as_u64().unwrap_or(1).max(1) as f64);
        let f = 1.0 + self.jitter * (2.0 * rng.unit() - 1.0);
        Duration::from_secs_f64((base * f).max(0.05))
    }
}

enum Step {
    Enter,
    Poll { polls: u32 },
    Buy { token: String, tries: u32 },
}

fn token_of(v: &Value) -> Option<(String, bool)> {
    let direct = match v["status"].as_str()? {
        "ADMITTED" => false,
        "DIRECT_ADMITTED" => true,
        _ => return None,
    };
    Some((v["entryToken"].as_str()?.to_string(), direct))
}

/// Plays one user from arrival to purchase, departure or the deadline.
pub async fn run(ctx: &Ctx, sale: &Sale, mut plan: Plan) -> UserTrace {
    let mut t = UserTrace {
        user: plan.user,
        sale: plan.sale,
        fate: plan.fate,
        cheat: plan.cheat,
        arrived_ms: plan.arrive.as_millis() as u64,
        seq: None,
        first_eta: None,
        last_waiting_sent_ms: None,
        admitted_ms: None,
        direct: false,
        purchased_ms: None,
        duplicate: false,
        gone_ms: None,
        lost: 0,
        requests: Vec::new(),
    };
    let (queue, purchase) = (sale.queue_path(), sale.purchase_path());
    let entries = format!("{queue}/entries");
    let me = format!("{queue}/entries/me");
    if ctx.wait(plan.arrive).await {
        if plan.cheat {
            for forged in [None, Some("eyJmb3JnZWQiOnRydWV9.AAAA")] {
                ctx.call(&mut t, Op::Bypass, reqwest::Method::POST, &purchase, forged)
                    .await;
            }
        }
        play(ctx, &mut t, &mut plan, &entries, &me, &purchase).await;
    }
    let c = &ctx.counts;
    c.done.fetch_add(1, Ordering::Relaxed);
    t
}

async fn play(
    ctx: &Ctx,
    t: &mut UserTrace,
    plan: &mut Plan,
    entries: &str,
    me: &str,
    purchase: &str,
) {
    let c = &ctx.counts;
    let mut waiting = false;
    let mut set_waiting = |now: bool| {
        if now != waiting {
            if now {
                c.waiting.fetch_add(1, Ordering::Relaxed);
            } else {
                c.waiting.fetch_sub(1, Ordering::Relaxed);
            }
            waiting = now;
        }
    };
    let mut step = Step::Enter;
    loop {
        let pause = match step {
            Step::Enter => {
                let (status, v) = ctx
                    .call(t, Op::Enter, reqwest::Method::POST, entries, None)
                    .await;
                match (status, token_of(&v)) {
                    (200, Some((token, direct))) => {
                        t.admitted_ms.get_or_insert(ctx.ms());
                        t.direct |= direct;
                        set_waiting(false);
                        c.admitted.fetch_add(1, Ordering::Relaxed);
                        step = Step::Buy { token, tries: 0 };
                        Duration::ZERO
                    }
                    (200, None) => {
                        if let Some(seq) = v["position"].as_u64() {
                            t.seq = Some(seq);
                            if let Some(eta) = v["etaSeconds"].as_u64() {
                                t.first_eta.get_or_insert((eta, ctx.ms()));
                            }
                            set_waiting(true);
                            step = Step::Poll { polls: 0 };
                        }
                        // Without a position (a degraded answer) the user enters again.
                        ctx.next_poll(&v, &mut plan.rng)
                    }
                    (429, _) => Duration::from_secs(2),
                    _ => Duration::from_secs(1),
                }
            }
            Step::Poll { polls } => {
                let departs = match plan.fate {
                    Fate::Abandon { after_polls } if polls >= after_polls => Some(false),
                    Fate::Leave { after_polls } if polls >= after_polls => Some(true),
                    _ => None,
                };
                if let Some(leave) = departs {
                    if leave {
                        ctx.call(t, Op::Leave, reqwest::Method::DELETE, me, None)
                            .await;
                    }
                    t.gone_ms = Some(ctx.ms());
                    set_waiting(false);
                    return;
                }
                let sent = ctx.ms();
                let (status, v) = ctx.call(t, Op::Poll, reqwest::Method::GET, me, None).await;
                step = Step::Poll { polls: polls + 1 };
                match (status, token_of(&v)) {
                    (200, Some((token, direct))) => {
                        t.admitted_ms.get_or_insert(ctx.ms());
                        t.direct |= direct;
                        set_waiting(false);
                        c.admitted.fetch_add(1, Ordering::Relaxed);
                        step = Step::Buy { token, tries: 0 };
                        Duration::ZERO
                    }
                    (200, None) => {
                        if v["position"].as_u64().is_some() {
                            t.last_waiting_sent_ms = Some(sent);
                        }
                        ctx.next_poll(&v, &mut plan.rng)
                    }
                    (404, _) => {
                        t.lost += 1;
                        t.last_waiting_sent_ms = None;
                        step = Step::Enter;
                        Duration::ZERO
                    }
                    _ => Duration::from_secs(1),
                }
            }
            Step::Buy { ref token, tries } => {
                let token = token.clone();
                let (status, _) = ctx
                    .call(
                        t,
                        Op::Purchase,
                        reqwest::Method::POST,
                        purchase,
                        Some(&token),
                    )
                    .await;
                match status {
                    200..=299 => {
                        t.purchased_ms = Some(ctx.ms());
                        c.purchased.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    409 => {
                        t.duplicate = true;
                        return;
                    }
                    // Refused by the gate (expired, already used) or by the backend: done.
                    400..=499 => return,
                    _ if tries >= 2 => return,
                    _ => {
                        step = Step::Buy {
                            token,
                            tries: tries + 1,
                        };
                        Duration::from_millis(500)
                    }
                }
            }
        };
        if !ctx.wait(pause).await {
            set_waiting(false);
            return;
        }
    }
}
