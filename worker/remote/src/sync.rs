//! Sync: making the remote hold what the store holds now.
//!
//! One sync, in this order (each step needs the ones before it):
//!
//! 1. *checkpoint* the metadata (RocksDB checkpoint, [`Store::checkpoint`]) while holding a
//!    read view, so no container the checkpoint names is unlinked before it is uploaded;
//! 2. *upload the containers* the checkpoint names that the remote lacks, then the
//!    checkpoint's *metadata files* it lacks (named by content, so unchanged tables are
//!    never uploaded twice);
//! 3. *publish the head* naming those files — from here `recover` rebuilds this state;
//! 4. *delete* what no head needs any more: older heads, metadata files the new head does
//!    not name, and containers the checkpoint no longer names (freed by expire, slide or gc)
//!    once no reader that started before their freeing is still running (a restore may be
//!    reading an evicted one from the bucket).
//!
//! Steps 2 to 4 first check the fence ([`crate::fence`]). A crash anywhere leaves the bucket
//! holding the previous head and everything it names; what a crashed sync uploaded or failed
//! to delete is found by a listing at the next process's first sync and removed. That listing
//! is skipped when the records are clean ([`crate::state::State::is_clean`]): the marker is
//! removed before anything is uploaded and set again only once a sync has finished.
//!
//! Each step's time is logged at debug level (`REVAULT_LOG=revault_remote=debug`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use revault_engine::{keys, ContainerId, OpenMode, Store};
use serde::Serialize;

use crate::bucket::{Bucket, ObjectLock};
use crate::error::{IoCtx, RemoteError, Result};
use crate::fence;
use crate::head::{self, Head, MetaFile, Published, SeriesAt};
use crate::layout;
use crate::locks;
use crate::seal::{self, DataKey, DEFAULT_FRAME_LOG2};
use crate::Remote;

/// Uploads (or deletions) in flight at once.
pub(crate) const PARALLEL: usize = 8;

/// What the uploader remembers between syncs of one process.
#[derive(Default)]
pub(crate) struct Progress {
    /// The store's metadata sequence number the newest head covers.
    pub(crate) synced_seq: Option<u64>,
    /// The containers the newest head's metadata names.
    pub(crate) head_containers: HashSet<ContainerId>,
    /// Deletions that had to wait (for readers, or a failed request).
    deletions_pending: bool,
    /// The bucket was listed for leftovers of crashed syncs since this process started, or
    /// needs no listing: its records were clean when it opened ([`crate::state::State::is_clean`]).
    listed: bool,
    /// Metadata files older heads named and the newest does not.
    stale_meta: Vec<String>,
    /// When versions past their Object Lock retention were last purged.
    pub(crate) last_purge: Option<Instant>,
    /// When the retention of what the newest head needs was last extended.
    pub(crate) last_extension: Option<Instant>,
    /// Why the last Object Lock upkeep failed, until one succeeds.
    pub(crate) lock_error: Option<String>,
}

/// What a sync did.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncReport {
    /// A new head was written (false when nothing had changed).
    pub published: bool,
    pub head: Option<String>,
    pub containers_uploaded: u64,
    pub container_bytes_uploaded: u64,
    pub meta_files_uploaded: u64,
    pub meta_bytes_uploaded: u64,
    pub objects_deleted: u64,
    /// Objects still needed whose Object Lock retention was extended.
    pub locks_extended: u64,
    /// Why the Object Lock upkeep (extension, purge) last failed, until one succeeds.
    pub lock_upkeep_error: Option<String>,
    pub seconds: f64,
}

/// Uploads running in the background: their outcome, and the task to abort them.
struct Upload {
    done: std::sync::mpsc::Receiver<Result<()>>,
    /// With Object Lock: when the retention of what it uploads ends at the earliest, and
    /// the objects it uploads.
    locked: Option<(i64, Vec<String>)>,
    task: tokio::task::JoinHandle<()>,
}

/// What a checkpoint holds, read from it.
struct Snapshot {
    containers: HashSet<ContainerId>,
    container_bytes: u64,
    max_session: u64,
    series: Vec<SeriesAt>,
    files: Vec<(String, std::path::PathBuf)>,
}

