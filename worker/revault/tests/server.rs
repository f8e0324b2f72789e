//! `revault serve` driven by the real `revault push` / `pull` clients and by
//! raw HTTP: round trips, one writer per series, interrupted uploads, drain
//! on SIGTERM, auth scopes, bad input, TLS, scheduled retention.

mod common;

use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Duration;

use common::server::{client, client_ok, slow_push, wait_child, Server};
use common::tree::{make_tree, tree_listing};
use common::*;
use sha2::{Digest, Sha256};

fn push_args<'a>(url: &'a str, series: &'a str, input: &'a str) -> Vec<&'a str> {
    vec!["push", "--server", url, "--series", series, input]
}

fn pull_to<'a>(url: &'a str, series: &'a str, output: &'a str) -> Vec<&'a str> {
    vec!["pull", "--server", url, "--series", series, "-o", output]
}

#[test]
fn stream_and_directory_round_trips_are_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    let url = srv.url();

    // A file (Content-Length known) and the same data with changes.
    let input = dir.path().join("in.bin");
    let mut data = random(6 << 20, 1);
    data.extend(vec![0u8; 1 << 20]);
    std::fs::write(&input, &data).unwrap();
    let out = client_ok(
        &[
            &push_args(&url, "default/db", input.to_str().unwrap())[..],
            &["--json"],
        ]
        .concat(),
        None,
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["version"], 1);
    assert_eq!(rep["logicalBytes"], data.len());
    data[100..200].fill(9);
    std::fs::write(&input, &data).unwrap();
    client_ok(
        &push_args(&url, "default/db", input.to_str().unwrap()),
        None,
    );

    let got = dir.path().join("out.bin");
    let out = client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--series",
            "default/db",
            "--version",
            "1",
            "-o",
            got.to_str().unwrap(),
            "--json",
        ],
        None,
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["version"], 1);
    assert!(
        rep["server"]["containerReads"].as_u64().unwrap() >= 1,
        "{rep}"
    );
    assert!(
        rep["server"]["speedFactor"].as_f64().unwrap() > 0.0,
        "{rep}"
    );
    assert_eq!(rep["server"]["state"], "done");
    assert_eq!(rep["transfer"], "blocks");
    let mut v1 = data.clone();
    v1[100..200].copy_from_slice(&random(6 << 20, 1)[100..200]);
    assert_eq!(rep["bytes"], v1.len());
    assert_eq!(sha256_file(&got), hex::encode(Sha256::digest(&v1)));
    // The same version assembled by the server.
    let got_bytes = dir.path().join("out-bytes.bin");
    let mut args = pull_to(&url, "default/db", got_bytes.to_str().unwrap());
    args.extend(["--version", "1", "--transfer", "bytes"]);
    client_ok(&args, None);
    assert_eq!(sha256_file(&got_bytes), hex::encode(Sha256::digest(&v1)));
    // latest to stdout
    let out = client_ok(&["pull", "--server", &url, "--series", "default/db"], None);
    assert_eq!(out.stdout, data);
    // latest into a FIFO (like -o /dev/null): written in place, not replaced
    let fifo = dir.path().join("pipe");
    let reader = fifo_reader(&fifo);
    client_ok(&pull_to(&url, "default/db", fifo.to_str().unwrap()), None);
    assert!(reader.join().unwrap() == data);
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // no partial file is left beside the output
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.to_string_lossy().contains("revault-partial")),
        "{names:?}"
    );

    // stdin (chunked upload)
    let mut p = slow_push(&url, "default/stdin", None);
    let body = random(2 << 20, 3);
    p.stdin.take().unwrap().write_all(&body).unwrap();
    let o = wait_child(p, Duration::from_secs(60));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--series",
            "default/stdin",
            "--version",
            "latest",
        ],
        None,
    );
    assert_eq!(out.stdout, body);

    // A directory: sent as a tar, kept as a tree, extracted on pull.
    let tree = dir.path().join("tree");
    make_tree(&tree);
    client_ok(
        &push_args(&url, "default/files", tree.to_str().unwrap()),
        None,
    );
    let back = dir.path().join("back");
    client_ok(
        &pull_to(&url, "default/files", &format!("{}/", back.display())),
        None,
    );
    assert_eq!(tree_listing(&back), tree_listing(&tree));
    // Extracted from the server's tar stream instead of assembled here.
    let back_bytes = dir.path().join("back-bytes");
    let mut args = pull_to(&url, "default/files", back_bytes.to_str().unwrap());
    args.extend(["--transfer", "bytes"]);
    std::fs::create_dir(&back_bytes).unwrap();
    client_ok(&args, None);
    assert_eq!(tree_listing(&back_bytes), tree_listing(&tree));
    // The same version as a tar to a file.
    let tar = dir.path().join("files.tar");
    client_ok(&pull_to(&url, "default/files", tar.to_str().unwrap()), None);
    let mut names: Vec<String> = tar::Archive::new(std::fs::File::open(&tar).unwrap())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.iter().any(|n| n == "etc/secret"), "{names:?}");
    // A stream version cannot become a directory.
    let o = client(
        &pull_to(
            &url,
            "default/db",
            &format!("{}/", dir.path().join("nodir").display()),
        ),
        None,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("single stream"));

    // Listings and details.
    let r = srv.get("/v1/series/default/db", None);
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["versions"], 2);
    assert_eq!(j["versionList"][1]["kind"], "stream");
    let r = srv.get("/v1/series/default/files/versions", None).json();
    assert_eq!(r[0]["kind"], "tree");
    let r = srv.get("/v1/series", None).json();
    assert_eq!(r.as_array().unwrap().len(), 3);

    // Metrics saw it all.
    assert!(srv.metric("revault_received_bytes_total").unwrap() >= (data.len() * 2) as f64);
    assert!(srv.metric("revault_sent_bytes_total").unwrap() >= data.len() as f64);
    assert!(srv.metric("revault_container_reads_total").unwrap() >= 1.0);
    assert!(srv.metric("revault_restore_speed_factor_count").unwrap() >= 3.0);
    assert!(
        srv.metric("revault_series_dedup_ratio{series=\"default/db\"}")
            .unwrap()
            > 1.5
    );
    let m = srv.get("/metrics", None);
    assert!(m.header("content-type").unwrap().contains("openmetrics"));
    srv.stop();
}

