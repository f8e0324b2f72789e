//! Metadata in RocksDB: one column family per table, typed records, and write
//! batches that commit atomically.
//!
//! | column family | key                              | value                                  |
//! |---------------|----------------------------------|----------------------------------------|
//! | default       | "config", "counters", "totals"   | store config (JSON), id counters, sums |
//! |               | "marks-kept"                     | present once `F` and `Z` keys are kept |
//! |               |                                  | (see `orphans::adopt_untracked`)       |
//! | series        | "ns/name"                        | [`SeriesRecord`] (JSON)                |
//! | versions      | series id, version (BE)          | [`VersionRecord`] (JSON)               |
//! | recipes       | series id, version, part (BE)    | recipe bytes + CRC32C                  |
//! | catalogs      | series id, version, part (BE)    | catalog bytes (zstd) + CRC32C          |
//! | units         | unit id (BE)                     | [`UnitRecord`] (binary + CRC32C)       |
//! | refs          | unit id (BE)                     | format 1 only: one unit's counts       |
//! | refcounts     | block number (BE)                | [`RefsBlock`]: 64 units' counts        |
//! | index         | kind byte, fingerprint           | unit id: where new backups dedup to    |
//! | containers    | container id (BE)                | [`ContainerRecord`] (binary + CRC32C)  |
//! | sessions      | session id (BE)                  | a write session that has not committed |
//! | marks         | gc's bookkeeping, by first byte: | (see `gc.rs` for M, N, G, S)           |
//! |               | `M` unit, group; `N` group, unit | a group's mark of a unit; its members  |
//! |               | `G` group                        | the generation a group was marked at   |
//! |               | `S` container                    | may hold dead data: sweep it           |
//! |               | `F` container                    | freed by a commit (proof for gc that   |
//! |               |                                  | its file may be deleted)               |
//! |               | `Z` unit                         | unreferenced while pinned: gc frees it |

use std::path::Path;
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, BottommostLevelCompaction, Cache, ColumnFamily, ColumnFamilyDescriptor,
    CompactOptions, Direction, FlushOptions, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions, DB,
};
use serde::{Deserialize, Serialize};

use crate::config::{DedupUnit, StoreConfig};
use crate::error::{corrupt_meta, Error, Result};
use crate::format::codec::{open_crc, put_uvarint, seal_crc, Reader};
use crate::format::container::{ChunkEntry, ContainerId};
use crate::format::fp::Fp;

pub const CF_SERIES: &str = "series";
pub const CF_VERSIONS: &str = "versions";
pub const CF_RECIPES: &str = "recipes";
pub const CF_CATALOGS: &str = "catalogs";
pub const CF_UNITS: &str = "units";
/// Per-unit reference counts of a format-1 store, until a read-write open
/// moves them into `refcounts` (empty afterwards).
pub const CF_REFS: &str = "refs";
/// Reference counts in blocks of [`REFS_BLOCK`] units (format 2). A build
/// from before format 2 cannot open a store that has this family (RocksDB
/// refuses to open a store with a column family it does not name), so it
/// cannot misread the counts as zero.
pub const CF_REFCOUNTS: &str = "refcounts";
pub const CF_INDEX: &str = "index";
pub const CF_CONTAINERS: &str = "containers";
pub const CF_SESSIONS: &str = "sessions";
pub const CF_MARKS: &str = "marks";

/// `F`+container in `marks`: a commit freed this container. Its file is
/// unlinked after the commit (or, while a reader may still need it, later);
/// the key is what lets gc delete a file no record names, since a file
/// without one may be the only copy of data whose metadata was lost.
pub fn freed_key(c: ContainerId) -> [u8; 9] {
    prefixed(b'F', c.0)
}

/// `S`+container in `marks`: the container may hold dead data (it lost
/// units, or a unit in it lost its last link); gc's next sweep looks at it.
pub(crate) fn sweep_key(c: ContainerId) -> [u8; 9] {
    prefixed(b'S', c.0)
}

/// `Z`+unit in `marks`: the unit's references reached zero while a backup in
/// flight had it pinned, so the commit could not free it; gc does, even after
/// a restart.
pub fn zombie_key(unit: u64) -> [u8; 9] {
    prefixed(b'Z', unit)
}

/// A `marks` key: a kind byte, then an id (big-endian).
pub(crate) fn prefixed(p: u8, id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = p;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The id in a key made by [`freed_key`] or [`zombie_key`].
pub fn prefixed_id(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.get(1..9)?.try_into().ok()?))
}

/// In the default family: this store records freed containers (`F`) and
/// zombie units (`Z`); a store from before them gets it at its first
/// read-write open (`orphans::adopt_untracked`).
pub const MARKS_KEPT_KEY: &[u8] = b"marks-kept";

/// The key [`Meta::probe_write`] deletes, in the default family; never stored.
const PROBE_KEY: &[u8] = b"probe";

const ALL_CFS: &[&str] = &[
    CF_SERIES,
    CF_VERSIONS,
    CF_RECIPES,
    CF_CATALOGS,
    CF_UNITS,
    CF_REFS,
    CF_REFCOUNTS,
    CF_INDEX,
    CF_CONTAINERS,
    CF_SESSIONS,
    CF_MARKS,
];

