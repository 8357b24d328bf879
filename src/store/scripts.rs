//! The Lua scripts of `lua/`, compiled in and registered in one place, and the Redis key names
//! they run on (docs/redis.md#keys).
//!
//! Every per-target key carries the `{TYPE:ID}` hash tag so a script touches one cluster slot.

use crate::queue::QueueTarget;

/// One script: its source and the SHA1 that `EVALSHA` names it by.
#[derive(Debug)]
pub struct Script {
    pub name: &'static str,
    pub source: &'static str,
    pub sha: String,
}

impl Script {
    fn new(name: &'static str, source: &'static str) -> Script {
        Script {
            name,
            source,
            sha: fred::util::sha1_hash(source),
        }
    }
}

/// All scripts the Redis store runs.
#[derive(Debug)]
pub struct Scripts {
    pub enter: Script,
    pub poll: Script,
    pub issue: Script,
    pub leave: Script,
    pub stats: Script,
    pub advance: Script,
    pub sweep: Script,
    pub unlock: Script,
    pub setnx: Script,
    pub claim: Script,
    pub roster: Script,
    pub open: Script,
    pub settings_read: Script,
    pub settings_write: Script,
    pub sale_write: Script,
    pub draw: Script,
    pub ticks: Script,
    pub rejoin: Script,
    pub paced: Script,
}

impl Scripts {
    pub fn load() -> Scripts {
        Scripts {
            enter: Script::new("enter", include_str!("../../lua/enter.lua")),
            poll: Script::new("poll", include_str!("../../lua/poll.lua")),
            issue: Script::new("issue", include_str!("../../lua/issue.lua")),
            leave: Script::new("leave", include_str!("../../lua/leave.lua")),
            stats: Script::new("stats", include_str!("../../lua/stats.lua")),
            advance: Script::new("advance", include_str!("../../lua/advance.lua")),
            sweep: Script::new("sweep", include_str!("../../lua/sweep.lua")),
            unlock: Script::new("unlock", include_str!("../../lua/unlock.lua")),
            setnx: Script::new("setnx", include_str!("../../lua/setnx.lua")),
            claim: Script::new("claim", include_str!("../../lua/claim.lua")),
            roster: Script::new("roster", include_str!("../../lua/roster.lua")),
            open: Script::new("open", include_str!("../../lua/open.lua")),
            settings_read: Script::new(
                "settings_read",
                include_str!("../../lua/settings_read.lua"),
            ),
            settings_write: Script::new(
                "settings_write",
                include_str!("../../lua/settings_write.lua"),
            ),
            sale_write: Script::new("sale_write", include_str!("../../lua/sale_write.lua")),
            draw: Script::new("draw", include_str!("../../lua/draw.lua")),
            ticks: Script::new("ticks", include_str!("../../lua/ticks.lua")),
            rejoin: Script::new("rejoin", include_str!("../../lua/rejoin.lua")),
            paced: Script::new("paced", include_str!("../../lua/paced.lua")),
        }
    }

    pub fn all(&self) -> [&Script; 19] {
        [
            &self.enter,
            &self.poll,
            &self.issue,
            &self.leave,
            &self.stats,
            &self.advance,
            &self.sweep,
            &self.unlock,
            &self.setnx,
            &self.claim,
            &self.roster,
            &self.open,
            &self.settings_read,
            &self.settings_write,
            &self.sale_write,
            &self.draw,
            &self.ticks,
            &self.rejoin,
            &self.paced,
        ]
    }
}

/// The set of targets the pump visits (written outside the per-target scripts).
pub const ACTIVE_KEY: &str = "queue:active";

pub use crate::allowed::REGISTERED_KEY;

/// The replica roster (`roster.lua`): live gateway replicas, for the fail-open pacer.
///
/// The roster's keys keep the name they were first written with (`queue:instances…`): replicas
/// of every version read and write the same keys during a rolling upgrade.
pub const ROSTER_KEY: &str = "queue:instances";

/// The heartbeat credits the instances report (`roster.lua`), in the roster's slot.
pub const ROSTER_CREDIT_KEY: &str = "{queue:instances}:credit";

/// Each instance's presence (`run_id|replica name`), in the roster's slot (`roster.lua`).
pub const ROSTER_PRESENCE_KEY: &str = "{queue:instances}:presence";