#[test]
fn a_second_writer_of_a_series_gets_409() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    let url = srv.url();
    let mut first = slow_push(&url, "team/db", None);
    let mut stdin = first.stdin.take().unwrap();
    let part1 = random(1 << 20, 11);
    stdin.write_all(&part1).unwrap();
    srv.wait_for("the first backup to start", Duration::from_secs(30), |s| {
        s.metric("revault_inflight_backups").unwrap_or(0.0) >= 1.0
    });
    // The real client reports the conflict ...
    let small = dir.path().join("small");
    std::fs::write(&small, random(100_000, 12)).unwrap();
    let o = client(
        &[
            "push",
            "--server",
            &url,
            "--series",
            "team/db",
            small.to_str().unwrap(),
        ],
        None,
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("already has a backup in progress"), "{err}");
    // ... which is a 409 with a JSON body.
    let r = srv.request(
        "PUT",
        "/v1/series/team/db/versions",
        &[("Content-Type", "application/octet-stream")],
        b"x",
    );
    r.assert_error(409, "series_busy");
    // Another series is not blocked.
    client_ok(
        &[
            "push",
            "--server",
            &url,
            "--series",
            "team/other",
            small.to_str().unwrap(),
        ],
        None,
    );
    let part2 = random(1 << 20, 13);
    stdin.write_all(&part2).unwrap();
    drop(stdin);
    let o = wait_child(first, Duration::from_secs(60));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = client_ok(&["pull", "--server", &url, "--series", "team/db"], None);
    assert_eq!(out.stdout, [part1, part2].concat());
    assert_eq!(
        srv.get("/v1/series/team/db/versions", None)
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    srv.stop();
}

#[test]
fn an_interrupted_push_leaves_no_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let srv = Server::start(&store, &[]);
    let url = srv.url();

    // Kill the client mid-upload.
    let mut p = slow_push(&url, "default/cut", None);
    let mut stdin = p.stdin.take().unwrap();
    stdin.write_all(&random(3 << 20, 21)).unwrap();
    srv.wait_for(
        "the upload to reach the server",
        Duration::from_secs(30),
        |s| s.metric("revault_received_bytes_total").unwrap_or(0.0) >= 1.0,
    );
    p.kill().unwrap();
    let _ = p.wait();
    drop(stdin);
    srv.wait_for("the backup to be discarded", Duration::from_secs(30), |s| {
        s.metric("revault_backups_total{result=\"error\"}")
            .unwrap_or(0.0)
            >= 1.0
            && s.metric("revault_inflight_backups").unwrap_or(1.0) == 0.0
    });
    srv.get("/v1/series/default/cut/versions", None)
        .assert_error(404, "unknown_series");

    // A body shorter than its Content-Length: 400, no version.
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    write!(
        s,
        "PUT /v1/series/default/short/versions HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 5000000\r\n\r\n"
    )
    .unwrap();
    s.write_all(&random(100_000, 22)).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let r = server::read_response(s).unwrap();
    r.assert_error(400, "cancelled");
    srv.get("/v1/series/default/short/versions", None)
        .assert_error(404, "unknown_series");

    // A chunked body cut before its last chunk: no version either.
    let mut s = std::net::TcpStream::connect(&srv.addr).unwrap();
    write!(
        s,
        "PUT /v1/series/default/chunky/versions HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    write!(s, "{:x}\r\n", 65536).unwrap();
    s.write_all(&random(65536, 23)).unwrap();
    s.write_all(b"\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let r = server::read_response(s).unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    srv.get("/v1/series/default/chunky/versions", None)
        .assert_error(404, "unknown_series");

    // A complete version still works, and the store checks clean offline.
    client_ok(
        &["push", "--server", &url, "--series", "default/cut", "-"],
        None,
    );
    srv.stop();
    let l = ok_json(&["list", "--store", store.to_str().unwrap()]);
    assert_eq!(l.as_array().unwrap().len(), 1, "{l}");
    assert_check_ok(&store);
}

#[test]
fn a_pull_that_breaks_off_leaves_nothing_under_the_output_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let srv = Server::start(&store, &[]);
    let url = srv.url();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, random(6 << 20, 31)).unwrap();
    client_ok(
        &push_args(&url, "default/db", input.to_str().unwrap()),
        None,
    );
    // Flip a byte inside the largest container: the server's restore finds
    // the bad checksum and ends the body with an error.
    let mut files = files_under(&store.join("data"));
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let victim = files.last().expect("a container");
    let mut bytes = std::fs::read(victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(victim, bytes).unwrap();

    let out = dir.path().join("out.bin");
    let o = client(&pull_to(&url, "default/db", out.to_str().unwrap()), None);
    assert!(!o.status.success(), "a corrupt restore was pulled");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nothing was written"), "{err}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("out.bin")),
        "left behind: {names:?}"
    );
}

