//! The entry-token gate in front of the purchase routes
//! (docs/security.md#what-an-entry-token-guarantees): a request to a gated route reaches the
//! backend only with a valid, matching, unexpired and (with `single_use`) unused entry token. Which
//! requests are on a gated route is `routing::gated`'s job; this module decides what happens to
//! them.

use std::time::Duration;

use http::Method;

use super::hygiene::HeaderFacts;
use crate::allowed::{Standing, UnregisteredGated};
use crate::app::AppState;
use crate::claims::LocalClaim;
use crate::error::ApiError;
use crate::flag::GateView;
use crate::identity::IdentityError;
use crate::queue::QueueTarget;
use crate::routing::gated::GatedPath;
use crate::store::Now;
use crate::store::{ClaimTake, ClaimTerms, QueueStore, Settle, StoreError};
use crate::token::{verify, MAX_TOKEN_LEN};

/// The clock difference between instances the gate allows for: how far in the future a token
/// may expire beyond the configured TTL (a token that claims to live longer was not minted by
/// us), and how long a single-use claim outlives the token's expiry on this instance's clock (an
/// instance whose clock is behind still takes the token for that long).
const EXPIRY_SKEW_SECS: u64 = 60;

/// Why a gated request was refused: the status/code answered and the bounded reason counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub error: ApiError,
    pub reason: &'static str,
}

fn deny(reason: &'static str, detail: &'static str) -> Denied {
    Denied {
        error: ApiError::BypassDenied(detail),
        reason,
    }
}

fn bad(reason: &'static str, detail: &'static str) -> Denied {
    Denied {
        error: ApiError::BadRequest(detail),
        reason,
    }
}

/// A single-use claim taken for a request, pending while it is in flight: in the store (with
/// the purchase attempt's id), or (the store down) in this replica's `Claims`, to be written to
/// the store once it answers again. Either way until when it is kept (epoch seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Stored {
        target: QueueTarget,
        id: String,
        owner: String,
        until: u64,
    },
    Local {
        target: QueueTarget,
        id: String,
        until: u64,
    },
}

/// How long a pending claim holds without being renewed: the forwarding replica renews it every
/// third of this while the purchase is in flight, so the claim of a replica that died lapses
/// this long after its last renewal and the user may try again.
pub const CLAIM_LEASE: Duration = Duration::from_secs(5);

/// The terms of a token's claim held until `until` (epoch seconds).
pub fn claim_terms(state: &AppState, until: u64, now_s: u64) -> ClaimTerms {
    ClaimTerms {
        ttl: Duration::from_secs(until.saturating_sub(now_s).max(1)),
        lease: CLAIM_LEASE,
        max_attempts: state.config.token.max_attempts,
    }
}

/// A passed check: what to forward and whether a single-use claim must be given back if the
/// backend refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passed {
    pub target: QueueTarget,
    /// False when the flag is off for this user and target, so no token was looked at.
    pub checked: bool,
    /// The claim taken for this token, when single use is on.
    pub claim: Option<Claim>,
}

