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
    /// The last `etaSeconds` shown for the current position, and how many answers showed a
    /// larger one than the answer before them.
    pub last_eta: Option<u64>,
    pub eta_rises: u32,
    /// When the last poll answered `WAITING` for the current position was sent.
    pub last_waiting_sent_ms: Option<u64>,
    /// When the last request the queue counted as a heartbeat (an enter or poll answered with a
    /// position) was sent: eviction counts from there.
    pub last_heartbeat_ms: Option<u64>,
    /// When the first answer with a token came, and whether it was `DIRECT_ADMITTED`.
    pub admitted_ms: Option<u64>,
    pub direct: bool,
    /// When a purchase was answered 2xx.
    pub purchased_ms: Option<u64>,
    /// Purchase requests sent (more than one: retried after a 5xx or no answer).
    pub purchase_tries: u32,
    /// The backend said this user had bought already (409).
    pub duplicate: bool,
    /// When the user abandoned or left.
    pub gone_ms: Option<u64>,
    /// Polls answered 404 after the user had a position (then it entered again).
    pub lost: u32,
    /// The 4xx that ended the user's run (an enter refused for good, a purchase refused).
    pub refused: Option<u16>,
    pub requests: Vec<Req>,
}

impl UserTrace {
    /// An answer showed `eta` for the current position: counted as a rise when it is larger
    /// than the one before.
    fn saw_eta(&mut self, eta: u64) {
        if self.last_eta.is_some_and(|prev| eta > prev) {
            self.eta_rises += 1;
        }
        self.last_eta = Some(eta);
    }

    /// A user who has done nothing yet.
    pub fn new(plan: &Plan) -> UserTrace {
        UserTrace {
            user: plan.user,
            sale: plan.sale,
            fate: plan.fate,
            cheat: plan.cheat,
            arrived_ms: plan.arrive.as_millis() as u64,
            seq: None,
            first_eta: None,
            last_eta: None,
            eta_rises: 0,
            last_waiting_sent_ms: None,
            last_heartbeat_ms: None,
            admitted_ms: None,
            direct: false,
            purchased_ms: None,
            purchase_tries: 0,
            duplicate: false,
            gone_ms: None,
            lost: 0,
            refused: None,
            requests: Vec::new(),
        }
    }
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