#[test]
fn sigterm_drains_in_flight_backups() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");

    // Within the grace period: the backup commits, then the server exits.
    let srv = Server::start(&store, &["--grace-period", "30s", "--shutdown-delay", "1s"]);
    let url = srv.url();
    let mut p = slow_push(&url, "default/drain", None);
    let mut stdin = p.stdin.take().unwrap();
    let a = random(2 << 20, 31);
    stdin.write_all(&a).unwrap();
    srv.wait_for("the backup to start", Duration::from_secs(30), |s| {
        s.metric("revault_inflight_backups").unwrap_or(0.0) >= 1.0
    });
    srv.signal(libc::SIGTERM);
    // Readiness fails at once, while the listener still answers, saying the server is on its
    // way down (clients wait for its replacement), the pod's probe (exclude=writes) too.
    let mut refusal = None;
    srv.wait_for("readiness to fail", Duration::from_secs(5), |s| {
        match s.try_request("GET", "/readyz", &[], b"") {
            Ok(r) if r.status == 503 => refusal = Some(r),
            _ => {}
        }
        refusal.is_some()
    });
    refusal.unwrap().assert_error(503, "shutting_down");
    // The listener may be gone by now (--shutdown-delay 1s): only an answer is checked.
    if let Ok(r) = srv.try_request("GET", "/readyz?exclude=writes", &[], b"") {
        r.assert_error(503, "shutting_down");
    }
    let b = random(2 << 20, 32);
    stdin.write_all(&b).unwrap();
    drop(stdin);
    let o = wait_child(p, Duration::from_secs(60));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut srv = srv;
    let st = srv.wait(Duration::from_secs(30));
    assert!(st.success(), "{st}: {}", srv.log_text());
    drop(srv);

    // Past the grace period: the unfinished backup is discarded.
    let srv = Server::start(&store, &["--grace-period", "1s"]);
    let url = srv.url();
    let mut p = slow_push(&url, "default/drain", None);
    let mut stdin = p.stdin.take().unwrap();
    stdin.write_all(&random(2 << 20, 33)).unwrap();
    srv.wait_for("the backup to start", Duration::from_secs(30), |s| {
        s.metric("revault_inflight_backups").unwrap_or(0.0) >= 1.0
    });
    srv.signal(libc::SIGTERM);
    let mut srv = srv;
    let st = srv.wait(Duration::from_secs(30));
    assert!(st.success(), "{st}: {}", srv.log_text());
    assert!(
        srv.log_text().contains("grace period over"),
        "{}",
        srv.log_text()
    );
    drop(stdin);
    let o = wait_child(p, Duration::from_secs(30));
    assert!(!o.status.success(), "the push should have failed");
    drop(srv);

    // Exactly the committed version is there, and it is intact.
    let srv = Server::start(&store, &[]);
    let vs = srv.get("/v1/series/default/drain/versions", None).json();
    assert_eq!(vs.as_array().unwrap().len(), 1, "{vs}");
    let out = client_ok(
        &["pull", "--server", &srv.url(), "--series", "default/drain"],
        None,
    );
    assert_eq!(out.stdout, [a, b].concat());
    srv.stop();
    assert_check_ok(&store);
}

#[test]
fn tokens_are_checked_and_scoped_to_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "# admin, then two teams\nadmin-0123456789 *\nteam-a-token-0001 team-a\nteam-b-token-0002 team-b,team-c\n",
    )
    .unwrap();
    let srv = Server::start(
        &dir.path().join("store"),
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--token-reload",
            "200ms",
        ],
    );
    let url = srv.url();
    let (admin, ta, tb) = (
        Some("admin-0123456789"),
        Some("team-a-token-0001"),
        Some("team-b-token-0002"),
    );
    let f = dir.path().join("f");
    std::fs::write(&f, random(500_000, 41)).unwrap();
    let fp = f.to_str().unwrap();

    // Missing and wrong tokens: 401, through the client and raw.
    let o = client(
        &["push", "--server", &url, "--series", "team-a/db", fp],
        None,
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing bearer token"));
    let o = client(
        &["push", "--server", &url, "--series", "team-a/db", fp],
        Some("wrong-token-xyz"),
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("invalid bearer token"));
    srv.get("/v1/series", None)
        .assert_error(401, "unauthorized");
    srv.get("/v1/series", Some("wrong-token-xyz"))
        .assert_error(401, "unauthorized");
    srv.request(
        "GET",
        "/v1/series",
        &[("Authorization", "Basic YWRtaW46eA==")],
        b"",
    )
    .assert_error(401, "unauthorized");
    // Health, readiness and metrics are open.
    for p in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(srv.get(p, None).status, 200, "{p}");
    }

    // In scope: fine. Out of scope: 403, and nothing is created.
    client_ok(&["push", "--server", &url, "--series", "team-a/db", fp], ta);
    client_ok(&["push", "--server", &url, "--series", "team-b/db", fp], tb);
    let o = client(&["push", "--server", &url, "--series", "team-b/x", fp], ta);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("may not access namespace team-b"));
    // The client reads its token from a file too.
    let tf = dir.path().join("client-token");
    std::fs::write(&tf, "# the token\nteam-a-token-0001\n").unwrap();
    client_ok(
        &[
            "push",
            "--server",
            &url,
            "--token-file",
            tf.to_str().unwrap(),
            "--series",
            "team-a/db",
            fp,
        ],
        None,
    );

    // Listings are filtered; reads across namespaces are refused.
    let names = |t: Option<&str>, q: &str| -> Vec<String> {
        srv.get(&format!("/v1/series{q}"), t)
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["series"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(ta, ""), vec!["team-a/db"]);
    assert_eq!(names(tb, ""), vec!["team-b/db"]);
    assert_eq!(names(admin, "").len(), 2);
    srv.get("/v1/series?namespace=team-a", tb)
        .assert_error(403, "forbidden");
    assert_eq!(names(tb, "?namespace=team-c"), Vec::<String>::new());
    for path in [
        "/v1/series/team-a/db",
        "/v1/series/team-a/db/versions",
        "/v1/series/team-a/db/versions/latest",
        "/v1/series/team-a/nonexistent/versions/1",
    ] {
        srv.get(path, tb).assert_error(403, "forbidden");
    }
    let o = client(&["pull", "--server", &url, "--series", "team-a/db"], tb);
    assert!(!o.status.success());
    let bearer = |t: &str| format!("Bearer {t}");
    let del = srv.request(
        "DELETE",
        "/v1/series/team-a/db",
        &[("Authorization", &bearer(tb.unwrap()))],
        b"",
    );
    del.assert_error(403, "forbidden");
    // Store-wide operations need `*`.
    srv.get("/v1/stats", ta).assert_error(403, "forbidden");
    srv.request(
        "POST",
        "/v1/gc",
        &[("Authorization", &bearer(ta.unwrap()))],
        b"",
    )
    .assert_error(403, "forbidden");
    let st = srv.get("/v1/stats", admin);
    assert_eq!(st.status, 200);
    assert_eq!(st.json()["versions"], 3);
    // Restore reports belong to the token that made them.
    let r = srv.get("/v1/series/team-a/db/versions/1", ta);
    assert_eq!(r.status, 200);
    let id = r.header("x-revault-restore-id").unwrap().to_string();
    srv.get(&format!("/v1/restores/{id}"), tb)
        .assert_error(404, "unknown_restore");
    let rep = srv.get(&format!("/v1/restores/{id}"), ta).json();
    assert_eq!(rep["state"], "done");
    assert_eq!(rep["series"], "team-a/db");

    // Rotation: the file changes, the server follows.
    std::fs::write(&tokens, "admin-0123456789 *\nteam-a-rotated-0003 team-a\n").unwrap();
    srv.wait_for(
        "the token file to be reloaded",
        Duration::from_secs(10),
        |s| s.get("/v1/series", Some("team-a-rotated-0003")).status == 200,
    );
    srv.get("/v1/series", ta).assert_error(401, "unauthorized");
    srv.get("/v1/series", tb).assert_error(401, "unauthorized");
    srv.stop();
}

