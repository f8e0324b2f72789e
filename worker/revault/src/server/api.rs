//! Route handlers. Engine calls run on the blocking pool; every failure is an
//! [`ApiError`] (JSON `{code, message}`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use revault_engine::backup::{backup, BackupOptions};
use revault_engine::caches::CachePolicy;
use revault_engine::config::{DedupUnit, MIB};
use revault_engine::expire::{expire, ExpireReport, ExpireSel};
use revault_engine::format::records::{Retention, SeriesRecord, VersionKind, VersionRecord};
use revault_engine::restore::{restore, RestoreOptions, RestoreReport, RestoreTarget};
use revault_engine::source::{Source, StreamSource};
use revault_engine::store::{check_series_name, Store, VersionSel};
use revault_engine::tarsource::TarSource;
use revault_engine::transfer;

use super::auth::{self, Principal};
use super::error::{ApiError, ApiResult};
use super::stream::{BodyPump, BodyReader, ChannelWriter};
use super::{App, InflightBackup, RestoreEntry};
use crate::cli::format_time;

type AppState = State<Arc<App>>;
type SeriesPath = Result<Path<(String, String)>, PathRejection>;
type VersionPath = Result<Path<(String, String, String)>, PathRejection>;

/// Largest JSON request body accepted.
const JSON_LIMIT: usize = 64 << 10;
/// How long an upload waits for a slide or expiry of its series to finish.
const BUSY_WAIT: Duration = Duration::from_secs(120);

// ---- helpers ---------------------------------------------------------------

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a worker task failed: {e}")))?
}

pub(crate) fn path_err(e: PathRejection) -> ApiError {
    ApiError::bad_request("bad_path", format!("bad path: {}", e.body_text()))
}

pub(crate) fn query_err(e: QueryRejection) -> ApiError {
    ApiError::bad_request("bad_query", format!("bad query: {}", e.body_text()))
}

fn check_namespace(ns: &str) -> ApiResult<()> {
    if auth::is_namespace(ns) {
        return Ok(());
    }
    Err(ApiError::bad_request(
        "bad_series_name",
        format!(
            "invalid namespace {ns:?}: expected a DNS label (lowercase letters, digits and '-')"
        ),
    ))
}

/// Validates `{ns}/{name}` and the caller's access to `ns`.
fn series_name(p: &Principal, path: SeriesPath) -> ApiResult<String> {
    let Path((ns, name)) = path.map_err(path_err)?;
    series_of(p, &ns, &name)
}

fn series_of(p: &Principal, ns: &str, name: &str) -> ApiResult<String> {
    let full = format!("{ns}/{name}");
    check_series_name(&full)?;
    p.check_ns(ns)?;
    Ok(full)
}

fn version_sel(v: &str) -> ApiResult<VersionSel> {
    if v.len() > 10 {
        return Err(ApiError::bad_request(
            "invalid_argument",
            format!("version {v:?}: expected a version number (1, 2, ...) or `latest`"),
        ));
    }
    Ok(v.parse::<VersionSel>()?)
}

/// Reads a JSON body (bounded); an empty body is `None`.
pub(crate) async fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Option<T>> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::bad_request(
                "bad_content_type",
                format!("expected Content-Type application/json, got {ct:?}"),
            ));
        }
    }
    let bytes = axum::body::to_bytes(body, JSON_LIMIT).await.map_err(|e| {
        if let Some(t) = super::limits::body_timeout(&e) {
            return ApiError::body_timeout(t, "nothing was done");
        }
        ApiError::bad_request(
            "bad_body",
            format!("cannot read the request body (at most {JSON_LIMIT} bytes of JSON): {e}"),
        )
    })?;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ApiError::bad_request("bad_json", format!("invalid JSON body: {e}")))
}