pub struct Meta {
    db: Arc<DB>,
    /// Writes what the open recovered from the log to tables (see
    /// [`Meta::open`]); the store does not close before it is done.
    flusher: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Meta {
    fn drop(&mut self) {
        if let Some(t) = self.flusher.get_mut().take() {
            let _ = t.join();
        }
    }
}

fn db_options(cache: &Cache) -> Options {
    let mut o = Options::default();
    // Every CLI command opens the store. RocksDB opens table files on 16
    // threads per column family by default: 160 thread starts, a fifth of the
    // open of a small store. Two keep some parallel reads for a large store
    // on a slow disk.
    o.set_max_file_opening_threads(2);
    o.create_if_missing(false);
    o.create_missing_column_families(true);
    o.increase_parallelism(2);
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    o.set_keep_log_file_num(4);
    o.set_max_total_wal_size(64 << 20);
    // Every CLI command opens the store: do not read every table's statistics.
    o.set_skip_stats_update_on_db_open(true);
    let mut b = BlockBasedOptions::default();
    b.set_block_cache(cache);
    b.set_bloom_filter(10.0, false);
    b.set_cache_index_and_filter_blocks(true);
    o.set_block_based_table_factory(&b);
    o
}

/// Small tables a column family's bottom level may hold before they are merged.
const MAX_SMALL_TABLES: usize = 32;
/// A table under this size counts as small (RocksDB writes up to 64 MiB).
const SMALL_TABLE_BYTES: usize = 4 << 20;

/// Merges a column family's small bottom-level tables once there are more
/// than [`MAX_SMALL_TABLES`] of them.
///
/// Why: every command flushes what it wrote into one small table per column
/// family, and in a family whose keys only grow (units, containers, versions
/// by id) the new table overlaps nothing below it, so RocksDB moves it to the
/// bottom level as it is and never merges it with its neighbours. Each open
/// reads every table: after 150 backups of a synthetic series a store had
/// 608 tables, and listing it took 49 ms instead of 8.5
/// (`hack/bench-long-series.py`; 89 tables and 10 ms with this).
/// Compacting from the first small table's smallest key to the end rewrites
/// only that recent tail (the full-size tables before it stay), whatever the
/// store's size. Errors are left to RocksDB's own compactions to retry: the
/// data is the same either way.
pub(crate) fn merge_small_tables(db: &DB) {
    let files = match db.live_files() {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "listing the metadata tables failed");
            return;
        }
    };
    let mut opts = CompactOptions::default();
    opts.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
    opts.set_exclusive_manual_compaction(false);
    for name in std::iter::once(rocksdb::DEFAULT_COLUMN_FAMILY_NAME).chain(ALL_CFS.iter().copied())
    {
        let Some(cf) = db.cf_handle(name) else {
            continue;
        };
        let mine: Vec<_> = files
            .iter()
            .filter(|f| f.column_family_name == name)
            .collect();
        let Some(bottom) = mine.iter().map(|f| f.level).max() else {
            continue;
        };
        let small: Vec<_> = mine
            .iter()
            .filter(|f| f.level == bottom && f.size < SMALL_TABLE_BYTES)
            .collect();
        if small.len() <= MAX_SMALL_TABLES {
            continue;
        }
        let Some(from) = small.iter().filter_map(|f| f.start_key.as_deref()).min() else {
            continue;
        };
        db.compact_range_cf_opt(cf, Some(from), None::<&[u8]>, &opts);
    }
}

impl Meta {
    pub fn create(path: &Path) -> Result<Meta> {
        let cache = Cache::new_lru_cache(64 << 20);
        let mut o = db_options(&cache);
        o.create_if_missing(true);
        Self::open_with(path, o, false)
    }

    pub fn open(path: &Path, read_only: bool) -> Result<Meta> {
        let cache = Cache::new_lru_cache(128 << 20);
        let mut o = db_options(&cache);
        if read_only {
            return Self::open_with(path, o, true);
        }
        // The last command's writes are in the log, and by default the open
        // writes them to tables, one fsynced file per column family, before
        // it returns: 12 ms of a 40 ms open after a chunk-mode backup here.
        // Kept in memory instead, they are flushed on a thread of ours while
        // the command works, and the store waits for that flush when it
        // closes, so the log never holds more than one command's writes.
        // (A flush merely queued with RocksDB is dropped by a close that
        // comes first, and quick commands then grew the log every time.)
        // The crate has no setter for this option; the string form is RocksDB's.
        let o = o.get_options_from_string("avoid_flush_during_recovery=true")?;
        let mut meta = Self::open_with(path, o, false)?;
        let db = Arc::clone(&meta.db);
        let flusher = std::thread::Builder::new()
            .name("revault-flush".into())
            .spawn(move || {
                let cfs: Vec<&ColumnFamily> = std::iter::once(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
                    .chain(ALL_CFS.iter().copied())
                    .filter_map(|n| db.cf_handle(n))
                    .collect();
                if let Err(e) = db.flush_cfs_opt(&cfs, &FlushOptions::default()) {
                    // Nothing is lost: the log keeps it until a later flush.
                    tracing::warn!(error = %e, "flushing the recovered metadata log failed");
                }
                merge_small_tables(&db);
            })
            .map_err(|source| Error::Io {
                context: "starting the metadata flush thread".into(),
                source,
            })?;
        *meta.flusher.get_mut() = Some(flusher);
        Ok(meta)
    }

    fn open_with(path: &Path, mut o: Options, read_only: bool) -> Result<Meta> {
        let o = o.get_options_from_string("track_and_verify_wals=true")?;
        let cfs: Vec<_> = ALL_CFS
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(*n, o.clone()))
            .collect();
        let db = if read_only {
            DB::open_cf_descriptors_read_only(&o, path, cfs, false)?
        } else {
            DB::open_cf_descriptors(&o, path, cfs)?
        };
        Ok(Meta {
            db: Arc::new(db),
            flusher: parking_lot::Mutex::new(None),
        })
    }

    pub fn db(&self) -> &DB {
        &self.db
    }

