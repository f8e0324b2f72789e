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

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use crate::config::{DedupUnit, StoreConfig};
use crate::error::{corrupt_meta, Error, IoContext, Result};
use crate::format::container::{session_dir_name, ContainerId};
use crate::format::fp::Fp;
use crate::format::keys::CF_SESSIONS;
use crate::format::records::{Counters, SeriesRecord, SessionRecord, Totals, VersionRecord};
use crate::format::unit::UnitRecord;
use crate::index::{FingerprintIndex, FullIndex};
use crate::lock::StoreLock;
use crate::meta::{Meta, MetaRead};

const MARKER: &str = "revault.store";
/// The metadata (RocksDB) directory, under the store root.
pub const META_DIR: &str = "meta";

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

/// A test's code for a pause point (see [`Store::on_pause_point`]).
pub type PauseHook = Box<dyn FnOnce(&Store) + Send>;

pub struct Store {
    root: PathBuf,
    data_dir: PathBuf,
    pub(crate) meta: Meta,
    config: StoreConfig,
    mode: OpenMode,
    ids: Mutex<Counters>,
    /// Serialises read-modify-write of reference counts and totals.
    pub(crate) commit_lock: Mutex<()>,
    /// Series with a backup in progress (one writer per series).
    writers: Mutex<HashSet<String>>,
    /// Units that in-flight backups have deduplicated against (they must not be
    /// freed or trimmed before those backups commit or abort), and units a
    /// running slide or gc is about to trim or free (new backups must not
    /// dedup against them).
    pub(crate) pins: Mutex<PinState>,
    /// Readers (restores, listings) and container files whose deletion waits
    /// for readers that might still need them.
    readers: Mutex<ReaderState>,
    /// Slides, expiries and gc run one at a time: they move and free units.
    maintenance: Mutex<()>,
    /// Test hook: the failpoint that will simulate a crash, if armed.
    failpoint: Mutex<Option<String>>,
    /// Test hook: what runs when the engine reaches a pause point.
    pause_hooks: Mutex<Vec<(String, PauseHook)>>,
    /// Set when a failpoint fired: sessions then leave their files behind, as
    /// a killed process would.
    crashed: Arc<std::sync::atomic::AtomicBool>,
    /// Sessions whose commit write failed: it may still have reached the
    /// log (a failed sync), so their files stay for the next read-write open
    /// to decide on, by whether the session record is still there.
    unsettled: Arc<Mutex<HashSet<u64>>>,
    _lock: Option<StoreLock>,
}

