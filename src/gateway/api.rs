//! The queue API handlers (SPEC §3, §4): enter, poll, leave, stats. Each takes the parsed call and
//! the request's user, talks to the store, and returns a `Reply` for the proxy to write.
//!
//! Enter and poll never answer 5xx: when the store fails they fail open with a stateless token
//! (SPEC §7). Stats answer 503 instead, since there is nothing honest to report.

use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderMap;

use super::route::{ApiCall, RouteClass};
use super::AppState;
use crate::error::ApiError;
use crate::queue::{
    eta_seconds, parse_positive_id, EntryStatus, QueueEntryResponse, QueueStatsResponse,
    QueueTarget,
};
use crate::store::{EnterOutcome, Now, PollOutcome, StoreError, TokenCandidate};
use crate::token::{mint, TokenClaims};

pub const USER_HEADER: &str = "x-user-id";

/// A locally generated response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// JSON body; empty for 204.
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(status: u16, value: &impl serde::Serialize) -> Reply {
        match serde_json::to_vec(value) {
            Ok(body) => Reply { status, body },
            Err(_) => Reply::error(&ApiError::QueueUnavailable),
        }
    }

    pub fn error(e: &ApiError) -> Reply {
        Reply {
            status: e.status(),
            body: e.body(),
        }
    }

    pub fn no_content() -> Reply {
        Reply {
            status: 204,
            body: Vec::new(),
        }
    }
}

/// A header that may appear at most once came twice, or is not visible ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadHeader;

/// The value of a header that may appear at most once: `Ok(None)` when absent.
pub fn single_header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, BadHeader> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v.to_str().map(Some).map_err(|_| BadHeader),
        _ => Err(BadHeader),
    }
}

/// The request's user: exactly one `X-User-Id`, a canonical positive 64-bit decimal.
pub fn user_id(headers: &HeaderMap) -> Result<u64, ApiError> {
    let value = single_header(headers, USER_HEADER)
        .ok()
        .flatten()
        .ok_or(ApiError::BadRequest(
            "exactly one X-User-Id header is required",
        ))?;
    parse_positive_id(value).ok_or(ApiError::BadRequest("X-User-Id must be a positive integer"))
}

pub fn now() -> Now {
    let epoch_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(crate::queue::millis)
        .unwrap_or(0);
    Now { epoch_ms }
}

pub async fn handle(state: &AppState, call: ApiCall, headers: &HeaderMap) -> Reply {
    let result = match call.class {
        RouteClass::Stats => stats(state, call.target).await,
        class => match user_id(headers) {
            Ok(user) => match class {
                RouteClass::Enter => enter(state, call.target, user).await,
                RouteClass::Poll => poll(state, call.target, user).await,
                _ => leave(state, call.target, user).await,
            },
            Err(e) => Err(e),
        },
    };
    result.unwrap_or_else(|e| Reply::error(&e))
}

fn candidate(state: &AppState, target: QueueTarget, user: u64, now: Now) -> TokenCandidate {
    let expires_at = now.epoch_ms / 1000 + state.config.token_ttl.as_secs();
    let claims = TokenClaims {
        target_type: target.kind,
        target_id: target.id,
        user_id: user,
        expires_at,
    };
    TokenCandidate {
        token: mint(&state.keys, &claims),
        expires_at,
    }
}

fn entry(status: EntryStatus) -> Reply {
    Reply::json(200, &QueueEntryResponse::from(status))
}

fn waiting(state: &AppState, seq: u64, ahead: u64) -> Reply {
    let eta = eta_seconds(ahead, state.config.batch_size.get(), state.config.tick);
    entry(EntryStatus::Waiting {
        seq,
        ahead,
        eta_seconds: eta,
    })
}

/// Let the user through without queueing: flag off, or the store failed (fail-open).
fn direct(state: &AppState, target: QueueTarget, user: u64, now: Now) -> Reply {
    let c = candidate(state, target, user, now);
    state.count_token(target, "issued");
    entry(EntryStatus::DirectAdmitted {
        token: c.token,
        expires_at: c.expires_at,
    })
}

