//! Which targets may have a queue (`queue.targets`). Clients choose target ids, so with `any`
//! (the default) every id can open a queue, bounded by `queue.max_active_targets`; with
//! `registered` only the sales ops registered do: listed in `queue.registered` or added at run
//! time to the Redis set `queue:targets` (`vq-gateway target add`), which every instance re-reads
//! every second. A request for any other target gets 404 `UNKNOWN_TARGET`; its gated route is let
//! through unchecked (`unregistered_gated = "pass"`, the queue is not on for it) or refused
//! (`"refuse"`).
//!
//! No I/O: the Redis service hands in what it read.

use parking_lot::RwLock;
use std::collections::HashSet;

use crate::queue::QueueTarget;

/// Targets read from Redis at most (a bigger set is truncated and logged).
pub const MAX_REGISTERED: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetsMode {
    Any,
    Registered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnregisteredGated {
    /// The queue is not on for an unregistered sale: its purchases pass without a token.
    Pass,
    /// Purchases of unregistered sales are refused (404 UNKNOWN_TARGET).
    Refuse,
}

/// Where a target stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Allowed,
    Unregistered,
    /// `registered` mode, and `queue:targets` was never read yet (Redis not reached since the
    /// start): nobody can tell, so nothing is let through ungated meanwhile.
    Unknown,
}

#[derive(Debug)]
pub struct Registry {
    mode: TargetsMode,
    gated: UnregisteredGated,
    configured: HashSet<QueueTarget>,
    dynamic: RwLock<HashSet<QueueTarget>>,
    loaded: std::sync::atomic::AtomicBool,
}

impl Registry {
    pub fn new(
        mode: TargetsMode,
        gated: UnregisteredGated,
        configured: impl IntoIterator<Item = QueueTarget>,
    ) -> Registry {
        Registry {
            mode,
            gated,
            configured: configured.into_iter().collect(),
            dynamic: RwLock::new(HashSet::new()),
            loaded: std::sync::atomic::AtomicBool::new(mode == TargetsMode::Any),
        }
    }

    /// There is no run-time set to read (the memory store): the file's list is all there is.
    pub fn mark_loaded(&self) {
        self.loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn standing(&self, target: QueueTarget) -> Standing {
        if self.allows(target) {
            Standing::Allowed
        } else if self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            Standing::Unregistered
        } else {
            Standing::Unknown
        }
    }

    pub fn mode(&self) -> TargetsMode {
        self.mode
    }

    pub fn unregistered_gated(&self) -> UnregisteredGated {
        self.gated
    }

    /// Whether `target` may have a queue.
    pub fn allows(&self, target: QueueTarget) -> bool {
        match self.mode {
            TargetsMode::Any => true,
            TargetsMode::Registered => {
                self.configured.contains(&target) || self.dynamic.read().contains(&target)
            }
        }
    }

    /// Replaces the run-time set with the members of `queue:targets`; returns the members that
    /// are not `TYPE:ID` (ignored).
    pub fn set_dynamic(&self, members: &[String]) -> Vec<String> {
        let mut bad = Vec::new();
        let mut set = HashSet::new();
        for m in members {
            match QueueTarget::parse_key(m) {
                Some(t) if set.len() < MAX_REGISTERED => {
                    set.insert(t);
                }
                Some(_) => {}
                None => bad.push(m.clone()),
            }
        }
        *self.dynamic.write() = set;
        self.mark_loaded();
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    fn t(id: u64) -> QueueTarget {
        QueueTarget::new(TargetType::LimitedDrop, id)
    }

    #[test]
    fn any_allows_everything() {
        let r = Registry::new(TargetsMode::Any, UnregisteredGated::Pass, []);
        assert!(r.allows(t(1)) && r.allows(t(u64::MAX)));
    }

    #[test]
    fn registered_allows_configured_and_dynamic_targets() {
        let r = Registry::new(TargetsMode::Registered, UnregisteredGated::Refuse, [t(1)]);
        assert!(r.allows(t(1)));
        assert!(!r.allows(t(2)));
        assert_eq!(r.standing(t(2)), Standing::Unknown, "never read");
        let bad = r.set_dynamic(&["LIMITED_DROP:2".into(), "nonsense".into()]);
        assert_eq!(bad, vec!["nonsense".to_string()]);
        assert!(r.allows(t(2)));
        assert_eq!(r.standing(t(3)), Standing::Unregistered);
        r.set_dynamic(&[]);
        assert!(!r.allows(t(2)), "removed at run time");
        assert!(r.allows(t(1)), "configured targets stay");
    }
}