impl Progress {
    /// A process's first: the bucket is listed for leftovers at the first sync unless the
    /// records were `clean`.
    pub(crate) fn new(clean: bool) -> Progress {
        Progress {
            listed: clean,
            ..Progress::default()
        }
    }
}

impl Remote {
    /// What this store knows it published in generation `gen` ([`crate::head::newest`]).
    pub(crate) fn published(&self, gen: u32) -> Result<Published> {
        let recorded = self
            .inner
            .head
            .lock()
            .as_ref()
            .filter(|h| h.generation == gen)
            .map(|h| h.seq);
        let writing = self
            .inner
            .state
            .writing_head()?
            .filter(|(g, _, _)| *g == gen)
            .map(|(_, s, h)| (s, h));
        Ok(Published { recorded, writing })
    }

    /// Removes the clean marker, durably, before anything is uploaded; `clean` is
    /// `Inner::clean`, locked by the caller.
    pub(crate) fn mark_dirty(&self, clean: &mut bool) -> Result<()> {
        if *clean {
            self.inner.state.set_clean(false)?;
            *clean = false;
        }
        Ok(())
    }

    /// Sets the clean marker once a sync has published and deleted everything it had to, and
    /// no early upload is left that no sync took.
    fn mark_clean_if_done(&self, p: &Progress) -> Result<()> {
        let mut clean = self.inner.clean.lock();
        if !*clean && p.listed && !p.deletions_pending && !self.early_left() {
            self.inner.state.set_clean(true)?;
            *clean = true;
        }
        Ok(())
    }

    /// Makes the remote hold the store as it is now; returns once the new head is written.
    pub fn sync(&self, store: &Store) -> Result<SyncReport> {
        let t0 = Instant::now();
        let mut p = self.inner.sync_lock.lock();
        let mut rep = SyncReport::default();
        let synced = self.publish_and_delete(store, &mut p, &mut rep);
        if synced.is_err() {
            // A failed sync may leave uploads no head names, or listed leftovers it did not
            // delete: the next sync of this process lists the bucket again.
            p.listed = false;
        }
        // Object Lock upkeep runs whatever became of the upload: a store whose uploads keep
        // failing must not let the last published head's objects fall out of their lock. Its
        // own failure is reported beside the sync's outcome, not as it (the change is durable).
        if let Some(lock) = self.object_lock() {
            self.keep_locks(lock, &mut p, &mut rep);
        }
        synced?;
        rep.seconds = t0.elapsed().as_secs_f64();
        Ok(rep)
    }

    /// Steps 1 to 4 (see the module's documentation).
    fn publish_and_delete(
        &self,
        store: &Store,
        p: &mut Progress,
        rep: &mut SyncReport,
    ) -> Result<()> {
        let seq = store.meta_sequence();
        if p.synced_seq != Some(seq) {
            let view = store.read_view();
            let t = Instant::now();
            let snap = self.checkpoint(store)?;
            tracing::debug!(
                ms = t.elapsed().as_millis() as u64,
                "sync: checkpoint taken"
            );
            let before = self.head();
            self.upload_and_publish(store, &snap, rep)?;
            if let (Some(old), Some(new)) = (before, self.head()) {
                let keep: HashSet<&str> =
                    new.meta_files.iter().map(|f| f.object.as_str()).collect();
                p.stale_meta.extend(
                    old.meta_files
                        .iter()
                        .filter(|f| !keep.contains(f.object.as_str()))
                        .map(|f| f.object.clone()),
                );
            }
            p.head_containers = snap.containers;
            p.synced_seq = Some(seq);
            // What the new head names may have been uploaded long ago (uploads that kept
            // failing after it, say): its locks are checked now, not at the next due time.
            p.last_extension = None;
            p.deletions_pending = true;
            drop(view);
            let _ = std::fs::remove_dir_all(self.checkpoint_dir());
        }
        if p.deletions_pending || !p.listed {
            let t = Instant::now();
            let done = self.delete_unneeded(store, p, rep)?;
            p.deletions_pending = !done;
            tracing::debug!(ms = t.elapsed().as_millis() as u64, "sync: deletions done");
        }
        self.mark_clean_if_done(p)
    }

