//! A store on local disk: metadata (RocksDB) and a data directory of containers.
//!
//! ```text
//! STORE/revault.store   marker (JSON): format and where the data directory is
//! STORE/meta/           RocksDB
//! STORE/data/SESSION/   containers written by one write session
//! STORE/lock            the store lock
//! ```
//!
//! **Write sessions and crash safety.** Every operation that writes containers
//! (backup, slide, gc) runs as a *session*: it first records the session id with
//! a synced write, writes its containers into `data/SESSION/` (each fsynced when
//! sealed), fsyncs the directories, and then commits all its metadata in one
//! synced RocksDB batch that also removes the session record. A crash before the
//! commit leaves a session record behind: the next read-write open deletes that
//! session's directory, so an uncommitted backup leaves neither a visible
//! version nor leaked space. Container files that become unreachable are
//! unlinked only after the commit that made them so is durable.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::{DedupUnit, StoreConfig};
use crate::container::{session_dir_name, ContainerId};
use crate::error::{corrupt_meta, Error, IoContext, Result};
use crate::fp::Fp;
use crate::lock::StoreLock;
use crate::meta::{
    Batch, ContainerRecord, Counters, Meta, Refs, SeriesRecord, SessionRecord, Totals, UnitRecord,
    VersionRecord, CF_CONTAINERS, CF_INDEX, CF_MARKS, CF_REFS, CF_SESSIONS, CF_UNITS,
};

const MARKER: &str = "revault.store";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Marker {
    format: u32,
    /// Data directory: relative to the store root, or absolute.
    data_dir: PathBuf,
}

#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    pub config: StoreConfig,
    /// Containers elsewhere (e.g. an HDD) than metadata (e.g. an SSD).
    pub data_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Exclusive: changes the store. Recovers unfinished sessions.
    ReadWrite,
    /// Shared with other readers; sees the store as of opening.
    ReadOnly,
}

pub struct Store {
    root: PathBuf,
    data_dir: PathBuf,
    pub(crate) meta: Meta,
    config: StoreConfig,
    mode: OpenMode,
    ids: Mutex<Counters>,
    /// Serialises read-modify-write of reference counts and totals.
    commit_lock: Mutex<()>,
    /// Series with a backup in progress (one writer per series).
    writers: Mutex<HashSet<String>>,
    /// Units that in-flight backups have deduplicated against: they must not be
    /// freed before those backups commit or abort.
    pins: Mutex<HashMap<u64, u32>>,
    /// Units whose references reached zero while pinned; freed later.
    zombies: Mutex<HashSet<u64>>,
    /// Test hook: the failpoint that will simulate a crash, if armed.
    failpoint: Mutex<Option<String>>,
    /// Set when a failpoint fired: sessions then leave their files behind, as
    /// a killed process would.
    crashed: Arc<std::sync::atomic::AtomicBool>,
    _lock: Option<StoreLock>,
}

