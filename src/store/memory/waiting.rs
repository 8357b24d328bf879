//! The waiting users of one target, by user id, split over shards.
//!
//! One hash map of millions of users rehashes all of them in one step each time it outgrows its
//! table, under the store's lock: with the first entries of a sale arriving at 60,000 a second, a
//! gateway on the memory store stopped for up to 200 ms at those steps (wrk's maximum latency;
//! p99 up to 147 ms in a 5 s run), and each step doubles the one before. Split over `SHARDS`
//! maps by a keyed hash of the user id, a step rehashes one shard's users only.

use std::collections::HashMap;

use ahash::RandomState;

/// How many maps the users are split over.
const SHARDS: usize = 64;

/// A map from user id to `V`, in `SHARDS` hash maps. Keyed hashes (random per process): user ids
/// come from clients, who must not be able to pile their ids into one shard or one bucket.
#[derive(Debug)]
pub(super) struct Waiting<V> {
    shards: Vec<HashMap<u64, V, RandomState>>,
    /// Picks the shard; separate from the maps' own hash so that the users of one shard still
    /// spread over their map.
    pick: RandomState,
    len: usize,
}

impl<V> Default for Waiting<V> {
    fn default() -> Waiting<V> {
        let hasher = RandomState::new();
        Waiting {
            shards: (0..SHARDS)
                .map(|_| HashMap::with_hasher(hasher.clone()))
                .collect(),
            pick: RandomState::new(),
            len: 0,
        }
    }
}

impl<V> Waiting<V> {
    fn shard(&self, user: u64) -> usize {
        (self.pick.hash_one(user) % SHARDS as u64) as usize
    }

    pub(super) fn get(&self, user: &u64) -> Option<&V> {
        self.shards[self.shard(*user)].get(user)
    }

    pub(super) fn get_mut(&mut self, user: &u64) -> Option<&mut V> {
        let i = self.shard(*user);
        self.shards[i].get_mut(user)
    }

    /// Inserts or replaces; the value it replaced, if any.
    pub(super) fn insert(&mut self, user: u64, value: V) -> Option<V> {
        let i = self.shard(user);
        let old = self.shards[i].insert(user, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(super) fn remove(&mut self, user: &u64) -> Option<V> {
        let i = self.shard(*user);
        let old = self.shards[i].remove(user);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.shards.iter().flat_map(|s| s.values())
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Bump(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct ids, so that inserts replace and removes hit.
        let id = 0u64..40;
        prop_oneof![
            (id.clone(), any::<u32>()).prop_map(|(u, v)| Op::Insert(u, v)),
            id.clone().prop_map(Op::Remove),
            id.prop_map(Op::Bump),
        ]
    }

    proptest! {
        /// Every operation answers as one `HashMap` does, and the count follows.
        #[test]
        fn answers_as_one_map(ops in proptest::collection::vec(op(), 0..300)) {
            let mut sharded = Waiting::default();
            let mut model = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(u, v) => prop_assert_eq!(sharded.insert(u, v), model.insert(u, v)),
                    Op::Remove(u) => prop_assert_eq!(sharded.remove(&u), model.remove(&u)),
                    Op::Bump(u) => {
                        if let Some(v) = sharded.get_mut(&u) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = model.get_mut(&u) {
                            *v = v.wrapping_add(1);
                        }
                    }
                }
                prop_assert_eq!(sharded.len(), model.len());
                prop_assert_eq!(sharded.is_empty(), model.is_empty());
            }
            for u in 0..40 {
                prop_assert_eq!(sharded.get(&u), model.get(&u));
            }
            let mut values: Vec<u32> = sharded.values().copied().collect();
            let mut want: Vec<u32> = model.values().copied().collect();
            values.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(values, want);
        }
    }

    #[test]
    fn users_spread_over_the_shards() {
        let mut w = Waiting::default();
        for u in 1..=64_000u64 {
            w.insert(u, ());
        }
        // 1,000 a shard on average; a keyed hash keeps every shard near it.
        for s in &w.shards {
            assert!((700..1300).contains(&s.len()), "{}", s.len());
        }
    }
}
