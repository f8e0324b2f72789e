//! Buckets and objects (`/v1/buckets/...`, `/v1/signed/...`).

use serde::{Deserialize, Serialize};

use revault_objects::{BucketSummary, Encoding as EngineEncoding, Listing, ObjectInfo};

use crate::cli::format_time;

/// How an object's body was uploaded (and is served).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Identity,
    Gzip,
}

impl From<EngineEncoding> for Encoding {
    fn from(e: EngineEncoding) -> Self {
        match e {
            EngineEncoding::Identity => Encoding::Identity,
            EngineEncoding::Gzip => Encoding::Gzip,
        }
    }
}

/// An object as looked up or listed.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Object {
    pub key: String,
    /// Content bytes (decompressed for gzip uploads).
    pub size: u64,
    pub encoding: Encoding,
    /// Bytes received (the gzip stream's size for gzip uploads).
    pub uploaded_bytes: u64,
    /// BLAKE3 of the content, hex.
    pub etag: String,
    /// The version of the bucket's series holding the content.
    pub version: u32,
    pub time: String,
    /// Tar members found in the content (0: not a tar).
    pub tar_members: u64,
}

impl From<&ObjectInfo> for Object {
    fn from(o: &ObjectInfo) -> Self {
        Object {
            key: o.key.clone(),
            size: o.record.size,
            encoding: o.record.encoding.into(),
            uploaded_bytes: o.record.uploaded_bytes,
            etag: o.record.etag.clone(),
            version: o.record.version,
            time: format_time(o.record.time_unix),
            tar_members: o.record.tar_members,
        }
    }
}

/// A stored object (`PUT …/object`), with what its upload added.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct StoredObject {
    #[serde(flatten)]
    pub object: Object,
    /// Unique data the upload added (uncompressed).
    pub new_bytes: u64,
    /// Container bytes the upload wrote.
    pub stored_bytes: u64,
}

/// A bucket's totals (`GET /v1/buckets/{ns}/{bucket}`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Bucket {
    pub bucket: String,
    pub created: String,
    pub objects: u64,
    /// Content bytes of all objects.
    pub size: u64,
    /// Bytes uploaded for them (compressed sizes for gzip uploads).
    pub uploaded_bytes: u64,
    /// Container bytes their versions wrote.
    pub stored_bytes: u64,
}

impl From<BucketSummary> for Bucket {
    fn from(s: BucketSummary) -> Self {
        let BucketSummary {
            bucket,
            created_unix,
            objects,
            size,
            uploaded_bytes,
            stored_bytes,
        } = s;
        Bucket {
            bucket,
            created: format_time(created_unix),
            objects,
            size,
            uploaded_bytes,
            stored_bytes,
        }
    }
}

/// One page of a listing (`GET …/objects`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ObjectList {
    pub objects: Vec<Object>,
    pub common_prefixes: Vec<String>,
    /// Pass as `startAfter` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_start_after: Option<String>,
}

impl From<Listing> for ObjectList {
    fn from(l: Listing) -> Self {
        let Listing {
            objects,
            common_prefixes,
            next_start_after,
        } = l;
        ObjectList {
            objects: objects.iter().map(Object::from).collect(),
            common_prefixes,
            next_start_after,
        }
    }
}

/// A deleted object (`DELETE …/object`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ObjectDeleted {
    pub key: String,
    /// The version that held its content, now expired.
    pub version: u32,
    pub bytes_freed: u64,
}

/// A signed URL (`POST …/signed-url`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct SignedUrl {
    /// Path and query, relative to the worker's address.
    pub url: String,
    pub expires_at: String,
}

// ---- requests ---------------------------------------------------------------------

/// `GET …/objects?prefix=&delimiter=&startAfter=&limit=`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectListQuery {
    #[serde(default)]
    pub prefix: String,
    pub delimiter: Option<String>,
    pub start_after: Option<String>,
    pub limit: Option<usize>,
}

/// `?key=` of one object (meta, delete).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct KeyQuery {
    pub key: String,
}

/// `PUT …/object?key=&encoding=`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct PutObjectQuery {
    pub key: String,
    pub encoding: Option<String>,
}

/// `GET …/object?key=&decoded=`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct GetObjectQuery {
    pub key: String,
    pub decoded: Option<bool>,
}

/// `POST …/signed-url`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignRequest {
    pub key: String,
    pub ttl_seconds: Option<u64>,
}

/// `GET /v1/signed/{ns}/{bucket}?key=&expires=&id=&sig=`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct SignedQuery {
    pub key: String,
    pub expires: i64,
    pub id: String,
    pub sig: String,
}
