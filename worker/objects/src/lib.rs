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
//! RocksDB batch (the backup's
//! [`CommitHook`](revault_engine::CommitHook)), so an object appears with its
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

mod listing;
mod records;
mod source;
mod write;

#[cfg(test)]
mod testdata;
#[cfg(test)]
mod tests;

pub use listing::{list, summary, BucketSummary, Listing};
pub use records::{is_bucket, BucketRecord, ObjectRecord};
pub use write::{DeleteReport, Objects, PutOptions, PutReport};

use std::io::Write;

use serde::{Deserialize, Serialize};

use revault_engine::{
    check_series_name, restore, Error, MetaRead, RestoreOptions, RestoreReport, RestoreTarget,
    Result, Store, VersionSel,
};

use records::{record, version_exists};

/// Longest key accepted (as S3).
pub const MAX_KEY_BYTES: usize = 1024;

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

/// An object as listed or looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub bucket: String,
    pub key: String,
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