impl Store {
    /// Creates a new store at `root`.
    pub fn init(root: &Path, opts: &InitOptions) -> Result<()> {
        opts.config.validate()?;
        if root.join(MARKER).exists() {
            return Err(Error::AlreadyInitialised(root.to_path_buf()));
        }
        create_dir_durable(root)?;
        let _lock = StoreLock::acquire(root, true, "revault init")?;
        let data_rel = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("data"));
        let data_dir = resolve(root, &data_rel);
        refuse_store_content(root, &data_dir)?;
        create_dir_durable(&data_dir)?;
        let meta = Meta::create(&root.join(META_DIR))?;
        let mut b = meta.batch();
        b.put_json("default", crate::format::keys::CONFIG_KEY, &opts.config);
        b.put_counters(&Counters {
            next_session: 1,
            next_unit: 1,
            next_series: 1,
        });
        b.put_totals(&Totals::default());
        b.put("default", crate::format::keys::MARKS_KEPT_KEY, b"");
        meta.write(b, true)?;
        drop(meta);
        // The marker is written last: a store is initialised only once complete.
        write_marker(
            root,
            &Marker {
                format: FORMAT,
                data_dir: data_rel,
            },
        )
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
        if marker.format > FORMAT {
            return Err(Error::Invalid(format!(
                "{} is a store of format {}; this revault reads formats up to {FORMAT}",
                root.display(),
                marker.format
            )));
        }
        let lock = StoreLock::acquire(root, mode == OpenMode::ReadWrite, what)?;
        // A read-write open brings the metadata up to the current format,
        // then says so in the marker.
        let meta = Meta::open(&root.join(META_DIR), mode == OpenMode::ReadOnly)
            .map_err(|e| explain_meta_open(root, e))?;
        if mode == OpenMode::ReadWrite && marker.format < FORMAT {
            meta.migrate_refs()?;
            write_marker(
                root,
                &Marker {
                    format: FORMAT,
                    ..marker.clone()
                },
            )?;
        }
        let config = meta
            .config()?
            .ok_or_else(|| corrupt_meta("store config", "missing"))?;
        let mut counters = meta.counters()?;
        let data_dir = resolve(root, &marker.data_dir);
        if mode == OpenMode::ReadWrite {
            // Metadata that lost writes may hand out a session id whose
            // directory exists: never reuse one (its files may be the only
            // copy of data whose records were lost).
            let seen = crate::orphans::highest_session_on_disk(&data_dir)?;
            counters.next_session = counters.next_session.max(seen.map_or(0, |s| s + 1));
        }
        let store = Store {
            root: root.to_path_buf(),
            data_dir,
            meta,
            config,
            mode,
            ids: Mutex::new(counters),
            commit_lock: Mutex::new(()),
            writers: Mutex::new(HashSet::new()),
            pins: Mutex::new(PinState::default()),
            readers: Mutex::new(ReaderState::default()),
            maintenance: Mutex::new(()),
            failpoint: Mutex::new(None),
            pause_hooks: Mutex::new(Vec::new()),
            crashed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            unsettled: Arc::default(),
            _lock: Some(lock),
        };
        if mode == OpenMode::ReadWrite {
            store.recover_sessions()?;
            crate::orphans::adopt_untracked(&store)?;
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Waits for the open's background work (the metadata flush): a server
    /// does this before it takes requests, so that work's disk use (RocksDB
    /// preallocates its tables) is not racing the first backup's.
    pub fn settle(&self) {
        self.meta.wait_flushed();
    }

    /// Whether this store takes writes now and nothing awaits a reopen: it
    /// is open read-write, the metadata takes a write (see
    /// [`Meta::probe_write`]), and no commit's write failed (its session's
    /// files wait for the next read-write open to settle them).
    pub fn probe_metadata(&self) -> Result<()> {
        self.require_writable()?;
        self.meta.probe_write()?;
        let unsettled = self.unsettled.lock().len();
        if unsettled > 0 {
            return Err(Error::Internal(format!(
                "{unsettled} commit(s) failed to write their metadata; a reopen settles them"
            )));
        }
        Ok(())
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
        // The id is allocated and its record written under the commit lock:
        // gc's orphan removal reads the next id and the records under it too
        // (`data_dir_view`), so every session below that id is recorded.
        let _g = self.commit_lock.lock();
        let (id, counters) = {
            let mut c = self.ids.lock();
            let id = c.next_session;
            if id >= ContainerId::SESSION_LIMIT {
                return Err(Error::Internal(format!(
                    "session ids are exhausted (next {id:#x}); the store takes no more writes"
                )));
            }
            c.next_session += 1;
            (id, *c)
        };
        let rec = SessionRecord {
            kind: kind.to_string(),
            started_unix: now_unix(),
            pid: std::process::id(),
        };
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
            unsettled: self.unsettled.clone(),
        })
    }

    /// A commit of `session` failed to write: keep its files (see `unsettled`).
    pub(crate) fn commit_write_failed(&self, session: u64) {
        self.unsettled.lock().insert(session);
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

    /// Finds the copies new data with these fingerprints may dedup to and
    /// pins every one of them: only complete units that no slide or gc is
    /// about to trim or free are offered. The ids of everything pinned are
    /// appended to `pinned` for the caller to unpin when it is done; each
    /// fingerprint's candidates come newest first, and an empty list means no
    /// usable copy.
    ///
    /// No lock is held while reading. The copies are pinned before their
    /// records are read: a commit never frees a pinned unit and holds the pin
    /// lock until its batch is written, and a slide or gc dooms what it trims
    /// before writing, so a record read after the pin is one that stays. Those
    /// found gone or trimmed are unpinned at once. Reads are batched (a
    /// chunk-mode backup looks up a whole buffer's chunks at once; one read
    /// per key was half of its dedup stage), and each record is read once.
    pub(crate) fn lookup_pin(
        &self,
        kind: DedupUnit,
        fps: &[Fp],
        pinned: &mut Vec<u64>,
    ) -> Result<FxHashMap<Fp, Vec<UnitCopy>>> {
        let copies = FullIndex(&self.meta).copies_many(kind, fps)?;
        let mut ids: Vec<u64> = copies.iter().flatten().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let usable: FxHashMap<u64, UnitCopy> = self
            .pin_read(&ids, pinned)?
            .into_iter()
            .filter_map(|(_, copy)| copy.map(|c| (c.id, c)))
            .collect();
        Ok(fps
            .iter()
            .zip(copies)
            .map(|(fp, ids)| {
                let cands = ids
                    .iter()
                    .filter_map(|id| usable.get(id).copied())
                    .collect();
                (*fp, cands)
            })
            .collect())
    }

    /// Pins the units of a version a backup reads anyway (the previous one,
    /// to predict chunks from; see the predict module) and returns each one's
    /// record, with the copy new data may dedup to when it is usable. A
    /// missing record is an error: the recipe names it.
    pub(crate) fn read_pin(
        &self,
        ids: &[u64],
        pinned: &mut Vec<u64>,
    ) -> Result<Vec<(UnitRecord, Option<UnitCopy>)>> {
        self.pin_read(ids, pinned)?
            .into_iter()
            .zip(ids)
            .map(|((u, copy), &id)| Ok((crate::meta::referenced(id, u)?, copy)))
            .collect()
    }

    /// Pins each unit of `ids` that no slide or gc has doomed, then reads
    /// every record (pinned first, read after: see [`Store::lookup_pin`]).
    /// A pinned unit whose record is there and complete is a usable copy: it
    /// stays pinned, its id appended to `pinned` for the caller to unpin when
    /// done. The others are unpinned at once.
    fn pin_read(
        &self,
        ids: &[u64],
        pinned: &mut Vec<u64>,
    ) -> Result<Vec<(Option<UnitRecord>, Option<UnitCopy>)>> {
        let held: Vec<bool> = {
            let mut guard = self.pins.lock();
            let p = &mut *guard;
            ids.iter()
                .map(|id| {
                    let ok = !p.doomed.contains(id);
                    if ok {
                        *p.pins.entry(*id).or_default() += 1;
                    }
                    ok
                })
                .collect()
        };
        let records = match self.meta.units_many(ids) {
            Ok(r) => r,
            Err(e) => {
                self.unpin(ids.iter().zip(&held).filter(|x| *x.1).map(|x| *x.0));
                return Err(e);
            }
        };
        let mut unusable = Vec::new();
        let out = ids
            .iter()
            .zip(held)
            .zip(records)
            .map(|((&id, held), u)| {
                let copy = u
                    .as_ref()
                    .filter(|u| held && !u.trimmed)
                    .map(|u| UnitCopy::of(id, u));
                if copy.is_some() {
                    pinned.push(id);
                } else if held {
                    unusable.push(id);
                }
                (u, copy)
            })
            .collect();
        self.unpin(unusable);
        Ok(out)
    }

    /// Marks a unit as about to be trimmed or freed, unless a backup pinned it.
    pub(crate) fn try_doom(&self, id: u64) -> bool {
        let mut p = self.pins.lock();
        if p.pins.contains_key(&id) {
            return false;
        }
        p.doomed.insert(id);
        true
    }

    pub(crate) fn undoom(&self, ids: impl IntoIterator<Item = u64>) {
        let mut p = self.pins.lock();
        for id in ids {
            p.doomed.remove(&id);
        }
    }

    /// What gc and check need to tell the data directory's files apart,
    /// read at one instant: the store's records from one snapshot, the next
    /// session id, and the freed files that readers still hold. Taken under
    /// the commit lock, so no commit (and no session start) is half-way.
    pub(crate) fn data_dir_view(&self) -> Result<crate::orphans::DataDirView> {
        let _g = self.commit_lock.lock();
        let next_session = (self.mode == OpenMode::ReadWrite).then(|| self.ids.lock().next_session);
        let pending = self
            .readers
            .lock()
            .pending
            .iter()
            .map(|(_, id)| id.0)
            .collect();
        let snap = self.meta.db().snapshot();
        drop(_g);
        crate::orphans::DataDirView::read(&self.meta, &snap, next_session, pending)
    }

    /// Serialises slides, expiries and gc.
    pub(crate) fn maintenance(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.maintenance.lock()
    }

    /// A consistent view for a reader: metadata from a snapshot, and container
    /// files kept on disk until the view is dropped.
    pub fn read_view(&self) -> ReadView<'_> {
        let epoch = {
            let mut r = self.readers.lock();
            let e = r.epoch;
            *r.active.entry(e).or_default() += 1;
            e
        };
        ReadView {
            store: self,
            snap: self.meta.db().snapshot(),
            epoch,
        }
    }

    fn end_read(&self, epoch: u64) {
        let doomed = {
            let mut r = self.readers.lock();
            if let Some(n) = r.active.get_mut(&epoch) {
                *n -= 1;
                if *n == 0 {
                    r.active.remove(&epoch);
                }
            }
            r.take_deletable()
        };
        if !doomed.is_empty() {
            self.pause_point("read.end.unlink");
        }
        for id in doomed {
            self.remove_container_file(id);
        }
    }

    /// Units whose references reached zero while a backup had them pinned
    /// (recorded by the commit that dropped the last reference).
    pub(crate) fn zombies(&self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        self.meta
            .for_each_prefix(crate::format::keys::CF_MARKS, b"Z", |k, _| {
                out.extend(crate::format::keys::prefixed_id(k));
                Ok(true)
            })?;
        Ok(out)
    }

    pub(crate) fn is_pinned(&self, id: u64) -> bool {
        self.pins.lock().pins.contains_key(&id)
    }

    /// Arms a failpoint (tests): when the engine reaches `name` it stops as if
    /// the process had been killed there: no cleanup, no further writes.
    /// Reopen the store to recover.
    #[doc(hidden)]
    pub fn arm_failpoint(&self, name: &str) {
        *self.failpoint.lock() = Some(name.to_string());
    }

    /// Runs `hook` (once) when the engine next reaches the pause point
    /// `name` (tests): forces an interleaving that threads would hit only by
    /// chance, e.g. a backup committing in the middle of a slide. The hook
    /// runs on the engine's thread, holding what the engine holds there.
    #[doc(hidden)]
    pub fn on_pause_point(&self, name: &str, hook: PauseHook) {
        self.pause_hooks.lock().push((name.to_string(), hook));
    }

    pub(crate) fn pause_point(&self, name: &str) {
        let hook = {
            let mut h = self.pause_hooks.lock();
            h.iter()
                .position(|(n, _)| n == name)
                .map(|i| h.swap_remove(i).1)
        };
        if let Some(hook) = hook {
            hook(self);
        }
    }

    pub(crate) fn failpoint(&self, name: &str) -> Result<()> {
        let mut f = self.failpoint.lock();
        if f.as_deref() == Some(name) {
            *f = None;
            self.crashed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(Error::Internal(format!(
                "simulated crash at failpoint {name}"
            )));
        }
        if self.crashed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Internal(
                "the store crashed at a failpoint; reopen it".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn unpin(&self, ids: impl IntoIterator<Item = u64>) {
        let mut p = self.pins.lock();
        for id in ids {
            if let Some(n) = p.pins.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    p.pins.remove(&id);
                }
            }
        }
    }

    /// Registers container files freed by a durable commit; returns those no
    /// active reader can still need (the rest wait for their readers).
    pub(crate) fn files_freed(&self, ids: &[ContainerId]) -> Vec<ContainerId> {
        let mut r = self.readers.lock();
        r.epoch += 1;
        let e = r.epoch;
        r.pending.extend(ids.iter().map(|id| (e, *id)));
        r.take_deletable()
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
        series_in(&self.meta, name)
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
        resolve_version_in(&self.meta, series, sel)
    }

    pub fn totals(&self) -> Result<Totals> {
        self.meta.totals()
    }
}

