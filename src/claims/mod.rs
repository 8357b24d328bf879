//! The single-use claims a replica remembers (docs/security.md): the ones it took in Redis, and the
//! ones it took alone while Redis was down.
//!
//! - A claim is in flight while its purchase is (`claim.lua`: pending under a lease this
//!   replica renews, `in_flight`); the backend's answer spends it (2xx, 3xx) or gives it back
//!   (4xx, 5xx, no answer). A claim given back is forgotten here.
//! - A claim Redis recorded is remembered too (while there is room), and journalled without
//!   waiting once spent: a second use of the token on this replica is refused even while Redis
//!   is down or after it lost the claim, also after a restart from the same journal, and a
//!   replica that finds Redis came back empty writes every spent claim it remembers back
//!   (`requeue_all`). A spend Redis did not confirm is written back the same way.
//! - A claim taken while Redis is down (not merely slow: the gate answers 503 then) is kept here,
//!   synced to the replica's journal on disk before the request is forwarded (`journal.rs`,
//!   `fail_open.claims_file`), and written to Redis once it answers; a replica restarted from the
//!   same journal still refuses those tokens and still writes them back.
//!
//! So during an outage a token can reach the backend at most once per replica (the replica that
//! took it before the outage included), and never again after Redis answers. Nothing here talks
//! to Redis: the gate and the prober (`services/connection.rs`) do.

mod journal;

use parking_lot::Mutex;
use std::collections::HashMap;

pub use journal::Journal;

use crate::queue::QueueTarget;

/// How many claims a replica remembers at most (each is one admitted user's token).
pub const MAX_CLAIMS: usize = 200_000;

/// One claim still to be written to the store: the sale, the token id, and until when it holds
/// (epoch seconds).
pub type PendingClaim = (QueueTarget, String, u64);

#[derive(Debug, Default)]
pub struct Claims {
    inner: Mutex<Inner>,
    journal: Option<Journal>,
}

#[derive(Debug, Default)]
struct Inner {
    /// (target, token id) → the claim. The id (32 hex digits) is kept as the number it spells:
    /// looking a claim up on the gate's path allocates nothing.
    table: HashMap<(QueueTarget, u128), Entry, ahash::RandomState>,
    /// Spent claims not yet written to the store (and local claims, once spent).
    pending: Vec<PendingClaim>,
    /// How many purchases each token tried through this replica while the store was down:
    /// (target, id) → (attempts, until when remembered, epoch seconds).
    local_attempts: HashMap<(QueueTarget, u128), (u32, u64), ahash::RandomState>,
    /// The stored claims in flight here, and their purchase attempts' ids (their leases are
    /// renewed while they are).
    leases: HashMap<(QueueTarget, u128), String, ahash::RandomState>,
    /// When expired claims were last purged (a full table is scanned at most once a second).
    purged_at: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Until when the claim holds (epoch seconds).
    until: u64,
    /// Taken while the store was down, as opposed to recorded by the store.
    local: bool,
    /// Its purchase is in flight: not written back (nor journalled, if stored) until it is
    /// spent.
    in_flight: bool,
}

/// The outcome of a local claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalClaim {
    Taken,
    AlreadyUsed,
    /// Tried `token.max_attempts` times through this replica already.
    Exhausted,
    /// The table is full of unexpired local claims, or the journal could not be written: the
    /// purchase waits rather than go unrecorded.
    Refused,
}

/// The table's key of a token id (the gate's ids are 32 hex digits; anything else is no claim).
fn key(target: QueueTarget, id: &str) -> Option<(QueueTarget, u128)> {
    if id.len() != 32 {
        return None;
    }
    u128::from_str_radix(id, 16).ok().map(|n| (target, n))
}

/// The token id a table key stands for.
fn hex(n: u128) -> String {
    format!("{n:032x}")
}

impl Claims {
    /// Claims kept in memory only (no `fail_open.claims_file`).
    pub fn in_memory() -> Claims {
        Claims::default()
    }

    /// Claims journalled to `journal`, starting with the unexpired claims it holds (taken
    /// before a restart: the local ones still to be written to the store).
    pub fn with_journal(journal: Journal, now_s: u64) -> Claims {
        let loaded = journal.loaded(now_s);
        let claims = Claims {
            inner: Mutex::default(),
            journal: Some(journal),
        };
        {
            let mut c = claims.inner.lock();
            for (target, id, until, local) in loaded {
                let Some(k) = key(target, &id) else {
                    continue;
                };
                c.table.insert(
                    k,
                    Entry {
                        until,
                        local,
                        in_flight: false,
                    },
                );
                if local {
                    c.pending.push((target, id, until));
                }
            }
        }
        claims
    }

