//! The wire contract, pinned: every JSON body `revault serve` answers, with
//! the exact keys it carries and the JSON type of each value, driven through
//! a real server. A change of casing, a key that appears or disappears, or a
//! number that becomes a string fails here: clients (the operator, the
//! Velero plugin, `revault push/pull`) parse these bodies.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::server::{Response, Server};
use common::*;
use serde_json::Value;

const JSON: (&str, &str) = ("Content-Type", "application/json");
const OCTETS: (&str, &str) = ("Content-Type", "application/octet-stream");

/// A JSON value's type, as a client parsing it sees it.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Asserts that `v` is an object with exactly the keys of `want`, each
/// holding a value of the given type.
#[track_caller]
fn assert_shape(what: &str, v: &Value, want: &[(&str, &str)]) {
    let Some(obj) = v.as_object() else {
        panic!("{what}: not a JSON object: {v}");
    };
    let got: BTreeMap<&str, &str> = obj.iter().map(|(k, v)| (k.as_str(), type_of(v))).collect();
    let want: BTreeMap<&str, &str> = want.iter().copied().collect();
    assert_eq!(got, want, "{what}: keys or types changed in {v}");
}

/// Each element of an array (non-empty) has the shape `want`.
#[track_caller]
fn assert_items(what: &str, v: &Value, want: &[(&str, &str)]) {
    let items = v
        .as_array()
        .unwrap_or_else(|| panic!("{what}: not an array: {v}"));
    assert!(!items.is_empty(), "{what}: empty, nothing to check");
    for (i, item) in items.iter().enumerate() {
        assert_shape(&format!("{what}[{i}]"), item, want);
    }
}

#[track_caller]
fn ok(r: Response, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with("application/json"), "content type {ct:?}");
    r.json()
}

// ---- the shapes (worker/api/openapi.yaml describes them) -----------------------

const ERROR: &[(&str, &str)] = &[("code", "string"), ("message", "string")];

const RETENTION: &[(&str, &str)] = &[
    ("keep", "int"),
    ("keepWithinSeconds", "null"),
    ("keepHourly", "null"),
    ("keepDaily", "null"),
    ("keepWeekly", "null"),
    ("keepMonthly", "null"),
    ("keepYearly", "null"),
    ("timezone", "null"),
    ("live", "int"),
    ("auto", "bool"),
];

const STATS: &[(&str, &str)] = &[
    ("logicalBytes", "int"),
    ("versions", "int"),
    ("uniqueBytes", "int"),
    ("containerBytes", "int"),
    ("containerUncompressedBytes", "int"),
    ("containers", "int"),
    ("units", "int"),
    ("recipeBytes", "int"),
    ("catalogBytes", "int"),
    ("dedupRatio", "float"),
    ("totalRatio", "float"),
    // A store without a remote (server_remote.rs has one).
    ("remote", "null"),
    ("disk", "object"),
    ("dedupDomain", "string"),
    // A store that takes writes (full_disk.rs has a degraded one).
    ("degraded", "null"),
];

const DISK: &[(&str, &str)] = &[
    ("dataTotalBytes", "int"),
    ("dataFreeBytes", "int"),
    ("metaTotalBytes", "int"),
    ("metaFreeBytes", "int"),
];

const GC: &[(&str, &str)] = &[
    ("orphans", "object"),
    ("groups", "int"),
    ("groupsMarked", "int"),
    ("unitsMarked", "int"),
    ("containersSwept", "int"),
    ("unitsFreed", "int"),
    ("unitsTrimmed", "int"),
    ("containersCompacted", "int"),
    ("containersFreed", "int"),
    ("bytesFreed", "int"),
    ("bytesWritten", "int"),
    ("markSeconds", "float"),
    ("sweepSeconds", "float"),
    ("seconds", "float"),
];

const ORPHANS: &[(&str, &str)] = &[
    ("orphanFiles", "int"),
    ("orphanBytes", "int"),
    ("emptyDirs", "int"),
    ("quarantinedFiles", "int"),
    ("quarantinedBytes", "int"),
];

