//! The pre-queue draw: at a sale's opening, every live user who entered before it gets a
//! uniformly random place, in one step, reproducible by anyone from the revealed seed and the
//! entrant list. No I/O.
//!
//! # The algorithm (`vq-draw-v1`), specified so that it can be reimplemented
//! - **Seed**: 32 bytes fixed when the sale's `opensAt` is first set. Its **commitment**, the
//!   lowercase hex SHA-256 of the 32 bytes, is public from then on; the seed (lowercase hex) is
//!   revealed once the draw has run. With Redis the seed is never stored before the draw: a
//!   random 16-byte nonce is, and the seed is HMAC-SHA256(draw key, `vq-draw-seed-v1|TYPE:ID|`
//!   nonce in hex), the draw key being HMAC-SHA256(token secret, `vq-draw-key-v1`) (`DrawKeys`):
//!   only the replicas, which hold the secret, can compute it; someone who can read Redis sees
//!   the nonce and the commitment, and cannot grind user ids against an unknown seed.
//! - **Entrants**: the user ids (unsigned 64-bit) of the users waiting at the draw, sorted
//!   ascending. Sorted, not in arrival order: when a user entered the pre-queue makes no difference.
//! - **Stream**: block `i` (i = 0, 1, 2, …) is `SHA-256(seed ‖ i as 8 bytes big-endian)`; each
//!   block gives four 64-bit words, big-endian, in order; the stream is the words of block 0, then
//!   block 1, …
//! - **Uniform integer below `b`**: take the next word `w`; if `w ≥ 2⁶⁴ − (2⁶⁴ mod b)`, reject it
//!   and take the next; else the result is `w mod b`.
//! - **Shuffle** (Fisher–Yates, Durstenfeld's form): for `i` from `n − 1` down to `1`: `j =` uniform
//!   integer below `i + 1`; swap entries `i` and `j` of the sorted entrant list.
//! - **Places**: the entrant at index `k` of the shuffled list gets the `k`-th smallest of the
//!   sequence numbers the entrants held (their places in arrival order), so the users after the
//!   pre-queue keep theirs; index 0 is admitted first.

use ring::digest;

/// The algorithm's name, as answered with the draw.
pub const ALGORITHM: &str = "vq-draw-v1: Fisher-Yates over the entrants sorted by user id, \
     uniform integers by rejection from the big-endian 64-bit words of SHA-256(seed || \
     u64be(block)); entrant k takes the k-th smallest entrant seq";

/// The keys the seeds of draws are derived from (the module documentation): from the token
/// secret, and from the previous one while it rotates, so a draw announced before a rotation
/// still honours its commitment.
#[derive(Clone)]
pub struct DrawKeys {
    current: Vec<u8>,
    previous: Option<Vec<u8>>,
}

impl std::fmt::Debug for DrawKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DrawKeys(..)")
    }
}

impl DrawKeys {
    pub fn from_token_keys(keys: &crate::token::TokenKeys) -> DrawKeys {
        let (current, previous) = keys.derive(b"vq-draw-key-v1");
        DrawKeys { current, previous }
    }

    fn seed_with(key: &[u8], target: &str, nonce_hex: &str) -> [u8; 32] {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
        let tag = ring::hmac::sign(
            &key,
            format!("vq-draw-seed-v1|{target}|{nonce_hex}").as_bytes(),
        );
        let mut seed = [0u8; 32];
        seed.copy_from_slice(tag.as_ref());
        seed
    }

    /// The seed of `target`'s draw (`TYPE:ID`) with `nonce_hex`, under the current key.
    pub fn seed(&self, target: &str, nonce_hex: &str) -> [u8; 32] {
        DrawKeys::seed_with(&self.current, target, nonce_hex)
    }

    /// The seed whose commitment is `commitment`, under the current key or the previous one;
    /// `None` when neither gives it (the secret changed and the old one is not configured).
    pub fn committed_seed(
        &self,
        target: &str,
        nonce_hex: &str,
        commitment_hex: &str,
    ) -> Option<[u8; 32]> {
        std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .map(|key| DrawKeys::seed_with(key, target, nonce_hex))
            .find(|seed| commitment(seed) == commitment_hex)
    }
}

/// A fresh nonce for a draw (`DrawKeys`), from the operating system's CSPRNG.
pub fn new_nonce() -> Result<[u8; 16], ring::error::Unspecified> {
    let mut nonce = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)?;
    Ok(nonce)
}

