//! The data directory's files, and what gc may do with each.
//!
//! A file under `data/SESSION/` is one of:
//! - a container a record names (**live**);
//! - a container of a session **in flight**: its session record exists (it
//!   has not committed; a crash leaves it to the next read-write open), or
//!   the session started after the metadata was read;
//! - a container a commit freed: its unlink **waits** for a reader that may
//!   still read it, or a crash came between the commit and the unlink. The
//!   commit records `F`+container ([`crate::format::keys::freed_key`]) in the same
//!   batch, and that key is gc's proof that the file may go;
//! - anything else: no record names it and no commit freed it. The commit
//!   protocol never leaves such a file, unless the metadata lost writes (a
//!   deleted RocksDB log, an old copy of `meta/` put back). It may then be
//!   the only copy of acknowledged backups, so gc moves it to
//!   `data/quarantine/` and never deletes it, and `check` reports it.
//!
//! All of this is decided against one view of the store ([`DataDirView`],
//! taken under the commit lock): records from one snapshot, the next session
//! id, and the freed files readers hold. Two separate reads would let a
//! commit land between them and make its containers look orphaned.
//!
//! A reader that ends unlinks the freed files that waited for it (and their
//! session directory, once empty) on its own thread, without that lock: such
//! a file may be freed and held by no reader in the view, and vanish while
//! gc looks at it. Gone is what gc wanted, so a file or session directory
//! that is no longer there is not an error.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashSet;
use serde::Serialize;

use crate::error::{IoContext, Result};
use crate::format::container::{session_dir_name, ContainerId};
use crate::format::keys::{
    freed_key, zombie_key, CF_CONTAINERS, CF_MARKS, CF_SESSIONS, CF_UNITS, MARKS_KEPT_KEY,
};
use crate::meta::{scan_refs, Meta, MetaRead};
use crate::store::{sync_dir, Store};

/// Where gc puts files nothing explains (inside the data directory, so a
/// move is a rename on the same filesystem).
pub const QUARANTINE: &str = "quarantine";

#[derive(Clone, Debug, Default, Serialize)]
pub struct OrphanReport {
    /// Freed container files deleted (a crash came between their commit and
    /// their unlink).
    pub orphan_files: u64,
    pub orphan_bytes: u64,
    pub empty_dirs: u64,
    /// Files no record names and no commit freed, moved to `data/quarantine`.
    pub quarantined_files: u64,
    pub quarantined_bytes: u64,
}

/// The store as gc and check see the data directory (see the module docs).
pub(crate) struct DataDirView {
    known: FxHashSet<u64>,
    active: FxHashSet<u64>,
    freed: FxHashSet<u64>,
    /// Sessions from this id on started after the view: in flight. `None`
    /// for a read-only store, which no session can be writing to.
    next_session: Option<u64>,
    pending: FxHashSet<u64>,
}

impl DataDirView {
    pub(crate) fn read(
        meta: &Meta,
        snap: &rocksdb::Snapshot<'_>,
        next_session: Option<u64>,
        pending: FxHashSet<u64>,
    ) -> Result<Self> {
        let ids = |cf: &str, prefix: &[u8]| -> Result<FxHashSet<u64>> {
            let mut out = FxHashSet::default();
            let it = snap.iterator_cf(
                meta.cf(cf),
                rocksdb::IteratorMode::From(prefix, rocksdb::Direction::Forward),
            );
            for item in it {
                let (k, _) = item?;
                if !k.starts_with(prefix) {
                    break;
                }
                let raw = &k[prefix.len()..];
                if let Ok(b) = <[u8; 8]>::try_from(raw) {
                    out.insert(u64::from_be_bytes(b));
                }
            }
            Ok(out)
        };
        Ok(DataDirView {
            known: ids(CF_CONTAINERS, b"")?,
            active: ids(CF_SESSIONS, b"")?,
            freed: ids(CF_MARKS, b"F")?,
            next_session,
            pending,
        })
    }

    fn in_flight(&self, session: u64) -> bool {
        self.active.contains(&session) || self.next_session.is_some_and(|n| session >= n)
    }

