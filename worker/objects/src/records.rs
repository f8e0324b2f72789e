//! The object index in the metadata store: a JSON record per bucket and per
//! key, under the keys of `revault_engine::keys` (see the crate docs),
//! and what a record says about the bucket's series.

use serde::{Deserialize, Serialize};

use revault_engine::{
    keys::{bucket_key, object_key},
    Error, MetaRead, Result, SeriesRecord, Store, VersionRecord,
};

use crate::Encoding;

/// The column family holding the index.
pub(crate) const CF: &str = "default";

/// What the index knows about a bucket (written with its first object).
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

/// An object's record, read from the index entry `key`.
pub(crate) fn decode_record(bucket: &str, key: &[u8], v: &[u8]) -> Result<ObjectRecord> {
    serde_json::from_slice(v).map_err(|e| Error::CorruptMetadata {
        what: format!(
            "object {:?} of bucket {bucket}",
            String::from_utf8_lossy(key)
        ),
        detail: e.to_string(),
    })
}

/// The record of `bucket`, if it is an object bucket.
pub(crate) fn bucket_record(r: &impl MetaRead, bucket: &str) -> Result<Option<BucketRecord>> {
    let Some(raw) = r.get_raw(CF, &bucket_key(bucket))? else {
        return Ok(None);
    };
    let b = serde_json::from_slice(&raw).map_err(|e| Error::CorruptMetadata {
        what: format!("bucket {bucket}"),
        detail: e.to_string(),
    })?;
    Ok(Some(b))
}

/// True when `bucket` (a series name) is an object bucket.
pub fn is_bucket(r: &impl MetaRead, bucket: &str) -> Result<bool> {
    Ok(r.get_raw(CF, &bucket_key(bucket))?.is_some())
}

/// The index entry of `key`, whether or not its version still exists.
pub(crate) fn record(r: &impl MetaRead, bucket: &str, key: &str) -> Result<Option<ObjectRecord>> {
    match r.get_raw(CF, &object_key(bucket, key))? {
        None => Ok(None),
        Some(v) => decode_record(bucket, key.as_bytes(), &v).map(Some),
    }
}

/// Whether `version` of a bucket's series (`None`: it has none) still exists.
pub(crate) fn version_exists(
    r: &impl MetaRead,
    series: Option<&SeriesRecord>,
    version: u32,
) -> Result<bool> {
    Ok(match series {
        Some(s) => r.version(s, version)?.is_some(),
        None => false,
    })
}

/// The versions of the bucket's series (none if it has no series).
pub(crate) fn bucket_versions(store: &Store, bucket: &str) -> Result<Vec<VersionRecord>> {
    match store.meta().series(bucket)? {
        None => Ok(Vec::new()),
        Some(s) => store.versions(&s),
    }
}
