//! The wire types against `worker/api/openapi.yaml`: a sample of every
//! response body, serialised, must match the schema of the response it is
//! sent as (keys, required keys, types, enums); every JSON response of the
//! spec must have a sample here; every request body and query string must
//! accept exactly the fields the spec lists. The spec is what clients are
//! generated from, so it cannot drift from what the server sends.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use revault_engine::ErrorKind;

use super::objects::Encoding;
use super::reports::RestoreFigures;
use super::*;

fn spec() -> Value {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../api/openapi.yaml");
    let text = std::fs::read_to_string(p).expect("read openapi.yaml");
    serde_yaml::from_str(&text).expect("openapi.yaml parses")
}

/// Follows a `$ref` (local ones only: the spec has no others).
fn resolve<'a>(spec: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let ptr = r.strip_prefix('#').expect("a local $ref");
            resolve(spec, spec.pointer(ptr).unwrap_or_else(|| panic!("no {r}")))
        }
        None => schema,
    }
}

/// Where `value` breaks `schema` (the part of OpenAPI 3.0 the spec uses).
fn check(spec: &Value, schema: &Value, value: &Value, at: &str, errs: &mut Vec<String>) {
    let schema = resolve(spec, schema);
    if value.is_null() && schema["nullable"] == true {
        return;
    }
    if let Some(all) = schema["allOf"].as_array() {
        for s in all {
            check(spec, s, value, at, errs);
        }
    }
    if let Some(one) = schema["oneOf"].as_array() {
        let fits = one
            .iter()
            .filter(|s| {
                let mut e = Vec::new();
                check(spec, s, value, at, &mut e);
                e.is_empty()
            })
            .count();
        if fits != 1 {
            errs.push(format!("{at}: fits {fits} of the oneOf schemas: {value}"));
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(value) {
            errs.push(format!("{at}: {value} is not one of {allowed:?}"));
        }
    }
    let Some(ty) = schema["type"].as_str() else {
        return;
    };
    let fits = match ty {
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        other => panic!("{at}: schema type {other} not handled"),
    };
    if !fits {
        errs.push(format!("{at}: {value} is not of type {ty}"));
        return;
    }
    if let Some(items) = value.as_array() {
        for (i, v) in items.iter().enumerate() {
            check(spec, &schema["items"], v, &format!("{at}[{i}]"), errs);
        }
    }
    if let Some(obj) = value.as_object() {
        let props = schema["properties"].as_object();
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(spec, s, v, &format!("{at}.{k}"), errs),
                None if schema["additionalProperties"] == false => {
                    errs.push(format!("{at}: key {k:?} is not in the schema"))
                }
                None => {}
            }
        }
        for r in schema["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap();
            if !obj.contains_key(r) {
                errs.push(format!("{at}: required key {r:?} is missing"));
            }
        }
    }
}

/// Every operation: (operationId, the operation).
fn operations(spec: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for (_, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if matches!(method.as_str(), "get" | "put" | "post" | "delete") {
                let id = op["operationId"].as_str().expect("an operationId");
                out.push((id.to_string(), op));
            }
        }
    }
    out
}

fn operation<'a>(spec: &'a Value, id: &str) -> &'a Value {
    operations(spec)
        .into_iter()
        .find(|(i, _)| i == id)
        .unwrap_or_else(|| panic!("no operation {id} in the spec"))
        .1
}

/// The JSON schema of an operation's response with `status`, if it has one.
fn response_schema<'a>(spec: &'a Value, op: &'a Value, status: &str) -> Option<&'a Value> {
    let resp = resolve(spec, &op["responses"][status]);
    resp["content"]["application/json"]
        .get("schema")
        .map(|s| resolve(spec, s))
}

fn to_json(v: impl Serialize) -> Value {
    serde_json::to_value(v).unwrap()
}

// ---- samples ----------------------------------------------------------------------

const TIME: &str = "2026-01-31T02:00:00Z";

fn retention() -> Retention {
    Retention {
        keep: Some(7),
        keep_within_seconds: None,
        keep_hourly: None,
        keep_daily: Some(7),
        keep_weekly: Some(4),
        keep_monthly: Some(12),
        keep_yearly: None,
        timezone: Some("Europe/Berlin".into()),
        live: 1,
        auto: Some(true),
    }
}

fn stats_with_remote(totals: revault_engine::Totals) -> Stats {
    let mut s = Stats::from(totals);
    s.remote = Some(RemoteStats {
        url: "s3://backups/cluster-a/ssd/node1".into(),
        store: "3f2a".into(),
        generation: 2,
        head_time: Some(TIME.into()),
        lag_seconds: 1.5,
        last_error: None,
        fenced: false,
    });
    s.degraded = Some("a synced write to the metadata failed: No space left on device".into());
    s
}

