//! Object Lock upkeep, run by every sync of a remote written with Object Lock.
//!
//! - *Extension*: each object is locked for N days from its upload, so a container that
//!   the newest backups still read would fall out of its lock N days after it went up. Every
//!   object the newest head needs (the descriptor, the generation's claim, the head, its
//!   metadata files and containers) has its retention pushed back to N days from now once
//!   less than half of N remains: what can still be restored stays immutable for as long as
//!   the uploader runs at least every N/4 (a worker does, hourly at most).
//! - *Purge*: a delete only hides a locked object behind a delete marker; its versions are
//!   deleted for good once their retention ended.
//!
//! When each object's retention ends is recorded in `remote/state` (the *ledger*) as a lower
//! bound, so an extension check costs no request for objects that need none.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::bucket::{ObjectLock, ObjectVersion};
use crate::error::{RemoteError, Result};
use crate::layout;
use crate::sync::{parallel, Progress, SyncReport};
use crate::Remote;

/// Seconds since the Unix epoch, now.
pub(crate) fn now_secs() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Whether upkeep last done at `last` is due again: every quarter of the retention, hourly at
/// most often for long retentions (every second for the tests' short ones).
fn is_due(lock: ObjectLock, last: Option<Instant>) -> bool {
    let every = Duration::from_secs((lock.seconds / 4).clamp(1, 3600));
    last.is_none_or(|t| t.elapsed() >= every)
}

/// Whether a sync has Object Lock upkeep to do (an idle worker's syncs do only that).
pub(crate) fn upkeep_due(lock: ObjectLock, p: &Progress) -> bool {
    is_due(lock, p.last_extension) || is_due(lock, p.last_purge)
}

impl Remote {
    /// Records in the ledger that the retention of `names` ends at `until` at the earliest.
    /// Best effort: a record lost only means extending those objects once more.
    pub(crate) fn note_locked(&self, names: &[String], until: i64) {
        if let Err(e) = self.inner.state.set_locked(names, until) {
            tracing::warn!(error = %e, "recording Object Lock retention failed");
        }
    }

    /// Extends and purges, each when due. A failure is kept in `p.lock_error` (reported by
    /// every sync until an upkeep succeeds) and retried when the upkeep is next due, not at
    /// once: a bucket refusing `PutObjectRetention` is not asked every few seconds.
    pub(crate) fn keep_locks(&self, lock: ObjectLock, p: &mut Progress, rep: &mut SyncReport) {
        if is_due(lock, p.last_extension) {
            p.last_extension = Some(Instant::now());
            match self.extend_locks(lock, p) {
                Ok(Some(n)) => {
                    rep.locks_extended += n;
                    p.lock_error = None;
                }
                Ok(None) => p.last_extension = None,
                Err(e) => p.lock_error = Some(format!("extending Object Lock retention: {e}")),
            }
        }
        if is_due(lock, p.last_purge) {
            p.last_purge = Some(Instant::now());
            let purged = self.needed_objects(p).and_then(|needed| {
                let needed: HashSet<String> = needed.unwrap_or_default().into_iter().collect();
                self.purge_expired_versions(lock, &needed)
            });
            match purged {
                Ok(n) => rep.objects_deleted += n,
                Err(e) => p.lock_error = Some(format!("purging expired versions: {e}")),
            }
        }
        if let Some(e) = &p.lock_error {
            tracing::warn!(error = %e, "Object Lock upkeep failed; retried when next due");
        }
        rep.lock_upkeep_error = p.lock_error.clone();
    }

    /// Every object the newest head needs to be restored from (a few more before this
    /// process published: every container recorded as uploaded).
    fn needed_objects(&self, p: &Progress) -> Result<Option<Vec<String>>> {
        let Some(head) = self.head() else {
            return Ok(None);
        };
        let mut out = vec![
            layout::DESCRIPTOR.to_string(),
            layout::generation(head.generation),
            layout::head(head.generation, head.seq),
        ];
        out.extend(head.meta_files.iter().map(|f| f.object.clone()));
        if p.synced_seq.is_some() {
            out.extend(p.head_containers.iter().map(|c| layout::container(*c)));
        } else {
            // `head_containers` is known once this process published; until then (its uploads
            // failing, say), every container recorded as uploaded: those the head names and
            // perhaps a few freed since.
            let uploaded = self.inner.state.uploaded()?;
            out.extend(uploaded.iter().map(|(c, _)| layout::container(*c)));
        }
        out.sort();
        out.dedup();
        Ok(Some(out))
    }

