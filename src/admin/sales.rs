//! `/sales` on the admin listener (private, like `/metrics`): an operator creates, changes,
//! pauses and deletes sales at run time. The sale's hash in the store is the one source of truth
//! (`crate::sale`); every replica's scripts read it, so a change takes effect at the next tick
//! everywhere, whichever replica took it.
//!
//! - `GET /sales` lists the sales (registered ones and those with a queue), `GET
//!   /sales/{type}/{id}` shows one with its live figures (404 for an unknown sale).
//! - `PUT /sales/{type}/{id}` with a JSON object of sale fields creates the sale or merges the
//!   fields into it (200, the full sale; 400 `BAD_REQUEST` naming the field). A created sale is
//!   registered too (`queue:targets`), so `queue.targets = "registered"` admits it.
//! - `DELETE /sales/{type}/{id}` drops the sale, its queue and its registration (204).
//!
//! Writes carry `Authorization: Bearer <token>`, the value of the environment variable named by
//! `server.admin_token_env`, compared in constant time (an HMAC of what was sent, under a key made
//! at start-up, against the HMAC of the token); without it configured every write is refused.

use std::sync::Arc;

use http::Method;
use ring::hmac;

use crate::app::AppState;
use crate::queue::{QueueTarget, TargetType};
use crate::sale::{Sale, SalePatch};
use crate::store::{QueueStore, StoreError};

/// The largest request body a sale change may have.
pub const MAX_BODY: usize = 16 * 1024;

/// The admin writes' credential: the HMAC of the configured token under a key of this process.
pub struct AdminToken {
    key: hmac::Key,
    tag: hmac::Tag,
    /// What the audit log names the credential by: the first 12 hex digits of its SHA-256,
    /// never the token.
    id: String,
}

impl AdminToken {
    /// The token of `server.admin_token_env`: `Ok(None)` without one configured; an error when the
    /// variable is named but unset or shorter than 16 bytes (a guessable token on an endpoint
    /// that can stop a sale).
    pub fn from_env(var: Option<&str>) -> Result<Option<AdminToken>, String> {
        let Some(var) = var else { return Ok(None) };
        AdminToken::from_value(var, std::env::var(var).ok().as_deref()).map(Some)
    }

    /// The token `value` of the variable `var` (`None`: unset; the name is for the errors).
    pub fn from_value(var: &str, value: Option<&str>) -> Result<AdminToken, String> {
        let value = value
            .ok_or_else(|| format!("server.admin_token_env names ${var}, which is not set"))?;
        if value.len() < 16 {
            return Err(format!(
                "${var} (server.admin_token_env) must hold at least 16 bytes"
            ));
        }
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
            .map_err(|_| "no randomness for the admin token's key".to_string())?;
        let tag = hmac::sign(&key, value.as_bytes());
        let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
        let id = digest.as_ref()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(AdminToken { key, tag, id })
    }

    /// The credential's id for the audit log (`sha256:` and 12 hex digits).
    pub fn id(&self) -> String {
        format!("sha256:{}", self.id)
    }

    /// Whether `authorization` (the header's value) is `Bearer <the token>`.
    fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        hmac::verify(&self.key, token, self.tag.as_ref()).is_ok()
    }
}

/// Who may write: the configured token's id when `authorization` carries it; otherwise the
/// refusal (403 without a token configured, 401 with a wrong or missing one).
pub fn authorize(
    token: Option<&AdminToken>,
    authorization: Option<&[u8]>,
) -> Result<String, SalesAnswer> {
    match token {
        None => Err(error(
            403,
            "FORBIDDEN",
            "admin writes are off: set server.admin_token_env",
        )),
        Some(t) if !t.accepts(authorization) => Err(error(
            401,
            "UNAUTHORIZED",
            "Authorization: Bearer <admin token>",
        )),
        Some(t) => Ok(t.id()),
    }
}

/// One request to `/sales…`: its method, path, `Authorization` header and body.
pub struct SalesRequest<'a> {
    pub method: &'a Method,
    /// The client's address, for the audit log.
    pub peer: &'a str,
    pub path: &'a str,
    pub authorization: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// The answer: status and JSON body (`None`: no body, 204).
pub type SalesAnswer = (u16, Option<serde_json::Value>);

fn error(status: u16, code: &str, detail: impl Into<String>) -> SalesAnswer {
    (
        status,
        Some(serde_json::json!({ "code": code, "detail": detail.into() })),
    )
}

pub fn store_error(e: &StoreError) -> SalesAnswer {
    error(
        503,
        "STORE_UNAVAILABLE",
        format!("the store could not be used: {e}"),
    )
}

/// The sale named by `/sales/{type}/{id}`, strictly (the public API's spelling).
fn sale_target(rest: &str) -> Option<QueueTarget> {
    let (kind, id) = rest.split_once('/')?;
    Some(QueueTarget::new(
        TargetType::from_path_segment(kind)?,
        crate::queue::parse_positive_id(id)?,
    ))
}