const SLIDE: &[(&str, &str)] = &[
    ("series", "string"),
    ("slid", "array"),
    ("indirectChunks", "int"),
    ("directChunks", "int"),
    ("unitsTrimmed", "int"),
    ("unitsFreed", "int"),
    ("unitsMoved", "int"),
    ("linksResolved", "int"),
    ("bytesWritten", "int"),
    ("containersFreed", "int"),
    ("bytesFreed", "int"),
    ("seconds", "float"),
];

const EXPIRE: &[(&str, &str)] = &[
    ("series", "string"),
    ("expired", "array"),
    ("spliced", "array"),
    ("unitsFreed", "int"),
    ("containersFreed", "int"),
    ("bytesFreed", "int"),
    ("logicalBytesExpired", "int"),
    ("seconds", "float"),
];

/// A backup's report; `slide` and `expire` join it when the series'
/// retention is automatic, `retentionError` when that failed. The figures a
/// version's listing also carries have its names (`time`, `newBytes`,
/// `storedBytes`).
const BACKUP: &[(&str, &str)] = &[
    ("series", "string"),
    ("version", "int"),
    ("kind", "string"),
    ("unit", "string"),
    ("time", "string"),
    ("logicalBytes", "int"),
    ("chunks", "int"),
    ("units", "int"),
    ("newUnits", "int"),
    ("newBytes", "int"),
    ("storedBytes", "int"),
    ("zeroBytes", "int"),
    ("catalogEntries", "int"),
    ("recipeBytes", "int"),
    ("catalogBytes", "int"),
    ("seconds", "float"),
    ("rewrite", "string"),
    ("rewrittenUnits", "int"),
    ("rewrittenChunks", "int"),
    ("rewrittenBytes", "int"),
    ("predictedBytes", "int"),
];

const RESTORE_DONE: &[(&str, &str)] = &[
    ("id", "string"),
    ("state", "string"),
    ("series", "string"),
    ("version", "int"),
    ("kind", "string"),
    ("logicalBytes", "int"),
    ("containerReads", "int"),
    ("bytesRead", "int"),
    ("bytesDecoded", "int"),
    ("readAmplification", "float"),
    ("speedFactor", "float"),
    ("chainDepth", "int"),
    ("cache", "string"),
    ("cacheAuto", "bool"),
    ("cacheBytes", "int"),
    ("peakCacheBytes", "int"),
    ("reusedBytes", "int"),
    ("reusePeakBytes", "int"),
    ("seconds", "float"),
    ("warnings", "array"),
];

const RESTORE_FAILED: &[(&str, &str)] = &[
    ("id", "string"),
    ("series", "string"),
    ("version", "int"),
    ("state", "string"),
    ("error", "object"),
];

const RESTORE_RUNNING: &[(&str, &str)] = &[("id", "string"), ("state", "string")];

const SERIES: &[(&str, &str)] = &[
    ("series", "string"),
    ("unit", "string"),
    ("versions", "int"),
    ("latest", "int"),
    ("latestTime", "string"),
    ("logicalBytes", "int"),
    ("retention", "object"),
    // A store without a remote (server_remote.rs has one).
    ("durableVersion", "null"),
    // Not moved to another worker.
    ("movedTo", "null"),
];

const VERSION: &[(&str, &str)] = &[
    ("number", "int"),
    ("time", "string"),
    ("kind", "string"),
    ("form", "string"),
    ("logicalBytes", "int"),
    ("newBytes", "int"),
    ("storedBytes", "int"),
    ("chunks", "int"),
];

const PROGRESS_IDLE: &[(&str, &str)] = &[
    ("series", "string"),
    ("running", "bool"),
    ("queued", "bool"),
];

const PROGRESS_RUNNING: &[(&str, &str)] = &[
    ("series", "string"),
    ("running", "bool"),
    ("queued", "bool"),
    ("logicalBytes", "int"),
    ("startedAt", "string"),
];