impl Store {
    /// Creates a new store at `root`.
    pub fn init(root: &Path, opts: &InitOptions) -> Result<()> {
        opts.config.validate()?;
        if root.join(MARKER).exists() {
            return Err(Error::AlreadyInitialised(root.to_path_buf()));
        }
        std::fs::create_dir_all(root).ctx(|| format!("creating {}", root.display()))?;
        let _lock = StoreLock::acquire(root, true, "revault init")?;
        let data_rel = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("data"));
        let data_dir = resolve(root, &data_rel);
        std::fs::create_dir_all(&data_dir).ctx(|| format!("creating {}", data_dir.display()))?;
        let meta = Meta::create(&root.join("meta"))?;
        let mut b = meta.batch();
        b.put_json("default", b"config", &opts.config);
        b.put_counters(&Counters {
            next_session: 1,
            next_unit: 1,
            next_series: 1,
        });
        b.put_totals(&Totals::default());
        meta.write(b, true)?;
        drop(meta);
        // The marker is written last: a store is initialised only once complete.
        let marker = serde_json::to_vec_pretty(&Marker {
            format: 1,
            data_dir: data_rel,
        })
        .expect("marker serialises");
        write_synced(&root.join(MARKER), &marker)?;
        sync_dir(root)?;
        Ok(())
    }

    pub fn open(root: &Path, mode: OpenMode, what: &str) -> Result<Store> {
        let marker_path = root.join(MARKER);
        let marker: Marker = match std::fs::read(&marker_path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| corrupt_meta(marker_path.display().to_string(), e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotInitialised(root.to_path_buf()))
            }
            Err(e) => {
                return Err(Error::Io {
                    context: format!("reading {}", marker_path.display()),
                    source: e,
                })
            }
        };
        let lock = StoreLock::acquire(root, mode == OpenMode::ReadWrite, what)?;
        let meta = Meta::open(&root.join("meta"), mode == OpenMode::ReadOnly)?;
        let config = meta
            .config()?
            .ok_or_else(|| corrupt_meta("store config", "missing"))?;
        let counters = meta.counters()?;
        let store = Store {
            root: root.to_path_buf(),
            data_dir: resolve(root, &marker.data_dir),
            meta,
            config,
            mode,
            ids: Mutex::new(counters),
            commit_lock: Mutex::new(()),
            writers: Mutex::new(HashSet::new()),
            pins: Mutex::new(HashMap::new()),
            zombies: Mutex::new(HashSet::new()),
            failpoint: Mutex::new(None),
            crashed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            _lock: Some(lock),
        };
        if mode == OpenMode::ReadWrite {
            store.recover_sessions()?;
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub(crate) fn require_writable(&self) -> Result<()> {
        if self.mode != OpenMode::ReadWrite {
            return Err(Error::Invalid("the store was opened read-only".into()));
        }
        Ok(())
    }

    /// Deletes the containers of sessions that never committed (a crash).
    fn recover_sessions(&self) -> Result<()> {
        let pending = self.meta.scan_prefix(CF_SESSIONS, b"")?;
        if pending.is_empty() {
            return Ok(());
        }
        let mut b = self.meta.batch();
        for (k, v) in &pending {
            let id = u64::from_be_bytes(
                k[..8]
                    .try_into()
                    .map_err(|_| corrupt_meta("session", "bad key"))?,
            );
            let rec: Option<SessionRecord> = serde_json::from_slice(v).ok();
            let dir = self.data_dir.join(session_dir_name(id));
            tracing::warn!(
                session = id,
                kind = rec.as_ref().map(|r| r.kind.as_str()).unwrap_or("?"),
                "removing the containers of a write session that did not commit"
            );
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::Io {
                        context: format!("removing {}", dir.display()),
                        source: e,
                    })
                }
            }
            b.delete(CF_SESSIONS, k);
        }
        sync_dir(&self.data_dir)?;
        self.meta.write(b, true)
    }

    // ---- ids and sessions ---------------------------------------------------

    pub(crate) fn alloc_unit(&self) -> u64 {
        let mut c = self.ids.lock();
        let id = c.next_unit;
        c.next_unit += 1;
        id
    }

    pub(crate) fn alloc_series(&self) -> u32 {
        let mut c = self.ids.lock();
        let id = c.next_series;
        c.next_series += 1;
        id
    }

    pub(crate) fn counters(&self) -> Counters {
        *self.ids.lock()
    }

    /// Starts a write session: its id is durable before any container exists.
    pub(crate) fn begin_session(&self, kind: &str) -> Result<Session> {
        self.require_writable()?;
        let (id, counters) = {
            let mut c = self.ids.lock();
            let id = c.next_session;
            c.next_session += 1;
            (id, *c)
        };
        let rec = SessionRecord {
            kind: kind.to_string(),
            started_unix: now_unix(),
            pid: std::process::id(),
        };
        let _g = self.commit_lock.lock();
        let mut b = self.meta.batch();
        b.put_json(CF_SESSIONS, &id.to_be_bytes(), &rec);
        b.put_counters(&counters.max(self.meta.counters()?));
        self.meta.write(b, true)?;
        Ok(Session {
            id,
            data_dir: self.data_dir.clone(),
            next_seq: Arc::new(Mutex::new(0)),
            committed: false,
            crashed: self.crashed.clone(),
        })
    }

    // ---- series writers and pins -------------------------------------------

    pub(crate) fn claim_series(&self, name: &str) -> Result<SeriesClaim<'_>> {
        let mut w = self.writers.lock();
        if !w.insert(name.to_string()) {
            return Err(Error::SeriesBusy {
                series: name.to_string(),
            });
        }
        Ok(SeriesClaim {
            store: self,
            name: name.to_string(),
        })
    }

    /// Looks up the unit new data with fingerprint `fp` dedups to, pinning it.
    pub(crate) fn lookup_pin(&self, kind: DedupUnit, fp: &Fp) -> Result<Option<u64>> {
        let Some(id) = self.meta.index_lookup(kind, fp)? else {
            return Ok(None);
        };
        // The index only names complete, referenced units (kept so by commit),
        // and the commit lock orders this check against concurrent frees.
        let _g = self.commit_lock.lock();
        if self.meta.get(CF_UNITS, &id.to_be_bytes())?.is_none() {
            return Ok(None);
        }
        *self.pins.lock().entry(id).or_default() += 1;
        Ok(Some(id))
    }

    pub(crate) fn take_zombies(&self) -> Vec<u64> {
        self.zombies.lock().drain().collect()
    }

    pub(crate) fn is_pinned(&self, id: u64) -> bool {
        self.pins.lock().contains_key(&id)
    }

    /// Arms a failpoint (tests): when the engine reaches `name` it stops as if
    /// the process had been killed there: no cleanup, no further writes.
    /// Reopen the store to recover.
    #[doc(hidden)]
    pub fn arm_failpoint(&self, name: &str) {
        *self.failpoint.lock() = Some(name.to_string());
    }

    pub(crate) fn failpoint(&self, name: &str) -> Result<()> {
        let mut f = self.failpoint.lock();
        if f.as_deref() == Some(name) {
            *f = None;
            self.crashed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(Error::Invalid(format!(
                "simulated crash at failpoint {name}"
            )));
        }
        if self.crashed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Invalid(
                "the store crashed at a failpoint; reopen it".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn unpin(&self, ids: impl IntoIterator<Item = u64>) {
        let mut p = self.pins.lock();
        for id in ids {
            if let Some(n) = p.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    p.remove(&id);
                }
            }
        }
    }

    // ---- commit -------------------------------------------------------------

    /// Applies a transaction atomically: reference-count deltas, new and changed
    /// units and containers, recipes, versions and series. Units whose counts
    /// reach zero are freed with their index entries; containers left with no
    /// units are deleted (their files unlinked after the durable commit).
    pub(crate) fn commit(&self, txn: Txn) -> Result<CommitOutcome> {
        self.require_writable()?;
        self.failpoint("commit.before_write")?;
        let _g = self.commit_lock.lock();
        let meta = &self.meta;
        let mut b = meta.batch();
        let mut totals = meta.totals()?;
        let mut containers: HashMap<ContainerId, ContainerRecord> = HashMap::new();
        let mut load_container =
            |id: ContainerId, cs: &mut HashMap<ContainerId, ContainerRecord>| -> Result<()> {
                if let std::collections::hash_map::Entry::Vacant(e) = cs.entry(id) {
                    let rec = meta.container(id)?.ok_or_else(|| {
                        corrupt_meta(format!("container {id}"), "no container record")
                    })?;
                    e.insert(rec);
                }
                Ok(())
            };

        for (id, rec) in &txn.new_containers {
            totals.containers += 1;
            totals.container_bytes += rec.file_bytes;
            totals.container_vbytes += rec.vbytes;
            containers.insert(*id, rec.clone());
        }
        let new_ids: HashSet<u64> = txn.new_units.iter().map(|(id, _, _)| *id).collect();
        for (id, unit, refs) in &txn.new_units {
            b.put_unit(*id, unit);
            b.put_refs(*id, *refs);
            totals.units += 1;
            totals.unit_vbytes += unit.stored_vbytes();
        }

        // Relocated or trimmed units: the old copy's container loses them.
        let mut unit_cache: HashMap<u64, UnitRecord> = HashMap::new();
        for (id, new) in &txn.unit_updates {
            let old = match meta.unit(*id)? {
                Some(u) => u,
                None => {
                    return Err(corrupt_meta(
                        format!("unit {id}"),
                        "updated unit does not exist",
                    ))
                }
            };
            load_container(old.container, &mut containers)?;
            let c = containers.get_mut(&old.container).unwrap();
            c.live_vbytes -= old.stored_vbytes();
            c.live_units -= 1;
            // Containers written by this transaction already count what was
            // packed into them.
            if !txn.new_containers.iter().any(|(c, _)| *c == new.container) {
                load_container(new.container, &mut containers)?;
                let c = containers.get_mut(&new.container).unwrap();
                c.live_vbytes += new.stored_vbytes();
                c.live_units += 1;
            }
            totals.unit_vbytes = totals.unit_vbytes - old.stored_vbytes() + new.stored_vbytes();
            if new.trimmed && !old.trimmed && meta.index_lookup(old.kind, &old.fp)? == Some(*id) {
                b.delete_index(old.kind, &old.fp);
            }
            b.put_unit(*id, new);
            unit_cache.insert(*id, new.clone());
        }

        // Reference deltas.
        let mut freed_units = 0u64;
        let mut ids: Vec<_> = txn.ref_deltas.iter().collect();
        ids.sort_unstable_by_key(|(id, _)| **id);
        let pins = self.pins.lock();
        let mut zombies = self.zombies.lock();
        for (&id, &(dl, da)) in ids {
            let cur = if new_ids.contains(&id) {
                txn.new_units
                    .iter()
                    .find(|(i, _, _)| *i == id)
                    .map(|x| x.2)
                    .unwrap()
            } else {
                meta.refs(id)?
            };
            let live = i64::from(cur.live) + dl;
            let arch = i64::from(cur.arch) + da;
            if live < 0 || arch < 0 {
                return Err(corrupt_meta(
                    format!("unit {id}"),
                    format!("reference count would go negative ({live} live, {arch} archival)"),
                ));
            }
            let r = Refs {
                live: live as u32,
                arch: arch as u32,
            };
            b.put_refs(id, r);
            if r.is_zero() {
                if pins.contains_key(&id) {
                    zombies.insert(id);
                    continue;
                }
                let unit = match unit_cache.remove(&id) {
                    Some(u) => u,
                    None => match txn.new_units.iter().find(|(i, _, _)| *i == id) {
                        Some((_, u, _)) => u.clone(),
                        None => meta.unit(id)?.ok_or_else(|| {
                            corrupt_meta(format!("unit {id}"), "referenced unit does not exist")
                        })?,
                    },
                };
                self.free_unit(
                    &mut b,
                    id,
                    &unit,
                    &mut containers,
                    &mut totals,
                    &mut load_container,
                )?;
                freed_units += 1;
            }
        }
        for &id in &txn.free_units {
            if txn.ref_deltas.contains_key(&id)
                || pins.contains_key(&id)
                || !meta.refs(id)?.is_zero()
            {
                continue;
            }
            let Some(unit) = meta.unit(id)? else { continue };
            self.free_unit(
                &mut b,
                id,
                &unit,
                &mut containers,
                &mut totals,
                &mut load_container,
            )?;
            zombies.remove(&id);
            freed_units += 1;
        }
        drop(pins);
        drop(zombies);

        for (k, v) in &txn.index_puts {
            b.put_index(k.0, &k.1, *v);
        }

        // Containers: write changed records, delete empty ones.
        let mut dead_files = Vec::new();
        let new_containers: HashSet<ContainerId> = txn.new_containers.iter().map(|c| c.0).collect();
        for (id, rec) in &containers {
            // A container that lost units may now hold dead data: gc sweeps it.
            let sweep_key = crate::gc::sweep_key(*id);
            if rec.live_units == 0 {
                b.delete(CF_MARKS, &sweep_key);
            } else if !new_containers.contains(id) {
                b.put(CF_MARKS, &sweep_key, b"");
            }
            if rec.live_units == 0 {
                b.delete(CF_CONTAINERS, &id.0.to_be_bytes());
                totals.containers -= 1;
                totals.container_bytes -= rec.file_bytes;
                totals.container_vbytes -= rec.vbytes;
                dead_files.push(*id);
            } else {
                b.put_container(*id, rec);
            }
        }

        for (name, update) in txn.series_updates {
            let cur = meta.series(&name)?;
            b.put_series(&update(cur));
        }
        // Deletions first: a replaced recipe deletes its old parts and puts new
        // ones under the same keys, and batch operations apply in order.
        for (cf, from, to) in &txn.delete_ranges {
            b.delete_prefix_range(cf, from, to);
        }
        for (cf, k) in &txn.deletes {
            b.delete(cf, k);
        }
        for (cf, k, v) in &txn.puts {
            b.put(cf, k, v);
        }
        totals.logical_bytes = apply(totals.logical_bytes, txn.totals.logical_bytes);
        totals.versions = apply(totals.versions, txn.totals.versions);
        totals.recipe_bytes = apply(totals.recipe_bytes, txn.totals.recipe_bytes);
        totals.catalog_bytes = apply(totals.catalog_bytes, txn.totals.catalog_bytes);
        b.put_totals(&totals);
        b.put_counters(&self.counters().max(meta.counters()?));
        if let Some(s) = txn.session {
            b.delete(CF_SESSIONS, &s.to_be_bytes());
        }
        meta.write(b, true)?;

        // Durable: now the files can go.
        self.failpoint("commit.before_unlink")?;
        for id in &dead_files {
            self.remove_container_file(*id);
        }
        Ok(CommitOutcome {
            freed_units,
            freed_containers: dead_files.len() as u64,
            freed_bytes: dead_files.iter().map(|id| containers[id].file_bytes).sum(),
        })
    }

    fn free_unit(
        &self,
        b: &mut Batch<'_>,
        id: u64,
        unit: &UnitRecord,
        containers: &mut HashMap<ContainerId, ContainerRecord>,
        totals: &mut Totals,
        load: &mut impl FnMut(ContainerId, &mut HashMap<ContainerId, ContainerRecord>) -> Result<()>,
    ) -> Result<()> {
        b.delete(CF_UNITS, &id.to_be_bytes());
        b.delete(CF_REFS, &id.to_be_bytes());
        if !unit.trimmed && self.meta.index_lookup(unit.kind, &unit.fp)? == Some(id) {
            b.delete(CF_INDEX, &crate::meta::index_key(unit.kind, &unit.fp));
        }
        load(unit.container, containers)?;
        let c = containers.get_mut(&unit.container).unwrap();
        c.live_vbytes -= unit.stored_vbytes();
        c.live_units -= 1;
        totals.units -= 1;
        totals.unit_vbytes -= unit.stored_vbytes();
        Ok(())
    }

    pub(crate) fn remove_container_file(&self, id: ContainerId) {
        let path = id.path(&self.data_dir);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(container = %id, error = %e, "could not remove a freed container; gc will retry");
            }
        }
        // Remove the session directory once it is empty (fails harmlessly otherwise).
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }

    // ---- lookups used by every command --------------------------------------

    pub fn series(&self, name: &str) -> Result<SeriesRecord> {
        check_series_name(name)?;
        self.meta
            .series(name)?
            .ok_or_else(|| Error::UnknownSeries(name.to_string()))
    }

    pub fn list_series(&self) -> Result<Vec<SeriesRecord>> {
        self.meta.all_series()
    }

    pub fn versions(&self, series: &SeriesRecord) -> Result<Vec<VersionRecord>> {
        self.meta.versions(series)
    }

    /// Resolves `N` or `latest` to a committed version.
    pub fn resolve_version(
        &self,
        series: &SeriesRecord,
        sel: &VersionSel,
    ) -> Result<VersionRecord> {
        let versions = self.meta.versions(series)?;
        let latest = versions.last().map(|v| v.number);
        let found = match sel {
            VersionSel::Latest => versions.last().cloned(),
            VersionSel::Number(n) => versions.into_iter().find(|v| v.number == *n),
        };
        found.ok_or_else(|| Error::UnknownVersion {
            series: series.name.clone(),
            version: sel.to_string(),
            latest,
        })
    }

    pub fn totals(&self) -> Result<Totals> {
        self.meta.totals()
    }
}