#[test]
fn bad_input_gets_json_4xx_and_never_a_version() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    let oct = [("Content-Type", "application/octet-stream")];
    srv.get("/nope", None).assert_error(404, "not_found");
    srv.get("/v1/series/default/db/versions/1/extra", None)
        .assert_error(404, "not_found");
    srv.request("POST", "/v1/series", &[], b"")
        .assert_error(405, "method_not_allowed");
    srv.request("DELETE", "/v1/stats", &[], b"")
        .assert_error(405, "method_not_allowed");
    for p in [
        "/v1/series/Default/db",
        "/v1/series/default/db_x/versions",
        "/v1/series/-a/b",
        "/v1/series/a/b%2Fc",
    ] {
        srv.get(p, None).assert_error(400, "bad_series_name");
    }
    srv.get("/v1/series?namespace=Bad_NS", None)
        .assert_error(400, "bad_series_name");
    srv.get("/v1/series?bogus=1", None)
        .assert_error(400, "bad_query");
    srv.get("/v1/series/default/missing", None)
        .assert_error(404, "unknown_series");
    assert_eq!(
        srv.request("PUT", "/v1/series/default/db/versions", &oct, b"hello")
            .status,
        201
    );
    for v in ["0", "-1", "latest2", "x", "99999999999", "4294967296"] {
        let r = srv.get(&format!("/v1/series/default/db/versions/{v}"), None);
        assert_eq!(r.status, 400, "{v}: {}", r.text());
    }
    srv.get("/v1/series/default/db/versions/7", None)
        .assert_error(404, "unknown_version");
    srv.get("/v1/series/default/db/versions/1?cacheMib=0", None)
        .assert_error(400, "invalid_argument");
    srv.get("/v1/series/default/db/versions/1?cacheMib=abc", None)
        .assert_error(400, "bad_query");
    // The previous release's spelling, from a restore Job older than its worker.
    srv.get("/v1/series/default/db/versions/1?cache_mib=0", None)
        .assert_error(400, "invalid_argument");
    srv.get("/v1/series/default/db/versions/1?cache=mru", None)
        .assert_error(400, "invalid_argument");
    srv.get("/v1/restores/XYZ", None)
        .assert_error(400, "invalid_argument");
    srv.get("/v1/restores/abc", None)
        .assert_error(404, "unknown_restore");
    // Uploads: media types, units, times, bad tar.
    srv.request(
        "PUT",
        "/v1/series/default/db/versions",
        &[("Content-Type", "text/plain")],
        b"x",
    )
    .assert_error(415, "unsupported_media_type");
    srv.request("PUT", "/v1/series/default/db/versions", &[], b"x")
        .assert_error(415, "unsupported_media_type");
    srv.request(
        "PUT",
        "/v1/series/default/db/versions?unit=block",
        &oct,
        b"x",
    )
    .assert_error(400, "invalid_argument");
    srv.request(
        "PUT",
        "/v1/series/default/db/versions?unit=chunk",
        &oct,
        b"x",
    )
    .assert_error(400, "unit_mismatch");
    srv.request(
        "PUT",
        "/v1/series/default/db/versions?time=yesterday",
        &oct,
        b"x",
    )
    .assert_error(400, "invalid_argument");
    srv.request(
        "PUT",
        "/v1/series/default/t/versions",
        &[("Content-Type", "application/x-tar")],
        &[7u8; 2048],
    )
    .assert_error(400, "invalid_argument");
    srv.get("/v1/series/default/t", None)
        .assert_error(404, "unknown_series");
    // JSON bodies.
    let js = [("Content-Type", "application/json")];
    // Calendar retention: a zone nobody has, a count of zero; nothing is stored.
    let r = srv.request(
        "PUT",
        "/v1/series/default/db/retention",
        &js,
        b"{\"keepDaily\": 7, \"timezone\": \"Mars/Olympus_Mons\"}",
    );
    r.assert_error(400, "invalid_argument");
    assert!(r.text().contains("Mars/Olympus_Mons"), "{}", r.text());
    srv.request(
        "PUT",
        "/v1/series/default/db/retention",
        &js,
        b"{\"keepWeekly\": 0}",
    )
    .assert_error(400, "invalid_argument");
    let kept = srv.get("/v1/series/default/db", None).json();
    assert!(kept["retention"]["keepDaily"].is_null(), "{kept}");
    srv.request("POST", "/v1/series/default/db/expire", &js, b"{}")
        .assert_error(400, "invalid_argument");
    srv.request(
        "POST",
        "/v1/series/default/db/expire",
        &js,
        b"{\"version\":1,\"applyRetention\":true}",
    )
    .assert_error(400, "invalid_argument");
    srv.request(
        "POST",
        "/v1/series/default/db/expire",
        &js,
        b"{\"before\":\"soon\"}",
    )
    .assert_error(400, "invalid_argument");
    srv.request(
        "POST",
        "/v1/series/default/db/expire",
        &js,
        b"{\"version\":",
    )
    .assert_error(400, "bad_json");
    srv.request(
        "POST",
        "/v1/series/default/db/expire",
        &[("Content-Type", "text/plain")],
        b"{}",
    )
    .assert_error(400, "bad_content_type");
    srv.request(
        "PUT",
        "/v1/series/default/db/retention",
        &js,
        b"{\"keep\":0}",
    )
    .assert_error(400, "invalid_argument");
    srv.request(
        "PUT",
        "/v1/series/default/db/retention",
        &js,
        b"{\"keep\":2,\"live\":3}",
    )
    .assert_error(400, "invalid_argument");
    srv.request(
        "PUT",
        "/v1/series/default/db/retention",
        &js,
        b"{\"kept\":2}",
    )
    .assert_error(400, "bad_json");
    srv.request("POST", "/v1/gc", &js, b"{\"compactBelow\":2}")
        .assert_error(400, "invalid_argument");
    // Oversized request heads: 431 (or 400), never a crash.
    let big = "x".repeat(600 << 10);
    let r = srv.request("GET", "/v1/series", &[("X-Big", &big)], b"");
    assert!(r.status == 431 || r.status == 400, "{}", r.status);
    let r = srv.request(
        "GET",
        &format!("/v1/series/default/{}", "a".repeat(600 << 10)),
        &[],
        b"",
    );
    assert!(
        r.status == 431 || r.status == 400 || r.status == 414,
        "{}",
        r.status
    );
    // Still alive, and exactly one version was created.
    assert_eq!(srv.get("/healthz", None).status, 200);
    assert_eq!(
        srv.get("/v1/series/default/db/versions", None)
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    srv.stop();
}

