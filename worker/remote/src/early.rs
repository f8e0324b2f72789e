//! Early uploads: a container goes up as soon as it is sealed, while the command writing it
//! still runs.
//!
//! A CLI command on a store with a remote returns only once the bucket holds its change. Its
//! sync used to start uploading containers only after the backup (and its automatic slide)
//! had finished, so the upload's whole time added to the command's. Now
//! [`Remote::upload_as_sealed`] has the store tell the remote of every sealed container, and
//! the upload overlaps the rest of the backup; the sync that follows waits for what is still
//! in flight and uploads again what failed.
//!
//! An early upload records nothing. The sync takes an early upload as done only for a
//! container its checkpoint names (a committed one). A container abandoned with its session (a
//! failed backup) is left in the bucket, and the sync does not mark the remote clean while
//! any is left: the next process lists the bucket and removes it, like the leftovers of a
//! crashed sync. That is why the marker is removed *before* the first early upload starts.
//!
//! Early uploads must not do what the sync refuses to do. Before the first of them goes up,
//! and again before every 64th, they check the fence (a store taken over uploads nothing)
//! and that the newest head of this generation in the bucket is this store's own
//! ([`crate::head::newest`]: a store whose disk went back in time reuses the session numbers,
//! so the container names, of the state it lost, whose only copy may be in the bucket). Each is
//! written with `If-None-Match: *` besides: a freshly sealed container never exists yet, so
//! one that does is left alone and the upload fails (the sync, which checks both again,
//! decides). After a failed check no further early upload starts in this process.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use revault_engine::{ContainerId, Store};
use tokio::task::JoinHandle;

use crate::error::{RemoteError, Result};
use crate::fence;
use crate::head::{self, Published};
use crate::layout;
use crate::locks;
use crate::seal::{self, DEFAULT_FRAME_LOG2};
use crate::Remote;

/// A finished upload: the sealed object's header and the container's bytes.
pub(crate) type Uploaded = (Vec<u8>, u64);

/// One early upload under way.
struct Started {
    task: JoinHandle<Result<Uploaded>>,
    /// With Object Lock: when the retention of the uploaded object ends at the earliest.
    locked_until: Option<i64>,
}

/// Early uploads between two checks of the fence and of the newest head (as the sync's
/// batches).
const CHECK_EVERY: u64 = 64;

/// The early uploads of one process (part of [`crate::Inner`]).
pub(crate) struct Early {
    started: parking_lot::Mutex<HashMap<ContainerId, Started>>,
    gate: Arc<Gate>,
    /// Uploads in flight at once (a gc may seal hundreds of containers: not all in memory).
    slots: Arc<tokio::sync::Semaphore>,
}

/// The checks early uploads pass (see the module's documentation).
#[derive(Default)]
struct Gate {
    /// Early uploads started so far; every [`CHECK_EVERY`]th checks again.
    count: std::sync::atomic::AtomicU64,
    /// The outcome of the latest check: uploads wait for it.
    checked: tokio::sync::Mutex<Option<std::result::Result<(), String>>>,
}

impl Default for Early {
    fn default() -> Self {
        Early {
            started: Default::default(),
            gate: Default::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(crate::sync::PARALLEL)),
        }
    }
}

/// What one early upload needs, taken from the remote when it starts.
struct Job {
    bucket: crate::bucket::Bucket,
    key: seal::DataKey,
    lock: Option<crate::bucket::ObjectLock>,
    store: String,
    generation: u32,
    /// What this store published in its generation, when the upload started.
    mine: Published,
    gate: Arc<Gate>,
    slots: Arc<tokio::sync::Semaphore>,
}

/// A finished early upload: (container, sealed header, bytes, when its Object Lock retention
/// ends at the earliest).
pub(crate) type Done = (ContainerId, Vec<u8>, u64, Option<i64>);

impl Remote {
    /// Uploads every container `store` seals from now on at once, in the background (see the
    /// module's documentation). For a process whose syncs run after its writes (the CLI).
    pub fn upload_as_sealed(&self, store: &Store) {
        let (r, data_dir) = (self.clone(), store.data_dir().to_path_buf());
        store.on_container_sealed(Arc::new(move |id| r.start_early(id, data_dir.clone())));
    }

