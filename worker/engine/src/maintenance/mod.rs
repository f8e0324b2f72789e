//! Keeping the store in shape after backups: retention decides which versions go, the
//! slide moves versions out of the live window (reverse deduplication, RevDedup §2.4), expiry
//! deletes versions by ownership (time proportional to what expires), gc's grouped
//! mark-and-sweep (Efstathopoulos & Guo) reclaims what is left, and check verifies it all.
//! `auto` runs retention after a backup and on the worker's schedule; `repeats` measures
//! how a version repeats itself.

pub mod auto;
pub mod check;
pub mod expire;
pub mod gc;
pub mod repeats;
pub mod retention;
pub mod slide;
