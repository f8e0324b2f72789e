//! The S3 client: the few calls the durable tier makes, with errors in its own terms.
//!
//! Built on the AWS SDK for Rust, so credentials, regions and endpoints come the standard
//! way (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, profiles, web identity on EKS, instance metadata). With an endpoint set
//! (Ceph RGW, SeaweedFS, versitygw, …) requests use path-style addressing, which every
//! S3-compatible server accepts. The SDK retries throttling, 5xx and broken connections
//! (standard mode, [`MAX_ATTEMPTS`]); what still fails is reported as [`RemoteError`].
//!
//! Checksums: request checksums only where the S3 API requires them, so servers that predate
//! the SDK's default CRC trailers take our PUTs. Integrity does not depend on them: every
//! object is sealed ([`crate::seal`]) and checked when opened. Bodies go up with an unsigned
//! payload (`UNSIGNED-PAYLOAD`; the request itself is still signed): the server checks each
//! body's CRC32C before storing it, and the seal authenticates it, so SigV4's SHA-256 of every
//! byte, on both ends, would buy nothing but CPU.

use std::ops::Range;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart, ObjectLockMode,
    ObjectLockRetention, ObjectLockRetentionMode,
};
use aws_sdk_s3::Client;
use bytes::Bytes;

use crate::error::{RemoteError, Result};
use crate::seal::{self, DataKey};
use crate::url::RemoteUrl;

/// Attempts per request, the first included (throttling, 5xx, connection errors). Few:
/// the uploader retries whole syncs with its own backoff, and a CLI command should say soon
/// that the bucket is away.
const MAX_ATTEMPTS: u32 = 3;
/// Bodies above this go up in parts (retried part by part).
const MULTIPART_ABOVE: usize = 32 << 20;
const PART_SIZE: usize = 16 << 20;

/// Object Lock for new objects: the mode and how long each object is kept from the moment
/// it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectLock {
    /// `COMPLIANCE` (nobody, not even the root account, can delete early) or `GOVERNANCE`.
    pub compliance: bool,
    /// Retention from upload, in seconds (the CLI takes days).
    pub seconds: u64,
}

/// A version of an object (`ListObjectVersions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectVersion {
    pub name: String,
    pub version_id: String,
    /// The current version (not deleted, not replaced).
    pub latest: bool,
    pub delete_marker: bool,
    /// Unix seconds.
    pub modified: i64,
}

/// An object listed: its name (relative to the store's prefix) and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub size: u64,
}

#[derive(Clone)]
pub struct Bucket {
    client: Client,
    pub url: RemoteUrl,
    /// A custom endpoint (not AWS): bucket creation takes no location constraint.
    custom_endpoint: bool,
    region: String,
}

