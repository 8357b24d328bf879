//! `vq-sim simulate`: plays a sale start against a running gateway or the load balancer in
//! front of the replicas, as its users would: a spike of arrivals, then a tail; each user enters,
//! polls on the interval the API suggests (`pollAfterSeconds`, with jitter), and buys once on the
//! gated route with the token it was given. A share abandons silently, a share leaves, a share
//! tries the purchase route without a token first. The result is a JSON report, an SVG chart over
//! time and a printed summary (`report`, `chart`).
//!
//! - `user`    — one virtual user: its plan and the requests it makes.
//! - `report`  — what the traces say: rates, latencies, errors, ETA error, FIFO, the budget.
//! - `chart`   — the SVG.
//! - `backend` — `vq-sim record-backend`, the recording stand-in for the backend.
//!
//! A package of its own, beside the gateway: a client of it over HTTP that imports none of it,
//! so the sidecar neither compiles nor links the load generator's dependencies.

pub mod backend;
pub mod chart;
pub mod report;
pub mod user;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use report::{Report, Run, StatsSample};
use user::{Ctx, Fate, Plan, Rng, UserTrace};

/// What can go wrong before or after the run (never during it: a failed request is data).
#[derive(Debug, Error)]
pub enum SimError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot write the report to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot draw the chart: {0}")]
    Chart(String),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// Milliseconds since the Unix epoch (the report's and the record's time base, comparable with
/// the gateway's own clock on the same machine).
pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How a virtual user says who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// `X-User-Id: N` (straight to a gateway with `identity.mode = "header"`).
    Header,
    /// `Cookie: NAME=N` (through a load balancer whose auth service maps the session to the id).
    Cookie(String),
}

impl FromStr for Identity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "header" => Ok(Identity::Header),
            Some(("cookie", name))
                if !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
            {
                Ok(Identity::Cookie(name.to_string()))
            }
            _ => Err(format!(
                "identity must be `header` or `cookie:NAME`, not `{s}`"
            )),
        }
    }
}

/// A sale the users queue for: `limited-drop:42` or `ticketing-event:7`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sale {
    pub kind: &'static str,
    pub id: u64,
}

impl Sale {
    pub fn queue_path(&self) -> String {
        format!("/virtual-queues/{}/{}", self.kind, self.id)
    }

    /// The default gated route of the sale's type (`gate.routes` of a default configuration).
    pub fn purchase_path(&self) -> String {
        match self.kind {
            "limited-drop" => format!("/limited-drops/{}/orders", self.id),
            _ => format!("/events/{}/seats/select", self.id),
        }
    }
}

impl std::fmt::Display for Sale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.id)
    }
}

impl FromStr for Sale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("a sale is `limited-drop:ID` or `ticketing-event:ID`, not `{s}`");
        let (kind, id) = s.split_once(':').ok_or_else(bad)?;
        let kind = match kind {
            "limited-drop" => "limited-drop",
            "ticketing-event" => "ticketing-event",
            _ => return Err(bad()),
        };
        let id = id
            .parse::<u64>()
            .ok()
            .filter(|i| *i > 0 && !id.starts_with('+'))
            .ok_or_else(bad)?;
        Ok(Sale { kind, id })
    }
}

