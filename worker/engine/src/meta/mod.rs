//! Metadata in RocksDB: one column family per table (listed in `format::keys`), typed
//! records (`format::records`, `format::unit`, `format::refcounts`), and write batches that
//! commit atomically. [`MetaRead`] reads the live database or a snapshot.

mod read;

pub(crate) use read::{load_units, referenced};
pub use read::{scan_refs, MetaRead};

use std::path::Path;
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, BottommostLevelCompaction, Cache, ColumnFamily, ColumnFamilyDescriptor,
    CompactOptions, Direction, FlushOptions, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions, DB,
};
use serde::Serialize;

use crate::error::{corrupt_meta, Error, Result};
use crate::format::container::ContainerId;
use crate::format::keys::{
    refs_block_key, version_key, ALL_CFS, CF_CONTAINERS, CF_REFCOUNTS, CF_REFS, CF_SERIES,
    CF_UNITS, CF_VERSIONS, COUNTERS_KEY, PROBE_KEY, TOTALS_KEY,
};
use crate::format::records::{ContainerRecord, Counters, SeriesRecord, Totals, VersionRecord};
use crate::format::refcounts::{Refs, RefsBlock, REFS_BLOCK};
use crate::format::unit::UnitRecord;

pub struct Meta {
    db: Arc<DB>,
    /// Writes what the open recovered from the log to tables (see
    /// [`Meta::open`]); the store does not close before it is done.
    flusher: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    /// RocksDB's sequence number after the last write through [`Meta::write`]: it grows with
    /// every change to the records, and not with the health probe's writes (see
    /// [`Meta::changes`]).
    changes: std::sync::atomic::AtomicU64,
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
        let changes = std::sync::atomic::AtomicU64::new(db.latest_sequence_number());
        Ok(Meta {
            db: Arc::new(db),
            flusher: parking_lot::Mutex::new(None),
            changes,
        })
    }

    /// Bytes column family `cf` takes: its table files and its memtables.
    pub fn cf_bytes(&self, cf: &str) -> Result<u64> {
        let mut total = 0;
        for p in [
            "rocksdb.total-sst-files-size",
            "rocksdb.size-all-mem-tables",
        ] {
            total += self.db.property_int_value_cf(self.cf(cf), p)?.unwrap_or(0);
        }
        Ok(total)
    }

    pub(crate) fn db(&self) -> &DB {
        &self.db
    }

    /// A RocksDB checkpoint of the metadata at `path` (memtables flushed first, so it needs
    /// no log to be complete).
    pub(crate) fn checkpoint(&self, path: &Path) -> Result<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(path)?;
        Ok(())
    }

    pub(crate) fn cf(&self, name: &str) -> &ColumnFamily {
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
        f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let mut ro = ReadOptions::default();
        ro.fill_cache(false);
        self.walk_prefix(cf, ro, prefix, prefix, f)
    }

    /// Calls `f` on each entry whose key starts with `prefix` and is at least
    /// `from`, in key order, until it returns false: one page of a listing
    /// that resumes after the last key of the page before. A `from` below
    /// `prefix` starts at `prefix`.
    ///
    /// Unlike [`Meta::for_each_prefix`] the blocks read stay in the cache: a
    /// client lists the same pages again and again.
    pub fn for_each_from(
        &self,
        cf: &str,
        from: &[u8],
        prefix: &[u8],
        f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        self.walk_prefix(cf, ReadOptions::default(), from.max(prefix), prefix, f)
    }

    /// Calls `f` on each entry with `from <= key < to`, in key order, until it returns
    /// false. The blocks read stay in the cache: the sampled index reads the same
    /// neighbourhoods again when the next backup of a series comes round.
    pub fn for_each_range(
        &self,
        cf: &str,
        from: &[u8],
        to: &[u8],
        f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(to.to_vec());
        self.walk_prefix(cf, ro, from, b"", f)
    }

    fn walk_prefix(
        &self,
        cf: &str,
        ro: ReadOptions,
        from: &[u8],
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let it = self.db.iterator_cf_opt(
            self.cf(cf),
            ro,
            IteratorMode::From(from, Direction::Forward),
        );
        for item in it {
            let (k, v) = item?;
            if !k.starts_with(prefix) || !f(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    pub fn write(&self, batch: Batch<'_>, sync: bool) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch.inner, &wo)?;
        self.changes.fetch_max(
            self.db.latest_sequence_number(),
            std::sync::atomic::Ordering::SeqCst,
        );
        Ok(())
    }

    /// A number that grows with every write of records (and never shrinks, across reopens
    /// too): whoever noted it can tell whether the store changed since. The health probe's
    /// writes do not count.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::SeqCst)
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

    pub fn put_counters(&mut self, c: &Counters) {
        self.put("default", COUNTERS_KEY, &c.encode());
    }

    pub fn put_totals(&mut self, t: &Totals) {
        self.put_json("default", TOTALS_KEY, t);
    }

    pub fn len(&self) -> usize {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_each_from_walks_a_prefix_from_a_key_on() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::create(dir.path()).unwrap();
        let mut b = meta.batch();
        for k in ["a/1", "b/1", "b/2", "b/3", "b/4", "c/1"] {
            b.put("default", k.as_bytes(), k.to_uppercase().as_bytes());
        }
        meta.write(b, false).unwrap();
        let walk = |from: &str, prefix: &str, stop_after: usize| {
            let mut seen = Vec::new();
            meta.for_each_from("default", from.as_bytes(), prefix.as_bytes(), |k, v| {
                assert_eq!(v, k.to_ascii_uppercase(), "the value of its key");
                seen.push(String::from_utf8(k.to_vec()).unwrap());
                Ok(seen.len() < stop_after)
            })
            .unwrap();
            seen
        };
        assert_eq!(walk("b/", "b/", 10), ["b/1", "b/2", "b/3", "b/4"]);
        // From a key on, including that key; between keys, from the next.
        assert_eq!(walk("b/2", "b/", 10), ["b/2", "b/3", "b/4"]);
        assert_eq!(walk("b/25", "b/", 10), ["b/3", "b/4"]);
        // A start below the prefix starts at the prefix, not before it.
        assert_eq!(walk("a/", "b/", 10), ["b/1", "b/2", "b/3", "b/4"]);
        assert!(walk("b/5", "b/", 10).is_empty());
        // `f` returning false ends the walk.
        assert_eq!(walk("b/", "b/", 2), ["b/1", "b/2"]);
    }

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
}
