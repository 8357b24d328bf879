//! What a simulated sale's traces say: the JSON report and the printed summary.
//!
//! Times are milliseconds since the start of the run. Definitions:
//! - **ETA error**: `|etaSeconds first shown − actual wait| / actual wait`, the actual wait being
//!   from that answer to the first answer with a token (users who kept their first position and
//!   were admitted by the pump, not let through by fail-open).
//! - **FIFO inversion**: a user whose poll, sent after a user with a later position had been
//!   answered `ADMITTED`, was still answered `WAITING` (the mark never moves back, so that is
//!   an admission out of order).
//! - **Slots to departed users**: users who abandoned (stopped polling) and whose position the
//!   mark (sampled each second from `/stats`) reached after they stopped but before the
//!   heartbeat timeout could evict them: a slot given to somebody who had gone.
//! - **Budget**: per sale, the most purchases that reached the backend in any window of 1..=10
//!   ticks, against `batch × ticks`; `lagTicks` is how late (in ticks) the slowest buyer bought
//!   after its last `WAITING` answer, by which users of consecutive ticks may buy together.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::backend::Record;
use super::user::{Fate, Op, UserTrace};
use super::SimArgs;

/// Facts of the run besides the users' traces.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub started_at_ms: u64,
    pub duration_ms: u64,
    /// User tasks that ended without a trace (a panic): counted, never hidden.
    pub lost_tasks: u64,
    /// `/stats` asks that got no usable answer.
    pub stats_failed: u64,
}