    pub fn cf(&self, name: &str) -> &ColumnFamily {
        // Every family is created at open; a missing one is a programming error.
        self.db.cf_handle(name).expect("column family exists")
    }

    pub fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_cf(self.cf(cf), key)?)
    }

    pub fn get_snap(
        &self,
        snap: Option<&rocksdb::Snapshot<'_>>,
        cf: &str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        match snap {
            Some(s) => Ok(s.get_cf(self.cf(cf), key)?),
            None => self.get(cf, key),
        }
    }

    pub fn multi_get(&self, cf: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        // The batched form looks keys up together (one memtable and version
        // reference, blocks shared by several keys read once): much cheaper
        // per key than one get each for a backup's lookups.
        self.db
            .batched_multi_get_cf(self.cf(cf), keys, false)
            .into_iter()
            .map(|r| r.map(|v| v.map(|s| s.to_vec())).map_err(Error::from))
            .collect()
    }

    /// All (key, value) pairs whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, cf: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        self.for_each_prefix(cf, prefix, |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Calls `f` on each entry whose key starts with `prefix` until it returns false.
    pub fn for_each_prefix(
        &self,
        cf: &str,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let mut ro = ReadOptions::default();
        ro.fill_cache(false);
        let it = self.db.iterator_cf_opt(
            self.cf(cf),
            ro,
            IteratorMode::From(prefix, Direction::Forward),
        );
        for item in it {
            let (k, v) = item?;
            if !k.starts_with(prefix) || !f(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    pub fn write(&self, batch: Batch, sync: bool) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch.inner, &wo)?;
        Ok(())
    }

    /// Waits until what the open recovered from the log is in tables (see
    /// [`Meta::open`]). A long-running process does this once after opening,
    /// so the flush's own writes are behind it before its work begins.
    pub fn wait_flushed(&self) {
        if let Some(t) = self.flusher.lock().take() {
            let _ = t.join();
        }
    }

    /// Whether the metadata takes a write now: a synced delete of a key
    /// nothing stores (it leaves no record behind, only a tombstone that
    /// compaction drops). After a write fails on a full disk RocksDB may stop
    /// taking writes until it is reopened; this is how a caller finds out.
    pub fn probe_write(&self) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.delete_opt(PROBE_KEY, &wo)?;
        Ok(())
    }

    pub fn batch(&self) -> Batch<'_> {
        Batch {
            meta: self,
            inner: WriteBatch::default(),
        }
    }
}

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
        match self.get_raw("default", b"config")? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt_meta("store config", e.to_string())),
        }
    }

    fn counters(&self) -> Result<Counters> {
        match self.get_raw("default", b"counters")? {
            None => Ok(Counters::default()),
            Some(v) => Counters::decode(&v),
        }
    }

    fn totals(&self) -> Result<Totals> {
        match self.get_raw("default", b"totals")? {
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
        self.scan(CF_SERIES, b"")?
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

    /// The units holding copies of `fp`, newest first (rewriting makes
    /// copies; new backups dedup to the newest unless an older copy serves the
    /// current window better).
    fn index_copies(&self, kind: DedupUnit, fp: &Fp) -> Result<Vec<u64>> {
        match self.get_raw(CF_INDEX, &index_key(kind, fp))? {
            None => Ok(Vec::new()),
            Some(b) => decode_copies(&b)
                .ok_or_else(|| corrupt_meta(format!("index entry {fp}"), "bad length")),
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

    /// [`MetaRead::index_copies`] for many fingerprints in one batched read.
    fn index_copies_many(&self, kind: DedupUnit, fps: &[Fp]) -> Result<Vec<Vec<u64>>> {
        let keys: Vec<Vec<u8>> = fps.iter().map(|fp| index_key(kind, fp).to_vec()).collect();
        self.multi_get_raw(CF_INDEX, &keys)?
            .into_iter()
            .zip(fps)
            .map(|(v, fp)| match v {
                None => Ok(Vec::new()),
                Some(b) => decode_copies(&b)
                    .ok_or_else(|| corrupt_meta(format!("index entry {fp}"), "bad length")),
            })
            .collect()
    }

    fn index_lookup(&self, kind: DedupUnit, fp: &Fp) -> Result<Option<u64>> {
        Ok(self.index_copies(kind, fp)?.first().copied())
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

impl Meta {
    /// Moves a format-1 store's per-unit reference counts into blocks, in one
    /// synced batch (the store's open does this for a read-write open of a
    /// store whose marker says format 1). Blocks that already exist are
    /// merged into, so nothing is lost if it runs twice.
    pub(crate) fn migrate_refs(&self) -> Result<()> {
        let mut old: Vec<(u64, Refs)> = Vec::new();
        self.for_each_prefix(CF_REFS, b"", |k, v| {
            let id =
                u64::from_be_bytes(k.try_into().map_err(|_| {
                    corrupt_meta("reference counts", "a key that is not a unit id")
                })?);
            old.push((id, Refs::decode(id, v)?));
            Ok(true)
        })?;
        if old.is_empty() {
            return Ok(());
        }
        let mut numbers: Vec<u64> = old.iter().map(|(id, _)| id / REFS_BLOCK).collect();
        numbers.dedup();
        let mut blocks: std::collections::BTreeMap<u64, RefsBlock> = numbers
            .iter()
            .copied()
            .zip(self.refs_blocks(&numbers)?)
            .map(|(n, b)| (n, b.unwrap_or_default()))
            .collect();
        let mut b = self.batch();
        for (id, r) in &old {
            b.delete(CF_REFS, &id.to_be_bytes());
            blocks
                .get_mut(&(id / REFS_BLOCK))
                .expect("loaded")
                .set(*id, *r);
        }
        for (n, r) in &blocks {
            b.put_refs_block(*n, r);
        }
        self.write(b, true)?;
        tracing::info!(
            units = old.len(),
            blocks = blocks.len(),
            "reference counts moved into blocks of {REFS_BLOCK} units"
        );
        Ok(())
    }

    /// The values of `ids` (ascending, distinct) with one iterator.
    fn walk_ids(&self, cf: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        /// Ids apart by at most this are reached by stepping.
        const STEP_MAX: u64 = 16;
        let Some(&last) = ids.last() else {
            return Ok(Vec::new());
        };
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound((last + 1).to_be_bytes());
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf), ro);
        let key_of = |k: &[u8]| -> Result<u64> {
            Ok(u64::from_be_bytes(k.try_into().map_err(|_| {
                corrupt_meta(format!("{cf} key"), "not an 8-byte id".to_string())
            })?))
        };
        let mut at: Option<u64> = None;
        let mut vals = Vec::with_capacity(ids.len());
        for &id in ids {
            match at {
                Some(k) if k >= id => {}
                Some(k) if id - k <= STEP_MAX => loop {
                    it.next();
                    at = it.key().map(key_of).transpose()?;
                    if at.is_none_or(|k| k >= id) {
                        break;
                    }
                },
                _ => {
                    it.seek(id.to_be_bytes());
                    at = it.key().map(key_of).transpose()?;
                }
            }
            vals.push(if at == Some(id) {
                it.value().map(|v| v.to_vec())
            } else {
                None
            });
        }
        it.status()?;
        Ok(vals)
    }
}

fn decode_version(series: &str, v: u32, b: &[u8]) -> Result<VersionRecord> {
    serde_json::from_slice(b)
        .map_err(|e| corrupt_meta(format!("series {series} version {v}"), e.to_string()))
}

/// A write batch with typed helpers. Nothing is visible until [`Meta::write`].
pub struct Batch<'a> {
    meta: &'a Meta,
    inner: WriteBatch,
}

impl Batch<'_> {
    pub fn put(&mut self, cf: &str, key: &[u8], value: &[u8]) {
        self.inner.put_cf(self.meta.cf(cf), key, value);
    }

    pub fn delete(&mut self, cf: &str, key: &[u8]) {
        self.inner.delete_cf(self.meta.cf(cf), key);
    }

    pub fn delete_prefix_range(&mut self, cf: &str, from: &[u8], to: &[u8]) {
        self.inner.delete_range_cf(self.meta.cf(cf), from, to);
    }

    pub fn put_json<T: Serialize>(&mut self, cf: &str, key: &[u8], value: &T) {
        let v = serde_json::to_vec(value).expect("records serialise");
        self.put(cf, key, &v);
    }

    pub fn put_series(&mut self, s: &SeriesRecord) {
        self.put_json(CF_SERIES, s.name.as_bytes(), s);
    }

    pub fn put_version(&mut self, series_id: u32, v: &VersionRecord) {
        self.put_json(CF_VERSIONS, &version_key(series_id, v.number), v);
    }

    pub fn put_unit(&mut self, id: u64, u: &UnitRecord) {
        self.put(CF_UNITS, &id.to_be_bytes(), &u.encode());
    }

    /// Writes a block of reference counts; one with no counts is deleted.
    pub fn put_refs_block(&mut self, block: u64, r: &RefsBlock) {
        if r.is_empty() {
            self.delete(CF_REFCOUNTS, &refs_block_key(block));
        } else {
            self.put(CF_REFCOUNTS, &refs_block_key(block), &r.encode());
        }
    }

    pub fn put_container(&mut self, id: ContainerId, c: &ContainerRecord) {
        self.put(CF_CONTAINERS, &id.0.to_be_bytes(), &c.encode());
    }

    /// Stores the copies of `fp` (newest first); an empty list deletes the entry.
    pub fn put_index(&mut self, kind: DedupUnit, fp: &Fp, copies: &[u64]) {
        if copies.is_empty() {
            self.delete(CF_INDEX, &index_key(kind, fp));
        } else {
            let v: Vec<u8> = copies.iter().flat_map(|c| c.to_be_bytes()).collect();
            self.put(CF_INDEX, &index_key(kind, fp), &v);
        }
    }

    pub fn put_counters(&mut self, c: &Counters) {
        self.put("default", b"counters", &c.encode());
    }

    pub fn put_totals(&mut self, t: &Totals) {
        self.put_json("default", b"totals", t);
    }

    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

pub fn version_key(series: u32, v: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&series.to_be_bytes());
    k[4..].copy_from_slice(&v.to_be_bytes());
    k
}

pub fn part_key(series: u32, v: u32, part: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&version_key(series, v));
    k[8..].copy_from_slice(&part.to_be_bytes());
    k
}