/// Writes a self-signed certificate for localhost and its key as DIR/NAME.crt and DIR/NAME.key.
fn self_signed(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, ck.cert.pem()).unwrap();
    std::fs::write(&k, ck.key_pair.serialize_pem()).unwrap();
    (c, k)
}

#[test]
fn https_with_a_self_signed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path(), "tls");
    let srv = Server::start(
        &dir.path().join("store"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let port = srv.addr.rsplit(':').next().unwrap().to_string();
    let url = format!("https://localhost:{port}");
    let f = dir.path().join("f");
    let data = random(3 << 20, 51);
    std::fs::write(&f, &data).unwrap();
    let ca = cert.to_str().unwrap();
    // Not trusted without the CA ...
    let o = client(
        &[
            "push",
            "--server",
            &url,
            "--series",
            "default/tls",
            f.to_str().unwrap(),
        ],
        None,
    );
    assert!(!o.status.success());
    // ... and plain HTTP to the TLS port fails too.
    assert!(srv
        .try_request("GET", "/healthz", &[], b"")
        .map(|r| r.status != 200)
        .unwrap_or(true));
    client_ok(
        &[
            "push",
            "--server",
            &url,
            "--ca-cert",
            ca,
            "--series",
            "default/tls",
            f.to_str().unwrap(),
        ],
        None,
    );
    let out = client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--ca-cert",
            ca,
            "--series",
            "default/tls",
        ],
        None,
    );
    assert_eq!(out.stdout, data);
    srv.stop();
}

/// A certificate replaced on disk (as the kubelet swaps a rotated Secret in) is served from
/// then on, without a restart: a client trusting only the new one gets in, and one trusting
/// only the old one no longer does.
#[test]
fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (old_cert, old_key) = self_signed(dir.path(), "old");
    let (new_cert, new_key) = self_signed(dir.path(), "new");
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(&old_cert, &cert).unwrap();
    std::fs::copy(&old_key, &key).unwrap();
    let srv = Server::start(
        &dir.path().join("store"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--token-reload",
            "100ms",
        ],
    );
    let port = srv.addr.rsplit(':').next().unwrap().to_string();
    let url = format!("https://localhost:{port}");
    let f = dir.path().join("f");
    let data = random(1 << 20, 52);
    std::fs::write(&f, &data).unwrap();
    let push = |ca: &Path| {
        client(
            &[
                "push",
                "--server",
                &url,
                "--ca-cert",
                ca.to_str().unwrap(),
                "--series",
                "default/rot",
                f.to_str().unwrap(),
            ],
            None,
        )
    };
    assert!(push(&old_cert).status.success());
    // Renamed over, key first, then the certificate: a pair that matches only once both are in.
    for (src, dst) in [(&new_key, &key), (&new_cert, &cert)] {
        let tmp = dst.with_extension("tmp");
        std::fs::copy(src, &tmp).unwrap();
        std::fs::rename(&tmp, dst).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !push(&new_cert).status.success() {
        assert!(
            std::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !push(&old_cert).status.success(),
        "the old certificate is still served"
    );
    let out = client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--ca-cert",
            new_cert.to_str().unwrap(),
            "--series",
            "default/rot",
        ],
        None,
    );
    assert_eq!(out.stdout, data);
    srv.stop();
}