impl Bucket {
    /// A client for `url`, configured from the environment.
    pub async fn connect(url: RemoteUrl) -> Result<Bucket> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(MAX_ATTEMPTS)
                    .with_initial_backoff(Duration::from_millis(200)),
            )
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .read_timeout(Duration::from_secs(60))
                    .operation_attempt_timeout(Duration::from_secs(300))
                    .build(),
            );
        if std::env::var_os("AWS_REGION").is_none()
            && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        {
            // S3-compatible servers mostly ignore the region, but signing needs one.
            loader = loader.region(Region::new("us-east-1"));
        }
        let shared = loader.load().await;
        let region = shared
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "us-east-1".into());
        let custom_endpoint = shared.endpoint_url().is_some();
        let conf = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(custom_endpoint)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        Ok(Bucket {
            client: Client::from_conf(conf),
            url,
            custom_endpoint,
            region,
        })
    }

    fn key(&self, name: &str) -> String {
        self.url.key(name)
    }

    /// Opens sealed object `name` (sealed under its name relative to the prefix); an error
    /// names its whole key in the bucket.
    pub fn open_sealed(&self, key: &DataKey, name: &str, sealed: &[u8]) -> Result<Vec<u8>> {
        seal::open(key, name, sealed).map_err(|e| self.in_bucket(e))
    }

    /// `e` with the object named by its key in the bucket rather than its name.
    pub fn in_bucket(&self, e: RemoteError) -> RemoteError {
        match e {
            RemoteError::Tampered { object, detail } => RemoteError::Tampered {
                object: format!("s3://{}/{}", self.url.bucket, self.url.key(&object)),
                detail,
            },
            other => other,
        }
    }

    /// Creates the bucket if it does not exist; true if this call created it.
    pub async fn ensure_bucket(&self, object_lock: bool) -> Result<bool> {
        let what = format!("the bucket {}", self.url.bucket);
        match self
            .client
            .head_bucket()
            .bucket(&self.url.bucket)
            .send()
            .await
        {
            Ok(_) => return Ok(false),
            Err(e) => match map_err(&what, e) {
                RemoteError::NotFound { .. } => {}
                other => return Err(other),
            },
        }
        let mut req = self
            .client
            .create_bucket()
            .bucket(&self.url.bucket)
            .object_lock_enabled_for_bucket(object_lock);
        if !self.custom_endpoint && self.region != "us-east-1" {
            use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};
            req = req.create_bucket_configuration(
                CreateBucketConfiguration::builder()
                    .location_constraint(BucketLocationConstraint::from(self.region.as_str()))
                    .build(),
            );
        }
        match req.send().await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("BucketAlreadyOwnedByYou") => Ok(false),
            Err(e) => Err(map_err(&format!("creating {what}"), e)),
        }
    }

    /// Stores `body` as object `name` (replacing it), with Object Lock if `lock` is set.
    pub async fn put(&self, name: &str, body: Bytes, lock: Option<ObjectLock>) -> Result<()> {
        if body.len() > MULTIPART_ABOVE {
            return self.put_parts(name, body, lock).await;
        }
        self.put_request(name, body, lock)
            .customize()
            .disable_payload_signing()
            .send()
            .await
            .map(|_| ())
            .map_err(|e| map_err(&format!("writing {}", self.key(name)), e))
    }

    /// A PutObject of `body` as `name`, with its checksum and Object Lock if `lock` is set.
    fn put_request(
        &self,
        name: &str,
        body: Bytes,
        lock: Option<ObjectLock>,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        let req = self
            .client
            .put_object()
            .bucket(&self.url.bucket)
            .key(self.key(name))
            // The server checks the bytes it received against this before it stores them (a
            // body damaged on the way is refused, not kept as the only copy of a container
            // that is then evicted); Object Lock PUTs need a checksum anyway.
            .checksum_crc32_c(crc32c_of(&body))
            .body(ByteStream::from(body));
        match lock {
            Some(l) => req
                .object_lock_mode(lock_mode(l))
                .object_lock_retain_until_date(retain_until(l)),
            None => req,
        }
    }

    /// Replaces object `name` only if it is still the one read with ETag `etag`
    /// (`If-Match`): the new ETag, or `None` if someone else wrote it meanwhile.
    pub async fn put_if_match(
        &self,
        name: &str,
        body: Bytes,
        lock: Option<ObjectLock>,
        etag: &str,
    ) -> Result<Option<String>> {
        let req = self.put_request(name, body, lock).if_match(etag);
        match req.customize().disable_payload_signing().send().await {
            Ok(out) => Ok(Some(out.e_tag().unwrap_or_default().to_string())),
            Err(e) => match status_of(&e) {
                Some(412) | Some(409) => Ok(None),
                _ => Err(map_err(&format!("writing {}", self.key(name)), e)),
            },
        }
    }

    /// Stores object `name` only if it does not exist yet (`If-None-Match: *`); false if it
    /// did. This is how two stores claiming one generation cannot both win.
    pub async fn put_new(&self, name: &str, body: Bytes, lock: Option<ObjectLock>) -> Result<bool> {
        let req = self.put_request(name, body, lock).if_none_match("*");
        match req.customize().disable_payload_signing().send().await {
            Ok(_) => Ok(true),
            Err(e) => match status_of(&e) {
                Some(412) | Some(409) => Ok(false),
                _ => Err(map_err(&format!("writing {}", self.key(name)), e)),
            },
        }
    }

    async fn put_parts(&self, name: &str, body: Bytes, lock: Option<ObjectLock>) -> Result<()> {
        let key = self.key(name);
        let what = format!("writing {key}");
        let mut create = self
            .client
            .create_multipart_upload()
            .bucket(&self.url.bucket)
            .key(&key);
        create = create.checksum_algorithm(ChecksumAlgorithm::Crc32C);
        if let Some(l) = lock {
            create = create
                .object_lock_mode(lock_mode(l))
                .object_lock_retain_until_date(retain_until(l));
        }
        let up = create.send().await.map_err(|e| map_err(&what, e))?;
        let id = up
            .upload_id()
            .ok_or_else(|| RemoteError::Bucket {
                what: what.clone(),
                detail: "the server returned no upload id".into(),
            })?
            .to_string();
        let result = async {
            let mut parts = Vec::new();
            for (i, chunk) in body.chunks(PART_SIZE).enumerate() {
                let n = i as i32 + 1;
                let out = self
                    .client
                    .upload_part()
                    .bucket(&self.url.bucket)
                    .key(&key)
                    .upload_id(&id)
                    .part_number(n)
                    .checksum_crc32_c(crc32c_of(chunk))
                    .body(ByteStream::from(body.slice_ref(chunk)))
                    .customize()
                    .disable_payload_signing()
                    .send()
                    .await
                    .map_err(|e| map_err(&what, e))?;
                parts.push(
                    CompletedPart::builder()
                        .part_number(n)
                        .set_e_tag(out.e_tag().map(str::to_string))
                        .set_checksum_crc32_c(out.checksum_crc32_c().map(str::to_string))
                        .build(),
                );
            }
            self.client
                .complete_multipart_upload()
                .bucket(&self.url.bucket)
                .key(&key)
                .upload_id(&id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| map_err(&what, e))?;
            Ok(())
        }
        .await;
        if result.is_err() {
            // Parts of an abandoned upload cost space until aborted; best effort.
            let _ = self
                .client
                .abort_multipart_upload()
                .bucket(&self.url.bucket)
                .key(&key)
                .upload_id(&id)
                .send()
                .await;
        }
        result
    }

    /// The whole object, or [`RemoteError::NotFound`].
    pub async fn get(&self, name: &str) -> Result<Bytes> {
        Ok(self.get_inner(name, None).await?.0)
    }

    /// The object and its ETag (for a later [`Bucket::put_if_match`]).
    pub async fn get_tagged(&self, name: &str) -> Result<(Bytes, Option<String>)> {
        self.get_inner(name, None).await
    }

    /// The object, or `None` if it does not exist.
    pub async fn get_opt(&self, name: &str) -> Result<Option<Bytes>> {
        match self.get_inner(name, None).await {
            Ok((b, _)) => Ok(Some(b)),
            Err(RemoteError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The object's first `max` bytes at most (all of a shorter one): a read whose length
    /// the caller knows a bound for, so a hostile object cannot make it hold more.
    pub async fn get_at_most(&self, name: &str, max: u64) -> Result<Bytes> {
        Ok(self.get_inner(name, Some(0..max)).await?.0)
    }

    /// Bytes `range` of the object.
    pub async fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes> {
        let (b, _) = self.get_inner(name, Some(range.clone())).await?;
        if b.len() as u64 != range.end - range.start {
            return Err(RemoteError::tampered(
                &self.key(name),
                &format!(
                    "asked for bytes {}..{}, got {} bytes (the object is shorter than its header says)",
                    range.start,
                    range.end,
                    b.len()
                ),
            ));
        }
        Ok(b)
    }

    async fn get_inner(
        &self,
        name: &str,
        range: Option<Range<u64>>,
    ) -> Result<(Bytes, Option<String>)> {
        let key = self.key(name);
        let what = format!("reading {key}");
        let mut req = self.client.get_object().bucket(&self.url.bucket).key(&key);
        if let Some(r) = &range {
            req = req.range(format!("bytes={}-{}", r.start, r.end.saturating_sub(1)));
        }
        let out = req.send().await.map_err(|e| match map_err(&what, e) {
            RemoteError::NotFound { .. } => RemoteError::NotFound {
                object: key.clone(),
            },
            other => other,
        })?;
        let etag = out.e_tag().map(str::to_string);
        let body = out
            .body
            .collect()
            .await
            .map_err(|e| RemoteError::Unreachable {
                what: what.clone(),
                detail: e.to_string(),
            })?;
        Ok((body.into_bytes(), etag))
    }

    /// Every object whose name starts with `prefix` (relative to the store's prefix).
    pub async fn list(&self, prefix: &str) -> Result<Vec<Listed>> {
        let full = self.key(prefix);
        let what = format!("listing {full}");
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.url.bucket)
            .prefix(&full)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| map_err(&what, e))?;
            for o in page.contents() {
                let Some(key) = o.key() else { continue };
                if let Some(name) = self.url.name_of(key) {
                    out.push(Listed {
                        name: name.to_string(),
                        size: o.size().unwrap_or(0).max(0) as u64,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Every version of the objects under `prefix` (a versioned bucket, e.g. one with Object
    /// Lock), delete markers included.
    pub async fn list_versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>> {
        let full = self.key(prefix);
        let what = format!("listing the versions under {full}");
        let mut out = Vec::new();
        let (mut key_marker, mut version_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .client
                .list_object_versions()
                .bucket(&self.url.bucket)
                .prefix(&full)
                .set_key_marker(key_marker.clone())
                .set_version_id_marker(version_marker.clone())
                .send()
                .await
                .map_err(|e| map_err(&what, e))?;
            let secs = |t: Option<&aws_smithy_types::DateTime>| t.map_or(0, |t| t.secs());
            for v in page.versions() {
                if let (Some(k), Some(id)) = (v.key(), v.version_id()) {
                    if let Some(name) = self.url.name_of(k) {
                        out.push(ObjectVersion {
                            name: name.to_string(),
                            version_id: id.to_string(),
                            latest: v.is_latest().unwrap_or(false),
                            delete_marker: false,
                            modified: secs(v.last_modified()),
                        });
                    }
                }
            }
            for m in page.delete_markers() {
                if let (Some(k), Some(id)) = (m.key(), m.version_id()) {
                    if let Some(name) = self.url.name_of(k) {
                        out.push(ObjectVersion {
                            name: name.to_string(),
                            version_id: id.to_string(),
                            latest: m.is_latest().unwrap_or(false),
                            delete_marker: true,
                            modified: secs(m.last_modified()),
                        });
                    }
                }
            }
            if page.is_truncated() != Some(true) {
                return Ok(out);
            }
            key_marker = page.next_key_marker().map(str::to_string);
            version_marker = page.next_version_id_marker().map(str::to_string);
        }
    }

    /// Keeps the current version of object `name` locked until `until` (Unix seconds): S3
    /// only lets a retention grow, so this never shortens one.
    pub async fn extend_retention(&self, name: &str, lock: ObjectLock, until: i64) -> Result<()> {
        let key = self.key(name);
        let retention = ObjectLockRetention::builder()
            .mode(retention_mode(lock))
            .retain_until_date(aws_smithy_types::DateTime::from_secs(until))
            .build();
        self.client
            .put_object_retention()
            .bucket(&self.url.bucket)
            .key(&key)
            .retention(retention)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| map_err(&format!("extending the retention of {key}"), e))
    }

    /// Deletes one version of object `name` for good (Object Lock refuses it while the
    /// version is retained: [`RemoteError::Denied`]).
    pub async fn delete_version(&self, name: &str, version_id: &str) -> Result<()> {
        let key = self.key(name);
        self.client
            .delete_object()
            .bucket(&self.url.bucket)
            .key(&key)
            .version_id(version_id)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| map_err(&format!("deleting version {version_id} of {key}"), e))
    }

    /// Deletes object `name`; deleting one that is not there succeeds.
    pub async fn delete(&self, name: &str) -> Result<()> {
        let key = self.key(name);
        match self
            .client
            .delete_object()
            .bucket(&self.url.bucket)
            .key(&key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match map_err(&format!("deleting {key}"), e) {
                RemoteError::NotFound { .. } => Ok(()),
                other => Err(other),
            },
        }
    }
}

/// The base64 CRC32C of `b`, as S3's `x-amz-checksum-crc32c` carries it.
fn crc32c_of(b: &[u8]) -> String {
    aws_smithy_types::base64::encode(crc32c::crc32c(b).to_be_bytes())
}

fn lock_mode(l: ObjectLock) -> ObjectLockMode {
    if l.compliance {
        ObjectLockMode::Compliance
    } else {
        ObjectLockMode::Governance
    }
}

fn retention_mode(l: ObjectLock) -> ObjectLockRetentionMode {
    if l.compliance {
        ObjectLockRetentionMode::Compliance
    } else {
        ObjectLockRetentionMode::Governance
    }
}

fn retain_until(l: ObjectLock) -> aws_smithy_types::DateTime {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    aws_smithy_types::DateTime::from_secs(now + l.seconds as i64)
}

fn status_of<E>(e: &SdkError<E, HttpResponse>) -> Option<u16> {
    match e {
        SdkError::ServiceError(se) => Some(se.raw().status().as_u16()),
        _ => None,
    }
}

/// An SDK error in the durable tier's terms: missing, refused, unreachable or other.
fn map_err<E>(what: &str, e: SdkError<E, HttpResponse>) -> RemoteError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let detail = || DisplayErrorContext(&e).to_string();
    match &e {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = se.err().code().unwrap_or("");
            match (status, code) {
                (404, _) | (_, "NoSuchKey") | (_, "NoSuchBucket") => RemoteError::NotFound {
                    object: what.to_string(),
                },
                // A range past the end: the object is shorter than its sealed header says.
                (416, _) | (_, "InvalidRange") => RemoteError::Tampered {
                    object: what.to_string(),
                    detail: "it is shorter than its header says (truncated)".into(),
                },
                (401 | 403, _) => RemoteError::Denied {
                    what: what.to_string(),
                    detail: format!(
                        "{code} {}",
                        se.err().message().unwrap_or("(check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's policy)")
                    ),
                },
                (500..=599, _) => RemoteError::Unreachable {
                    what: what.to_string(),
                    detail: detail(),
                },
                _ => RemoteError::Bucket {
                    what: what.to_string(),
                    detail: detail(),
                },
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            RemoteError::Unreachable {
                what: what.to_string(),
                detail: detail(),
            }
        }
        _ => RemoteError::Bucket {
            what: what.to_string(),
            detail: detail(),
        },
    }
}
