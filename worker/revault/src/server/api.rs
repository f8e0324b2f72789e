//! Route handlers for the probes, the store and its series (backups and
//! restores of versions are in [`super::backup`] and [`super::restore`],
//! objects in [`super::objects`]). Engine calls run on the blocking pool;
//! every failure is an [`ApiError`] (JSON `{code, message}`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use revault_engine::{check_series_name, expire, ErrorKind, ExpireReport, ExpireSel, VersionSel};

use super::auth::{self, Principal};
use super::error::{ApiError, ApiResult};
use super::request::{json_body, path_err, query_err, required_json_body};
use super::wire::{self, ApiCode};
use super::work::{blocking, guarded};
use super::App;
use crate::cli::format_time;

pub(crate) type AppState = State<Arc<App>>;
pub(crate) type SeriesPath = Result<Path<(String, String)>, PathRejection>;
pub(crate) type VersionPath = Result<Path<(String, String, String)>, PathRejection>;

// ---- helpers ---------------------------------------------------------------

fn check_namespace(ns: &str) -> ApiResult<()> {
    if auth::is_namespace(ns) {
        return Ok(());
    }
    Err(ApiError::bad_request(
        ApiCode::Engine(ErrorKind::BadSeriesName),
        format!(
            "invalid namespace {ns:?}: expected a DNS label (lowercase letters, digits and '-')"
        ),
    ))
}

/// Validates `{ns}/{name}` and the caller's access to `ns`.
pub(crate) fn series_name(p: &Principal, path: SeriesPath) -> ApiResult<String> {
    let Path((ns, name)) = path.map_err(path_err)?;
    series_of(p, &ns, &name)
}

pub(crate) fn series_of(p: &Principal, ns: &str, name: &str) -> ApiResult<String> {
    let full = format!("{ns}/{name}");
    check_series_name(&full)?;
    p.check_ns(ns)?;
    Ok(full)
}

pub(crate) fn version_sel(v: &str) -> ApiResult<VersionSel> {
    if v.len() > 10 {
        return Err(ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            format!("version {v:?}: expected a version number (1, 2, ...) or `latest`"),
        ));
    }
    Ok(v.parse::<VersionSel>()?)
}

pub(crate) fn parse_rfc3339(what: &str, s: &str) -> ApiResult<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|_| {
            ApiError::bad_request(
                ApiCode::Engine(ErrorKind::InvalidArgument),
                format!("{what} {s:?}: expected an RFC 3339 time, e.g. 2026-01-31T02:00:00Z"),
            )
        })
}

/// Keep-within limit: about 300 years.
const MAX_KEEP_WITHIN: u64 = 10_000_000_000;

// ---- health, readiness, metrics ---------------------------------------------

/// Alive unless only a restart can help (a store that could not be
/// reopened, see `health`): a full disk alone keeps it alive, not ready.
pub async fn healthz(State(app): AppState) -> Response {
    if let Some(why) = app.health.wedged() {
        return ApiError::unavailable(why).into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "ok\n",
    )
        .into_response()
}

/// Ready: the store is open and takes new work. `?exclude=writes` leaves out whether it takes
/// work that writes (the Kubernetes API server's `/readyz?exclude=CHECK` style): a worker pod's
/// readiness probe asks that, so a store degraded by a full disk stays in its Service and
/// serves the restores of versions only it holds. Clients that write ask plain `/readyz`.
pub async fn readyz(
    State(app): AppState,
    q: Result<Query<wire::ReadyQuery>, QueryRejection>,
) -> Response {
    let writes = match q {
        Ok(Query(q)) => q.exclude != Some(wire::ReadyCheck::Writes),
        Err(e) => return query_err(e).into_response(),
    };
    let refusal = if app.draining.load(Ordering::SeqCst) {
        Some(ApiError::shutting_down("the server is shutting down"))
    } else if let Some(why) = app.health.refusal().filter(|_| writes) {
        Some(ApiError::unavailable(super::health::degraded_message(&why)))
    } else if app.open_store().is_none() {
        Some(ApiError::starting())
    } else if !app.ready.load(Ordering::SeqCst) {
        // The store is open but readiness was withdrawn: the server is on its way down
        // (`--shutdown-delay`), not starting.
        Some(ApiError::shutting_down("the server is shutting down"))
    } else {
        None
    };
    match refusal {
        Some(e) => e.into_response(),
        None => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "ready\n",
        )
            .into_response(),
    }
}

/// Store-wide figures for anyone; per-series gauges for a token, for the
/// namespaces it may see (without --token-file: everyone sees all).
pub async fn metrics(State(app): AppState, p: Option<Principal>) -> Response {
    if let Some(store) = app.open_store() {
        let a = app.clone();
        let _ = tokio::task::spawn_blocking(move || a.refresh_totals(&store)).await;
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(p.as_ref().map(|p| &p.scope)),
    )
        .into_response()
}

// ---- store-wide ----------------------------------------------------------------