fn apply(v: u64, d: i64) -> u64 {
    (v as i64 + d).max(0) as u64
}

/// Which version to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionSel {
    Latest,
    Number(u32),
}

impl std::fmt::Display for VersionSel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VersionSel::Latest => f.write_str("latest"),
            VersionSel::Number(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for VersionSel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s == "latest" {
            return Ok(VersionSel::Latest);
        }
        match s.parse::<u32>() {
            Ok(n) if n > 0 => Ok(VersionSel::Number(n)),
            _ => Err(Error::Invalid(format!(
                "version {s:?}: expected a version number (1, 2, ...) or `latest`"
            ))),
        }
    }
}

/// Releases the one-writer-per-series claim on drop.
pub(crate) struct SeriesClaim<'a> {
    store: &'a Store,
    name: String,
}

impl Drop for SeriesClaim<'_> {
    fn drop(&mut self) {
        self.store.writers.lock().remove(&self.name);
    }
}

/// A write session: allocates container ids inside its own directory. Dropped
/// without commit, it removes its directory (a crash leaves it to recovery).
pub(crate) struct Session {
    pub id: u64,
    data_dir: PathBuf,
    next_seq: Arc<Mutex<u64>>,
    committed: bool,
    crashed: Arc<std::sync::atomic::AtomicBool>,
}