/// The roster's clock (`roster.lua`): registrations counted, and the rollbacks of Redis
/// they found, in the roster's slot.
pub const ROSTER_CLOCK_KEY: &str = "{queue:instances}:clock";

/// Roster retired by a newer one with their replica name, in the roster's slot.
pub const ROSTER_RETIRED_KEY: &str = "{queue:instances}:retired";

/// The channel an instance's presence connection subscribes to (`presence.rs`): in the
/// roster's slot, so a cluster keeps it (sharded) on the node that runs `roster.lua`.
pub fn presence_channel(instance: &str) -> String {
    format!("{{queue:instances}}:presence:{instance}")
}

/// Every per-target key (docs/redis.md#keys): one enum, rendered in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    Waiting,
    /// Bitmap by seq: 1 while that seq waits.
    Queued,
    /// The draw's order (`draw.lua`).
    Draw,
    /// The sale's parameters (`sale_write.lua`). (The heartbeat windows' bitmaps,
    /// `alive:{windowMs}:{window}`, are named by the scripts themselves from the sale's width.)
    Sale,
    /// The sweep's scratch bitmap.
    Sweep,
    Seq,
    AdmittedCount,
    SeqTime,
    Waits,
    Advances,
    LastAdvance,
    Lock,
    Summary,
    /// The console's history of pump visits (`ticks.lua`).
    Ticks,
    /// Losses of the target's state found and repaired by the scripts (HASH kind -> count;
    /// named by the scripts themselves from the waiting key's prefix).
    Losses,
    /// The sale's spent tokens (`claim.lua`): a second record of each spend beside its
    /// `used:{token}` hash.
    Spent,
    /// Set when an operator deletes the sale, for as long as its keys would have lived: its
    /// queue state missing then is no loss (docs/state.md).
    Deleted,
    Token(u64),
    Used(&'a str),
}

/// Key names of one target.
#[derive(Debug, Clone)]
pub struct TargetKeys {
    prefix: String,
}

impl TargetKeys {
    pub fn new(target: QueueTarget) -> TargetKeys {
        TargetKeys {
            prefix: format!("queue:{{{target}}}:"),
        }
    }

    pub fn of(&self, key: Key<'_>) -> String {
        let p = &self.prefix;
        match key {
            Key::Waiting => format!("{p}waiting"),
            Key::Queued => format!("{p}queued"),
            Key::Sale => format!("{p}sale"),
            Key::Draw => format!("{p}draw"),
            Key::Sweep => format!("{p}sweep"),
            Key::Seq => format!("{p}seq"),
            Key::AdmittedCount => format!("{p}admitted_count"),
            Key::SeqTime => format!("{p}seqtime"),
            Key::Waits => format!("{p}waits"),
            Key::Advances => format!("{p}advances"),
            Key::LastAdvance => format!("{p}last_advance"),
            Key::Lock => format!("{p}lock"),
            Key::Summary => format!("{p}summary"),
            Key::Ticks => format!("{p}ticks"),
            Key::Losses => format!("{p}losses"),
            Key::Deleted => format!("{p}deleted"),
            Key::Spent => format!("{p}spent"),
            Key::Token(user) => format!("{p}token:{user}"),
            Key::Used(token_id) => format!("{p}used:{token_id}"),
        }
    }

    /// The seven keys every write script refreshes together (KEYS[1..7] of enter, issue and
    /// advance), so that no key of a target outlives the others.
    fn shared_keys(&self) -> Vec<String> {
        [
            Key::Waiting,
            Key::Queued,
            Key::Seq,
            Key::AdmittedCount,
            Key::SeqTime,
            Key::Waits,
            Key::Advances,
        ]
        .into_iter()
        .map(|k| self.of(k))
        .collect()
    }

    /// KEYS of enter.lua: the shared seven and the sale (the script names a user's token key
    /// and the heartbeat window's bitmap itself, from the waiting key's prefix).
    pub fn enter_keys(&self) -> Vec<String> {
        let mut keys = self.shared_keys();
        keys.push(self.of(Key::Sale));
        keys
    }

    /// KEYS of poll.lua: waiting, admitted_count and the sale (the script names a user's token
    /// key and the heartbeat window's bitmap itself).
    pub fn poll_keys(&self) -> Vec<String> {
        vec![
            self.of(Key::Waiting),
            self.of(Key::AdmittedCount),
            self.of(Key::Sale),
        ]
    }