    /// One request and its answer (status 0 and a Null body when there is none).
    async fn call(
        &self,
        trace: &mut UserTrace,
        op: Op,
        method: reqwest::Method,
        path: &str,
        header: Option<(&'static str, &str)>,
    ) -> Answer {
        let asked = Instant::now();
        let Ok(_permit) = self.permits.acquire().await else {
            return Answer::none(self.ms());
        };
        let queued_us = asked.elapsed().as_micros() as u64;
        let mut req = self.as_user(
            self.client.request(method, format!("{}{path}", self.base)),
            trace.user,
        );
        if let Some((name, value)) = header {
            req = req.header(name, value);
        }
        if matches!(op, Op::Purchase | Op::Bypass) {
            req = req
                .header("content-type", "application/json")
                .body(r#"{"quantity":1}"#);
        }
        let start_ms = self.ms();
        let started = Instant::now();
        let (status, body, retry_after) = match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                let retry_after = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(|s| Duration::from_secs(s.min(MAX_WAIT_S)));
                match r.bytes().await {
                    Ok(b) => (
                        status,
                        serde_json::from_slice(&b).unwrap_or(Value::Null),
                        retry_after,
                    ),
                    Err(_) => (0, Value::Null, None),
                }
            }
            Err(_) => (0, Value::Null, None),
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
        Answer {
            status,
            body,
            retry_after,
            sent_ms: start_ms,
        }
    }

    /// `req` with the identity of `user`.
    fn as_user(&self, req: reqwest::RequestBuilder, user: u64) -> reqwest::RequestBuilder {
        match &self.identity {
            Identity::Header => req.header("x-user-id", user.to_string()),
            Identity::Cookie(name) => req.header("cookie", format!("{name}={user}")),
        }
    }

    /// A `/stats` answer, asked as `user`; `None` when there is no 200 with JSON.
    pub async fn stats(&self, url: &str, user: u64) -> Option<Value> {
        let r = self.as_user(self.client.get(url), user).send().await.ok()?;
        if r.status() != reqwest::StatusCode::OK {
            return None;
        }
        serde_json::from_slice(&r.bytes().await.ok()?).ok()
    }

    /// When to poll after a `WAITING` answer: the answer's `pollAfterSeconds` (1 s without
    /// one) or the fixed `--poll-interval-s`, with the configured jitter.
    fn next_poll(&self, answer: &Value, rng: &mut Rng) -> Duration {
        let hint = || {
            answer["pollAfterSeconds"]
                .as_u64()
                .unwrap_or(1)
                .clamp(1, MAX_WAIT_S) as f64
        };
        let base = self.poll_interval_s.unwrap_or_else(hint);
        let f = 1.0 + self.jitter * (2.0 * rng.unit() - 1.0);
        Duration::from_secs_f64((base * f).max(0.05))
    }
}

/// The longest wait an answer may ask for (`pollAfterSeconds`, `Retry-After`), seconds.
const MAX_WAIT_S: u64 = 3600;

/// What one request got.
struct Answer {
    /// 0: no answer.
    status: u16,
    body: Value,
    retry_after: Option<Duration>,
    /// When it was sent (after waiting for a connection), since the start of the run.
    sent_ms: u64,
}

impl Answer {
    fn none(now_ms: u64) -> Answer {
        Answer {
            status: 0,
            body: Value::Null,
            retry_after: None,
            sent_ms: now_ms,
        }
    }

    /// The token of an `ADMITTED` / `DIRECT_ADMITTED` answer, and whether it was direct.
    fn token(&self) -> Option<(String, bool)> {
        if self.status != 200 {
            return None;
        }
        let direct = match self.body["status"].as_str()? {
            "ADMITTED" => false,
            "DIRECT_ADMITTED" => true,
            _ => return None,
        };
        Some((self.body["entryToken"].as_str()?.to_string(), direct))
    }

    /// A `WAITING` answer's position (`None` for a degraded one, which has none).
    fn position(&self) -> Option<u64> {
        (self.status == 200 && self.body["status"] == "WAITING")
            .then(|| self.body["position"].as_u64())
            .flatten()
    }

