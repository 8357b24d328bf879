//! The operator console on the admin listener (private, like `/metrics`): one page to watch and
//! steer the sales of the whole deployment from any replica.
//!
//! - `GET /console`: the page; `GET /console/console.js` and `/console/console.css`: its script
//!   and style. All three are embedded in the binary (`console/`), load nothing else, and work
//!   offline. The page asks for the admin token, keeps it in its own memory only, and sends it
//!   with each write.
//! - `GET /console/state?since=MS`: what the page shows, read fresh at every tick: each sale
//!   with its figures (`sales::listed`) and its console history after `since` (the pump's
//!   visits, `QueueStore::ticks`), the flag, and the replica roster with each member's last
//!   registration.
//! - `GET /flag`, `PUT /flag`: the queue flag (`flag::FlagChange`: the global switch, the
//!   rollout, or one sale's override). A write goes through Redis' flag document like
//!   `vq-gateway flag set` (every replica adopts it within a second; this one at once), or sets
//!   the local flag with the memory store (one process).
//!
//! Writes carry the admin token (`sales::authorize`); each one is logged with the token's id
//! (never the token), the peer and what changed.

use std::sync::Arc;

use super::sales::{self, SalesAnswer};
use crate::app::AppState;
use crate::flag::{FlagChange, FlagState};
use crate::queue::QueueTarget;
use crate::settings::FlagWriter;
use crate::store::QueueStore;

pub const PAGE: &str = include_str!("console/index.html");
pub const SCRIPT: &str = include_str!("console/console.js");
pub const STYLE: &str = include_str!("console/console.css");

/// The most sales the console lists (clients choose target ids: with `queue.targets = "any"`
/// there may be thousands); the state says how many there are.
pub const MAX_SALES: usize = 50;

fn error(status: u16, code: &str, detail: impl Into<String>) -> SalesAnswer {
    (
        status,
        Some(serde_json::json!({ "code": code, "detail": detail.into() })),
    )
}

/// The flag as this replica holds it (`known: false` before its first reading of Redis).
pub fn flag_json(app: &AppState) -> serde_json::Value {
    let Some(flag) = app.flag.snapshot() else {
        return serde_json::json!({ "known": false });
    };
    let mut targets: Vec<(String, bool)> = flag
        .per_target
        .iter()
        .map(|(t, on)| (t.to_string(), *on))
        .collect();
    targets.sort();
    let overrides: serde_json::Map<String, serde_json::Value> =
        targets.into_iter().map(|(t, on)| (t, on.into())).collect();
    serde_json::json!({
        "known": true,
        "enabled": flag.enabled,
        "rolloutPercent": flag.rollout_percent,
        "targets": overrides,
        "queuedSince": flag.queued_since,
    })
}

/// Whether the queue is on for a sale under `flag`: `on`, `off`, or `partial` (a rollout below
/// 100 % queues only that share of the users).
fn queue_for(flag: Option<&FlagState>, target: QueueTarget) -> &'static str {
    let Some(flag) = flag else { return "unknown" };
    let enabled = flag
        .per_target
        .get(&target)
        .copied()
        .unwrap_or(flag.enabled);
    match (enabled, flag.rollout_percent) {
        (false, _) | (true, 0) => "off",
        (true, 100..) => "on",
        (true, _) => "partial",
    }
}

/// `PUT /flag`.
pub async fn put_flag(
    app: &AppState,
    writer: Option<&dyn FlagWriter>,
    body: &[u8],
    who: &str,
    peer: &str,
) -> SalesAnswer {
    let change = match FlagChange::from_json(body) {
        Ok(c) => c,
        Err(e) => return error(400, "BAD_REQUEST", e),
    };
    let now_s = crate::clock::now().epoch_ms / 1000;
    let fields = match change.fields(now_s) {
        Ok(f) => f,
        Err(e) => return error(400, "BAD_REQUEST", e),
    };
    let written: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let version = match writer {
        Some(writer) => match writer.write_flag(&fields).await {
            Ok(v) => Some(v),
            Err(e) => return error(503, "STORE_UNAVAILABLE", e),
        },
        None => {
            // One process: the local flag is the only one.
            let current = app
                .flag
                .snapshot()
                .unwrap_or_else(|| FlagState::new(false, 100));
            let (next, _) = FlagState::with_overrides(&current, &fields);
            app.flag.set(next);
            None
        }
    };
    tracing::info!(who, peer, change = %written.join(" "), version, "flag changed through the admin API");
    let mut body = flag_json(app);
    body["version"] = version.into();
    (200, Some(body))
}