const BUCKET: &[(&str, &str)] = &[
    ("bucket", "string"),
    ("created", "string"),
    ("objects", "int"),
    ("size", "int"),
    ("uploadedBytes", "int"),
    ("storedBytes", "int"),
];

const OBJECT: &[(&str, &str)] = &[
    ("key", "string"),
    ("size", "int"),
    ("encoding", "string"),
    ("uploadedBytes", "int"),
    ("etag", "string"),
    ("version", "int"),
    ("time", "string"),
    ("tarMembers", "int"),
];

const OBJECT_DELETED: &[(&str, &str)] =
    &[("key", "string"), ("version", "int"), ("bytesFreed", "int")];

const SIGNED_URL: &[(&str, &str)] = &[("url", "string"), ("expiresAt", "string")];

fn with<'a>(base: &[(&'a str, &'a str)], more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    [base, more].concat()
}

fn put_version(srv: &Server, series: &str, ct: (&str, &str), body: &[u8]) -> Value {
    ok(
        srv.request("PUT", &format!("/v1/series/{series}/versions"), &[ct], body),
        201,
    )
}

/// A tar stream holding one small file.
fn small_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(5);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    b.append_data(&mut h, "hello.txt", &b"hello"[..]).unwrap();
    b.into_inner().unwrap()
}

// ---- the tests -------------------------------------------------------------------------

#[test]
fn series_and_maintenance_bodies_keep_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);

    // Backups: a stream, a tree, and one whose retention runs after it. A new series' retention
    // is automatic, so its reports carry what the slide and the expiry did.
    let auto = with(BACKUP, &[("slide", "object"), ("expire", "object")]);
    let first = put_version(&srv, "default/db", OCTETS, &random(2 << 20, 1));
    assert_shape("backup report", &first, &auto);
    assert_eq!(first["kind"], "stream");
    let t = put_version(
        &srv,
        "default/tree",
        ("Content-Type", "application/x-tar"),
        &small_tar(),
    );
    assert_shape("backup report (tar)", &t, &auto);
    assert_eq!(t["kind"], "tree");
    // Without automatic retention, neither.
    ok(
        srv.request(
            "PUT",
            "/v1/series/default/manual/retention",
            &[JSON],
            b"{\"auto\": false}",
        ),
        201,
    );
    let m = put_version(&srv, "default/manual", OCTETS, &random(1 << 20, 4));
    assert_shape("backup report (manual retention)", &m, BACKUP);

    // A retention that creates its series answers 201, one that replaces
    // another 200; the body is the same.
    let retention = b"{\"keep\": 1, \"live\": 1, \"auto\": true}";
    let put = |status| {
        let r = srv.request(
            "PUT",
            "/v1/series/default/auto/retention",
            &[JSON],
            retention,
        );
        ok(r, status)
    };
    assert_shape("retention (created)", &put(201), RETENTION);
    assert_shape("retention (replaced)", &put(200), RETENTION);
    put_version(&srv, "default/auto", OCTETS, &random(2 << 20, 2));
    let mut data = random(2 << 20, 2);
    data[..4096].fill(7);
    let b = put_version(&srv, "default/auto", OCTETS, &data);
    assert_shape("backup report with automatic retention", &b, &auto);
    assert_shape("backup report's slide", &b["slide"], SLIDE);
    assert_shape("backup report's expire", &b["expire"], EXPIRE);
    assert_eq!(b["expire"]["expired"], serde_json::json!([1]), "{b}");

    // Series, versions, progress.
    put_version(&srv, "default/db", OCTETS, &random(2 << 20, 3));
    let l = ok(srv.get("/v1/series", None), 200);
    assert_items("series list", &l, SERIES);
    let s = ok(srv.get("/v1/series/default/db", None), 200);
    assert_shape(
        "series",
        &s,
        &with(
            SERIES,
            &[("versionList", "array"), ("pendingExpiry", "array")],
        ),
    );
    // The same shape as a stored retention, with no keep rule (a series nobody set one for).
    assert_shape(
        "series retention",
        &s["retention"],
        &with(RETENTION, &[("keep", "null")]),
    );
    assert_items("series versionList", &s["versionList"], VERSION);
    let vs = ok(srv.get("/v1/series/default/db/versions", None), 200);
    assert_items("versions", &vs, VERSION);
    // The backup's report and the version's listing name a figure alike, and agree on it.
    for k in [
        "time",
        "logicalBytes",
        "newBytes",
        "storedBytes",
        "chunks",
        "kind",
    ] {
        assert_eq!(first[k], vs[0][k], "{k}: {first} vs {}", vs[0]);
    }
    let p = ok(srv.get("/v1/series/default/db/backup", None), 200);
    assert_shape("progress (idle)", &p, PROGRESS_IDLE);

    // A restore and its report.
    let r = srv.get("/v1/series/default/db/versions/1", None);
    assert_eq!(r.status, 200);
    let id = r.header("x-revault-restore-id").unwrap().to_string();
    let rep = ok(srv.get(&format!("/v1/restores/{id}"), None), 200);
    assert_shape("restore report (done)", &rep, RESTORE_DONE);
    assert_eq!(rep["state"], "done");

    // Maintenance.
    let st = ok(srv.get("/v1/stats", None), 200);
    assert_shape("stats", &st, STATS);
    assert_shape("stats' disk", &st["disk"], DISK);
    let sl = ok(
        srv.request("POST", "/v1/series/default/db/slide", &[], b""),
        200,
    );
    assert_shape("slide report", &sl, SLIDE);
    let e = ok(
        srv.request(
            "POST",
            "/v1/series/default/db/expire",
            &[JSON],
            b"{\"version\": 1}",
        ),
        200,
    );
    assert_shape("expire report", &e, EXPIRE);
    let e = ok(
        srv.request("DELETE", "/v1/series/default/db/versions/latest", &[], b""),
        200,
    );
    assert_shape("expire report (delete version)", &e, EXPIRE);
    let e = ok(
        srv.request("DELETE", "/v1/series/default/tree", &[], b""),
        200,
    );
    assert_shape("expire report (delete series)", &e, EXPIRE);
    let g = ok(
        srv.request("POST", "/v1/gc", &[JSON], b"{\"full\": true}"),
        200,
    );
    assert_shape("gc report", &g, GC);
    assert_shape("gc report's orphans", &g["orphans"], ORPHANS);
    srv.stop();
}

