//! Restore caches other than the forward assembly area (see `restore::faa`).
//! All of them read real containers and decode real blocks; they differ in
//! what they keep in memory between container reads, under one budget.
//!
//! - `lru-container`: whole decoded containers, least recently used out;
//! - `lru-chunk`: the chunks of every container read, least recently used out
//!   (one container's decode buffer is held while it is read);
//! - `dasm`: Tan et al.'s Dynamic Adaptive Forward Assembly Area: an
//!   assembly area and a container cache share the budget, re-split every
//!   round from the recipe ahead (see `dasm.rs`, which also says where we
//!   depart from the paper and why);
//! - `opt`: Belady's optimal container cache with full look-ahead (evict the
//!   container used farthest in the future): the papers' yardstick;
//! - `auto` (the default): counts, on the recipe and before reading anything,
//!   the container reads `faa` and `opt` would make and runs the cheaper one.
//!   Neither wins everywhere: `opt` reads 33% fewer containers than `faa` on
//!   the kube series' latest version, `faa` 5× fewer than `opt` on a synthetic
//!   series whose chunks are scattered over every version's containers
//!   (docs/benchmarks.md).
//!
//! Every engine reports the most memory it held (`peak_bytes`), which never
//! exceeds its budget.

mod auto;
mod dasm;
mod io;
mod lru;
mod opt;

pub(crate) use auto::choose;
pub(crate) use io::{next_uses, out_err, write_zeros, CacheStats, Loader};

use std::io::Write;

use crate::error::{Error, Result};
use crate::recipe::archival::Loc;
use crate::store::Store;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Forward assembly area (parallel container reads per window).
    Faa,
    LruContainer,
    LruChunk,
    Dasm,
    /// Belady: a restore knows its whole recipe before it reads anything, so
    /// the optimal eviction is not hypothetical here.
    Opt,
    /// The default: `faa` or `opt`, whichever the recipe says reads fewer
    /// containers (see [`choose`]).
    #[default]
    Auto,
}

impl CachePolicy {
    /// The cache engines (what the benchmarks compare); `auto` runs one of them.
    pub const ALL: [CachePolicy; 5] = [
        CachePolicy::LruContainer,
        CachePolicy::LruChunk,
        CachePolicy::Faa,
        CachePolicy::Dasm,
        CachePolicy::Opt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Faa => "faa",
            CachePolicy::LruContainer => "lru-container",
            CachePolicy::LruChunk => "lru-chunk",
            CachePolicy::Dasm => "dasm",
            CachePolicy::Opt => "opt",
            CachePolicy::Auto => "auto",
        }
    }
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CachePolicy::ALL
            .into_iter()
            .chain([CachePolicy::Auto])
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "cache {s:?}: expected auto, faa, lru-container, lru-chunk, dasm or opt"
                ))
            })
    }
}

/// A restore cache: reads a version's chunk locations, container by container, into `out`
/// without holding more than `budget` bytes. FAA is not one: it streams the recipe's extents
/// instead of resolving every location first (`restore::faa`).
pub(crate) type CacheEngine =
    fn(store: &Store, locs: &[Loc], budget: u64, out: &mut dyn Write) -> Result<CacheStats>;

/// The engine that runs `policy`; `None` for `faa` and `auto`, which the restore runs itself.
pub(crate) fn engine(policy: CachePolicy) -> Option<CacheEngine> {
    match policy {
        CachePolicy::LruContainer => Some(lru::container),
        CachePolicy::LruChunk => Some(lru::chunk),
        CachePolicy::Dasm => Some(dasm::run),
        CachePolicy::Opt => Some(opt::run),
        CachePolicy::Faa | CachePolicy::Auto => None,
    }
}

pub(crate) fn run(
    store: &Store,
    policy: CachePolicy,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
    match engine(policy) {
        Some(run) => run(store, locs, budget, out),
        None => Err(Error::Invalid(format!(
            "the {policy} cache is run by the restore itself"
        ))),
    }
}
