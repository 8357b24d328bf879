//! `vq-gateway flag show|set`: the ops toggle (docs/operations.md#the-flag). Reads and writes the
//! same `queue:flag` hash every instance refreshes from, so a change is live everywhere within 3 s,
//! no deploy. `target add|remove|list` and `sale create|set|show|list|pause|resume|delete`: the
//! registered sales and each sale's own parameters, in Redis too.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, StoreBackend};
use crate::flag::{FlagState, FLAG_KEY};
use crate::queue::QueueTarget;
use crate::sale::{Sale, SalePatch, SaleState};
use crate::settings::DocKind;
use crate::store::{QueueStore, RedisStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("the configured store is `memory`: the flag can only be changed at run time with the redis store (edit [flag] in the TOML file and restart instead)")]
    NotRedis,
    #[error("cannot reach Redis at {0} within {1:?}")]
    Unreachable(String, Duration),
    #[error("{0}")]
    Usage(String),
    #[error("redis: {0}")]
    Store(String),
    #[error("{0} is missing from Redis (restarted empty, or flushed) and {1} replica(s) run: they write back the last state they read within seconds; run this command again then")]
    Missing(&'static str, u64),
}

/// What `flag set` was given (its target still text: `set` parses it).
#[derive(Debug, Clone, Default)]
pub struct FlagSetArgs {
    pub enabled: Option<bool>,
    pub rollout: Option<u8>,
    pub target: Option<String>,
}

const CONNECT_WITHIN: Duration = Duration::from_secs(3);

fn runtime() -> Result<tokio::runtime::Runtime, OpsError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| OpsError::Store(e.to_string()))
}