    fn is_waiting(&self) -> bool {
        self.status == 200 && self.body["status"] == "WAITING"
    }
}

enum Step {
    Enter,
    Poll { polls: u32 },
    Buy { token: String, tries: u32 },
}

/// Plays one user from arrival to purchase, departure or the deadline.
pub async fn run(ctx: &Ctx, sale: &Sale, mut plan: Plan) -> UserTrace {
    let mut t = UserTrace::new(&plan);
    let (queue, purchase) = (sale.queue_path(), sale.purchase_path());
    let entries = format!("{queue}/entries");
    let me = format!("{queue}/entries/me");
    if ctx.wait(plan.arrive).await {
        if plan.cheat {
            for forged in [None, Some("eyJmb3JnZWQiOnRydWV9.AAAA")] {
                let forged = forged.map(|f| ("x-entry-token", f));
                ctx.call(&mut t, Op::Bypass, reqwest::Method::POST, &purchase, forged)
                    .await;
            }
        }
        play(ctx, &mut t, &mut plan, &entries, &me, &purchase).await;
    }
    ctx.counts.done.fetch_add(1, Ordering::Relaxed);
    t
}

/// After an answer with a token: note the admission, go and buy.
fn admitted(ctx: &Ctx, t: &mut UserTrace, token: String, direct: bool) -> Step {
    t.admitted_ms.get_or_insert(ctx.ms());
    t.direct |= direct;
    ctx.counts.admitted.fetch_add(1, Ordering::Relaxed);
    Step::Buy { token, tries: 0 }
}

/// How long to wait after an answer that was not what the user wanted: `Retry-After` when
/// given, else 2 s after a 429 and 1 s after anything else.
fn backoff(a: &Answer) -> Duration {
    a.retry_after
        .unwrap_or(Duration::from_secs(if a.status == 429 { 2 } else { 1 }))
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
    // The queue ticket of the last waiting answer, sent back with every poll: it gives the user
    // precedence over fresh arrivals while the store is down, and its place back if the store
    // lost it.
    let mut ticket: Option<String> = None;
    loop {
        let pause = match step {
            Step::Enter => {
                let a = ctx
                    .call(t, Op::Enter, reqwest::Method::POST, entries, None)
                    .await;
                if let Some((token, direct)) = a.token() {
                    set_waiting(false);
                    step = admitted(ctx, t, token, direct);
                    Duration::ZERO
                } else if a.is_waiting() {
                    if let Some(tk) = a.body["queueTicket"].as_str() {
                        ticket = Some(tk.to_string());
                    }
                    if let Some(seq) = a.position() {
                        t.seq = Some(seq);
                        t.last_heartbeat_ms = Some(a.sent_ms);
                        if let Some(eta) = a.body["etaSeconds"].as_u64() {
                            t.first_eta.get_or_insert((eta, ctx.ms()));
                            t.saw_eta(eta);
                        }
                        set_waiting(true);
                        step = Step::Poll { polls: 0 };
                    }
                    // Without a position (a degraded answer) the user enters again.
                    ctx.next_poll(&a.body, &mut plan.rng)
                } else if (400..500).contains(&a.status) && a.status != 429 {
                    // Refused for good (a bad request, an unknown sale, no identity).
                    t.refused = Some(a.status);
                    set_waiting(false);
                    return;
                } else {
                    backoff(&a)
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
                let shown = ticket.as_deref().map(|tk| ("x-queue-ticket", tk));
                let a = ctx.call(t, Op::Poll, reqwest::Method::GET, me, shown).await;
                step = Step::Poll { polls: polls + 1 };
                if let Some((token, direct)) = a.token() {
                    set_waiting(false);
                    step = admitted(ctx, t, token, direct);
                    Duration::ZERO
                } else if a.is_waiting() {
                    if let Some(tk) = a.body["queueTicket"].as_str() {
                        ticket = Some(tk.to_string());
                    }
                    if a.position().is_some() {
                        t.last_waiting_sent_ms = Some(a.sent_ms);
                        t.last_heartbeat_ms = Some(a.sent_ms);
                        if let Some(eta) = a.body["etaSeconds"].as_u64() {
                            t.saw_eta(eta);
                        }
                    }
                    ctx.next_poll(&a.body, &mut plan.rng)
                } else if a.status == 404 {
                    // No longer in the queue: enter again, at the back, with a new position.
                    t.lost += 1;
                    t.seq = None;
                    t.last_eta = None;
                    t.last_waiting_sent_ms = None;
                    step = Step::Enter;
                    Duration::ZERO
                } else {
                    backoff(&a)
                }
            }
            Step::Buy { ref token, tries } => {
                let token = token.clone();
                t.purchase_tries += 1;
                let a = ctx
                    .call(
                        t,
                        Op::Purchase,
                        reqwest::Method::POST,
                        purchase,
                        Some(("x-entry-token", &token)),
                    )
                    .await;
                match a.status {
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
                    400..=499 => {
                        t.refused = Some(a.status);
                        return;
                    }
                    // No answer or a 5xx: try again, twice at most, with the same token.
                    _ if tries >= 2 => return,
                    _ => {
                        step = Step::Buy {
                            token,
                            tries: tries + 1,
                        };
                        a.retry_after.unwrap_or(Duration::from_millis(500))
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