pub async fn handle(
    state: &Arc<AppState>,
    token: Option<&AdminToken>,
    req: SalesRequest<'_>,
) -> SalesAnswer {
    let write = matches!(*req.method, Method::PUT | Method::DELETE);
    if req.path == "/sales" {
        return match *req.method {
            Method::GET => list(state).await,
            _ => error(405, "METHOD_NOT_ALLOWED", "GET /sales"),
        };
    }
    if let Some(rest) = req
        .path
        .strip_prefix("/sales/")
        .and_then(|r| r.strip_suffix("/draw"))
    {
        let Some(target) = sale_target(rest) else {
            return error(404, "NOT_FOUND", "draws are at /sales/{type}/{id}/draw");
        };
        return match *req.method {
            Method::GET => draw_export(state, target).await,
            _ => error(405, "METHOD_NOT_ALLOWED", "GET"),
        };
    }
    let Some(target) = req.path.strip_prefix("/sales/").and_then(sale_target) else {
        return error(
            404,
            "NOT_FOUND",
            "sales are at /sales/{limited-drop|ticketing-event}/{id}",
        );
    };
    let who = if write {
        match authorize(token, req.authorization) {
            Ok(who) => who,
            Err(refused) => return refused,
        }
    } else {
        String::new()
    };
    match *req.method {
        Method::GET => match state.store.sale(target).await {
            Ok(Some(sale)) => (200, Some(shown(state, target, &sale).await)),
            Ok(None) => error(404, "NOT_FOUND", format!("no sale {target}")),
            Err(e) => store_error(&e),
        },
        Method::PUT => put(state, target, req.body, &who, req.peer).await,
        Method::DELETE => delete(state, target, &who, req.peer).await,
        _ => error(405, "METHOD_NOT_ALLOWED", "GET, PUT or DELETE"),
    }
}

async fn put(
    state: &Arc<AppState>,
    target: QueueTarget,
    body: &[u8],
    who: &str,
    peer: &str,
) -> SalesAnswer {
    let bad_field = |e: crate::sale::FieldError| {
        (
            400,
            Some(serde_json::json!({
                "code": "BAD_REQUEST",
                "field": e.field,
                "detail": e.to_string(),
            })),
        )
    };
    let patch = match SalePatch::from_json(body) {
        Ok(p) => p,
        Err(e) => return bad_field(e),
    };
    let sale = match state
        .store
        .put_sale(target, &patch, crate::clock::now())
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return bad_field(e),
        Err(e) => return store_error(&e),
    };
    // Registered after it exists: a sale is never listed without its parameters.
    if let Err(e) = state.store.register_sale(target, true).await {
        return store_error(&e);
    }
    state.allowed.insert(target);
    state.sales.set(
        target,
        Some(sale.clone()),
        None,
        crate::clock::now().epoch_ms,
    );
    let change: Vec<String> = patch
        .fields()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    tracing::info!(who, peer, %target, change = %change.join(" "), version = sale.version, "sale changed through the admin API");
    (200, Some(shown(state, target, &sale).await))
}

async fn delete(state: &Arc<AppState>, target: QueueTarget, who: &str, peer: &str) -> SalesAnswer {
    // Unregistered first: replicas write back only registered sales, so none restores it.
    if let Err(e) = state.store.register_sale(target, false).await {
        return store_error(&e);
    }
    state.allowed.remove(target);
    state
        .sales
        .set(target, None, None, crate::clock::now().epoch_ms);
    match state.store.delete_sale(target).await {
        Ok(true) => {
            tracing::info!(who, peer, %target, "sale deleted through the admin API");
            (204, None)
        }
        Ok(false) => error(404, "NOT_FOUND", format!("no sale {target}")),
        Err(e) => store_error(&e),
    }
}

/// The draw for an auditor: the commitment and, once drawn, the seed, the entrants (sorted ids)
/// and the order they were given. `vq-gateway draw verify FILE` checks a saved copy.
async fn draw_export(state: &Arc<AppState>, target: QueueTarget) -> SalesAnswer {
    let sale = match state.store.sale(target).await {
        Ok(Some(s)) if !s.draw_commitment.is_empty() => s,
        Ok(_) => {
            return error(
                404,
                "NO_DRAW",
                format!("{target} has no opening, so no draw"),
            )
        }
        Err(e) => return store_error(&e),
    };
    let mut body = serde_json::json!({
        "sale": target.to_string(),
        "commitment": sale.draw_commitment,
        "opensAt": sale.opens_at_ms,
    });
    if sale.drawn_at_ms > 0 {
        let order = match state.store.draw_order(target).await {
            Ok(o) => o,
            Err(e) => return store_error(&e),
        };
        let mut entrants = order.clone();
        entrants.sort_unstable();
        body["drawnAt"] = sale.drawn_at_ms.into();
        body["seed"] = sale.draw_seed.into();
        body["algorithm"] = crate::draw::ALGORITHM.into();
        body["entrants"] = entrants.into();
        body["order"] = order.into();
    }
    (200, Some(body))
}