fn series() -> Series {
    Series {
        series: "default/db".into(),
        unit: DedupUnit::Segment,
        versions: 2,
        latest: Some(2),
        latest_time: Some(TIME.into()),
        logical_bytes: 1 << 20,
        retention: retention(),
        durable_version: Some(1),
        moved_to: None,
    }
}

fn version() -> Version {
    Version {
        number: 2,
        time: TIME.into(),
        kind: VersionKind::Tree,
        form: RecipeForm::Archival,
        logical_bytes: 1 << 20,
        new_bytes: 4096,
        stored_bytes: 2048,
        chunks: 100,
    }
}

fn slide() -> SlideReport {
    revault_engine::SlideReport {
        series: "default/db".into(),
        slid: vec![1],
        ..Default::default()
    }
    .into()
}

fn expire() -> ExpireReport {
    revault_engine::ExpireReport {
        series: "default/db".into(),
        expired: vec![1, 2],
        spliced: vec![3],
        ..Default::default()
    }
    .into()
}

fn backup(auto: bool) -> BackupReport {
    BackupReport {
        series: "default/db".into(),
        version: 3,
        kind: VersionKind::Stream,
        unit: DedupUnit::Chunk,
        time: TIME.into(),
        logical_bytes: 1 << 20,
        chunks: 10,
        units: 9,
        new_units: 1,
        new_bytes: 4096,
        stored_bytes: 2048,
        zero_bytes: 0,
        catalog_entries: 0,
        recipe_bytes: 120,
        catalog_bytes: 0,
        seconds: 0.25,
        rewrite: "none".into(),
        rewritten_units: 0,
        rewritten_chunks: 0,
        rewritten_bytes: 0,
        predicted_bytes: 0,
        slide: auto.then(slide),
        expire: auto.then(expire),
        retention_error: auto.then(|| "the disk is full".into()),
    }
}

fn restore_figures() -> RestoreFigures {
    revault_engine::RestoreReport {
        series: "default/db".into(),
        version: 3,
        kind: Some(revault_engine::VersionKind::Stream),
        speed_factor: Some(2.5),
        cache: "faa".into(),
        warnings: vec!["a warning".into()],
        ..Default::default()
    }
    .into()
}

fn object() -> Object {
    Object {
        key: "backups/a".into(),
        size: 5,
        encoding: Encoding::Gzip,
        uploaded_bytes: 30,
        etag: "ab".repeat(32),
        version: 4,
        time: TIME.into(),
        tar_members: 0,
    }
}

fn error(code: ApiCode) -> ErrorBody {
    ErrorBody {
        code,
        message: "what went wrong".into(),
    }
}

/// (operationId, status, a body the server may send as that response).
fn samples() -> Vec<(&'static str, &'static str, Value)> {
    let gc = revault_engine::GcReport {
        orphans: revault_engine::OrphanReport {
            orphan_files: 1,
            ..Default::default()
        },
        seconds: 1.5,
        ..Default::default()
    };
    let totals = revault_engine::Totals {
        logical_bytes: 10,
        unit_vbytes: 5,
        ..Default::default()
    };
    let progress = |running: bool| BackupProgress {
        series: "default/db".into(),
        running,
        queued: false,
        logical_bytes: running.then_some(1 << 20),
        started_at: running.then(|| TIME.into()),
    };
    let list = |next: Option<&str>| ObjectList {
        objects: vec![object()],
        common_prefixes: vec!["backups/".into()],
        next_start_after: next.map(str::to_string),
    };
    vec![
        ("getStats", "200", to_json(stats_with_remote(totals))),
        ("runGc", "200", to_json(GcReport::from(gc))),
        ("listSeries", "200", to_json(vec![series()])),
        (
            "getSeries",
            "200",
            to_json(SeriesDetail {
                series: series(),
                version_list: vec![version()],
                pending_expiry: vec![1],
            }),
        ),
        ("deleteSeries", "200", to_json(expire())),
        ("putRetention", "200", to_json(retention())),
        (
            "putMovedTo",
            "200",
            to_json(Series {
                moved_to: Some("https://revault-worker-ssd-b.revault-system.svc:8420".into()),
                ..series()
            }),
        ),
        ("putRetention", "201", to_json(retention())),
        ("slideSeries", "200", to_json(slide())),
        ("expireVersions", "200", to_json(expire())),
        ("listVersions", "200", to_json(vec![version()])),
        ("putVersion", "201", to_json(backup(false))),
        ("putVersion", "201", to_json(backup(true))),
        ("deleteVersion", "200", to_json(expire())),
        ("getBackupProgress", "200", to_json(progress(false))),
        ("getBackupProgress", "200", to_json(progress(true))),
        (
            "getRestoreReport",
            "200",
            to_json(RestoreReport::Done {
                id: "ab12".into(),
                figures: restore_figures(),
            }),
        ),
        (
            "getRestoreReport",
            "200",
            to_json(RestoreReport::Failed {
                id: "ab12".into(),
                series: Some("default/db".into()),
                version: Some(3),
                error: error(ApiCode::Engine(ErrorKind::CorruptContainer)),
            }),
        ),
        (
            "getRestoreReport",
            "200",
            to_json(RestoreReport::Failed {
                id: "ab12".into(),
                series: None,
                version: None,
                error: error(ApiCode::Engine(ErrorKind::Internal)),
            }),
        ),
        (
            "getRestoreReport",
            "200",
            to_json(RestoreReport::Running { id: "ab12".into() }),
        ),
        (
            "getBucket",
            "200",
            to_json(Bucket::from(revault_objects::BucketSummary {
                bucket: "velero/bsl".into(),
                ..Default::default()
            })),
        ),
        ("listObjects", "200", to_json(list(Some("backups/a")))),
        ("listObjects", "200", to_json(list(None))),
        (
            "putObject",
            "201",
            to_json(StoredObject {
                object: object(),
                new_bytes: 5,
                stored_bytes: 3,
            }),
        ),
        ("getObjectMeta", "200", to_json(object())),
        (
            "deleteObject",
            "200",
            to_json(ObjectDeleted {
                key: "backups/a".into(),
                version: 4,
                bytes_freed: 100,
            }),
        ),
        (
            "signObjectUrl",
            "200",
            to_json(SignedUrl {
                url: "/v1/signed/velero/bsl?key=a".into(),
                expires_at: TIME.into(),
            }),
        ),
    ]
}

