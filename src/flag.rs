//! The `virtual-queue.enabled` flag (docs/operations.md#the-flag): whether a given user of a given
//! target goes through the queue. Evaluation is a pure function of (flag state, target, user) with
//! a stable bucket, so enter, poll and the gate decide alike on every instance.
//!
//! This module does no I/O; the state is set from the TOML defaults and replaced by whoever reads
//! the runtime overrides.

use parking_lot::RwLock;
use std::collections::HashMap;

use crate::queue::QueueTarget;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagState {
    pub enabled: bool,
    /// 0..=100: users whose bucket is below this are queued.
    pub rollout_percent: u8,
    /// Per-target overrides of `enabled` (`LIMITED_DROP:42 = on|off`).
    pub per_target: HashMap<QueueTarget, bool>,
    /// When the queue last took in users it had let through (epoch seconds; `flag set` writes it
    /// with every change that can turn the queue on for someone). A token issued before then (or
    /// while the change spread) may have been handed out without queueing, so the gate lets it
    /// through only if it is the token the queue itself holds for that user.
    pub queued_since: Option<u64>,
}

impl FlagState {
    pub fn new(enabled: bool, rollout_percent: u8) -> FlagState {
        FlagState {
            enabled,
            rollout_percent: rollout_percent.min(100),
            per_target: HashMap::new(),
            queued_since: None,
        }
    }

    /// Whether `user` waits in the queue of `target`.
    pub fn queue_on(&self, target: QueueTarget, user: u64) -> bool {
        let enabled = self
            .per_target
            .get(&target)
            .copied()
            .unwrap_or(self.enabled);
        // Every bucket is below 100 and none below 0: the hash is needed only in between.
        enabled
            && match self.rollout_percent {
                0 => false,
                100.. => true,
                p => bucket(user) < p,
            }
    }
}

/// The Redis hash that overrides the TOML defaults at run time (docs/operations.md#the-flag).
pub const FLAG_KEY: &str = "queue:flag";

/// The field of [`FLAG_KEY`] that holds [`FlagState::queued_since`].
pub const QUEUED_SINCE: &str = "queued_since";

/// An operator's change of the flag (`vq-gateway flag set`, the console's `PUT /flag`): the
/// global switch and rollout, or one sale's override.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlagChange {
    pub enabled: Option<bool>,
    pub rollout: Option<u8>,
    /// One sale's override instead of the global switch (needs `enabled`; the rollout is global).
    pub target: Option<QueueTarget>,
}

impl FlagChange {
    /// The fields written into [`FLAG_KEY`]. Any change that can turn the queue on for someone
    /// (a sale or everyone switched on, the rollout moved) also says when (`now_s`): a token
    /// handed out before then without queueing no longer passes the gate on its own
    /// ([`FlagState::queued_since`]). Errors name the field at fault.
    pub fn fields(&self, now_s: u64) -> Result<Vec<(String, String)>, String> {
        let on_off = |on: bool| if on { "on" } else { "off" }.to_string();
        let mut fields = Vec::new();
        match self.target {
            Some(target) => {
                if self.rollout.is_some() {
                    return Err("rollout is global: set it without a target".into());
                }
                let on = self
                    .enabled
                    .ok_or("a target's override needs enabled (on or off)")?;
                fields.push((target.to_string(), on_off(on)));
            }
            None => {
                if let Some(on) = self.enabled {
                    fields.push(("enabled".to_string(), on_off(on)));
                }
                if let Some(p) = self.rollout {
                    if p > 100 {
                        return Err(format!("rollout {p} is outside 0..=100"));
                    }
                    fields.push(("rollout_percent".to_string(), p.to_string()));
                }
                if fields.is_empty() {
                    return Err("nothing to set: give enabled and/or rollout".into());
                }
            }
        }
        if self.enabled == Some(true) || self.rollout.is_some() {
            fields.push((QUEUED_SINCE.to_string(), now_s.to_string()));
        }
        Ok(fields)
    }

    /// A JSON object of `enabled` (true or false), `rolloutPercent` (0 to 100) and `target`
    /// (`LIMITED_DROP:42`), strictly: unknown keys and other types are refused.
    pub fn from_json(body: &[u8]) -> Result<FlagChange, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Raw {
            enabled: Option<bool>,
            rollout_percent: Option<u8>,
            target: Option<String>,
        }
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err("the body must be a JSON object".into());
        }
        // Unknown and repeated keys and wrong types are refused here.
        let raw: Raw = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        // A key given as null is refused too, not read as absent (which would quietly drop it).
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(body).map_err(|e| e.to_string())?;
        if let Some((key, _)) = object.iter().find(|(_, v)| v.is_null()) {
            return Err(format!("`{key}` must not be null"));
        }
        let target = match raw.target {
            None => None,
            Some(t) => Some(
                QueueTarget::parse_key(&t)
                    .ok_or_else(|| format!("target `{t}` is not TYPE:ID (e.g. LIMITED_DROP:42)"))?,
            ),
        };
        Ok(FlagChange {
            enabled: raw.enabled,
            rollout: raw.rollout_percent,
            target,
        })
    }
}

