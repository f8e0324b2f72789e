//! Fingerprints: BLAKE3 of a chunk's bytes; a segment's fingerprint is the
//! BLAKE3 of its chunks' fingerprints, so data bytes are hashed exactly once.

use std::fmt;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fp(pub [u8; 32]);

impl Fp {
    pub const LEN: usize = 32;

    pub fn of(data: &[u8]) -> Fp {
        Fp(*blake3::hash(data).as_bytes())
    }

    /// Fingerprint of a segment from the fingerprints of its chunks, in order.
    /// Chunk lengths are implied by the chunk fingerprints.
    pub fn of_segment<'a>(chunks: impl IntoIterator<Item = &'a Fp>) -> Fp {
        let mut h = blake3::Hasher::new();
        h.update(b"revault-segment-v1");
        for c in chunks {
            h.update(&c.0);
        }
        Fp(*h.finalize().as_bytes())
    }

    /// The fingerprint a unit of dedup domain `domain` is indexed under: its own for domain 0
    /// (no domains), otherwise a keyed hash of it, so that each domain has its own copy lists
    /// in the index: another domain's copies neither crowd a domain's out of a list nor show
    /// up in its lookups (see `store::domain`).
    pub fn in_domain(&self, domain: u64) -> Fp {
        if domain == 0 {
            return *self;
        }
        let mut h = blake3::Hasher::new_derive_key("revault dedup domain index v1");
        h.update(&domain.to_le_bytes());
        h.update(&self.0);
        Fp(*h.finalize().as_bytes())
    }

    /// The first 8 bytes as an integer: uniformly distributed, used for the
    /// segment-boundary test and for hashing in memory.
    #[inline]
    pub fn prefix_u64(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().unwrap())
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fp({})", &hex::encode(&self.0[..6]))
    }
}

impl fmt::Display for Fp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// True when every byte is zero. Such chunks are never stored.
#[inline]
pub fn is_zero(data: &[u8]) -> bool {
    // Blocks of 256 bytes, each OR-folded (the compiler vectorises the fold);
    // the scan stops at the first block with a bit set, which for real data is
    // nearly always the first: scanning every chunk whole cost a tenth of the
    // hashing stage.
    data.chunks(256)
        .all(|b| b.iter().fold(0u8, |acc, &x| acc | x) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_fp_depends_on_order_and_content() {
        let a = Fp::of(b"a");
        let b = Fp::of(b"b");
        assert_ne!(Fp::of_segment([&a, &b]), Fp::of_segment([&b, &a]));
        assert_eq!(Fp::of_segment([&a, &b]), Fp::of_segment([&a, &b]));
        assert_ne!(Fp::of_segment([&a]), a);
    }

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[]));
        assert!(is_zero(&vec![0u8; 10_001]));
        let mut v = vec![0u8; 10_001];
        v[10_000] = 1;
        assert!(!is_zero(&v));
        v[10_000] = 0;
        v[3] = 1;
        assert!(!is_zero(&v));
    }
}
