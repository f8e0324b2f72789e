//! The exact index: every fingerprint's copy list in the `index` column family, keyed by
//! [`index_key`] (a kind byte and the fingerprint), the list as big-endian unit ids.

use crate::config::DedupUnit;
use crate::error::{corrupt_meta, Result};
use crate::format::fp::Fp;
use crate::format::keys::{index_key, CF_INDEX};
use crate::index::FingerprintIndex;
use crate::meta::{Batch, MetaRead};

/// Copies of one fingerprint kept in the index at most.
pub const MAX_COPIES: usize = 4;

/// The exact index over the metadata store (the live database or a snapshot).
pub struct FullIndex<'a, R: MetaRead + ?Sized>(pub &'a R);

impl<R: MetaRead + ?Sized> FingerprintIndex for FullIndex<'_, R> {
    fn copies(&self, kind: DedupUnit, fp: &Fp) -> Result<Vec<u64>> {
        match self.0.get_raw(CF_INDEX, &index_key(kind, fp))? {
            None => Ok(Vec::new()),
            Some(b) => decode_entry(fp, &b),
        }
    }

    fn copies_many(&self, kind: DedupUnit, fps: &[Fp]) -> Result<Vec<Vec<u64>>> {
        let keys: Vec<Vec<u8>> = fps.iter().map(|fp| index_key(kind, fp).to_vec()).collect();
        self.0
            .multi_get_raw(CF_INDEX, &keys)?
            .into_iter()
            .zip(fps)
            .map(|(v, fp)| match v {
                None => Ok(Vec::new()),
                Some(b) => decode_entry(fp, &b),
            })
            .collect()
    }
}

/// Makes `unit` the newest copy in `list`, keeping at most [`MAX_COPIES`].
pub fn add_copy(list: &mut Vec<u64>, unit: u64) {
    list.retain(|c| *c != unit);
    list.insert(0, unit);
    list.truncate(MAX_COPIES);
}

/// Stores the copies of `fp` (newest first) in `b`; an empty list deletes the entry.
pub fn stage(b: &mut Batch<'_>, kind: DedupUnit, fp: &Fp, copies: &[u64]) {
    if copies.is_empty() {
        b.delete(CF_INDEX, &index_key(kind, fp));
    } else {
        let v: Vec<u8> = copies.iter().flat_map(|c| c.to_be_bytes()).collect();
        b.put(CF_INDEX, &index_key(kind, fp), &v);
    }
}

fn decode_entry(fp: &Fp, b: &[u8]) -> Result<Vec<u64>> {
    decode_copies(b).ok_or_else(|| corrupt_meta(format!("index entry {fp}"), "bad length"))
}

/// A stored copy list, or `None` when its length is not a whole number of ids.
pub fn decode_copies(b: &[u8]) -> Option<Vec<u64>> {
    if b.is_empty() || !b.len().is_multiple_of(8) {
        return None;
    }
    Some(
        b.chunks(8)
            .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
            .collect(),
    )
}