    /// Pushes back the retention of every needed object with less than half of it left;
    /// forgets the ledger entries of objects no longer needed. Returns how many were
    /// extended (None when there is no head of this process to go by yet).
    fn extend_locks(&self, lock: ObjectLock, p: &Progress) -> Result<Option<u64>> {
        let Some(needed) = self.needed_objects(p)? else {
            return Ok(None);
        };
        self.fence_check(self.generation())?;
        let ledger: HashMap<String, i64> = self.inner.state.locked()?.into_iter().collect();
        let now = now_secs();
        let half = lock.seconds.div_ceil(2) as i64;
        let due: Vec<String> = needed
            .iter()
            .filter(|n| ledger.get(*n).is_none_or(|until| *until <= now + half))
            .cloned()
            .collect();
        let until = now + lock.seconds as i64;
        let n = due.len() as u64;
        for batch in due.chunks(256) {
            let names = batch.to_vec();
            self.run(move |b| async move {
                parallel(names, "a retention task", |name| {
                    let b = b.clone();
                    async move { b.extend_retention(&name, lock, until).await }
                })
                .await
            })?;
            self.note_locked(batch, until);
        }
        let keep: HashSet<&str> = needed.iter().map(String::as_str).collect();
        let gone: Vec<String> = ledger
            .into_keys()
            .filter(|n| !keep.contains(n.as_str()))
            .collect();
        self.inner.state.forget_locked(&gone)?;
        Ok(Some(n))
    }

    /// With Object Lock, a delete only hides an object behind a delete marker; its bytes stay
    /// until its retention ends. This deletes, for good, the versions whose retention ended
    /// and that no longer hold anything current: replaced versions, and deleted objects
    /// (their versions, then their delete marker, in that order, so a marker is never
    /// removed while it still hides a version). Returns the versions deleted.
    pub(crate) fn purge_expired_versions(
        &self,
        lock: ObjectLock,
        needed: &HashSet<String>,
    ) -> Result<u64> {
        self.fence_check(self.generation())?;
        let versions = self.run(|b| async move { b.list_versions("").await })?;
        let now = now_secs();
        // A margin past the retention (a minute, less for a shorter retention): clocks differ.
        let margin = lock.seconds.min(60) as i64;
        let expired = |v: &ObjectVersion| v.modified + lock.seconds as i64 + margin < now;
        let mut by_name: HashMap<&str, Vec<&ObjectVersion>> = HashMap::new();
        for v in &versions {
            by_name.entry(v.name.as_str()).or_default().push(v);
        }
        let mut versions_doomed: Vec<(String, String)> = Vec::new();
        let mut markers_doomed: Vec<(String, String)> = Vec::new();
        for (name, vs) in &by_name {
            // Every version of a needed object stays: if its current version is not the one
            // uploaded here (someone holding the credentials wrote over it), the one uploaded
            // here is among the older versions, and is the one that must not go.
            if needed.contains(*name) {
                continue;
            }
            let deleted = vs.iter().any(|v| v.latest && v.delete_marker);
            let old: Vec<_> = vs
                .iter()
                .filter(|v| !v.latest && !v.delete_marker)
                .collect();
            let gone: Vec<_> = old.iter().filter(|v| expired(v)).collect();
            versions_doomed.extend(gone.iter().map(|v| (v.name.clone(), v.version_id.clone())));
            if deleted && gone.len() == old.len() {
                markers_doomed.extend(
                    vs.iter()
                        .filter(|v| v.delete_marker)
                        .map(|v| (v.name.clone(), v.version_id.clone())),
                );
            }
        }
        self.run(move |b| async move {
            let mut kept = HashSet::new();
            let mut n = 0;
            for (name, id) in versions_doomed {
                match b.delete_version(&name, &id).await {
                    Ok(()) => n += 1,
                    // Still retained (a clock ahead of ours): next time. Its marker stays,
                    // or the version would be current again.
                    Err(RemoteError::Denied { .. }) => {
                        kept.insert(name);
                    }
                    Err(e) => return Err(e),
                }
            }
            for (name, id) in markers_doomed
                .into_iter()
                .filter(|(n, _)| !kept.contains(n))
            {
                b.delete_version(&name, &id).await?;
                n += 1;
            }
            Ok(n)
        })
    }
}