    /// The heartbeat bitmap of the window holding `now_ms`, for windows `width_ms` wide (the
    /// scripts name the same: `alive:{width}:{now / width}`).
    pub fn window(&self, width_ms: u64, now_ms: u64) -> String {
        let width = width_ms.max(1);
        format!("{}alive:{width}:{}", self.prefix, now_ms / width)
    }

    /// KEYS of issue.lua: the shared seven, the user's token key, the sale, and the losses (a
    /// repair's hold).
    pub fn queue_keys(&self, user: u64) -> Vec<String> {
        let mut keys = self.shared_keys();
        keys.push(self.of(Key::Token(user)));
        keys.push(self.of(Key::Sale));
        keys.push(self.of(Key::Losses));
        keys
    }

    /// KEYS of sweep.lua: waiting, queued, the scratch bitmap and the sale (the script names the
    /// windows it reads from the sale's width).
    pub fn sweep_keys(&self) -> Vec<String> {
        vec![
            self.of(Key::Waiting),
            self.of(Key::Queued),
            self.of(Key::Sweep),
            self.of(Key::Sale),
        ]
    }

    /// KEYS of advance.lua: the shared seven, the tick guard, the sale, the losses found, the
    /// deletion mark.
    pub fn advance_keys(&self) -> Vec<String> {
        let mut keys = self.shared_keys();
        keys.push(self.of(Key::LastAdvance));
        keys.push(self.of(Key::Sale));
        keys.push(self.of(Key::Losses));
        keys.push(self.of(Key::Deleted));
        keys
    }

    /// KEYS of draw.lua: waiting, seq, the sale, the draw's order.
    pub fn draw_keys(&self) -> Vec<String> {
        [Key::Waiting, Key::Seq, Key::Sale, Key::Draw]
            .map(|k| self.of(k))
            .to_vec()
    }

    /// KEYS of rejoin.lua: waiting, queued, seq, admitted_count, the user's token key, the sale,
    /// the deletion mark.
    pub fn rejoin_keys(&self, user: u64) -> Vec<String> {
        [
            Key::Waiting,
            Key::Queued,
            Key::Seq,
            Key::AdmittedCount,
            Key::Token(user),
            Key::Sale,
            Key::Deleted,
        ]
        .map(|k| self.of(k))
        .to_vec()
    }

    /// KEYS of paced.lua: waiting, queued, the user's token key.
    pub fn paced_keys(&self, user: u64) -> Vec<String> {
        [Key::Waiting, Key::Queued, Key::Token(user)]
            .map(|k| self.of(k))
            .to_vec()
    }

    /// Every key of a target's queue but the users' tokens and claims (they expire on their
    /// own): what deleting a sale drops with it.
    pub fn queue_state_keys(&self) -> Vec<String> {
        let mut keys = self.shared_keys();
        keys.extend(
            [
                Key::LastAdvance,
                Key::Lock,
                Key::Summary,
                Key::Sweep,
                Key::Draw,
                Key::Ticks,
                Key::Losses,
            ]
            .map(|k| self.of(k)),
        );
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::TargetType;

    #[test]
    fn keys_carry_the_hash_tag() {
        let k = TargetKeys::new(QueueTarget::new(TargetType::LimitedDrop, 42));
        assert_eq!(k.of(Key::Waiting), "queue:{LIMITED_DROP:42}:waiting");
        assert_eq!(k.of(Key::Token(1001)), "queue:{LIMITED_DROP:42}:token:1001");
        assert_eq!(k.of(Key::Sale), "queue:{LIMITED_DROP:42}:sale");
        let sweep = k.sweep_keys();
        assert_eq!(sweep.len(), 4);
        assert!(sweep
            .iter()
            .all(|k| k.starts_with("queue:{LIMITED_DROP:42}:")));
        assert_eq!(k.of(Key::Used("ab")), "queue:{LIMITED_DROP:42}:used:ab");
    }

    #[test]
    fn scripts_have_headers_and_distinct_shas() {
        let s = Scripts::load();
        let all = s.all();
        for sc in all {
            assert!(
                sc.source.starts_with("#!lua"),
                "{} lacks the #!lua shebang",
                sc.name
            );
            assert!(
                sc.source.contains("KEYS[1]"),
                "{} lacks its KEYS header",
                sc.name
            );
            assert_eq!(sc.sha.len(), 40);
        }
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.sha, b.sha);
            }
        }
    }
}