#[test]
fn object_bodies_keep_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    for key in ["backups/a", "backups/b", "top"] {
        let o = ok(
            srv.request(
                "PUT",
                &format!("/v1/buckets/velero/bsl/object?key={key}"),
                &[OCTETS],
                key.as_bytes(),
            ),
            201,
        );
        assert_shape(
            "stored object",
            &o,
            &with(OBJECT, &[("newBytes", "int"), ("storedBytes", "int")]),
        );
    }
    let m = ok(
        srv.get("/v1/buckets/velero/bsl/object/meta?key=top", None),
        200,
    );
    assert_shape("object meta", &m, OBJECT);
    let b = ok(srv.get("/v1/buckets/velero/bsl", None), 200);
    assert_shape("bucket", &b, BUCKET);
    let l = ok(
        srv.get("/v1/buckets/velero/bsl/objects?delimiter=/&limit=1", None),
        200,
    );
    assert_shape(
        "object list (a page)",
        &l,
        &[
            ("objects", "array"),
            ("commonPrefixes", "array"),
            ("nextStartAfter", "string"),
        ],
    );
    let l = ok(srv.get("/v1/buckets/velero/bsl/objects", None), 200);
    assert_shape(
        "object list (the last page)",
        &l,
        &[("objects", "array"), ("commonPrefixes", "array")],
    );
    assert_items("object list's objects", &l["objects"], OBJECT);
    let u = ok(
        srv.request(
            "POST",
            "/v1/buckets/velero/bsl/signed-url",
            &[JSON],
            b"{\"key\": \"top\", \"ttlSeconds\": 60}",
        ),
        200,
    );
    assert_shape("signed URL", &u, SIGNED_URL);
    let d = ok(
        srv.request("DELETE", "/v1/buckets/velero/bsl/object?key=top", &[], b""),
        200,
    );
    assert_shape("deleted object", &d, OBJECT_DELETED);
    srv.stop();
}