/// Parses `on` / `off`, the only spellings the flag hash uses.
pub fn parse_on_off(v: &str) -> Option<bool> {
    match v {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

impl FlagState {
    /// The state the fields of `queue:flag` describe, on top of the TOML `defaults`. A field with
    /// a bad value keeps the default and is reported, never guessed at.
    pub fn with_overrides(
        defaults: &FlagState,
        fields: &[(String, String)],
    ) -> (FlagState, Vec<String>) {
        let mut state = defaults.clone();
        let mut problems = Vec::new();
        for (name, value) in fields {
            match name.as_str() {
                "enabled" => match parse_on_off(value) {
                    Some(on) => state.enabled = on,
                    None => problems.push(format!(
                        "{FLAG_KEY} enabled = `{value}`: expected on or off"
                    )),
                },
                "rollout_percent" => match value.parse::<u8>() {
                    Ok(p) if p <= 100 => state.rollout_percent = p,
                    _ => problems.push(format!(
                        "{FLAG_KEY} rollout_percent = `{value}`: expected 0..=100"
                    )),
                },
                QUEUED_SINCE => match value.parse::<u64>() {
                    Ok(t) => state.queued_since = Some(t),
                    Err(_) => problems.push(format!(
                        "{FLAG_KEY} {QUEUED_SINCE} = `{value}`: expected epoch seconds"
                    )),
                },
                other => match (QueueTarget::parse_key(other), parse_on_off(value)) {
                    (Some(target), Some(on)) => {
                        state.per_target.insert(target, on);
                    }
                    (Some(_), None) => problems.push(format!(
                        "{FLAG_KEY} {other} = `{value}`: expected on or off"
                    )),
                    (None, _) => {
                        problems.push(format!("{FLAG_KEY} has an unknown field `{other}`"))
                    }
                },
            }
        }
        (state, problems)
    }
}

/// The user's stable rollout bucket, 0..100: the first 8 bytes of SHA-256 of the decimal user id,
/// big-endian, mod 100. Written out so any other service can compute the same bucket.
pub fn bucket(user: u64) -> u8 {
    let mut decimal = [0u8; 20];
    let digest = ring::digest::digest(&ring::digest::SHA256, write_decimal(user, &mut decimal));
    let first = digest
        .as_ref()
        .first_chunk::<8>()
        .copied()
        .unwrap_or_default();
    (u64::from_be_bytes(first) % 100) as u8
}

/// `n` in decimal, written into the end of `buf` (20 bytes hold every u64) without allocating.
fn write_decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[start..];
        }
    }
}

/// The live flag, shared by every request and replaced as a whole. With the Redis store it starts
/// *unknown*: until this replica has read `queue:flag` (or created it, `settings.rs`), nobody can
/// tell whether the queue is on, and the safe side is that it is: everyone queues, and the gate
/// asks for a token (a purchase without one is told to come back, not refused for good).
#[derive(Debug)]
pub struct Flag {
    state: RwLock<Option<FlagState>>,
}

/// What the gate needs of the flag for one user of one sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateView {
    /// The queue is off for this user: no token is looked at.
    Off,
    /// The queue is on: a token is needed; [`FlagState::queued_since`].
    On { queued_since: Option<u64> },
    /// Not known yet (never read): a token passes as with `On`, a purchase without one waits.
    Unknown,
}

impl Flag {
    /// A flag known from the start (the memory store: the TOML values are all there is).
    pub fn new(initial: FlagState) -> Flag {
        Flag {
            state: RwLock::new(Some(initial)),
        }
    }

    /// A flag not known until the first [`Flag::set`].
    pub fn unknown() -> Flag {
        Flag {
            state: RwLock::new(None),
        }
    }

    pub fn queue_on(&self, target: QueueTarget, user: u64) -> bool {
        self.state
            .read()
            .as_ref()
            .is_none_or(|s| s.queue_on(target, user))
    }

    /// For the gate, in one read of the live state.
    pub fn gate_view(&self, target: QueueTarget, user: u64) -> GateView {
        match &*self.state.read() {
            None => GateView::Unknown,
            Some(s) if s.queue_on(target, user) => GateView::On {
                queued_since: s.queued_since,
            },
            Some(_) => GateView::Off,
        }
    }

    /// The state, if known.
    pub fn snapshot(&self) -> Option<FlagState> {
        self.state.read().clone()
    }

    pub fn set(&self, next: FlagState) {
        *self.state.write() = Some(next);
    }
}

#[cfg(test)]
mod tests;
