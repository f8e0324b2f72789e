//! faultfs: a FUSE filesystem that records every change made to it, so that a
//! test can see what a power cut after any operation would have left.
//!
//! A test mounts it ([`Mount::new`]), runs a real program on it, notes
//! [`Mount::position`] whenever the program acknowledges something, then
//! unmounts and, for each cut it chooses, [`Recording::materialise`]s the
//! surviving files into an ordinary directory to check them there.
//!
//! Files live in memory as copy-on-write blocks: every fsync keeps a snapshot
//! of the file (or of the directory's entries) at the cost of a block-list
//! clone, and any cut is then a walk over the last snapshots before it, with
//! nothing replayed and nothing read back from a disk. A passthrough to a real
//! directory would have needed a copy of the file at every fsync, or a replay
//! of the whole write log for every cut. Memory is what the program writes
//! (tens of MiB in the store's power-loss test).
//!
//! What survives is the strictest POSIX allows: see [`model`].

mod content;
mod fuse;
pub mod model;
mod mount;

pub use model::{Op, OpKind};
pub use mount::{unavailable, Mount, Recording};
