//! The fingerprint index: for a segment's or chunk's fingerprint, the stored units that hold
//! a copy of it, newest first. A backup looks a buffer's fingerprints up in one batch
//! (`Store::lookup_pin`), a commit records the copies it wrote and forgets the ones it freed,
//! and `check` verifies every entry.
//!
//! Two implementations. The exact index keeps one RocksDB record per fingerprint
//! ([`full::FullIndex`]): commits maintain it, `check` verifies it, and by default backups
//! look up there. The sampled, progressive index of "Rethinking Deduplication Scalability"
//! ([`sampled::SampledIndex`], `Store::use_sampled_index`) keeps a sample of it in memory
//! and, on a hit, the neighbourhood of the unit found, so a backup's lookups are served from
//! memory however large the store grows.

pub mod full;
pub mod sampled;

pub use full::{decode_copies, FullIndex};
pub use sampled::{SampledIndex, SampledStats};

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
