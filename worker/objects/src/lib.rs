//! An object namespace on top of series: keys in a *bucket*, as S3 and
//! Velero's `ObjectStore` plugins see them, with contents deduplicated like
//! every other backup.
//!
//! **Model.** A bucket is a series (`NAMESPACE/BUCKET`, dedup unit `chunk`);
//! each object's current content is one version of it. An index in the
//! metadata store maps keys to versions:
//!
//! ```text
//! default CF  "objects/b/" SERIES              → BucketRecord (JSON)
//! default CF  "objects/k/" SERIES "\0" KEY     → ObjectRecord (JSON)
//! ```
//!
//! **Consistency.** A put commits its version and its index entry in one
//! RocksDB batch (the backup's [`CommitHook`]), so an object appears with its
//! data or not at all. Overwriting commits the new version (the entry now
//! points at it) and then expires the old one; deleting removes the entry
//! (synced) and then expires the version. A crash between the two steps leaves
//! a version no entry refers to; [`Objects::sweep`] expires such versions (it
//! runs on a bucket's first write after the store opens). Hence: every version
//! of a bucket series is some object's current content, or garbage. The
//! series API refuses backups into a bucket series (see [`is_bucket`]).
//!
//! **Compressed uploads.** Velero writes gzip tarballs and gzip JSON. Gzip
//! output changes from the first changed byte on, so compressed bytes barely
//! deduplicate. A put with [`Encoding::Gzip`] decompresses the body and stores
//! the content; reads compress it again (so readers get a valid gzip stream of
//! the same content; the compressed bytes may differ from what was uploaded).
//! The ETag is the BLAKE3 hash of the content.
//!
//! **Tar-aware chunking.** A tar interleaves 512-byte headers (with each
//! member's mtime, which Velero sets to the backup time) and member data. The
//! content is fed to the chunker as pieces: each header block is a piece and
//! each member's data (with its padding) is a piece, so chunking restarts at
//! every member and an unchanged member's data deduplicates whatever its
//! header says. The pieces concatenate to the content, so objects stay
//! byte-exact; content that is not a tar is one piece.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use revault_engine::backup::{backup, BackupOptions, BackupReport, CommitHook};
use revault_engine::config::DedupUnit;
use revault_engine::expire::{expire, ExpireReport, ExpireSel};
use revault_engine::format::catalog;
use revault_engine::format::keys::{bucket_key, bucket_objects_prefix, object_key};
use revault_engine::format::records::{SeriesRecord, VersionRecord};
use revault_engine::meta::MetaRead;
use revault_engine::progress::Progress;
use revault_engine::restore::{restore, RestoreOptions, RestoreReport, RestoreTarget};
use revault_engine::source::{input_error, Source};
use revault_engine::store::{check_series_name, now_unix, Store, VersionSel};
use revault_engine::tarsource::{header_sum, pad};
use revault_engine::{Error, Result};

/// Longest key accepted (as S3).
pub const MAX_KEY_BYTES: usize = 1024;

const CF: &str = "default";

/// How an object's body was uploaded (and is served).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Stored and served as uploaded.
    #[default]
    Identity,
    /// Uploaded as a gzip stream: stored decompressed, served compressed again.
    Gzip,
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
        })
    }
}

impl std::str::FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "identity" => Ok(Encoding::Identity),
            "gzip" => Ok(Encoding::Gzip),
            _ => Err(format!("encoding {s:?}: expected identity or gzip")),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BucketRecord {
    pub created_unix: i64,
}

/// What the index knows about an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    /// The version of the bucket's series holding the content.
    pub version: u32,
    /// Content bytes (decompressed for gzip uploads).
    pub size: u64,
    pub encoding: Encoding,
    /// Bytes received (the gzip stream's size for gzip uploads).
    pub uploaded_bytes: u64,
    /// BLAKE3 of the content, hex.
    pub etag: String,
    pub time_unix: i64,
    /// Tar members found in the content (0: not a tar).
    pub tar_members: u64,
}