pub async fn stats(State(app): AppState, p: Principal) -> ApiResult<Response> {
    p.check_all("store totals")?;
    let store = app.store_to_read()?;
    // The process's setting: a read-only store served while the metadata disk is full has
    // none of its own.
    let domain = super::dedup_domain();
    let (t, disk) = blocking(move || Ok((store.totals()?, disk_space(&store)))).await?;
    let mut stats = wire::Stats::from(t);
    stats.remote = app.durable.stats();
    stats.disk = disk;
    stats.dedup_domain = domain.to_string();
    stats.degraded = app.health.refusal();
    Ok(Json(stats).into_response())
}

/// Size and free room of the filesystems of the store's containers and metadata.
fn disk_space(store: &revault_engine::Store) -> Option<wire::DiskSpace> {
    let room = |dir: &std::path::Path| {
        let s = rustix::fs::statvfs(dir).ok()?;
        // At most i64::MAX: clients read these as signed 64-bit integers (the API's int64).
        let bytes = |blocks: u64| blocks.saturating_mul(s.f_frsize).min(i64::MAX as u64);
        Some((bytes(s.f_blocks), bytes(s.f_bavail)))
    };
    let (data_total_bytes, data_free_bytes) = room(store.data_dir())?;
    let (meta_total_bytes, meta_free_bytes) = room(store.root())?;
    Some(wire::DiskSpace {
        data_total_bytes,
        data_free_bytes,
        meta_total_bytes,
        meta_free_bytes,
    })
}

pub async fn gc(
    State(app): AppState,
    p: Principal,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    p.check_all("gc")?;
    let req: wire::GcRequest = json_body(&headers, body).await?.unwrap_or_default();
    let compact_below = req.compact_below.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&compact_below) {
        return Err(ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            "compactBelow is a fraction between 0 and 1",
        ));
    }
    let rep = guarded(&app, move |a, store| {
        let opts = revault_engine::GcOptions {
            compact_below,
            full: req.full,
        };
        let rep = revault_engine::gc(store, &opts)?;
        a.metrics.maintenance("gc", rep.seconds);
        Ok(rep)
    })
    .await?;
    Ok(Json(wire::GcReport::from(rep)).into_response())
}

// ---- series ---------------------------------------------------------------------

pub async fn list_series(
    State(app): AppState,
    p: Principal,
    q: Result<Query<wire::SeriesListQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let Query(q) = q.map_err(query_err)?;
    if let Some(ns) = &q.namespace {
        check_namespace(ns)?;
        p.check_ns(ns)?;
    }
    let store = app.store_to_read()?;
    let rows = blocking(move || {
        let mut rows = Vec::new();
        for s in store.list_series()? {
            let ns = s.name.split_once('/').map(|x| x.0).unwrap_or("");
            if !p.scope.allows(ns) || q.namespace.as_deref().is_some_and(|want| want != ns) {
                continue;
            }
            let vs = store.versions(&s)?;
            rows.push(wire::Series::new(
                &s,
                &vs,
                app.durable.durable_version(&s.name),
            ));
        }
        Ok(rows)
    })
    .await?;
    Ok(Json(rows).into_response())
}

pub async fn get_series(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let store = app.store_to_read()?;
    let detail = blocking(move || {
        let s = store.series(&name)?;
        let vs = store.versions(&s)?;
        Ok(wire::SeriesDetail::new(
            &s,
            &vs,
            app.durable.durable_version(&s.name),
        ))
    })
    .await?;
    Ok(Json(detail).into_response())
}