/// One `/stats` sample of one sale.
#[derive(Debug, Clone, Copy)]
pub struct StatsSample {
    pub t_ms: u64,
    pub sale: usize,
    pub waiting: u64,
    pub admitted: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    pub spike_rate: f64,
    pub spike_s: f64,
    pub tail_rate: f64,
    pub tail_s: f64,
    pub batch: u64,
    pub tick_ms: u64,
    /// Polls at a fixed interval instead of `pollAfterSeconds` (absent: the hint).
    pub poll_interval_s: Option<f64>,
    pub abandon: f64,
    pub leave: f64,
    pub cheat: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Users {
    pub planned: u64,
    pub arrived: u64,
    /// Users who kept polling (neither abandoned nor left).
    pub stayed: u64,
    pub admitted: u64,
    /// Of them, let through by fail-open (`DIRECT_ADMITTED`).
    pub direct_admitted: u64,
    pub purchased: u64,
    /// Users who stayed but had not bought when the run ended.
    pub stayed_without_purchase: u64,
    /// Users whose run ended on a 4xx (an enter refused for good, a purchase refused).
    pub refused: u64,
    /// User tasks that crashed (their requests are not in this report).
    pub lost_tasks: u64,
    pub abandoned: u64,
    pub left: u64,
    /// Polls answered 404 for a user who held a position (it entered again).
    pub lost_positions: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    pub count: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Answers by status (`"0"`: no answer).
    pub statuses: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorSample {
    pub at_ms: u64,
    pub op: &'static str,
    pub status: u16,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Errors {
    pub five_xx: u64,
    pub no_answer: u64,
    /// The first 1000 of them, in time order.
    pub samples: Vec<ErrorSample>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SaleBudget {
    pub sale: String,
    pub purchases: u64,
    pub budget_per_tick: u64,
    /// The most purchases in any window of 1, 2, … 10 ticks.
    pub max_per_ticks: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// `record-backend` (counted where they arrived) or `simulator` (2xx answers it got).
    pub source: &'static str,
    pub purchases: u64,
    /// Second purchases the backend refused (409) of users who sent one purchase request.
    pub duplicates: u64,
    /// 409s for users whose purchase the simulator sent again after a 5xx or no answer (the
    /// first try had reached the backend).
    pub duplicates_after_retry: u64,
    /// Why `record-backend` could not be read (the figures are then the simulator's).
    pub record_error: Option<String>,
    /// Purchases at the backend by users who never got a token in this run.
    pub without_token: u64,
    pub lag_ticks: u64,
    pub per_sale: Vec<SaleBudget>,
}

/// One second of the run.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Second {
    pub t_s: u64,
    pub enters: u64,
    pub polls: u64,
    /// Users waiting, as the simulator sees them.
    pub waiting: u64,
    /// Users waiting, as `/stats` reports them (summed over the sales; absent when unsampled).
    pub waiting_server: Option<u64>,
    pub admissions: u64,
    pub purchases: u64,
    pub budget: f64,
    pub poll_p50_ms: f64,
    pub poll_p95_ms: f64,
    pub poll_p99_ms: f64,
    pub errors: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub url: String,
    pub sales: Vec<String>,
    pub profile: Profile,
    pub started_at_ms: u64,
    pub duration_ms: u64,
    pub users: Users,
    pub target_enter_rate: f64,
    /// First enters per second: the busiest second, and the mean over the spike's seconds.
    pub peak_enter_rate: f64,
    pub spike_enter_rate: f64,
    pub endpoints: BTreeMap<&'static str, Latency>,
    pub errors: Errors,
    pub degraded_answers: u64,
    /// Milliseconds requests waited for one of the simulator's `--connections` (not part of the
    /// latencies above): when this grows, the simulator is the bottleneck, not the target.
    pub client_queue_ms: Spread,
    /// Seconds from arrival to the first answer with a token.
    pub time_to_admission_s: Spread,
    /// Relative ETA error (0.1 = 10 %) of admitted users.
    pub eta_error: Spread,
    /// Users shown an ETA who were still waiting when the run ended (not in `etaError`).
    pub eta_unfinished: u64,
    /// Answers whose `etaSeconds` was larger than the same user's answer before (same position).
    pub eta_rises: u64,
    pub fifo_inversions: u64,
    /// Absent when `/stats` gave no sample.
    pub slots_to_departed: Option<u64>,
    pub stats_samples: u64,
    pub stats_failed: u64,
    pub bypass_attempts: u64,
    /// Bypass attempts answered 2xx or reaching the backend (must be 0).
    pub bypass_passed: u64,
    pub backend: Backend,
    pub series: Vec<Second>,
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn spread(mut v: Vec<f64>) -> Spread {
    v.sort_by(f64::total_cmp);
    Spread {
        count: v.len() as u64,
        p50: round3(pct(&v, 50.0)),
        p90: round3(pct(&v, 90.0)),
        p95: round3(pct(&v, 95.0)),
        p99: round3(pct(&v, 99.0)),
        max: round3(v.last().copied().unwrap_or(0.0)),
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The most entries of sorted `times` in any window of `width` ms.
fn max_in_window(times: &[u64], width: u64) -> u64 {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= width {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best as u64
}

/// Users overtaken: see the module documentation.
fn fifo_inversions(traces: &[&UserTrace]) -> u64 {
    let mut admitted: Vec<(u64, u64)> = traces
        .iter()
        .filter(|t| !t.direct)
        .filter_map(|t| Some((t.seq?, t.admitted_ms?)))
        .collect();
    admitted.sort_unstable();
    // suffix[i]: the earliest admission among positions admitted[i..].
    let mut suffix = vec![u64::MAX; admitted.len() + 1];
    for i in (0..admitted.len()).rev() {
        suffix[i] = suffix[i + 1].min(admitted[i].1);
    }
    traces
        .iter()
        .filter_map(|t| Some((t.seq?, t.last_waiting_sent_ms?)))
        .filter(|(seq, sent)| {
            let later = admitted.partition_point(|(s, _)| s <= seq);
            suffix[later] < *sent
        })
        .count() as u64
}

impl Report {
    pub fn build(
        args: &SimArgs,
        run: Run,
        traces: &[UserTrace],
        stats: &[StatsSample],
        record: Option<&Result<Record, String>>,
    ) -> Report {
        let Run {
            started_at_ms,
            duration_ms,
            ..
        } = run;
        let arrived: Vec<&UserTrace> = traces.iter().filter(|t| !t.requests.is_empty()).collect();
        let stayed = |t: &&&UserTrace| t.fate == Fate::Stay;
        let users = Users {
            planned: args.planned_users(),
            arrived: arrived.len() as u64,
            stayed: arrived.iter().filter(stayed).count() as u64,
            admitted: arrived.iter().filter(|t| t.admitted_ms.is_some()).count() as u64,
            direct_admitted: arrived.iter().filter(|t| t.direct).count() as u64,
            purchased: arrived.iter().filter(|t| t.purchased_ms.is_some()).count() as u64,
            stayed_without_purchase: arrived
                .iter()
                .filter(stayed)
                .filter(|t| t.purchased_ms.is_none())
                .count() as u64,
            abandoned: arrived
                .iter()
                .filter(|t| matches!(t.fate, Fate::Abandon { .. }) && t.gone_ms.is_some())
                .count() as u64,
            left: arrived
                .iter()
                .filter(|t| matches!(t.fate, Fate::Leave { .. }) && t.gone_ms.is_some())
                .count() as u64,
            lost_positions: arrived.iter().map(|t| u64::from(t.lost)).sum(),
            refused: arrived.iter().filter(|t| t.refused.is_some()).count() as u64,
            lost_tasks: run.lost_tasks,
        };

        let requests = || arrived.iter().flat_map(|t| t.requests.iter());
        let mut endpoints = BTreeMap::new();
        for op in [Op::Enter, Op::Poll, Op::Leave, Op::Purchase, Op::Bypass] {
            let mut lat: Vec<f64> = Vec::new();
            let mut statuses = BTreeMap::new();
            for r in requests().filter(|r| r.op == op) {
                lat.push(r.latency_us as f64 / 1000.0);
                *statuses.entry(r.status.to_string()).or_insert(0) += 1;
            }
            if lat.is_empty() {
                continue;
            }
            let s = spread(lat);
            endpoints.insert(
                op.name(),
                Latency {
                    count: s.count,
                    p50_ms: s.p50,
                    p95_ms: s.p95,
                    p99_ms: s.p99,
                    max_ms: s.max,
                    statuses,
                },
            );
        }

        let mut failed: Vec<ErrorSample> = requests()
            .filter(|r| r.status == 0 || r.status >= 500)
            .map(|r| ErrorSample {
                at_ms: r.start_ms,
                op: r.op.name(),
                status: r.status,
            })
            .collect();
        failed.sort_by_key(|e| e.at_ms);
        let errors = Errors {
            five_xx: failed.iter().filter(|e| e.status >= 500).count() as u64,
            no_answer: failed.iter().filter(|e| e.status == 0).count() as u64,
            samples: failed.into_iter().take(1000).collect(),
        };

        // First enters: each user's first request that was an enter.
        let first_enters: Vec<u64> = arrived
            .iter()
            .filter_map(|t| t.requests.iter().find(|r| r.op == Op::Enter))
            .map(|r| r.start_ms)
            .collect();
        let seconds = duration_ms.div_ceil(1000).max(1) as usize;
        let mut per_sec = vec![0u64; seconds];
        for ms in &first_enters {
            per_sec[((ms / 1000) as usize).min(seconds - 1)] += 1;
        }
        let peak_enter_rate = per_sec.iter().copied().max().unwrap_or(0) as f64;
        let spike_enter_rate = if args.spike_s > 0.0 && args.spike_rate > 0.0 {
            let spike_secs = (args.spike_s.ceil() as usize).clamp(1, seconds);
            per_sec[..spike_secs].iter().sum::<u64>() as f64 / spike_secs as f64
        } else {
            0.0
        };

        let time_to_admission_s = spread(
            arrived
                .iter()
                .filter_map(|t| Some(t.admitted_ms?.saturating_sub(t.arrived_ms) as f64 / 1000.0))
                .collect(),
        );
        let eta_error = spread(
            arrived
                .iter()
                .filter(|t| !t.direct && t.lost == 0)
                .filter_map(|t| {
                    let (eta, shown) = t.first_eta?;
                    let waited = t.admitted_ms?.saturating_sub(shown) as f64 / 1000.0;
                    Some((eta as f64 - waited).abs() / waited.max(1.0))
                })
                .collect(),
        );

        let fifo = (0..args.sales.len())
            .map(|s| {
                let of_sale: Vec<&UserTrace> =
                    arrived.iter().copied().filter(|t| t.sale == s).collect();
                fifo_inversions(&of_sale)
            })
            .sum();

        let eta_unfinished = arrived
            .iter()
            .filter(|t| t.first_eta.is_some() && t.admitted_ms.is_none() && t.gone_ms.is_none())
            .count() as u64;
        let eta_rises = arrived.iter().map(|t| u64::from(t.eta_rises)).sum();
        // An abandoned user's slot: the mark reached its position after it stopped polling and
        // before the heartbeat timeout (counted from its last heartbeat) let the pump evict it.
        let heartbeat_ms = args.heartbeat_timeout_s.saturating_mul(1000);
        let slots_to_departed = (!stats.is_empty()).then(|| {
            arrived
                .iter()
                .filter(|t| matches!(t.fate, Fate::Abandon { .. }))
                .filter_map(|t| Some((t.sale, t.seq?, t.gone_ms?, t.last_heartbeat_ms?)))
                .filter(|(sale, seq, gone, beat)| {
                    stats
                        .iter()
                        .find(|s| s.sale == *sale && s.admitted >= *seq)
                        .is_some_and(|s| {
                            s.t_ms > *gone && s.t_ms < beat.saturating_add(heartbeat_ms)
                        })
                })
                .count() as u64
        });

        let bypass: Vec<_> = requests().filter(|r| r.op == Op::Bypass).collect();
        let bypass_passed = bypass
            .iter()
            .filter(|r| (200..300).contains(&r.status) || r.status == 409)
            .count() as u64;

        let backend = backend(args, started_at_ms, &arrived, record);
        let series = series(args, seconds, &arrived, stats, &backend.1);

        Report {
            url: args.url.clone(),
            sales: args.sales.iter().map(ToString::to_string).collect(),
            profile: Profile {
                spike_rate: args.spike_rate,
                spike_s: args.spike_s,
                tail_rate: args.tail_rate,
                tail_s: args.tail_s,
                batch: args.batch,
                tick_ms: args.tick_ms,
                poll_interval_s: args.poll_interval_s,
                abandon: args.abandon,
                leave: args.leave,
                cheat: args.cheat,
            },
            started_at_ms,
            duration_ms,
            users,
            target_enter_rate: args.spike_rate,
            peak_enter_rate,
            spike_enter_rate: round3(spike_enter_rate),
            endpoints,
            errors,
            degraded_answers: requests().filter(|r| r.degraded).count() as u64,
            client_queue_ms: spread(requests().map(|r| r.queued_us as f64 / 1000.0).collect()),
            time_to_admission_s,
            eta_error,
            eta_rises,
            eta_unfinished,
            fifo_inversions: fifo,
            slots_to_departed,
            stats_samples: stats.len() as u64,
            stats_failed: run.stats_failed,
            bypass_attempts: bypass.len() as u64,
            bypass_passed,
            backend: backend.0,
            series,
        }
    }

    /// The printed summary.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        let u = &self.users;
        line(format!(
            "sale against {} ({}), {:.1} s",
            self.url,
            self.sales.join(", "),
            self.duration_ms as f64 / 1000.0
        ));
        line(format!(
            "users: {} arrived of {}, {} admitted ({} by fail-open), {} bought; {} abandoned, {} left; {} stayed without buying; {} refused (4xx); {} positions lost",
            u.arrived, u.planned, u.admitted, u.direct_admitted, u.purchased, u.abandoned, u.left,
            u.stayed_without_purchase, u.refused, u.lost_positions
        ));
        if u.lost_tasks > 0 {
            line(format!(
                "WARNING: {} simulated users crashed and are missing",
                u.lost_tasks
            ));
        }
        line(format!(
            "enter rate: target {:.0}/s, achieved {:.0}/s over the spike (peak second {:.0})",
            self.target_enter_rate, self.spike_enter_rate, self.peak_enter_rate
        ));
        for (op, l) in &self.endpoints {
            let statuses: Vec<String> =
                l.statuses.iter().map(|(s, n)| format!("{s}×{n}")).collect();
            line(format!(
                "{op:>9}: {:>7} requests, p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms [{}]",
                l.count,
                l.p50_ms,
                l.p95_ms,
                l.p99_ms,
                statuses.join(" ")
            ));
        }
        line(format!(
            "errors: {} 5xx, {} without an answer; {} degraded answers",
            self.errors.five_xx, self.errors.no_answer, self.degraded_answers
        ));
        let q = &self.client_queue_ms;
        line(format!(
            "requests waited for a simulator connection: p95 {:.1} ms, max {:.1} ms{}",
            q.p95,
            q.max,
            if q.p95 > 10.0 {
                " (the simulator is the limit: raise --connections or give it more CPU)"
            } else {
                ""
            }
        ));
        let a = &self.time_to_admission_s;
        line(if a.count == 0 {
            "time to admission: n/a (nobody admitted)".to_string()
        } else {
            format!(
                "time to admission: p50 {:.1} s, p90 {:.1} s, p99 {:.1} s, max {:.1} s",
                a.p50, a.p90, a.p99, a.max
            )
        });
        let e = &self.eta_error;
        line(if e.count == 0 {
            format!(
                "ETA error: n/a ({} shown an ETA still waiting)",
                self.eta_unfinished
            )
        } else {
            format!(
                "ETA error: median {:.0} %, p90 {:.0} % ({} users; {} shown an ETA still waiting); {} answers showed a larger ETA than the one before",
                e.p50 * 100.0,
                e.p90 * 100.0,
                e.count,
                self.eta_unfinished,
                self.eta_rises
            )
        });
        let slots = match self.slots_to_departed {
            Some(n) => n.to_string(),
            None => format!("n/a (no /stats answer in {} asks)", self.stats_failed),
        };
        line(format!(
            "FIFO inversions: {}; slots to users who had gone: {slots}; bypass attempts {} (passed {})",
            self.fifo_inversions, self.bypass_attempts, self.bypass_passed
        ));
        let b = &self.backend;
        if let Some(e) = &b.record_error {
            line(format!("WARNING: {e}; purchases below are the simulator's"));
        }
        line(format!(
            "backend ({}): {} purchases, {} duplicates refused (+{} after a retried purchase), {} without a token; buyers up to {} ticks late",
            b.source, b.purchases, b.duplicates, b.duplicates_after_retry, b.without_token, b.lag_ticks
        ));
        for s in &b.per_sale {
            let w = |n: usize| s.max_per_ticks.get(n - 1).copied().unwrap_or(0);
            line(format!(
                "  {}: {} purchases; most in 1/2/5/10 ticks: {}/{}/{}/{} (budget {} per tick)",
                s.sale,
                s.purchases,
                w(1),
                w(2),
                w(5),
                w(10),
                s.budget_per_tick
            ));
        }
        out
    }
}

/// The backend's view (or the simulator's, without a record) and the purchase times per sale.
fn backend(
    args: &SimArgs,
    started_at_ms: u64,
    arrived: &[&UserTrace],
    record: Option<&Result<Record, String>>,
) -> (Backend, Vec<Vec<u64>>) {
    let record_error = record.and_then(|r| r.as_ref().err().cloned());
    let record = record.and_then(|r| r.as_ref().ok());
    let retried: HashSet<u64> = arrived
        .iter()
        .filter(|t| t.purchase_tries > 1)
        .map(|t| t.user)
        .collect();
    let sales: Vec<String> = args.sales.iter().map(ToString::to_string).collect();
    let ours: HashSet<u64> = arrived.iter().map(|t| t.user).collect();
    let with_token: HashSet<u64> = arrived
        .iter()
        .filter(|t| t.admitted_ms.is_some())
        .map(|t| t.user)
        .collect();
    let mut times = vec![Vec::new(); sales.len()];
    let (source, (duplicates, duplicates_after_retry), without_token) = match record {
        Some(rec) => {
            let mut without = 0;
            for p in rec.purchases.iter().filter(|p| ours.contains(&p.user)) {
                if let Some(i) = sales.iter().position(|s| *s == p.sale) {
                    times[i].push(p.at_ms.saturating_sub(started_at_ms));
                }
                if !with_token.contains(&p.user) {
                    without += 1;
                }
            }
            let dups = rec.duplicates.iter().filter(|p| ours.contains(&p.user));
            let after_retry = dups.clone().filter(|p| retried.contains(&p.user)).count() as u64;
            let all = dups.count() as u64;
            ("record-backend", (all - after_retry, after_retry), without)
        }
        None => {
            for t in arrived {
                if let Some(ms) = t.purchased_ms {
                    times[t.sale].push(ms);
                }
            }
            let dup = |retry: bool| {
                arrived
                    .iter()
                    .filter(|t| t.duplicate && (t.purchase_tries > 1) == retry)
                    .count() as u64
            };
            ("simulator", (dup(false), dup(true)), 0)
        }
    };
    for t in &mut times {
        t.sort_unstable();
    }
    let lag_ms = arrived
        .iter()
        .filter_map(|t| {
            let bought = t.requests.iter().find(|r| r.op == Op::Purchase)?.start_ms;
            Some(bought.saturating_sub(t.last_waiting_sent_ms?))
        })
        .max()
        .unwrap_or(0);
    let per_sale = sales
        .iter()
        .zip(&times)
        .map(|(sale, t)| SaleBudget {
            sale: sale.clone(),
            purchases: t.len() as u64,
            budget_per_tick: args.batch,
            max_per_ticks: (1..=10)
                .map(|n| max_in_window(t, args.tick_ms.saturating_mul(n)))
                .collect(),
        })
        .collect();
    let b = Backend {
        source,
        purchases: times.iter().map(|t| t.len() as u64).sum(),
        duplicates,
        duplicates_after_retry,
        record_error,
        without_token,
        lag_ticks: lag_ms.div_ceil(args.tick_ms),
        per_sale,
    };
    (b, times)
}

fn series(
    args: &SimArgs,
    seconds: usize,
    arrived: &[&UserTrace],
    stats: &[StatsSample],
    purchases: &[Vec<u64>],
) -> Vec<Second> {
    let budget = args.sales.len() as f64 * args.batch as f64 * 1000.0 / args.tick_ms as f64;
    let mut s: Vec<Second> = (0..seconds)
        .map(|i| Second {
            t_s: i as u64,
            budget,
            ..Second::default()
        })
        .collect();
    let at = |ms: u64| ((ms / 1000) as usize).min(seconds - 1);
    let mut poll_lat: Vec<Vec<f64>> = vec![Vec::new(); seconds];
    let mut waiting_delta = vec![0i64; seconds + 1];
    for t in arrived {
        for r in &t.requests {
            let sec = at(r.start_ms);
            match r.op {
                Op::Enter => s[sec].enters += 1,
                Op::Poll => {
                    s[sec].polls += 1;
                    poll_lat[sec].push(r.latency_us as f64 / 1000.0);
                }
                _ => {}
            }
            if r.status == 0 || r.status >= 500 {
                s[sec].errors += 1;
            }
        }
        if let Some(ms) = t.admitted_ms {
            s[at(ms)].admissions += 1;
        }
        // Waiting from the first answer with a position to admission, departure or the end.
        if let Some((_, from)) = t.first_eta {
            let until = t.admitted_ms.or(t.gone_ms).map_or(seconds, at);
            waiting_delta[at(from)] += 1;
            waiting_delta[until] -= 1;
        }
    }
    for p in purchases.iter().flatten() {
        s[at(*p)].purchases += 1;
    }
    let mut level = 0i64;
    for (i, sec) in s.iter_mut().enumerate() {
        level += waiting_delta[i];
        sec.waiting = level.max(0) as u64;
        let mut lat = std::mem::take(&mut poll_lat[i]);
        lat.sort_by(f64::total_cmp);
        sec.poll_p50_ms = round3(pct(&lat, 50.0));
        sec.poll_p95_ms = round3(pct(&lat, 95.0));
        sec.poll_p99_ms = round3(pct(&lat, 99.0));
    }
    // The server's count: the last sample of each sale in each second, summed.
    let mut last: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for x in stats {
        last.insert((at(x.t_ms), x.sale), x.waiting);
    }
    for ((sec, _), waiting) in last {
        *s[sec].waiting_server.get_or_insert(0) += waiting;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 50.0), 50.0);
        assert_eq!(pct(&v, 95.0), 95.0);
        assert_eq!(pct(&v, 100.0), 100.0);
        assert_eq!(pct(&[7.0], 99.0), 7.0);
        assert_eq!(pct(&[], 50.0), 0.0);
    }

    #[test]
    fn windows_count_what_falls_inside() {
        let t = [0, 100, 999, 1000, 1500, 5000];
        assert_eq!(max_in_window(&t, 1000), 3);
        assert_eq!(max_in_window(&t, 1001), 4);
        assert_eq!(max_in_window(&t, 1), 1);
        assert_eq!(max_in_window(&[], 1000), 0);
    }

    fn trace(seq: u64, admitted: Option<u64>, last_waiting: Option<u64>) -> UserTrace {
        let plan = super::super::user::Plan {
            user: seq,
            sale: 0,
            arrive: std::time::Duration::ZERO,
            fate: Fate::Stay,
            cheat: false,
            rng: super::super::user::Rng::new(seq),
        };
        UserTrace {
            seq: Some(seq),
            last_waiting_sent_ms: last_waiting,
            last_heartbeat_ms: last_waiting,
            admitted_ms: admitted,
            ..UserTrace::new(&plan)
        }
    }

    #[test]
    fn an_inversion_is_a_later_position_admitted_before_an_earlier_one_was_told_to_wait() {
        // 1 admitted at 100; 2 polled at 150 and waited (fine: 3 was admitted only at 200).
        let ok = [
            trace(1, Some(100), Some(50)),
            trace(2, Some(300), Some(150)),
            trace(3, Some(200), Some(120)),
        ];
        // Position 3 admitted at 200, yet 2 was still told to wait at 250: an inversion.
        let bad = [
            trace(1, Some(100), Some(50)),
            trace(2, Some(300), Some(250)),
            trace(3, Some(200), Some(120)),
        ];
        let refs = |v: &[UserTrace]| -> u64 {
            let r: Vec<&UserTrace> = v.iter().collect();
            fifo_inversions(&r)
        };
        assert_eq!(refs(&ok), 0);
        assert_eq!(refs(&bad), 1);
    }

    fn args(extra: &[&str]) -> SimArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: SimArgs,
        }
        let mut v = vec!["t", "--url", "http://127.0.0.1:1"];
        v.extend_from_slice(extra);
        T::try_parse_from(v).unwrap().a
    }

    fn run() -> Run {
        Run {
            started_at_ms: 0,
            duration_ms: 20_000,
            lost_tasks: 0,
            stats_failed: 0,
        }
    }

    fn sample(t_ms: u64, admitted: u64) -> StatsSample {
        StatsSample {
            t_ms,
            sale: 0,
            waiting: 0,
            admitted,
        }
    }

    #[test]
    fn a_slot_goes_to_a_departed_user_only_before_the_heartbeat_timeout_and_only_with_stats() {
        let a = args(&["--spike-rate", "3", "--spike-s", "1", "--tail-s", "0"]);
        let a = SimArgs {
            heartbeat_timeout_s: 10,
            ..a
        };
        let req = super::super::user::Req {
            op: Op::Enter,
            start_ms: 0,
            latency_us: 1000,
            queued_us: 0,
            status: 200,
            degraded: false,
        };
        let gone = |seq: u64| {
            let mut t = trace(seq, None, Some(1500));
            t.fate = Fate::Abandon { after_polls: 1 };
            t.gone_ms = Some(2000);
            t.requests.push(req);
            t
        };
        let mut stayed = trace(3, Some(13_000), Some(12_000));
        stayed.first_eta = Some((10, 100));
        stayed.requests.push(req);
        let mut waiting = trace(4, None, Some(12_000));
        waiting.first_eta = Some((12, 100));
        waiting.requests.push(req);
        let traces = [gone(1), gone(2), stayed, waiting];
        // The mark reaches 1 at 3 s (user 1 gone, not yet evictable: a wasted slot) and 2 at
        // 12 s (past 1.5 s + 10 s: user 2 was evictable, the pump skipped it).
        let stats = [
            sample(1000, 0),
            sample(3000, 1),
            sample(12_000, 2),
            sample(13_000, 3),
        ];
        let r = Report::build(&a, run(), &traces, &stats, None);
        assert_eq!(r.slots_to_departed, Some(1));
        assert_eq!(r.users.abandoned, 2);
        assert_eq!(r.eta_error.count, 1);
        assert_eq!(r.eta_unfinished, 1);
        // Shown 10 s at 0.1 s, admitted at 13 s: |10 - 12.9| / 12.9.
        assert!(
            (r.eta_error.p50 - 0.225).abs() < 0.001,
            "{}",
            r.eta_error.p50
        );
        let r = Report::build(&a, run(), &traces, &[], None);
        assert_eq!(r.slots_to_departed, None);
        assert!(r.summary().contains("slots to users who had gone: n/a"));
    }

    #[test]
    fn the_backend_record_counts_where_purchases_arrived_and_a_failed_read_is_reported() {
        use super::super::backend::Purchase;
        let a = args(&[
            "--spike-rate",
            "2",
            "--spike-s",
            "1",
            "--tail-s",
            "0",
            "--tick-ms",
            "1000",
        ]);
        let req = super::super::user::Req {
            op: Op::Purchase,
            start_ms: 500,
            latency_us: 1000,
            queued_us: 0,
            status: 200,
            degraded: false,
        };
        let mut once = trace(1, Some(400), Some(300));
        once.purchase_tries = 1;
        once.requests.push(req);
        let mut twice = trace(2, Some(400), Some(300));
        twice.purchase_tries = 2;
        twice.requests.push(req);
        let p = |user: u64, at_ms: u64| Purchase {
            at_ms,
            sale: "limited-drop:1".into(),
            user,
        };
        let record = Record {
            purchases: vec![p(1, 500), p(2, 600), p(99, 700)],
            duplicates: vec![p(2, 900)],
            unidentified: 0,
            other: 0,
        };
        let r = Report::build(&a, run(), &[once, twice], &[], Some(&Ok(record)));
        let b = &r.backend;
        assert_eq!(
            (b.source, b.purchases),
            ("record-backend", 2),
            "user 99 is not ours"
        );
        assert_eq!((b.duplicates, b.duplicates_after_retry), (0, 1));
        assert_eq!(b.per_sale[0].max_per_ticks[0], 2);
        let failed = Err("cannot read".to_string());
        let r = Report::build(&a, run(), &[], &[], Some(&failed));
        assert_eq!(r.backend.source, "simulator");
        assert!(r.summary().contains("WARNING: cannot read"));
        assert!(r.summary().contains("time to admission: n/a"));
    }
}