    /// Whether the store changed since the newest head (a sync would publish one).
    pub fn is_behind(&self, store: &Store) -> bool {
        self.inner.sync_lock.lock().synced_seq != Some(store.meta_sequence())
    }

    /// Whether a sync has anything to do: publish a head, delete what waited, or keep Object
    /// Lock's retention.
    pub fn needs_sync(&self, store: &Store) -> bool {
        let p = self.inner.sync_lock.lock();
        p.synced_seq != Some(store.meta_sequence())
            || p.deletions_pending
            || !p.listed
            || self.object_lock().is_some_and(|l| locks::upkeep_due(l, &p))
    }

    fn checkpoint_dir(&self) -> std::path::PathBuf {
        self.inner.root.join(crate::state::DIR).join("checkpoint")
    }

    /// Checkpoints the metadata and reads what the checkpoint holds.
    fn checkpoint(&self, store: &Store) -> Result<Snapshot> {
        let dir = self.checkpoint_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).ctx(|| format!("removing {}", dir.display()))?;
        }
        store.checkpoint(&dir)?;
        // The file list first: opening the checkpoint below may add RocksDB's info log.
        let meta = dir.join(revault_engine::META_DIR);
        let mut files = Vec::new();
        for e in std::fs::read_dir(&meta).ctx(|| format!("reading {}", meta.display()))? {
            let e = e.ctx(|| format!("reading {}", meta.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_file() && name != "LOCK" && !name.starts_with("LOG") {
                files.push((name, e.path()));
            }
        }
        files.sort();
        let cp = Store::open(&dir, OpenMode::ReadOnly, "revault remote sync")?;
        let mut containers = HashSet::new();
        let mut max_session = 0;
        cp.meta()
            .for_each_prefix(keys::CF_CONTAINERS, b"", |k, _| {
                if let Ok(b) = <[u8; 8]>::try_from(k) {
                    let id = ContainerId(u64::from_be_bytes(b));
                    max_session = max_session.max(id.session());
                    containers.insert(id);
                }
                Ok(true)
            })?;
        let mut series = Vec::new();
        for s in cp.list_series()? {
            let vs = cp.versions(&s)?;
            series.push(SeriesAt {
                name: s.name.clone(),
                latest: vs.last().map(|v| v.number),
                versions: vs.len() as u32,
            });
        }
        let container_bytes = cp.totals()?.container_bytes;
        Ok(Snapshot {
            containers,
            container_bytes,
            max_session,
            series,
            files,
        })
    }

    fn upload_and_publish(
        &self,
        store: &Store,
        snap: &Snapshot,
        rep: &mut SyncReport,
    ) -> Result<()> {
        let t = Instant::now();
        let gen = self.generation();
        self.fence_check(gen)?;
        self.mark_dirty(&mut self.inner.clean.lock())?;
        let uploaded: HashSet<ContainerId> = self
            .inner
            .state
            .uploaded()?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let mut todo: Vec<ContainerId> = snap.containers.difference(&uploaded).copied().collect();
        todo.sort();
        let prev = self.head();
        let seq = self.next_seq(gen, prev.as_ref())?;
        // The metadata files go up while the containers do: no head names either yet.
        let (meta_files, meta_up) = self.upload_meta_files(&snap.files, prev.as_ref(), rep)?;
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            "sync: fence checked, heads listed"
        );
        // Containers uploaded early, while the command that wrote them ran, are waited for
        // rather than sent again; those whose early upload failed are sent below.
        let early = self.collect_early(&todo);
        let sent: HashSet<ContainerId> = early.iter().map(|d| d.0).collect();
        let early_n = sent.len();
        self.record_uploads(
            early
                .into_iter()
                .map(|(id, h, n, until)| ((id, h, n), until)),
            rep,
        )?;
        todo.retain(|id| !sent.contains(id));
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            early = early_n,
            "sync: early uploads collected"
        );
        let uploaded = self
            .upload_containers(gen, store.data_dir(), &todo, rep)
            .and_then(|()| self.failpoint("sync.uploaded"));
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            containers = todo.len(),
            "sync: containers uploaded"
        );
        if let Err(e) = uploaded {
            // A store fenced out (or failing) stops uploading: the metadata too.
            meta_up.task.abort();
            return Err(e);
        }
        meta_up.done.recv().unwrap_or_else(|_| {
            Err(RemoteError::Bucket {
                what: "uploading metadata files".into(),
                detail: "the upload stopped".into(),
            })
        })?;
        if let Some((until, names)) = &meta_up.locked {
            self.note_locked(names, *until);
        }
        self.failpoint("sync.meta")?;
        tracing::debug!(
            ms = t.elapsed().as_millis() as u64,
            "sync: metadata uploaded"
        );
        let head = Head {
            format: 1,
            store: self.store_id().to_string(),
            generation: gen,
            seq,
            time: rfc3339_now(),
            meta_files,
            containers: snap.containers.len() as u64,
            container_bytes: snap.container_bytes,
            max_session: snap.max_session,
            series: snap.series.clone(),
        };
        let name = layout::head(gen, seq);
        let body = seal::seal(
            &self.inner.key,
            &name,
            &serde_json::to_vec(&head).expect("head serialises"),
            DEFAULT_FRAME_LOG2,
        );
        self.fence_check(gen)?;
        if let Some(f) = self.inner.before_head.lock().take() {
            f();
        }
        let lock = self.object_lock();
        let locked_until = lock.map(|l| locks::now_secs() + l.seconds as i64);
        self.inner
            .state
            .set_writing_head(gen, seq, blake3::hash(&body).as_bytes())?;
        self.failpoint("sync.head_writing")?;
        let n = name.clone();
        // Written once: a second writer of this store (a copy of it, or its metadata put
        // back) cannot replace a head it did not write.
        if !self.run(move |b| async move { b.put_new(&n, body.into(), lock).await })? {
            return Err(self.diverged(&format!("{name} was written by someone else meanwhile")));
        }
        self.failpoint("sync.head_written")?;
        // A recovery may have claimed the remote between the check above and the head: then
        // the new owner may not have seen this head, and it is not durable.
        self.fence_check(gen)?;
        self.inner.state.set_head(&head)?;
        if let Some(until) = locked_until {
            self.note_locked(std::slice::from_ref(&name), until);
        }
        *self.inner.head.lock() = Some(head);
        rep.published = true;
        tracing::debug!(ms = t.elapsed().as_millis() as u64, head = %name, "sync: head published");
        rep.head = Some(name);
        self.failpoint("sync.published")
    }

    /// The sequence number of the next head, after checking that the bucket holds no head of
    /// this generation newer than the newest this store published: a store whose metadata went
    /// back in time (a disk snapshot put back) or a copy of it must not publish an older state
    /// over a newer one, nor delete what the newer one needs.
    fn next_seq(&self, gen: u32, prev: Option<&Head>) -> Result<u64> {
        let mine = self.published(gen)?;
        let newest = self.run(move |b| async move { head::newest(&b, gen, mine).await })?;
        match (prev, newest) {
            (Some(p), Some(n)) if !n.ours => Err(self.diverged(&format!(
                "it holds {} and this store last published {}",
                layout::head(gen, n.seq),
                layout::head(gen, p.seq)
            ))),
            // With no head recorded (the records lost) the newest is taken as this store's.
            (p, n) => Ok(p.map_or(0, |h| h.seq).max(n.map_or(0, |n| n.seq)) + 1),
        }
    }

    fn diverged(&self, detail: &str) -> RemoteError {
        RemoteError::Diverged {
            remote: self.url().to_string(),
            detail: detail.to_string(),
        }
    }

    pub(crate) fn object_lock(&self) -> Option<ObjectLock> {
        self.inner.conf.lock().object_lock
    }

    pub(crate) fn fence_check(&self, gen: u32) -> Result<()> {
        let (key, store) = (self.inner.key.clone(), self.store_id().to_string());
        self.run(move |b| async move { fence::check(&b, &key, &store, gen).await })
    }

    /// Seals and uploads containers `ids` from `data_dir`, [`PARALLEL`] at a time.
    fn upload_containers(
        &self,
        gen: u32,
        data_dir: &Path,
        ids: &[ContainerId],
        rep: &mut SyncReport,
    ) -> Result<()> {
        for batch in ids.chunks(64) {
            // Before every batch: a fenced store stops uploading within one batch.
            self.fence_check(gen)?;
            let key = self.inner.key.clone();
            let lock = self.object_lock();
            let data_dir = data_dir.to_path_buf();
            let batch = batch.to_vec();
            let locked_until = lock.map(|l| locks::now_secs() + l.seconds as i64);
            let done = self
                .run(move |b| async move { upload_batch(b, key, lock, data_dir, batch).await })?;
            self.record_uploads(done.into_iter().map(|d| (d, locked_until)), rep)?;
        }
        Ok(())
    }

    /// Records finished container uploads ((container, sealed header, bytes), the end of
    /// their Object Lock retention): in the records, the ledger of locks and the report.
    fn record_uploads(
        &self,
        done: impl Iterator<Item = ((ContainerId, Vec<u8>, u64), Option<i64>)>,
        rep: &mut SyncReport,
    ) -> Result<()> {
        let mut items = Vec::new();
        let mut locked: HashMap<i64, Vec<String>> = HashMap::new();
        for ((id, header, bytes), until) in done {
            // Not those found already in the bucket (bytes = 0): their retention is older.
            if let (Some(until), true) = (until, bytes > 0) {
                locked.entry(until).or_default().push(layout::container(id));
            }
            rep.containers_uploaded += 1;
            rep.container_bytes_uploaded += bytes;
            items.push((id, header));
        }
        for (until, names) in locked {
            self.note_locked(&names, until);
        }
        self.inner.state.set_uploaded(&items)
    }

    /// Starts uploading the checkpoint's metadata files the remote lacks, [`PARALLEL`] at a
    /// time; returns the head's list of them and where the upload's outcome will arrive.
    fn upload_meta_files(
        &self,
        files: &[(String, std::path::PathBuf)],
        prev: Option<&Head>,
        rep: &mut SyncReport,
    ) -> Result<(Vec<MetaFile>, Upload)> {
        let have: HashSet<&str> = prev
            .map(|h| h.meta_files.iter().map(|f| f.object.as_str()).collect())
            .unwrap_or_default();
        let mut out = Vec::new();
        let mut todo = Vec::new();
        for (name, path) in files {
            let bytes = std::fs::read(path).ctx(|| format!("reading {}", path.display()))?;
            let object = layout::meta_file(&blake3::hash(&bytes));
            out.push(MetaFile {
                name: name.clone(),
                object: object.clone(),
                size: bytes.len() as u64,
            });
            if !have.contains(object.as_str()) {
                todo.push((object, bytes));
            }
        }
        todo.sort_by(|a, b| a.0.cmp(&b.0));
        todo.dedup_by(|a, b| a.0 == b.0);
        rep.meta_files_uploaded += todo.len() as u64;
        rep.meta_bytes_uploaded += todo.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        let (key, lock) = (self.inner.key.clone(), self.object_lock());
        let locked = lock.map(|l| {
            let until = locks::now_secs() + l.seconds as i64;
            (until, todo.iter().map(|(name, _)| name.clone()).collect())
        });
        let (tx, done) = std::sync::mpsc::sync_channel(1);
        let b = self.inner.bucket.clone();
        let task = self.rt().spawn(async move {
            let _ = tx.send(upload_meta(b, key, lock, todo).await);
        });
        Ok((out, Upload { done, task, locked }))
    }

    /// Step 4. Returns false when something had to wait (a reader, a refused delete).
    fn delete_unneeded(
        &self,
        store: &Store,
        p: &mut Progress,
        rep: &mut SyncReport,
    ) -> Result<bool> {
        let Some(head) = self.head() else {
            return Ok(true);
        };
        let gen = self.generation();
        self.fence_check(gen)?;
        let mut doomed: Vec<String> = Vec::new();
        let uploaded: HashMap<ContainerId, Vec<u8>> =
            self.inner.state.uploaded()?.into_iter().collect();
        let waiting: HashSet<ContainerId> = store.freed_awaiting_readers().into_iter().collect();
        let mut left_over = false;
        if !p.listed {
            // Leftovers of crashed syncs: uploads not recorded, deletions not finished.
            let mine = self.published(gen)?;
            match self.run(move |b| async move { head::newest(&b, gen, mine).await })? {
                Some(n) if !n.ours => {
                    // Another copy of this store went on: nothing it names may be deleted.
                    return Err(self.diverged(&format!(
                        "it holds {} and this store last published {}",
                        layout::head(gen, n.seq),
                        layout::head(head.generation, head.seq)
                    )));
                }
                Some(n) if n.seq > head.seq => {
                    // This store's own head, written but not recorded: the next sync
                    // publishes past it; until then it may name what is listed.
                    return Ok(false);
                }
                _ => {}
            }
            let listed = self.run(|b| async move { b.list("").await })?;
            let pending = self.early_pending();
            let files: HashSet<&str> = head.meta_files.iter().map(|f| f.object.as_str()).collect();
            let mut adopt = Vec::new();
            for o in &listed {
                if let Some(id) = layout::parse_container(&o.name) {
                    if p.head_containers.contains(&id) && !uploaded.contains_key(&id) {
                        adopt.push(id);
                    } else if !p.head_containers.contains(&id) && !uploaded.contains_key(&id) {
                        if pending.contains(&id) {
                            // Its session may still commit it; while it is pending, the
                            // records are not marked clean.
                        } else if waiting.contains(&id) {
                            // A reader may still need it: recorded, so a later sync deletes
                            // it (below, with what waits for readers) once none does.
                            adopt.push(id);
                            left_over = true;
                        } else {
                            doomed.push(o.name.clone());
                        }
                    }
                } else if o.name.starts_with(layout::META) && !files.contains(o.name.as_str()) {
                    doomed.push(o.name.clone());
                } else if let Some((g, s)) = layout::parse_head(&o.name) {
                    if g <= gen && (g, s) < (head.generation, head.seq) {
                        doomed.push(o.name.clone());
                    }
                }
            }
            if !adopt.is_empty() {
                // Uploaded by a sync that crashed before recording them: their headers are
                // read back when they are first opened from the remote.
                let items: Vec<_> = adopt.into_iter().map(|id| (id, Vec::new())).collect();
                self.inner.state.set_uploaded(&items)?;
            }
        } else {
            let prev_heads = self.run(|b| async move { b.list(layout::HEADS).await })?;
            for o in prev_heads {
                if let Some((g, s)) = layout::parse_head(&o.name) {
                    if g <= gen && (g, s) < (head.generation, head.seq) {
                        doomed.push(o.name);
                    }
                }
            }
            doomed.extend(p.stale_meta.iter().cloned());
        }
        let mut freed = Vec::new();
        let mut all_done = true;
        for id in uploaded.keys() {
            if p.head_containers.contains(id) {
                continue;
            }
            if waiting.contains(id) {
                all_done = false;
                continue;
            }
            freed.push(*id);
            doomed.push(layout::container(*id));
        }
        // Whatever else said so, nothing the newest head names is deleted (a metadata file it
        // names may be one an older head named too, re-uploaded since).
        let needed: HashSet<String> = head
            .meta_files
            .iter()
            .map(|f| f.object.clone())
            .chain([layout::head(head.generation, head.seq)])
            .chain(p.head_containers.iter().map(|c| layout::container(*c)))
            .collect();
        doomed.retain(|n| !needed.contains(n));
        p.listed = true;
        if left_over {
            all_done = false;
        }
        if doomed.is_empty() {
            p.stale_meta.clear();
            return Ok(all_done);
        }
        self.fence_check(gen)?;
        if self.inner.failpoint.lock().as_deref() == Some("sync.deleting") {
            // Half the deletions, then the "crash".
            let half: Vec<String> = doomed
                .iter()
                .take(doomed.len().div_ceil(2))
                .cloned()
                .collect();
            self.run(move |b| async move { delete_all(b, half).await })?;
            self.failpoint("sync.deleting")?;
        }
        let n = doomed.len() as u64;
        self.run(move |b| async move { delete_all(b, doomed).await })?;
        self.inner.state.forget(&freed)?;
        p.stale_meta.clear();
        rep.objects_deleted += n;
        Ok(all_done)
    }
}