/// An object as listed or looked up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ObjectInfo {
    pub bucket: String,
    pub key: String,
    #[serde(flatten)]
    pub record: ObjectRecord,
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("bucket {bucket} has no object {key:?}")]
    NotFound { bucket: String, key: String },
    #[error("no bucket {0}: nothing was stored in it yet")]
    NoBucket(String),
    #[error("series {0} holds backups, not objects: use another bucket name")]
    NotABucket(String),
    #[error("invalid object key {key:?}: {why}")]
    BadKey { key: String, why: String },
    #[error("the upload is not a valid gzip stream: {0}")]
    BadGzip(String),
    #[error(transparent)]
    Engine(#[from] Error),
}

impl ObjectError {
    pub fn code(&self) -> &'static str {
        match self {
            ObjectError::NotFound { .. } => "unknown_object",
            ObjectError::NoBucket(_) => "unknown_bucket",
            ObjectError::NotABucket(_) => "not_a_bucket",
            ObjectError::BadKey { .. } => "bad_key",
            ObjectError::BadGzip(_) => "bad_gzip",
            ObjectError::Engine(e) => e.code(),
        }
    }
}

pub type ObjResult<T> = std::result::Result<T, ObjectError>;

/// Checks a key: 1 to 1024 bytes of UTF-8 without control characters.
pub fn check_key(key: &str) -> ObjResult<()> {
    let bad = |why: &str| ObjectError::BadKey {
        key: key.chars().take(80).collect(),
        why: why.to_string(),
    };
    if key.is_empty() {
        return Err(bad("keys are not empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(bad("keys are at most 1024 bytes"));
    }
    if key.chars().any(char::is_control) {
        return Err(bad("keys hold no control characters"));
    }
    Ok(())
}

fn decode_record(bucket: &str, key: &[u8], v: &[u8]) -> Result<ObjectRecord> {
    serde_json::from_slice(v).map_err(|e| Error::CorruptMetadata {
        what: format!(
            "object {:?} of bucket {bucket}",
            String::from_utf8_lossy(key)
        ),
        detail: e.to_string(),
    })
}

/// True when `bucket` (a series name) is an object bucket.
pub fn is_bucket(r: &impl MetaRead, bucket: &str) -> Result<bool> {
    Ok(r.get_raw(CF, &bucket_key(bucket))?.is_some())
}

/// The index entry of `key`, whether or not its version still exists.
fn record(r: &impl MetaRead, bucket: &str, key: &str) -> Result<Option<ObjectRecord>> {
    match r.get_raw(CF, &object_key(bucket, key))? {
        None => Ok(None),
        Some(v) => decode_record(bucket, key.as_bytes(), &v).map(Some),
    }
}

/// Whether `version` of a bucket's series (`None`: it has none) still exists.
fn version_exists(r: &impl MetaRead, series: Option<&SeriesRecord>, version: u32) -> Result<bool> {
    Ok(match series {
        Some(s) => r.version(s, version)?.is_some(),
        None => false,
    })
}

/// The versions of the bucket's series (none if it has no series).
fn bucket_versions(store: &Store, bucket: &str) -> Result<Vec<VersionRecord>> {
    match store.meta().series(bucket)? {
        None => Ok(Vec::new()),
        Some(s) => store.versions(&s),
    }
}

/// Looks an object up. An entry whose version is gone (the series was
/// expired or deleted behind the object API's back) counts as missing.
pub fn head(store: &Store, bucket: &str, key: &str) -> ObjResult<ObjectInfo> {
    check_series_name(bucket)?;
    check_key(key)?;
    let not_found = || ObjectError::NotFound {
        bucket: bucket.to_string(),
        key: key.to_string(),
    };
    let rec = record(store.meta(), bucket, key)?.ok_or_else(not_found)?;
    let series = store.meta().series(bucket)?;
    if !version_exists(store.meta(), series.as_ref(), rec.version)? {
        return Err(not_found());
    }
    Ok(ObjectInfo {
        bucket: bucket.to_string(),
        key: key.to_string(),
        record: rec,
    })
}

/// Writes an object's body: as uploaded (gzip objects compressed again), or
/// with `decoded` the stored content itself.
pub fn read(
    store: &Store,
    info: &ObjectInfo,
    decoded: bool,
    opts: &RestoreOptions,
    out: &mut dyn Write,
) -> Result<RestoreReport> {
    let sel = VersionSel::Number(info.record.version);
    if decoded || info.record.encoding == Encoding::Identity {
        return restore(store, &info.bucket, sel, opts, RestoreTarget::Writer(out));
    }
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::new(GZIP_LEVEL));
    let rep = restore(
        store,
        &info.bucket,
        sel,
        opts,
        RestoreTarget::Writer(&mut gz),
    )?;
    gz.finish().map_err(|e| Error::Io {
        context: "compressing the object".into(),
        source: e,
    })?;
    Ok(rep)
}

/// gzip level of served objects (zlib's default, as Go's `gzip.NewWriter`).
pub const GZIP_LEVEL: u32 = 6;

/// One page of a listing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Listing {
    pub objects: Vec<ObjectInfo>,
    /// With a delimiter: the distinct key prefixes up to and including the
    /// delimiter after `prefix` (as S3's CommonPrefixes).
    pub common_prefixes: Vec<String>,
    /// Pass as `start_after` for the next page; `None` on the last page.
    pub next_start_after: Option<String>,
}

