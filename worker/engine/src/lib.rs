//! Revault's deduplication engine: plain Rust with no server dependencies.
//!
//! A [`store::Store`] holds series of versions. A backup ([`backup::backup`])
//! chunks its input with content-defined chunking, groups chunks into segments,
//! deduplicates whole segments (or single chunks) against the store, packs new
//! data into compressed, checksummed containers, and commits a recipe.
//! [`restore::restore`] streams a version back through a forward assembly
//! area. See `docs/architecture.md` for the design as built.

pub mod auto_retention;
pub mod backup;
pub mod bufpool;
pub mod caches;
pub mod check;
pub mod chunker;
pub mod config;
mod dasm;
pub mod error;
pub mod expire;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub mod gc;
pub mod index;
pub mod meta;
pub mod objects;
mod predict;
pub mod progress;
pub mod recipe;
pub mod repeats;
pub mod restore;
pub mod retention;
pub mod reuse;
pub mod rewrite;
pub mod slide;
pub mod source;
pub mod store;
pub mod tarsource;
pub mod transfer;
pub mod tree;

pub use error::{Error, Result};

// The modules' old paths, until the crate surface is curated (issue 19).
#[doc(hidden)]
pub use format::{catalog, codec, container, fp};
#[doc(hidden)]
pub use store::{commit, lock, orphans, pack};