#[test]
fn retention_runs_after_backups_and_on_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        &dir.path().join("store"),
        &["--maintenance-interval", "300ms"],
    );
    let url = srv.url();
    let js = [("Content-Type", "application/json")];
    let f = dir.path().join("f");
    let mut data = random(2 << 20, 61);
    let push = |data: &[u8], series: &str| {
        std::fs::write(&f, data).unwrap();
        client_ok(
            &[
                "push",
                "--server",
                &url,
                "--series",
                series,
                f.to_str().unwrap(),
            ],
            None,
        );
    };
    // Automatic retention: applied as each backup commits.
    let r = srv.request(
        "PUT",
        "/v1/series/default/auto/retention",
        &js,
        b"{\"keep\":2,\"live\":1,\"auto\":true}",
    );
    assert_eq!(
        r.status,
        201,
        "a retention that creates its series: {}",
        r.text()
    );
    assert_eq!(r.json()["keep"], 2);
    for i in 0..3u8 {
        data[i as usize * 1000] ^= 0xff;
        push(&data, "default/auto");
    }
    let vs = srv.get("/v1/series/default/auto/versions", None).json();
    let nums: Vec<u64> = vs
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["number"].as_u64().unwrap())
        .collect();
    assert_eq!(nums, vec![2, 3]);
    assert_eq!(vs[0]["form"], "archival");
    assert_eq!(vs[1]["form"], "live");

    // Set afterwards: the scheduler catches up.
    for _ in 0..3 {
        data[5] ^= 0x11;
        push(&data, "default/later");
    }
    // What the retention would remove, as the worker plans it (oldest first),
    // is what the scheduler then expires.
    let pending =
        |s: &Server| s.get("/v1/series/default/later", None).json()["pendingExpiry"].clone();
    assert_eq!(
        pending(&srv),
        serde_json::json!([]),
        "no retention, nothing pending"
    );
    let r = srv.request(
        "PUT",
        "/v1/series/default/later/retention",
        &js,
        b"{\"keep\":1,\"auto\":false}",
    );
    assert_eq!(
        r.status,
        200,
        "a retention of an existing series: {}",
        r.text()
    );
    assert_eq!(pending(&srv), serde_json::json!([1, 2]));
    let r = srv.request(
        "PUT",
        "/v1/series/default/later/retention",
        &js,
        b"{\"keep\":1,\"auto\":true}",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    srv.wait_for(
        "the scheduler to apply retention",
        Duration::from_secs(20),
        |s| {
            s.get("/v1/series/default/later/versions", None)
                .json()
                .as_array()
                .unwrap()
                .len()
                == 1
        },
    );
    assert_eq!(
        pending(&srv),
        serde_json::json!([]),
        "nothing left to expire"
    );
    let out = client_ok(
        &["pull", "--server", &url, "--series", "default/later"],
        None,
    );
    assert_eq!(out.stdout, data);
    assert!(
        srv.metric("revault_maintenance_duration_seconds_count{op=\"expire\"}")
            .unwrap()
            >= 2.0
    );
    assert!(
        srv.metric("revault_maintenance_duration_seconds_count{op=\"slide\"}")
            .unwrap()
            >= 2.0
    );

    // Manual operations through the API.
    let r = srv.request("POST", "/v1/series/default/auto/slide", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = srv.request(
        "POST",
        "/v1/series/default/auto/expire",
        &js,
        b"{\"version\":2}",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["expired"], serde_json::json!([2]));
    let r = srv.request(
        "DELETE",
        "/v1/series/default/auto/versions/latest",
        &[],
        b"",
    );
    assert_eq!(r.json()["expired"], serde_json::json!([3]));
    let r = srv.request("DELETE", "/v1/series/default/later", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        srv.get("/v1/series/default/later/versions", None)
            .json()
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let r = srv.request("POST", "/v1/gc", &js, b"{\"full\":true}");
    assert_eq!(r.status, 200, "{}", r.text());
    let st = srv.get("/v1/stats", None).json();
    assert_eq!(st["versions"], 0, "{st}");
    // A series emptied by DELETE takes the unit of its next backup (a BackupSeries recreated
    // under the same name may choose another); version numbers are never reused.
    let r = srv.request(
        "PUT",
        "/v1/series/default/later/versions?unit=chunk",
        &[("Content-Type", "application/octet-stream")],
        b"a new series under an old name",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let s = srv.get("/v1/series/default/later", None).json();
    assert_eq!(s["unit"], "chunk", "{s}");
    assert_eq!(s["versions"], 1, "{s}");
    assert!(s["latest"].as_u64().unwrap() > 1, "{s}");
    srv.stop();
}

/// A worker on its way down answers `shutting_down` while its Service may still route to it: a
/// push waits for the replacement (here none comes) instead of failing at once, and says why.
#[test]
fn a_push_to_a_worker_shutting_down_waits_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &["--shutdown-delay", "30s"]);
    let url = srv.url();
    srv.signal(libc::SIGTERM);
    srv.wait_for("readiness to fail", Duration::from_secs(5), |s| {
        s.try_request("GET", "/readyz", &[], b"")
            .is_ok_and(|r| r.status == 503)
    });
    let input = dir.path().join("in");
    std::fs::write(&input, b"some bytes").unwrap();
    let mut args = push_args(&url, "default/db", input.to_str().unwrap());
    args.extend(["--wait-ready", "2s"]);
    let started = std::time::Instant::now();
    let out = client(&args, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("waiting for the worker")
            && err.contains(&format!("the worker at {url} is not ready after 2s"))
            && err.contains("shutting down"),
        "{err}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "it did not wait: {err}"
    );
}

#[test]
fn a_push_to_a_starting_worker_waits_for_it_and_says_why() {
    // A backup Job whose worker pod is still opening its store (here: waiting for the store
    // lock of the pod it replaces) used to fail with "Broken pipe": the worker refused the
    // body unread. The client now asks first, waits while the worker says `starting`, and
    // sends the body once it is ready.
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let old = Server::start(&store, &[]);
    let new = Server::spawn(&store, &["--lock-wait", "60s"], &[]);
    new.get("/readyz", None).assert_error(503, "starting");
    let input = dir.path().join("in");
    std::fs::write(&input, random(3 << 20, 43)).unwrap();
    let stderr = dir.path().join("push.err");
    let url = new.url();
    let push = std::process::Command::new(bin())
        .args(push_args(&url, "default/db", input.to_str().unwrap()))
        .env("REVAULT_LOG", "warn")
        .env_remove("REVAULT_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    old.wait_for("the push to wait", Duration::from_secs(30), |_| {
        std::fs::read_to_string(&stderr).is_ok_and(|e| e.contains("waiting for the worker"))
    });
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert!(said.contains("the store is still opening"), "{said}");
    old.signal(libc::SIGKILL);
    let out = wait_child(push, Duration::from_secs(90));
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert!(out.status.success(), "the push failed: {said}");
    assert!(!said.contains("Broken pipe"), "{said}");
    let restored = dir.path().join("out");
    client_ok(
        &pull_to(&url, "default/db", restored.to_str().unwrap()),
        None,
    );
    assert_eq!(
        std::fs::read(&restored).unwrap(),
        std::fs::read(&input).unwrap()
    );
    new.stop();
}