    /// Called on the thread that sealed container `id`.
    fn start_early(&self, id: ContainerId, data_dir: PathBuf) {
        // The marker goes first, under the lock a sync takes to set it again, so a crash from
        // here on is always followed by a listing.
        let mut clean = self.inner.clean.lock();
        if let Err(e) = self.mark_dirty(&mut clean) {
            // Nothing is uploaded early then: the sync uploads it, or fails saying why.
            tracing::warn!(container = %id, error = %e, "not uploading early");
            return;
        }
        let lock = self.object_lock();
        let locked_until = lock.map(|l| locks::now_secs() + l.seconds as i64);
        let job = Job {
            bucket: self.inner.bucket.clone(),
            key: self.inner.key.clone(),
            lock,
            store: self.store_id().to_string(),
            generation: self.generation(),
            mine: match self.published(self.generation()) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "not uploading early");
                    return;
                }
            },
            gate: self.inner.early.gate.clone(),
            slots: self.inner.early.slots.clone(),
        };
        // Listed as pending before it can land, so no listing takes it for a leftover.
        let mut started = self.inner.early.started.lock();
        let task = self.rt().spawn(upload_one(job, id, data_dir));
        started.insert(id, Started { task, locked_until });
    }

    /// Waits for the early uploads of `ids` and forgets them; returns those that succeeded
    /// (the sync uploads the others itself). Early uploads of other containers stay for a
    /// later sync.
    pub(crate) fn collect_early(&self, ids: &[ContainerId]) -> Vec<Done> {
        let mine: Vec<(ContainerId, Started)> = {
            let mut started = self.inner.early.started.lock();
            ids.iter()
                .filter_map(|id| started.remove(id).map(|s| (*id, s)))
                .collect()
        };
        let mut out = Vec::new();
        for (id, s) in mine {
            let outcome = self.run(|_| s.task);
            match outcome {
                Ok(Ok((header, n))) => out.push((id, header, n, s.locked_until)),
                Ok(Err(e)) => {
                    tracing::debug!(container = %id, error = %e, "early upload failed; the sync uploads it");
                }
                Err(e) => {
                    tracing::debug!(container = %id, error = %e, "early upload stopped; the sync uploads it");
                }
            }
        }
        out
    }

    /// Whether early uploads of containers no sync took are still known to this process.
    pub(crate) fn early_left(&self) -> bool {
        !self.inner.early.started.lock().is_empty()
    }

    /// Containers uploaded early that no sync took yet: their sessions may still commit
    /// them, so a listing must not delete them.
    pub(crate) fn early_pending(&self) -> std::collections::HashSet<ContainerId> {
        self.inner.early.started.lock().keys().copied().collect()
    }
}

impl Job {
    /// Checks the fence and the newest head when due (the first upload, every
    /// [`CHECK_EVERY`]th after it); a failed check stops every later early upload.
    async fn pass_gate(&self) -> Result<()> {
        let n = self
            .gate
            .count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut checked = self.gate.checked.lock().await;
        if checked.is_none()
            || (n.is_multiple_of(CHECK_EVERY) && checked.as_ref().is_some_and(|c| c.is_ok()))
        {
            *checked = Some(self.check().await.map_err(|e| e.to_string()));
        }
        match checked.as_ref().expect("checked above") {
            Ok(()) => Ok(()),
            Err(e) => Err(RemoteError::Bucket {
                what: "checking the remote before uploading early".into(),
                detail: e.clone(),
            }),
        }
    }

    async fn check(&self) -> Result<()> {
        fence::check(&self.bucket, &self.key, &self.store, self.generation).await?;
        match head::newest(&self.bucket, self.generation, self.mine).await? {
            Some(n) if !n.ours => Err(RemoteError::Diverged {
                remote: self.bucket.url.to_string(),
                detail: format!(
                    "it holds {}, a head this store did not write",
                    layout::head(self.generation, n.seq)
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// Passes the gate, then reads, seals and uploads container `id` (only if no object has its
/// name yet).
async fn upload_one(job: Job, id: ContainerId, data_dir: PathBuf) -> Result<Uploaded> {
    job.pass_gate().await?;
    let _slot = job
        .slots
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    let path = id.path(&data_dir);
    let plain = tokio::fs::read(&path).await.map_err(|e| RemoteError::Io {
        context: format!("reading {}", path.display()),
        source: e,
    })?;
    let name = layout::container(id);
    let sealed = seal::seal(&job.key, &name, &plain, DEFAULT_FRAME_LOG2);
    let header = sealed[..seal::HEADER_LEN].to_vec();
    if !job
        .bucket
        .put_new(&name, Bytes::from(sealed), job.lock)
        .await?
    {
        return Err(RemoteError::Diverged {
            remote: job.bucket.url.to_string(),
            detail: format!("{name} exists already; it was not replaced"),
        });
    }
    Ok((header, plain.len() as u64))
}
