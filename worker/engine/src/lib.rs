//! Revault's deduplication engine: plain Rust with no server dependencies.
//!
//! A [`Store`] holds series of versions. A backup ([`backup`]) chunks its
//! input with content-defined chunking, groups chunks into segments,
//! deduplicates whole segments (or single chunks) against the store, packs new
//! data into compressed, checksummed containers, and commits a recipe.
//! [`restore()`] streams a version back through a forward assembly area;
//! [`slide`], [`expire`], [`gc`] and [`check`] maintain the store. See
//! `docs/architecture.md` for the design as built (its "Code map" names the
//! room of each algorithm).
//!
//! The rooms are private: everything a caller may use is listed below. One
//! door is wider than the rest: [`Store::meta`] gives the object API the
//! metadata database itself ([`Meta`], [`Batch`]), so its buckets can live in
//! their own column family beside the engine's records; a change to `Meta`'s
//! methods reaches that crate too.

mod bufpool;
mod config;
mod error;
mod format;
#[doc(hidden)]
pub mod fuzzing;
mod index;
mod ingest;
mod maintenance;
mod meta;
mod progress;
mod recipe;
mod restore;
mod scale;
mod source;
mod store;

// Opening a store, and what every call can fail with.
pub use error::{panicked, Error, ErrorKind, IoContext, Result};
// What the sampled fingerprint index holds (`Store::sampled_index_stats`).
pub use index::SampledStats;
// The sampled index's scale benchmark (`revault-bench index`): a tool's door, not an API.
#[doc(hidden)]
pub use scale::{bench_index, IndexBenchOptions, IndexBenchPoint, IndexBenchReport};
pub use store::domain::{domain_tag, DedupDomain};
pub use store::{
    check_series_name, now_unix, ColdTier, InitOptions, OnSealed, OpenMode, PauseHook, ReadView,
    Store, VersionSel, META_DIR,
};

// A store's settings.
pub use config::{Compression, DedupUnit, RewriteSettings, SizeRange, StoreConfig, KIB, MIB};

// Backing up: sources of bytes and the backup itself.
pub use ingest::chunker::Chunker;
pub use ingest::{backup, BackupOptions, BackupReport, CommitHook};
pub use progress::Progress;
pub use source::tree::{extract_tar, TreeSource, TreeWriter};
pub use source::{input_error, CancelledInput, Source, StreamSource};

// Restoring: the caches, and the block transfer protocol of `pull`.
pub use restore::cache::CachePolicy;
pub use restore::{restore, transfer, RestoreOptions, RestoreReport, RestoreTarget};

// Maintenance: retention, reverse dedup (slide), expiry, garbage collection, checks.
pub use maintenance::auto::apply_auto;
pub use maintenance::check::{check, CheckReport};
pub use maintenance::expire::{expire, ExpireReport, ExpireSel};
pub use maintenance::gc::{gc, GcOptions, GcReport};
pub use maintenance::repeats::{repeats, RepeatReport};
pub use maintenance::retention::{auto_or_current, plan_expiry, set_retention};
pub use maintenance::seal::set_moved_to;
pub use maintenance::slide::{slide, SlideReport};
pub use maintenance::tiering::live_containers;
pub use store::orphans::{OrphanReport, QUARANTINE};

// What is stored: records, their keys, and the formats the object API shares.
pub use bufpool::BufPool;
pub use format::container::{ColdFile, ContainerId};
pub use format::fp::Fp;
pub use format::records::{
    Calendar, RecipeForm, Retention, SeriesRecord, Totals, VersionKind, VersionRecord,
};
pub use format::{catalog, keys};
pub use meta::{Batch, Meta, MetaRead};

/// The tar helpers the object API shares with the tar reader.
pub mod tar {
    pub use crate::source::tar::{header_sum, pad, TarSource};
}
