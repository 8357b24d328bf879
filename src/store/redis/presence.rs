//! This instance's presence connection: one connection of its own, subscribed to the instance's
//! channel (`scripts::presence_channel`), that the replica roster (`roster.lua`) looks
//! for when the instance stops registering. A process that exits or is killed closes it, and
//! Redis sees that at once: the roster then drops the instance instead of holding its slice
//! back for `fail_open.paced_for_s`. A replica cut off by a partition leaves it open on Redis'
//! side until TCP keep-alive gives up, and a subscribed connection is exempt from the server's
//! idle `timeout`.
//!
//! So the signal is offered only when Redis keeps a silent half-open connection at least as
//! long as a cut-off replica paces: `tcp-keepalive` is 0 (never dropped), or its seconds (Redis
//! gives up no sooner than that after the last reply it had) cover the pacing window. Where
//! `CONFIG GET` is refused, nothing is known and the signal is not offered: the instance is held
//! back for the whole window, as before.

use std::time::{Duration, Instant};

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, PubsubInterface};
use parking_lot::Mutex;

use crate::store::PresenceKind;

/// How often a presence the roster does not see is connected again (after a failover the
/// subscription may still sit on the old primary).
const RECONNECT_EVERY: Duration = Duration::from_secs(5);

/// How many registrations in a row may miss the subscription before it is connected again.
const MISSES_BEFORE_RECONNECT: u32 = 3;

#[derive(Default)]
pub struct Presence {
    state: Mutex<State>,
}

#[derive(Default)]
enum State {
    #[default]
    Unstarted,
    /// Not offered (why logged once).
    Off,
    On {
        client: SubscriberClient,
        kind: PresenceKind,
        misses: u32,
        reconnected: Option<Instant>,
    },
}

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.state.lock() {
            State::Unstarted => "unstarted",
            State::Off => "off",
            State::On { .. } => "on",
        };
        f.debug_struct("Presence").field("state", &state).finish()
    }
}

/// Whether Redis keeps a silent connection at least `window` after it last heard from it, by
/// its `tcp-keepalive` (seconds; 0: never dropped).
pub fn keepalive_covers(keepalive_s: u64, window: Duration) -> bool {
    keepalive_s == 0 || Duration::from_secs(keepalive_s) >= window
}

impl Presence {
    /// The answer of an earlier `ensure`: None before the first.
    pub fn known(&self) -> Option<Option<PresenceKind>> {
        match &*self.state.lock() {
            State::Unstarted => None,
            State::Off => Some(None),
            State::On { kind, .. } => Some(Some(*kind)),
        }
    }

    /// The kind of presence subscription this instance keeps, starting it at the first call
    /// (`keepalive_s`: Redis' `tcp-keepalive` as read, None where `CONFIG GET` was refused;
    /// `window`: how long a cut-off replica may pace after its last registration).
    pub async fn ensure(
        &self,
        builder: impl FnOnce() -> Option<SubscriberClient>,
        instance: &str,
        cluster: bool,
        keepalive_s: Option<u64>,
        window: Duration,
    ) -> Option<PresenceKind> {
        {
            let state = self.state.lock();
            match &*state {
                State::Off => return None,
                State::On { kind, .. } => return Some(*kind),
                State::Unstarted => {}
            }
        }
        let off = |why: &str| {
            tracing::warn!(
                why,
                "a crashed replica's share is held back for fail_open.paced_for_s: Redis cannot tell it from a cut-off one"
            );
            *self.state.lock() = State::Off;
            None
        };
        match keepalive_s {
            None => return off("CONFIG GET tcp-keepalive is refused by this Redis"),
            Some(k) if !keepalive_covers(k, window) => {
                return off(
                    "Redis' tcp-keepalive is shorter than a cut-off replica's pacing window",
                )
            }
            Some(_) => {}
        }
        let Some(client) = builder() else {
            return off("the presence connection could not be built");
        };
        let _task = client.connect();
        let _manage = client.manage_subscriptions();
        let channel = crate::store::scripts::presence_channel(instance);
        let kind = if cluster {
            PresenceKind::Shard
        } else {
            PresenceKind::Classic
        };
        // Subscribed in the background: the roster sees it from the first registration after
        // it landed (and fred subscribes again after every reconnect).
        let sub = client.clone();
        tokio::spawn(async move {
            let _ = sub.wait_for_connect().await;
            let done = match kind {
                PresenceKind::Shard => sub.ssubscribe(channel).await,
                PresenceKind::Classic => sub.subscribe(channel).await,
            };
            if let Err(e) = done {
                tracing::debug!(error = %e.details(), "presence subscription failed; retried at the next reconnect");
            }
        });
        *self.state.lock() = State::On {
            client,
            kind,
            misses: 0,
            reconnected: None,
        };
        Some(kind)
    }

    /// A registration answered whether the roster saw this instance's subscription; after a
    /// few misses in a row the connection is made again (it may sit on a demoted primary).
    pub fn seen(&self, seen: bool) {
        let mut state = self.state.lock();
        let State::On {
            client,
            misses,
            reconnected,
            ..
        } = &mut *state
        else {
            return;
        };
        if seen {
            *misses = 0;
            return;
        }
        *misses += 1;
        let due = reconnected.is_none_or(|at| at.elapsed() >= RECONNECT_EVERY);
        if *misses >= MISSES_BEFORE_RECONNECT && due {
            *reconnected = Some(Instant::now());
            *misses = 0;
            let client = client.clone();
            tokio::spawn(async move {
                let _ = client.force_reconnection().await;
            });
        }
    }
}

/// `CONFIG GET tcp-keepalive`'s seconds, from the reply's pairs.
pub fn keepalive_from(pairs: &[(String, String)]) -> Option<u64> {
    pairs
        .iter()
        .find(|(k, _)| k == "tcp-keepalive")
        .and_then(|(_, v)| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_needs_a_keepalive_that_outlasts_pacing() {
        let window = Duration::from_secs(116);
        assert!(keepalive_covers(0, window), "never dropped");
        assert!(keepalive_covers(300, window), "Redis' default");
        assert!(keepalive_covers(116, window));
        assert!(!keepalive_covers(60, window));
        let pairs = vec![("tcp-keepalive".to_string(), "300".to_string())];
        assert_eq!(keepalive_from(&pairs), Some(300));
        assert_eq!(keepalive_from(&[]), None);
    }
}
