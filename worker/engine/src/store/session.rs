//! Write sessions: a record of every operation that writes containers, and the allocator of
//! their container ids (see the store's crash-safety notes in `store`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::format::container::{session_dir_name, ContainerId};
use crate::format::keys::CF_SESSIONS;
use crate::format::records::SessionRecord;
use crate::meta::MetaRead;
use crate::store::{now_unix, sync_dir, Store};

impl Store {
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
