//! The entry tokens this replica answered for admissions through the queue (sale, user → the
//! token's expiry), as long as they live (docs/state.md). When the store finds a user due again
//! after it lost the issue (its token key deleted, or Redis came back from a failover behind),
//! the same token is stored and answered, never a second one; after a rollback every one is
//! written back. Tokens are deterministic in (sale, user, expiry), so the expiry is all that is
//! kept. No I/O.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::queue::QueueTarget;

/// How many tokens are remembered: well above the admissions of every sale within a token's
/// lifetime; past it, the expired ones go, then new ones are not remembered.
const MAX_ISSUED: usize = 200_000;

#[derive(Debug, Default)]
pub struct Issued {
    tokens: Mutex<HashMap<(QueueTarget, u64), u64>>,
}

impl Issued {
    /// `user` of `target` was answered a token expiring at `expires_at` (epoch s).
    pub fn record(&self, target: QueueTarget, user: u64, expires_at: u64, now_s: u64) {
        let mut tokens = self.tokens.lock();
        if tokens.len() >= MAX_ISSUED && !tokens.contains_key(&(target, user)) {
            tokens.retain(|_, at| *at > now_s);
            if tokens.len() >= MAX_ISSUED {
                return;
            }
        }
        tokens.insert((target, user), expires_at);
    }

    /// The expiry of the live token `user` of `target` was answered, if any.
    pub fn get(&self, target: QueueTarget, user: u64, now_s: u64) -> Option<u64> {
        self.tokens
            .lock()
            .get(&(target, user))
            .copied()
            .filter(|at| *at > now_s)
    }

    /// The user left the queue: its token is not answered again from here.
    pub fn forget(&self, target: QueueTarget, user: u64) {
        self.tokens.lock().remove(&(target, user));
    }

    /// Every live token remembered: (sale, user, expiry).
    pub fn live(&self, now_s: u64) -> Vec<(QueueTarget, u64, u64)> {
        self.tokens
            .lock()
            .iter()
            .filter(|(_, at)| **at > now_s)
            .map(|((t, u), at)| (*t, *u, *at))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    #[test]
    fn remembers_live_tokens_only() {
        let t = QueueTarget::new(TargetType::LimitedDrop, 1);
        let issued = Issued::default();
        issued.record(t, 7, 100, 10);
        issued.record(t, 8, 20, 10);
        assert_eq!(issued.get(t, 7, 50), Some(100));
        assert_eq!(issued.get(t, 8, 50), None, "expired");
        assert_eq!(issued.live(50), vec![(t, 7, 100)]);
    }
}
