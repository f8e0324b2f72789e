//! Reading metadata records, from the live database or a snapshot.

use crate::config::StoreConfig;
use crate::error::{corrupt_meta, Error, Result};
use crate::format::container::ContainerId;
use crate::format::keys::{
    refs_block_key, version_key, CF_CONTAINERS, CF_REFCOUNTS, CF_REFS, CF_SERIES, CF_UNITS,
    CF_VERSIONS, CONFIG_KEY, COUNTERS_KEY, TOTALS_KEY,
};
use crate::format::records::{
    decode_version, ContainerRecord, Counters, SeriesRecord, Totals, VersionRecord,
};
use crate::format::refcounts::{Refs, RefsBlock, REFS_BLOCK};
use crate::format::unit::UnitRecord;
use crate::meta::Meta;

/// Reads metadata: from the live database, or from a snapshot ([`crate::store::ReadView`])
/// so that a long reader sees one consistent store while writers commit.
pub trait MetaRead {
    fn get_raw(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn multi_get_raw(&self, cf: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>>;
    fn scan(&self, cf: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Values of the records keyed by these ids (big-endian), in `ids` order.
    fn get_ids_raw(&self, cf: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|i| i.to_be_bytes().to_vec()).collect();
        self.multi_get_raw(cf, &keys)
    }

    fn config(&self) -> Result<Option<StoreConfig>> {
        match self.get_raw("default", CONFIG_KEY)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt_meta("store config", e.to_string())),
        }
    }

    fn counters(&self) -> Result<Counters> {
        match self.get_raw("default", COUNTERS_KEY)? {
            None => Ok(Counters::default()),
            Some(v) => Counters::decode(&v),
        }
    }

    fn totals(&self) -> Result<Totals> {
        match self.get_raw("default", TOTALS_KEY)? {
            None => Ok(Totals::default()),
            Some(v) => {
                serde_json::from_slice(&v).map_err(|e| corrupt_meta("store totals", e.to_string()))
            }
        }
    }

    fn series(&self, name: &str) -> Result<Option<SeriesRecord>> {
        match self.get_raw(CF_SERIES, name.as_bytes())? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt_meta(format!("series {name}"), e.to_string())),
        }
    }

    fn all_series(&self) -> Result<Vec<SeriesRecord>> {
        self.series_with_prefix(b"")
    }

    /// The series whose names start with `prefix` (`b"ns/"`: a namespace's).
    fn series_with_prefix(&self, prefix: &[u8]) -> Result<Vec<SeriesRecord>> {
        self.scan(CF_SERIES, prefix)?
            .into_iter()
            .map(|(k, v)| {
                serde_json::from_slice(&v).map_err(|e| {
                    corrupt_meta(
                        format!("series {}", String::from_utf8_lossy(&k)),
                        e.to_string(),
                    )
                })
            })
            .collect()
    }

    fn version(&self, series: &SeriesRecord, v: u32) -> Result<Option<VersionRecord>> {
        match self.get_raw(CF_VERSIONS, &version_key(series.id, v))? {
            None => Ok(None),
            Some(b) => decode_version(&series.name, v, &b).map(Some),
        }
    }

    fn versions(&self, series: &SeriesRecord) -> Result<Vec<VersionRecord>> {
        self.scan(CF_VERSIONS, &series.id.to_be_bytes())?
            .into_iter()
            .map(|(k, b)| {
                let v = u32::from_be_bytes(k[4..8].try_into().unwrap());
                decode_version(&series.name, v, &b)
            })
            .collect()
    }

    fn unit(&self, id: u64) -> Result<Option<UnitRecord>> {
        match self.get_raw(CF_UNITS, &id.to_be_bytes())? {
            None => Ok(None),
            Some(b) => UnitRecord::decode(id, &b).map(Some),
        }
    }

    fn refs(&self, id: u64) -> Result<Refs> {
        let block = self.refs_blocks(&[id / REFS_BLOCK])?.pop().flatten();
        Ok(block.map(|b| b.get(id)).unwrap_or_default())
    }

    /// [`MetaRead::refs`] for many ids, each block of counts read once.
    fn refs_many(&self, ids: &[u64]) -> Result<Vec<Refs>> {
        let mut blocks: Vec<u64> = ids.iter().map(|id| id / REFS_BLOCK).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let read = self.refs_blocks(&blocks)?;
        Ok(ids
            .iter()
            .map(|id| {
                let i = blocks.binary_search(&(id / REFS_BLOCK)).expect("listed");
                read[i].as_ref().map(|b| b.get(*id)).unwrap_or_default()
            })
            .collect())
    }

    /// The stored blocks of reference counts (see [`RefsBlock`]), in `blocks`
    /// order; `None` for a block with no counts.
    fn refs_blocks(&self, blocks: &[u64]) -> Result<Vec<Option<RefsBlock>>> {
        let keys: Vec<Vec<u8>> = blocks.iter().map(|b| refs_block_key(*b).to_vec()).collect();
        self.multi_get_raw(CF_REFCOUNTS, &keys)?
            .into_iter()
            .zip(blocks)
            .map(|(v, &b)| v.map(|v| RefsBlock::decode(b, &v)).transpose())
            .collect()
    }

    fn container(&self, id: ContainerId) -> Result<Option<ContainerRecord>> {
        match self.get_raw(CF_CONTAINERS, &id.0.to_be_bytes())? {
            None => Ok(None),
            Some(b) => ContainerRecord::decode(id, &b).map(Some),
        }
    }

    /// [`MetaRead::unit`] for many ids in one batched read.
    fn units_many(&self, ids: &[u64]) -> Result<Vec<Option<UnitRecord>>> {
        self.get_ids_raw(CF_UNITS, ids)?
            .into_iter()
            .zip(ids)
            .map(|(v, &id)| v.map(|b| UnitRecord::decode(id, &b)).transpose())
            .collect()
    }
}