/// Copies of one fingerprint kept in the index at most.
pub const MAX_COPIES: usize = 4;

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

pub fn index_key(kind: DedupUnit, fp: &Fp) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = match kind {
        DedupUnit::Segment => b'S',
        DedupUnit::Chunk => b'C',
    };
    k[1..].copy_from_slice(&fp.0);
    k
}

/// Id allocators, persisted in every commit (and at session start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub next_session: u64,
    pub next_unit: u64,
    pub next_series: u32,
}

impl Counters {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        put_uvarint(&mut v, self.next_session);
        put_uvarint(&mut v, self.next_unit);
        put_uvarint(&mut v, u64::from(self.next_series));
        seal_crc(&mut v);
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self> {
        let bad = || corrupt_meta("id counters", "checksum or format mismatch");
        let body = open_crc(b).ok_or_else(bad)?;
        let mut r = Reader::new(body);
        Ok(Counters {
            next_session: r.uvarint().ok_or_else(bad)?,
            next_unit: r.uvarint().ok_or_else(bad)?,
            next_series: u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?,
        })
    }

    /// Merges another writer's high-water marks into these.
    pub fn max(self, o: Counters) -> Counters {
        Counters {
            next_session: self.next_session.max(o.next_session),
            next_unit: self.next_unit.max(o.next_unit),
            next_series: self.next_series.max(o.next_series),
        }
    }
}

