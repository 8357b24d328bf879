//! A growable array kept in chunks of `CHUNK` entries: a push never moves the entries already
//! there. The memory store's seq slots and Fenwick tree grow by one entry per new user, under
//! the target's lock. As one `Vec` each, every doubling copied the whole array into freshly
//! allocated memory while every call of the target waited (tens of milliseconds at a million
//! entries: `benches/HISTORY.md`). In chunks the first grows like a `Vec` up to `CHUNK` entries
//! (so a target with few users stays small) and each later one is allocated whole, once.

/// Entries per chunk: 128 KiB of `u64`.
const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

#[derive(Debug)]
pub(super) struct Chunked<T> {
    /// Every chunk but the last holds exactly `CHUNK` entries; the last holds at least one,
    /// unless there are no entries at all (then there is no chunk).
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Copy> Chunked<T> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn get(&self, i: usize) -> Option<T> {
        self.chunks
            .get(i >> CHUNK_BITS)
            .and_then(|c| c.get(i & (CHUNK - 1)))
            .copied()
    }

    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.chunks
            .get_mut(i >> CHUNK_BITS)
            .and_then(|c| c.get_mut(i & (CHUNK - 1)))
    }

    pub(super) fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => last.push(value),
            _ => {
                // The first chunk grows as a `Vec` does; a later one is allocated whole.
                let mut chunk = if self.chunks.is_empty() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHUNK)
                };
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// As `slice::partition_point`: the number of leading entries for which `pred` holds, the
    /// entries being ordered so that it holds for a prefix of them.
    pub(super) fn partition_point(&self, pred: impl Fn(&T) -> bool) -> usize {
        // The chunks whose last entry passes hold passing entries only.
        let whole = self.chunks.partition_point(|c| c.last().is_some_and(&pred));
        match self.chunks.get(whole) {
            Some(chunk) => whole * CHUNK + chunk.partition_point(&pred),
            None => self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_stay_where_they_were_pushed_across_chunks() {
        let mut c = Chunked::default();
        assert!(c.is_empty());
        assert_eq!(c.partition_point(|_: &u64| true), 0);
        let n = 3 * CHUNK + 5;
        for i in 0..n as u64 {
            c.push(2 * i);
        }
        assert_eq!(c.len(), n);
        assert_eq!(c.chunks.len(), 4);
        assert_eq!(c.get(0), Some(0));
        assert_eq!(c.get(CHUNK - 1), Some(2 * (CHUNK as u64 - 1)));
        assert_eq!(c.get(CHUNK), Some(2 * CHUNK as u64));
        assert_eq!(c.get(n - 1), Some(2 * (n as u64 - 1)));
        assert_eq!(c.get(n), None);
        // At each chunk edge, within a chunk, before all and after all.
        for (seq, point) in [
            (0, 1),
            (2 * CHUNK as u64 - 2, CHUNK),
            (2 * CHUNK as u64 - 1, CHUNK),
            (2 * CHUNK as u64, CHUNK + 1),
            (7, 4),
            (u64::MAX, n),
        ] {
            assert_eq!(c.partition_point(|s| *s <= seq), point, "{seq}");
        }
        if let Some(v) = c.get_mut(CHUNK + 1) {
            *v = 1;
        }
        assert_eq!(c.get(CHUNK + 1), Some(1));
        assert!(c.get_mut(n).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The same answers as one `Vec` holding the same pushes.
        #[test]
        fn behaves_as_a_vec(
            steps in proptest::collection::vec((0u64..5, any::<u16>()), 0..3 * CHUNK),
            probes in proptest::collection::vec(any::<u64>(), 1..20),
        ) {
            let (mut c, mut v) = (Chunked::default(), Vec::new());
            let mut seq = 0u64;
            for (gap, write) in &steps {
                // Ascending values, as the seq slots hold.
                seq += gap;
                c.push(seq);
                v.push(seq);
                let at = usize::from(*write) % v.len();
                if *write % 7 == 0 {
                    // A write that keeps the order: the same value again.
                    if let Some(x) = c.get_mut(at) {
                        *x = v[at];
                    }
                }
            }
            prop_assert_eq!(c.len(), v.len());
            for i in 0..v.len() + 2 {
                prop_assert_eq!(c.get(i), v.get(i).copied());
            }
            for p in probes {
                let bound = if seq == 0 { p % 2 } else { p % (seq + 2) };
                prop_assert_eq!(
                    c.partition_point(|s| *s <= bound),
                    v.partition_point(|s| *s <= bound)
                );
            }
        }
    }
}
