//! The route table: the router is built from it, and a test compares it with
//! `worker/api/openapi.yaml`, so routes and spec cannot drift apart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use super::api;
use super::backup;
use super::error::ErrorCode;
use super::metrics::{RequestLabel, RouteLabel};
use super::objects;
use super::restore;
use super::App;

pub struct Route {
    pub method: Method,
    pub path: &'static str,
    /// The operation's `operationId` in the spec (and the generated
    /// clients' name for it).
    pub id: &'static str,
    pub handler: MethodRouter<Arc<App>>,
}

fn route<H, T>(method: Method, path: &'static str, id: &'static str, h: H) -> Route
where
    H: Handler<T, Arc<App>>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a routable method");
    Route {
        method,
        path,
        id,
        handler: on(filter, h),
    }
}

/// Every route the server answers (paths in OpenAPI/axum `{param}` syntax).
pub fn table() -> Vec<Route> {
    use Method as M;
    vec![
        route(M::GET, "/healthz", "getHealth", api::healthz),
        route(M::GET, "/readyz", "getReady", api::readyz),
        route(M::GET, "/metrics", "getMetrics", api::metrics),
        route(M::GET, "/v1/stats", "getStats", api::stats),
        route(M::POST, "/v1/gc", "runGc", api::gc),
        route(M::GET, "/v1/series", "listSeries", api::list_series),
        route(
            M::GET,
            "/v1/series/{ns}/{name}",
            "getSeries",
            api::get_series,
        ),
        route(
            M::DELETE,
            "/v1/series/{ns}/{name}",
            "deleteSeries",
            api::delete_series,
        ),
        route(
            M::PUT,
            "/v1/series/{ns}/{name}/retention",
            "putRetention",
            api::put_retention,
        ),
        route(
            M::PUT,
            "/v1/series/{ns}/{name}/moved-to",
            "putMovedTo",
            api::put_moved_to,
        ),
        route(
            M::POST,
            "/v1/series/{ns}/{name}/slide",
            "slideSeries",
            api::slide,
        ),
        route(
            M::POST,
            "/v1/series/{ns}/{name}/expire",
            "expireVersions",
            api::post_expire,
        ),
        route(
            M::GET,
            "/v1/series/{ns}/{name}/versions",
            "listVersions",
            api::list_versions,
        ),
        route(
            M::PUT,
            "/v1/series/{ns}/{name}/versions",
            "putVersion",
            backup::put_version,
        ),
        route(
            M::GET,
            "/v1/series/{ns}/{name}/versions/{version}",
            "getVersion",
            restore::get_version,
        ),
        route(
            M::DELETE,
            "/v1/series/{ns}/{name}/versions/{version}",
            "deleteVersion",
            api::delete_version,
        ),
        route(
            M::GET,
            "/v1/series/{ns}/{name}/backup",
            "getBackupProgress",
            api::get_backup_progress,
        ),
        route(
            M::GET,
            "/v1/restores/{id}",
            "getRestoreReport",
            restore::get_restore,
        ),
        route(
            M::GET,
            "/v1/buckets/{ns}/{bucket}",
            "getBucket",
            objects::get_bucket,
        ),
        route(
            M::GET,
            "/v1/buckets/{ns}/{bucket}/objects",
            "listObjects",
            objects::list_objects,
        ),
        route(
            M::PUT,
            "/v1/buckets/{ns}/{bucket}/object",
            "putObject",
            objects::put_object,
        ),
        route(
            M::GET,
            "/v1/buckets/{ns}/{bucket}/object",
            "getObject",
            objects::get_object,
        ),
        route(
            M::DELETE,
            "/v1/buckets/{ns}/{bucket}/object",
            "deleteObject",
            objects::delete_object,
        ),
        route(
            M::GET,
            "/v1/buckets/{ns}/{bucket}/object/meta",
            "getObjectMeta",
            objects::object_meta,
        ),
        route(
            M::POST,
            "/v1/buckets/{ns}/{bucket}/signed-url",
            "signObjectUrl",
            objects::sign_url,
        ),
        route(
            M::GET,
            "/v1/signed/{ns}/{bucket}",
            "getSignedObject",
            objects::get_signed,
        ),
    ]
}