    fn state(&self, c: Option<ContainerId>) -> FileState {
        let Some(c) = c else {
            return FileState::Unknown;
        };
        if self.known.contains(&c.0) {
            FileState::Live
        } else if self.pending.contains(&c.0) {
            FileState::Pending
        } else if self.freed.contains(&c.0) {
            FileState::Freed
        } else {
            FileState::Unknown
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileState {
    Live,
    /// Freed; a reader that started before the commit may still read it.
    Pending,
    /// Freed by a durable commit: may be deleted.
    Freed,
    /// Named by no record, freed by no commit: quarantined, never deleted.
    Unknown,
}

pub(crate) struct DataFile {
    pub path: PathBuf,
    pub session: u64,
    /// The container its name stands for, if it is named like one.
    pub container: Option<ContainerId>,
    pub state: FileState,
    pub bytes: u64,
}

/// Every file of the session directories not in flight, classified.
pub(crate) struct Survey {
    pub files: Vec<DataFile>,
    /// Session directories not in flight (removable once empty).
    pub dirs: Vec<PathBuf>,
    /// Sessions in flight (their files are left alone).
    pub in_flight: u64,
    pub quarantined_files: u64,
    pub quarantined_bytes: u64,
}

/// The session a directory name stands for: only names exactly as
/// [`session_dir_name`] writes them, of ids a container id can hold (a
/// stray `+1` or `10000000000` is not a session, and must not move the
/// next session id to where container ids wrap around).
fn session_of(name: &str) -> Option<u64> {
    let id = u64::from_str_radix(name, 16).ok()?;
    (id < ContainerId::SESSION_LIMIT && session_dir_name(id) == name).then_some(id)
}

fn container_of(session: u64, name: &str) -> Option<ContainerId> {
    let seq = u64::from_str_radix(name.strip_suffix(".rvc")?, 16).ok()?;
    (seq < 1 << ContainerId::SEQ_BITS).then(|| ContainerId::new(session, seq))
}

pub(crate) fn survey(data: &Path, view: &DataDirView) -> Result<Survey> {
    let mut s = Survey {
        files: Vec::new(),
        dirs: Vec::new(),
        in_flight: 0,
        quarantined_files: 0,
        quarantined_bytes: 0,
    };
    let entries = match std::fs::read_dir(data) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(s),
        Err(e) => return Err(e).ctx(|| format!("reading {}", data.display())),
    };
    for d in entries {
        let d = d.ctx(|| format!("reading {}", data.display()))?;
        let name = d.file_name().to_string_lossy().into_owned();
        if name == QUARANTINE {
            for (_, bytes) in files_in(&d.path())? {
                s.quarantined_files += 1;
                s.quarantined_bytes += bytes;
            }
            continue;
        }
        // Anything not named like a session directory is not ours.
        let Some(session) = session_of(&name).filter(|_| d.path().is_dir()) else {
            continue;
        };
        if view.in_flight(session) {
            s.in_flight += 1;
            continue;
        }
        for (path, bytes) in files_in(&d.path())? {
            let file = path.file_name().unwrap_or_default().to_string_lossy();
            let container = container_of(session, &file);
            s.files.push(DataFile {
                state: view.state(container),
                path,
                session,
                container,
                bytes,
            });
        }
        s.dirs.push(d.path());
    }
    Ok(s)
}

/// The files directly in `dir`, with their sizes. A file or directory that
/// goes while it is read (a restore's deferred unlink, gc removing an empty
/// session directory while `check` looks) is simply not there.
fn files_in(dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).ctx(|| format!("reading {}", dir.display())),
    };
    for f in entries {
        let f = f.ctx(|| format!("reading {}", dir.display()))?;
        let m = match f.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).ctx(|| format!("reading {}", f.path().display())),
        };
        if m.is_file() {
            out.push((f.path(), m.len()));
        }
    }
    Ok(out)
}

/// The highest session id any file or directory in the data directory was
/// written under (quarantined files included).
pub(crate) fn highest_session_on_disk(data: &Path) -> Result<Option<u64>> {
    let mut max = None;
    let entries = match std::fs::read_dir(data) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).ctx(|| format!("reading {}", data.display())),
    };
    for d in entries.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        if name == QUARANTINE {
            for (p, _) in files_in(&d.path())? {
                let f = p.file_name().unwrap_or_default().to_string_lossy();
                let s = f.split('-').next().and_then(session_of);
                max = max.max(s);
            }
        } else {
            max = max.max(session_of(&name));
        }
    }
    Ok(max)
}

/// A store last written by a release that kept no freed (`F`) or zombie
/// (`Z`) keys: the containers its commits freed but a crash (or a restore
/// still reading them when it stopped) kept on disk, and the units its
/// commits left unreferenced while a backup had them pinned, are recorded
/// nowhere. Without this they would look like files the metadata lost
/// (quarantined, `check` errors) and units only a full gc frees. At the
/// first read-write open, after crashed sessions were recovered and before
/// anything runs, they are recorded once as what they are.
pub(crate) fn adopt_untracked(store: &Store) -> Result<()> {
    if store.meta.get_raw("default", MARKS_KEPT_KEY)?.is_some() {
        return Ok(());
    }
    let mut b = store.meta.batch();
    // A store that has F or Z keys already keeps them (made by a build
    // from before this key): nothing to adopt.
    let mut keeps = false;
    for p in [b"F", b"Z"] {
        store.meta.for_each_prefix(CF_MARKS, p, |_, _| {
            keeps = true;
            Ok(false)
        })?;
    }
    if keeps {
        b.put("default", MARKS_KEPT_KEY, b"");
        return store.meta.write(b, true);
    }
    let view = store.data_dir_view()?;
    let mut files = 0;
    for f in survey(store.data_dir(), &view)?.files {
        if let (Some(c), FileState::Unknown) = (f.container, f.state) {
            b.put(CF_MARKS, &freed_key(c), b"");
            files += 1;
        }
    }
    let counted: FxHashSet<u64> = scan_refs(&store.meta, |_| {})?
        .into_iter()
        .filter(|(_, r)| !r.is_zero())
        .map(|(id, _)| id)
        .collect();
    let mut units = 0;
    store.meta.for_each_prefix(CF_UNITS, b"", |k, _| {
        if let Ok(id) = <[u8; 8]>::try_from(k).map(u64::from_be_bytes) {
            if !counted.contains(&id) {
                b.put(CF_MARKS, &zombie_key(id), b"");
                units += 1;
            }
        }
        Ok(true)
    })?;
    b.put("default", MARKS_KEPT_KEY, b"");
    store.meta.write(b, true)?;
    if files > 0 || units > 0 {
        tracing::info!(
            files,
            units,
            "recorded the freed containers and unreferenced units a previous release left, for gc"
        );
    }
    Ok(())
}

