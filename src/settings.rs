//! Run-time settings kept in Redis (the flag `queue:flag`, the registered sales `queue:targets`)
//! as versioned documents, and what a replica does with each reading of one: adopt it, wait, or
//! write back what it knows because Redis lost it.
//!
//! A Redis that restarts without persistence, a failover to a replica that missed the last
//! writes, or a `FLUSHALL` leaves these keys missing or older than before. A missing key is not
//! an operator's decision: read as "no overrides" it switched the queue off (the TOML default) in
//! the middle of a sale. So every document carries a version in a meta hash beside it in the same
//! cluster slot (`{queue:flag}:meta`), bumped by every write of the CLI, and every replica
//! remembers the last document it read:
//!
//! - a reading with a version at least the remembered one is adopted (an operator's change);
//! - a reading without a version, or with an older one, after the replica had read one is data
//!   loss: the replica keeps what it knew, counts the loss and writes its document back; the
//!   write-back applies only over an older version, so among replicas the newest known wins;
//! - a replica that never read the document and finds none waits `BOOTSTRAP_AFTER` for replicas
//!   that may remember it to write it back, then creates it from its TOML values (a new
//!   deployment); until then the state is unknown and the callers take the safe side.
//!
//! No I/O: the refresher (`services/settings.rs`) reads and writes, this module decides.

use std::time::Duration;

use async_trait::async_trait;

/// How long a replica that never saw a document waits for others to write it back before it
/// creates it from its TOML values: two refreshes of the others and a command timeout to spare.
pub const BOOTSTRAP_AFTER: Duration = Duration::from_secs(3);

/// Which document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DocKind {
    /// `queue:flag`, a hash of fields (docs/operations.md#the-flag).
    Flag,
    /// `queue:targets`, a set of `TYPE:ID` members.
    Targets,
}

impl DocKind {
    /// The metric label and the log's name.
    pub fn as_str(self) -> &'static str {
        match self {
            DocKind::Flag => "flag",
            DocKind::Targets => "targets",
        }
    }

    /// The key holding the document (docs/redis.md#keys).
    pub fn key(self) -> &'static str {
        match self {
            DocKind::Flag => crate::flag::FLAG_KEY,
            DocKind::Targets => crate::allowed::REGISTERED_KEY,
        }
    }

    /// The key of its meta hash (`version`): hash-tagged with the document's own name, so both
    /// live in one cluster slot and a script sees them together.
    pub fn meta_key(self) -> String {
        format!("{{{}}}:meta", self.key())
    }

    /// Whether the document is a hash (field, value pairs) or a set (members).
    pub fn is_hash(self) -> bool {
        self == DocKind::Flag
    }
}

/// One document's content and version. A set's members are `(member, "")`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Doc {
    pub items: Vec<(String, String)>,
    pub version: u64,
}

/// What one read of a document found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub items: Vec<(String, String)>,
    /// The meta hash's version; `None` when the meta hash is missing.
    pub version: Option<u64>,
}

/// What the refresher does after a reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Use this document from now on.
    Adopt(Doc),
    /// Redis lost the document (missing, or older than the one this replica read): keep using
    /// the known one and write it back. `new_loss` is true the first time this loss is seen.
    Restore { known: Doc, new_loss: bool },
    /// Nobody wrote the document yet (or it was lost before this replica ever read it, and
    /// nobody wrote it back): create it from the TOML values.
    Bootstrap,
    /// A document without a version (written by hand, or by a version of the gateway that kept
    /// none): use it, and give it a version so that losing it later is noticed.
    Stamp(Doc),
    /// The state stays unknown for now.
    Wait,
}

/// A replica's memory of one document.
#[derive(Debug, Default)]
pub struct Tracker {
    known: Option<Doc>,
    /// When this replica first read the document's key and found nothing (epoch ms).
    missing_since_ms: Option<u64>,
    /// A loss was seen and not yet repaired.
    restoring: bool,
}

impl Tracker {
    /// The document this replica knows, if any.
    pub fn known(&self) -> Option<&Doc> {
        self.known.as_ref()
    }

