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
pub mod seal;
pub mod slide;
pub mod tiering;

use crate::format::keys::{version_key, CF_VERSIONS};
use crate::format::records::VersionRecord;
use crate::recipe::archival::{refs_to_recipe, Ref};
use crate::store::commit::Txn;

/// Stages `refs` as the recipe of version `old` of series `series`, replacing its parts, and
/// `rec` (the version's record with whatever else changed) as its record; the store's recipe
/// bytes move by the difference. Expiry's splice and the slide's archival recipe both end so.
fn stage_recipe(
    txn: &mut Txn,
    series: u32,
    old: &VersionRecord,
    mut rec: VersionRecord,
    refs: &[Ref],
) {
    let parts = refs_to_recipe(refs).finish();
    let (n, bytes) = txn.replace_recipe_parts(series, old.number, parts);
    rec.recipe_parts = n;
    rec.recipe_bytes = bytes;
    txn.totals.recipe_bytes += bytes as i64 - old.recipe_bytes as i64;
    txn.put_json(CF_VERSIONS, &version_key(series, old.number), &rec);
}