#[test]
fn a_push_to_a_worker_that_never_starts_gives_up_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::write(&input, b"some bytes").unwrap();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut args = push_args(&url, "default/db", input.to_str().unwrap());
    args.extend(["--wait-ready", "1s"]);
    let out = client(&args, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("the worker at {url} is not ready after 1s"))
            && err.contains("cannot connect"),
        "{err}"
    );
}

#[test]
fn a_new_server_waits_for_the_store_lock_of_an_exiting_one() {
    // A force-deleted worker pod's process can still hold the store while its
    // replacement starts: the new server waits, not ready, and takes over.
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let old = Server::start(&store, &[]);
    let input = dir.path().join("in");
    std::fs::write(&input, random(1 << 20, 41)).unwrap();
    let url = old.url();
    client_ok(
        &push_args(&url, "default/db", input.to_str().unwrap()),
        None,
    );

    let store2 = store.clone();
    let new = std::thread::spawn(move || Server::start(&store2, &["--lock-wait", "60s"]));
    old.wait_for("the new server to wait", Duration::from_secs(30), |_| {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
            .any(|log| log.contains("the store is locked; waiting for its holder to exit"))
    });
    old.signal(libc::SIGKILL);
    let new = new.join().expect("the new server becomes ready");
    let out = dir.path().join("out");
    client_ok(
        &pull_to(&new.url(), "default/db", out.to_str().unwrap()),
        None,
    );
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&input).unwrap());
    new.stop();
}

#[test]
fn a_worker_with_namespace_dedup_domains_keeps_namespaces_apart() {
    // `--dedup-domain namespace`: a series finds what its namespace stored, never what
    // another namespace stored, and `GET /v1/stats` says which mode the worker runs in.
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &["--dedup-domain", "namespace"]);
    let url = srv.url();
    let input = dir.path().join("in.bin");
    let data = random(4 << 20, 11);
    std::fs::write(&input, &data).unwrap();
    let new_bytes = |series: &str| {
        let out = client_ok(
            &[
                &push_args(&url, series, input.to_str().unwrap())[..],
                &["--json"],
            ]
            .concat(),
            None,
        );
        let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        rep["newBytes"].as_u64().unwrap()
    };
    let first = new_bytes("team-a/db");
    let same_ns = new_bytes("team-a/web");
    let other_ns = new_bytes("team-b/db");
    assert!(
        first >= 4 << 20,
        "team-a's first backup stored {first} new bytes"
    );
    assert!(
        same_ns < 1 << 20,
        "team-a's second series stored {same_ns} new bytes of content team-a holds"
    );
    assert_eq!(
        other_ns, first,
        "team-b's backup of the same content stored {other_ns} new bytes, team-a's {first}"
    );
    let stats = srv.get("/v1/stats", None).json();
    assert_eq!(stats["dedupDomain"], "namespace", "{stats}");
    for series in ["team-a/db", "team-a/web", "team-b/db"] {
        let got = dir.path().join("out.bin");
        client_ok(&pull_to(&url, series, got.to_str().unwrap()), None);
        assert!(
            std::fs::read(&got).unwrap() == data,
            "{series} restores byte-exact"
        );
    }
    let bad = client(
        &[
            "serve",
            "--store",
            dir.path().join("x").to_str().unwrap(),
            "--init",
            "--dedup-domain",
            "tenant",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("`store` or `namespace`"),
        "{err}"
    );
}

