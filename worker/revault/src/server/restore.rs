//! Restores out: `GET /v1/series/{ns}/{name}/versions/{version}` streams a
//! version as the response body (or its stored blocks, for `revault pull`
//! to assemble), and `GET /v1/restores/{id}` reports how it went.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use revault_engine::{
    restore, transfer, CachePolicy, ErrorKind, RestoreOptions, RestoreReport, RestoreTarget, Store,
    VersionKind, VersionRecord, VersionSel, MIB,
};

use super::api::{series_of, version_sel, AppState, VersionPath};
use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::request::{path_err, query_err};
use super::wire::{self, ApiCode};
use super::work::{blocking, restore_body};
use super::{App, RestoreEntry};

/// Whether the client asked for a block-transfer stream (`Accept`).
fn wants_blocks(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.split(';').next().map(str::trim) == Some(transfer::MEDIA_TYPE))
}

/// A restore request, parsed and checked.
struct RestoreRequest {
    name: String,
    sel: VersionSel,
    cache: CachePolicy,
    cache_mib: u64,
    /// Block transfer: stored blocks go out and the client assembles the
    /// version (restore memory = its assembly window, policy always faa).
    blocks: bool,
}

/// `GET …/versions/{version}`: the version as the response body. In steps:
/// parse, resolve the version, file a report slot, stream the body, set
/// the headers.
pub async fn get_version(
    State(app): AppState,
    p: Principal,
    path: VersionPath,
    headers: HeaderMap,
    q: Result<Query<wire::GetVersionQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let req = parse_restore(&app, &p, path, &headers, q)?;
    let store = app.store_to_read()?;
    let (st, name, sel) = (store.clone(), req.name.clone(), req.sel);
    let v = blocking(move || {
        let s = st.series(&name)?;
        Ok(st.resolve_version(&s, &sel)?)
    })
    .await?;
    let (id, report) = file_report(&app, &p);
    let blocks = req.blocks;
    let body = restore_version(&app, store, req, v.number, id.clone(), report);
    Ok(version_response(body, &v, &id, blocks))
}

/// The series and version, the cache to restore with (capped by the
/// server's limit), and whether the client asked for blocks.
fn parse_restore(
    app: &App,
    p: &Principal,
    path: VersionPath,
    headers: &HeaderMap,
    q: Result<Query<wire::GetVersionQuery>, QueryRejection>,
) -> ApiResult<RestoreRequest> {
    let Path((ns, n, v)) = path.map_err(path_err)?;
    let name = series_of(p, &ns, &n)?;
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
            ApiCode::Engine(ErrorKind::InvalidArgument),
            "cacheMib must be between 1 and 16384",
        ));
    }
    Ok(RestoreRequest {
        name,
        sel,
        cache,
        cache_mib: cache_mib.min(app.max_cache_mib),
        blocks: wants_blocks(headers),
    })
}

/// A new restore id, and where its report goes once the body has ended
/// (`GET /v1/restores/{id}`, for the token that started it).
fn file_report(app: &App, p: &Principal) -> (String, ReportSender) {
    let id = format!("{:032x}", rand::random::<u128>());
    let (report_tx, report_rx) = tokio::sync::watch::channel(None);
    app.reports.lock().unwrap().insert(
        id.clone(),
        RestoreEntry {
            owner: p.owner.clone(),
            report: report_rx,
        },
    );
    (id, report_tx)
}

type ReportSender = tokio::sync::watch::Sender<Option<wire::RestoreReport>>;

/// The body of version `number`: restored (or sent as blocks) on the
/// blocking pool; its report is filed when it ends.
fn restore_version(
    app: &Arc<App>,
    store: Arc<Store>,
    req: RestoreRequest,
    number: u32,
    id: String,
    report: ReportSender,
) -> Body {
    let opts = RestoreOptions {
        cache: req.cache,
        cache_bytes: req.cache_mib * MIB,
        ..Default::default()
    };
    let (name, blocks) = (req.name, req.blocks);
    let n2 = name.clone();
    app.metrics.inflight_restores.inc();
    restore_body(
        app,
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
            let _ = report.send(Some(restore_report(a, name, number, id, r)));
        },
    )
}

/// What a restore that ended reports (and its metrics and log line).
fn restore_report(
    a: &App,
    name: String,
    number: u32,
    id: String,
    r: revault_engine::Result<RestoreReport>,
) -> wire::RestoreReport {
    match r {
        Ok(rep) => {
            if let Some(sf) = rep.speed_factor {
                a.metrics.speed_factor.observe(sf);
            }
            tracing::info!(series = %name, version = number, restore = %id, bytes = rep.logical_bytes, reads = rep.container_reads, secs = rep.seconds, "restore finished");
            wire::RestoreReport::Done {
                id,
                figures: rep.into(),
            }
        }
        Err(e) => {
            tracing::info!(series = %name, version = number, restore = %id, error = %e, "restore failed");
            wire::RestoreReport::Failed {
                id,
                series: Some(name),
                version: Some(number),
                error: wire::ErrorBody {
                    code: e.kind().into(),
                    message: e.to_string(),
                },
            }
        }
    }
}

/// The response for version `v` with its body: content type, the
/// version's number and kind, the restore id, and a length when known.
fn version_response(body: Body, v: &VersionRecord, id: &str, blocks: bool) -> Response {
    let ct = match v.kind {
        _ if blocks => transfer::MEDIA_TYPE,
        VersionKind::Stream => "application/octet-stream",
        VersionKind::Tree => "application/x-tar",
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert("x-revault-version", HeaderValue::from(v.number));
    h.insert(
        "x-revault-kind",
        HeaderValue::from_static(wire::VersionKind::from(v.kind).as_str()),
    );
    h.insert(
        "x-revault-restore-id",
        HeaderValue::from_str(id).expect("hex is a valid header"),
    );
    h.insert(header::VARY, HeaderValue::from_static("accept"));
    if v.kind == VersionKind::Stream && !blocks {
        // A known length lets clients tell a complete body from a cut one
        // (a block stream ends with its own end frame).
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(v.logical_bytes));
    }
    resp
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
            ApiCode::Engine(ErrorKind::InvalidArgument),
            format!("restore id {id:?}: expected up to 32 lowercase hex digits"),
        ));
    }
    let not_found = || {
        ApiError::not_found(ApiCode::UnknownRestore, format!("no restore {id} (reports are kept for recent restores, for the token that started them)"))
    };
    let Some(mut rx) = app.reports.lock().unwrap().get(&id, &p.owner) else {
        return Err(not_found());
    };
    // The body may have ended a moment before the report was filed.
    let got = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|r| r.is_some())).await;
    let report = match got {
        Ok(Ok(r)) => r.clone(),
        Ok(Err(_)) => None,
        Err(_) => Some(wire::RestoreReport::Running { id: id.clone() }),
    };
    let report = report.unwrap_or_else(|| wire::RestoreReport::Failed {
        id,
        series: None,
        version: None,
        error: wire::ErrorBody {
            code: ApiCode::Engine(ErrorKind::Internal),
            message: "the restore task ended without a report".into(),
        },
    });
    Ok(Json(report).into_response())
}
