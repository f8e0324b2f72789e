//! Where a store reads a container whose file is not in the data directory: the durable tier
//! (revault-remote) plugs in here, so restores, slides, gc and check read evicted containers
//! through the same code as local ones. The engine knows nothing of buckets or keys.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::container::{Backing, ColdFile, ContainerFile, ContainerId};
use crate::meta::MetaRead;
use crate::store::Store;

/// Opens containers that are not in the data directory.
pub trait ColdTier: Send + Sync {
    /// Container `id`'s file, whose place in the data directory is `local`; an error
    /// ([`Error::MissingContainer`]) when the tier does not hold it either.
    fn open(&self, id: ContainerId, local: &Path) -> Result<Box<dyn ColdFile>>;
    /// Hints that container `id`, whose file the metadata says is `file_bytes` long, will be
    /// opened and read whole soon: a tier may fetch it in the background and serve the next
    /// [`ColdTier::open`] from what it fetched. Every hint is withdrawn by one
    /// [`ColdTier::cancel_prefetch`] or consumed by an opening.
    fn prefetch(&self, _id: ContainerId, _file_bytes: u64) {}
    /// Withdraws one [`ColdTier::prefetch`] whose container will not be opened after all (the
    /// restore that asked ended); what is fetched for no one any more is dropped.
    fn cancel_prefetch(&self, _id: ContainerId) {}
}

/// Told the id of every container a write session of this store seals, once its file is
/// complete (written, not yet fsynced), on the thread that wrote it: the durable tier may start
/// uploading it while the session goes on. The container may still be abandoned with its
/// session (an error, a crash), so a listener must not treat it as committed.
pub type OnSealed = Arc<dyn Fn(ContainerId) + Send + Sync>;

impl Store {
    /// Calls `f` with every container sealed from now on (see [`OnSealed`]).
    pub fn on_container_sealed(&self, f: OnSealed) {
        *self.on_sealed.write() = Some(f);
    }

    pub(crate) fn sealed_listener(&self) -> Option<OnSealed> {
        self.on_sealed.read().clone()
    }

    /// Reads containers missing from the data directory through `tier` from now on.
    pub fn set_cold_tier(&self, tier: Arc<dyn ColdTier>) {
        *self.cold.write() = Some(tier);
    }

    /// Opens container `id`: its file in the data directory, else its copy in the cold
    /// tier, else [`Error::MissingContainer`].
    pub(crate) fn open_container(
        &self,
        id: ContainerId,
        with_units: bool,
    ) -> Result<ContainerFile> {
        if let Some(f) = ContainerFile::open_local(&self.data_dir, id)? {
            return ContainerFile::open_backing(id, Backing::Local(f), with_units);
        }
        let tier = self.cold.read().clone();
        if let Some(tier) = tier {
            let c = tier.open(id, &id.path(&self.data_dir))?;
            return ContainerFile::open_backing(id, Backing::Cold(c), with_units);
        }
        Err(Error::MissingContainer {
            container: id.to_string(),
            path: id.path(&self.data_dir),
        })
    }

    /// Hints to the cold tier that container `id`, not in the data directory (the caller
    /// checked), will be opened and read whole soon, if it decodes to at most `max_vbytes`.
    /// Returns the bytes of its file when the tier took the hint.
    pub(crate) fn prefetch_cold(&self, id: ContainerId, max_vbytes: u64) -> Option<u64> {
        let tier = self.cold.read().clone()?;
        let rec = self.meta.container(id).ok()??;
        if rec.vbytes > max_vbytes {
            return None;
        }
        tier.prefetch(id, rec.file_bytes);
        Some(rec.file_bytes)
    }

    /// Whether container `id`'s file is in the data directory.
    pub(crate) fn is_local(&self, id: ContainerId) -> bool {
        id.path(&self.data_dir).exists()
    }

    /// Withdraws [`Store::prefetch_cold`] hints for containers that will not be opened.
    pub(crate) fn cancel_cold_prefetch(&self, ids: impl IntoIterator<Item = ContainerId>) {
        if let Some(t) = self.cold.read().clone() {
            for id in ids {
                t.cancel_prefetch(id);
            }
        }
    }

    /// Removes container `id`'s file from the data directory once its copy is durable
    /// elsewhere (the caller's promise): reads then go to the cold tier. Readers that have
    /// the file open keep reading it. A container that no record names any more is left
    /// alone (the commit that freed it unlinks it).
    pub fn evict_container(&self, id: ContainerId) -> Result<bool> {
        self.require_writable()?;
        if self.cold.read().is_none() {
            return Err(Error::Invalid(
                "a container can only be evicted from a store with a cold tier".into(),
            ));
        }
        let _g = self.commit_lock.lock();
        let key = id.0.to_be_bytes();
        if self
            .meta
            .get(crate::format::keys::CF_CONTAINERS, &key)?
            .is_none()
        {
            return Ok(false);
        }
        let path = id.path(&self.data_dir);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::Io {
                context: format!("evicting container {}", path.display()),
                source: e,
            }),
        }
    }

    /// Containers freed by commits whose files wait for readers that started before (a
    /// restore still running): the durable tier keeps its copies of these too.
    pub fn freed_awaiting_readers(&self) -> Vec<ContainerId> {
        self.readers
            .lock()
            .pending
            .iter()
            .map(|(_, id)| *id)
            .collect()
    }

    /// Writes a consistent copy of the metadata into `dir` (which must not exist) as a store
    /// directory of its own — `dir/meta` and a marker whose data directory is this store's —
    /// so [`Store::open`] reads it as the store was at one instant. The tables are hard
    /// links where the file system allows; the durable tier uploads what changed.
    pub fn checkpoint(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io {
            context: format!("creating {}", dir.display()),
            source: e,
        })?;
        self.meta.checkpoint(&dir.join(super::META_DIR))?;
        let data_dir = std::path::absolute(&self.data_dir).map_err(|e| Error::Io {
            context: format!("resolving {}", self.data_dir.display()),
            source: e,
        })?;
        super::write_marker(
            dir,
            &super::Marker {
                format: super::FORMAT,
                data_dir,
            },
        )
    }

    /// A number that grows with every change to the store's records (never with the health
    /// probe), across reopens too: a reader that noted it can tell whether anything changed.
    pub fn meta_sequence(&self) -> u64 {
        self.meta.changes()
    }

    /// Never hands out session ids below `next` (persisted): a store rebuilt from a remote
    /// skips the ids a store it replaces may still be using.
    pub fn skip_sessions_to(&self, next: u64) -> Result<()> {
        self.require_writable()?;
        let _g = self.commit_lock.lock();
        let mut c = self.ids.lock();
        if c.next_session >= next {
            return Ok(());
        }
        c.next_session = next;
        let mut b = self.meta.batch();
        b.put_counters(&c);
        self.meta.write(b, true)
    }
}
