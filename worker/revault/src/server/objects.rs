//! The object API (`/v1/buckets/...`): keys in a bucket, stored through the
//! [`revault_objects`] crate (deduplicated like every backup), and
//! short-lived signed URLs for reading one object without a token. This is
//! what Velero's ObjectStore plugin talks to.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use revault_engine::{check_series_name, ErrorKind, RestoreOptions};
use revault_objects::{self as objects, Encoding, ObjectError, ObjectInfo, PutOptions};

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::request::{path_err, query_err, required_json_body};
use super::wire::{self, ApiCode};
use super::work::{blocking, guarded, restore_body, retry_while_busy, run_upload};
use super::App;
use crate::cli::format_time;

type AppState = State<Arc<App>>;
type BucketPath = Result<Path<(String, String)>, PathRejection>;

/// Signed URLs live at most this long.
pub const MAX_URL_TTL: u64 = 12 * 3600;
const DEFAULT_URL_TTL: u64 = 600;
/// Listing pages hold at most this many entries.
const MAX_LIST: usize = 10_000;
const DEFAULT_LIST: usize = 1000;

/// `NS/BUCKET` for a request, after checking names and the caller's scope.
fn bucket_of(p: &Principal, path: BucketPath) -> ApiResult<String> {
    let (ns, bucket) = bucket_parts(path)?;
    p.check_ns(&ns)?;
    Ok(format!("{ns}/{bucket}"))
}

/// The namespace and bucket of a request path (a bucket is named like a series).
fn bucket_parts(path: BucketPath) -> ApiResult<(String, String)> {
    let Path((ns, bucket)) = path.map_err(path_err)?;
    check_series_name(&format!("{ns}/{bucket}")).map_err(|_| {
        ApiError::bad_request(
            ApiCode::BadBucketName,
            format!("invalid bucket {ns}/{bucket}: the namespace is a DNS label, the bucket lowercase letters, digits, '-' and '.'"),
        )
    })?;
    Ok((ns, bucket))
}

// ---- bucket -------------------------------------------------------------------

pub async fn get_bucket(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
) -> ApiResult<Response> {
    let bucket = bucket_of(&p, path)?;
    let store = app.store_to_read()?;
    let s = blocking(move || Ok(objects::summary(&store, &bucket)?)).await?;
    Ok(Json(wire::Bucket::from(s)).into_response())
}

pub async fn list_objects(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
    q: Result<Query<wire::ObjectListQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let bucket = bucket_of(&p, path)?;
    let Query(q) = q.map_err(query_err)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIST);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            format!("limit must be between 1 and {MAX_LIST}"),
        ));
    }
    for (what, v) in [
        ("prefix", Some(&q.prefix)),
        ("delimiter", q.delimiter.as_ref()),
        ("startAfter", q.start_after.as_ref()),
    ] {
        if v.is_some_and(|v| v.len() > objects::MAX_KEY_BYTES) {
            return Err(ApiError::bad_request(
                ApiCode::Engine(ErrorKind::InvalidArgument),
                format!("{what} is at most {} bytes", objects::MAX_KEY_BYTES),
            ));
        }
    }
    let store = app.store_to_read()?;
    let l = blocking(move || {
        Ok(objects::list(
            &store,
            &bucket,
            &q.prefix,
            q.delimiter.as_deref(),
            q.start_after.as_deref(),
            limit,
        )?)
    })
    .await?;
    Ok(Json(wire::ObjectList::from(l)).into_response())
}

// ---- one object ---------------------------------------------------------------

pub async fn put_object(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
    q: Result<Query<wire::PutObjectQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let bucket = bucket_of(&p, path)?;
    let Query(q) = q.map_err(query_err)?;
    objects::check_key(&q.key)?;
    super::backup::refuse_over_quota(&app, &bucket).await?;
    let encoding = match q.encoding.as_deref() {
        None => Encoding::Identity,
        Some(e) => e
            .parse::<Encoding>()
            .map_err(|m| ApiError::bad_request(ApiCode::Engine(ErrorKind::InvalidArgument), m))?,
    };
    let store = app.store()?;
    let key = q.key;
    let lost = "the object was not stored";
    let rep = run_upload(&app, &headers, body, "upload", lost, move |a, reader, cancel| {
        let opts = PutOptions {
            encoding,
            cancel: Some(cancel),
            ..Default::default()
        };
        let r = retry_while_busy(
            a,
            &reader,
            |e| {
                matches!(
                    e,
                    ObjectError::Engine(revault_engine::Error::SeriesBusy { .. })
                )
            },
            || {
                a.objects
                    .put(&store, &bucket, &key, Box::new(reader.clone()), &opts)
            },
        );
        drop(reader);
        match &r {
            Ok(rep) => {
                a.metrics
                    .backup_logical_bytes
                    .inc_by(rep.backup.logical_bytes);
                a.metrics.backup_new_bytes.inc_by(rep.backup.new_vbytes);
                a.refresh_series(&store, &bucket);
                tracing::info!(bucket = %bucket, key = %key, version = rep.object.record.version, bytes = rep.object.record.size, new = rep.backup.new_vbytes, "object stored");
            }
            Err(e) => tracing::info!(bucket = %bucket, key = %key, error = %e, "object not stored"),
        }
        r
    })
    .await?;
    let stored = wire::StoredObject {
        object: wire::Object::from(&rep.object),
        new_bytes: rep.backup.new_vbytes,
        stored_bytes: rep.backup.new_container_bytes,
    };
    Ok((StatusCode::CREATED, Json(stored)).into_response())
}