async fn connect(config: &Config) -> Result<Arc<RedisStore>, OpsError> {
    let StoreBackend::Redis { url } = &config.store.backend else {
        return Err(OpsError::NotRedis);
    };
    let mut store = RedisStore::from_url(url, Duration::from_secs(2))
        .map_err(|e| OpsError::Store(e.to_string()))?
        .with_sale_defaults(config.sale_defaults());
    // With the token secret in the environment an opening can be set (its draw committed to);
    // without it, `sale create|set opensAt=` is refused with a message saying so.
    if let Ok(keys) = crate::server::load_keys(config) {
        store = store.with_draw_keys(crate::draw::DrawKeys::from_token_keys(&keys));
    }
    let store = Arc::new(store);
    if !store.connect(CONNECT_WITHIN).await {
        return Err(OpsError::Unreachable(url.describe(), CONNECT_WITHIN));
    }
    let deadline = tokio::time::Instant::now() + CONNECT_WITHIN;
    while tokio::time::Instant::now() < deadline {
        if store.ping().await.is_ok() {
            return Ok(store);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(OpsError::Unreachable(url.describe(), CONNECT_WITHIN))
}

/// How recently a replica must have registered for the CLI to count it as running (it would
/// write back a settings document Redis lost): the roster's live window at its longest default.
const REPLICA_WINDOW: Duration = Duration::from_secs(10);

/// Writes an operator's change of a settings document. A document that Redis lost (restarted
/// empty) while replicas run is not created from this partial change: the replicas write back
/// the whole one within seconds, and this change is then made on top of it.
async fn write_setting(
    store: &RedisStore,
    kind: DocKind,
    op: &str,
    items: &[(String, String)],
) -> Result<u64, OpsError> {
    // Missing: a new deployment, or Redis lost it and the running replicas are about to write it
    // back (the replica roster may be lost with it, so wait for them first).
    let missing = |r: &crate::settings::Reading| r.version.is_none() && r.items.is_empty();
    let mut reading = store
        .read_doc(kind)
        .await
        .map_err(|e| OpsError::Store(e.to_string()))?;
    let mut waited = Duration::ZERO;
    while missing(&reading) && waited < crate::settings::BOOTSTRAP_AFTER + Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        waited += Duration::from_millis(500);
        reading = store
            .read_doc(kind)
            .await
            .map_err(|e| OpsError::Store(e.to_string()))?;
    }
    let live = store
        .live_replicas(REPLICA_WINDOW)
        .await
        .map_err(|e| OpsError::Store(e.to_string()))?;
    let now_ms = crate::clock::now().epoch_ms;
    let (status, version) = store
        .write_doc(kind, op, now_ms, live == 0, items)
        .await
        .map_err(|e| OpsError::Store(e.to_string()))?;
    match status.as_str() {
        "ok" => Ok(version),
        "missing" => Err(OpsError::Missing(kind.key(), live)),
        other => Err(OpsError::Store(format!("unexpected answer `{other}`"))),
    }
}

/// `flag show`: the TOML defaults, the runtime overrides and the resulting state.
pub fn show(config: &Config) -> Result<String, OpsError> {
    runtime()?.block_on(async {
        let store = connect(config).await?;
        let reading = store
            .read_doc(DocKind::Flag)
            .await
            .map_err(|e| OpsError::Store(e.to_string()))?;
        let fields = reading.items;
        let defaults = FlagState::new(config.flag.enabled, config.flag.rollout_percent);
        let (state, problems) = FlagState::with_overrides(&defaults, &fields);
        let on_off = |b: bool| if b { "on" } else { "off" };
        let mut out = format!(
            "enabled: {} (TOML default {})\nrollout_percent: {} (TOML default {})\n",
            on_off(state.enabled),
            on_off(defaults.enabled),
            state.rollout_percent,
            defaults.rollout_percent
        );
        let mut targets: Vec<_> = state.per_target.iter().collect();
        targets.sort();
        for (t, on) in targets {
            out.push_str(&format!("{t}: {}\n", on_off(*on)));
        }
        if let Some(since) = state.queued_since {
            out.push_str(&format!(
                "queued since: {since} (epoch s; a token issued before then passes the gate only as the user's stored queue token)\n"
            ));
        }
        match reading.version {
            Some(v) => out.push_str(&format!("version: {v}\n")),
            None => out.push_str(&format!(
                "version: none ({} is missing: a new deployment, or Redis lost it and the replicas write it back)\n",
                DocKind::Flag.meta_key()
            )),
        }
        out.push_str(&format!("raw {FLAG_KEY}: {fields:?}\n"));
        for p in problems {
            out.push_str(&format!("ignored: {p}\n"));
        }
        Ok(out)
    })
}

/// `flag set`: writes the change to `queue:flag`.
pub fn set(config: &Config, args: &FlagSetArgs) -> Result<String, OpsError> {
    let target = match &args.target {
        None => None,
        Some(t) => Some(QueueTarget::parse_key(t).ok_or_else(|| {
            OpsError::Usage(format!(
                "--target `{t}` is not TYPE:ID (e.g. LIMITED_DROP:42)"
            ))
        })?),
    };
    let change = crate::flag::FlagChange {
        enabled: args.enabled,
        rollout: args.rollout,
        target,
    };
    let fields = change
        .fields(crate::clock::now().epoch_ms / 1000)
        .map_err(|e| OpsError::Usage(format!("flag set: {e}")))?;
    runtime()?.block_on(async {
        let store = connect(config).await?;
        let version = write_setting(&store, DocKind::Flag, "set", &fields).await?;
        let written: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Ok(format!(
            "{FLAG_KEY}: set {} (version {version})",
            written.join(" ")
        ))
    })
}

/// `target add|remove|list`: the registered sales in `queue:targets`. `remove` also takes a
/// member that is not a canonical `TYPE:ID` (one written by hand), so it can be cleaned up.
pub fn target(config: &Config, change: Option<(&str, bool)>) -> Result<String, OpsError> {
    runtime()?.block_on(async {
        let store = connect(config).await?;
        let read = |store: Arc<RedisStore>| async move {
            store
                .read_doc(DocKind::Targets)
                .await
                .map_err(|e| OpsError::Store(e.to_string()))
        };
        if let Some((t, add)) = change {
            let member = match QueueTarget::parse_key(t) {
                Some(target) => target.to_string(),
                None if !add
                    && read(store.clone())
                        .await?
                        .items
                        .iter()
                        .any(|(m, _)| m == t) =>
                {
                    t.to_string()
                }
                None => {
                    return Err(OpsError::Usage(format!(
                        "`{t}` is not TYPE:ID (e.g. LIMITED_DROP:42: the type in capitals, the id without leading zeros)"
                    )))
                }
            };
            let op = if add { "add" } else { "remove" };
            write_setting(&store, DocKind::Targets, op, &[(member, String::new())]).await?;
        }
        let mut members: Vec<String> = read(store.clone())
            .await?
            .items
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        members.sort();
        let mut out = String::new();
        if config.queue.targets != crate::allowed::TargetsMode::Registered {
            out.push_str(
                "note: queue.targets is `any` in this file: the list below is not enforced\n",
            );
        }
        for t in &config.queue.registered {
            out.push_str(&format!("{t} (file)\n"));
        }
        for m in members {
            if QueueTarget::parse_key(&m).is_some() {
                out.push_str(&format!("{m}\n"));
            } else {
                let meant = crate::allowed::lenient_key(&m)
                    .map_or("nothing".to_string(), |t| t.to_string());
                out.push_str(&format!(
                    "{m:?} INVALID: not canonical TYPE:ID; registers {meant}; remove it and add the sale again\n"
                ));
            }
        }
        Ok(out)
    })
}

/// What `sale …` does.
#[derive(Debug, Clone)]
pub enum SaleCommand {
    /// Creates a sale (refused if it exists) with the given fields, the file's `[queue]` for the
    /// others.
    Create(String, Vec<String>),
    /// Changes fields of an existing sale.
    Set(String, Vec<String>),
    Show(String),
    List,
    Pause(String),
    Resume(String),
    Delete(String),
}

fn sale_target(s: &str) -> Result<QueueTarget, OpsError> {
    QueueTarget::parse_key(s).ok_or_else(|| {
        OpsError::Usage(format!(
            "`{s}` is not TYPE:ID (e.g. LIMITED_DROP:42: the type in capitals, the id without leading zeros)"
        ))
    })
}

/// `field=value` arguments as a sale change.
fn sale_patch(fields: &[String]) -> Result<SalePatch, OpsError> {
    let mut patch = SalePatch::default();
    for f in fields {
        let (name, value) = f
            .split_once('=')
            .ok_or_else(|| OpsError::Usage(format!("`{f}` is not field=value")))?;
        patch
            .set(name, value)
            .map_err(|e| OpsError::Usage(e.to_string()))?;
    }
    Ok(patch)
}

fn store_failed(e: StoreError) -> OpsError {
    OpsError::Store(e.to_string())
}

/// One sale as `sale show` prints it.
fn sale_line(target: QueueTarget, sale: &Sale) -> String {
    format!(
        "{target}: {} batchSize={} tickMs={} maxCapacity={} heartbeatTimeoutS={} (version {})",
        sale.state.as_str(),
        sale.batch_size,
        sale.tick_ms,
        sale.max_capacity,
        sale.heartbeat_timeout_s,
        sale.version
    )
}

/// `sale create|set|show|list|pause|resume|delete`: the sales' own parameters in Redis
/// (`queue:{TYPE:ID}:sale`), which every replica's scripts read, and their registration.
pub fn sale(config: &Config, command: &SaleCommand) -> Result<String, OpsError> {
    runtime()?.block_on(async {
        let store = connect(config).await?;
        let store = store.as_ref();
        let now = crate::clock::now();
        let change = |target: QueueTarget, patch: SalePatch| async move {
            let sale = store
                .put_sale(target, &patch, now)
                .await
                .map_err(store_failed)?
                .map_err(|e| OpsError::Usage(e.to_string()))?;
            write_setting(
                store,
                DocKind::Targets,
                "add",
                &[(target.to_string(), String::new())],
            )
            .await?;
            Ok::<_, OpsError>(sale_line(target, &sale))
        };
        match command {
            SaleCommand::Create(t, fields) => {
                let target = sale_target(t)?;
                let patch = sale_patch(fields)?;
                if let Some(existing) = store.sale(target).await.map_err(store_failed)? {
                    if existing.version > 0 {
                        return Err(OpsError::Usage(format!(
                            "{target} exists (version {}); change it with `sale set`",
                            existing.version
                        )));
                    }
                }
                change(target, patch).await
            }
            SaleCommand::Set(t, fields) => {
                let target = sale_target(t)?;
                let patch = sale_patch(fields)?;
                if patch == SalePatch::default() {
                    return Err(OpsError::Usage("nothing to set: give field=value".into()));
                }
                if store.sale(target).await.map_err(store_failed)?.is_none() {
                    return Err(OpsError::Usage(format!(
                        "no sale {target}; create it with `sale create`"
                    )));
                }
                change(target, patch).await
            }
            SaleCommand::Pause(t) | SaleCommand::Resume(t) => {
                let target = sale_target(t)?;
                let state = if matches!(command, SaleCommand::Pause(_)) {
                    SaleState::Paused
                } else {
                    SaleState::Open
                };
                if store.sale(target).await.map_err(store_failed)?.is_none() {
                    return Err(OpsError::Usage(format!("no sale {target}")));
                }
                let patch = SalePatch {
                    state: Some(state),
                    ..SalePatch::default()
                };
                change(target, patch).await
            }
            SaleCommand::Show(t) => {
                let target = sale_target(t)?;
                match store.sale(target).await.map_err(store_failed)? {
                    Some(sale) => {
                        let stats = store.stats(target, now).await.map_err(store_failed)?;
                        Ok(format!(
                            "{}\nwaiting {} admitted {} admission rate {:.2}/s",
                            sale_line(target, &sale),
                            stats.waiting_count,
                            stats.admitted_count,
                            stats.admission_rate_per_sec
                        ))
                    }
                    None => Err(OpsError::Usage(format!("no sale {target}"))),
                }
            }
            SaleCommand::List => {
                let registered = store
                    .read_doc(DocKind::Targets)
                    .await
                    .map_err(store_failed)?;
                let mut targets: Vec<QueueTarget> = registered
                    .items
                    .iter()
                    .filter_map(|(m, _)| QueueTarget::parse_key(m))
                    .collect();
                targets.extend(store.active_targets(now).await.map_err(store_failed)?);
                targets.sort();
                targets.dedup();
                let mut out = String::new();
                for target in targets {
                    if let Some(sale) = store.sale(target).await.map_err(store_failed)? {
                        out.push_str(&sale_line(target, &sale));
                        out.push('\n');
                    }
                }
                if out.is_empty() {
                    out.push_str("no sales\n");
                }
                Ok(out)
            }
            SaleCommand::Delete(t) => {
                let target = sale_target(t)?;
                write_setting(
                    store,
                    DocKind::Targets,
                    "remove",
                    &[(target.to_string(), String::new())],
                )
                .await?;
                if store.delete_sale(target).await.map_err(store_failed)? {
                    Ok(format!("{target}: deleted"))
                } else {
                    Err(OpsError::Usage(format!("no sale {target}")))
                }
            }
        }
    })
}