pub async fn list_versions(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let store = app.store_to_read()?;
    let vs = blocking(move || {
        let s = store.series(&name)?;
        Ok(store
            .versions(&s)?
            .iter()
            .map(wire::Version::from)
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(Json(vs).into_response())
}

/// Runs an expiry (or several) on the blocking pool, recording metrics.
async fn run_expire(app: &Arc<App>, name: String, sels: Vec<ExpireSel>) -> ApiResult<ExpireReport> {
    guarded(app, move |a, store| {
        let mut total = ExpireReport {
            series: name.clone(),
            ..Default::default()
        };
        let r = (|| -> ApiResult<()> {
            for sel in &sels {
                let rep = expire(store, &name, sel)?;
                a.metrics.maintenance("expire", rep.seconds);
                total.expired.extend(rep.expired);
                total.spliced.extend(rep.spliced);
                total.units_freed += rep.units_freed;
                total.containers_freed += rep.containers_freed;
                total.bytes_freed += rep.bytes_freed;
                total.logical_bytes_expired += rep.logical_bytes_expired;
                total.seconds += rep.seconds;
            }
            Ok(())
        })();
        a.refresh_series(store, &name);
        r.map(|_| total)
    })
    .await
}

pub async fn delete_series(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let store = app.store()?;
    // A backup of it waiting for a slot (whose client may have sent its
    // whole body and gone) must not bring the series back afterwards.
    super::slots::withdraw_queued(&app, &name, super::slots::Withdrawn::SeriesDeleted);
    let n = name.clone();
    let newest = blocking(move || {
        let s = store.series(&n)?;
        Ok(store.versions(&s)?.last().map(|v| v.number))
    })
    .await?;
    // Everything but the newest, then the newest.
    let sels = match newest {
        Some(v) => vec![ExpireSel::Before(i64::MAX), ExpireSel::Version(v)],
        None => Vec::new(),
    };
    let rep = run_expire(&app, name.clone(), sels).await?;
    // A bucket deleted as a series loses its keys too (counted in flight, so
    // a shutdown that begins now waits for it).
    guarded(&app, move |a, store| {
        if revault_objects::is_bucket(store.meta(), &name)? {
            a.objects.forget_bucket(store, &name)?;
        }
        Ok(())
    })
    .await?;
    Ok(Json(wire::ExpireReport::from(rep)).into_response())
}

/// The backup of a series in progress on this worker, if any: how far it
/// got, or that it waits for a slot.
pub async fn get_backup_progress(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let cur = app.backups.lock().unwrap().get(&name).cloned();
    Ok(Json(match cur {
        Some(b) => wire::BackupProgress {
            series: name,
            running: true,
            queued: b.queued.load(Ordering::SeqCst),
            logical_bytes: Some(b.logical_bytes.load(Ordering::Relaxed)),
            started_at: Some(format_time(b.started_unix)),
        },
        None => wire::BackupProgress {
            series: name,
            running: false,
            queued: false,
            logical_bytes: None,
            started_at: None,
        },
    })
    .into_response())
}

pub async fn put_retention(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let r: wire::Retention = required_json_body(
        &headers,
        body,
        "a JSON retention, e.g. {\"keep\": 7, \"live\": 1, \"auto\": true}",
    )
    .await?;
    if r.keep_within_seconds.is_some_and(|s| s > MAX_KEEP_WITHIN) {
        return Err(ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            format!("keepWithinSeconds is at most {MAX_KEEP_WITHIN}"),
        ));
    }
    let (s, created) = guarded(&app, move |_, store| {
        let auto = revault_engine::auto_or_current(store, &name, r.auto)?;
        Ok(revault_engine::set_retention(
            store,
            &name,
            r.to_engine(auto),
        )?)
    })
    .await?;
    // 201 when the retention created the series (a policy set before the first backup).
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(wire::Retention::from(&s.retention))).into_response())
}

/// `PUT …/moved-to`: seals the series once it was moved to another worker (or unseals it with
/// `null`). Refused with 409 `series_busy` while a backup of it runs; afterwards every backup is
/// refused with 409 `series_moved`, naming the address.
pub async fn put_moved_to(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let m: wire::MovedTo = required_json_body(
        &headers,
        body,
        "{\"movedTo\": \"https://…\"} or {\"movedTo\": null}",
    )
    .await?;
    let row = guarded(&app, move |a, store| {
        let s = revault_engine::set_moved_to(store, &name, m.moved_to)?;
        let vs = store.versions(&s)?;
        Ok(wire::Series::new(
            &s,
            &vs,
            a.durable.durable_version(&s.name),
        ))
    })
    .await?;
    Ok(Json(row).into_response())
}

pub async fn slide(State(app): AppState, p: Principal, path: SeriesPath) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let rep = guarded(&app, move |a, store| {
        let rep = revault_engine::slide(store, &name)?;
        a.metrics.maintenance("slide", rep.seconds);
        Ok(rep)
    })
    .await?;
    Ok(Json(wire::SlideReport::from(rep)).into_response())
}

pub async fn post_expire(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let req: Option<wire::ExpireRequest> = json_body(&headers, body).await?;
    let bad = || {
        ApiError::bad_request(
            ApiCode::Engine(ErrorKind::InvalidArgument),
            "give exactly one of {\"version\": N}, {\"before\": \"RFC 3339 time\"} or {\"applyRetention\": true}",
        )
    };
    let sel = match req {
        Some(wire::ExpireRequest {
            version: Some(v),
            before: None,
            apply_retention: None,
        }) if v > 0 => ExpireSel::Version(v),
        Some(wire::ExpireRequest {
            version: None,
            before: Some(t),
            apply_retention: None,
        }) => ExpireSel::Before(parse_rfc3339("before", &t)?),
        Some(wire::ExpireRequest {
            version: None,
            before: None,
            apply_retention: Some(true),
        }) => ExpireSel::Retention,
        _ => return Err(bad()),
    };
    let rep = run_expire(&app, name, vec![sel]).await?;
    Ok(Json(wire::ExpireReport::from(rep)).into_response())
}

pub async fn delete_version(
    State(app): AppState,
    p: Principal,
    path: VersionPath,
) -> ApiResult<Response> {
    let Path((ns, n, v)) = path.map_err(path_err)?;
    let name = series_of(&p, &ns, &n)?;
    let sel = version_sel(&v)?;
    let store = app.store()?;
    let n2 = name.clone();
    let number = blocking(move || {
        let s = store.series(&n2)?;
        Ok(store.resolve_version(&s, &sel)?.number)
    })
    .await?;
    let rep = run_expire(&app, name, vec![ExpireSel::Version(number)]).await?;
    Ok(Json(wire::ExpireReport::from(rep)).into_response())
}

// ---- fallbacks -----------------------------------------------------------------------

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(ApiCode::NotFound, format!("no route for {}", uri.path()))
}

pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ApiCode::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}