/// Store-wide sums, updated in every commit so `stats` costs one read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Logical bytes of every version currently stored.
    pub logical_bytes: u64,
    pub versions: u64,
    /// Uncompressed chunk bytes held by live units.
    pub unit_vbytes: u64,
    /// Bytes of container files on disk (compressed).
    pub container_bytes: u64,
    /// Uncompressed bytes in container files (live and dead).
    pub container_vbytes: u64,
    pub containers: u64,
    pub units: u64,
    /// Bytes of recipes and catalogs (metadata that grows with versions).
    pub recipe_bytes: u64,
    pub catalog_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep at most this many versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
    /// Keep versions younger than this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_within_secs: Option<u64>,
    /// Versions in the live window (default 1).
    #[serde(default = "default_live")]
    pub live: u32,
    /// After each backup, slide versions out of the live window and expire
    /// what retention no longer keeps.
    #[serde(default)]
    pub auto: bool,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep: None,
            keep_within_secs: None,
            live: 1,
            auto: false,
        }
    }
}

fn default_live() -> u32 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesRecord {
    pub id: u32,
    pub name: String,
    pub unit: DedupUnit,
    pub created_unix: i64,
    pub next_version: u32,
    #[serde(default)]
    pub retention: Retention,
    /// Bumped by every change to the series' versions; gc re-marks a series
    /// only when this differs from the generation it marked.
    #[serde(default)]
    pub generation: u64,
    /// A version was deleted since gc last marked this series, so containers
    /// it referenced may hold dead data.
    #[serde(default)]
    pub deleted_since_gc: bool,
    /// Rewrite selection on the inline path.
    #[serde(default)]
    pub rewrite: crate::rewrite::RewriteSettings,
    /// The last backup's shape, for rewrite budgets.
    #[serde(default)]
    pub last: crate::rewrite::VersionHint,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionKind {
    /// One byte stream (a file or stdin).
    Stream,
    /// A directory tree: contents in the recipe, metadata in the catalog.
    Tree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecipeForm {
    /// References whole units (segments or chunks).
    Live,
    /// References chunks: direct, indirect (into a newer version) or zero.
    Archival,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub number: u32,
    /// Backup time, unix seconds (from `--time` or the clock).
    pub time_unix: i64,
    pub kind: VersionKind,
    pub form: RecipeForm,
    pub logical_bytes: u64,
    /// Chunk positions in the recipe (every chunk, zero chunks included).
    pub chunks: u64,
    pub recipe_parts: u32,
    pub recipe_bytes: u64,
    pub catalog_parts: u32,
    pub catalog_bytes: u64,
    pub catalog_entries: u64,
    /// What this backup added to the store.
    pub new_units: u64,
    pub new_vbytes: u64,
    pub new_container_bytes: u64,
    pub zero_bytes: u64,
    pub backup_secs: f64,
}

/// A stored unit: a run of chunks in one container's data space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitRecord {
    pub kind: DedupUnit,
    /// The fingerprint new backups dedup against (segment or chunk fp).
    pub fp: Fp,
    pub container: ContainerId,
    pub vbase: u64,
    /// Set when chunks were removed (reverse dedup, compaction): an incomplete
    /// unit is no longer a dedup target.
    pub trimmed: bool,
    pub chunks: Vec<ChunkEntry>,
}

impl UnitRecord {
    pub fn stored_vbytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.stored_len()).sum()
    }

    pub fn logical_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| u64::from(c.len)).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64 + self.chunks.len() * 36);
        v.push(1); // format
        v.push(match self.kind {
            DedupUnit::Segment => 0,
            DedupUnit::Chunk => 1,
        });
        v.push(u8::from(self.trimmed));
        v.extend_from_slice(&self.fp.0);
        put_uvarint(&mut v, self.container.0);
        put_uvarint(&mut v, self.vbase);
        put_uvarint(&mut v, self.chunks.len() as u64);
        for c in &self.chunks {
            c.encode_into(&mut v);
        }
        seal_crc(&mut v);
        v
    }

    pub fn decode(id: u64, b: &[u8]) -> Result<Self> {
        let bad = || corrupt_meta(format!("unit {id}"), "checksum or format mismatch");
        let body = open_crc(b).ok_or_else(bad)?;
        let mut r = Reader::new(body);
        if r.u8().ok_or_else(bad)? != 1 {
            return Err(bad());
        }
        let kind = match r.u8().ok_or_else(bad)? {
            0 => DedupUnit::Segment,
            1 => DedupUnit::Chunk,
            _ => return Err(bad()),
        };
        let trimmed = r.u8().ok_or_else(bad)? != 0;
        let fp = Fp(r.array().ok_or_else(bad)?);
        let container = ContainerId(r.uvarint().ok_or_else(bad)?);
        let vbase = r.uvarint().ok_or_else(bad)?;
        let n = r.uvarint().ok_or_else(bad)? as usize;
        let mut chunks = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            chunks.push(ChunkEntry::decode_from(&mut r).ok_or_else(bad)?);
        }
        if !r.is_empty() {
            return Err(bad());
        }
        Ok(UnitRecord {
            kind,
            fp,
            container,
            vbase,
            trimmed,
            chunks,
        })
    }
}