async fn lookup(app: &Arc<App>, bucket: String, key: String) -> ApiResult<ObjectInfo> {
    let store = app.store_to_read()?;
    blocking(move || Ok(objects::head(&store, &bucket, &key)?)).await
}

pub async fn object_meta(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
    q: Result<Query<wire::KeyQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let bucket = bucket_of(&p, path)?;
    let Query(q) = q.map_err(query_err)?;
    objects::check_key(&q.key)?;
    let info = lookup(&app, bucket, q.key).await?;
    Ok(Json(wire::Object::from(&info)).into_response())
}

pub async fn get_object(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
    q: Result<Query<wire::GetObjectQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let bucket = bucket_of(&p, path)?;
    let Query(q) = q.map_err(query_err)?;
    objects::check_key(&q.key)?;
    let info = lookup(&app, bucket, q.key).await?;
    serve(&app, info, q.decoded.unwrap_or(false))
}

/// Streams an object's body (restored on the blocking pool).
fn serve(app: &Arc<App>, info: ObjectInfo, decoded: bool) -> ApiResult<Response> {
    let store = app.store_to_read()?;
    let gzip = info.record.encoding == Encoding::Gzip && !decoded;
    let mut resp = Response::new(Body::empty());
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if gzip {
            "application/gzip"
        } else {
            "application/octet-stream"
        }),
    );
    if !gzip {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(info.record.size));
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", info.record.etag)) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        "x-revault-encoding",
        HeaderValue::from_static(if gzip { "gzip" } else { "identity" }),
    );
    h.insert("x-revault-size", HeaderValue::from(info.record.size));
    h.insert("x-revault-version", HeaderValue::from(info.record.version));
    let (bucket, key) = (info.bucket.clone(), info.key.clone());
    *resp.body_mut() = restore_body(
        app,
        RestoreOptions::default(),
        "sending the object",
        move |opts, w| objects::read(&store, &info, decoded, opts, w),
        move |_, r| {
            if let Err(e) = r {
                tracing::info!(bucket = %bucket, key = %key, error = %e, "object read failed");
            }
        },
    );
    Ok(resp)
}

pub async fn delete_object(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
    q: Result<Query<wire::KeyQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let bucket = bucket_of(&p, path)?;
    let Query(q) = q.map_err(query_err)?;
    objects::check_key(&q.key)?;
    let rep = guarded(&app, move |a, store| {
        let r = a.objects.delete(store, &bucket, &q.key);
        if r.is_ok() {
            a.refresh_series(store, &bucket);
        }
        Ok(r?)
    })
    .await?;
    Ok(Json(wire::ObjectDeleted {
        key: rep.key,
        version: rep.version,
        bytes_freed: rep.expired.bytes_freed,
    })
    .into_response())
}

// ---- signed URLs ------------------------------------------------------------------

fn signed_message(ns: &str, bucket: &str, key: &str, expires: i64) -> Vec<u8> {
    format!("revault signed GET v1\n{ns}\n{bucket}\n{key}\n{expires}").into_bytes()
}

/// Percent-encodes a query value (RFC 3986 unreserved characters stay).
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub async fn sign_url(
    State(app): AppState,
    p: Principal,
    path: BucketPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let (ns, bucket) = bucket_parts(path)?;
    p.check_ns(&ns)?;
    let req: wire::SignRequest =
        required_json_body(&headers, body, "{\"key\": \"...\", \"ttlSeconds\": 600}").await?;
    objects::check_key(&req.key)?;
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_URL_TTL);
    if !(1..=MAX_URL_TTL).contains(&ttl) {
        return Err(ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            format!("ttlSeconds must be between 1 and {MAX_URL_TTL}"),
        ));
    }
    // The object must exist now (it may still go before the URL is used).
    lookup(&app, format!("{ns}/{bucket}"), req.key.clone()).await?;
    let expires = revault_engine::now_unix() + ttl as i64;
    let (id, sig) = app
        .auth
        .sign(&p, &signed_message(&ns, &bucket, &req.key, expires))?;
    let url = format!(
        "/v1/signed/{ns}/{bucket}?key={}&expires={expires}&id={id}&sig={sig}",
        pct(&req.key)
    );
    Ok(Json(wire::SignedUrl {
        url,
        expires_at: format_time(expires),
    })
    .into_response())
}

/// `GET /v1/signed/{ns}/{bucket}?key&expires&id&sig`: no token; the signature
/// is the credential. Serves the object as uploaded.
pub async fn get_signed(
    State(app): AppState,
    path: BucketPath,
    q: Result<Query<wire::SignedQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let (ns, bucket) = bucket_parts(path)?;
    let Query(q) = q.map_err(query_err)?;
    objects::check_key(&q.key)?;
    let valid_form = q.id.len() == 16
        && q.sig.len() == 64
        && q.id
            .bytes()
            .chain(q.sig.bytes())
            .all(|b| b.is_ascii_hexdigit());
    if !valid_form {
        return Err(ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            "id and sig must be the hex values of a signed URL",
        ));
    }
    let msg = signed_message(&ns, &bucket, &q.key, q.expires);
    let Some(scope) = app.auth.verify(&q.id, &msg, &q.sig) else {
        return Err(ApiError::forbidden(
            "invalid signature (the URL was altered, or the token that signed it was revoked)",
        ));
    };
    if q.expires < revault_engine::now_unix() {
        return Err(ApiError::forbidden(format!(
            "the signed URL expired at {}",
            format_time(q.expires)
        )));
    }
    if !scope.allows(&ns) {
        return Err(ApiError::forbidden(format!(
            "the token that signed this URL may no longer access namespace {ns}"
        )));
    }
    let info = lookup(&app, format!("{ns}/{bucket}"), q.key).await?;
    serve(&app, info, false)
}
