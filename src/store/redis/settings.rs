//! The operator-facing keys of `RedisStore`: the run-time flag (`queue:flag`), the registered
//! sales (`queue:targets`) and Redis's own memory settings. Plain commands, no scripts.

use fred::prelude::*;

use super::{store_err, RedisStore};
use crate::queue::QueueTarget;
use crate::store::replies::{protocol, reply_array};
use crate::store::scripts::REGISTERED_KEY;
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

    /// The fields of the runtime flag hash (`queue:flag`).
    pub async fn read_flag(&self) -> Result<Vec<(String, String)>, StoreError> {
        let reply = self
            .command("HGETALL", vec![crate::flag::FLAG_KEY.into()])
            .await
            .map_err(store_err)?;
        string_pairs(reply, "flag hash")
    }

    /// Writes fields of the runtime flag hash.
    pub async fn write_flag(&self, fields: &[(String, String)]) -> Result<(), StoreError> {
        let mut args: Vec<Value> = vec![crate::flag::FLAG_KEY.into()];
        for (k, v) in fields {
            args.push(k.as_str().into());
            args.push(v.as_str().into());
        }
        self.command("HSET", args).await.map_err(store_err)?;
        Ok(())
    }

    /// The targets ops registered (`queue:targets`), for `queue.targets = "registered"`.
    pub async fn registered_targets(&self) -> Result<Vec<String>, StoreError> {
        let reply = self
            .command("SMEMBERS", vec![REGISTERED_KEY.into()])
            .await
            .map_err(store_err)?;
        Ok(reply_array(reply, "registered")?
            .iter()
            .filter_map(|v| v.as_string())
            .collect())
    }

    /// Adds (`add`) or removes a registered target.
    pub async fn write_registered(&self, target: QueueTarget, add: bool) -> Result<(), StoreError> {
        let cmd = if add { "SADD" } else { "SREM" };
        self.command(cmd, vec![REGISTERED_KEY.into(), target.to_string().into()])
            .await
            .map_err(store_err)?;
        Ok(())
    }
}

/// A hash-shaped reply (`HGETALL`, `CONFIG GET`) as its string pairs: a map under RESP3, a flat
/// array under RESP2, nothing for a missing key. Pairs that are not strings are skipped.
fn string_pairs(reply: Value, what: &str) -> Result<Vec<(String, String)>, StoreError> {
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