/// The Content-Length a request declared, if any: a body that ends short of
/// it is cut, not complete.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Runs an upload's `attempt` again while a slide or expiry holds its series
/// (`busy`), for at most [`BUSY_WAIT`]: only while nothing of the body has been
/// read (retries share one body reader) and not once the server drains.
pub(crate) fn retry_while_busy<T, E>(
    app: &App,
    reader: &BodyReader,
    busy: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let waited = Instant::now();
    loop {
        match attempt() {
            Err(e)
                if busy(&e)
                    && !reader.started()
                    && waited.elapsed() < BUSY_WAIT
                    && !app.draining.load(Ordering::SeqCst) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// Runs an upload (`what`: "backup", "upload") on the blocking pool, counted
/// as in flight: `run` gets a reader of the request body and the flag that
/// shutdown sets to cancel it.
///
/// A failure is answered once the rest of the body was let in (bounded), so
/// the client reads the error instead of a reset connection; an upload
/// cancelled by shutdown answers 503, and one whose body came too slowly
/// 408, saying what was `lost`.
pub(crate) async fn run_upload<T, E>(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
    what: &str,
    lost: &str,
    run: impl FnOnce(&App, BodyReader, Arc<AtomicBool>) -> Result<T, E> + Send + 'static,
) -> ApiResult<T>
where
    T: Send + 'static,
    E: Into<ApiError> + Send + 'static,
{
    let (pump, reader) = BodyPump::start(
        body,
        content_length(headers),
        app.abort.subscribe(),
        app.metrics.clone(),
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = app.begin(Some(cancel.clone()));
    let a = app.clone();
    let result = tokio::task::spawn_blocking(move || {
        let _g = guard;
        run(&a, reader, cancel)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the {what} task failed: {e}")))?;
    let mut err: ApiError = match result {
        Ok(t) => return Ok(t),
        Err(e) => e.into(),
    };
    let timed_out = pump.timed_out();
    pump.settle().await;
    if let Some(t) = timed_out.filter(|_| err.status.is_client_error()) {
        err = ApiError::body_timeout(&t, lost);
    } else if err.code == "cancelled" && app.draining.load(Ordering::SeqCst) {
        err = ApiError::unavailable(format!(
            "the server shut down before the {what} completed; {lost}"
        ));
    } else if err.code == "cancelled" && app.health.refusal().is_some() {
        err = ApiError::unavailable(format!(
            "the server reopened its store (recovering from a full disk) before the {what} completed; {lost}"
        ));
    }
    Err(err)
}

/// Runs engine work on the blocking pool, counted as in flight (shutdown
/// waits for it): `f` gets the app and the store.
pub(crate) async fn guarded<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&App, &Store) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let store = app.store()?;
    let guard = app.begin(None);
    let a = app.clone();
    blocking(move || {
        let _g = guard;
        f(&a, &store)
    })
    .await
}

/// Streams a restore (`run`, on the blocking pool) into a response body. A
/// failure ends the body with an error, so a client never takes a short body
/// for a whole one; `done` sees the outcome after that (reports, logs).
pub(crate) fn restore_body(
    app: &Arc<App>,
    mut opts: RestoreOptions,
    sending: &'static str,
    run: impl FnOnce(&RestoreOptions, &mut ChannelWriter) -> revault_engine::Result<RestoreReport>
        + Send
        + 'static,
    done: impl FnOnce(&App, revault_engine::Result<RestoreReport>) + Send + 'static,
) -> Body {
    let (mut writer, body) =
        ChannelWriter::new(app.metrics.clone(), opts.cache_bytes, app.abort.subscribe());
    let cancel = Arc::new(AtomicBool::new(false));
    opts.cancel = Some(cancel.clone());
    let guard = app.begin(Some(cancel));
    let a = app.clone();
    tokio::task::spawn_blocking(move || {
        let _g = guard;
        // A panic is an internal error like any other: the body ends in it
        // and `done` still runs (it releases the restore's gauges).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let rep = run(&opts, &mut writer)?;
            writer.complete().map_err(|e| revault_engine::Error::Io {
                context: sending.into(),
                source: e,
            })?;
            Ok(rep)
        }))
        .unwrap_or_else(|p| Err(revault_engine::error::panicked("restore", p)));
        match &r {
            Ok(rep) => {
                a.metrics.container_reads.inc_by(rep.container_reads);
                a.metrics.restore_bytes_read.inc_by(rep.bytes_read);
            }
            Err(e) => {
                a.metrics.error(e.code());
                writer.fail(e.to_string());
            }
        }
        done(&a, r);
    });
    body
}

fn parse_rfc3339(what: &str, s: &str) -> ApiResult<i64> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map(|t| t.unix_timestamp())
        .map_err(|_| {
            ApiError::bad_request(
                "invalid_argument",
                format!("{what} {s:?}: expected an RFC 3339 time, e.g. 2026-01-31T02:00:00Z"),
            )
        })
}