    /// Decides what a reading at `now_ms` means.
    pub fn observe(&mut self, reading: Reading, now_ms: u64) -> Step {
        match (reading.version, &self.known) {
            (Some(v), Some(known)) if v < known.version => self.lost(),
            (Some(version), _) => {
                let doc = Doc {
                    items: reading.items,
                    version,
                };
                self.known = Some(doc.clone());
                self.restoring = false;
                self.missing_since_ms = None;
                Step::Adopt(doc)
            }
            (None, Some(_)) => self.lost(),
            (None, None) if !reading.items.is_empty() => {
                let doc = Doc {
                    items: reading.items,
                    version: 0,
                };
                self.known = Some(doc.clone());
                Step::Stamp(doc)
            }
            (None, None) => {
                let since = *self.missing_since_ms.get_or_insert(now_ms);
                if now_ms.saturating_sub(since) >= crate::queue::millis(BOOTSTRAP_AFTER) {
                    Step::Bootstrap
                } else {
                    Step::Wait
                }
            }
        }
    }

    fn lost(&mut self) -> Step {
        let new_loss = !std::mem::replace(&mut self.restoring, true);
        match &self.known {
            Some(known) => Step::Restore {
                known: known.clone(),
                new_loss,
            },
            None => Step::Wait,
        }
    }
}

/// Writes the flag document where every replica reads it (the admin API's `PUT /flag`). With
/// Redis: the settings refresher of `services/settings.rs`, which also adopts the written document on
/// this replica at once.
#[async_trait]
pub trait FlagWriter: Send + Sync {
    /// Sets `fields` in the flag document: the version written, or why not.
    async fn write_flag(&self, fields: &[(String, String)]) -> Result<u64, String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(items: &[(&str, &str)], version: Option<u64>) -> Reading {
        Reading {
            items: items
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            version,
        }
    }

    #[test]
    fn keys_share_a_slot_with_their_meta() {
        assert_eq!(DocKind::Flag.meta_key(), "{queue:flag}:meta");
        assert_eq!(DocKind::Targets.meta_key(), "{queue:targets}:meta");
    }

    #[test]
    fn a_versioned_document_is_adopted_and_newer_ones_replace_it() {
        let mut t = Tracker::default();
        let on = reading(&[("enabled", "on")], Some(5));
        assert!(matches!(t.observe(on, 0), Step::Adopt(d) if d.version == 5));
        // A hand-written field without a new version is still adopted.
        let hand = reading(&[("enabled", "off")], Some(5));
        assert!(matches!(t.observe(hand, 1), Step::Adopt(_)));
        let newer = reading(&[("enabled", "on")], Some(9));
        assert!(matches!(t.observe(newer, 2), Step::Adopt(d) if d.version == 9));
    }

    #[test]
    fn a_missing_or_older_document_after_one_was_read_is_a_loss() {
        let mut t = Tracker::default();
        t.observe(reading(&[("enabled", "on")], Some(9)), 0);
        let step = t.observe(reading(&[], None), 1000);
        let Step::Restore { known, new_loss } = step else {
            panic!("{step:?}")
        };
        assert_eq!(known.items, vec![("enabled".into(), "on".into())]);
        assert!(new_loss);
        // Still lost at the next reading (the write-back failed): the same loss, counted once.
        assert!(matches!(
            t.observe(reading(&[("enabled", "off")], None), 2000),
            Step::Restore {
                new_loss: false,
                ..
            }
        ));
        // A stale replica's document: older than the one read.
        t.observe(reading(&[("enabled", "on")], Some(9)), 3000);
        assert!(matches!(
            t.observe(reading(&[("enabled", "off")], Some(3)), 4000),
            Step::Restore { new_loss: true, .. }
        ));
        // Written back: adopted again.
        assert!(matches!(
            t.observe(reading(&[("enabled", "on")], Some(9)), 5000),
            Step::Adopt(_)
        ));
    }

    #[test]
    fn a_document_never_seen_is_created_only_after_waiting_for_a_write_back() {
        let mut t = Tracker::default();
        assert_eq!(t.observe(reading(&[], None), 10_000), Step::Wait);
        assert_eq!(t.observe(reading(&[], None), 12_999), Step::Wait);
        assert_eq!(t.observe(reading(&[], None), 13_000), Step::Bootstrap);
        assert!(t.known().is_none());
    }

    #[test]
    fn a_document_without_a_version_is_used_at_once_and_stamped() {
        let mut t = Tracker::default();
        let step = t.observe(reading(&[("enabled", "on")], None), 0);
        assert!(
            matches!(step, Step::Stamp(ref d) if d.version == 0),
            "{step:?}"
        );
        assert!(matches!(
            t.observe(reading(&[("enabled", "on")], Some(1)), 1000),
            Step::Adopt(_)
        ));
    }
}
