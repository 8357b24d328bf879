//! The operator-facing keys of `RedisStore`: the run-time settings documents (the flag
//! `queue:flag`, the registered sales `queue:targets`, each with its version: `src/settings.rs`),
//! the replica count the CLI checks, and Redis's own memory settings.

use fred::prelude::*;

use super::{store_err, RedisStore};
use crate::settings::{DocKind, Reading};
use crate::store::replies::{protocol, reply_array};
use crate::store::scripts::ROSTER_KEY;
use crate::store::StoreError;

impl RedisStore {
    /// `maxmemory` and `maxmemory-policy` as Redis reports them (None where `CONFIG` is refused,
    /// as on some managed services).
    pub async fn memory_config(&self) -> Option<(u64, String)> {
        let reply = self
            .command("CONFIG", vec!["GET".into(), "maxmemory*".into()])
            .await
            .ok()?;
        let pairs = string_pairs(reply, "config").ok()?;
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        Some((get("maxmemory")?.parse().ok()?, get("maxmemory-policy")?))
    }

    /// One run-time settings document with its version (`settings_read.lua`).
    pub async fn read_doc(&self, kind: DocKind) -> Result<Reading, StoreError> {
        let what = if kind.is_hash() { "hash" } else { "set" };
        let reply = self
            .eval(
                &self.scripts.settings_read,
                vec![kind.key().to_string(), kind.meta_key()],
                vec![what.into()],
            )
            .await?;
        let mut values = reply_array(reply, "settings")?.into_iter();
        let version = match values.next().and_then(|v| v.as_i64()) {
            Some(v) if v >= 0 => Some(v as u64),
            Some(_) => None,
            None => return Err(protocol("settings version", &Value::Null)),
        };
        let strings: Vec<String> = values.filter_map(|v| v.as_string()).collect();
        let items = if kind.is_hash() {
            strings
                .chunks(2)
                .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                .collect()
        } else {
            strings.into_iter().map(|m| (m, String::new())).collect()
        };
        Ok(Reading { items, version })
    }

    /// A write of a settings document (`settings_write.lua`): `op` is `set`, `add`, `remove`,
    /// `restore` or `bootstrap`; `arg` the writer's clock or the version restored. Returns the
    /// script's status (`ok`, `newer`, `missing`) and the version Redis holds.
    pub async fn write_doc(
        &self,
        kind: DocKind,
        op: &str,
        arg: u64,
        may_create: bool,
        items: &[(String, String)],
    ) -> Result<(String, u64), StoreError> {
        let what = if kind.is_hash() { "hash" } else { "set" };
        let mut argv: Vec<Value> = vec![
            what.into(),
            op.into(),
            arg.to_string().into(),
            if may_create { "1" } else { "0" }.into(),
        ];
        for (k, v) in items {
            argv.push(k.as_str().into());
            if kind.is_hash() {
                argv.push(v.as_str().into());
            }
        }
        let reply = self
            .eval(
                &self.scripts.settings_write,
                vec![kind.key().to_string(), kind.meta_key()],
                argv,
            )
            .await?;
        let values = reply_array(reply, "settings write")?;
        let status = values.first().and_then(|v| v.as_string());
        let version = values.get(1).and_then(|v| v.as_u64());
        match (status, version) {
            (Some(s), Some(v)) => Ok((s, v)),
            _ => Err(protocol("settings write", &Value::Array(values))),
        }
    }

    /// How many gateway replicas registered within `window` (the CLI's check that someone runs
    /// who may write back a lost settings document).
    pub async fn live_replicas(&self, window: std::time::Duration) -> Result<u64, StoreError> {
        let time = self.command("TIME", vec![]).await.map_err(store_err)?;
        let secs = reply_array(time, "time")?
            .first()
            .and_then(|v| v.as_string())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let from = (secs * 1000).saturating_sub(crate::queue::millis(window));
        let count = self
            .command(
                "ZCOUNT",
                vec![ROSTER_KEY.into(), from.to_string().into(), "+inf".into()],
            )
            .await
            .map_err(store_err)?;
        Ok(count.as_u64().unwrap_or(0))
    }
}

/// A hash-shaped reply (`HGETALL`, `CONFIG GET`) as its string pairs: a map under RESP3, a flat
/// array under RESP2, nothing for a missing key. Pairs that are not strings are skipped.
pub(super) fn string_pairs(reply: Value, what: &str) -> Result<Vec<(String, String)>, StoreError> {
    Ok(match reply {
        Value::Map(map) => map
            .inner()
            .into_iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_string()?)))
            .collect(),
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|p| Some((p.first()?.as_string()?, p.get(1)?.as_string()?)))
            .collect(),
        Value::Null => Vec::new(),
        other => return Err(protocol(what, &other)),
    })
}