async fn list(state: &Arc<AppState>) -> SalesAnswer {
    match listed(state, usize::MAX).await {
        Ok((sales, _)) => {
            let sales: Vec<serde_json::Value> = sales.into_iter().map(|(_, _, v)| v).collect();
            (200, Some(serde_json::json!({ "sales": sales })))
        }
        Err(e) => store_error(&e),
    }
}

/// The sales (the allowed ones and those with a queue) in target order, each with its live
/// figures (`shown`), at most `limit` of them, and how many targets there are (sales and
/// queues; only the first `limit` sales are read).
pub async fn listed(
    state: &Arc<AppState>,
    limit: usize,
) -> Result<(Vec<(QueueTarget, Sale, serde_json::Value)>, usize), StoreError> {
    let mut targets = state.allowed.members();
    targets.extend(state.store.active_targets(crate::clock::now()).await?);
    targets.sort();
    targets.dedup();
    let mut sales = Vec::new();
    for &target in &targets {
        if sales.len() >= limit {
            break;
        }
        if let Some(sale) = state.store.sale(target).await? {
            let figures = shown(state, target, &sale).await;
            sales.push((target, sale, figures));
        }
    }
    Ok((sales, targets.len()))
}

/// The sale with its target and live figures (`null` when the store cannot give them now): the
/// waiting and admitted users, the admission rates, the budget per second, the share of the
/// capacity in use and the time until the last user waiting now is admitted at the measured
/// rate (at the budget while nothing was measured yet; `null` while paused).
async fn shown(state: &Arc<AppState>, target: QueueTarget, sale: &Sale) -> serde_json::Value {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut body = sale.to_json();
    body["type"] = target.kind.path_segment().into();
    body["id"] = target.id.to_string().into();
    let budget_per_sec = sale.batch_size as f64 * 1000.0 / sale.tick_ms.max(1) as f64;
    body["budgetPerSec"] = round(budget_per_sec).into();
    let stats = state.store.stats(target, crate::clock::now()).await.ok();
    body["waitingCount"] = stats.as_ref().map(|s| s.waiting_count).into();
    body["admittedCount"] = stats.as_ref().map(|s| s.admitted_count).into();
    body["admissionRatePerSec"] = stats
        .as_ref()
        .map(|s| round(s.admission_rate_per_sec))
        .into();
    body["liveRatePerSec"] = stats.as_ref().map(|s| round(s.live_rate_per_sec)).into();
    body["capacityUsed"] = stats
        .as_ref()
        .filter(|_| sale.max_capacity > 0)
        .map(|s| round(s.waiting_count as f64 / sale.max_capacity as f64))
        .into();
    body["etaLastUserS"] = stats
        .as_ref()
        .and_then(|s| {
            let rate = if s.live_rate_per_sec > 0.0 {
                s.live_rate_per_sec
            } else {
                budget_per_sec
            };
            match sale.state {
                _ if s.waiting_count == 0 => Some(0.0),
                crate::sale::SaleState::Paused => None,
                _ if rate > 0.0 => Some((s.waiting_count as f64 / rate).ceil()),
                _ => None,
            }
        })
        .into();
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sale_paths_are_strict() {
        let t = sale_target("limited-drop/42").unwrap();
        assert_eq!(t.to_string(), "LIMITED_DROP:42");
        for bad in [
            "limited-drop/042",
            "limited-drop/0",
            "LIMITED_DROP/42",
            "limited-drop/42/",
            "limited-drop",
            "ticketing-event/-1",
            "ticketing-event/1/x",
        ] {
            assert!(sale_target(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn only_the_bearer_token_is_accepted() {
        let t = AdminToken::from_value("VQ_ADMIN_TOKEN", Some("0123456789abcdef-secret")).unwrap();
        assert!(t.accepts(Some(b"Bearer 0123456789abcdef-secret")));
        for bad in [
            &b"Bearer 0123456789abcdef-secreT"[..],
            b"Bearer 0123456789abcdef-secret ",
            b"bearer 0123456789abcdef-secret",
            b"0123456789abcdef-secret",
            b"Bearer ",
            b"",
        ] {
            assert!(!t.accepts(Some(bad)), "{bad:?}");
        }
        assert!(!t.accepts(None));
        assert!(AdminToken::from_value("VQ_ADMIN_TOKEN", Some("short")).is_err());
        assert!(AdminToken::from_value("VQ_ADMIN_TOKEN", None).is_err());
        assert!(AdminToken::from_env(Some("VQ_TEST_ADMIN_TOKEN_UNSET")).is_err());
        assert!(AdminToken::from_env(None).unwrap().is_none());
    }
}