/// Lists keys starting with `prefix`, in key order, after `start_after`, at
/// most `limit` entries (objects and common prefixes together). A bucket
/// that does not exist lists empty.
pub fn list(
    store: &Store,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: Option<&str>,
    limit: usize,
) -> ObjResult<Listing> {
    check_series_name(bucket)?;
    let delimiter = delimiter.filter(|d| !d.is_empty());
    // Entries are checked against their version one by one, as `head` does:
    // a page holds far fewer keys than the bucket may have versions.
    let meta = store.meta();
    let series = meta.series(bucket)?;
    let base = bucket_objects_prefix(bucket);
    let scan_prefix = [base.as_slice(), prefix.as_bytes()].concat();
    let mut from = scan_prefix.clone();
    if let Some(s) = start_after {
        let after = [base.as_slice(), s.as_bytes()].concat();
        if after > from {
            from = after;
        }
    }
    let mut out = Listing::default();
    let mut last: Option<String> = None;
    meta.for_each_from(CF, &from, &scan_prefix, |k, v| {
        let key = String::from_utf8_lossy(&k[base.len()..]).into_owned();
        if let Some(s) = start_after {
            // Skip the start key itself, and everything under a common prefix
            // that ended the previous page.
            if key.as_str() <= s
                || (delimiter.is_some_and(|d| s.ends_with(d)) && key.starts_with(s))
            {
                return Ok(true);
            }
        }
        let rest = &key[prefix.len()..];
        if let Some(d) = delimiter {
            if let Some(i) = rest.find(d) {
                let cp = format!("{prefix}{}", &rest[..i + d.len()]);
                if out.common_prefixes.last() == Some(&cp) {
                    return Ok(true);
                }
                if out.objects.len() + out.common_prefixes.len() == limit {
                    out.next_start_after = last.take();
                    return Ok(false);
                }
                last = Some(cp.clone());
                out.common_prefixes.push(cp);
                return Ok(true);
            }
        }
        let rec = decode_record(bucket, k, v)?;
        if !version_exists(meta, series.as_ref(), rec.version)? {
            return Ok(true);
        }
        if out.objects.len() + out.common_prefixes.len() == limit {
            out.next_start_after = last.take();
            return Ok(false);
        }
        last = Some(key.clone());
        out.objects.push(ObjectInfo {
            bucket: bucket.to_string(),
            key,
            record: rec,
        });
        Ok(true)
    })?;
    Ok(out)
}