/// The command line of `simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Base URL of a gateway, or of the load balancer in front of the replicas (http or https;
    /// https trusts the system's CA certificates, or those of `SSL_CERT_FILE`).
    #[arg(long)]
    pub url: String,
    /// A sale to queue for (`limited-drop:42`, `ticketing-event:7`); repeat for several, users
    /// are spread evenly over them.
    #[arg(long = "sale", default_value = "limited-drop:1")]
    pub sales: Vec<Sale>,
    /// Arrivals per second during the spike.
    #[arg(long, default_value_t = 500.0)]
    pub spike_rate: f64,
    /// Length of the spike, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub spike_s: f64,
    /// Arrivals per second after the spike.
    #[arg(long, default_value_t = 10.0)]
    pub tail_rate: f64,
    /// Length of the tail, seconds.
    #[arg(long, default_value_t = 20.0)]
    pub tail_s: f64,
    /// Stop every user this long after the start, whatever its state (it counts as unfinished).
    #[arg(long, default_value_t = 300)]
    pub max_duration_s: u64,
    /// Share of users who stop polling without a word after a few polls.
    #[arg(long, default_value_t = 0.05)]
    pub abandon: f64,
    /// Share of users who leave the queue (`DELETE .../entries/me`) after a few polls.
    #[arg(long, default_value_t = 0.05)]
    pub leave: f64,
    /// Share of users who first try the purchase route without a token and with a forged one.
    #[arg(long, default_value_t = 0.01)]
    pub cheat: f64,
    /// Poll every this many seconds instead of when `pollAfterSeconds` says (clients that ignore
    /// the hint).
    #[arg(long)]
    pub poll_interval_s: Option<f64>,
    /// Relative jitter on each poll interval (0.2: ±20 %).
    #[arg(long, default_value_t = 0.2)]
    pub jitter: f64,
    /// Requests in flight at most (and so keep-alive connections at most).
    #[arg(long, default_value_t = 256)]
    pub connections: usize,
    /// Per-request timeout, milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// `header` (X-User-Id) or `cookie:NAME` (a session cookie holding the user id).
    #[arg(long, default_value = "header")]
    pub identity: Identity,
    /// The first user id; users are numbered from it. Default: from the clock, so runs differ.
    #[arg(long)]
    pub first_user: Option<u64>,
    /// The gateways' `queue.batch_size` (for the budget line and checks).
    #[arg(long, default_value_t = 100)]
    pub batch: u64,
    /// The gateways' `queue.tick_ms`.
    #[arg(long, default_value_t = 2000)]
    pub tick_ms: u64,
    /// The gateways' `queue.heartbeat_timeout_s` (when an abandoned user stops taking slots).
    #[arg(long, default_value_t = 60)]
    pub heartbeat_timeout_s: u64,
    /// `record-backend`'s base URL (or its `/_record` URL): count purchases where they arrive,
    /// not where sent.
    #[arg(long)]
    pub backend_record: Option<String>,
    /// Directory for `report.json` and `chart.svg`.
    #[arg(long, default_value = "sim-report")]
    pub out: PathBuf,
    /// Seed of the users' choices (fates, jitter).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads of the simulator's own runtime.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

impl SimArgs {
    fn validate(&self) -> Result<(), SimError> {
        let usage = |m: &str| Err(SimError::Usage(m.to_string()));
        let share = |x: f64| (0.0..=1.0).contains(&x);
        match reqwest::Url::parse(&self.url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => return usage("--url must be an http:// or https:// URL with a host"),
        }
        if self.sales.is_empty() {
            return usage("at least one --sale");
        }
        for (name, x) in [
            ("--spike-rate", self.spike_rate),
            ("--spike-s", self.spike_s),
            ("--tail-rate", self.tail_rate),
            ("--tail-s", self.tail_s),
        ] {
            if !x.is_finite() || x < 0.0 {
                return Err(SimError::Usage(format!("{name} must be a number ≥ 0")));
            }
        }
        if self.planned_users() == 0 {
            return usage("the arrival profile has no users (rate × seconds is 0)");
        }
        if self.planned_users() > 10_000_000 {
            return usage("more than 10,000,000 users: lower the rates or the durations");
        }
        if self.max_duration_s > 86_400 {
            return usage("--max-duration-s is at most 86400 (a day)");
        }
        if self.spike_s + self.tail_s > self.max_duration_s as f64 {
            return usage("--spike-s plus --tail-s is longer than --max-duration-s");
        }
        if let Some(first) = self.first_user {
            let last = first.checked_add(self.planned_users());
            if first == 0 || last.is_none_or(|l| l > i64::MAX as u64) {
                return usage(
                    "--first-user must be at least 1, and the last user id at most 2^63 - 1",
                );
            }
        }
        if !share(self.abandon) || !share(self.leave) || !share(self.cheat) {
            return usage("--abandon, --leave and --cheat are shares between 0 and 1");
        }
        if self.abandon + self.leave > 1.0 {
            return usage("--abandon plus --leave is more than 1");
        }
        if self
            .poll_interval_s
            .is_some_and(|p| !(0.05..=3600.0).contains(&p))
        {
            return usage("--poll-interval-s must be between 0.05 and 3600");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return usage("--jitter must be at least 0 and below 1");
        }
        if self.connections == 0 || self.threads == 0 {
            return usage("--connections and --threads must be at least 1");
        }
        if self.batch == 0 || self.tick_ms == 0 || self.timeout_ms == 0 {
            return usage("--batch, --tick-ms and --timeout-ms must be at least 1");
        }
        if self.max_duration_s == 0 {
            return usage("--max-duration-s must be at least 1");
        }
        if let Some(r) = &self.backend_record {
            if record_url(r).is_none() {
                return usage(
                    "--backend-record takes record-backend's base URL (http://host:port) or its /_record URL",
                );
            }
        }
        Ok(())
    }