/// gc's pass over the data directory: deletes what a commit freed and a
/// crash left behind, quarantines what nothing explains, removes empty
/// session directories, and forgets the freed keys of files that are gone.
pub(crate) fn collect(store: &Store) -> Result<OrphanReport> {
    store.require_writable()?;
    let view = store.data_dir_view()?;
    store.pause_point("gc.orphans.scanned");
    let data = store.data_dir();
    let survey = survey(data, &view)?;
    store.pause_point("gc.orphans.surveyed");
    let mut rep = OrphanReport::default();
    let mut touched: BTreeSet<PathBuf> = BTreeSet::new();
    for f in &survey.files {
        match f.state {
            FileState::Freed => {
                match std::fs::remove_file(&f.path) {
                    Ok(()) => {}
                    // Its reader's thread unlinked it meanwhile (module docs).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).ctx(|| format!("removing {}", f.path.display())),
                }
                tracing::info!(file = %f.path.display(), bytes = f.bytes, "removed a freed container file");
                rep.orphan_files += 1;
                rep.orphan_bytes += f.bytes;
            }
            FileState::Unknown => {
                let to = quarantine(data, f)?;
                tracing::error!(file = %f.path.display(), quarantined = %to.display(), bytes = f.bytes,
                    "no record names this file and no commit freed it: the metadata may have lost writes; moved to quarantine, not deleted");
                rep.quarantined_files += 1;
                rep.quarantined_bytes += f.bytes;
            }
            FileState::Live | FileState::Pending => continue,
        }
        touched.extend(f.path.parent().map(Path::to_path_buf));
    }
    for d in &survey.dirs {
        if std::fs::remove_dir(d).is_ok() {
            rep.empty_dirs += 1;
            touched.remove(d);
        }
    }
    for d in &touched {
        sync_session_dir(d)?;
    }
    if rep.quarantined_files > 0 {
        sync_dir(&data.join(QUARANTINE))?;
    }
    if !touched.is_empty() || rep.empty_dirs > 0 || rep.quarantined_files > 0 {
        sync_dir(data)?;
    }
    forget_freed(store, &view)?;
    Ok(rep)
}

/// Makes the removals in a session directory durable, unless a reader's
/// thread removed the directory itself meanwhile (module docs): the caller
/// syncs the data directory, which makes that removal durable.
fn sync_session_dir(dir: &Path) -> Result<()> {
    match sync_dir(dir) {
        Err(crate::error::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Moves a file nothing explains into `data/quarantine/SESSION-NAME`.
fn quarantine(data: &Path, f: &DataFile) -> Result<PathBuf> {
    let q = data.join(QUARANTINE);
    std::fs::create_dir_all(&q).ctx(|| format!("creating {}", q.display()))?;
    let name = f.path.file_name().unwrap_or_default().to_string_lossy();
    let mut to = q.join(format!("{}-{name}", session_dir_name(f.session)));
    let mut n = 1;
    while to.exists() {
        to = q.join(format!("{}-{name}.{n}", session_dir_name(f.session)));
        n += 1;
    }
    std::fs::rename(&f.path, &to)
        .ctx(|| format!("moving {} to {}", f.path.display(), to.display()))?;
    Ok(to)
}

/// Deletes the freed keys of container files that are gone, once their
/// removal is durable (a freed key dropped before the unlink is on disk
/// would turn a file that reappears after a power cut into an unknown one).
fn forget_freed(store: &Store, view: &DataDirView) -> Result<()> {
    let data = store.data_dir();
    let gone: Vec<ContainerId> = view
        .freed
        .iter()
        .map(|id| ContainerId(*id))
        .filter(|c| !view.pending.contains(&c.0) && !c.path(data).exists())
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    let dirs: BTreeSet<PathBuf> = gone
        .iter()
        .map(|c| data.join(session_dir_name(c.session())))
        .filter(|d| d.exists())
        .collect();
    for d in &dirs {
        sync_session_dir(d)?;
    }
    sync_dir(data)?;
    let mut b = store.meta.batch();
    for c in &gone {
        b.delete(CF_MARKS, &freed_key(*c));
    }
    store.meta.write(b, true)
}