/// A series by name, from any reader.
pub fn series_in(r: &impl MetaRead, name: &str) -> Result<SeriesRecord> {
    check_series_name(name)?;
    r.series(name)?
        .ok_or_else(|| Error::UnknownSeries(name.to_string()))
}

/// Resolves `N` or `latest` to a committed version, from any reader.
pub fn resolve_version_in(
    r: &impl MetaRead,
    series: &SeriesRecord,
    sel: &VersionSel,
) -> Result<VersionRecord> {
    let versions = r.versions(series)?;
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

/// A stored unit new data can dedup to: what a backup needs to reference it
/// and to judge where it lies (the rewrite policies look at its container).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnitCopy {
    pub id: u64,
    pub container: ContainerId,
    pub vbase: u64,
}

impl UnitCopy {
    pub fn of(id: u64, u: &UnitRecord) -> Self {
        UnitCopy {
            id,
            container: u.container,
            vbase: u.vbase,
        }
    }
}

#[derive(Default)]
pub(crate) struct PinState {
    /// A backup pins every unit it may reference (tens of thousands in
    /// chunk mode): a fast hash, not the DoS-resistant default, since unit
    /// ids are ours.
    pub(crate) pins: FxHashMap<u64, u32>,
    pub(crate) doomed: FxHashSet<u64>,
}