/// The full check of a gated request (method already matched).
pub async fn check(
    state: &AppState,
    gated: &GatedPath<'_>,
    facts: &HeaderFacts<'_>,
    identity: Result<u64, IdentityError>,
    now: Now,
) -> Result<Passed, Denied> {
    let target = gated
        .target
        .ok_or_else(|| bad("bad_target_id", "the target id must be a positive integer"))?;
    let user = state.identity.required(identity).map_err(|error| Denied {
        error,
        reason: "bad_user_id",
    })?;
    let token = facts.entry_token().map_err(|_| {
        bad(
            "duplicate_token",
            "exactly one X-Entry-Token header is allowed",
        )
    })?;
    let standing = state.allowed.standing(target);
    if standing == Standing::Unknown {
        return Err(Denied {
            error: ApiError::QueueUnavailable,
            reason: "targets_unknown",
        });
    }
    if standing == Standing::Unregistered {
        return match state.allowed.unregistered_gated() {
            UnregisteredGated::Pass => Ok(Passed {
                target,
                checked: false,
                claim: None,
            }),
            UnregisteredGated::Refuse => Err(Denied {
                error: ApiError::UnknownTarget,
                reason: "unknown_target",
            }),
        };
    }
    let (queued_since, unknown) = match state.flag.gate_view(target, user) {
        GateView::Off => {
            return Ok(Passed {
                target,
                checked: false,
                claim: None,
            })
        }
        GateView::On { queued_since } => (queued_since, false),
        // Not known whether (or since when) the queue is on: as if it had just taken users in,
        // so a token handed out while it may have been off passes only as the user's stored
        // queue token, and none passes while the store cannot be asked.
        GateView::Unknown => (Some(now.epoch_ms / 1000), true),
    };
    let token = match token {
        Some(t) => t,
        // Whether this purchase needs a token is not known yet: it waits, never passes unchecked.
        None if unknown => {
            return Err(Denied {
                error: ApiError::QueueUnavailable,
                reason: "flag_unknown",
            })
        }
        None => return Err(deny("missing_token", "an entry token is required")),
    };
    if token.len() > MAX_TOKEN_LEN {
        return Err(bad("token_too_long", "the entry token is too long"));
    }
    let now_s = now.epoch_ms / 1000;
    let payload = verify(&state.keys, token, now_s).map_err(|e| Denied {
        error: ApiError::BypassDenied("the entry token is not valid"),
        reason: e.reason(),
    })?;
    if payload.target_type != target.kind || payload.target_id != target.id {
        return Err(deny("wrong_target", "the entry token is for another sale"));
    }
    if payload.user_id != user {
        return Err(deny(
            "wrong_user",
            "the entry token belongs to another user",
        ));
    }
    if payload.expires_at > now_s + state.config.token.ttl.as_secs() + EXPIRY_SKEW_SECS {
        return Err(deny("expiry_too_far", "the entry token is not valid"));
    }
    if let Some(since) = queued_since {
        issued_before_queue(state, target, user, token, &payload, since, unknown, now).await?;
    }
    if !state.config.token.single_use {
        return Ok(Passed {
            target,
            checked: true,
            claim: None,
        });
    }
    let id = token_id(token);
    let used = || deny("already_used", "the entry token has been used already");
    let in_flight = || {
        deny(
            "in_flight",
            "a purchase with this entry token is in progress",
        )
    };
    if state.claims.used_here(target, &id, now_s) {
        if state.claims.in_flight_here(target, &id) {
            return Err(in_flight());
        }
        // Spent or in flight through this replica: refused without asking the store (which
        // may be down, or may have lost the claim).
        return Err(used());
    }
    // Held until the token has expired on every instance, not only on this one: a replica whose
    // clock is up to EXPIRY_SKEW_SECS behind still accepts it until then.
    let held_until = payload.expires_at.saturating_add(EXPIRY_SKEW_SECS);
    let unconfirmed = |reason| Denied {
        error: ApiError::QueueUnavailable,
        reason,
    };
    // The store answers again after an outage, a broken connection or a rollback: the claims
    // other replicas spent meanwhile may not be written back yet (docs/state.md), and this could
    // be such a token's second use. The purchase waits until the write-backs are done (a few
    // ticks at most), without taking a claim.
    if !state.store.degraded() && state.store.issue_held(&state.pacer, now.epoch_ms) {
        return Err(unconfirmed("claim_held"));
    }
    let owner = claim_owner();
    match claim_in_store(state, target, &id, &owner, held_until).await {
        // The same, found only by this very call (the store came back while it ran): the claim
        // is given back.
        Ok(ClaimTake::Taken { .. })
            if state
                .store
                .issue_held(&state.pacer, crate::clock::now().epoch_ms) =>
        {
            let now = crate::clock::now();
            let terms = claim_terms(state, held_until, now.epoch_ms / 1000);
            let undo = state
                .store
                .settle(target, &id, &owner, Settle::Undo, terms, now);
            if undo.await.is_err() {
                tracing::debug!(%target, "giving back a held claim failed: its lease runs out");
            }
            Err(unconfirmed("claim_held"))
        }
        Ok(ClaimTake::Taken { .. }) => {
            state
                .claims
                .remember_stored(target, &id, &owner, held_until, now_s);
            Ok(Passed {
                target,
                checked: true,
                claim: Some(Claim::Stored {
                    target,
                    id,
                    owner,
                    until: held_until,
                }),
            })
        }
        Ok(ClaimTake::Spent) => Err(used()),
        Ok(ClaimTake::InFlight) => Err(in_flight()),
        Ok(ClaimTake::Exhausted) => Err(deny(
            "attempts_exhausted",
            "the entry token was tried too often",
        )),
        // This replica is at its own limit while Redis answers: a local claim could not see a
        // use recorded in Redis, so the purchase waits instead (the token stays unused).
        Err(StoreError::Saturated) => Err(unconfirmed("claim_saturated")),
        // Redis kept answering something (late replies included) but not this claim: it is
        // slow, or this replica is overloaded, not down. A local claim would not see a use Redis
        // recorded, so the purchase waits.
        Err(_)
            if state
                .store
                .heard_within(crate::clock::now().epoch_ms, down_after_ms(state)) =>
        {
            Err(unconfirmed("claim_unconfirmed"))
        }
        // Redis is down and this replica did not hand the token out: another replica may have
        // seen it spent (or will), and a local claim here would let it through once more. The
        // purchase waits; a retry reaches the replica that issued it, or the store once it is
        // back (docs/state.md: one use per token during an outage).
        Err(_) if !vouches(state, target, user, payload.expires_at, now.epoch_ms) => {
            Err(unconfirmed("claim_unvouched"))
        }
        // Redis is down: HMAC and expiry still hold; the claim is kept on this replica (on disk
        // with `fail_open.claims_file`) and written to the store when it answers again.
        Err(_) => match state
            .claims
            .take_local(
                target,
                &id,
                held_until,
                state.config.token.max_attempts,
                now_s,
            )
            .await
        {
            LocalClaim::Taken => Ok(Passed {
                target,
                checked: true,
                claim: Some(Claim::Local {
                    target,
                    id,
                    until: held_until,
                }),
            }),
            LocalClaim::AlreadyUsed => Err(used()),
            LocalClaim::Exhausted => Err(deny(
                "attempts_exhausted",
                "the entry token was tried too often",
            )),
            LocalClaim::Refused => Err(unconfirmed("claims_full")),
        },
    }
}

