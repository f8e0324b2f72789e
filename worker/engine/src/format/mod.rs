//! What Revault writes, byte for byte: the encodings of containers, recipes, catalogs and the
//! small records in the metadata store. Nothing here reads or writes the metadata store; the
//! rooms above do (`container` writes and reads its own files). docs/format.md describes the
//! same for readers of the disk.

pub mod catalog;
pub mod codec;
pub mod container;
pub mod fp;
pub mod keys;
pub mod recipe;
pub mod records;
pub mod refcounts;
pub mod unit;
