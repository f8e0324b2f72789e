//! The object API (`/v1/buckets/...`) against a real `revault serve`: round
//! trips, listings with delimiters and pages, overwrite and delete freeing
//! their versions, gzip uploads, signed URLs, token scopes, bad input, the
//! in-flight backup progress, and what gzip does to dedup (figures printed
//! with `--nocapture`; docs/velero.md quotes them).

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::server::{slow_push, wait_child, Response, Server};
use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ADMIN: &str = "admin-token-0001";
const VELERO: &str = "velero-token-0001";
const OTHER: &str = "other-token-00001";

fn start() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("{ADMIN} *\n{VELERO} velero\n{OTHER} team-b\n"),
    )
    .unwrap();
    let s = Server::start(
        &dir.path().join("store"),
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--token-reload",
            "100ms",
        ],
    );
    (dir, s)
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

/// Percent-encodes a query value.
fn q(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn call(s: &Server, method: &str, path: &str, token: &str, body: &[u8]) -> Response {
    let auth = bearer(token);
    s.request(method, path, &[("Authorization", &auth)], body)
}

fn put(s: &Server, bucket: &str, key: &str, body: &[u8], gzip: bool) -> Response {
    let enc = if gzip { "&encoding=gzip" } else { "" };
    call(
        s,
        "PUT",
        &format!("/v1/buckets/{bucket}/object?key={}{enc}", q(key)),
        VELERO,
        body,
    )
}

fn get(s: &Server, bucket: &str, key: &str) -> Response {
    call(
        s,
        "GET",
        &format!("/v1/buckets/{bucket}/object?key={}", q(key)),
        VELERO,
        b"",
    )
}

/// Backs `body` up as a version of `series` (a byte stream), with a `query`
/// (empty, or starting with `?`).
fn backup(s: &Server, series: &str, query: &str, body: &[u8]) -> Response {
    let auth = bearer(VELERO);
    s.request(
        "PUT",
        &format!("/v1/series/{series}/versions{query}"),
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/octet-stream"),
        ],
        body,
    )
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn list(s: &Server, bucket: &str, query: &str) -> serde_json::Value {
    let r = call(
        s,
        "GET",
        &format!("/v1/buckets/{bucket}/objects?{query}"),
        VELERO,
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    v["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap().to_string())
        .collect()
}

fn versions(s: &Server, series: &str) -> Vec<serde_json::Value> {
    let r = call(
        s,
        "GET",
        &format!("/v1/series/{series}/versions"),
        ADMIN,
        b"",
    );
    if r.status == 404 {
        return Vec::new();
    }
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().as_array().unwrap().clone()
}

#[test]
fn objects_round_trip_list_overwrite_and_delete() {
    let (_d, s) = start();
    let b = "velero/bsl";
    let keys_in = [
        "backups/b1/velero-backup.json",
        "backups/b1/b1-logs.gz",
        "backups/b2/velero-backup.json",
        "restores/r1/restore-r1-logs.gz",
        "metadata/revision",
        "odd key/ü ñ+&=?#%",
    ];
    for (i, k) in keys_in.iter().enumerate() {
        let body = random(1000 + i * 5000, i as u64);
        let r = put(&s, b, k, &body, false);
        assert_eq!(r.status, 201, "{}", r.text());
        let j = r.json();
        assert_eq!(j["key"], *k);
        assert_eq!(j["size"], body.len());
        assert_eq!(j["etag"], blake3::hash(&body).to_hex().to_string());
        let g = get(&s, b, k);
        assert_eq!(g.status, 200, "{}", g.text());
        assert_eq!(g.body, body, "{k} reads back byte-exact");
        assert_eq!(
            g.header("etag").unwrap(),
            format!("\"{}\"", j["etag"].as_str().unwrap())
        );
        assert_eq!(g.header("x-revault-encoding"), Some("identity"));
        let m = call(
            &s,
            "GET",
            &format!("/v1/buckets/{b}/object/meta?key={}", q(k)),
            VELERO,
            b"",
        );
        assert_eq!(m.json()["version"], j["version"]);
    }

    // Listings: S3 semantics, as Velero's ListCommonPrefixes/ListObjects expect.
    let l = list(&s, b, "prefix=backups%2F&delimiter=%2F");
    assert_eq!(
        strings(&l["commonPrefixes"]),
        ["backups/b1/", "backups/b2/"]
    );
    assert!(keys(&l).is_empty());
    let l = list(&s, b, "prefix=backups%2Fb1%2F");
    assert_eq!(
        keys(&l),
        ["backups/b1/b1-logs.gz", "backups/b1/velero-backup.json"]
    );
    let l = list(&s, b, "delimiter=%2F");
    assert_eq!(
        strings(&l["commonPrefixes"]),
        ["backups/", "metadata/", "odd key/", "restores/"]
    );
    // Pages of two walk the whole bucket once, in key order.
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let l = list(&s, b, &format!("limit=2&startAfter={}", q(&after)));
        let page = keys(&l);
        assert!(page.len() <= 2);
        all.extend(page);
        match l["nextStartAfter"].as_str() {
            Some(n) => after = n.to_string(),
            None => break,
        }
    }
    let mut want: Vec<String> = keys_in.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(all, want);
    assert_eq!(
        versions(&s, b).len(),
        keys_in.len(),
        "one version per object"
    );

    // Overwrite: the new content replaces the old, whose version is expired.
    let old = get(&s, b, "metadata/revision")
        .header("x-revault-version")
        .unwrap()
        .to_string();
    let r = put(&s, b, "metadata/revision", b"rev-2", false);
    assert_eq!(r.status, 201);
    assert_eq!(get(&s, b, "metadata/revision").body, b"rev-2");
    let vs: Vec<String> = versions(&s, b)
        .iter()
        .map(|v| v["number"].to_string())
        .collect();
    assert!(
        !vs.contains(&old),
        "version {old} of the old content is gone: {vs:?}"
    );
    assert_eq!(vs.len(), keys_in.len());

    // Delete frees the content; the key is gone for reads, lists and deletes.
    let big = random(3 << 20, 99);
    assert_eq!(put(&s, b, "backups/b3/big.bin", &big, false).status, 201);
    let before = call(&s, "GET", "/v1/stats", ADMIN, b"").json()["containerBytes"]
        .as_u64()
        .unwrap();
    let d = call(
        &s,
        "DELETE",
        &format!("/v1/buckets/{b}/object?key={}", q("backups/b3/big.bin")),
        VELERO,
        b"",
    );
    assert_eq!(d.status, 200, "{}", d.text());
    assert!(
        d.json()["bytesFreed"].as_u64().unwrap() > 3 << 20,
        "{}",
        d.text()
    );
    let after_stats = call(&s, "GET", "/v1/stats", ADMIN, b"").json()["containerBytes"]
        .as_u64()
        .unwrap();
    assert!(
        after_stats + (3 << 20) <= before,
        "space came back: {before} -> {after_stats}"
    );
    get(&s, b, "backups/b3/big.bin").assert_error(404, "unknown_object");
    call(
        &s,
        "DELETE",
        &format!("/v1/buckets/{b}/object?key={}", q("backups/b3/big.bin")),
        VELERO,
        b"",
    )
    .assert_error(404, "unknown_object");
    assert!(
        !keys(&list(&s, b, "prefix=backups%2Fb3%2F")).contains(&"backups/b3/big.bin".to_string())
    );

    // Bucket totals; a bucket never written to has none, but lists empty (an
    // older Velero plugin validates a new location by listing it first).
    let t = call(&s, "GET", &format!("/v1/buckets/{b}"), VELERO, b"").json();
    assert_eq!(t["objects"], keys_in.len());
    let empty = call(&s, "GET", "/v1/buckets/velero/empty/objects", VELERO, b"").json();
    assert_eq!(empty["objects"], serde_json::json!([]), "{empty}");
    call(&s, "GET", "/v1/buckets/velero/empty", VELERO, b"").assert_error(404, "unknown_bucket");

    // The objects survive a restart.
    let store = s.store.clone();
    drop(s.stop());
    let dir = store.parent().unwrap();
    let s = Server::start(
        &store,
        &["--token-file", dir.join("tokens").to_str().unwrap()],
    );
    assert_eq!(get(&s, b, "metadata/revision").body, b"rev-2");
    assert_eq!(keys(&list(&s, b, "")).len(), keys_in.len());
}

#[test]
fn gzip_uploads_are_stored_decompressed_and_served_compressed() {
    let (_d, s) = start();
    let b = "velero/bsl";
    let content = random(200_000, 7);
    let gz = gzip(&content);
    let r = put(&s, b, "backups/x/x-logs.gz", &gz, true);
    assert_eq!(r.status, 201, "{}", r.text());
    let j = r.json();
    assert_eq!(j["encoding"], "gzip");
    assert_eq!(j["size"], content.len());
    assert_eq!(j["uploadedBytes"], gz.len());
    assert_eq!(j["etag"], blake3::hash(&content).to_hex().to_string());
    let g = get(&s, b, "backups/x/x-logs.gz");
    assert_eq!(g.status, 200);
    assert_eq!(g.header("content-type"), Some("application/gzip"));
    assert_eq!(g.header("x-revault-encoding"), Some("gzip"));
    assert_eq!(
        gunzip(&g.body),
        content,
        "the served gzip holds the same content"
    );
    let raw = call(
        &s,
        "GET",
        &format!(
            "/v1/buckets/{b}/object?key={}&decoded=true",
            q("backups/x/x-logs.gz")
        ),
        VELERO,
        b"",
    );
    assert_eq!(raw.body, content);
    assert_eq!(
        raw.header("content-length"),
        Some(content.len().to_string().as_str())
    );

    // Not gzip: refused, nothing stored, the old content stays.
    put(&s, b, "backups/x/x-logs.gz", b"plain text, not gzip", true).assert_error(400, "bad_gzip");
    assert_eq!(gunzip(&get(&s, b, "backups/x/x-logs.gz").body), content);
    // A body cut short stores nothing either.
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "PUT /v1/buckets/velero/bsl/object?key=cut HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {VELERO}\r\nContent-Length: 5000000\r\n\r\n"
    )
    .unwrap();
    c.write_all(&random(100_000, 1)).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    server::read_response(c)
        .unwrap()
        .assert_error(400, "cancelled");
    get(&s, b, "cut").assert_error(404, "unknown_object");
    assert_eq!(versions(&s, b).len(), 1);
}

#[test]
fn signed_urls_read_one_object_without_a_token() {
    let (d, s) = start();
    let b = "velero/bsl";
    let content = random(50_000, 3);
    assert_eq!(
        put(&s, b, "backups/x/x.tar.gz", &gzip(&content), true).status,
        201
    );
    let sign = |token: &str, body: &str| {
        call(
            &s,
            "POST",
            &format!("/v1/buckets/{b}/signed-url"),
            token,
            body.as_bytes(),
        )
    };
    let r = sign(
        VELERO,
        r#"{"key": "backups/x/x.tar.gz", "ttlSeconds": 600}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let url = r.json()["url"].as_str().unwrap().to_string();
    assert!(url.starts_with("/v1/signed/velero/bsl?"), "{url}");
    // No Authorization header: the signature is the credential.
    let g = s.request("GET", &url, &[], b"");
    assert_eq!(g.status, 200, "{}", g.text());
    assert_eq!(gunzip(&g.body), content);
    assert!(
        g.header("content-encoding").is_none(),
        "served as a .gz file, not transfer-encoded"
    );

    // Tampering with any part breaks it.
    let tampered = url.replace("x.tar.gz", "y.tar.gz");
    s.request("GET", &tampered, &[], b"")
        .assert_error(403, "forbidden");
    let later = url.replacen("expires=", "expires=9", 1);
    s.request("GET", &later, &[], b"")
        .assert_error(403, "forbidden");
    s.request(
        "GET",
        "/v1/signed/velero/bsl?key=k&expires=1&id=zz&sig=00",
        &[],
        b"",
    )
    .assert_error(400, "invalid_argument");

    // Expiry.
    let short = sign(VELERO, r#"{"key": "backups/x/x.tar.gz", "ttlSeconds": 1}"#).json()["url"]
        .as_str()
        .unwrap()
        .to_string();
    std::thread::sleep(Duration::from_millis(2100));
    let e = s.request("GET", &short, &[], b"");
    e.assert_error(403, "forbidden");
    assert!(e.text().contains("expired"), "{}", e.text());

    // Scope, bad requests.
    sign(OTHER, r#"{"key": "backups/x/x.tar.gz"}"#).assert_error(403, "forbidden");
    sign(
        VELERO,
        r#"{"key": "backups/x/x.tar.gz", "ttlSeconds": 86400}"#,
    )
    .assert_error(400, "invalid_argument");
    sign(VELERO, r#"{"key": "missing"}"#).assert_error(404, "unknown_object");
    sign(VELERO, r#"{"key": "k", "other": 1}"#).assert_error(400, "bad_json");

    // Revoking the token that signed a URL revokes the URL.
    std::fs::write(
        d.path().join("tokens"),
        format!("{ADMIN} *\n{OTHER} team-b\n"),
    )
    .unwrap();
    s.wait_for("the token file reload", Duration::from_secs(10), |s| {
        s.request("GET", &url, &[], b"").status == 403
    });
}

#[test]
fn scopes_and_bad_input_get_clear_errors() {
    let (_d, s) = start();
    // Scope: a token for team-b cannot touch velero's bucket.
    call(
        &s,
        "PUT",
        "/v1/buckets/velero/bsl/object?key=k",
        OTHER,
        b"x",
    )
    .assert_error(403, "forbidden");
    call(&s, "GET", "/v1/buckets/velero/bsl/objects", OTHER, b"").assert_error(403, "forbidden");
    s.request("GET", "/v1/buckets/velero/bsl/objects", &[], b"")
        .assert_error(401, "unauthorized");

    let p = |path: &str| call(&s, "PUT", path, VELERO, b"x");
    p("/v1/buckets/velero/bsl/object").assert_error(400, "bad_query");
    p("/v1/buckets/velero/bsl/object?key=").assert_error(400, "bad_key");
    p("/v1/buckets/velero/bsl/object?key=a%0Ab").assert_error(400, "bad_key");
    p(&format!(
        "/v1/buckets/velero/bsl/object?key={}",
        "k".repeat(1025)
    ))
    .assert_error(400, "bad_key");
    p("/v1/buckets/velero/bsl/object?key=k&encoding=zip").assert_error(400, "invalid_argument");
    p("/v1/buckets/velero/bsl/object?key=k&colour=red").assert_error(400, "bad_query");
    p("/v1/buckets/velero/Bad_Bucket/object?key=k").assert_error(400, "bad_bucket_name");
    call(&s, "GET", "/v1/buckets/Velero/bsl/objects", VELERO, b"")
        .assert_error(400, "bad_bucket_name");
    call(
        &s,
        "GET",
        "/v1/buckets/velero/bsl/objects?limit=0",
        VELERO,
        b"",
    )
    .assert_error(400, "invalid_argument");
    call(
        &s,
        "GET",
        "/v1/buckets/velero/bsl/object?key=nothing",
        VELERO,
        b"",
    )
    .assert_error(404, "unknown_object");

    // Buckets and backup series do not mix.
    let r = backup(&s, "velero/db", "", b"a backup");
    assert_eq!(r.status, 201, "{}", r.text());
    call(
        &s,
        "PUT",
        "/v1/buckets/velero/db/object?key=k",
        VELERO,
        b"x",
    )
    .assert_error(409, "not_a_bucket");
    assert_eq!(put(&s, "velero/bsl", "k", b"x", false).status, 201);
    backup(&s, "velero/bsl", "", b"a backup").assert_error(409, "bucket_series");

    // Deleting the bucket's series deletes its objects.
    let r = call(&s, "DELETE", "/v1/series/velero/bsl", VELERO, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    get(&s, "velero/bsl", "k").assert_error(404, "unknown_object");
    call(&s, "GET", "/v1/buckets/velero/bsl", VELERO, b"").assert_error(404, "unknown_bucket");
    assert_eq!(put(&s, "velero/bsl", "k", b"again", false).status, 201);
}

#[test]
fn a_running_backup_reports_its_progress() {
    let (_d, s) = start();
    let idle = call(&s, "GET", "/v1/series/velero/db/backup", VELERO, b"").json();
    assert_eq!(idle["running"], false);
    let mut child = slow_push(&s.url(), "velero/db", Some(VELERO));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&random(24 << 20, 5)).unwrap();
    stdin.flush().unwrap();
    s.wait_for(
        "progress of the running backup",
        Duration::from_secs(60),
        |s| {
            let j = call(s, "GET", "/v1/series/velero/db/backup", VELERO, b"").json();
            j["running"] == true && j["logicalBytes"].as_u64().unwrap_or(0) >= 8 << 20
        },
    );
    drop(stdin);
    let o = wait_child(child, Duration::from_secs(60));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let done = call(&s, "GET", "/v1/series/velero/db/backup", VELERO, b"").json();
    assert_eq!(done["running"], false);
    call(&s, "GET", "/v1/series/velero/db/backup", OTHER, b"").assert_error(403, "forbidden");
}

// ---- what gzip does to dedup ------------------------------------------------------------

/// A Kubernetes-like JSON object (what Velero writes per resource).
fn resource(kind: &str, ns: &str, name: &str, generation: u64, rng_seed: u64) -> Vec<u8> {
    let mut r = ChaCha8Rng::seed_from_u64(rng_seed);
    let uid: String = (0..32)
        .map(|_| format!("{:x}", r.random_range(0..16u8)))
        .collect();
    let words = [
        "app", "tier", "backend", "frontend", "cache", "db", "worker", "api", "v1", "prod",
    ];
    let mut labels = String::new();
    for i in 0..r.random_range(2..6) {
        labels += &format!(
            "\"label-{i}\":\"{}\",",
            words[r.random_range(0..words.len())]
        );
    }
    let data_len = r.random_range(400..6000);
    let data: String = (0..data_len)
        .map(|_| (b'A' + r.random_range(0..58u8)) as char)
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    // What changes between backups: the resource version and the status.
    let mut s = ChaCha8Rng::seed_from_u64(rng_seed ^ generation.wrapping_mul(0x9e37_79b9));
    let rv: u64 = s.random_range(1_000_000..9_000_000);
    format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"{kind}\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"{ns}\",\
\"uid\":\"{uid}\",\"resourceVersion\":\"{rv}\",\"labels\":{{{}}},\"managedFields\":[{{\"manager\":\"kubectl\",\
\"operation\":\"Update\",\"time\":\"2026-01-0{}T10:00:00Z\"}}]}},\"spec\":{{\"data\":\"{data}\"}},\
\"status\":{{\"observedGeneration\":{generation},\"phase\":\"Running\"}}}}",
        labels.trim_end_matches(','),
        1 + generation % 9
    )
    .into_bytes()
}

/// One Velero-like backup tarball: `resources/<kind>/namespaces/<ns>/<name>.json`
/// for every object, with every header's mtime set to the backup's time.
fn velero_tarball(day: u64, objects: usize, churn: f64) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let kinds = [
        "configmaps",
        "secrets",
        "deployments.apps",
        "services",
        "pods",
        "persistentvolumeclaims",
    ];
    for i in 0..objects {
        let kind = kinds[i % kinds.len()];
        let ns = format!("team-{}", i % 7);
        let name = format!("obj-{i}");
        // Each day a fraction of the objects change (new resourceVersion, status).
        let generation = (0..=day)
            .filter(|d| *d == 0 || pick_changed(i, *d, churn))
            .count() as u64;
        let body = resource(kind, &ns, &name, generation, i as u64);
        let mut h = tar::Header::new_ustar();
        h.set_path(format!("resources/{kind}/namespaces/{ns}/{name}.json"))
            .unwrap();
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(1_767_225_600 + day * 86_400 + i as u64 % 3);
        h.set_cksum();
        b.append(&h, body.as_slice()).unwrap();
    }
    let v = b"1.1.0";
    let mut h = tar::Header::new_ustar();
    h.set_path("metadata/version").unwrap();
    h.set_size(v.len() as u64);
    h.set_mode(0o755);
    h.set_mtime(1_767_225_600 + day * 86_400);
    h.set_cksum();
    b.append(&h, v.as_slice()).unwrap();
    b.into_inner().unwrap()
}

fn pick_changed(i: usize, day: u64, churn: f64) -> bool {
    let mut r = ChaCha8Rng::seed_from_u64((i as u64) << 20 | day);
    r.random::<f64>() < churn
}

fn sum(vs: &[serde_json::Value], field: &str) -> u64 {
    vs.iter().map(|v| v[field].as_u64().unwrap()).sum()
}

#[test]
fn gzip_tarballs_dedup_only_once_decompressed_and_split_per_member() {
    let (_d, s) = start();
    let days = 10;
    let objects = 800;
    let (mut logical, mut uploaded) = (0u64, 0u64);
    for day in 0..days {
        let tar = velero_tarball(day, objects, 0.03);
        let gz = gzip(&tar);
        logical += tar.len() as u64;
        uploaded += gz.len() as u64;
        let key = format!("backups/daily-{day}/daily-{day}.tar.gz");
        // (a) the gzip bytes as they are
        assert_eq!(put(&s, "velero/raw", &key, &gz, false).status, 201);
        // (b) decompressed, as one stream (no tar awareness), chunk and segment units
        for (series, unit) in [
            ("velero/plain-chunk", "chunk"),
            ("velero/plain-segment", "segment"),
        ] {
            let r = backup(&s, series, &format!("?unit={unit}"), &tar);
            assert_eq!(r.status, 201, "{}", r.text());
        }
        // (c) the object API with encoding=gzip: decompressed and split per tar member
        let r = put(&s, "velero/bsl", &key, &gz, true);
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["tarMembers"], objects + 1);
        // Every stored tarball reads back as its exact content.
        let back = call(
            &s,
            "GET",
            &format!("/v1/buckets/velero/bsl/object?key={}&decoded=true", q(&key)),
            VELERO,
            b"",
        );
        assert_eq!(back.body, tar);
    }
    let mut rows = Vec::new();
    for (what, series) in [
        ("gzip bytes as uploaded", "velero/raw"),
        ("decompressed, one stream, chunk unit", "velero/plain-chunk"),
        (
            "decompressed, one stream, segment unit",
            "velero/plain-segment",
        ),
        (
            "object API, encoding=gzip (decompressed, split per member)",
            "velero/bsl",
        ),
    ] {
        let vs = versions(&s, series);
        assert_eq!(vs.len() as u64, days);
        rows.push((what, sum(&vs, "newBytes"), sum(&vs, "storedBytes")));
    }
    println!(
        "\n{days} daily Velero-like tarballs of {objects} objects, 3% changing per day: {:.1} MiB of tar, {:.1} MiB of gzip uploaded",
        logical as f64 / 1048576.0,
        uploaded as f64 / 1048576.0
    );
    println!("| stored as | unique bytes | container bytes | vs gzip uploaded |");
    println!("| --- | --- | --- | --- |");
    for (what, new, stored) in &rows {
        println!(
            "| {what} | {:.2} MiB | {:.2} MiB | {:.2}x smaller |",
            *new as f64 / 1048576.0,
            *stored as f64 / 1048576.0,
            uploaded as f64 / *stored as f64
        );
    }
    let stored = |i: usize| rows[i].2;
    // Gzip bytes barely dedup: storing them costs about what was uploaded.
    assert!(
        stored(0) * 10 > uploaded * 9,
        "raw gzip: {} of {uploaded}",
        stored(0)
    );
    // Decompressing alone helps little: every member's header has a new mtime.
    // Splitting per member makes unchanged members dedup.
    assert!(
        stored(3) * 3 < stored(1),
        "split {} vs plain {}",
        stored(3),
        stored(1)
    );
    assert!(
        stored(3) * 4 < uploaded,
        "split {} vs uploaded {uploaded}",
        stored(3)
    );
}
