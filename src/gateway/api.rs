//! The queue API handlers (docs/api.md#queue-semantics): enter, poll, leave, stats. Each takes the
//! parsed call and the request's user, talks to the store, and returns a `Reply` for the proxy to
//! write.
//!
//! Enter and poll never answer 5xx in the default `paced` fail-open mode: when the store fails
//! they answer per `fail_open.mode` (`failopen.rs`, docs/failures.md). A Redis that is full
//! (maxmemory) is not an outage: new enters get 429, everything else goes on. Stats answer from a
//! per-replica cache, or 503 when there is nothing honest to report.

use std::time::Instant;

use http::HeaderMap;

use super::route::{ApiCall, ApiOp};
use crate::allowed::Standing;
use crate::app::AppState;
use crate::clock::now;
use crate::error::ApiError;
use crate::failopen::{self, Answer};
use crate::queue::stats_cache::Lookup;
use crate::queue::{
    eta_seconds, poll_after_seconds, EntryStatus, QueueEntryResponse, QueueStats,
    QueueStatsResponse, QueueTarget,
};
use crate::sale::{BookLookup, SaleView};
use crate::store::{EnterOutcome, Now, PollOutcome, QueueStore, StoreError, TokenCandidate};
use crate::token::{mint, mint_ticket, verify_ticket, TicketPayload, TokenPayload};

pub use crate::headers::USER_HEADER;

use crate::headers::TICKET_HEADER;

/// A locally generated response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// JSON body; empty for 204.
    pub body: Vec<u8>,
    /// `Retry-After` in seconds, when the client should come back later.
    pub retry_after: Option<u64>,
}

impl Reply {
    pub fn json(status: u16, value: &impl serde::Serialize) -> Reply {
        match serde_json::to_vec(value) {
            Ok(body) => Reply {
                status,
                body,
                retry_after: None,
            },
            Err(_) => Reply::error(&ApiError::QueueUnavailable),
        }
    }

    pub fn error(e: &ApiError) -> Reply {
        Reply {
            status: e.status(),
            body: e.body(),
            retry_after: e.retry_after(),
        }
    }