impl MetaRead for Meta {
    fn get_raw(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get(cf, key)
    }

    fn multi_get_raw(&self, cf: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        self.multi_get(cf, keys)
    }

    fn scan(&self, cf: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.scan_prefix(cf, prefix)
    }

    /// Many ids are read in id order with an iterator: it steps over short
    /// gaps and seeks past long ones. A step costs a fraction of a point
    /// lookup and a seek about one, and the ids a backup or a restore reads
    /// come in long runs (a version's units are allocated together), so this
    /// is several times cheaper per key than a batched point lookup, which
    /// remains for a few ids.
    fn get_ids_raw(&self, cf: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        if ids.len() < 64 {
            let keys: Vec<Vec<u8>> = ids.iter().map(|i| i.to_be_bytes().to_vec()).collect();
            return self.multi_get(cf, &keys);
        }
        let in_order = ids.windows(2).all(|w| w[0] < w[1]);
        let mut order = ids.to_vec();
        if !in_order {
            order.sort_unstable();
            order.dedup();
        }
        let vals = self.walk_ids(cf, &order)?;
        if in_order {
            return Ok(vals);
        }
        Ok(ids
            .iter()
            .map(|id| {
                let i = order.binary_search(id).expect("every id is in the order");
                vals[i].clone()
            })
            .collect())
    }
}

/// Every unit's stored counts: the blocks, and the per-unit records of a
/// format-1 store not yet upgraded (a read-only command may read one). A
/// record that does not decode goes to `bad` and is skipped.
pub fn scan_refs(r: &impl MetaRead, mut bad: impl FnMut(Error)) -> Result<Vec<(u64, Refs)>> {
    let mut out = Vec::new();
    let key = |k: &[u8]| {
        k.try_into()
            .map(u64::from_be_bytes)
            .map_err(|_| corrupt_meta("reference counts", "a key of the wrong length"))
    };
    for (k, v) in r.scan(CF_REFCOUNTS, b"")? {
        match key(&k).and_then(|n| Ok((n, RefsBlock::decode(n, &v)?))) {
            Ok((n, b)) => out.extend(b.units(n)),
            Err(e) => bad(e),
        }
    }
    for (k, v) in r.scan(CF_REFS, b"")? {
        match key(&k).and_then(|id| Ok((id, Refs::decode(id, &v)?))) {
            Ok(x) => out.push(x),
            Err(e) => bad(e),
        }
    }
    Ok(out)
}

/// The records of units a recipe names, which must exist.
pub(crate) fn load_units(r: &impl MetaRead, ids: &[u64]) -> Result<Vec<UnitRecord>> {
    ids.iter()
        .zip(r.units_many(ids)?)
        .map(|(&id, u)| referenced(id, u))
        .collect()
}

/// A unit a recipe names, which must exist.
pub(crate) fn referenced<T>(id: u64, u: Option<T>) -> Result<T> {
    u.ok_or_else(|| corrupt_meta(format!("unit {id}"), "referenced by a recipe but missing"))
}