#[test]
fn every_response_body_matches_its_schema() {
    let spec = spec();
    let mut errs = Vec::new();
    for (id, status, body) in samples() {
        let op = operation(&spec, id);
        let schema = response_schema(&spec, op, status)
            .unwrap_or_else(|| panic!("{id} {status} has no JSON schema"));
        check(&spec, schema, &body, &format!("{id} {status}"), &mut errs);
    }
    assert!(
        errs.is_empty(),
        "bodies and openapi.yaml differ:\n{}",
        errs.join("\n")
    );
}

#[test]
fn every_json_response_of_the_spec_has_a_sample() {
    let spec = spec();
    let have: BTreeSet<(&str, &str)> = samples().iter().map(|(i, s, _)| (*i, *s)).collect();
    for (id, op) in operations(&spec) {
        for (status, _) in op["responses"].as_object().unwrap() {
            let is_error = status.starts_with('4') || status.starts_with('5');
            if !is_error && response_schema(&spec, op, status).is_some() {
                assert!(
                    have.contains(&(id.as_str(), status.as_str())),
                    "{id} {status}: a JSON response without a sample here"
                );
            }
        }
    }
}

#[test]
fn every_error_code_is_in_the_spec_and_no_other() {
    let spec = spec();
    let schema = &spec["components"]["schemas"]["Error"];
    let mut errs = Vec::new();
    for code in ApiCode::all() {
        check(
            &spec,
            schema,
            &to_json(error(code)),
            code.as_str(),
            &mut errs,
        );
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    let listed: BTreeSet<&str> = schema["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let ours: BTreeSet<&str> = ApiCode::all().iter().map(|c| c.as_str()).collect();
    assert_eq!(listed, ours, "Error.code's enum and ApiCode differ");
    // Every error response of every operation is an Error.
    for (id, op) in operations(&spec) {
        for (status, _) in op["responses"].as_object().unwrap() {
            if status.starts_with('4') || status.starts_with('5') {
                let s = response_schema(&spec, op, status)
                    .unwrap_or_else(|| panic!("{id} {status}: no JSON body"));
                assert_eq!(s, schema, "{id} {status}: not the Error schema");
            }
        }
    }
}

/// The fields `T` accepts, from the error a field it does not know gets
/// (`deny_unknown_fields` lists the expected ones).
fn accepted_fields<T: DeserializeOwned + std::fmt::Debug>() -> BTreeSet<String> {
    let e = serde_json::from_value::<T>(json!({ "zz-not-a-field": 0 }))
        .expect_err("a request type denies unknown fields");
    let msg = e.to_string();
    let expected = msg
        .split_once("expected ")
        .unwrap_or_else(|| panic!("no field list in {msg:?}"))
        .1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The property names of a request body schema (all branches of a oneOf).
fn schema_fields(spec: &Value, schema: &Value) -> BTreeSet<String> {
    let schema = resolve(spec, schema);
    let mut out: BTreeSet<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for s in schema["oneOf"].as_array().into_iter().flatten() {
        out.extend(schema_fields(spec, s));
    }
    out
}

#[test]
fn request_bodies_take_exactly_the_fields_of_their_schema() {
    let spec = spec();
    let ours = [
        ("runGc", accepted_fields::<GcRequest>()),
        ("putRetention", accepted_fields::<Retention>()),
        ("putMovedTo", accepted_fields::<MovedTo>()),
        ("expireVersions", accepted_fields::<ExpireRequest>()),
        ("signObjectUrl", accepted_fields::<SignRequest>()),
    ];
    let mut with_body = BTreeSet::new();
    for (id, op) in operations(&spec) {
        if let Some(s) = op["requestBody"]["content"]["application/json"].get("schema") {
            with_body.insert(id.clone());
            let fields = ours
                .iter()
                .find(|(i, _)| *i == id)
                .unwrap_or_else(|| panic!("{id} takes a JSON body: list its type here"));
            assert_eq!(fields.1, schema_fields(&spec, s), "{id}'s request body");
        }
    }
    assert_eq!(
        with_body.len(),
        ours.len(),
        "a type here has no JSON body in the spec"
    );
    // Bodies the spec gives as examples parse.
    let gc: GcRequest = serde_json::from_value(json!({"full": true, "compactBelow": 0.3})).unwrap();
    assert!(gc.full && gc.compact_below == Some(0.3));
}

/// Query keys a type also accepts under the previous release's name (`#[serde(alias)]`), for
/// clients older than their worker; the spec lists only the current name.
const PREVIOUS_NAMES: &[&str] = &["cache_mib"];

#[test]
fn query_strings_take_exactly_the_parameters_of_the_spec() {
    let spec = spec();
    let ours = [
        ("listSeries", accepted_fields::<SeriesListQuery>()),
        ("putVersion", accepted_fields::<PutVersionQuery>()),
        ("getVersion", accepted_fields::<GetVersionQuery>()),
        ("listObjects", accepted_fields::<ObjectListQuery>()),
        ("putObject", accepted_fields::<PutObjectQuery>()),
        ("getObject", accepted_fields::<GetObjectQuery>()),
        ("deleteObject", accepted_fields::<KeyQuery>()),
        ("getObjectMeta", accepted_fields::<KeyQuery>()),
        ("getSignedObject", accepted_fields::<SignedQuery>()),
        ("getReady", accepted_fields::<ReadyQuery>()),
    ];
    for (id, op) in operations(&spec) {
        let params: BTreeSet<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| resolve(&spec, p))
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        match ours.iter().find(|(i, _)| *i == id) {
            Some((_, fields)) => {
                let current: BTreeSet<String> = fields
                    .iter()
                    .filter(|f| !PREVIOUS_NAMES.contains(&f.as_str()))
                    .cloned()
                    .collect();
                assert_eq!(current, params, "{id}'s query parameters")
            }
            None => assert!(
                params.is_empty(),
                "{id} takes {params:?}: list its type here"
            ),
        }
    }
}

#[test]
fn engine_error_kinds_keep_their_codes_on_the_wire() {
    for &k in ErrorKind::ALL {
        assert_eq!(to_json(ApiCode::from(k)), json!(k.code()));
    }
}

/// A key of the wire is camelCase: a lowercase ASCII letter, then letters
/// and digits (no `_` or `-`).
fn camel_case(k: &str) -> bool {
    k.starts_with(|c: char| c.is_ascii_lowercase()) && k.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Every object key in `v`, at any depth, that is not camelCase.
fn not_camel(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                if !camel_case(k) {
                    out.push(format!("{at}.{k}"));
                }
                not_camel(v, &format!("{at}.{k}"), out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| not_camel(v, &format!("{at}[]"), out)),
        _ => {}
    }
}

#[test]
fn every_key_on_the_wire_is_camel_case() {
    let mut bad = Vec::new();
    for (id, status, body) in samples() {
        not_camel(&body, &format!("{id} {status}"), &mut bad);
    }
    // The spec's properties and query parameters too (what clients are generated from).
    let spec = spec();
    for (name, schema) in spec["components"]["schemas"].as_object().unwrap() {
        let branches = schema["oneOf"].as_array().cloned().unwrap_or_default();
        for s in std::iter::once(schema).chain(branches.iter()) {
            let s = resolve(&spec, s);
            for k in s["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|p| p.0)
            {
                if !camel_case(k) {
                    bad.push(format!("schema {name}.{k}"));
                }
            }
        }
    }
    for (id, op) in operations(&spec) {
        for p in op["parameters"].as_array().into_iter().flatten() {
            let p = resolve(&spec, p);
            let n = p["name"].as_str().unwrap();
            if p["in"] == "query" && !camel_case(n) {
                bad.push(format!("{id} query parameter {n}"));
            }
        }
    }
    assert!(bad.is_empty(), "keys not in camelCase:\n{}", bad.join("\n"));
}
