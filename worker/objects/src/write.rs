//! Writes to buckets: a put commits its content as a version of the bucket's
//! series together with its index entry; a delete removes the entry, then the
//! version; a sweep expires versions no entry refers to.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::Arc;

use parking_lot::Mutex;

use revault_engine::{
    backup, check_series_name, expire,
    keys::{bucket_key, bucket_objects_prefix, object_key},
    now_unix, BackupOptions, BackupReport, CommitHook, DedupUnit, Error, ExpireReport, ExpireSel,
    Progress, Store,
};

use crate::records::{bucket_versions, decode_record, is_bucket, record, BucketRecord, CF};
use crate::source::{ObjectSource, Summary};
use crate::{check_key, head, Encoding, ObjResult, ObjectError, ObjectInfo, ObjectRecord};

#[derive(Clone, Default)]
pub struct PutOptions {
    pub encoding: Encoding,
    /// Called with the content bytes read so far.
    pub progress: Option<Progress>,
    pub cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

#[derive(Clone, Debug)]
pub struct PutReport {
    pub object: ObjectInfo,
    pub backup: BackupReport,
    /// The version the object had before, now expired.
    pub replaced: Option<ExpireReport>,
}

#[derive(Clone, Debug)]
pub struct DeleteReport {
    pub bucket: String,
    pub key: String,
    pub version: u32,
    pub expired: ExpireReport,
}

/// Writes to buckets. One write at a time per bucket (its series has one
/// writer at a time anyway); reads need no handle.
#[derive(Default)]
pub struct Objects {
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    swept: Mutex<HashSet<String>>,
}

impl Objects {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self, bucket: &str) -> Arc<Mutex<()>> {
        self.locks
            .lock()
            .entry(bucket.to_string())
            .or_default()
            .clone()
    }

    /// Stores `body` as `key`'s content, replacing what was there.
    pub fn put(
        &self,
        store: &Store,
        bucket: &str,
        key: &str,
        body: Box<dyn Read + Send>,
        opts: &PutOptions,
    ) -> ObjResult<PutReport> {
        check_series_name(bucket)?;
        check_key(key)?;
        let lock = self.lock(bucket);
        let _g = lock.lock();
        let new_bucket = !is_bucket(store.meta(), bucket)?;
        if new_bucket && !bucket_versions(store, bucket)?.is_empty() {
            return Err(ObjectError::NotABucket(bucket.to_string()));
        }
        self.sweep_once(store, bucket)?;
        let previous = record(store.meta(), bucket, key)?;

        let summary: Arc<Mutex<Option<Summary>>> = Arc::default();
        let time_unix = now_unix();
        let hook = index_hook(
            summary.clone(),
            bucket,
            key,
            opts.encoding,
            time_unix,
            new_bucket,
        );
        let source = ObjectSource::new(
            format!("the upload of {bucket}/{key}"),
            body,
            opts.encoding,
            summary.clone(),
        );
        let bopts = BackupOptions {
            unit: Some(DedupUnit::Chunk),
            time_unix: Some(time_unix),
            progress: opts.progress.clone(),
            cancel: opts.cancel.clone(),
            on_commit: Some(hook),
            // A bucket's versions are different objects: nothing to slide one into the next.
            new_series_retention: Some(revault_engine::Retention {
                auto: false,
                ..Default::default()
            }),
            ..Default::default()
        };
        let rep = backup(store, bucket, Box::new(source), &bopts).map_err(|e| match e {
            Error::BadGzip(m) => ObjectError::BadGzip(m),
            e => ObjectError::Engine(e),
        })?;
        let rec = record(store.meta(), bucket, key)?.ok_or_else(|| {
            Error::Invalid(format!(
                "object {key:?} of bucket {bucket} is missing after its commit"
            ))
        })?;
        let replaced = match previous {
            Some(p) if p.version != rec.version => self.expire_version(store, bucket, p.version),
            _ => None,
        };
        Ok(PutReport {
            object: ObjectInfo {
                bucket: bucket.to_string(),
                key: key.to_string(),
                record: rec,
            },
            backup: rep,
            replaced,
        })
    }

    /// Expires a version no index entry refers to any more. Failure leaves
    /// garbage for the next sweep rather than failing the caller, whose
    /// change is already committed.
    fn expire_version(&self, store: &Store, bucket: &str, version: u32) -> Option<ExpireReport> {
        match expire(store, bucket, &ExpireSel::Version(version)) {
            Ok(r) => Some(r),
            Err(Error::UnknownVersion { .. }) => None,
            Err(e) => {
                tracing::warn!(bucket, version, error = %e, "could not expire a replaced object version; the next sweep will");
                self.swept.lock().remove(bucket);
                None
            }
        }
    }