pub fn router(app: Arc<App>) -> Router {
    let mut by_path: BTreeMap<&'static str, MethodRouter<Arc<App>>> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut ids = std::collections::BTreeSet::new();
    for r in table() {
        assert!(
            seen.insert((r.method.to_string(), r.path)),
            "route {} {} is listed twice",
            r.method,
            r.path
        );
        assert!(ids.insert(r.id), "operationId {} is used twice", r.id);
        let mr = match by_path.remove(r.path) {
            Some(existing) => existing.merge(r.handler),
            None => r.handler,
        };
        by_path.insert(r.path, mr);
    }
    let mut router = Router::new();
    for (path, mr) in by_path {
        router = router.route(path, mr);
    }
    router
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}

/// Counts and logs every request; counts error responses by code.
async fn observe(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    let secs = started.elapsed().as_secs_f64();
    let status = resp.status().as_u16();
    if matches!(status, 500 | 507) {
        // A storage failure may have left the metadata taking no writes.
        app.health.kick();
    }
    let m = &app.metrics;
    if let Some(ErrorCode(code)) = resp.extensions().get::<ErrorCode>() {
        m.error(code.as_str());
    }
    m.requests
        .get_or_create(&RequestLabel {
            method: method.clone(),
            route: route.clone(),
            status,
        })
        .inc();
    m.request_seconds
        .get_or_create(&RouteLabel {
            method: method.clone(),
            route: route.clone(),
        })
        .observe(secs);
    if matches!(route.as_str(), "/healthz" | "/readyz" | "/metrics") {
        tracing::debug!(%method, %path, status, ms = secs * 1e3, "request");
    } else {
        tracing::info!(%method, %path, status, ms = secs * 1e3, "request");
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// (METHOD, path, operationId) of every operation in worker/api/openapi.yaml.
    fn spec_routes() -> BTreeSet<(String, String, String)> {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/openapi.yaml");
        let text = std::fs::read_to_string(p).expect("read openapi.yaml");
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("openapi.yaml parses");
        let paths = doc["paths"].as_mapping().expect("spec has paths");
        let mut out = BTreeSet::new();
        for (path, ops) in paths {
            let path = path.as_str().expect("path is a string");
            for (k, op) in ops.as_mapping().expect("path item is a mapping") {
                let k = k.as_str().unwrap_or_default();
                if matches!(
                    k,
                    "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace"
                ) {
                    let id = op["operationId"].as_str().unwrap_or("(no operationId)");
                    out.insert((k.to_uppercase(), path.to_string(), id.to_string()));
                }
            }
        }
        out
    }

    #[test]
    fn routes_match_the_openapi_spec() {
        let ours: BTreeSet<(String, String, String)> = table()
            .into_iter()
            .map(|r| (r.method.to_string(), r.path.to_string(), r.id.to_string()))
            .collect();
        let spec = spec_routes();
        let missing: Vec<_> = spec.difference(&ours).collect();
        let extra: Vec<_> = ours.difference(&spec).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "routes and worker/api/openapi.yaml differ:\n  in the spec, not served: {missing:?}\n  served, not in the spec: {extra:?}"
        );
        assert_eq!(ours.len(), table().len(), "a route is listed twice");
        let ids: BTreeSet<&str> = table().iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), table().len(), "an operationId is used twice");
    }

    #[test]
    fn every_spec_operation_documents_its_error_codes() {
        // Operations needing a token must document 401; every one that takes
        // a path or query parameter must document 400.
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/openapi.yaml");
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        for (path, ops) in doc["paths"].as_mapping().unwrap() {
            let path = path.as_str().unwrap();
            for (m, op) in ops.as_mapping().unwrap() {
                let Some(m) = m.as_str().filter(|m| *m != "parameters") else {
                    continue;
                };
                let responses = op["responses"].as_mapping().unwrap();
                let has = |c: &str| responses.contains_key(serde_yaml::Value::from(c));
                let public = op["security"].as_sequence().is_some_and(|s| s.is_empty());
                if !public {
                    assert!(has("401"), "{m} {path} does not document 401");
                }
                if path.contains('{') {
                    assert!(has("400"), "{m} {path} does not document 400");
                }
            }
        }
    }
}