/// Reference counts of a unit: live recipes that reference it whole,
/// archival recipes that reference some of its chunks directly, and other
/// units of the same backup whose duplicate chunks link to its chunks (links
/// inside one unit count nowhere). A unit with all three at zero is
/// unreachable and is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refs {
    pub live: u32,
    pub arch: u32,
    pub links: u32,
}

impl Refs {
    pub fn is_zero(&self) -> bool {
        self.live == 0 && self.arch == 0 && self.links == 0
    }

    /// The per-unit form written before blocks (tests write it to check the
    /// migration to blocks).
    #[cfg(test)]
    fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&self.live.to_le_bytes());
        b[4..8].copy_from_slice(&self.arch.to_le_bytes());
        b[8..].copy_from_slice(&self.links.to_le_bytes());
        b
    }

    pub fn decode(id: u64, b: &[u8]) -> Result<Self> {
        // 8 bytes: written before links existed (none link to the unit).
        if b.len() != 12 && b.len() != 8 {
            return Err(corrupt_meta(
                format!("reference counts of unit {id}"),
                "bad length",
            ));
        }
        let n = |i: usize| {
            b.get(i..i + 4)
                .map_or(0, |f| u32::from_le_bytes(f.try_into().unwrap()))
        };
        Ok(Refs {
            live: n(0),
            arch: n(4),
            links: n(8),
        })
    }
}

/// Units per block of reference counts. A chunk-mode backup changes one
/// count per distinct chunk it references (12.7k for a kube version), mostly
/// runs of consecutive ids: kept per unit, that was 12.7k records in the
/// commit's reads and writes, in the log the next command replays and in the
/// tables it flushes; in blocks it is a few hundred.
pub const REFS_BLOCK: u64 = 64;

/// Key of block `block` (units `block * 64 .. block * 64 + 63`) in
/// [`CF_REFCOUNTS`]: the block number, u64 BE.
pub fn refs_block_key(block: u64) -> [u8; 8] {
    block.to_be_bytes()
}

/// The reference counts of [`REFS_BLOCK`] consecutive units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefsBlock {
    slots: [Refs; REFS_BLOCK as usize],
}

impl Default for RefsBlock {
    fn default() -> Self {
        RefsBlock {
            slots: [Refs::default(); REFS_BLOCK as usize],
        }
    }
}

impl RefsBlock {
    pub fn get(&self, id: u64) -> Refs {
        self.slots[(id % REFS_BLOCK) as usize]
    }

    pub fn set(&mut self, id: u64, r: Refs) {
        self.slots[(id % REFS_BLOCK) as usize] = r;
    }

    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Refs::is_zero)
    }

    /// (unit id, counts) of the units of block `block` with any count.
    pub fn units(&self, block: u64) -> impl Iterator<Item = (u64, Refs)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_zero())
            .map(move |(i, r)| (block * REFS_BLOCK + i as u64, *r))
    }

    /// Each unit with a count: its slot (u8) and live, archival and link
    /// counts (uvarints), slots ascending; CRC32C-sealed.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, r) in self.slots.iter().enumerate().filter(|(_, r)| !r.is_zero()) {
            out.push(i as u8);
            put_uvarint(&mut out, u64::from(r.live));
            put_uvarint(&mut out, u64::from(r.arch));
            put_uvarint(&mut out, u64::from(r.links));
        }
        seal_crc(&mut out);
        out
    }

    pub fn decode(block: u64, b: &[u8]) -> Result<Self> {
        // Unit ids are u64: the last block is the one holding u64::MAX.
        if block > u64::MAX / REFS_BLOCK {
            return Err(corrupt_meta(
                "reference counts",
                format!("block {block} is past the largest unit id"),
            ));
        }
        let bad = |why: &str| {
            let lo = block * REFS_BLOCK;
            corrupt_meta(
                format!("reference counts of units {lo}..={}", lo + (REFS_BLOCK - 1)),
                why.to_string(),
            )
        };
        let body = open_crc(b).ok_or_else(|| bad("checksum mismatch"))?;
        let mut r = Reader::new(body);
        let mut out = RefsBlock::default();
        let mut next = 0usize;
        let count = |v: Option<u64>| v.and_then(|v| u32::try_from(v).ok());
        while !r.is_empty() {
            let slot = r.u8().ok_or_else(|| bad("truncated"))? as usize;
            if slot < next || slot >= REFS_BLOCK as usize {
                return Err(bad("slots out of order"));
            }
            let (live, arch, links) = (
                count(r.uvarint()).ok_or_else(|| bad("bad count"))?,
                count(r.uvarint()).ok_or_else(|| bad("bad count"))?,
                count(r.uvarint()).ok_or_else(|| bad("bad count"))?,
            );
            out.slots[slot] = Refs { live, arch, links };
            next = slot + 1;
        }
        Ok(out)
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

/// A container file known to the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRecord {
    pub file_bytes: u64,
    pub vbytes: u64,
    /// Uncompressed bytes of units still stored in it.
    pub live_vbytes: u64,
    /// Units still stored in it.
    pub live_units: u64,
    /// The version whose leftovers were repacked into it (series id, version), if any.
    pub owner: Option<(u32, u32)>,
}