    fn spike_users(&self) -> u64 {
        (self.spike_rate * self.spike_s).floor() as u64
    }

    fn planned_users(&self) -> u64 {
        self.spike_users() + (self.tail_rate * self.tail_s).floor() as u64
    }

    /// When user `i` arrives: evenly spaced at the spike rate, then at the tail rate.
    fn arrival(&self, i: u64) -> Duration {
        let spike = self.spike_users();
        let s = if i < spike {
            i as f64 / self.spike_rate
        } else {
            self.spike_s + (i - spike) as f64 / self.tail_rate
        };
        Duration::from_secs_f64(s)
    }

    /// Every user's plan, from the seed.
    fn plans(&self, first_user: u64) -> Vec<Plan> {
        (0..self.planned_users())
            .map(|i| {
                let mut rng = Rng::new(self.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let roll = rng.unit();
                let after = rng.below(4) as u32;
                let fate = if roll < self.abandon {
                    Fate::Abandon { after_polls: after }
                } else if roll < self.abandon + self.leave {
                    Fate::Leave { after_polls: after }
                } else {
                    Fate::Stay
                };
                Plan {
                    user: first_user + i,
                    sale: (i % self.sales.len() as u64) as usize,
                    arrive: self.arrival(i),
                    fate,
                    cheat: rng.unit() < self.cheat,
                    rng,
                }
            })
            .collect()
    }
}

/// Runs the simulation and writes the report; returns it.
pub fn run(args: SimArgs) -> Result<Report, SimError> {
    args.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .map_err(SimError::Runtime)?;
    let report = runtime.block_on(simulate(&args))?;
    std::fs::create_dir_all(&args.out).map_err(|source| SimError::Write {
        path: args.out.clone(),
        source,
    })?;
    let json = args.out.join("report.json");
    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
    std::fs::write(&json, text).map_err(|source| SimError::Write { path: json, source })?;
    let svg = args.out.join("chart.svg");
    chart::draw(&report, &svg).map_err(SimError::Chart)?;
    Ok(report)
}

async fn simulate(args: &SimArgs) -> Result<Report, SimError> {
    let client = reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(args.connections)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .timeout(Duration::from_millis(args.timeout_ms))
        .build()
        .map_err(|e| SimError::Usage(format!("cannot build the HTTP client: {e}")))?;
    // By default from the clock: runs started a millisecond apart get disjoint ids for up to
    // 10,000 users, a second apart for up to 10,000,000.
    let first_user = args
        .first_user
        .unwrap_or_else(|| crate::epoch_ms().saturating_mul(10_000));
    let plans = args.plans(first_user);
    let started_at_ms = crate::epoch_ms();
    let t0 = Instant::now();
    let ctx = Arc::new(Ctx::new(
        client.clone(),
        args,
        t0,
        t0 + Duration::from_secs(args.max_duration_s),
    ));
    let total = plans.len() as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} done · {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let sampler = tokio::spawn(sample_stats(ctx.clone(), args.sales.clone(), first_user));
    let mut handles = Vec::with_capacity(plans.len());
    for plan in plans {
        let ctx = ctx.clone();
        let sale = args.sales[plan.sale].clone();
        handles.push(tokio::spawn(
            async move { user::run(&ctx, &sale, plan).await },
        ));
    }
    let progress = {
        let (ctx, bar) = (ctx.clone(), bar.clone());
        tokio::spawn(async move {
            loop {
                let c = &ctx.counts;
                bar.set_position(c.done.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "{} waiting · {} admitted · {} bought · {} errors",
                    c.waiting.load(Ordering::Relaxed),
                    c.admitted.load(Ordering::Relaxed),
                    c.purchased.load(Ordering::Relaxed),
                    c.errors.load(Ordering::Relaxed),
                ));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let mut traces: Vec<UserTrace> = Vec::with_capacity(handles.len());
    let mut lost_tasks = 0;
    for h in handles {
        match h.await {
            Ok(t) => traces.push(t),
            Err(_) => lost_tasks += 1,
        }
    }
    let duration_ms = t0.elapsed().as_millis() as u64;
    progress.abort();
    bar.finish_and_clear();
    ctx.stop_sampling();
    let (stats, stats_failed) = sampler.await.unwrap_or_default();
    let backend = match &args.backend_record {
        Some(url) => Some(fetch_record(&client, &record_url(url).unwrap_or_default()).await),
        None => None,
    };
    Ok(Report::build(
        args,
        Run {
            started_at_ms,
            duration_ms,
            lost_tasks,
            stats_failed,
        },
        &traces,
        &stats,
        backend.as_ref(),
    ))
}

/// Each second, every sale's cluster-wide stats (the server's view of the queue).
/// Each second, every sale's cluster-wide stats (the server's view of the queue), asked as the
/// first user (a load balancer may turn anonymous requests away). Returns the samples and how
/// many asks failed.
async fn sample_stats(ctx: Arc<Ctx>, sales: Vec<Sale>, user: u64) -> (Vec<StatsSample>, u64) {
    let mut samples = Vec::new();
    let mut failed = 0;
    let mut next = Instant::now();
    while !ctx.sampling_stopped() {
        for (i, sale) in sales.iter().enumerate() {
            let url = format!("{}{}/stats", ctx.base, sale.queue_path());
            let t_ms = ctx.t0.elapsed().as_millis() as u64;
            match ctx.stats(&url, user).await {
                Some(v) => samples.push(StatsSample {
                    t_ms,
                    sale: i,
                    waiting: v["waitingCount"].as_u64().unwrap_or(0),
                    admitted: v["admittedCount"].as_u64().unwrap_or(0),
                }),
                None => failed += 1,
            }
        }
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.into()).await;
    }
    (samples, failed)
}

/// The backend's record, or why it could not be read (the run's report is written either way).
/// The `/_record` URL of record-backend given its base URL or that URL itself; None for anything
/// else (another path would answer something that is not a record).
fn record_url(given: &str) -> Option<String> {
    let mut url = reqwest::Url::parse(given).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return None;
    }
    match url.path() {
        "" | "/" => url.set_path("/_record"),
        "/_record" => {}
        _ => return None,
    }
    Some(url.to_string())
}

async fn fetch_record(client: &reqwest::Client, url: &str) -> Result<backend::Record, String> {
    let fail = |e: String| format!("cannot read the backend record at {url}: {e}");
    let r = client
        .get(url)
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !r.status().is_success() {
        return Err(fail(format!("status {}", r.status())));
    }
    let bytes = r.bytes().await.map_err(|e| fail(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: SimArgs,
    }

    fn args(extra: &[&str]) -> SimArgs {
        let mut v = vec!["t", "--url", "http://127.0.0.1:1"];
        v.extend_from_slice(extra);
        T::try_parse_from(v).unwrap().a
    }

    #[test]
    fn sales_and_identities_parse_strictly() {
        assert_eq!(
            "limited-drop:42".parse::<Sale>(),
            Ok(Sale {
                kind: "limited-drop",
                id: 42
            })
        );
        for bad in [
            "limited-drop",
            "drop:1",
            "limited-drop:0",
            "limited-drop:+1",
            "limited-drop:x",
        ] {
            assert!(bad.parse::<Sale>().is_err(), "{bad}");
        }
        assert_eq!("header".parse::<Identity>(), Ok(Identity::Header));
        assert_eq!(
            "cookie:session".parse::<Identity>(),
            Ok(Identity::Cookie("session".into()))
        );
        for bad in ["cookie:", "cookie:a b", "headers", "cookie:a;b"] {
            assert!(bad.parse::<Identity>().is_err(), "{bad}");
        }
    }

    #[test]
    fn arrivals_follow_the_profile_and_fates_their_shares() {
        let a = args(&[
            "--spike-rate",
            "100",
            "--spike-s",
            "2",
            "--tail-rate",
            "10",
            "--tail-s",
            "3",
            "--abandon",
            "0.2",
            "--leave",
            "0.1",
            "--sale",
            "limited-drop:1",
            "--sale",
            "ticketing-event:2",
        ]);
        let plans = a.plans(1000);
        assert_eq!(plans.len(), 230);
        assert_eq!(plans[0].arrive, Duration::ZERO);
        assert_eq!(plans[100].arrive, Duration::from_secs(1));
        assert_eq!(plans[200].arrive, Duration::from_secs(2));
        assert_eq!(plans[229].arrive, Duration::from_secs_f64(4.9));
        assert_eq!(plans[229].user, 1229);
        assert_eq!((plans[0].sale, plans[1].sale), (0, 1));
        let share = |f: fn(&Fate) -> bool| {
            plans.iter().filter(|p| f(&p.fate)).count() as f64 / plans.len() as f64
        };
        let abandon = share(|f| matches!(f, Fate::Abandon { .. }));
        let leave = share(|f| matches!(f, Fate::Leave { .. }));
        assert!((0.12..0.28).contains(&abandon), "{abandon}");
        assert!((0.04..0.17).contains(&leave), "{leave}");
    }

    #[test]
    fn the_backend_record_takes_the_base_url_or_the_record_url() {
        for given in [
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/",
            "http://127.0.0.1:9000/_record",
        ] {
            assert_eq!(
                record_url(given).as_deref(),
                Some("http://127.0.0.1:9000/_record"),
                "{given}"
            );
        }
        for bad in ["http://127.0.0.1:9000/x", "ftp://h/", "not a url"] {
            assert_eq!(record_url(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        for extra in [
            &["--abandon", "0.7", "--leave", "0.5"][..],
            &["--spike-rate", "0", "--tail-rate", "0"],
            &["--jitter", "1"],
            &["--connections", "0"],
            &["--spike-rate", "NaN"],
            &["--backend-record", "not a url"],
            &["--backend-record", "http://127.0.0.1:9000/orders"],
        ] {
            let e = args(extra).validate().unwrap_err();
            assert!(matches!(e, SimError::Usage(_)), "{extra:?}");
        }
        for url in ["ftp://x", "http://", "127.0.0.1:8080", "https//x"] {
            let mut a = args(&[]);
            a.url = url.into();
            assert!(a.validate().is_err(), "{url}");
        }
        let mut a = args(&["--poll-interval-s", "0"]);
        assert!(a.validate().is_err());
        a.url = "https://lb.example:8443/".into();
        a.poll_interval_s = Some(2.0);
        assert!(a.validate().is_ok());
        assert!(args(&[]).validate().is_ok());
    }
}