/// Whether this replica handed out `user`'s token for `target` expiring at `expires_at`
/// (`issued.rs`, or the pacer's admissions while degraded): the only tokens it claims locally
/// while the store is down.
fn vouches(state: &AppState, target: QueueTarget, user: u64, expires_at: u64, now_ms: u64) -> bool {
    state.issued.get(target, user, now_ms / 1000) == Some(expires_at)
        || state.pacer.remembered_expiry(target, user, now_ms) == Some(expires_at)
}

/// The claim in the store, asked again while a call fails but the store was heard lately (a
/// stall of a few hundred milliseconds, a reply lost to a reconnect): until it answers, until it
/// has been silent for `down_after_ms` (down: the caller claims locally), or for at most twice
/// that in all (slow: the caller answers 503). Every attempt carries this purchase's own owner
/// id, so an attempt that reached Redis and lost its reply is not mistaken for a second use.
async fn claim_in_store(
    state: &AppState,
    target: QueueTarget,
    id: &str,
    owner: &str,
    until: u64,
) -> Result<ClaimTake, StoreError> {
    let down_after = down_after_ms(state);
    let started = crate::clock::now().epoch_ms;
    loop {
        let now = crate::clock::now();
        let terms = claim_terms(state, until, now.epoch_ms / 1000);
        let err = match state.store.claim(target, id, owner, terms, now).await {
            Ok(claimed) => return Ok(claimed),
            Err(e @ StoreError::Saturated) => return Err(e),
            Err(e) => e,
        };
        let now_ms = crate::clock::now().epoch_ms;
        if !state.store.heard_within(now_ms, down_after)
            || now_ms.saturating_sub(started) >= 2 * down_after
        {
            return Err(err);
        }
        tokio::time::sleep(CLAIM_RETRY_PAUSE).await;
    }
}

/// The pause between two attempts of one claim.
const CLAIM_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A claim owner id unique to this purchase attempt: a random per-process prefix and a counter.
fn claim_owner() -> String {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut b = [0u8; 8];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
        u64::from_le_bytes(b)
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix:016x}-{n:x}")
}

/// How long the store must have sent nothing before a claim is taken without it: four command
/// timeouts, and at least a second (a Redis that stopped answering, not a slow one).
fn down_after_ms(state: &AppState) -> u64 {
    crate::queue::millis(state.config.store.command_timeout)
        .saturating_mul(4)
        .max(1000)
}

/// How long after `queued_since` a token is still checked against the store: the time every
/// instance takes to see a flag change (3 s, docs/operations.md#the-flag), plus the clock
/// difference allowed between the host that changed it and the instances that mint.
const QUEUED_SETTLE_SECS: u64 = 3 + EXPIRY_SKEW_SECS;