/// A fresh seed from the operating system's CSPRNG.
pub fn new_seed() -> Result<[u8; 32], ring::error::Unspecified> {
    let mut seed = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)?;
    Ok(seed)
}

/// The public commitment to `seed`: lowercase hex SHA-256.
pub fn commitment(seed: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, seed).as_ref())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lowercase or uppercase hex to bytes (`None`: odd length or not hex).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The stream of 64-bit words of a seed.
struct Stream<'a> {
    seed: &'a [u8],
    block: u64,
    words: [u64; 4],
    next: usize,
}

impl<'a> Stream<'a> {
    fn new(seed: &'a [u8]) -> Stream<'a> {
        Stream {
            seed,
            block: 0,
            words: [0; 4],
            next: 4,
        }
    }

    fn word(&mut self) -> u64 {
        if self.next == 4 {
            let mut ctx = digest::Context::new(&digest::SHA256);
            ctx.update(self.seed);
            ctx.update(&self.block.to_be_bytes());
            let d = ctx.finish();
            for (i, w) in d.as_ref().chunks_exact(8).enumerate() {
                self.words[i] = u64::from_be_bytes(w.try_into().unwrap_or([0; 8]));
            }
            self.block += 1;
            self.next = 0;
        }
        let w = self.words[self.next];
        self.next += 1;
        w
    }

    /// A uniform integer below `bound` (> 0), by rejection.
    fn below(&mut self, bound: u64) -> u64 {
        // r = 2^64 mod bound, computed without 2^64: (2^64 - bound) mod bound. Words from
        // 2^64 - r on would make the low results likelier; with r = 0 none are rejected.
        let r = 0u64.wrapping_sub(bound) % bound;
        loop {
            let w = self.word();
            if r == 0 || w < 0u64.wrapping_sub(r) {
                return w % bound;
            }
        }
    }
}

/// The draw's order: `entrants` (any order; sorted here) shuffled by `seed`. Index 0 goes first.
pub fn order(seed: &[u8], entrants: &[u64]) -> Vec<u64> {
    let mut users = entrants.to_vec();
    users.sort_unstable();
    users.dedup();
    let mut stream = Stream::new(seed);
    for i in (1..users.len()).rev() {
        let j = stream.below(i as u64 + 1) as usize;
        users.swap(i, j);
    }
    users
}

/// Each entrant's new place: the draw's order over the entrants' own seqs, smallest first.
/// `entrants` are (user, seq) pairs.
pub fn places(seed: &[u8], entrants: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let users: Vec<u64> = entrants.iter().map(|(u, _)| *u).collect();
    let mut seqs: Vec<u64> = entrants.iter().map(|(_, s)| *s).collect();
    seqs.sort_unstable();
    order(seed, &users).into_iter().zip(seqs).collect()
}

/// Checks an admin export of a draw (`{commitment, seed, entrants, order}`): the seed is the one
/// committed to, and the order is the one the seed gives the entrants. Answers a one-line
/// summary, or what does not hold.
pub fn verify_export(json: &[u8]) -> Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let text = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("`{k}` missing (the draw has not run?)"))
    };
    let ids = |k: &str| -> Result<Vec<u64>, String> {
        v[k].as_array()
            .ok_or_else(|| format!("`{k}` missing"))?
            .iter()
            .map(|x| x.as_u64().ok_or_else(|| format!("`{k}` holds a non-id")))
            .collect()
    };
    let (commitment_given, seed_hex) = (text("commitment")?, text("seed")?);
    let seed = unhex(&seed_hex).ok_or("`seed` is not hex")?;
    if commitment(&seed) != commitment_given.to_ascii_lowercase() {
        return Err(format!(
            "the seed does not match the commitment: SHA-256(seed) = {}, committed {commitment_given}",
            commitment(&seed)
        ));
    }
    let (entrants, given) = (ids("entrants")?, ids("order")?);
    let computed = order(&seed, &entrants);
    if computed != given {
        let at = computed.iter().zip(&given).position(|(a, b)| a != b);
        return Err(format!(
            "the order differs from the one the seed gives ({} vs {} entries; first difference at index {at:?})",
            given.len(),
            computed.len()
        ));
    }
    Ok(format!(
        "ok: the seed matches the commitment {commitment_given}; the order of the {} entrants follows from it ({ALGORITHM})",
        entrants.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_come_from_the_secret_and_survive_a_rotation() {
        use crate::token::TokenKeys;
        let old = DrawKeys::from_token_keys(&TokenKeys::new(&[1u8; 32], None));
        let seed = old.seed("LIMITED_DROP:42", "00ff");
        assert_eq!(seed, old.seed("LIMITED_DROP:42", "00ff"), "deterministic");
        assert_ne!(seed, old.seed("LIMITED_DROP:43", "00ff"), "per sale");
        assert_ne!(seed, old.seed("LIMITED_DROP:42", "00fe"), "per nonce");
        let other = DrawKeys::from_token_keys(&TokenKeys::new(&[2u8; 32], None));
        assert_ne!(seed, other.seed("LIMITED_DROP:42", "00ff"), "per secret");
        let c = commitment(&seed);
        assert_eq!(
            old.committed_seed("LIMITED_DROP:42", "00ff", &c),
            Some(seed)
        );
        assert_eq!(other.committed_seed("LIMITED_DROP:42", "00ff", &c), None);
        let rotated = DrawKeys::from_token_keys(&TokenKeys::new(&[2u8; 32], Some(&[1u8; 32])));
        assert_eq!(
            rotated.committed_seed("LIMITED_DROP:42", "00ff", &c),
            Some(seed),
            "the previous secret still honours a commitment made with it"
        );
    }

    #[test]
    fn the_commitment_is_the_sha256_of_the_seed() {
        // SHA-256 of 32 zero bytes.
        assert_eq!(
            commitment(&[0u8; 32]),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        assert_eq!(unhex(&hex(&[1, 171, 255])), Some(vec![1, 171, 255]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn the_order_depends_on_the_seed_and_the_entrants_only() {
        let seed = [7u8; 32];
        let a = order(&seed, &[5, 1, 9, 3, 7]);
        let b = order(&seed, &[9, 7, 5, 3, 1]);
        assert_eq!(a, b, "arrival order does not matter");
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 3, 5, 7, 9]);
        assert_ne!(order(&[8u8; 32], &[5, 1, 9, 3, 7]), a);
        assert_eq!(order(&seed, &[]), Vec::<u64>::new());
        assert_eq!(order(&seed, &[4]), vec![4]);
        let p = places(&seed, &[(9, 1), (5, 2), (7, 3)]);
        let seqs: Vec<u64> = p.iter().map(|(_, s)| *s).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
    }

    /// Every entrant is equally likely at every place: a chi-square test per place over 60,000
    /// draws of 6 entrants (5 degrees of freedom each; 25.7 is the 0.01 % critical value).
    #[test]
    fn every_place_is_uniform_over_the_entrants() {
        let n = 6usize;
        let draws = 60_000u32;
        let mut counts = vec![vec![0u32; n]; n];
        let entrants: Vec<u64> = (1..=n as u64).collect();
        for d in 0..draws {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&d.to_be_bytes());
            for (place, user) in order(&seed, &entrants).into_iter().enumerate() {
                counts[place][user as usize - 1] += 1;
            }
        }
        let expected = f64::from(draws) / n as f64;
        for (place, row) in counts.iter().enumerate() {
            let chi2: f64 = row
                .iter()
                .map(|c| (f64::from(*c) - expected).powi(2) / expected)
                .sum();
            assert!(
                chi2 < 25.7,
                "place {place}: chi-square {chi2:.1} over {row:?}"
            );
        }
    }

    #[test]
    fn an_export_is_verified_and_a_forged_one_is_not() {
        let seed = [9u8; 32];
        let entrants: Vec<u64> = (1..=50).collect();
        let good = serde_json::json!({
            "commitment": commitment(&seed),
            "seed": hex(&seed),
            "entrants": entrants,
            "order": order(&seed, &entrants),
        });
        assert!(verify_export(good.to_string().as_bytes()).is_ok());
        let mut swapped = good.clone();
        let o = swapped["order"].as_array_mut().unwrap();
        o.swap(0, 1);
        assert!(verify_export(swapped.to_string().as_bytes()).is_err());
        let mut other_seed = good.clone();
        other_seed["seed"] = hex(&[8u8; 32]).into();
        assert!(verify_export(other_seed.to_string().as_bytes())
            .unwrap_err()
            .contains("commitment"));
        assert!(verify_export(b"{}").is_err());
    }

    #[test]
    fn uniform_integers_reject_the_biased_tail() {
        let mut s = Stream::new(&[1u8; 32]);
        for bound in [1u64, 2, 3, 7, 1 << 40, u64::MAX] {
            for _ in 0..100 {
                assert!(s.below(bound) < bound);
            }
        }
    }
}