/// Commits are numbered (epochs). A reader registered at epoch `e` may use any
/// container that existed at `e`; a file freed by the commit that made epoch
/// `f` is unlinked once no reader with an epoch below `f` is active.
#[derive(Default)]
struct ReaderState {
    epoch: u64,
    active: std::collections::BTreeMap<u64, usize>,
    pending: Vec<(u64, ContainerId)>,
}

impl ReaderState {
    fn take_deletable(&mut self) -> Vec<ContainerId> {
        let oldest = self.active.keys().next().copied();
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(e, _)| oldest.is_none_or(|o| o >= *e));
        self.pending = later;
        now.into_iter().map(|(_, id)| id).collect()
    }
}

/// A reader's consistent view of the store (see [`Store::read_view`]).
pub struct ReadView<'s> {
    store: &'s Store,
    snap: rocksdb::Snapshot<'s>,
    epoch: u64,
}

impl ReadView<'_> {
    pub fn store(&self) -> &Store {
        self.store
    }
}

impl MetaRead for ReadView<'_> {
    fn get_raw(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.snap.get_cf(self.store.meta.cf(cf), key)?)
    }

    fn multi_get_raw(&self, cf: &str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let h = self.store.meta.cf(cf);
        self.snap
            .multi_get_cf(keys.iter().map(|k| (h, k.as_slice())))
            .into_iter()
            .map(|r| r.map_err(Error::from))
            .collect()
    }

    fn scan(&self, cf: &str, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let it = self.snap.iterator_cf(
            self.store.meta.cf(cf),
            rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward),
        );
        for item in it {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }
}

