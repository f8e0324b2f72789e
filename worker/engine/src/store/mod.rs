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

mod cold;
pub mod commit;
pub mod domain;
mod failpoints;
pub mod lock;
pub mod orphans;
pub mod pack;
mod pins;
mod session;
mod view;

pub use cold::{ColdTier, OnSealed};
pub use failpoints::PauseHook;
pub(crate) use pins::{PinState, Undoom, UnitCopy};
pub(crate) use session::{ContainerAlloc, Session};
use view::ReaderState;
pub use view::{resolve_version_in, series_in, ReadView, VersionSel};

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::StoreConfig;
use crate::error::{corrupt_meta, Error, IoContext, Result};
use crate::format::container::session_dir_name;
use crate::format::keys::{CF_SESSIONS, DOMAINS_KEY};
use crate::format::records::{Counters, SessionRecord, Totals};
use crate::index::{SampledIndex, SampledStats};
use crate::meta::{Meta, MetaRead};
use crate::store::lock::StoreLock;
use domain::DedupDomain;

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
    /// Where containers missing from the data directory are read (the durable tier).
    cold: parking_lot::RwLock<Option<Arc<dyn ColdTier>>>,
    /// Who is told of each sealed container (the durable tier's early uploads).
    on_sealed: parking_lot::RwLock<Option<OnSealed>>,
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
    /// Set by [`Store::use_sampled_index`]: backups look fingerprints up there instead of in
    /// the exact index.
    pub(crate) sampled: Option<Mutex<SampledIndex>>,
    /// Set by [`Store::set_dedup_domain`]: what backups may deduplicate against.
    dedup_domain: DedupDomain,
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

    /// Makes `root` a store around metadata already in `root/meta` (a checkpoint the
    /// durable tier brought back): creates the data directory (`data_dir`, default `data`)
    /// and writes the marker last. The metadata must open; the data directory must be empty.
    pub fn init_recovered(root: &Path, data_dir: Option<PathBuf>) -> Result<()> {
        if root.join(MARKER).exists() {
            return Err(Error::AlreadyInitialised(root.to_path_buf()));
        }
        let data_rel = data_dir.unwrap_or_else(|| PathBuf::from("data"));
        let data = resolve(root, &data_rel);
        if std::fs::read_dir(&data).is_ok_and(|mut d| d.next().is_some()) {
            return Err(Error::NotEmpty {
                path: data.clone(),
                found: "files in the data directory".into(),
            });
        }
        let meta =
            Meta::open(&root.join(META_DIR), true).map_err(|e| explain_meta_open(root, e))?;
        meta.config()?
            .ok_or_else(|| corrupt_meta("store config", "missing"))?;
        create_dir_durable(&data)?;
        sync_dir(&root.join(META_DIR))?;
        // Metadata that recorded dedup domains may hold tagged units: the marker says so.
        let format = if meta.get_raw("default", DOMAINS_KEY)?.is_some() {
            FORMAT_DOMAINS
        } else {
            FORMAT
        };
        drop(meta);
        write_marker(
            root,
            &Marker {
                format,
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
        if marker.format > FORMAT_DOMAINS {
            return Err(Error::Invalid(format!(
                "{} is a store of format {}; this revault reads formats up to {FORMAT_DOMAINS}",
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
        if mode == OpenMode::ReadWrite {
            // A crash between recording domains and the marker: finish it.
            mark_domains(root, &meta, &read_marker(root)?)?;
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
            let seen = orphans::highest_session_on_disk(&data_dir)?;
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
            cold: parking_lot::RwLock::new(None),
            on_sealed: parking_lot::RwLock::new(None),
            failpoint: Mutex::new(None),
            pause_hooks: Mutex::new(Vec::new()),
            crashed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            unsettled: Arc::default(),
            sampled: None,
            dedup_domain: DedupDomain::Store,
            _lock: Some(lock),
        };
        if mode == OpenMode::ReadWrite {
            store.recover_sessions()?;
            orphans::adopt_untracked(&store)?;
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Backups of this store look their fingerprints up in a sampled, progressive index
    /// of about `budget` bytes of memory (see [`crate::index::sampled`]) instead of the
    /// exact index on disk: the lookups stay in memory as the store grows, at the cost of
    /// a duplicate copy now and then. Builds the sample from the exact index, which commits
    /// keep as before.
    pub fn use_sampled_index(&mut self, budget: usize) -> Result<()> {
        let units = self.meta.totals()?.units;
        self.sampled = Some(Mutex::new(SampledIndex::open(&self.meta, budget, units)?));
        Ok(())
    }

    /// Backups from now on deduplicate within `d` (see the [`domain`] module). Units keep
    /// the domain they were written for, so switching is safe at any time. Namespace domains
    /// on a store opened read-write record that in the metadata ([`DOMAINS_KEY`], which the
    /// durable tier's checkpoints carry), then mark the store [`FORMAT_DOMAINS`], before any
    /// tagged unit is written.
    pub fn set_dedup_domain(&mut self, d: DedupDomain) -> Result<()> {
        if d == DedupDomain::Namespace && self.mode == OpenMode::ReadWrite {
            if self.meta.get_raw("default", DOMAINS_KEY)?.is_none() {
                let mut b = self.meta.batch();
                b.put("default", DOMAINS_KEY, b"");
                self.meta.write(b, true)?;
            }
            let marker = read_marker(&self.root)?;
            mark_domains(&self.root, &self.meta, &marker)?;
        }
        self.dedup_domain = d;
        Ok(())
    }

    pub fn dedup_domain(&self) -> DedupDomain {
        self.dedup_domain
    }

    /// What the sampled index holds, when the store uses one.
    pub fn sampled_index_stats(&self) -> Option<SampledStats> {
        self.sampled.as_ref().map(|s| s.lock().stats())
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

    /// How the store was opened.
    pub fn mode(&self) -> OpenMode {
        self.mode
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

    /// What gc and check need to tell the data directory's files apart,
    /// read at one instant: the store's records from one snapshot, the next
    /// session id, and the freed files that readers still hold. Taken under
    /// the commit lock, so no commit (and no session start) is half-way.
    pub(crate) fn data_dir_view(&self) -> Result<orphans::DataDirView> {
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
        orphans::DataDirView::read(&self.meta, &snap, next_session, pending)
    }

    /// Serialises slides, expiries and gc.
    pub(crate) fn maintenance(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.maintenance.lock()
    }

    // ---- lookups used by every command --------------------------------------
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
/// 3: unit records may carry a dedup domain (unit record format 2, `domain`). A store is
/// marked so once its metadata holds [`DOMAINS_KEY`] (written when it is first opened
/// read-write with namespace domains, [`Store::set_dedup_domain`]; a store rebuilt from the
/// durable tier gets the mark from its metadata), so that releases before domains refuse it
/// with this message rather than report its tagged units corrupt; a store that never used
/// domains stays at [`FORMAT`], which they read.
const FORMAT_DOMAINS: u32 = 3;

/// The marker as stored.
fn read_marker(root: &Path) -> Result<Marker> {
    let path = root.join(MARKER);
    let bytes = std::fs::read(&path).ctx(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| corrupt_meta(path.display().to_string(), e.to_string()))
}

/// Marks the store [`FORMAT_DOMAINS`] when its metadata recorded dedup domains.
fn mark_domains(root: &Path, meta: &Meta, marker: &Marker) -> Result<()> {
    if marker.format >= FORMAT_DOMAINS || meta.get_raw("default", DOMAINS_KEY)?.is_none() {
        return Ok(());
    }
    write_marker(
        root,
        &Marker {
            format: FORMAT_DOMAINS,
            ..marker.clone()
        },
    )
}

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
            crate::ingest::backup(&s, "ns/a", Box::new(src), &Default::default()).unwrap();
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
        set(FORMAT_DOMAINS);
        drop(Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap());
        assert_eq!(
            format(),
            FORMAT_DOMAINS,
            "a store that used dedup domains stays marked"
        );
        set(FORMAT_DOMAINS + 1);
        let e = Store::open(dir.path(), OpenMode::ReadOnly, "t")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(&format!("format {}", FORMAT_DOMAINS + 1)), "{e}");
    }
}