    pub fn no_content() -> Reply {
        Reply {
            status: 204,
            body: Vec::new(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, secs: u64) -> Reply {
        self.retry_after = Some(secs);
        self
    }
}

/// The request's user per `[identity]` (`Identity::required`).
fn user_id(state: &AppState, headers: &HeaderMap) -> Result<u64, ApiError> {
    state.identity.required(state.identity.user(headers))
}

pub async fn handle(state: &AppState, call: ApiCall, headers: &HeaderMap) -> Reply {
    match state.allowed.standing(call.target) {
        Standing::Allowed => {}
        Standing::Unregistered => return Reply::error(&ApiError::UnknownTarget),
        Standing::Unknown => return Reply::error(&ApiError::QueueUnavailable),
    }
    // Stats and the draw are public; the other calls are a user's.
    let user = || user_id(state, headers);
    let result = match call.op {
        ApiOp::Stats => stats(state, call.target).await,
        ApiOp::Draw => draw(state, call.target).await,
        ApiOp::Enter => match user() {
            Ok(user) => enter(state, call.target, user, headers).await,
            Err(e) => Err(e),
        },
        ApiOp::Poll => match user() {
            Ok(user) => poll(state, call.target, user, headers).await,
            Err(e) => Err(e),
        },
        ApiOp::Leave => match user() {
            Ok(user) => leave(state, call.target, user).await,
            Err(e) => Err(e),
        },
    };
    result.unwrap_or_else(|e| Reply::error(&e))
}

fn candidate(state: &AppState, target: QueueTarget, user: u64, now: Now) -> TokenCandidate {
    token_expiring(
        state,
        target,
        user,
        now.epoch_ms / 1000 + state.config.token.ttl.as_secs(),
    )
}

/// The token of an admission the store just found due: the one this replica handed the same
/// user (while pacing, or before Redis lost the issue), if it still lives, else a new one —
/// unless issuing is held back: right after an outage or a rollback the replicas are writing
/// back the tokens they handed out, and a new token now could be a user's second (the poll then
/// answers `Due`, and the user polls again in a second).
fn admission_token(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    now: Now,
) -> Option<TokenCandidate> {
    let remembered = state
        .pacer
        .remembered_expiry(target, user, now.epoch_ms)
        .or_else(|| state.issued.get(target, user, now.epoch_ms / 1000));
    match remembered {
        Some(at) => Some(token_expiring(state, target, user, at)),
        None if issuing_held(state, now) => None,
        None => Some(candidate(state, target, user, now)),
    }
}

/// Whether new tokens are held back now (`admission_token`, `failopen::Pacer::issue_held`).
fn issuing_held(state: &AppState, now: Now) -> bool {
    state.store.issue_held(&state.pacer, now.epoch_ms)
}

/// Remembers a token this replica signed for an admission (`issued.rs`).
fn signed_here(state: &AppState, target: QueueTarget, user: u64, expires_at: u64) {
    state.issued.record(
        target,
        user,
        expires_at,
        crate::clock::now().epoch_ms / 1000,
    );
}

/// The entry token of `user` for `target` expiring at `expires_at` (epoch s).
fn token_expiring(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    expires_at: u64,
) -> TokenCandidate {
    let payload = TokenPayload {
        target_type: target.kind,
        target_id: target.id,
        user_id: user,
        expires_at,
    };
    TokenCandidate {
        token: mint(&state.keys, &payload),
        expires_at,
    }
}

fn entry(status: EntryStatus) -> Reply {
    Reply::json(200, &QueueEntryResponse::from(status))
}

/// A waiting answer by the sale's own budget, tick and heartbeat timeout (never this file's:
/// a poll hint longer than a third of the sale's timeout would get users who follow it evicted).
/// While the sale is paused the ETA is unknown (`null`) and the hint is the tick.
fn waiting_status(sale: SaleView, seq: u64, ahead: u64, now: Now) -> EntryStatus {
    let tick = std::time::Duration::from_millis(sale.tick_ms);
    let timeout = std::time::Duration::from_secs(sale.heartbeat_timeout_s);
    if sale.lost {
        // The sale's parameters are being written back (docs/state.md): a place shown now could
        // be moved by a draw the stand-in does not know of.
        return EntryStatus::WaitingDegraded {
            poll_after_seconds: 1,
        };
    }
    if sale.prequeue_until_ms > 0 {
        // Pre-queued: no place until the draw. The ETA is the time to the opening and the wait
        // of a place drawn at random among the pre-queue's users (`ahead` counts those who
        // entered before this one: the pre-queue has at least `ahead + 1`).
        let to_open = sale
            .prequeue_until_ms
            .saturating_sub(now.epoch_ms)
            .div_ceil(1000);
        let eta = to_open.saturating_add(eta_seconds(ahead / 2, sale.batch_size, tick));
        return EntryStatus::Prequeued {
            eta_seconds: eta,
            poll_after_seconds: poll_after_seconds(to_open.saturating_mul(2), tick, timeout),
            opens_at: sale.prequeue_until_ms / 1000,
        };
    }
    if sale.paused {
        return EntryStatus::Waiting {
            seq,
            ahead,
            eta_seconds: None,
            poll_after_seconds: poll_after_seconds(0, tick, timeout),
        };
    }
    // Live users ahead at the rate live users are admitted (`position::per_tick`).
    let per_tick = crate::queue::per_tick(sale.batch_size, tick, sale.measured_rate_per_sec);
    let eta = crate::queue::eta_at_rate(ahead, per_tick, tick);
    EntryStatus::Waiting {
        seq,
        ahead,
        eta_seconds: Some(eta),
        poll_after_seconds: poll_after_seconds(eta, tick, timeout),
    }
}

/// Reads the sale and its queue's measured live admission rate again (one request per sale and
/// second, `SaleBook::lookup`), and records them; the last reading when the store cannot say.
async fn reread_sale(
    state: &AppState,
    target: QueueTarget,
    now: Now,
) -> Option<std::sync::Arc<crate::sale::Sale>> {
    let book = &state.sales;
    match state.store.sale(target).await {
        Ok(sale) => {
            let rate = state
                .store
                .stats(target, now)
                .await
                .ok()
                .map(|s| s.live_rate_per_sec);
            book.set(target, sale, rate, now.epoch_ms);
            book.last(target)
        }
        Err(_) => {
            book.refresh_failed(target);
            book.last(target)
        }
    }
}

/// The sale's parameters for an answer (its own, or this file's defaults for a sale not created
/// yet) with its queue's measured admission rate, as this replica read them at most a second
/// ago.
async fn sale_view(state: &AppState, target: QueueTarget, now: Now) -> SaleView {
    let book = &state.sales;
    match book.lookup(target, now.epoch_ms) {
        BookLookup::Answer(view) => view,
        BookLookup::Refresh { last } => {
            reread_sale(state, target, now).await;
            match book.lookup(target, now.epoch_ms) {
                BookLookup::Answer(view) => view,
                BookLookup::Refresh { .. } => last.unwrap_or_else(|| book.view(None)),
            }
        }
    }
}

/// The whole sale (the draw's fields included), as read at most a second ago.
async fn sale_of(
    state: &AppState,
    target: QueueTarget,
    now: Now,
) -> Option<std::sync::Arc<crate::sale::Sale>> {
    match state.sales.fresh(target, now.epoch_ms) {
        Some(sale) => sale,
        None => reread_sale(state, target, now).await,
    }
}

/// `GET …/draw` (public): the draw's commitment and opening before it runs; after it, the
/// revealed seed, the number of entrants and the algorithm, so anyone holding the entrant list
/// (admin export) can check the order (`vq-gateway draw verify`). Answered from the replica's
/// book of sales (read at most once a second per sale), whatever the request rate.
async fn draw(state: &AppState, target: QueueTarget) -> Result<Reply, ApiError> {
    let now = now();
    let sale = sale_of(state, target, now).await;
    let Some(sale) = sale.filter(|s| !s.draw_commitment.is_empty()) else {
        return Err(ApiError::NoDraw);
    };
    let iso = |ms: u64| crate::queue::iso8601_utc(ms / 1000);
    let body = if sale.drawn_at_ms > 0 {
        serde_json::json!({
            "commitment": sale.draw_commitment,
            "opensAt": iso(sale.opens_at_ms),
            "drawnAt": iso(sale.drawn_at_ms),
            "seed": sale.draw_seed,
            "entrants": sale.draw_entrants,
            "algorithm": crate::draw::ALGORITHM,
        })
    } else {
        serde_json::json!({
            "commitment": sale.draw_commitment,
            "opensAt": iso(sale.opens_at_ms),
        })
    };
    Ok(Reply::json(200, &body))
}

/// A `WAITING` answer (of an enter or a poll), with the queue ticket that proves the user's
/// place while the store is down or after it lost the place (docs/state.md). The ticket expires
/// with the place it proves: a heartbeat timeout of the sale after this answer (a user silent
/// that long is evicted), renewed by every waiting answer.
fn waiting_with_ticket(
    state: &AppState,
    sale: SaleView,
    target: QueueTarget,
    user: u64,
    seq: u64,
    ahead: u64,
    now: Now,
) -> Reply {
    let status = waiting_status(sale, seq, ahead, now);
    if let EntryStatus::Prequeued { .. } | EntryStatus::WaitingDegraded { .. } = status {
        // No ticket in the pre-queue (its seq is the order of arrival, which the draw discards),
        // nor for a sale being written back (a draw may still move the place).
        return entry(status);
    }
    let ticket = mint_ticket(
        &state.keys,
        &TicketPayload {
            target_type: target.kind,
            target_id: target.id,
            user_id: user,
            seq,
            expires_at: now.epoch_ms / 1000 + sale.heartbeat_timeout_s.max(1),
        },
    );
    let response = QueueEntryResponse::from(status).with_ticket(ticket);
    Reply::json(200, &response)
}

/// The seq of the request's queue ticket, when it shows one for this user and sale that was
/// valid at `at_s` (epoch s).
fn ticket_seq(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    headers: &HeaderMap,
    at_s: u64,
) -> Option<u64> {
    let value = crate::headers::single(headers, TICKET_HEADER).ok()??;
    let t = verify_ticket(&state.keys, value, at_s).ok()?;
    (t.target_type == target.kind && t.target_id == target.id && t.user_id == user).then_some(t.seq)
}

/// Let the user through without queueing (the flag is off for them).
fn direct(state: &AppState, target: QueueTarget, user: u64, now: Now) -> Reply {
    let c = candidate(state, target, user, now);
    state.count_token(target, "issued");
    entry(EntryStatus::DirectAdmitted {
        token: c.token,
        expires_at: c.expires_at,
    })
}

/// The answer to an enter or poll that the store could not serve: `failopen::decide` decides,
/// this writes the answer and counts it.
fn degraded(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    headers: &HeaderMap,
    cause: &StoreError,
) -> Result<Reply, ApiError> {
    // Read now, not when the request began: the store call that failed may have taken up to its
    // timeout, and the pacer's window and tick are about the moment of this decision.
    let now = now();
    // A user this replica already signed a live token for holds that admission: the same token
    // again, never a second admission (docs/state.md).
    if let Some(at) = state.issued.get(target, user, now.epoch_ms / 1000) {
        let held = token_expiring(state, target, user, at);
        let status = EntryStatus::DirectAdmitted {
            token: held.token,
            expires_at: held.expires_at,
        };
        return Ok(Reply::json(
            200,
            &QueueEntryResponse::from(status).degraded(),
        ));
    }
    // The highest mark any answer of the store showed this replica (the pump's steps, and the
    // polls of waiting users): a ticket at or below it proves a place already admitted.
    state
        .pacer
        .set_mark(target, state.store.inner().mark_seen(target, now.epoch_ms));
    let last_ok_ms = state.store.last_ok_ms();
    // A ticket proves a place that stood when the store last answered: the outage's silence is
    // not held against it (the sweep credits it too).
    let ticket_at_s = match last_ok_ms {
        0 => now.epoch_ms,
        ok => ok.min(now.epoch_ms),
    } / 1000;
    let decision = failopen::decide(
        &state.pacer,
        state.config.fail_open.mode,
        matches!(cause, StoreError::Saturated),
        target,
        user,
        || ticket_seq(state, target, user, headers, ticket_at_s),
        now.epoch_ms,
        last_ok_ms,
    );
    state
        .metrics
        .failopen
        .with_label_values(&[decision.mode.as_str(), decision.outcome])
        .inc();
    Ok(match decision.answer {
        Answer::Admit => {
            // One admission, one token: a user let through again while pacing gets the token
            // of the first answer (its single use is tracked by the token), never a new one.
            let fresh = candidate(state, target, user, now);
            let minted =
                match state
                    .pacer
                    .token_expiry(target, user, fresh.expires_at, now.epoch_ms)
                {
                    Some(at) if at != fresh.expires_at => token_expiring(state, target, user, at),
                    _ => {
                        state.count_token(target, "issued");
                        fresh
                    }
                };
            signed_here(state, target, user, minted.expires_at);
            let status = EntryStatus::DirectAdmitted {
                token: minted.token,
                expires_at: minted.expires_at,
            };
            Reply::json(200, &QueueEntryResponse::from(status).degraded())
        }
        Answer::Refuse { retry_after_s } => {
            Reply::error(&ApiError::QueueUnavailable).retry_after(retry_after_s)
        }
        Answer::Wait { retry_after_s } => entry(EntryStatus::WaitingDegraded {
            poll_after_seconds: retry_after_s,
        })
        .retry_after(retry_after_s),
    })
}

async fn enter(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    headers: &HeaderMap,
) -> Result<Reply, ApiError> {
    let now = now();
    if !state.flag.queue_on(target, user) {
        return Ok(direct(state, target, user, now));
    }
    let count = |outcome: &'static str| state.metrics.count_entry(target, outcome);
    match state.store.enter(target, user, now).await {
        Ok(EnterOutcome::Waiting { seq, ahead }) => {
            count("waiting");
            let sale = sale_view(state, target, now).await;
            Ok(waiting_with_ticket(
                state, sale, target, user, seq, ahead, now,
            ))
        }
        Ok(EnterOutcome::Admitted { token, expires_at }) => {
            count("admitted");
            Ok(entry(EntryStatus::Admitted { token, expires_at }))
        }
        Ok(EnterOutcome::Full) => {
            count("full");
            Err(ApiError::QueueFull)
        }
        Ok(EnterOutcome::Early) => {
            count("early");
            let sale = sale_view(state, target, now).await;
            let wait_ms = sale.prequeue_opens_at_ms.saturating_sub(now.epoch_ms);
            Err(ApiError::NotOpenYet(wait_ms.div_ceil(1000)))
        }
        Ok(EnterOutcome::TooManyTargets) => {
            count("too_many_targets");
            log_too_many(target, state.config.queue.max_active_targets.get(), now);
            Err(ApiError::TooManyQueues)
        }
        // Redis is full: it answers, but takes no new users. Not an outage, so nobody is let
        // through for it; users already waiting keep their places: their enter is answered like
        // a poll (which runs under maxmemory), so it stays idempotent.
        Err(StoreError::OutOfMemory) => {
            let mint = || admission_token(state, target, user, now);
            match state.store.poll(target, user, now, &mint).await {
                Ok(PollOutcome::Waiting { seq, ahead }) => {
                    let sale = sale_view(state, target, now).await;
                    Ok(waiting_with_ticket(
                        state, sale, target, user, seq, ahead, now,
                    ))
                }
                Ok(PollOutcome::Admitted {
                    token, expires_at, ..
                }) => Ok(entry(EntryStatus::Admitted { token, expires_at })),
                _ => {
                    count("store_full");
                    Err(ApiError::StoreFull)
                }
            }
        }
        Err(e) => degraded(state, target, user, headers, &e),
    }
}

async fn poll(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    headers: &HeaderMap,
) -> Result<Reply, ApiError> {
    let now = now();
    if !state.flag.queue_on(target, user) {
        return Ok(direct(state, target, user, now));
    }
    // Signed only when the store finds the user admitted without a token (once per user).
    let minted = std::sync::OnceLock::new();
    let mint = || {
        let fresh = admission_token(state, target, user, now)?;
        let _ = minted.set(fresh.token.clone());
        Some(fresh)
    };
    let mut outcome = state.store.poll(target, user, now, &mint).await;
    if let Ok(PollOutcome::NotInQueue) = outcome {
        // Neither waiting nor admitted: a place the store lost is taken back on the user's
        // signed ticket (rejoin.lua checks that nothing else took it away).
        if let Some(seq) = ticket_seq(state, target, user, headers, now.epoch_ms / 1000) {
            outcome = state.store.rejoin(target, user, seq, now, &mint).await;
        }
    }
    if let Ok(PollOutcome::NotInQueue) = outcome {
        // An admitted user whose token the store lost: the token this replica signed for it,
        // written back and answered again (docs/state.md).
        if let Some(at) = state.issued.get(target, user, now.epoch_ms / 1000) {
            let held = token_expiring(state, target, user, at);
            if state
                .store
                .record_paced(target, user, &held, now)
                .await
                .is_ok()
            {
                outcome = Ok(PollOutcome::Admitted {
                    token: held.token,
                    expires_at: held.expires_at,
                    waited_ms: None,
                });
            }
        }
    }
    match outcome {
        Ok(PollOutcome::Waiting { seq, ahead }) => {
            let sale = sale_view(state, target, now).await;
            Ok(waiting_with_ticket(
                state, sale, target, user, seq, ahead, now,
            ))
        }
        Ok(PollOutcome::Admitted {
            token,
            expires_at,
            waited_ms,
        }) => {
            // The token this call signed was stored (a concurrent poll may have stored its own
            // first; then the stored one is answered and this one is dropped).
            if minted.get() == Some(&token) {
                state.count_token(target, "issued");
                signed_here(state, target, user, expires_at);
            }
            if let Some(ms) = waited_ms {
                let label = state.metrics.targets.label(target);
                state
                    .metrics
                    .wait
                    .with_label_values(&[&label])
                    .observe(ms as f64 / 1000.0);
            }
            Ok(entry(EntryStatus::Admitted { token, expires_at }))
        }
        Ok(PollOutcome::NotInQueue) => Err(ApiError::NotInQueue),
        // Admitted, its token held back a moment (`admission_token`): first in line.
        Ok(PollOutcome::Due { seq }) => {
            let sale = sale_view(state, target, now).await;
            Ok(waiting_with_ticket(state, sale, target, user, seq, 0, now))
        }
        Err(e) => degraded(state, target, user, headers, &e),
    }
}

async fn leave(state: &AppState, target: QueueTarget, user: u64) -> Result<Reply, ApiError> {
    state.issued.forget(target, user);
    // A failure is counted by the guard; the user stops polling either way and the pump evicts
    // them once the store is back.
    let _ = state.store.leave(target, user).await;
    Ok(Reply::no_content())
}

/// A new target refused for the cap is logged at most once per 10 s (clients choose target
/// ids: one line per refusal would let them flood the log too).
fn log_too_many(target: QueueTarget, cap: u32, now: Now) {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let last = LAST.load(std::sync::atomic::Ordering::Relaxed);
    if now.epoch_ms.saturating_sub(last) >= 10_000
        && LAST
            .compare_exchange(
                last,
                now.epoch_ms,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        tracing::warn!(%target, cap, "too many open queues: a new target was refused (queue.max_active_targets)");
    }
}

/// How long a stats caller waits for another caller's refresh of the same target.
const STATS_BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
const STATS_BUSY_WAITS: usize = 60;

/// Stats come from the per-replica cache (`queue::stats_cache`): at most one store call per target and
/// second per replica, whatever the request rate.
async fn stats(state: &AppState, target: QueueTarget) -> Result<Reply, ApiError> {
    let reply = |s: QueueStats| Reply::json(200, &QueueStatsResponse::from(s));
    let unavailable = || Err(ApiError::QueueUnavailable);
    let mut lookup = state.stats_cache.lookup(target, Instant::now());
    // The first callers for a target wait (briefly) for the one refresh in flight.
    for _ in 0..STATS_BUSY_WAITS {
        if lookup != Lookup::Busy {
            break;
        }
        tokio::time::sleep(STATS_BUSY_WAIT).await;
        lookup = state.stats_cache.lookup(target, Instant::now());
    }
    match lookup {
        Lookup::Answer(s) => Ok(reply(s)),
        Lookup::Busy => unavailable(),
        Lookup::Refresh { stale } => {
            let fetched = state.store.stats(target, now()).await.ok();
            state.stats_cache.finish(target, fetched, Instant::now());
            match fetched.or(stale) {
                Some(s) => Ok(reply(s)),
                None => unavailable(),
            }
        }
    }
}