// ---- JSON shapes (see worker/api/openapi.yaml) -----------------------------

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetentionJson {
    #[serde(default)]
    pub keep: Option<u32>,
    #[serde(default)]
    pub keep_within_seconds: Option<u64>,
    #[serde(default = "one")]
    pub live: u32,
    #[serde(default)]
    pub auto: bool,
}

fn one() -> u32 {
    1
}

/// Keep-within limit: about 300 years.
const MAX_KEEP_WITHIN: u64 = 10_000_000_000;

impl From<&Retention> for RetentionJson {
    fn from(r: &Retention) -> Self {
        RetentionJson {
            keep: r.keep,
            keep_within_seconds: r.keep_within_secs,
            live: r.live,
            auto: r.auto,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SeriesJson {
    series: String,
    unit: String,
    versions: usize,
    latest: Option<u32>,
    latest_time: Option<String>,
    logical_bytes: u64,
    retention: RetentionJson,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionJson {
    number: u32,
    time: String,
    kind: String,
    form: String,
    logical_bytes: u64,
    new_bytes: u64,
    stored_bytes: u64,
    chunks: u64,
}

impl From<&VersionRecord> for VersionJson {
    fn from(v: &VersionRecord) -> Self {
        VersionJson {
            number: v.number,
            time: format_time(v.time_unix),
            kind: kind_name(v.kind).to_string(),
            form: format!("{:?}", v.form).to_lowercase(),
            logical_bytes: v.logical_bytes,
            new_bytes: v.new_vbytes,
            stored_bytes: v.new_container_bytes,
            chunks: v.chunks,
        }
    }
}

fn kind_name(k: VersionKind) -> &'static str {
    match k {
        VersionKind::Stream => "stream",
        VersionKind::Tree => "tree",
    }
}

fn series_json(s: &SeriesRecord, vs: &[VersionRecord]) -> SeriesJson {
    SeriesJson {
        series: s.name.clone(),
        unit: s.unit.to_string(),
        versions: vs.len(),
        latest: vs.last().map(|v| v.number),
        latest_time: vs.last().map(|v| format_time(v.time_unix)),
        logical_bytes: vs.iter().map(|v| v.logical_bytes).sum(),
        retention: RetentionJson::from(&s.retention),
    }
}

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

pub async fn readyz(State(app): AppState) -> Response {
    let refusal = if app.draining.load(Ordering::SeqCst) {
        Some("the server is shutting down".to_string())
    } else if let Some(why) = app.health.refusal() {
        Some(super::health::degraded_message(&why))
    } else if !app.ready.load(Ordering::SeqCst) || app.open_store().is_none() {
        Some("the store is still opening".to_string())
    } else {
        None
    };
    match refusal {
        Some(why) => ApiError::unavailable(why).into_response(),
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

#[derive(Serialize)]
struct StatsJson {
    #[serde(flatten)]
    totals: revault_engine::format::records::Totals,
    dedup_ratio: f64,
    total_ratio: f64,
}

pub async fn stats(State(app): AppState, p: Principal) -> ApiResult<Response> {
    p.check_all("store totals")?;
    let store = app.store_to_read()?;
    let t = blocking(move || Ok(store.totals()?)).await?;
    let ratio = |a: u64, b: u64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    Ok(Json(StatsJson {
        totals: t,
        dedup_ratio: ratio(t.logical_bytes, t.unit_vbytes),
        total_ratio: ratio(t.logical_bytes, t.container_bytes),
    })
    .into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GcJson {
    #[serde(default)]
    full: bool,
    #[serde(default)]
    compact_below: Option<f64>,
}

pub async fn gc(
    State(app): AppState,
    p: Principal,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    p.check_all("gc")?;
    let req: GcJson = json_body(&headers, body).await?.unwrap_or_default();
    let compact_below = req.compact_below.unwrap_or(0.5);
    if !(0.0..=1.0).contains(&compact_below) {
        return Err(ApiError::bad_request(
            "invalid_argument",
            "compactBelow is a fraction between 0 and 1",
        ));
    }
    let rep = guarded(&app, move |a, store| {
        let opts = revault_engine::gc::GcOptions {
            compact_below,
            full: req.full,
        };
        let rep = revault_engine::gc::gc(store, &opts)?;
        a.metrics.maintenance("gc", rep.seconds);
        Ok(rep)
    })
    .await?;
    Ok(Json(rep).into_response())
}

// ---- series ---------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    namespace: Option<String>,
}

pub async fn list_series(
    State(app): AppState,
    p: Principal,
    q: Result<Query<ListQuery>, QueryRejection>,
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
            rows.push(series_json(&s, &vs));
        }
        Ok(rows)
    })
    .await?;
    Ok(Json(rows).into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SeriesDetailJson {
    #[serde(flatten)]
    series: SeriesJson,
    version_list: Vec<VersionJson>,
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
        Ok(SeriesDetailJson {
            series: series_json(&s, &vs),
            version_list: vs.iter().map(VersionJson::from).collect(),
        })
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
            .map(VersionJson::from)
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
    Ok(Json(rep).into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InflightJson {
    series: String,
    running: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    logical_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<String>,
}

/// The backup of a series in progress on this worker, if any: how far it got.
pub async fn get_backup_progress(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let cur = app.backups.lock().unwrap().get(&name).cloned();
    Ok(Json(match cur {
        Some(b) => InflightJson {
            series: name,
            running: true,
            logical_bytes: Some(b.logical_bytes.load(Ordering::Relaxed)),
            started_at: Some(format_time(b.started_unix)),
        },
        None => InflightJson {
            series: name,
            running: false,
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
    let Some(r) = json_body::<RetentionJson>(&headers, body).await? else {
        return Err(ApiError::bad_request(
            "bad_json",
            "expected a JSON retention, e.g. {\"keep\": 7, \"live\": 1, \"auto\": true}",
        ));
    };
    if r.keep_within_seconds.is_some_and(|s| s > MAX_KEEP_WITHIN) {
        return Err(ApiError::bad_request(
            "invalid_argument",
            format!("keepWithinSeconds is at most {MAX_KEEP_WITHIN}"),
        ));
    }
    let s = guarded(&app, move |_, store| {
        let ret = Retention {
            keep: r.keep,
            keep_within_secs: r.keep_within_seconds,
            live: r.live,
            auto: r.auto,
        };
        Ok(revault_engine::retention::set_retention(store, &name, ret)?)
    })
    .await?;
    Ok(Json(RetentionJson::from(&s.retention)).into_response())
}

pub async fn slide(State(app): AppState, p: Principal, path: SeriesPath) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let rep = guarded(&app, move |a, store| {
        let rep = revault_engine::slide::slide(store, &name)?;
        a.metrics.maintenance("slide", rep.seconds);
        Ok(rep)
    })
    .await?;
    Ok(Json(rep).into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExpireJson {
    version: Option<u32>,
    before: Option<String>,
    apply_retention: Option<bool>,
}

pub async fn post_expire(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
    let req: Option<ExpireJson> = json_body(&headers, body).await?;
    let bad = || {
        ApiError::bad_request(
            "invalid_argument",
            "give exactly one of {\"version\": N}, {\"before\": \"RFC 3339 time\"} or {\"applyRetention\": true}",
        )
    };
    let sel = match req {
        Some(ExpireJson {
            version: Some(v),
            before: None,
            apply_retention: None,
        }) if v > 0 => ExpireSel::Version(v),
        Some(ExpireJson {
            version: None,
            before: Some(t),
            apply_retention: None,
        }) => ExpireSel::Before(parse_rfc3339("before", &t)?),
        Some(ExpireJson {
            version: None,
            before: None,
            apply_retention: Some(true),
        }) => ExpireSel::Retention,
        _ => return Err(bad()),
    };
    let rep = run_expire(&app, name, vec![sel]).await?;
    Ok(Json(rep).into_response())
}

// ---- backup ------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutQuery {
    unit: Option<String>,
    time: Option<String>,
}

#[derive(Clone, Copy)]
enum Upload {
    Stream,
    Tar,
}

/// The server's one-backup-per-series claim (an entry of `App::backups`),
/// released when dropped.
struct WriterClaim {
    app: Arc<App>,
    name: String,
    progress: Arc<InflightBackup>,
}

impl Drop for WriterClaim {
    fn drop(&mut self) {
        self.app.backups.lock().unwrap().remove(&self.name);
    }
}

pub async fn put_version(
    State(app): AppState,
    p: Principal,
    path: SeriesPath,
    q: Result<Query<PutQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let name = series_name(&p, path)?;
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
                "unsupported_media_type",
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
    let store = app.store()?;
    {
        let (st, n) = (store.clone(), name.clone());
        if blocking(move || Ok(revault_objects::is_bucket(st.meta(), &n)?)).await? {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "bucket_series",
                format!("series {name} is an object bucket: objects go through /v1/buckets/{name}/object"),
            ));
        }
    }
    let claim = {
        let mut backups = app.backups.lock().unwrap();
        if backups.contains_key(&name) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "series_busy",
                format!("series {name} already has a backup in progress"),
            ));
        }
        let progress = Arc::new(InflightBackup {
            started_unix: revault_engine::store::now_unix(),
            logical_bytes: std::sync::atomic::AtomicU64::new(0),
        });
        backups.insert(name.clone(), progress.clone());
        WriterClaim {
            app: app.clone(),
            name: name.clone(),
            progress,
        }
    };
    app.metrics.inflight_backups.inc();
    let lost = "no version was created";
    let rep = run_upload(&app, &headers, body, "backup", lost, move |a, reader, cancel| {
        let progress = claim.progress.clone();
        let _claim = claim;
        let opts = BackupOptions {
            unit,
            time_unix,
            cancel: Some(cancel),
            progress: Some(Arc::new(move |n| {
                progress.logical_bytes.store(n, Ordering::Relaxed)
            })),
            ..Default::default()
        };
        let r = retry_while_busy(
            a,
            &reader,
            |e| matches!(e, revault_engine::Error::SeriesBusy { .. }),
            || {
                let what = format!("the upload of {name}");
                let src: Box<dyn Source> = match upload {
                    Upload::Stream => Box::new(StreamSource::new(what, reader.clone())),
                    Upload::Tar => Box::new(TarSource::new(what, reader.clone())),
                };
                backup(&store, &name, src, &opts)
            },
        );
        drop(reader);
        a.metrics.inflight_backups.dec();
        match &r {
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
                a.refresh_series(&store, &name);
                tracing::info!(series = %name, version = rep.version, bytes = rep.logical_bytes, new = rep.new_vbytes, secs = rep.seconds, "backup committed");
            }
            Err(e) => tracing::info!(series = %name, error = %e, "backup failed; no version created"),
        }
        super::metrics::Metrics::result(&a.metrics.backups, r.is_ok());
        r
    })
    .await?;
    Ok((StatusCode::CREATED, Json(rep)).into_response())
}

// ---- restore --------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetQuery {
    cache: Option<String>,
    cache_mib: Option<u64>,
}

/// Whether the client asked for a block-transfer stream (`Accept`).
fn wants_blocks(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.split(';').next().map(str::trim) == Some(transfer::MEDIA_TYPE))
}

pub async fn get_version(
    State(app): AppState,
    p: Principal,
    path: VersionPath,
    headers: HeaderMap,
    q: Result<Query<GetQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let Path((ns, n, v)) = path.map_err(path_err)?;
    let name = series_of(&p, &ns, &n)?;
    let sel = version_sel(&v)?;
    let Query(q) = q.map_err(query_err)?;
    let cache = q
        .cache
        .as_deref()
        .map(str::parse::<CachePolicy>)
        .transpose()?
        .unwrap_or_default();
    let cache_mib = q.cache_mib.unwrap_or(64);
    if !(1..=16384).contains(&cache_mib) {
        return Err(ApiError::bad_request(
            "invalid_argument",
            "cache_mib must be between 1 and 16384",
        ));
    }
    let cache_mib = cache_mib.min(app.max_cache_mib);
    let store = app.store_to_read()?;
    let (st, n2) = (store.clone(), name.clone());
    let v = blocking(move || {
        let s = st.series(&n2)?;
        Ok(st.resolve_version(&s, &sel)?)
    })
    .await?;

    let id = format!("{:032x}", rand::random::<u128>());
    let (report_tx, report_rx) = tokio::sync::watch::channel(None);
    app.reports.lock().unwrap().insert(
        id.clone(),
        RestoreEntry {
            owner: p.owner.clone(),
            report: report_rx,
        },
    );
    let number = v.number;
    let rid = id.clone();
    let opts = RestoreOptions {
        cache,
        cache_bytes: cache_mib * MIB,
        ..Default::default()
    };
    let n2 = name.clone();
    // Block transfer: stored blocks go out and the client assembles the
    // version (restore memory = its assembly window, policy always faa).
    let blocks = wants_blocks(&headers);
    app.metrics.inflight_restores.inc();
    let body = restore_body(
        &app,
        opts,
        "sending restored data",
        move |opts, w| {
            let sel = VersionSel::Number(number);
            if blocks {
                transfer::send(&store, &n2, sel, opts, w)
            } else {
                restore(&store, &n2, sel, opts, RestoreTarget::Writer(w))
            }
        },
        move |a, r| {
            a.metrics.inflight_restores.dec();
            super::metrics::Metrics::result(&a.metrics.restores, r.is_ok());
            let report = match r {
                Ok(rep) => {
                    if let Some(sf) = rep.speed_factor {
                        a.metrics.speed_factor.observe(sf);
                    }
                    tracing::info!(series = %name, version = number, restore = %rid, bytes = rep.logical_bytes, reads = rep.container_reads, secs = rep.seconds, "restore finished");
                    let mut j = serde_json::to_value(&rep).unwrap_or_default();
                    j["state"] = "done".into();
                    j["id"] = rid.into();
                    j
                }
                Err(e) => {
                    tracing::info!(series = %name, version = number, restore = %rid, error = %e, "restore failed");
                    serde_json::json!({
                        "id": rid, "series": name, "version": number, "state": "failed",
                        "error": { "code": e.code(), "message": e.to_string() },
                    })
                }
            };
            let _ = report_tx.send(Some(report));
        },
    );

    let ct = match v.kind {
        _ if blocks => transfer::MEDIA_TYPE,
        VersionKind::Stream => "application/octet-stream",
        VersionKind::Tree => "application/x-tar",
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert("x-revault-version", HeaderValue::from(number));
    h.insert(
        "x-revault-kind",
        HeaderValue::from_static(kind_name(v.kind)),
    );
    h.insert(
        "x-revault-restore-id",
        HeaderValue::from_str(&id).expect("hex is a valid header"),
    );
    h.insert(header::VARY, HeaderValue::from_static("accept"));
    if v.kind == VersionKind::Stream && !blocks {
        // A known length lets clients tell a complete body from a cut one
        // (a block stream ends with its own end frame).
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(v.logical_bytes));
    }
    Ok(resp)
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
    Ok(Json(rep).into_response())
}

pub async fn get_restore(
    State(app): AppState,
    p: Principal,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let Path(id) = path.map_err(path_err)?;
    if id.is_empty()
        || id.len() > 32
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ApiError::bad_request(
            "invalid_argument",
            format!("restore id {id:?}: expected up to 32 lowercase hex digits"),
        ));
    }
    let not_found = || {
        ApiError::not_found("unknown_restore", format!("no restore {id} (reports are kept for recent restores, for the token that started them)"))
    };
    let Some(mut rx) = app.reports.lock().unwrap().get(&id, &p.owner) else {
        return Err(not_found());
    };
    // The body may have ended a moment before the report was filed.
    let got = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|r| r.is_some())).await;
    let report = match got {
        Ok(Ok(r)) => r.clone().unwrap_or_default(),
        Ok(Err(_)) => {
            serde_json::json!({ "id": id, "state": "failed", "error": { "code": "internal", "message": "the restore task ended without a report" } })
        }
        Err(_) => serde_json::json!({ "id": id, "state": "running" }),
    };
    Ok(Json(report).into_response())
}

// ---- fallbacks -----------------------------------------------------------------------

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found("not_found", format!("no route for {}", uri.path()))
}

pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}
