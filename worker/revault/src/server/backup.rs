//! Backups in: `PUT /v1/series/{ns}/{name}/versions` streams the request
//! body into the series' next version (one backup per series at a time
//! through this server).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use revault_engine::{
    backup, tar::TarSource, BackupOptions, BackupReport, DedupUnit, ErrorKind, Source, Store,
    StreamSource,
};

use super::api::{parse_rfc3339, series_name, AppState, SeriesPath};
use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::request::query_err;
use super::slots::Withdrawn;
use super::stream::BodyReader;
use super::wire::{self, ApiCode};
use super::work::{blocking, retry_while_busy, run_upload};
use super::{App, InflightBackup};

#[derive(Clone, Copy)]
enum Upload {
    Stream,
    Tar,
}

/// A backup request, parsed and checked: nothing is claimed yet.
struct BackupRequest {
    name: String,
    upload: Upload,
    unit: Option<DedupUnit>,
    time_unix: Option<i64>,
    version: Option<u32>,
}

/// The server's one-backup-per-series claim (an entry of `App::backups`),
/// released when dropped.
struct WriterClaim {
    app: Arc<App>,
    name: String,
    progress: Arc<InflightBackup>,
}

impl WriterClaim {
    /// Claims `name` for a backup through this server: 409 if one runs; one
    /// still queued for a slot (its client may be gone) is taken over.
    fn take(app: &Arc<App>, name: &str) -> ApiResult<WriterClaim> {
        let mut backups = app.backups.lock().unwrap();
        if let Some(cur) = backups.get(name) {
            if !cur.queued.load(Ordering::SeqCst) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    ApiCode::Engine(ErrorKind::SeriesBusy),
                    format!("series {name} already has a backup in progress"),
                ));
            }
            let _ = cur.withdrawn.set(Withdrawn::TakenOver);
        }
        let progress = Arc::new(InflightBackup {
            started_unix: revault_engine::now_unix(),
            logical_bytes: std::sync::atomic::AtomicU64::new(0),
            queued: AtomicBool::new(false),
            withdrawn: Default::default(),
        });
        backups.insert(name.to_string(), progress.clone());
        Ok(WriterClaim {
            app: app.clone(),
            name: name.to_string(),
            progress,
        })
    }
}

impl Drop for WriterClaim {
    fn drop(&mut self) {
        let mut backups = self.app.backups.lock().unwrap();
        // A claim taken over by a newer backup is no longer this one's.
        if backups
            .get(&self.name)
            .is_some_and(|cur| Arc::ptr_eq(cur, &self.progress))
        {
            backups.remove(&self.name);
        }
    }
}

/// `PUT …/versions`: the body becomes the series' next version. In steps:
/// parse, admit (not a bucket) and claim the series, wait for a backup slot,
/// run the backup from the body, record what it did.
pub async fn put_version(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
    q: Result<Query<wire::PutVersionQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let req = parse_backup(&p, path, q, &headers)?;
    refuse_buckets(&app.store()?, &req.name).await?;
    refuse_over_quota(&app, &req.name).await?;
    let claim = WriterClaim::take(&app, &req.name)?;
    let slot = app
        .backup_slots
        .wait(&app, &req.name, &claim.progress)
        .await?;
    // Asked again: backups that held the slots meanwhile may have filled the quota.
    refuse_over_quota(&app, &req.name).await?;
    // Asked again after the wait: the store may have been reopened, or
    // refused writes (a full disk), meanwhile.
    let store = app.store()?;
    app.metrics.inflight_backups.inc();
    let lost = "no version was created";
    let rep = run_upload(
        &app,
        &headers,
        body,
        "backup",
        lost,
        move |a, reader, cancel| {
            let r = run_backup(a, &store, &req, &claim, reader, cancel);
            a.metrics.inflight_backups.dec();
            record_backup(a, &store, &req.name, &r);
            drop(claim);
            drop(slot);
            r
        },
    )
    .await?;
    Ok((StatusCode::CREATED, Json(wire::BackupReport::from(rep))).into_response())
}