fn fail_open(
    state: &AppState,
    op: &'static str,
    target: QueueTarget,
    user: u64,
    e: &StoreError,
    now: Now,
) -> Reply {
    state.store_failed(op, e);
    direct(state, target, user, now)
}

async fn enter(state: &AppState, target: QueueTarget, user: u64) -> Result<Reply, ApiError> {
    let now = now();
    if !state.flag.queue_on(target, user) {
        return Ok(direct(state, target, user, now));
    }
    let capacity = state.config.max_capacity.get();
    let label = state.metrics.targets.label(target);
    match state
        .bounded(state.store.enter(target, user, now, capacity))
        .await
    {
        Ok(EnterOutcome::Waiting { seq, ahead }) => {
            state.store_ok();
            state
                .metrics
                .entries
                .with_label_values(&[&label, "waiting"])
                .inc();
            Ok(waiting(state, seq, ahead))
        }
        Ok(EnterOutcome::Admitted { token, expires_at }) => {
            state.store_ok();
            state
                .metrics
                .entries
                .with_label_values(&[&label, "admitted"])
                .inc();
            Ok(entry(EntryStatus::Admitted { token, expires_at }))
        }
        Ok(EnterOutcome::Full) => {
            state.store_ok();
            state
                .metrics
                .entries
                .with_label_values(&[&label, "full"])
                .inc();
            Err(ApiError::QueueFull)
        }
        Ok(EnterOutcome::TooManyTargets) => {
            state.store_ok();
            state
                .metrics
                .entries
                .with_label_values(&[&label, "too_many_targets"])
                .inc();
            Err(ApiError::TooManyQueues)
        }
        Err(e) => Ok(fail_open(state, "enter", target, user, &e, now)),
    }
}

async fn poll(state: &AppState, target: QueueTarget, user: u64) -> Result<Reply, ApiError> {
    let now = now();
    if !state.flag.queue_on(target, user) {
        return Ok(direct(state, target, user, now));
    }
    let offered = candidate(state, target, user, now);
    match state
        .bounded(state.store.poll(target, user, now, &offered))
        .await
    {
        Ok(PollOutcome::Waiting { seq, ahead }) => {
            state.store_ok();
            Ok(waiting(state, seq, ahead))
        }
        Ok(PollOutcome::Admitted {
            token,
            expires_at,
            waited_ms,
        }) => {
            state.store_ok();
            if token == offered.token {
                state.count_token(target, "issued");
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
        Ok(PollOutcome::NotInQueue) => {
            state.store_ok();
            Err(ApiError::NotInQueue)
        }
        Err(e) => Ok(fail_open(state, "poll", target, user, &e, now)),
    }
}

async fn leave(state: &AppState, target: QueueTarget, user: u64) -> Result<Reply, ApiError> {
    match state.bounded(state.store.leave(target, user)).await {
        Ok(()) => state.store_ok(),
        // The user stops polling either way; the pump evicts them once the store is back.
        Err(e) => state.store_failed("leave", &e),
    }
    Ok(Reply::no_content())
}

async fn stats(state: &AppState, target: QueueTarget) -> Result<Reply, ApiError> {
    match state.bounded(state.store.stats(target, now())).await {
        Ok(s) => {
            state.store_ok();
            Ok(Reply::json(200, &QueueStatsResponse::from(s)))
        }
        Err(e) => {
            state.store_failed("stats", &e);
            Err(ApiError::QueueUnavailable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(USER_HEADER, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn user_header_is_strict() {
        assert_eq!(user_id(&headers(&["1001"])), Ok(1001));
        for bad in [
            &[][..],
            &["1", "2"],
            &["0"],
            &["abc"],
            &["01"],
            &["+1"],
            &[" 1"],
            &["-5"],
        ] {
            assert!(user_id(&headers(bad)).is_err(), "{bad:?}");
        }
    }
}
