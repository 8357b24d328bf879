//! A growable Fenwick (binary indexed) tree of 0/1 "still waiting" flags indexed by seq: the
//! memory store's rank in O(log n) per enter, poll and leave.

use super::chunked::Chunked;

/// A growable Fenwick (binary indexed) tree of 0/1 "still waiting" flags indexed by seq.
#[derive(Debug, Default)]
pub(super) struct Fenwick {
    /// 1-based; `tree[0]` is unused. In chunks: it grows by one node per new user.
    tree: Chunked<i64>,
}

impl Fenwick {
    pub(super) fn len(&self) -> usize {
        self.tree.len().saturating_sub(1)
    }

    /// Sum of flags at positions `1..=i`.
    pub(super) fn prefix(&self, mut i: usize) -> i64 {
        let mut sum = 0;
        i = i.min(self.len());
        while i > 0 {
            sum += self.tree.get(i).unwrap_or(0);
            i &= i - 1;
        }
        sum
    }

    /// Appends position `len + 1` with `value`.
    pub(super) fn push(&mut self, value: i64) {
        if self.tree.is_empty() {
            self.tree.push(0);
        }
        let i = self.tree.len();
        let low = i & i.wrapping_neg();
        // tree[i] covers (i - low, i]: the new value plus the already present (i - low, i - 1].
        let node = value + self.prefix(i - 1) - self.prefix(i - low);
        self.tree.push(node);
    }

    /// The smallest position whose prefix sum reaches `k` (the k-th set flag), if any.
    pub(super) fn find(&self, mut k: i64) -> Option<usize> {
        if k <= 0 {
            return None;
        }
        let n = self.len();
        let mut pos = 0;
        let mut step = if n == 0 {
            0
        } else {
            1 << (usize::BITS - 1 - n.leading_zeros())
        };
        while step > 0 {
            let next = pos + step;
            if next <= n {
                let v = self.tree.get(next).unwrap_or(0);
                if v < k {
                    pos = next;
                    k -= v;
                }
            }
            step >>= 1;
        }
        (pos < n).then_some(pos + 1)
    }

    pub(super) fn add(&mut self, mut i: usize, delta: i64) {
        while i > 0 && i < self.tree.len() {
            if let Some(n) = self.tree.get_mut(i) {
                *n += delta;
            }
            i += i & i.wrapping_neg();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenwick_prefix_sums_follow_pushes_and_removals() {
        let mut f = Fenwick::default();
        for _ in 0..100 {
            f.push(1);
        }
        assert_eq!(f.prefix(0), 0);
        assert_eq!(f.prefix(37), 37);
        assert_eq!(f.prefix(100), 100);
        f.add(5, -1);
        f.add(64, -1);
        assert_eq!(f.prefix(4), 4);
        assert_eq!(f.prefix(5), 4);
        assert_eq!(f.prefix(70), 68);
        f.push(1);
        assert_eq!(f.prefix(101), 99);
        assert_eq!(f.prefix(1000), 99);
        assert_eq!(f.find(1), Some(1));
        assert_eq!(f.find(5), Some(6));
        assert_eq!(f.find(99), Some(101));
        assert_eq!(f.find(100), None);
        assert_eq!(f.find(0), None);
    }

    #[test]
    fn fenwick_matches_a_naive_count() {
        let mut f = Fenwick::default();
        let mut flags = Vec::new();
        for i in 0..500u64 {
            f.push(1);
            flags.push(1i64);
            if i % 3 == 0 {
                let j = (i * 7 % (i + 1)) as usize;
                if flags[j] == 1 {
                    flags[j] = 0;
                    f.add(j + 1, -1);
                }
            }
            let k = (i as usize * 13) % flags.len() + 1;
            let sum = flags[..k].iter().sum::<i64>();
            assert_eq!(f.prefix(k), sum);
            if sum > 0 {
                let pos = f.find(sum).unwrap();
                assert_eq!(flags[..pos].iter().sum::<i64>(), sum);
                assert_eq!(flags[pos - 1], 1);
            }
        }
    }
}