/// Totals of a bucket.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BucketSummary {
    pub bucket: String,
    pub created_unix: i64,
    pub objects: u64,
    /// Content bytes of all objects.
    pub size: u64,
    /// Bytes uploaded for them (compressed sizes for gzip uploads).
    pub uploaded_bytes: u64,
    /// Container bytes the objects' versions wrote (what they added to the store).
    pub stored_bytes: u64,
}

pub fn summary(store: &Store, bucket: &str) -> ObjResult<BucketSummary> {
    check_series_name(bucket)?;
    let Some(raw) = store.meta().get_raw(CF, &bucket_key(bucket))? else {
        return Err(ObjectError::NoBucket(bucket.to_string()));
    };
    let b: BucketRecord = serde_json::from_slice(&raw).map_err(|e| Error::CorruptMetadata {
        what: format!("bucket {bucket}"),
        detail: e.to_string(),
    })?;
    let versions: HashMap<u32, u64> = bucket_versions(store, bucket)?
        .iter()
        .map(|v| (v.number, v.new_container_bytes))
        .collect();
    let mut out = BucketSummary {
        bucket: bucket.to_string(),
        created_unix: b.created_unix,
        ..Default::default()
    };
    let base = bucket_objects_prefix(bucket);
    store.meta().for_each_prefix(CF, &base, |k, v| {
        let rec = decode_record(bucket, k, v)?;
        if let Some(stored) = versions.get(&rec.version) {
            out.objects += 1;
            out.size += rec.size;
            out.uploaded_bytes += rec.uploaded_bytes;
            out.stored_bytes += stored;
        }
        Ok(true)
    })?;
    Ok(out)
}