    /// Deletes `key`: its entry first (durably), then its version.
    pub fn delete(&self, store: &Store, bucket: &str, key: &str) -> ObjResult<DeleteReport> {
        check_series_name(bucket)?;
        check_key(key)?;
        let lock = self.lock(bucket);
        let _g = lock.lock();
        let info = head(store, bucket, key)?;
        let mut b = store.meta().batch();
        b.delete(CF, &object_key(bucket, key));
        store.meta().write(b, true)?;
        let expired = match expire(store, bucket, &ExpireSel::Version(info.record.version)) {
            Ok(r) => r,
            Err(e) => {
                self.swept.lock().remove(bucket);
                return Err(e.into());
            }
        };
        Ok(DeleteReport {
            bucket: bucket.to_string(),
            key: key.to_string(),
            version: info.record.version,
            expired,
        })
    }

    fn sweep_once(&self, store: &Store, bucket: &str) -> ObjResult<()> {
        if self.swept.lock().contains(bucket) {
            return Ok(());
        }
        self.sweep_locked(store, bucket)?;
        self.swept.lock().insert(bucket.to_string());
        Ok(())
    }

    /// Expires the bucket's versions that no key refers to (left by a crash
    /// between an index change and its expiry). Returns the versions expired.
    pub fn sweep(&self, store: &Store, bucket: &str) -> ObjResult<Vec<u32>> {
        check_series_name(bucket)?;
        let lock = self.lock(bucket);
        let _g = lock.lock();
        self.sweep_locked(store, bucket)
    }

    fn sweep_locked(&self, store: &Store, bucket: &str) -> ObjResult<Vec<u32>> {
        if !is_bucket(store.meta(), bucket)? {
            return Ok(Vec::new());
        }
        let live: HashSet<u32> = bucket_versions(store, bucket)?
            .iter()
            .map(|v| v.number)
            .collect();
        let mut referenced = HashSet::new();
        store
            .meta()
            .for_each_prefix(CF, &bucket_objects_prefix(bucket), |k, v| {
                referenced.insert(decode_record(bucket, k, v)?.version);
                Ok(true)
            })?;
        let mut garbage: Vec<u32> = live.difference(&referenced).copied().collect();
        garbage.sort_unstable();
        for v in &garbage {
            tracing::warn!(
                bucket,
                version = v,
                "expiring an object version no key refers to"
            );
            match expire(store, bucket, &ExpireSel::Version(*v)) {
                Ok(_) | Err(Error::UnknownVersion { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(garbage)
    }

    /// Forgets a bucket's index (after its series was deleted as a whole).
    pub fn forget_bucket(&self, store: &Store, bucket: &str) -> ObjResult<()> {
        check_series_name(bucket)?;
        let lock = self.lock(bucket);
        let _g = lock.lock();
        let from = bucket_objects_prefix(bucket);
        let mut to = from.clone();
        *to.last_mut().expect("prefix ends with NUL") = 1;
        let mut b = store.meta().batch();
        b.delete_prefix_range(CF, &from, &to);
        b.delete(CF, &bucket_key(bucket));
        store.meta().write(b, true)?;
        self.swept.lock().remove(bucket);
        Ok(())
    }
}

/// The index entries a put commits in its version's batch: the object's
/// record, from what `summary` saw of the content, and the bucket's record
/// with its first object.
fn index_hook(
    summary: Arc<Mutex<Option<Summary>>>,
    bucket: &str,
    key: &str,
    encoding: Encoding,
    time_unix: i64,
    new_bucket: bool,
) -> CommitHook {
    let (bucket, key) = (bucket.to_string(), key.to_string());
    Arc::new(move |version, logical| {
        let s = summary
            .lock()
            .clone()
            .ok_or_else(|| Error::Invalid("the object's content was not read to its end".into()))?;
        if s.size != logical {
            return Err(Error::Invalid(format!(
                "object size mismatch: read {} bytes, backed up {logical}",
                s.size
            )));
        }
        let rec = ObjectRecord {
            version,
            size: s.size,
            encoding,
            uploaded_bytes: s.uploaded,
            etag: s.etag,
            time_unix,
            tar_members: s.tar_members,
        };
        let mut puts = vec![(
            CF,
            object_key(&bucket, &key),
            serde_json::to_vec(&rec).expect("records serialise"),
        )];
        if new_bucket {
            puts.push((
                CF,
                bucket_key(&bucket),
                serde_json::to_vec(&BucketRecord {
                    created_unix: time_unix,
                })
                .expect("records serialise"),
            ));
        }
        Ok(puts)
    })
}