#[test]
fn error_bodies_and_probes_keep_their_shape() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    for (r, status) in [
        (srv.get("/nope", None), 404),
        (srv.request("DELETE", "/v1/stats", &[], b""), 405),
        (srv.get("/v1/series/default/missing", None), 404),
        (srv.get("/v1/series?bogus=1", None), 400),
        (srv.request("POST", "/v1/gc", &[JSON], b"{\"full\": "), 400),
        (
            srv.request(
                "PUT",
                "/v1/series/default/db/versions",
                &[("Content-Type", "text/plain")],
                b"x",
            ),
            415,
        ),
    ] {
        let e = ok(r, status);
        assert_shape("error", &e, ERROR);
    }
    // The probes answer plain text, not JSON.
    for p in ["/healthz", "/readyz"] {
        let r = srv.get(p, None);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; charset=utf-8"),
            "{p}"
        );
    }
    srv.stop();
}

#[test]
fn a_running_backup_reports_its_progress_with_these_keys() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    // A body announced longer than what is sent: the backup stays running.
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    let head = format!(
        "PUT /v1/series/default/slow/versions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        srv.addr,
        64 << 20
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&random(4 << 20, 9)).unwrap();
    s.flush().unwrap();
    let mut last = Value::Null;
    srv.wait_for("the backup to be running", Duration::from_secs(60), |srv| {
        last = srv.get("/v1/series/default/slow/backup", None).json();
        last["running"] == true
    });
    assert_shape("progress (running)", &last, PROGRESS_RUNNING);
    drop(s);
    srv.wait_for("the backup to end", Duration::from_secs(60), |srv| {
        srv.get("/v1/series/default/slow/backup", None).json()["running"] == false
    });
    srv.stop();
}

#[test]
fn failed_restore_reports_keep_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let srv = Server::start(&store, &[]);
    put_version(&srv, "default/db", OCTETS, &random(4 << 20, 4));
    // A flipped byte in the largest container: the restore fails midway.
    let mut files = files_under(&store.join("data"));
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let victim = files.last().expect("a container");
    let mut bytes = std::fs::read(victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(victim, bytes).unwrap();
    // The body ends in an error (a cut chunked body): read it to its end.
    let (mut s, head) = restore_head(&srv, "/v1/series/default/db/versions/1");
    let _ = s.read_to_end(&mut Vec::new());
    let id = restore_id(&head);
    let rep = ok(srv.get(&format!("/v1/restores/{id}"), None), 200);
    assert_shape("restore report (failed)", &rep, RESTORE_FAILED);
    assert_shape("restore report's error", &rep["error"], ERROR);
    assert_eq!(rep["state"], "failed");
    srv.stop();
}

/// Sends a GET and reads up to the end of the response head.
fn restore_head(srv: &Server, path: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", srv.addr);
    s.write_all(head.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "the response head ended early"
        );
        got.push(byte[0]);
    }
    (s, String::from_utf8_lossy(&got).into_owned())
}

fn restore_id(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("x-revault-restore-id")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no restore id in {head}"))
}

/// A report asked for while its restore is still sending (the client reads
/// nothing) says `running` once the server stops waiting (30 s).
#[test]
fn a_report_of_a_restore_still_running_keeps_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    // More than the socket buffers and the body queue hold.
    put_version(&srv, "default/big", OCTETS, &vec![0u8; 64 << 20]);
    let (s, head) = restore_head(&srv, "/v1/series/default/big/versions/1?cacheMib=1");
    let id = restore_id(&head);
    let rep = ok(srv.get(&format!("/v1/restores/{id}"), None), 200);
    assert_shape("restore report (running)", &rep, RESTORE_RUNNING);
    assert_eq!(rep["state"], "running");
    drop(s);
    srv.stop();
}