#[derive(Clone, Default)]
pub struct PutOptions {
    pub encoding: Encoding,
    /// Called with the content bytes read so far.
    pub progress: Option<Progress>,
    pub cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PutReport {
    #[serde(flatten)]
    pub object: ObjectInfo,
    pub backup: BackupReport,
    /// The version the object had before, now expired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced: Option<ExpireReport>,
}

#[derive(Clone, Debug, Serialize)]
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
        let hook: CommitHook = {
            let summary = summary.clone();
            let (bucket, key) = (bucket.to_string(), key.to_string());
            let encoding = opts.encoding;
            Arc::new(move |version, logical| {
                let s = summary.lock().clone().ok_or_else(|| {
                    Error::Invalid("the object's content was not read to its end".into())
                })?;
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
        };
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

/// What the source saw, handed to the commit hook.
#[derive(Clone, Debug)]
struct Summary {
    size: u64,
    uploaded: u64,
    etag: String,
    tar_members: u64,
}

/// Counts bytes read from the network.
struct Counting<R> {
    inner: R,
    n: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n
            .fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(k)
    }
}

const BLOCK: usize = 512;

/// The data bytes (padding included) after a valid tar header, or `None`
/// when the block is not a tar header. Read with the `tar` crate's header
/// fields and checked as [`revault_engine::tarsource`] checks them.
fn tar_header(block: &[u8]) -> Option<u64> {
    let block: &[u8; BLOCK] = block.try_into().ok()?;
    if block.iter().all(|&b| b == 0) {
        return None;
    }
    let h = tar::Header::from_byte_slice(block);
    if h.cksum().ok()? != header_sum(block) {
        return None;
    }
    // Kinds of members whose size field counts the data blocks that follow.
    use tar::EntryType as T;
    let size = match h.entry_type() {
        T::Regular
        | T::Continuous
        | T::XHeader
        | T::XGlobalHeader
        | T::GNULongName
        | T::GNULongLink
        | T::GNUSparse => h.entry_size().ok()?,
        _ => 0,
    };
    size.checked_add(pad(size))
}

/// The piece being read.
enum Cur {
    /// A header block (in `head`).
    Head,
    /// Member data: this many bytes remain.
    Data(u64),
    /// Everything left (not a tar, or past its end), after `head`.
    Rest,
}

/// What the next piece is.
enum Next {
    /// A tar header, or the rest if the next block is not one.
    Header,
    /// Data of the member whose header was the last piece.
    Data(u64),
    /// Nothing: the content has ended.
    Done,
}

/// The object's content as backup pieces (see the module docs).
struct ObjectSource {
    name: String,
    r: Box<dyn Read + Send>,
    uploaded: Arc<std::sync::atomic::AtomicU64>,
    hasher: blake3::Hasher,
    size: u64,
    members: u64,
    cur: Cur,
    next: Next,
    /// Bytes read ahead that belong to the current piece.
    head: Vec<u8>,
    head_pos: usize,
    eof: bool,
    gzip: bool,
    out: Arc<Mutex<Option<Summary>>>,
}

impl ObjectSource {
    fn new(
        name: String,
        body: Box<dyn Read + Send>,
        encoding: Encoding,
        out: Arc<Mutex<Option<Summary>>>,
    ) -> Self {
        let uploaded = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Counting {
            inner: body,
            n: uploaded.clone(),
        };
        let r: Box<dyn Read + Send> = match encoding {
            Encoding::Identity => Box::new(counted),
            Encoding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(counted)),
        };
        ObjectSource {
            name,
            r,
            uploaded,
            hasher: blake3::Hasher::new(),
            size: 0,
            members: 0,
            cur: Cur::Rest,
            next: Next::Header,
            head: Vec::with_capacity(BLOCK),
            head_pos: 0,
            eof: false,
            gzip: encoding == Encoding::Gzip,
            out,
        }
    }

    fn err(&self, e: io::Error) -> Error {
        // What the gzip decoder reports for a corrupt or truncated stream (a
        // cancelled input is `Other`, so `input_error` still sees it).
        if self.gzip
            && matches!(
                e.kind(),
                io::ErrorKind::InvalidInput
                    | io::ErrorKind::InvalidData
                    | io::ErrorKind::UnexpectedEof
            )
        {
            return Error::BadGzip(e.to_string());
        }
        input_error(&self.name, e)
    }

    /// Reads from the content, hashing and counting it.
    fn raw_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.eof || buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.r.read(buf) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    self.hasher.update(&buf[..n]);
                    self.size += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    fn fill_head(&mut self) -> Result<()> {
        self.head.clear();
        self.head_pos = 0;
        let mut block = [0u8; BLOCK];
        let mut got = 0;
        while got < BLOCK {
            let n = self.raw_read(&mut block[got..])?;
            if n == 0 {
                break;
            }
            got += n;
        }
        self.head.extend_from_slice(&block[..got]);
        Ok(())
    }

    fn finish_summary(&mut self) {
        *self.out.lock() = Some(Summary {
            size: self.size,
            uploaded: self.uploaded.load(std::sync::atomic::Ordering::Relaxed),
            etag: self.hasher.finalize().to_hex().to_string(),
            tar_members: self.members,
        });
    }
}

impl Source for ObjectSource {
    fn next_piece(&mut self) -> Result<bool> {
        // A backup reads every piece to its end before asking for the next.
        if let Next::Data(n) = self.next {
            self.next = Next::Header;
            if n > 0 {
                self.cur = Cur::Data(n);
                return Ok(true);
            }
        }
        if let Next::Done = self.next {
            self.finish_summary();
            return Ok(false);
        }
        self.fill_head()?;
        if self.head.is_empty() {
            self.next = Next::Done;
            self.finish_summary();
            return Ok(false);
        }
        match tar_header(&self.head) {
            Some(data) => {
                self.members += 1;
                self.cur = Cur::Head;
                self.next = Next::Data(data);
            }
            None => {
                self.cur = Cur::Rest;
                self.next = Next::Done;
            }
        }
        Ok(true)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.head_pos < self.head.len() {
            let n = (self.head.len() - self.head_pos).min(buf.len());
            buf[..n].copy_from_slice(&self.head[self.head_pos..self.head_pos + n]);
            self.head_pos += n;
            return Ok(n);
        }
        match self.cur {
            Cur::Head | Cur::Data(0) => Ok(0),
            Cur::Data(left) => {
                let k = left.min(buf.len() as u64) as usize;
                let n = self.raw_read(&mut buf[..k])?;
                // Zero: the archive ends inside a member; the next piece finds the end.
                self.cur = Cur::Data(left - n as u64);
                Ok(n)
            }
            Cur::Rest => self.raw_read(buf),
        }
    }