/// The series, how its body is sent (Content-Type), and the query's options.
fn parse_backup(
    p: &Principal,
    path: SeriesPath,
    q: Result<Query<wire::PutVersionQuery>, QueryRejection>,
    headers: &HeaderMap,
) -> ApiResult<BackupRequest> {
    let name = series_name(p, path)?;
    let Query(q) = q.map_err(query_err)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?").to_string())
        .unwrap_or_default();
    let upload = match ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase().as_str() {
        "application/octet-stream" => Upload::Stream,
        "application/x-tar" => Upload::Tar,
        _ => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ApiCode::UnsupportedMediaType,
                format!("Content-Type {ct:?}: send application/octet-stream (a byte stream) or application/x-tar (a directory tree)"),
            ))
        }
    };
    let unit = q.unit.as_deref().map(str::parse::<DedupUnit>).transpose()?;
    let time_unix = q
        .time
        .as_deref()
        .map(|t| parse_rfc3339("time", t))
        .transpose()?;
    Ok(BackupRequest {
        name,
        upload,
        unit,
        time_unix,
        version: q.version,
    })
}

/// A bucket's series takes objects, not backups (409).
async fn refuse_buckets(store: &Arc<Store>, name: &str) -> ApiResult<()> {
    let (st, n) = (store.clone(), name.to_string());
    if blocking(move || Ok(revault_objects::is_bucket(st.meta(), &n)?)).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ApiCode::BucketSeries,
            format!(
                "series {name} is an object bucket: objects go through /v1/buckets/{name}/object"
            ),
        ));
    }
    Ok(())
}

/// A namespace that stores its quota already takes no new backup or object (403
/// quota_exceeded); `name` is the series or bucket (`NS/NAME`).
pub(super) async fn refuse_over_quota(app: &App, name: &str) -> ApiResult<()> {
    let ns = name.split_once('/').map_or(name, |(ns, _)| ns).to_string();
    let Some(limit) = app.quotas.limit(&ns) else {
        return Ok(());
    };
    let store = app.store()?;
    let n = ns.clone();
    let used = blocking(move || Ok(super::quota::usage(&store, &n)?)).await?;
    if used < limit {
        return Ok(());
    }
    tracing::info!(namespace = %ns, used, limit, series = %name, "backup refused: namespace over its quota");
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        ApiCode::QuotaExceeded,
        format!(
            "namespace {ns} holds {used} logical bytes of versions, its quota is {limit}: nothing new is stored in {name} until versions expire or the quota is raised"
        ),
    ))
}

/// Backs the body up (on the blocking pool), waiting while a slide or
/// expiry holds the series; `claim` shows how far it got.
fn run_backup(
    a: &App,
    store: &Store,
    req: &BackupRequest,
    claim: &WriterClaim,
    reader: BodyReader,
    cancel: Arc<AtomicBool>,
) -> revault_engine::Result<BackupReport> {
    let progress = claim.progress.clone();
    let opts = BackupOptions {
        unit: req.unit,
        time_unix: req.time_unix,
        version: req.version,
        cancel: Some(cancel),
        progress: Some(Arc::new(move |n| {
            progress.logical_bytes.store(n, Ordering::Relaxed)
        })),
        ..Default::default()
    };
    let name = &req.name;
    retry_while_busy(
        a,
        &reader,
        |e| matches!(e, revault_engine::Error::SeriesBusy { .. }),
        || {
            let what = format!("the upload of {name}");
            let src: Box<dyn Source> = match req.upload {
                Upload::Stream => Box::new(StreamSource::new(what, reader.clone())),
                Upload::Tar => Box::new(TarSource::new(what, reader.clone())),
            };
            backup(store, name, src, &opts)
        },
    )
}

/// Metrics, gauges and the log line of a backup that ended.
fn record_backup(a: &App, store: &Store, name: &str, r: &revault_engine::Result<BackupReport>) {
    match r {
        Ok(rep) => {
            a.metrics.backup_logical_bytes.inc_by(rep.logical_bytes);
            a.metrics.backup_new_bytes.inc_by(rep.new_vbytes);
            if let Some(s) = &rep.slide {
                a.metrics.maintenance("slide", s.seconds);
            }
            if let Some(e) = &rep.expire {
                a.metrics.maintenance("expire", e.seconds);
            }
            if rep.retention_error.is_some() {
                a.health.kick(); // a full disk, say: let the watcher look
            }
            a.refresh_series(store, name);
            tracing::info!(series = %name, version = rep.version, bytes = rep.logical_bytes, new = rep.new_vbytes, secs = rep.seconds, "backup committed");
        }
        Err(e) => tracing::info!(series = %name, error = %e, "backup failed; no version created"),
    }
    super::metrics::Metrics::result(&a.metrics.backups, r.is_ok());
}