/// `GET /console/state`. While the store cannot be read (an outage: the moment an operator
/// needs the page most) it still answers, with what this replica knows (the flag, whether it is
/// degraded) and the store's error in `storeError`.
pub async fn state(app: &Arc<AppState>, since_ms: u64) -> SalesAnswer {
    let now_ms = crate::clock::now().epoch_ms;
    let flag = app.flag.snapshot();
    let mut store_error: Option<String> = None;
    let (sales, count) = match sales_with_ticks(app, flag.as_ref(), since_ms).await {
        Ok(listed) => listed,
        Err(e) => {
            store_error = Some(e.to_string());
            (Vec::new(), 0)
        }
    };
    let live_window = app.config.pacer().live_window_ms();
    let replicas: Vec<serde_json::Value> = match app.store.roster_members().await {
        Ok(members) => members
            .into_iter()
            .map(|m| {
                let age = now_ms.saturating_sub(m.last_seen_ms);
                let status = if age > live_window {
                    "silent"
                } else if m.credit_ms > 0 {
                    "degraded"
                } else {
                    "live"
                };
                serde_json::json!({
                    "instance": m.instance,
                    "name": m.name,
                    "slice": m.slice,
                    "lastSeen": m.last_seen_ms,
                    "status": status,
                    "creditMs": m.credit_ms,
                })
            })
            .collect(),
        Err(e) => {
            store_error.get_or_insert(e.to_string());
            Vec::new()
        }
    };
    (
        200,
        Some(serde_json::json!({
            "now": now_ms,
            "store": app.store.kind(),
            "storeError": store_error,
            "degraded": app.store.degraded(),
            "failOpenMode": app.config.fail_open.mode.as_str(),
            "liveWindowMs": live_window,
            "flag": flag_json(app),
            "sales": sales,
            "salesCount": count,
            "replicas": replicas,
        })),
    )
}

/// The sales the console lists, each with whether its queue is on, its draw's seed once drawn,
/// and its ticks after `since_ms`; and how many targets there are.
async fn sales_with_ticks(
    app: &Arc<AppState>,
    flag: Option<&FlagState>,
    since_ms: u64,
) -> Result<(Vec<serde_json::Value>, usize), crate::store::StoreError> {
    let (listed, count) = sales::listed(app, MAX_SALES).await?;
    let mut sales = Vec::with_capacity(listed.len());
    for (target, sale, mut figures) in listed {
        figures["key"] = target.to_string().into();
        figures["queue"] = queue_for(flag, target).into();
        if sale.drawn_at_ms > 0 {
            // Public once the draw has run (the admin export shows it too).
            figures["drawSeed"] = sale.draw_seed.clone().into();
        }
        let ticks = app.store.ticks(target, since_ms).await?;
        figures["ticks"] = ticks.iter().map(|t| t.to_json()).collect();
        sales.push(figures);
    }
    Ok((sales, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    #[test]
    fn a_sales_queue_follows_its_override_then_the_switch_and_rollout() {
        let target = QueueTarget::new(TargetType::LimitedDrop, 42);
        let other = QueueTarget::new(TargetType::LimitedDrop, 7);
        let mut flag = FlagState::new(true, 100);
        assert_eq!(queue_for(Some(&flag), target), "on");
        flag.rollout_percent = 30;
        assert_eq!(queue_for(Some(&flag), target), "partial");
        flag.rollout_percent = 0;
        assert_eq!(queue_for(Some(&flag), target), "off");
        flag.rollout_percent = 100;
        flag.per_target.insert(target, false);
        assert_eq!(queue_for(Some(&flag), target), "off");
        assert_eq!(queue_for(Some(&flag), other), "on");
        assert_eq!(queue_for(None, target), "unknown");
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for text in [PAGE, SCRIPT, STYLE] {
            for outside in ["http://", "https://", "//cdn", "@import"] {
                assert!(!text.contains(outside), "{outside}");
            }
        }
        assert!(
            !PAGE.contains("<script>"),
            "no inline script: the CSP forbids it"
        );
    }
}