    fn finish(self: Box<Self>) -> Result<Option<Vec<catalog::Entry>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use revault_engine::store::{InitOptions, OpenMode};

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let s = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
        (dir, s)
    }

    /// A tar like Velero's: regular files with the given mtime.
    fn tarball(files: &[(&str, Vec<u8>)], mtime: u64) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_ustar();
            h.set_path(name).unwrap();
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            h.set_mtime(mtime);
            h.set_cksum();
            b.append(&h, data.as_slice()).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Reads a source the way the chunker does: piece by piece, to the end.
    fn pieces(content: &[u8], encoding: Encoding) -> (Vec<Vec<u8>>, Summary) {
        let out = Arc::new(Mutex::new(None));
        let mut src = ObjectSource::new(
            "test".into(),
            Box::new(io::Cursor::new(content.to_vec())),
            encoding,
            out.clone(),
        );
        let mut ps = Vec::new();
        while src.next_piece().unwrap() {
            let mut p = Vec::new();
            let mut buf = [0u8; 333];
            loop {
                let n = src.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                p.extend_from_slice(&buf[..n]);
            }
            ps.push(p);
        }
        let s = out.lock().clone().expect("summary at the end");
        (ps, s)
    }

    #[test]
    fn tar_content_is_split_at_members_and_stays_byte_exact() {
        let files = vec![
            (
                "resources/pods/namespaces/a/p1.json",
                pseudo_random(3000, 1),
            ),
            ("resources/pods/namespaces/a/empty.json", Vec::new()),
            ("metadata/version", b"1".to_vec()),
        ];
        let t = tarball(&files, 1_700_000_000);
        let (ps, s) = pieces(&t, Encoding::Identity);
        assert_eq!(ps.concat(), t, "pieces concatenate to the content");
        assert_eq!(s.size, t.len() as u64);
        assert_eq!(s.tar_members, 3);
        assert_eq!(s.etag, blake3::hash(&t).to_hex().to_string());
        // header, data, header (empty file: no data piece), header, data, end blocks
        let lens: Vec<usize> = ps.iter().map(Vec::len).collect();
        assert_eq!(lens[..5], [512, 3072, 512, 512, 512]);
        assert_eq!(lens.len(), 6, "{lens:?}");
        assert!(ps[5].iter().all(|&b| b == 0), "the end-of-archive blocks");
    }

    #[test]
    fn other_content_is_one_piece_and_gzip_is_decoded() {
        for data in [pseudo_random(10_000, 2), b"x".to_vec(), vec![0u8; 2048]] {
            let (ps, s) = pieces(&data, Encoding::Identity);
            assert_eq!(ps.len(), 1);
            assert_eq!(ps.concat(), data);
            assert_eq!(s.tar_members, 0);
            let gz = gzip(&data);
            let (ps, s) = pieces(&gz, Encoding::Gzip);
            assert_eq!(ps.concat(), data);
            assert_eq!(s.uploaded, gz.len() as u64);
            assert_eq!(s.size, data.len() as u64);
        }
        let (ps, s) = pieces(b"", Encoding::Identity);
        assert!(ps.is_empty());
        assert_eq!(s.size, 0);
    }

    #[test]
    fn a_truncated_tar_is_kept_as_it_is() {
        let t = tarball(&[("a", pseudo_random(5000, 3))], 1);
        let cut = &t[..2000];
        let (ps, _) = pieces(cut, Encoding::Identity);
        assert_eq!(ps.concat(), cut);
    }

