//! Repeats: chunk data a store holds more than once, i.e. what it stores
//! beyond exact chunk-level dedup, and where those copies sit.
//!
//! Chunk-mode series store each fingerprint once (rewrite policies aside);
//! segment-mode series keep the live window's segments whole, so a chunk that
//! occurs in several of the latest version's new segments is stored in each
//! (near links catch repeats within a container's worth of new data; reverse
//! dedup removes an archived version's copies of chunks the next version
//! holds). This report measures that gap on a real store
//! (`revault stats --repeats`): one pass over the unit table and the
//! reference counts, holding one entry per distinct stored fingerprint.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use crate::error::{corrupt_meta, Result};
use crate::format::keys::CF_UNITS;
use crate::format::unit::UnitRecord;
use crate::meta::scan_refs;
use crate::store::Store;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepeatReport {
    /// Chunk bytes stored in units (uncompressed; links and absent chunks
    /// hold none).
    pub stored_bytes: u64,
    /// Stored bytes of chunks whose fingerprint an earlier stored chunk (in
    /// unit order) already has: what exact chunk dedup would not store.
    pub repeat_bytes: u64,
    /// Repeat bytes in units that some live version references whole.
    pub repeat_bytes_in_live_units: u64,
    /// Repeat bytes whose earlier copy is in the same unit (a chunk repeated
    /// inside one segment).
    pub repeat_bytes_same_unit: u64,
    /// Repeat bytes of fingerprints stored 2, 3, 4–5 and 6 or more times.
    pub repeat_bytes_by_copies: [u64; 4],
    pub distinct_chunks: u64,
}

impl RepeatReport {
    /// Stored bytes over what exact chunk dedup would store (1.0: none repeated).
    pub fn excess_ratio(&self) -> f64 {
        let exact = self.stored_bytes - self.repeat_bytes;
        if exact == 0 {
            1.0
        } else {
            self.stored_bytes as f64 / exact as f64
        }
    }
}

pub fn repeats(store: &Store) -> Result<RepeatReport> {
    let meta = store.meta();
    let mut live: FxHashSet<u64> = FxHashSet::default();
    let mut bad = None;
    for (id, r) in scan_refs(meta, |e| {
        bad.get_or_insert(e);
    })? {
        if r.live > 0 {
            live.insert(id);
        }
    }
    if let Some(e) = bad {
        return Err(e);
    }
    let mut rep = RepeatReport::default();
    // Per fingerprint: copies stored, the unit of the latest copy, and the
    // bytes its repeats take (to bucket by copy count at the end).
    let mut seen: FxHashMap<crate::format::fp::Fp, (u32, u64, u64)> = FxHashMap::default();
    meta.for_each_prefix(CF_UNITS, b"", |k, v| {
        let id = unit_id(k)?;
        let u = UnitRecord::decode(id, v)?;
        for c in &u.chunks {
            let n = c.stored_len();
            if n == 0 {
                continue;
            }
            rep.stored_bytes += n;
            let e = seen.entry(c.fp).or_insert((0, u64::MAX, 0));
            if e.0 > 0 {
                rep.repeat_bytes += n;
                e.2 += n;
                if live.contains(&id) {
                    rep.repeat_bytes_in_live_units += n;
                }
                if e.1 == id {
                    rep.repeat_bytes_same_unit += n;
                }
            }
            e.0 += 1;
            e.1 = id;
        }
        Ok(true)
    })?;
    rep.distinct_chunks = seen.len() as u64;
    for (copies, _, bytes) in seen.into_values() {
        let bucket = match copies {
            0 | 1 => continue,
            2 => 0,
            3 => 1,
            4 | 5 => 2,
            _ => 3,
        };
        rep.repeat_bytes_by_copies[bucket] += bytes;
    }
    Ok(rep)
}

fn unit_id(key: &[u8]) -> Result<u64> {
    key.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| corrupt_meta("unit table", format!("a key of {} bytes", key.len())))
}