#[test]
fn a_namespace_over_its_quota_takes_no_new_backup_until_versions_expire_or_the_quota_rises() {
    let dir = tempfile::tempdir().unwrap();
    let quotas = dir.path().join("quotas");
    std::fs::write(&quotas, "# bytes\nteam-a 3000000\n").unwrap();
    let srv = Server::start(
        &dir.path().join("store"),
        &[
            "--quota-file",
            quotas.to_str().unwrap(),
            "--token-reload",
            "100ms",
        ],
    );
    let oct = [("Content-Type", "application/octet-stream")];
    let put = |series: &str, seed: u64| {
        let path = format!("/v1/series/{series}/versions");
        srv.request("PUT", &path, &oct, &random(2 << 20, seed))
    };
    // Under the quota: admitted, even though it ends over it (2 × 2 MiB of random data).
    assert_eq!(put("team-a/db", 1).status, 201);
    assert_eq!(put("team-a/web", 2).status, 201);
    let refused = put("team-a/db", 3);
    refused.assert_error(403, "quota_exceeded");
    let msg = refused.json()["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("namespace team-a holds 4194304 logical bytes")
            && msg.contains("its quota is 3000000"),
        "{msg}"
    );
    let listed = srv.get("/v1/series/team-a/db/versions", None).json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // Other namespaces are not affected.
    assert_eq!(put("team-b/db", 4).status, 201);

    // Expiring a version brings the namespace under its quota again.
    let r = srv.request("DELETE", "/v1/series/team-a/web/versions/latest", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(put("team-a/db", 5).status, 201);
    put("team-a/db", 6).assert_error(403, "quota_exceeded");
    // Objects count and are refused alike: a bucket is no way around the quota.
    srv.request(
        "PUT",
        "/v1/buckets/team-a/velero/object?key=backups%2Fx",
        &oct,
        b"metadata",
    )
    .assert_error(403, "quota_exceeded");
    assert_eq!(
        srv.request(
            "PUT",
            "/v1/buckets/team-b/velero/object?key=backups%2Fx",
            &oct,
            b"metadata"
        )
        .status,
        201,
        "a namespace without a quota stores objects"
    );

    // A raised quota applies once the file is re-read; a file that no longer parses keeps it.
    std::fs::write(&quotas, "team-a 100000000\n").unwrap();
    srv.wait_for("the raised quota", Duration::from_secs(10), |s| {
        let r = s.request(
            "PUT",
            "/v1/series/team-a/db/versions",
            &oct,
            &random(1 << 20, 7),
        );
        r.status == 201
    });
    std::fs::write(&quotas, "team-a lots\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(put("team-a/db", 8).status, 201);
    assert!(srv
        .log_text()
        .contains("quota file changed but does not parse"));
    for (series, v, seed) in [
        ("team-a/db", 1, 1),
        ("team-a/db", 2, 5),
        ("team-b/db", 1, 4),
    ] {
        let r = srv.get(&format!("/v1/series/{series}/versions/{v}"), None);
        assert!(
            r.body == random(2 << 20, seed),
            "{series} v{v} restores byte-exact"
        );
    }

    // A quota file that does not exist yet (a Secret key the operator has not written) is
    // no error: the quotas apply once it appears.
    let later = dir.path().join("later");
    let srv2 = Server::start(
        &dir.path().join("store2"),
        &[
            "--quota-file",
            later.to_str().unwrap(),
            "--token-reload",
            "100ms",
        ],
    );
    let put2 = |seed: u64| {
        srv2.request(
            "PUT",
            "/v1/series/team-c/db/versions",
            &oct,
            &random(1 << 20, seed),
        )
    };
    assert_eq!(put2(9).status, 201);
    std::fs::write(&later, "team-c 1000\n").unwrap();
    srv2.wait_for(
        "the quota file that appeared",
        Duration::from_secs(10),
        |_| put2(10).status == 403,
    );
    assert!(srv2
        .log_text()
        .contains("the quota file does not exist (yet)"));

    // A line that does not parse is left out, loudly; the server starts all the same (a
    // worker that cannot start backs nothing up).
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "team-d 10Gi\nteam-e 1000\n").unwrap();
    let srv3 = Server::start(
        &dir.path().join("store3"),
        &["--quota-file", bad.to_str().unwrap()],
    );
    let put3 = |series: &str, seed: u64| {
        let path = format!("/v1/series/{series}/versions");
        srv3.request("PUT", &path, &oct, &random(4096, seed))
    };
    assert_eq!(put3("team-e/db", 11).status, 201);
    put3("team-e/db", 12).assert_error(403, "quota_exceeded");
    assert_eq!(put3("team-d/db", 13).status, 201);
    assert_eq!(put3("team-d/db", 14).status, 201);
    assert!(srv3
        .log_text()
        .contains("quota file line 1: \"10Gi\" is not a byte count: that line is left out"));
}

#[test]
fn a_worker_with_a_sampled_index_dedups_and_restores_byte_exact() {
    // `--index-mib`: backups look up in the sampled index; a second series with the same
    // content finds it there, and every version restores byte-exact.
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &["--index-mib", "1"]);
    let url = srv.url();
    let input = dir.path().join("in.bin");
    let mut data = random(8 << 20, 5);
    std::fs::write(&input, &data).unwrap();
    client_ok(&push_args(&url, "default/a", input.to_str().unwrap()), None);
    data[3 << 20..(3 << 20) + 5000].fill(7);
    std::fs::write(&input, &data).unwrap();
    let out = client_ok(
        &[
            &push_args(&url, "default/b", input.to_str().unwrap())[..],
            &["--json"],
        ]
        .concat(),
        None,
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let new = rep["newBytes"].as_u64().unwrap();
    assert!(
        new < 2 << 20,
        "b stored {new} new bytes of 8 MiB it shares with a: {rep}"
    );
    let log = srv.log_text();
    assert!(
        log.contains("backups look up in a sampled index"),
        "the worker says it uses the sampled index:\n{log}"
    );
    for (series, want) in [("default/a", random(8 << 20, 5)), ("default/b", data)] {
        let got = dir.path().join("out.bin");
        client_ok(&pull_to(&url, series, got.to_str().unwrap()), None);
        assert!(
            std::fs::read(&got).unwrap() == want,
            "{series} restores byte-exact"
        );
    }
}

/// `GET /v1/stats` says how much room the store has, on each filesystem it uses: what the
/// operator places new series by. Here the containers are on tmpfs and the metadata on the
/// test's disk, so the two differ.
#[test]
fn stats_report_the_room_of_the_data_and_metadata_filesystems() {
    let dir = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let store = dir.path().join("store");
    let data = shm.path().join("data");
    let out = revault(&[
        "init",
        "--store",
        store.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let srv = Server::start(&store, &[]);
    let st = srv.get("/v1/stats", None).json();
    let disk = &st["disk"];
    let room = |p: &Path| {
        let s = rustix::fs::statvfs(p).unwrap();
        (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize)
    };
    let (data_total, data_free) = room(&data);
    let (meta_total, meta_free) = room(&store);
    assert_ne!(
        data_total, meta_total,
        "tmpfs and the disk differ in size: {disk}"
    );
    assert_eq!(disk["dataTotalBytes"], data_total, "{disk}");
    assert_eq!(disk["metaTotalBytes"], meta_total, "{disk}");
    // Free room moves as others write: within 1 GiB of what this test sees.
    let near = |v: &serde_json::Value, want: u64| v.as_u64().unwrap().abs_diff(want) < 1 << 30;
    assert!(
        near(&disk["dataFreeBytes"], data_free),
        "{disk} vs {data_free}"
    );
    assert!(
        near(&disk["metaFreeBytes"], meta_free),
        "{disk} vs {meta_free}"
    );
    srv.stop();
}