impl ContainerRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(40);
        v.push(1);
        put_uvarint(&mut v, self.file_bytes);
        put_uvarint(&mut v, self.vbytes);
        put_uvarint(&mut v, self.live_vbytes);
        put_uvarint(&mut v, self.live_units);
        match self.owner {
            None => v.push(0),
            Some((s, n)) => {
                v.push(1);
                put_uvarint(&mut v, u64::from(s));
                put_uvarint(&mut v, u64::from(n));
            }
        }
        seal_crc(&mut v);
        v
    }

    pub fn decode(id: ContainerId, b: &[u8]) -> Result<Self> {
        let bad = || {
            corrupt_meta(
                format!("container record {id}"),
                "checksum or format mismatch",
            )
        };
        let body = open_crc(b).ok_or_else(bad)?;
        let mut r = Reader::new(body);
        if r.u8().ok_or_else(bad)? != 1 {
            return Err(bad());
        }
        let file_bytes = r.uvarint().ok_or_else(bad)?;
        let vbytes = r.uvarint().ok_or_else(bad)?;
        let live_vbytes = r.uvarint().ok_or_else(bad)?;
        let live_units = r.uvarint().ok_or_else(bad)?;
        let owner = match r.u8().ok_or_else(bad)? {
            0 => None,
            1 => Some((
                u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?,
                u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?,
            )),
            _ => return Err(bad()),
        };
        Ok(ContainerRecord {
            file_bytes,
            vbytes,
            live_vbytes,
            live_units,
            owner,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub kind: String,
    pub started_unix: i64,
    pub pid: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_by_id_read_alike_by_iterator_and_by_point_lookups() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::create(dir.path()).unwrap();
        // Every third id of 1..=600 has a record, and one beyond the range.
        let mut b = meta.batch();
        for id in (1..=600u64).filter(|i| i % 3 == 0).chain([10_000]) {
            b.put(CF_UNITS, &id.to_be_bytes(), &id.to_le_bytes());
        }
        meta.write(b, false).unwrap();
        // Stepped; seeks; out of order and repeated, with gaps just within and
        // beyond a step; point lookups; many, out of order.
        let dense: Vec<u64> = (2..=500).collect();
        let scattered: Vec<u64> = (2..=500).map(|i| i * 97).collect();
        let mut mixed: Vec<u64> = (0..80u64).map(|i| (i * 37) % 620 + i % 2).collect();
        mixed.extend([600, 3, 3, 9_999, 10_000, 10_001, 584, 600]);
        let few = vec![3, 599, 600, 601, 10_000];
        let many: Vec<u64> = (0..5000u64).map(|i| (i * 7919) % 10_010).collect();
        for ids in [dense, scattered, mixed, few, many] {
            let got = meta.get_ids_raw(CF_UNITS, &ids).unwrap();
            let want: Vec<Option<Vec<u8>>> = ids
                .iter()
                .map(|i| meta.get(CF_UNITS, &i.to_be_bytes()).unwrap())
                .collect();
            assert_eq!(got, want, "ids {}..{}", ids[0], ids[ids.len() - 1]);
            assert!(got.iter().any(|v| v.is_some()) && got.iter().any(|v| v.is_none()));
        }
    }

    #[test]
    fn small_tables_of_growing_keys_are_merged_and_keep_their_records() {
        let dir = tempfile::tempdir().unwrap();
        drop(Meta::create(dir.path()).unwrap());
        let bottom_small = |meta: &Meta| {
            let files: Vec<_> = meta
                .db()
                .live_files()
                .unwrap()
                .into_iter()
                .filter(|f| f.column_family_name == CF_UNITS)
                .collect();
            let bottom = files.iter().map(|f| f.level).max().unwrap_or(0);
            files
                .iter()
                .filter(|f| f.level == bottom && f.size < SMALL_TABLE_BYTES)
                .count()
        };
        // Like a CLI command each: open, write records under new, growing
        // ids, close. Each leaves one table that overlaps no other.
        let commands = 3 * MAX_SMALL_TABLES as u64;
        for c in 0..commands {
            let meta = Meta::open(dir.path(), false).unwrap();
            let mut b = meta.batch();
            for id in c * 100..(c + 1) * 100 {
                b.put(CF_UNITS, &id.to_be_bytes(), &id.to_le_bytes());
            }
            meta.write(b, true).unwrap();
        }
        // The open flushes the last command's table, then merges (on its
        // thread, which the close waits for).
        drop(Meta::open(dir.path(), false).unwrap());
        let meta = Meta::open(dir.path(), true).unwrap();
        let n = bottom_small(&meta);
        assert!(
            n <= MAX_SMALL_TABLES + 1,
            "{n} small tables after {commands} commands"
        );
        for id in 0..commands * 100 {
            assert_eq!(
                meta.get(CF_UNITS, &id.to_be_bytes()).unwrap(),
                Some(id.to_le_bytes().to_vec()),
                "record {id}"
            );
        }
    }

    #[test]
    fn reopening_keeps_every_write_and_the_log_holds_only_the_last_commands() {
        let dir = tempfile::tempdir().unwrap();
        drop(Meta::create(dir.path()).unwrap());
        let logs = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
                .count()
        };
        let refs = |round: u64, id: u64| Refs {
            live: (round * 1000 + id) as u32,
            arch: 0,
            links: 0,
        };
        // Each round is a command: open, write a backup's worth of counts
        // (synced), close. The open keeps the last command's log in memory
        // and flushes it in the background.
        for round in 0..10u64 {
            let meta = Meta::open(dir.path(), false).unwrap();
            if round > 0 {
                for id in 1..=500 {
                    let want = refs(round - 1, id);
                    assert_eq!(
                        meta.refs(id).unwrap(),
                        want,
                        "round {round}: the last write"
                    );
                }
            }
            let mut b = meta.batch();
            for block in 0..=500 / REFS_BLOCK {
                let mut r = RefsBlock::default();
                for id in
                    (block * REFS_BLOCK..(block + 1) * REFS_BLOCK).filter(|i| (1..=500).contains(i))
                {
                    r.set(id, refs(round, id));
                }
                b.put_refs_block(block, &r);
            }
            b.put(CF_VERSIONS, &round.to_be_bytes(), b"v");
            meta.write(b, true).unwrap();
            drop(meta);
            assert!(logs() <= 2, "round {round}: {} logs", logs());
        }
        let ro = Meta::open(dir.path(), true).unwrap();
        for round in 0..10u64 {
            assert!(ro.get(CF_VERSIONS, &round.to_be_bytes()).unwrap().is_some());
        }
    }

    #[test]
    fn refs_blocks_round_trip_and_detect_corruption() {
        let mut r = RefsBlock::default();
        let c = |live, arch, links| Refs { live, arch, links };
        r.set(128, c(1, 0, 0));
        r.set(130, c(0, 3, 0));
        r.set(191, c(u32::MAX, 7, 2));
        let b = r.encode();
        assert_eq!(RefsBlock::decode(2, &b).unwrap(), r);
        let units: Vec<(u64, Refs)> = r.units(2).collect();
        assert_eq!(
            units,
            vec![
                (128, c(1, 0, 0)),
                (130, c(0, 3, 0)),
                (191, c(u32::MAX, 7, 2))
            ]
        );
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            let e = RefsBlock::decode(2, &bad).unwrap_err().to_string();
            assert!(e.contains("units 128..=191"), "{e}");
        }
        assert!(RefsBlock::default().is_empty() && !r.is_empty());
    }

    #[test]
    fn counts_kept_per_unit_are_moved_into_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::create(dir.path()).unwrap();
        // As a store written before blocks holds them: one record per unit,
        // 12 bytes, or 8 from before link counts.
        let c = |id: u64| Refs {
            live: id as u32 % 5,
            arch: 1,
            links: id as u32 % 3,
        };
        let ids: Vec<u64> = (1..300).filter(|i| i % 7 != 0).chain([5_000]).collect();
        let mut b = meta.batch();
        for &id in &ids {
            let v = c(id).encode();
            let v = if id.is_multiple_of(2) {
                &v[..]
            } else {
                &v[..8]
            };
            b.put(CF_REFS, &id.to_be_bytes(), v);
        }
        meta.write(b, true).unwrap();
        drop(meta);
        let meta = Meta::open(dir.path(), false).unwrap();
        // A block already holding counts is merged into, not replaced.
        let mut b = meta.batch();
        let mut first = RefsBlock::default();
        first.set(7, c(7));
        b.put_refs_block(0, &first);
        meta.write(b, true).unwrap();
        meta.migrate_refs().unwrap();
        let want = |id: u64| {
            let r = c(id);
            Refs {
                links: if id.is_multiple_of(2) { r.links } else { 0 },
                ..r
            }
        };
        for &id in &ids {
            assert_eq!(meta.refs(id).unwrap(), want(id), "unit {id}");
        }
        assert_eq!(meta.refs(7).unwrap(), c(7));
        assert_eq!(meta.refs(14).unwrap(), Refs::default());
        // Only blocks are left: 1..=299 in blocks 0..=4, and 5000's.
        assert!(meta.scan(CF_REFS, b"").unwrap().is_empty());
        let keys: Vec<Vec<u8>> = meta
            .scan(CF_REFCOUNTS, b"")
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let want_keys: Vec<Vec<u8>> = [0, 1, 2, 3, 4, 5_000 / REFS_BLOCK]
            .iter()
            .map(|b| refs_block_key(*b).to_vec())
            .collect();
        assert_eq!(keys, want_keys);
        // Running it again changes nothing.
        meta.migrate_refs().unwrap();
        assert_eq!(meta.refs(5_000).unwrap(), want(5_000));
    }

    #[test]
    fn unit_record_round_trips_and_detects_corruption() {
        let u = UnitRecord {
            kind: DedupUnit::Segment,
            fp: Fp::of(b"seg"),
            container: ContainerId::new(3, 9),
            vbase: 123_456,
            trimmed: false,
            chunks: vec![
                ChunkEntry::new(0, 8000, Fp::of(b"a")),
                ChunkEntry::new(
                    crate::format::container::CHUNK_ZERO,
                    65536,
                    Fp::of(&[0; 65536]),
                ),
                ChunkEntry {
                    flags: crate::format::container::CHUNK_LINK,
                    len: 100,
                    fp: Fp::of(b"l"),
                    link: Some((7, 3)),
                },
            ],
        };
        let mut b = u.encode();
        assert_eq!(UnitRecord::decode(1, &b).unwrap(), u);
        assert_eq!(u.stored_vbytes(), 8000);
        b[10] ^= 4;
        let e = UnitRecord::decode(1, &b).unwrap_err().to_string();
        assert!(e.contains("unit 1"), "{e}");
    }

    #[test]
    fn refs_round_trip_and_read_counts_written_before_links() {
        let r = Refs {
            live: 3,
            arch: 1,
            links: 2,
        };
        assert_eq!(Refs::decode(1, &r.encode()).unwrap(), r);
        let old = Refs::decode(1, &r.encode()[..8]).unwrap();
        assert_eq!((old.live, old.arch, old.links), (3, 1, 0));
        assert!(Refs::decode(1, &r.encode()[..10]).is_err());
    }

    #[test]
    fn container_record_round_trips() {
        for owner in [None, Some((4, 17))] {
            let c = ContainerRecord {
                file_bytes: 1,
                vbytes: 2,
                live_vbytes: 3,
                live_units: 4,
                owner,
            };
            assert_eq!(
                ContainerRecord::decode(ContainerId(1), &c.encode()).unwrap(),
                c
            );
        }
    }
}