impl Session {
    pub fn allocator(&self) -> ContainerAlloc {
        ContainerAlloc {
            session: self.id,
            next_seq: self.next_seq.clone(),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.data_dir.join(session_dir_name(self.id))
    }

    /// Makes the session's container files and directory entries durable.
    pub fn sync(&self) -> Result<()> {
        let dir = self.dir();
        if dir.exists() {
            sync_dir(&dir)?;
            sync_dir(&self.data_dir)?;
        }
        Ok(())
    }

    pub fn mark_committed(&mut self) {
        self.committed = true;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.committed && !self.crashed.load(std::sync::atomic::Ordering::SeqCst) {
            // The session record stays until the next read-write open clears it;
            // removing the files now returns the space at once.
            let _ = std::fs::remove_dir_all(self.dir());
        }
    }
}

#[derive(Clone)]
pub(crate) struct ContainerAlloc {
    session: u64,
    next_seq: Arc<Mutex<u64>>,
}

impl ContainerAlloc {
    pub fn next(&self) -> ContainerId {
        let mut s = self.next_seq.lock();
        let id = ContainerId::new(self.session, *s);
        *s += 1;
        id
    }
}

/// Everything one commit changes.
#[derive(Default)]
pub(crate) struct Txn {
    pub session: Option<u64>,
    pub new_units: Vec<(u64, UnitRecord, Refs)>,
    /// Units moved or trimmed (same id, new location or fewer chunks).
    pub unit_updates: Vec<(u64, UnitRecord)>,
    /// (live, archival) reference deltas by unit id.
    pub ref_deltas: HashMap<u64, (i64, i64)>,
    pub new_containers: Vec<(ContainerId, ContainerRecord)>,
    pub index_puts: Vec<((DedupUnit, Fp), u64)>,
    pub puts: Vec<(&'static str, Vec<u8>, Vec<u8>)>,
    pub deletes: Vec<(&'static str, Vec<u8>)>,
    pub delete_ranges: Vec<(&'static str, Vec<u8>, Vec<u8>)>,
    pub totals: TotalsDelta,
    /// Applied to series records as they are at commit time.
    pub series_updates: Vec<(String, SeriesUpdate)>,
    /// Units to free if they are still unreferenced (gc's sweep).
    pub free_units: Vec<u64>,
}

pub(crate) type SeriesUpdate = Box<dyn FnOnce(Option<SeriesRecord>) -> SeriesRecord + Send>;

impl Txn {
    pub fn ref_delta(&mut self, unit: u64, live: i64, arch: i64) {
        let e = self.ref_deltas.entry(unit).or_default();
        e.0 += live;
        e.1 += arch;
    }

    pub fn put_json<T: Serialize>(&mut self, cf: &'static str, key: &[u8], v: &T) {
        self.puts.push((
            cf,
            key.to_vec(),
            serde_json::to_vec(v).expect("records serialise"),
        ));
    }
}

#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct TotalsDelta {
    pub logical_bytes: i64,
    pub versions: i64,
    pub recipe_bytes: i64,
    pub catalog_bytes: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CommitOutcome {
    pub freed_units: u64,
    pub freed_containers: u64,
    pub freed_bytes: u64,
}

fn resolve(root: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .ctx(|| format!("syncing directory {}", dir.display()))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).ctx(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)
        .ctx(|| format!("writing {}", path.display()))?;
    f.sync_all().ctx(|| format!("syncing {}", path.display()))
}

pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `NAMESPACE/NAME`: a Kubernetes namespace (DNS label) and a name made of
/// lowercase letters, digits, '-' and '.', as Kubernetes object names are.
pub fn check_series_name(name: &str) -> Result<()> {
    let bad = || Error::BadSeriesName(name.to_string());
    let (ns, n) = name.split_once('/').ok_or_else(bad)?;
    let label = |s: &str, max: usize, dots: bool| {
        !s.is_empty()
            && s.len() <= max
            && s.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
            })
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
    };
    if label(ns, 63, false) && label(n, 253, true) {
        Ok(())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_names() {
        for ok in ["default/db", "team-a/pvc-data.1", "a/b"] {
            check_series_name(ok).unwrap();
        }
        for bad in [
            "db",
            "Default/db",
            "a/b/c",
            "/db",
            "ns/",
            "ns/-x",
            "ns/x_y",
            "ns/x y",
        ] {
            let e = check_series_name(bad).unwrap_err().to_string();
            assert!(e.contains("NAMESPACE/NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn version_selectors() {
        assert_eq!("latest".parse::<VersionSel>().unwrap(), VersionSel::Latest);
        assert_eq!("7".parse::<VersionSel>().unwrap(), VersionSel::Number(7));
        for bad in ["0", "-1", "x", ""] {
            assert!(bad.parse::<VersionSel>().is_err(), "{bad}");
        }
    }

    #[test]
    fn open_requires_init_and_init_refuses_twice() {
        let dir = tempfile::tempdir().unwrap();
        let e = Store::open(dir.path(), OpenMode::ReadOnly, "t")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a Revault store"), "{e}");
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let e = Store::init(dir.path(), &InitOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        let s = Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap();
        assert_eq!(s.config(), &StoreConfig::default());
    }
}
