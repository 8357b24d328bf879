//! Slices of a sale's batch: what a replica may admit per tick on its own while it is cut off from
//! Redis (`failopen.rs`), and what the pumps hold back for it (`pump.rs`, `advance.lua`).
//!
//! A slice is an interval `[start, end)` of the unit, in millionths. The replica roster
//! (`roster.lua`) keeps the recorded slices of its members disjoint. A tick's batch `B` is
//! cut into `B × FRAME` cells, lane by lane: cell `c` is lane `c / FRAME` at the tick whose
//! index `t` (since the epoch, in the sale's ticks) has `reverse(t mod FRAME) = c mod FRAME`. A
//! slice owns the cells `[⌈start·B·FRAME⌉, ⌈end·B·FRAME⌉)` (in millionths), and may admit as
//! many users in tick `t` as it owns cells of that tick.
//!
//! So, whatever the batch:
//! - disjoint slices own disjoint cells, and a tick has `B` cells: the slices' admissions in any
//!   tick add up to at most the batch;
//! - a slice of width `w` admits `w·B` users per tick on average, and once per `FRAME` ticks at
//!   least when `w·B·FRAME ≥ 1`: with a batch smaller than the replica count the remainder
//!   rotates instead of rounding every share down to zero;
//! - the bit-reversed tick order spreads a slice's ticks over the frame instead of bunching them.
//!
//! `advance.lua` computes the same cells; `tests/store_contract.rs` holds the two to it.

use std::fmt;

/// The whole unit, in millionths (`QueueStore::advance` takes shares in the same unit).
pub const UNIT: u32 = 1_000_000;

/// Ticks in one frame (a power of two: `reverse` reverses `FRAME_BITS` bits).
pub const FRAME: u64 = 64;
const FRAME_BITS: u32 = 6;

/// An interval of the unit, in millionths; empty when `start >= end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slice {
    pub start: u32,
    pub end: u32,
}

impl Slice {
    pub const EMPTY: Slice = Slice { start: 0, end: 0 };
    pub const WHOLE: Slice = Slice {
        start: 0,
        end: UNIT,
    };

    pub fn new(start: u32, end: u32) -> Slice {
        let start = start.min(UNIT);
        Slice {
            start,
            end: end.clamp(start, UNIT),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    pub fn width(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }

    /// The part of the unit both slices cover.
    pub fn intersect(&self, other: Slice) -> Slice {
        let s = Slice::new(self.start.max(other.start), self.end.min(other.end));
        if s.is_empty() {
            Slice::EMPTY
        } else {
            s
        }
    }

    /// The users this slice may admit in tick `tick` (index since the epoch) of a sale whose
    /// batch is `batch`.
    pub fn cells(&self, batch: u64, tick: u64) -> u64 {
        if self.is_empty() || batch == 0 {
            return 0;
        }
        let total = u128::from(batch) * u128::from(FRAME);
        let bound = |x: u32| (u128::from(x) * total).div_ceil(u128::from(UNIT)) as u64;
        let (lo, hi) = (bound(self.start), bound(self.end));
        let r = reverse(tick % FRAME);
        // Cells c in [lo, hi) with c ≡ r (mod FRAME).
        let upto = |x: u64| if x <= r { 0 } else { (x - r - 1) / FRAME + 1 };
        upto(hi) - upto(lo)
    }

    /// Whether `user`'s point of the unit (`point_of`) lies in this slice. The roster's slices
    /// are disjoint, so while replicas pace each user belongs to one of them at most: the only
    /// replica that may let it through (`failopen.rs`).
    pub fn owns(&self, user: u64) -> bool {
        let p = point_of(user);
        self.start <= p && p < self.end
    }

    /// Parses `start:end` (millionths), as the roster and `advance.lua` write it.
    pub fn parse(s: &str) -> Option<Slice> {
        let (a, b) = s.split_once(':')?;
        let num = |x: &str| {
            (!x.is_empty() && x.len() <= 7 && x.bytes().all(|c| c.is_ascii_digit()))
                .then(|| x.parse::<u32>().ok())
                .flatten()
                .filter(|v| *v <= UNIT)
        };
        Some(Slice::new(num(a)?, num(b)?))
    }
}

impl fmt::Display for Slice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.end)
    }
}

