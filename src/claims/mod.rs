//! The single-use claims a replica remembers (SPEC §6): the ones it took in Redis, and the ones
//! it took alone while Redis was down.
//!
//! - A claim Redis recorded is remembered too (while there is room), and journalled without
//!   waiting: a second use of the token on this replica is refused even while Redis is down or
//!   after it lost the claim, also after a restart from the same journal, and a replica that
//!   finds Redis came back empty writes every claim it remembers back (`requeue_all`).
//! - A claim taken while Redis is down (not merely slow: the gate answers 503 then) is kept here,
//!   synced to the replica's journal on disk before the request is forwarded (`journal.rs`,
//!   `fail_open.claims_file`), and written to Redis once it answers; a replica restarted from the
//!   same journal still refuses those tokens and still writes them back.
//!
//! So during an outage a token can reach the backend at most once per replica (the replica that
//! took it before the outage included), and never again after Redis answers. Nothing here talks
//! to Redis: the gate and the prober (`background.rs`) do.

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
    /// Claims not yet written to the store.
    pending: Vec<PendingClaim>,
    /// When expired claims were last purged (a full table is scanned at most once a second).
    purged_at: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Until when the claim holds (epoch seconds).
    until: u64,
    /// Taken while the store was down, as opposed to recorded by the store.
    local: bool,
}

/// The outcome of a local claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalClaim {
    Taken,
    AlreadyUsed,
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
                c.table.insert(k, Entry { until, local });
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

    /// Remembers a claim the store recorded (best effort: skipped when the table is full).
    pub fn remember_stored(&self, target: QueueTarget, id: &str, until: u64, now_s: u64) {
        let Some(k) = key(target, id) else {
            return;
        };
        let inserted = {
            let mut c = self.inner.lock();
            c.make_room(now_s)
                && c.table
                    .insert(
                        k,
                        Entry {
                            until,
                            local: false,
                        },
                    )
                    .is_none()
        };
        if let (true, Some(journal)) = (inserted, &self.journal) {
            journal.append(journal::Line::Stored(target, id, until));
        }
    }

    /// Takes a claim without the store: refused if this replica used the token already; else
    /// journalled (when there is a journal: synced before this returns) and kept until written
    /// back.
    pub async fn take_local(
        &self,
        target: QueueTarget,
        id: &str,
        until: u64,
        now_s: u64,
    ) -> LocalClaim {
        let Some(k) = key(target, id) else {
            return LocalClaim::Refused;
        };
        {
            let mut c = self.inner.lock();
            if c.table.get(&k).is_some_and(|e| e.until > now_s) {
                return LocalClaim::AlreadyUsed;
            }
            if !c.make_room(now_s) {
                return LocalClaim::Refused;
            }
            c.table.insert(k, Entry { until, local: true });
            c.pending.push((target, id.to_string(), until));
        }
        if let Some(journal) = &self.journal {
            if let Err(e) = journal
                .append_synced(journal::Line::Local(target, id, until))
                .await
            {
                tracing::error!(error = %e, "cannot write the claims journal; the purchase waits");
                self.forget(target, id);
                return LocalClaim::Refused;
            }
        }
        LocalClaim::Taken
    }

    /// Gives a claim back (the backend did not process the request).
    pub fn release(&self, target: QueueTarget, id: &str) {
        if let (true, Some(journal)) = (self.forget(target, id), &self.journal) {
            // If this line is lost, the token stays refused on this replica: never the reverse.
            journal.append(journal::Line::Release(target, id));
        }
    }

    /// Drops a claim; whether there was one.
    fn forget(&self, target: QueueTarget, id: &str) -> bool {
        let Some(k) = key(target, id) else {
            return false;
        };
        let mut c = self.inner.lock();
        let removed = c.table.remove(&k);
        if removed.is_some_and(|e| e.local) {
            c.pending.retain(|(t, i, _)| !(*t == target && i == id));
        }
        removed.is_some()
    }

    /// Takes the claims still to be written to the store (unexpired ones only).
    pub fn take_pending(&self, now_s: u64) -> Vec<PendingClaim> {
        let mut c = self.inner.lock();
        let mut out = std::mem::take(&mut c.pending);
        out.retain(|(_, _, until)| *until > now_s);
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
                .filter(|(_, e)| e.until > now_s)
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
            .filter(|(_, e)| e.until > now_s)
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
            if self.table.len() >= MAX_CLAIMS {
                let mut stored: Vec<u64> = self
                    .table
                    .values()
                    .filter(|e| !e.local)
                    .map(|e| e.until)
                    .collect();
                if !stored.is_empty() {
                    let k = (MAX_CLAIMS / 10).min(stored.len() - 1);
                    let (_, cut, _) = stored.select_nth_unstable(k);
                    let cut = *cut;
                    self.table.retain(|_, e| e.local || e.until > cut);
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
    fn local_claims_are_single_use_and_pending_until_written() {
        block_on(async {
            let c = Claims::in_memory();
            assert_eq!(c.take_local(t(1), A, 100, 10).await, LocalClaim::Taken);
            assert_eq!(
                c.take_local(t(1), A, 100, 11).await,
                LocalClaim::AlreadyUsed
            );
            assert_eq!(c.take_local(t(2), A, 100, 11).await, LocalClaim::Taken);
            c.release(t(2), A);
            assert!(!c.used_here(t(2), A, 12));
            assert_eq!(c.pending_len(), 1);
            let p = c.take_pending(12);
            assert_eq!(p, vec![(t(1), A.to_string(), 100)]);
            assert_eq!(c.pending_len(), 0);
            c.restore_pending(p);
            assert_eq!(c.pending_len(), 1);
            assert!(c.take_pending(200).is_empty(), "expired claims are dropped");
            assert_eq!(
                c.take_local(t(1), A, 300, 150).await,
                LocalClaim::Taken,
                "an expired claim no longer counts"
            );
        });
    }

    #[test]
    fn stored_claims_are_remembered_and_written_back_after_a_loss() {
        block_on(async {
            let c = Claims::in_memory();
            c.remember_stored(t(1), A, 100, 10);
            assert!(c.used_here(t(1), A, 50));
            assert_eq!(
                c.take_local(t(1), A, 100, 50).await,
                LocalClaim::AlreadyUsed,
                "spent here before the outage"
            );
            assert_eq!(c.pending_len(), 0);
            c.requeue_all(50);
            assert_eq!(c.take_pending(50), vec![(t(1), A.to_string(), 100)]);
            c.release(t(1), A);
            assert!(!c.used_here(t(1), A, 50), "given back");
        });
    }
}