    /// How many claims are still to be written to the store.
    pub fn pending_len(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// Whether `id` was claimed through this replica and the claim still holds.
    pub fn used_here(&self, target: QueueTarget, id: &str, now_s: u64) -> bool {
        let Some(k) = key(target, id) else {
            return false;
        };
        let c = self.inner.lock();
        c.table.get(&k).is_some_and(|e| e.until > now_s)
    }

    /// Whether `id`'s claim through this replica is in flight (its purchase not answered yet).
    pub fn in_flight_here(&self, target: QueueTarget, id: &str) -> bool {
        let Some(k) = key(target, id) else {
            return false;
        };
        self.inner.lock().table.get(&k).is_some_and(|e| e.in_flight)
    }

    /// Remembers a claim the store recorded for the purchase attempt `owner`, in flight (best
    /// effort: skipped when the table is full).
    pub fn remember_stored(
        &self,
        target: QueueTarget,
        id: &str,
        owner: &str,
        until: u64,
        now_s: u64,
    ) {
        let Some(k) = key(target, id) else {
            return;
        };
        let mut c = self.inner.lock();
        if c.make_room(now_s) {
            c.table.insert(
                k,
                Entry {
                    until,
                    local: false,
                    in_flight: true,
                },
            );
            c.leases.insert(k, owner.to_string());
        }
    }

    /// The stored claims in flight here: (target, token id, purchase attempt's id).
    pub fn leases(&self) -> Vec<(QueueTarget, String, String)> {
        let c = self.inner.lock();
        c.leases
            .iter()
            .map(|((t, id), owner)| (*t, hex(*id), owner.clone()))
            .collect()
    }

    /// The purchase went through: the claim is spent. A stored one is journalled (without
    /// waiting), and written to the store again when `unconfirmed` (the store did not confirm
    /// the spend); a local one is written to the store once it answers.
    pub fn spent(&self, target: QueueTarget, id: &str, until: u64, unconfirmed: bool, now_s: u64) {
        let Some(k) = key(target, id) else {
            return;
        };
        let journal_line = {
            let mut inner = self.inner.lock();
            inner.leases.remove(&k);
            let known = inner.table.get_mut(&k).map(|e| {
                e.in_flight = false;
                *e
            });
            let entry = match known {
                Some(e) => Some(e),
                None if inner.make_room(now_s) => {
                    let entry = Entry {
                        until,
                        local: false,
                        in_flight: false,
                    };
                    inner.table.insert(k, entry);
                    Some(entry)
                }
                None => None,
            };
            if unconfirmed && entry.is_some_and(|e| !e.local) {
                inner.pending.push((target, id.to_string(), until));
            }
            entry.is_some_and(|e| !e.local)
        };
        if let (true, Some(journal)) = (journal_line, &self.journal) {
            journal.append(journal::Line::Stored(target, id, until));
        }
    }

    /// Takes a claim without the store: refused if this replica used the token already (or
    /// has it in flight), or tried it `max_attempts` times; else journalled (when there is a
    /// journal: synced before this returns) and kept until written back.
    pub async fn take_local(
        &self,
        target: QueueTarget,
        id: &str,
        until: u64,
        max_attempts: u32,
        now_s: u64,
    ) -> LocalClaim {
        let Some(k) = key(target, id) else {
            return LocalClaim::Refused;
        };
        {
            let mut inner = self.inner.lock();
            if inner.table.get(&k).is_some_and(|e| e.until > now_s) {
                return LocalClaim::AlreadyUsed;
            }
            let tried = inner
                .local_attempts
                .get(&k)
                .filter(|(_, u)| *u > now_s)
                .map_or(0, |(n, _)| *n);
            if tried >= max_attempts {
                return LocalClaim::Exhausted;
            }
            if !inner.make_room(now_s) {
                return LocalClaim::Refused;
            }
            inner.table.insert(
                k,
                Entry {
                    until,
                    local: true,
                    in_flight: true,
                },
            );
            inner.local_attempts.insert(k, (tried + 1, until));
            inner.pending.push((target, id.to_string(), until));
        }
        if let Some(journal) = &self.journal {
            if let Err(e) = journal
                .append_synced(journal::Line::Local(target, id, until))
                .await
            {
                tracing::error!(error = %e, "cannot write the claims journal; the purchase waits");
                self.forget(target, id);
                self.undo_attempt(target, id);
                return LocalClaim::Refused;
            }
        }
        LocalClaim::Taken
    }

    /// Gives a claim back (the backend did not take the purchase, or it never reached it); with
    /// `undo`, a local attempt does not count either.
    pub fn release(&self, target: QueueTarget, id: &str, undo: bool) {
        if undo {
            self.undo_attempt(target, id);
        }
        if let (true, Some(journal)) = (self.forget(target, id), &self.journal) {
            // If this line is lost, the token stays refused on this replica: never the reverse.
            journal.append(journal::Line::Release(target, id));
        }
    }

    fn undo_attempt(&self, target: QueueTarget, id: &str) {
        let Some(k) = key(target, id) else {
            return;
        };
        if let Some((n, _)) = self.inner.lock().local_attempts.get_mut(&k) {
            *n = n.saturating_sub(1);
        }
    }

    /// Drops a claim; whether there was one.
    fn forget(&self, target: QueueTarget, id: &str) -> bool {
        let Some(k) = key(target, id) else {
            return false;
        };
        let mut c = self.inner.lock();
        c.leases.remove(&k);
        let removed = c.table.remove(&k);
        if removed.is_some_and(|e| e.local) {
            c.pending.retain(|(t, i, _)| !(*t == target && i == id));
        }
        removed.is_some()
    }

    /// Takes the claims still to be written to the store (unexpired ones only; a local claim
    /// whose purchase is still in flight stays until it is spent or given back).
    pub fn take_pending(&self, now_s: u64) -> Vec<PendingClaim> {
        let mut c = self.inner.lock();
        let all = std::mem::take(&mut c.pending);
        let (flying, out): (Vec<PendingClaim>, Vec<PendingClaim>) = all
            .into_iter()
            .filter(|(_, _, until)| *until > now_s)
            .partition(|(t, id, _)| {
                key(*t, id)
                    .and_then(|k| c.table.get(&k))
                    .is_some_and(|e| e.in_flight)
            });
        c.pending = flying;
        out
    }

    /// Puts back claims that could not be written yet.
    pub fn restore_pending(&self, claims: Vec<PendingClaim>) {
        self.inner.lock().pending.extend(claims);
    }

    /// Rewrites the journal from what this replica remembers when it has grown well past that
    /// (the background prober calls this now and then).
    pub fn compact_journal(&self, now_s: u64) {
        let Some(journal) = &self.journal else {
            return;
        };
        let entries = {
            let c = self.inner.lock();
            if !journal.due_for_rewrite(c.table.len()) {
                return;
            }
            let pending: std::collections::HashSet<(QueueTarget, u128)> = c
                .pending
                .iter()
                .filter_map(|(t, id, _)| key(*t, id))
                .collect();
            c.table
                .iter()
                // A stored claim in flight is journalled once spent.
                .filter(|(_, e)| e.until > now_s && (e.local || !e.in_flight))
                .map(|(k, e)| (k.0, hex(k.1), e.until, pending.contains(k)))
                .collect::<Vec<_>>()
        };
        journal.rewrite(&entries);
    }

    /// The store lost its data (it came back empty): every claim this replica remembers is to
    /// be written to it again.
    pub fn requeue_all(&self, now_s: u64) {
        let mut c = self.inner.lock();
        let all: Vec<PendingClaim> = c
            .table
            .iter()
            .filter(|(_, e)| e.until > now_s && !e.in_flight)
            .map(|((t, id), e)| (*t, hex(*id), e.until))
            .collect();
        c.pending = all;
    }
}

impl Inner {
    /// Whether one more claim fits, purging expired ones (at most once a second) when full, and
    /// then the tenth of the remembered store claims that expire first: the store holds them,
    /// and the soonest to expire are the least likely to be used again.
    fn make_room(&mut self, now_s: u64) -> bool {
        if self.table.len() < MAX_CLAIMS {
            return true;
        }
        if self.purged_at < now_s {
            self.purged_at = now_s;
            self.table.retain(|_, e| e.until > now_s);
            self.pending.retain(|(_, _, until)| *until > now_s);
            self.local_attempts.retain(|_, (_, until)| *until > now_s);
            if self.table.len() >= MAX_CLAIMS {
                let mut stored: Vec<u64> = self
                    .table
                    .values()
                    .filter(|e| !e.local && !e.in_flight)
                    .map(|e| e.until)
                    .collect();
                if !stored.is_empty() {
                    let k = (MAX_CLAIMS / 10).min(stored.len() - 1);
                    let (_, cut, _) = stored.select_nth_unstable(k);
                    let cut = *cut;
                    self.table
                        .retain(|_, e| e.local || e.in_flight || e.until > cut);
                }
            }
        }
        self.table.len() < MAX_CLAIMS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    const A: &str = "0123456789abcdef0123456789abcdef";

    fn t(id: u64) -> QueueTarget {
        QueueTarget::new(TargetType::LimitedDrop, id)
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn local_claims_are_single_use_and_written_back_once_spent() {
        block_on(async {
            let c = Claims::in_memory();
            assert_eq!(c.take_local(t(1), A, 100, 10, 10).await, LocalClaim::Taken);
            assert_eq!(
                c.take_local(t(1), A, 100, 10, 11).await,
                LocalClaim::AlreadyUsed,
                "in flight"
            );
            assert!(
                c.take_pending(11).is_empty(),
                "not written back while in flight"
            );
            assert_eq!(c.pending_len(), 1);
            c.spent(t(1), A, 100, false, 11);
            assert_eq!(c.take_local(t(2), A, 100, 10, 11).await, LocalClaim::Taken);
            c.release(t(2), A, false);
            assert!(!c.used_here(t(2), A, 12));
            assert_eq!(c.pending_len(), 1);
            let p = c.take_pending(12);
            assert_eq!(p, vec![(t(1), A.to_string(), 100)]);
            assert_eq!(c.pending_len(), 0);
            c.restore_pending(p);
            assert_eq!(c.pending_len(), 1);
            assert!(c.take_pending(200).is_empty(), "expired claims are dropped");
            assert_eq!(
                c.take_local(t(1), A, 300, 10, 150).await,
                LocalClaim::Taken,
                "an expired claim no longer counts"
            );
        });
    }

    #[test]
    fn local_attempts_are_bounded_and_an_undone_one_does_not_count() {
        block_on(async {
            let c = Claims::in_memory();
            for _ in 0..3 {
                assert_eq!(c.take_local(t(1), A, 100, 3, 10).await, LocalClaim::Taken);
                c.release(t(1), A, false);
            }
            assert_eq!(
                c.take_local(t(1), A, 100, 3, 10).await,
                LocalClaim::Exhausted
            );
            let c = Claims::in_memory();
            for _ in 0..5 {
                assert_eq!(c.take_local(t(1), A, 100, 3, 10).await, LocalClaim::Taken);
                c.release(t(1), A, true);
            }
        });
    }

    #[test]
    fn stored_claims_are_remembered_and_written_back_after_a_loss() {
        block_on(async {
            let c = Claims::in_memory();
            c.remember_stored(t(1), A, "attempt", 100, 10);
            assert!(c.used_here(t(1), A, 50), "in flight here");
            assert_eq!(
                c.leases(),
                vec![(t(1), A.to_string(), "attempt".to_string())]
            );
            c.requeue_all(50);
            assert!(
                c.take_pending(50).is_empty(),
                "nothing to write back while in flight"
            );
            c.spent(t(1), A, 100, false, 50);
            assert!(c.leases().is_empty());
            assert_eq!(
                c.take_local(t(1), A, 100, 10, 50).await,
                LocalClaim::AlreadyUsed,
                "spent here before the outage"
            );
            c.requeue_all(50);
            assert_eq!(c.take_pending(50), vec![(t(1), A.to_string(), 100)]);
            c.release(t(1), A, false);
            assert!(!c.used_here(t(1), A, 50), "given back");
        });
    }

    #[test]
    fn a_spend_the_store_did_not_confirm_is_written_back() {
        let c = Claims::in_memory();
        c.remember_stored(t(1), A, "attempt", 100, 10);
        c.spent(t(1), A, 100, true, 11);
        assert_eq!(c.take_pending(12), vec![(t(1), A.to_string(), 100)]);
    }
}
