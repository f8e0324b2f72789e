//! What Revault writes, byte for byte: the encodings of containers, recipes, catalogs and the
//! small records in the metadata store. Nothing here does I/O on a store; the rooms above
//! read and write these formats. docs/format.md describes them for readers of the disk.

pub mod catalog;
pub mod codec;
pub mod container;
pub mod fp;
pub mod keys;
pub mod recipe;
pub mod records;
pub mod refcounts;
pub mod unit;
