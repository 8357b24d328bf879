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

/// Targets registered by ops (`queue.targets = "registered"`; `vq-gateway target add`): a Redis
/// set, kept here beside the other names of this module's decision so that the pure modules need
/// nothing of the store.
pub const REGISTERED_KEY: &str = "queue:targets";

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
pub struct AllowedSales {
    mode: TargetsMode,
    gated: UnregisteredGated,
    configured: HashSet<QueueTarget>,
    dynamic: RwLock<HashSet<QueueTarget>>,
    loaded: std::sync::atomic::AtomicBool,
}

impl AllowedSales {
    pub fn new(
        mode: TargetsMode,
        gated: UnregisteredGated,
        configured: impl IntoIterator<Item = QueueTarget>,
    ) -> AllowedSales {
        AllowedSales {
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

    /// Registers `target` at once on this replica (an admin API change; the others follow at
    /// their next read of `queue:targets`).
    pub fn insert(&self, target: QueueTarget) {
        let mut set = self.dynamic.write();
        if set.len() < MAX_REGISTERED {
            set.insert(target);
        }
    }

    /// Unregisters `target` at once on this replica.
    pub fn remove(&self, target: QueueTarget) {
        self.dynamic.write().remove(&target);
    }

    /// The registered sales: the file's and the run-time ones.
    pub fn members(&self) -> Vec<QueueTarget> {
        let mut all: Vec<QueueTarget> = self.configured.iter().copied().collect();
        all.extend(self.dynamic.read().iter().copied());
        all.sort();
        all.dedup();
        all
    }

    /// Replaces the run-time set with the members of `queue:targets`; returns the members that
    /// are not canonical `TYPE:ID`. Such a member is reported (logged, counted, flagged by
    /// `target list`) and, when it still names a sale read leniently (`LIMITED_DROP:083`,
    /// `limited_drop:83`, blanks around it), registers that sale: the operator meant it, and with
    /// `unregistered_gated = "pass"` ignoring it would leave that sale's purchases ungated.
    pub fn set_dynamic(&self, members: &[String]) -> Vec<String> {
        let mut bad = Vec::new();
        let mut set = HashSet::new();
        for m in members {
            let target = match QueueTarget::parse_key(m) {
                Some(t) => Some(t),
                None => {
                    bad.push(m.clone());
                    lenient_key(m)
                }
            };
            if let Some(t) = target {
                if set.len() < MAX_REGISTERED {
                    set.insert(t);
                }
            }
        }
        *self.dynamic.write() = set;
        self.mark_loaded();
        bad
    }
}

/// A `TYPE:ID` member read the way a person who wrote it by hand meant it: blanks around it and
/// its parts ignored, the type in any case (`-` for `_`), leading zeros of the id folded.
pub fn lenient_key(s: &str) -> Option<QueueTarget> {
    let (kind, id) = s.trim().split_once(':')?;
    let kind = kind.trim().to_ascii_uppercase().replace('-', "_");
    let id = id.trim().trim_start_matches('0');
    Some(QueueTarget::new(
        crate::queue::TargetType::from_enum_name(&kind)?,
        crate::queue::parse_positive_id(id)?,
    ))
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
        let r = AllowedSales::new(TargetsMode::Any, UnregisteredGated::Pass, []);
        assert!(r.allows(t(1)) && r.allows(t(u64::MAX)));
    }

    #[test]
    fn registered_allows_configured_and_dynamic_targets() {
        let r = AllowedSales::new(TargetsMode::Registered, UnregisteredGated::Refuse, [t(1)]);
        assert!(r.allows(t(1)));
        assert!(!r.allows(t(2)));
        assert_eq!(r.standing(t(2)), Standing::Unknown, "never read");
        let bad = r.set_dynamic(&["LIMITED_DROP:2".into(), "nonsense".into()]);
        assert_eq!(bad, vec!["nonsense".to_string()]);
        assert!(r.allows(t(2)));
        assert_eq!(r.standing(t(3)), Standing::Unregistered);
        let bad = r.set_dynamic(&[
            "LIMITED_DROP:083".into(),
            "limited_drop:84".into(),
            " LIMITED_DROP:85 ".into(),
            "limited-drop:0086".into(),
            "LIMITED_DROP:x".into(),
        ]);
        assert_eq!(bad.len(), 5, "every one is reported");
        for id in 83..=86 {
            assert!(
                r.allows(t(id)),
                "{id}: a near miss still registers its sale"
            );
        }
        r.set_dynamic(&[]);
        assert!(!r.allows(t(2)), "removed at run time");
        assert!(r.allows(t(1)), "configured targets stay");
    }
}