/// Runs `task` on every item, [`PARALLEL`] at a time: the outputs in the order they finish,
/// or the first error (the other tasks are aborted with the set). `what` names the tasks.
pub(crate) async fn parallel<T, R, Fut>(
    items: Vec<T>,
    what: &str,
    task: impl Fn(T) -> Fut,
) -> Result<Vec<R>>
where
    R: Send + 'static,
    Fut: std::future::Future<Output = Result<R>> + Send + 'static,
{
    let sem = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut set = tokio::task::JoinSet::new();
    for item in items {
        let (sem, run) = (sem.clone(), task(item));
        set.spawn(async move {
            let _permit = sem.acquire_owned().await.expect("semaphore open");
            run.await
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.map_err(|e| RemoteError::Bucket {
            what: what.to_string(),
            detail: e.to_string(),
        })??);
    }
    Ok(out)
}

/// Seals and uploads containers `ids` from `data_dir`: (id, sealed header, plaintext bytes).
async fn upload_batch(
    b: Bucket,
    key: DataKey,
    lock: Option<ObjectLock>,
    data_dir: std::path::PathBuf,
    ids: Vec<ContainerId>,
) -> Result<Vec<(ContainerId, Vec<u8>, u64)>> {
    parallel(ids, "an upload task", |id| {
        let (b, key) = (b.clone(), key.clone());
        let path = id.path(&data_dir);
        async move {
            let name = layout::container(id);
            let plain = match tokio::fs::read(&path).await {
                Ok(p) => p,
                // Evicted, and the record of its upload lost (remote/state): the bucket's copy
                // is the one to keep, if it is there.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return match b.get_range(&name, 0..seal::HEADER_LEN as u64).await {
                        Ok(h) => Ok((id, h.to_vec(), 0)),
                        Err(RemoteError::NotFound { .. }) => Err(RemoteError::Engine(
                            revault_engine::Error::MissingContainer {
                                container: id.to_string(),
                                path: path.clone(),
                            },
                        )),
                        Err(e) => Err(e),
                    };
                }
                Err(e) => {
                    return Err(RemoteError::Io {
                        context: format!("reading {}", path.display()),
                        source: e,
                    })
                }
            };
            let sealed = seal::seal(&key, &name, &plain, DEFAULT_FRAME_LOG2);
            let header = sealed[..seal::HEADER_LEN].to_vec();
            let n = plain.len() as u64;
            b.put(&name, Bytes::from(sealed), lock).await?;
            Ok((id, header, n))
        }
    })
    .await
}

/// Seals and uploads metadata files (object name, bytes).
async fn upload_meta(
    b: Bucket,
    key: DataKey,
    lock: Option<ObjectLock>,
    files: Vec<(String, Vec<u8>)>,
) -> Result<()> {
    parallel(files, "a metadata upload task", |(object, bytes)| {
        let (b, key) = (b.clone(), key.clone());
        async move {
            let body = seal::seal(&key, &object, &bytes, DEFAULT_FRAME_LOG2);
            b.put(&object, body.into(), lock).await
        }
    })
    .await
    .map(drop)
}

async fn delete_all(b: Bucket, names: Vec<String>) -> Result<()> {
    parallel(names, "a delete task", |n| {
        let b = b.clone();
        async move { b.delete(&n).await }
    })
    .await
    .map(drop)
}

pub(crate) fn rfc3339_now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
