//! Revault's deduplication engine: plain Rust with no server dependencies.
//!
//! A [`store::Store`] holds series of versions. A backup ([`backup::backup`])
//! chunks its input with content-defined chunking, groups chunks into segments,
//! deduplicates whole segments (or single chunks) against the store, packs new
//! data into compressed, checksummed containers, and commits a recipe.
//! [`restore::restore`] streams a version back through a forward assembly
//! area. See `docs/architecture.md` for the design as built.

pub mod bufpool;
pub mod config;
pub mod error;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod index;
pub mod ingest;
pub mod maintenance;
pub mod meta;
pub mod progress;
pub mod recipe;
pub mod restore;
pub mod source;
pub mod store;

pub use error::{Error, Result};

// The modules' old paths, until the crate surface is curated (issue 19).
#[doc(hidden)]
pub use format::{catalog, codec, container, fp};
#[doc(hidden)]
pub use ingest as backup;
#[doc(hidden)]
pub use ingest::{chunker, rewrite};
#[doc(hidden)]
pub use maintenance::{auto as auto_retention, check, expire, gc, repeats, retention, slide};
#[doc(hidden)]
pub use restore::{cache as caches, reuse, transfer};
#[doc(hidden)]
pub use source::{tar as tarsource, tree};
#[doc(hidden)]
pub use store::{commit, lock, orphans, pack};