/// A token issued before the queue last took users in (or while that change spread) may have
/// been handed out without queueing (the flag off, a rollout that left the user out, a degraded
/// store), possibly one per second per user: it passes only if it is the very token the queue
/// holds for this user. Tokens issued later pass without this lookup, so it costs a store call
/// only in the minutes after a flag change. While this replica does not know the flag yet
/// (`unknown`), a token the store does not hold waits (503) instead of being refused: the flag
/// may turn out on since long ago, or the token's write-back may be on its way (docs/state.md).
#[allow(clippy::too_many_arguments)]
async fn issued_before_queue(
    state: &AppState,
    target: QueueTarget,
    user: u64,
    token: &str,
    payload: &crate::token::TokenPayload,
    since: u64,
    unknown: bool,
    now: Now,
) -> Result<(), Denied> {
    let issued_at = payload
        .expires_at
        .saturating_sub(state.config.token.ttl.as_secs());
    if issued_at >= since.saturating_add(QUEUED_SETTLE_SECS) {
        return Ok(());
    }
    match state.store.stored_token(target, user, now).await {
        // Compared as digests: no timing difference tells how much of the stored token matched.
        Ok(Some(stored))
            if ring::digest::digest(&ring::digest::SHA256, stored.as_bytes()).as_ref()
                == ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref() =>
        {
            Ok(())
        }
        Ok(_) if unknown => Err(Denied {
            error: ApiError::QueueUnavailable,
            reason: "flag_unknown",
        }),
        Ok(_) => Err(deny(
            "issued_before_queue",
            "the entry token was issued before the queue opened",
        )),
        // Only the store can tell; the purchase waits instead (the token stays unused).
        Err(_) => Err(Denied {
            error: ApiError::QueueUnavailable,
            reason: "issued_before_queue_unchecked",
        }),
    }
}

/// A short, stable id of a token for its single-use claim: SHA-256 of the token, first 16 bytes.
fn token_id(token: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut id = String::with_capacity(32);
    for &b in d.as_ref().iter().take(16) {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    id
}

/// What the gate decided about a request whose path has a gated route's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// Not the gated method and nothing that could create (GET, HEAD, DELETE...): passes as is.
    NotGated,
    /// Checked (or the queue is off for this user): forward, holding `claim` if one was taken.
    Pass { claim: Option<Claim> },
    /// Refused: the backend sees nothing.
    Refuse(Denied),
}

/// The gate: other creating methods, then the token check (method overrides were refused by
/// `hygiene::check_route`, whatever the method). Owns its metrics (tokens consumed and rejected, bypass attempts) and the log
/// line of a refusal.
pub async fn decide(
    state: &AppState,
    g: &GatedPath<'_>,
    method: &Method,
    facts: &HeaderFacts<'_>,
    identity: Result<u64, IdentityError>,
    now: Now,
) -> GateDecision {
    let route = g.route;
    let gated = route.gates(method);
    let denied = if !gated && super::hygiene::may_create(method) {
        // Another method that may create on a purchase path (PUT, PATCH, a custom one): a
        // backend that maps it to the same handler must not get it unchecked.
        Denied {
            error: ApiError::MethodNotAllowed,
            reason: "other_method",
        }
    } else if !gated {
        return GateDecision::NotGated;
    } else {
        match check(state, g, facts, identity, now).await {
            Ok(passed) => {
                if passed.checked {
                    state.count_token(passed.target, "consumed");
                }
                return GateDecision::Pass {
                    claim: passed.claim,
                };
            }
            Err(d) => {
                if let Some(t) = g.target {
                    state.count_token(t, "rejected");
                }
                d
            }
        }
    };
    state
        .metrics
        .bypass
        .with_label_values(&[&route.template, denied.reason])
        .inc();
    tracing::info!(route = %route.template, reason = denied.reason, "gated request refused");
    GateDecision::Refuse(denied)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn token_ids_are_stable_hex() {
        assert_eq!(token_id("a"), token_id("a"));
        assert_ne!(token_id("a"), token_id("b"));
        assert_eq!(token_id("a").len(), 32);
        // SHA-256("a"), first 16 bytes.
        assert_eq!(token_id("a"), "ca978112ca1bbdcafac231b39a23dc4d");
    }
}