    fn try_put(
        o: &Objects,
        s: &Store,
        bucket: &str,
        key: &str,
        body: Vec<u8>,
        enc: Encoding,
    ) -> ObjResult<PutReport> {
        o.put(
            s,
            bucket,
            key,
            Box::new(io::Cursor::new(body)),
            &PutOptions {
                encoding: enc,
                ..Default::default()
            },
        )
    }

    fn put(
        o: &Objects,
        s: &Store,
        bucket: &str,
        key: &str,
        body: Vec<u8>,
        enc: Encoding,
    ) -> PutReport {
        try_put(o, s, bucket, key, body, enc).unwrap()
    }

    fn get(s: &Store, bucket: &str, key: &str, decoded: bool) -> Vec<u8> {
        let info = head(s, bucket, key).unwrap();
        let mut out = Vec::new();
        read(s, &info, decoded, &RestoreOptions::default(), &mut out).unwrap();
        out
    }

    #[test]
    fn put_get_list_overwrite_delete() {
        let (_d, s) = store();
        let o = Objects::new();
        let b = "velero/bsl";
        assert!(list(&s, b, "", Some("/"), None, 100)
            .unwrap()
            .objects
            .is_empty());
        for k in [
            "backups/b1/b1.json",
            "backups/b1/b1-logs.gz",
            "backups/b2/b2.json",
            "metadata/revision",
        ] {
            put(
                &o,
                &s,
                b,
                k,
                format!("content of {k}").into_bytes(),
                Encoding::Identity,
            );
        }
        assert!(is_bucket(s.meta(), b).unwrap());
        let l = list(&s, b, "backups/", Some("/"), None, 100).unwrap();
        assert_eq!(l.common_prefixes, ["backups/b1/", "backups/b2/"]);
        assert!(l.objects.is_empty());
        let l = list(&s, b, "backups/b1/", None, None, 100).unwrap();
        let keys: Vec<_> = l.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["backups/b1/b1-logs.gz", "backups/b1/b1.json"]);
        // Pages of one entry each walk the same listing.
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let p = list(&s, b, "", Some("/"), after.as_deref(), 1).unwrap();
            seen.extend(p.common_prefixes.clone());
            seen.extend(p.objects.iter().map(|o| o.key.clone()));
            match p.next_start_after {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, ["backups/", "metadata/"]);

        assert_eq!(
            get(&s, b, "metadata/revision", false),
            b"content of metadata/revision"
        );
        let v1 = head(&s, b, "metadata/revision").unwrap().record.version;
        let r = put(
            &o,
            &s,
            b,
            "metadata/revision",
            b"new".to_vec(),
            Encoding::Identity,
        );
        assert_eq!(r.replaced.as_ref().unwrap().expired, [v1]);
        assert_eq!(get(&s, b, "metadata/revision", false), b"new");
        let series = s.series(b).unwrap();
        assert_eq!(
            s.versions(&series).unwrap().len(),
            4,
            "the old content's version is gone"
        );