/// Where `user` lies in the unit (millionths): the same on every replica and every version, and
/// spread evenly (ids handed out in order land all over the unit), so a slice of width `w` owns
/// about `w` of any crowd's users (`Slice::owns`).
pub fn point_of(user: u64) -> u32 {
    // A 64-bit mix (splitmix64's finaliser): every input bit moves every output bit.
    let mut z = user.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(UNIT)) as u32
}

/// `x`'s low `FRAME_BITS` bits in reverse order.
fn reverse(x: u64) -> u64 {
    (x as u32).reverse_bits() as u64 >> (32 - FRAME_BITS)
}

/// The users the slices together may admit in `tick` of a sale whose batch is `batch`.
pub fn cells_of(slices: &[Slice], batch: u64, tick: u64) -> u64 {
    slices.iter().map(|s| s.cells(batch, tick)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seat `k` of `n` equal slices.
    fn seat(k: u32, n: u32) -> Slice {
        Slice::new(
            (u64::from(UNIT) * u64::from(k) / u64::from(n)) as u32,
            (u64::from(UNIT) * u64::from(k + 1) / u64::from(n)) as u32,
        )
    }

    #[test]
    fn disjoint_slices_never_admit_more_than_the_batch_in_a_tick() {
        for batch in [1u64, 2, 3, 5, 7, 50, 100, 1000] {
            for n in [1u32, 2, 3, 4, 5, 7, 10, 64] {
                let slices: Vec<Slice> = (0..n).map(|k| seat(k, n)).collect();
                let mut per_replica = vec![0u64; n as usize];
                for tick in 0..FRAME * 3 {
                    let total = cells_of(&slices, batch, tick);
                    assert_eq!(total, batch, "batch {batch}, {n} replicas, tick {tick}");
                    for (i, s) in slices.iter().enumerate() {
                        per_replica[i] += s.cells(batch, tick);
                    }
                }
                for (i, got) in per_replica.iter().enumerate() {
                    let width = u64::from(slices[i].width());
                    let want = batch * 3 * FRAME * width / u64::from(UNIT);
                    assert!(
                        got.abs_diff(want) <= 3,
                        "batch {batch}, {n} replicas: replica {i} admitted {got}, its part is {want}"
                    );
                    assert!(
                        *got > 0,
                        "batch {batch}, {n} replicas: replica {i} never admits"
                    );
                }
            }
        }
    }

    #[test]
    fn a_small_slice_s_ticks_are_spread_over_the_frame() {
        // Batch 1 and three replicas: each admits about every third tick, not 21 ticks in a row.
        let s = seat(0, 3);
        let ticks: Vec<u64> = (0..FRAME).filter(|t| s.cells(1, *t) == 1).collect();
        assert_eq!(ticks.len(), 22);
        let longest_gap = ticks.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(longest_gap <= 4, "{ticks:?}");
    }

    #[test]
    fn every_user_belongs_to_one_seat_and_seats_own_their_part() {
        for n in [1u32, 2, 3, 7] {
            let seats: Vec<Slice> = (0..n).map(|k| seat(k, n)).collect();
            let mut owned = vec![0u64; n as usize];
            for user in 0..30_000u64 {
                let owners: Vec<usize> = (0..n as usize).filter(|k| seats[*k].owns(user)).collect();
                assert_eq!(owners.len(), 1, "user {user}, {n} seats: {owners:?}");
                owned[owners[0]] += 1;
            }
            let even = 30_000 / u64::from(n);
            for got in owned {
                assert!(got.abs_diff(even) < even / 20, "{n} seats: {got} of {even}");
            }
        }
        assert!(!Slice::EMPTY.owns(1));
        assert_eq!(point_of(42), point_of(42), "the same everywhere");
    }

    #[test]
    fn slices_parse_strictly() {
        assert_eq!(Slice::parse("0:1000000"), Some(Slice::WHOLE));
        assert_eq!(Slice::parse("5:3"), Some(Slice::new(5, 5)));
        for bad in [
            "",
            ":",
            "1:",
            "a:2",
            "1:2:3",
            "-1:2",
            "1:1000001",
            "+1:2",
            "00000001:2",
        ] {
            assert_eq!(Slice::parse(bad), None, "{bad}");
        }
        assert_eq!(
            Slice::new(10, 20).intersect(Slice::new(15, 30)),
            Slice::new(15, 20)
        );
        assert!(Slice::new(10, 20).intersect(Slice::new(20, 30)).is_empty());
    }
}
