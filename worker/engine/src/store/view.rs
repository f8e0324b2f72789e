//! Read views: one consistent snapshot of the metadata for a long reader, with the
//! container files it may need kept on disk until it is dropped; and looking series and
//! versions up by name.

use crate::error::{Error, Result};
use crate::format::container::ContainerId;
use crate::format::records::{SeriesRecord, Totals, VersionRecord};
use crate::meta::MetaRead;
use crate::store::{check_series_name, Store};

impl Store {
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

    pub fn series(&self, name: &str) -> Result<SeriesRecord> {
        series_in(&self.meta, name)
    }

    pub fn list_series(&self) -> Result<Vec<SeriesRecord>> {
        self.meta.all_series()
    }

    /// The series of namespace `ns` (named `ns/…`).
    pub fn series_in_namespace(&self, ns: &str) -> Result<Vec<SeriesRecord>> {
        self.meta.series_with_prefix(format!("{ns}/").as_bytes())
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

/// Commits are numbered (epochs). A reader registered at epoch `e` may use any
/// container that existed at `e`; a file freed by the commit that made epoch
/// `f` is unlinked once no reader with an epoch below `f` is active.
#[derive(Default)]
pub(super) struct ReaderState {
    pub(super) epoch: u64,
    pub(super) active: std::collections::BTreeMap<u64, usize>,
    pub(super) pending: Vec<(u64, ContainerId)>,
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
