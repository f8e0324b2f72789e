//! The fingerprint index: for a segment's or chunk's fingerprint, the stored units that hold
//! a copy of it, newest first. A backup looks a buffer's fingerprints up in one batch
//! (`Store::lookup_pin`), a commit records the copies it wrote and forgets the ones it freed,
//! and `check` verifies every entry.
//!
//! The index today is exact and whole: one RocksDB record per fingerprint
//! ([`full::FullIndex`]). The sampled, progressive index of "Rethinking Deduplication
//! Scalability" (Efstathopoulos & Guo, ../shared/papers) is the other implementation this
//! trait is for: a sample of fingerprints in memory, and on a hit the container's whole
//! fingerprint list, so a backup's lookups are served from memory.

pub mod full;

pub use full::{decode_copies, FullIndex};

use crate::config::DedupUnit;
use crate::error::Result;
use crate::format::fp::Fp;

/// Reads the index.
pub trait FingerprintIndex {
    /// The units holding copies of `fp`, newest first (rewriting makes copies; new backups
    /// dedup to the newest unless an older copy serves the current window better).
    fn copies(&self, kind: DedupUnit, fp: &Fp) -> Result<Vec<u64>>;

    /// [`FingerprintIndex::copies`] for many fingerprints in one batched read, in `fps` order.
    fn copies_many(&self, kind: DedupUnit, fps: &[Fp]) -> Result<Vec<Vec<u64>>>;
}