impl Drop for ReadView<'_> {
    fn drop(&mut self) {
        self.store.end_read(self.epoch);
    }
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
    unsettled: Arc<Mutex<HashSet<u64>>>,
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
        if self.committed || self.crashed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if self.unsettled.lock().contains(&self.id) {
            tracing::warn!(session = self.id, dir = %self.dir().display(),
                "a commit write failed: its files stay until the next read-write open sees whether it landed");
            return;
        }
        // The session record stays until the next read-write open clears it;
        // removing the files now returns the space at once.
        let _ = std::fs::remove_dir_all(self.dir());
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

/// Refuses to initialise a directory without a marker that holds store
/// content: a lost marker must not turn `init` (or `serve --init`) into a
/// reset of the metadata of backups that exist. An interrupted init (an
/// empty metadata database, no containers) is completed instead.
fn refuse_store_content(root: &Path, data_dir: &Path) -> Result<()> {
    let mut found = Vec::new();
    let meta_dir = root.join(META_DIR);
    if meta_dir.exists() {
        match Meta::open(&meta_dir, true) {
            Ok(m) => {
                let series = m.all_series()?.len();
                let mut containers = 0u64;
                m.for_each_prefix(crate::format::keys::CF_CONTAINERS, b"", |_, _| {
                    containers += 1;
                    Ok(true)
                })?;
                if series > 0 || containers > 0 {
                    found.push(format!(
                        "a metadata database (meta/) with {series} series and {containers} containers"
                    ));
                }
            }
            Err(e) => found.push(format!(
                "a metadata directory meta/ that does not open ({e})"
            )),
        }
    }
    if let Ok(entries) = std::fs::read_dir(data_dir) {
        // A fresh filesystem's lost+found is not store content.
        let n = entries
            .flatten()
            .filter(|e| e.file_name() != "lost+found")
            .count();
        if n > 0 {
            found.push(format!(
                "{n} entries in the data directory {}",
                data_dir.display()
            ));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(Error::NotEmpty {
        path: root.to_path_buf(),
        found: found.join(" and "),
    })
}

/// RocksDB refuses to open metadata whose log files went missing (we ask
/// it to check, `track_and_verify_wals`): the latest commits would be
/// silently lost, and the next open would take their sessions for crashed
/// ones and delete their containers. Say so in the store's terms.
fn explain_meta_open(root: &Path, e: Error) -> Error {
    let Error::Db(db) = &e else { return e };
    let m = db.to_string();
    // The failures of RocksDB's WAL verification (db/wal_edit.cc,
    // db/db_impl/db_impl_open.cc).
    let missing = m.contains("Missing WAL") || m.contains("with no WAL files");
    let short = m.contains("Size mismatch: WAL");
    if missing || short {
        let what = if missing {
            "log files are missing"
        } else {
            "a log file is shorter than it was when synced"
        };
        return corrupt_meta(
            format!("the metadata log of {}", root.join(META_DIR).display()),
            format!(
                "{m}: {what}, so the latest commits are not in the metadata. \
                 Nothing was changed and no container was touched; put the log files back, or \
                 see docs/retention.md (\"Orphans and quarantine\")"
            ),
        );
    }
    e
}

fn resolve(root: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
    }
}

/// Creates `dir` and its missing parents so that they survive a power cut:
/// the parent of every directory created is fsynced (the power-loss test
/// lost whole stores acknowledged by `init`, whose own directory entry was
/// never synced). The store root's contents are synced by the marker write.
fn create_dir_durable(dir: &Path) -> Result<()> {
    let mut created = Vec::new();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        created.push(d.to_path_buf());
        p = d.parent();
    }
    std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
    for d in created.iter().rev() {
        match d.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .ctx(|| format!("syncing directory {}", dir.display()))
}

/// The store format this build writes. 2: reference counts in blocks of
/// 64 units (format 1 kept one record per unit; a read-write open moves
/// them). Older builds do not check this number (the column family of the
/// blocks stops them instead, see [`crate::format::keys::CF_REFCOUNTS`]); builds
/// from this one on refuse a newer format instead of misreading it.
const FORMAT: u32 = 2;

/// Writes the marker whole or not at all (a new file renamed over it): a
/// crash while rewriting it must not leave a store that cannot be opened.
fn write_marker(root: &Path, m: &Marker) -> Result<()> {
    let marker = serde_json::to_vec_pretty(m).expect("marker serialises");
    let tmp = root.join(format!("{MARKER}.new"));
    write_synced(&tmp, &marker)?;
    std::fs::rename(&tmp, root.join(MARKER)).ctx(|| format!("renaming {}", tmp.display()))?;
    sync_dir(root)
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

/// Releases doomed units when a slide or gc ends, committed or not.
pub(crate) struct Undoom<'s>(pub &'s Store, pub Vec<u64>);

impl Drop for Undoom<'_> {
    fn drop(&mut self) {
        self.0.undoom(self.1.drain(..));
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

    /// Issue 18, defect 4: `init` (and `serve --init`) over a store whose
    /// marker is missing reset its metadata and deleted its containers.
    #[test]
    fn init_refuses_a_directory_holding_a_store_without_its_marker() {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        {
            let s = Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap();
            let src =
                crate::source::StreamSource::new("t", std::io::Cursor::new(vec![7u8; 1 << 20]));
            crate::backup::backup(&s, "ns/a", Box::new(src), &Default::default()).unwrap();
        }
        let marker = std::fs::read(dir.path().join(MARKER)).unwrap();
        std::fs::remove_file(dir.path().join(MARKER)).unwrap();
        let files = |d: &Path| -> usize { walk(d).len() };
        let before = files(&dir.path().join("data"));
        assert!(before > 0);
        let e = Store::init(dir.path(), &InitOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.code(), "not_empty", "{msg}");
        assert!(
            msg.contains("1 series") && msg.contains("data directory"),
            "{msg}"
        );
        assert_eq!(
            files(&dir.path().join("data")),
            before,
            "init touched the data"
        );
        // With the marker written back, the store and its backup are intact.
        std::fs::write(dir.path().join(MARKER), marker).unwrap();
        let s = Store::open(dir.path(), OpenMode::ReadOnly, "t").unwrap();
        let series = s.series("ns/a").unwrap();
        assert_eq!(s.versions(&series).unwrap().len(), 1);
    }

    /// An init that stopped before writing its marker left an empty store:
    /// running init again completes it.
    #[test]
    fn init_completes_an_interrupted_init() {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        std::fs::remove_file(dir.path().join(MARKER)).unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap();
    }

    fn walk(d: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }

    #[test]
    fn an_older_format_is_upgraded_by_a_writer_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let format = || -> u32 {
            let m: Marker =
                serde_json::from_slice(&std::fs::read(dir.path().join(MARKER)).unwrap()).unwrap();
            m.format
        };
        assert_eq!(format(), FORMAT);
        let set = |f: u32| {
            let m = Marker {
                format: f,
                data_dir: PathBuf::from("data"),
            };
            write_marker(dir.path(), &m).unwrap();
        };
        set(1);
        drop(Store::open(dir.path(), OpenMode::ReadOnly, "t").unwrap());
        assert_eq!(format(), 1, "a reader changes nothing");
        drop(Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap());
        assert_eq!(format(), FORMAT, "a writer upgrades");
        set(FORMAT + 1);
        let e = Store::open(dir.path(), OpenMode::ReadOnly, "t")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(&format!("format {}", FORMAT + 1)), "{e}");
    }
}