        let d = o.delete(&s, b, "backups/b2/b2.json").unwrap();
        assert_eq!(d.expired.expired, [d.version]);
        assert!(matches!(
            head(&s, b, "backups/b2/b2.json"),
            Err(ObjectError::NotFound { .. })
        ));
        assert!(matches!(
            o.delete(&s, b, "backups/b2/b2.json"),
            Err(ObjectError::NotFound { .. })
        ));
        let l = list(&s, b, "backups/", Some("/"), None, 100).unwrap();
        assert_eq!(l.common_prefixes, ["backups/b1/"]);
        let sum = summary(&s, b).unwrap();
        assert_eq!(sum.objects, 3);
    }

    #[test]
    fn gzip_objects_are_served_compressed_with_the_same_content() {
        let (_d, s) = store();
        let o = Objects::new();
        let t = tarball(&[("resources/a.json", pseudo_random(9000, 4))], 5);
        let gz = gzip(&t);
        let r = put(
            &o,
            &s,
            "velero/bsl",
            "backups/x/x.tar.gz",
            gz.clone(),
            Encoding::Gzip,
        );
        assert_eq!(r.object.record.size, t.len() as u64);
        assert_eq!(r.object.record.uploaded_bytes, gz.len() as u64);
        assert_eq!(r.object.record.tar_members, 1);
        let served = get(&s, "velero/bsl", "backups/x/x.tar.gz", false);
        assert_eq!(&served[..2], &[0x1f, 0x8b], "a gzip stream");
        assert_eq!(gunzip(&served), t);
        assert_eq!(get(&s, "velero/bsl", "backups/x/x.tar.gz", true), t);

        let e = try_put(
            &o,
            &s,
            "velero/bsl",
            "bad.gz",
            b"not gzip at all".to_vec(),
            Encoding::Gzip,
        )
        .unwrap_err();
        assert_eq!(e.code(), "bad_gzip", "{e}");
        assert!(matches!(
            head(&s, "velero/bsl", "bad.gz"),
            Err(ObjectError::NotFound { .. })
        ));
    }

    #[test]
    fn unchanged_tar_members_dedup_whatever_their_headers_say() {
        let (_d, s) = store();
        let o = Objects::new();
        let files: Vec<(String, Vec<u8>)> = (0..200)
            .map(|i| {
                (
                    format!("resources/cm/namespaces/ns/cm{i}.json"),
                    pseudo_random(2000 + i * 37, i as u64),
                )
            })
            .collect();
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
        let first = put(
            &o,
            &s,
            "velero/bsl",
            "b1.tar.gz",
            gzip(&tarball(&refs, 1000)),
            Encoding::Gzip,
        );
        // Same contents, every header's mtime different.
        let second = put(
            &o,
            &s,
            "velero/bsl",
            "b2.tar.gz",
            gzip(&tarball(&refs, 2000)),
            Encoding::Gzip,
        );
        assert!(first.backup.new_vbytes > 400_000);
        assert!(
            second.backup.new_vbytes * 10 < first.backup.new_vbytes,
            "only the headers are new: {} vs {}",
            second.backup.new_vbytes,
            first.backup.new_vbytes
        );
    }

    #[test]
    fn buckets_and_backup_series_do_not_mix_and_sweep_removes_orphans() {
        let (_d, s) = store();
        let o = Objects::new();
        revault_engine::backup::backup(
            &s,
            "team/db",
            Box::new(revault_engine::source::StreamSource::new(
                "x",
                io::Cursor::new(b"backup".to_vec()),
            )),
            &BackupOptions::default(),
        )
        .unwrap();
        let e = try_put(&o, &s, "team/db", "k", b"x".to_vec(), Encoding::Identity).unwrap_err();
        assert_eq!(e.code(), "not_a_bucket");
        assert_eq!(check_key("").unwrap_err().code(), "bad_key");
        assert_eq!(check_key("a\nb").unwrap_err().code(), "bad_key");
        assert_eq!(check_key(&"k".repeat(1025)).unwrap_err().code(), "bad_key");

        // A crash between removing an entry and expiring its version leaves an orphan.
        let b = "velero/bsl";
        put(&o, &s, b, "keep", b"keep".to_vec(), Encoding::Identity);
        let r = put(&o, &s, b, "orphan", b"orphan".to_vec(), Encoding::Identity);
        let mut batch = s.meta().batch();
        batch.delete(CF, &object_key(b, "orphan"));
        s.meta().write(batch, true).unwrap();
        assert_eq!(o.sweep(&s, b).unwrap(), [r.object.record.version]);
        let series = s.series(b).unwrap();
        assert_eq!(s.versions(&series).unwrap().len(), 1);
        assert_eq!(get(&s, b, "keep", false), b"keep");

        // A whole bucket deleted through its series leaves nothing listed.
        let newest = s.versions(&series).unwrap().last().unwrap().number;
        expire(&s, b, &ExpireSel::Version(newest)).unwrap();
        assert!(list(&s, b, "", None, None, 10).unwrap().objects.is_empty());
        o.forget_bucket(&s, b).unwrap();
        assert!(!is_bucket(s.meta(), b).unwrap());
    }
}
