//! `revault serve` on full disks (issue 18, defect 7): small tmpfs
//! filesystems mounted in the test's directory are filled with a filler file
//! while the real server runs.
//!
//! - Metadata and data on one filesystem: backups answer 507 until RocksDB
//!   itself fails; then the server is degraded (`/readyz` 503, new work 503,
//!   reads still served). Once the filler is deleted it closes and reopens
//!   the store by itself and is ready again, without a restart; a restore
//!   still running then is cut (never short and complete-looking) after the
//!   reopen grace.
//! - The data directory on its own tiny filesystem: backups, slides and gc
//!   answer 507, leave nothing behind, and succeed once space is freed, with
//!   no reopen.
//!
//! Every version acknowledged (201) before, during and after restores
//! byte-exact, and offline `revault check` is clean at the end. Mounting
//! needs root (CAP_SYS_ADMIN): without it the tests say SKIPPED and pass.
//! Settings the server may not know are passed through the environment
//! (`REVAULT_REOPEN_GRACE`), so run against a server without them these
//! tests fail on its behaviour, not on an unknown flag.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{parse_response, Response, Server};
use common::*;

/// A tmpfs mounted for the test, unmounted when dropped (also when the
/// test fails: drops run while a panic unwinds).
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// `None` (after a loud message) when this process may not mount.
    fn mount(path: &Path, size_mib: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m,mode=0755")])
            .arg("tmpfs")
            .arg(path)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                path: path.to_path_buf(),
            }),
            Ok(o) => {
                skipped(&String::from_utf8_lossy(&o.stderr));
                None
            }
            Err(e) => {
                skipped(&e.to_string());
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds it open: detach it, so the test's
            // directory can go and nothing stays mounted.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// A store whose metadata is on a 64 MiB tmpfs and whose data directory is on a tmpfs of its
/// own, `data_mib` large (`init --data-dir`); both unmounted when dropped.
struct SplitStore {
    store: PathBuf,
    data: PathBuf,
    _meta_fs: Tmpfs,
    data_fs: Tmpfs,
}

impl SplitStore {
    /// `None` (after a loud message) when this process may not mount.
    fn make(dir: &Path, data_mib: u64) -> Option<SplitStore> {
        let meta_fs = Tmpfs::mount(&dir.join("meta-fs"), 64)?;
        let data_fs = Tmpfs::mount(&dir.join("data-fs"), data_mib)?;
        let store = meta_fs.path.join("store");
        let data = data_fs.path.join("data");
        ok_json(&[
            "init",
            "--store",
            store.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ]);
        Some(SplitStore {
            store,
            data,
            _meta_fs: meta_fs,
            data_fs,
        })
    }
}

fn skipped(why: &str) {
    eprintln!(
        "\n*** SKIPPED: full_disk needs to mount tmpfs (run as root); mount said: {} ***\n",
        why.trim()
    );
}

/// Writes a filler file until the filesystem is full. Returns its size.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let buf = vec![0xa5u8; 1 << 20];
    let (mut chunk, mut total) = (buf.len(), 0u64);
    loop {
        match f.write(&buf[..chunk]) {
            Ok(n) => total += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                if chunk <= 4096 {
                    return total;
                }
                chunk /= 4;
            }
            Err(e) => panic!("writing the filler {}: {e}", path.display()),
        }
    }
}

/// Starts `revault serve` on `store` with its log and address file in
/// `dir` (not on the filesystems being filled), and waits until ready.
fn serve(dir: &Path, store: &Path, env: &[(&str, &str)]) -> Server {
    let addr_file = dir.join("addr");
    let _ = std::fs::remove_file(&addr_file);
    let log = dir.join("serve.log");
    let child = Command::new(bin())
        .args(["serve", "--store", store.to_str().unwrap(), "--init"])
        .args(["--listen", "127.0.0.1:0", "--addr-file"])
        .arg(&addr_file)
        .envs(env.iter().copied())
        .env("REVAULT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start revault serve");
    let mut srv = Server {
        child,
        addr: String::new(),
        store: store.to_path_buf(),
        log,
        scheme: "http",
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            srv.addr = a.trim().to_string();
            if srv
                .try_request("GET", "/readyz", &[], b"")
                .is_ok_and(|r| r.status == 200)
            {
                return srv;
            }
        }
        if let Ok(Some(st)) = srv.child.try_wait() {
            panic!("revault serve exited with {st}:\n{}", srv.log_text());
        }
        assert!(
            Instant::now() < deadline,
            "revault serve never became ready:\n{}",
            srv.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn push(srv: &Server, series: &str, data: &[u8]) -> Response {
    srv.request(
        "PUT",
        &format!("/v1/series/{series}/versions"),
        &[("Content-Type", "application/octet-stream")],
        data,
    )
}

fn post(srv: &Server, path: &str, json: &str) -> Response {
    srv.request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        json.as_bytes(),
    )
}

/// Versions the server acknowledged, with their bytes.
#[derive(Default)]
struct Acked(Vec<(String, u64, Vec<u8>)>);

impl Acked {
    /// Records a push answered 201.
    fn add(&mut self, series: &str, r: &Response, data: Vec<u8>) {
        assert_eq!(r.status, 201, "{}", r.text());
        let v = r.json()["version"].as_u64().expect("version in the report");
        self.0.push((series.to_string(), v, data));
    }

    /// Every acknowledged version restores byte-exact.
    fn verify(&self, srv: &Server) {
        for (series, v, data) in &self.0 {
            let r = srv.get(&format!("/v1/series/{series}/versions/{v}"), None);
            assert_eq!(r.status, 200, "{series} v{v}: {}", r.text());
            assert!(
                r.body == *data,
                "{series} v{v} restored {} bytes that differ from the {} acknowledged",
                r.body.len(),
                data.len()
            );
        }
        eprintln!("{} acknowledged versions restore byte-exact", self.0.len());
    }
}

/// A restore whose client reads its head and a little, then stops reading.
struct SlowRestore {
    s: TcpStream,
    buf: Vec<u8>,
    body_at: usize,
    length: usize,
}

impl SlowRestore {
    fn start(srv: &Server, path: &str, read_first: usize) -> SlowRestore {
        use socket2::{Domain, Socket, Type};
        let to: SocketAddr = srv.addr.parse().unwrap();
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        // A small window: the server blocks on sending soon after the
        // client stops reading, instead of filling megabytes of buffers.
        sock.set_recv_buffer_size(64 << 10).unwrap();
        sock.connect(&to.into()).unwrap();
        let mut s: TcpStream = sock.into();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: revault\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "the restore ended before its head");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = parse_response(&buf[..end + 4]).unwrap();
                assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&buf));
                let length = head
                    .header("content-length")
                    .expect("a stream restore has a Content-Length")
                    .parse()
                    .unwrap();
                if buf.len() - (end + 4) >= read_first {
                    return SlowRestore {
                        s,
                        buf,
                        body_at: end + 4,
                        length,
                    };
                }
            }
        }
    }

    /// Reads the rest: the body and whether it was complete.
    fn finish(mut self) -> (Vec<u8>, bool) {
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                // A cut response may end in a reset instead of a close.
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => panic!("reading the restore: {e}"),
            }
        }
        let body = self.buf.split_off(self.body_at);
        let complete = body.len() == self.length;
        (body, complete)
    }
}

fn metric(srv: &Server, name: &str) -> f64 {
    srv.metric(&format!("{name} "))
        .unwrap_or_else(|| panic!("no metric {name} in /metrics"))
}

fn stop_and_check(srv: Server, store: &Path) {
    srv.stop();
    assert_check_ok(store);
    let c = ok_json(&["check", "--store", store.to_str().unwrap()]);
    assert!(
        c["warnings"].as_array().is_none_or(|w| w.is_empty()),
        "check warns: {c}"
    );
}

/// Session directories (and their files) under a data directory, sorted.
fn data_files(data: &Path) -> Vec<PathBuf> {
    let mut f = files_under(data);
    f.sort();
    f
}

#[test]
fn a_full_store_disk_degrades_the_server_and_it_recovers_by_itself() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // Smaller than the 70 MiB RocksDB preallocates for its log, so the
    // log grows write by write and runs out of room when the disk does, as
    // it does on a large disk once its preallocated part is used.
    let Some(fs) = Tmpfs::mount(&dir.path().join("fs"), 64) else {
        return;
    };
    let store = fs.path.join("store");
    let srv = serve(dir.path(), &store, &[("REVAULT_REOPEN_GRACE", "2s")]);
    let mut acked = Acked::default();

    // Before: a large version (for a restore across the reopen) and a small one.
    let big = random(16 << 20, 1);
    acked.add("ns/big", &push(&srv, "ns/big", &big), big.clone());
    let small = random(1 << 20, 2);
    acked.add("ns/a", &push(&srv, "ns/a", &small), small);

    let filler = fs.path.join("filler");
    let filled = fill(&filler);
    eprintln!("filler: {} MiB", filled >> 20);

    // Push until RocksDB itself has failed: every answer until then is 507
    // no_space (or, if a backup still fit, 201), never a 500.
    let mut seen_507 = 0;
    let mut degraded = false;
    for i in 0..200u64 {
        let data = random(256 << 10, 100 + i);
        let r = push(&srv, "ns/a", &data);
        match r.status {
            201 => acked.add("ns/a", &r, data),
            507 => {
                r.assert_error(507, "no_space");
                let m = r.json()["message"].as_str().unwrap().to_string();
                // Which disk, and what became of the backup: nothing
                // (data directory), or a commit that may land at the reopen
                // (metadata; it was not acknowledged, so either is fine).
                assert!(
                    (m.contains("data directory") && m.contains("nothing was committed"))
                        || (m.contains("metadata") && m.contains("may still land")),
                    "{m}"
                );
                seen_507 += 1;
            }
            503 => {
                r.assert_error(503, "unavailable");
                degraded = true;
                break;
            }
            _ => panic!("push {i} on a full disk: {} {}", r.status, r.text()),
        }
        if srv.get("/readyz", None).status == 503 {
            degraded = true;
            break;
        }
    }
    assert!(seen_507 > 0, "no push was answered 507");
    assert!(
        degraded,
        "the metadata never stopped taking writes, or /readyz stayed 200"
    );

    // Degraded: not ready (saying why), alive, new work refused at once,
    // reads still served.
    let r = srv.get("/readyz", None);
    r.assert_error(503, "unavailable");
    assert!(r.text().contains("metadata"), "{}", r.text());
    // A worker pod's readiness probe leaves writes out: the store stays in its Service and
    // serves restores; the operator learns why it takes no new series from its stats.
    assert_eq!(srv.get("/readyz?exclude=writes", None).status, 200);
    srv.get("/readyz?exclude=everything", None)
        .assert_error(400, "bad_query");
    let stats = srv.get("/v1/stats", None).json();
    let why = stats["degraded"].as_str().unwrap_or_default();
    assert!(why.contains("metadata"), "stats say degraded: {stats}");
    assert_eq!(srv.get("/healthz", None).status, 200);
    let t = Instant::now();
    push(&srv, "ns/a", &random(64 << 10, 7)).assert_error(503, "unavailable");
    assert!(t.elapsed() < Duration::from_secs(5));
    post(&srv, "/v1/series/ns/a/slide", "").assert_error(503, "unavailable");
    post(&srv, "/v1/gc", "{}").assert_error(503, "unavailable");
    assert_eq!(srv.get("/v1/series/ns/a/versions", None).status, 200);
    assert_eq!(metric(&srv, "revault_store_degraded"), 1.0);
    acked.verify(&srv);

    // A restore that started before the reopen and whose client stops
    // reading: the reopen waits for it only within the grace.
    let slow = SlowRestore::start(&srv, "/v1/series/ns/big/versions/1?cacheMib=1", 1 << 20);

    // `revault push` waits while the store is degraded (it recovers by itself once room is
    // freed), saying why, instead of failing at once: a backup Job's few retries would not
    // outlast a short spell.
    let waited = random(1 << 20, 9);
    let input = dir.path().join("waited");
    std::fs::write(&input, &waited).unwrap();
    let url = format!("http://{}", srv.addr);
    let mut waiting = Command::new(bin())
        .args(["push", "--server", &url, "--series", "ns/waited"])
        .args([input.to_str().unwrap(), "--wait-ready", "120s"])
        .env("REVAULT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut stderr = std::io::BufReader::new(waiting.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut stderr, &mut said).unwrap();
    assert!(
        said.contains("waiting for the worker") && said.contains("degraded"),
        "{said}"
    );

    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    srv.wait_for(
        "readiness after space was freed",
        Duration::from_secs(30),
        |s| s.get("/readyz", None).status == 200,
    );
    eprintln!(
        "ready again {:?} after the filler was deleted",
        freed.elapsed()
    );
    assert_eq!(metric(&srv, "revault_store_degraded"), 0.0);
    assert!(metric(&srv, "revault_store_reopens_total") >= 1.0);

    // The restore was cut, not passed off as complete: what arrived is a
    // prefix of the version.
    let (got, complete) = slow.finish();
    assert!(got.len() <= big.len());
    assert!(got == big[..got.len()], "the cut restore sent wrong bytes");
    assert!(
        !complete,
        "a restore whose client read nothing for the whole grace still completed"
    );

    // The waiting push went ahead once the store took writes again.
    let out = waiting.wait_with_output().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(
        out.status.success(),
        "the waiting push failed: {said}{rest}"
    );
    assert_eq!(
        srv.get("/v1/series/ns/waited/versions/1", None).body,
        waited
    );

    // After: new backups commit; everything acknowledged restores.
    let after = random(2 << 20, 3);
    acked.add("ns/a", &push(&srv, "ns/a", &after), after);
    acked.verify(&srv);
    let log = srv.log_text();
    assert_eq!(
        log.matches("store degraded").count(),
        1,
        "the degraded state is logged once:\n{log}"
    );
    stop_and_check(srv, &store);
    eprintln!("took {:?}", started.elapsed());
}

#[test]
fn a_full_data_directory_fails_writes_cleanly_and_needs_no_reopen() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let Some(split) = SplitStore::make(dir.path(), 40) else {
        return;
    };
    let (store, data) = (split.store.clone(), split.data.clone());
    let srv = serve(dir.path(), &store, &[]);
    let mut acked = Acked::default();
    // Slides here happen by hand, once the disk is full (a new series would slide by itself).
    for s in ["ns/s", "ns/g"] {
        let r = srv.request(
            "PUT",
            &format!("/v1/series/{s}/retention"),
            &[("Content-Type", "application/json")],
            br#"{"auto": false}"#,
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }

    // A series with two similar versions, so a slide rewrites some units.
    let s1 = random(4 << 20, 10);
    let mut s2 = s1.clone();
    for at in (0..s2.len()).step_by(512 << 10) {
        s2[at..at + 2000].copy_from_slice(&random(2000, at as u64));
    }
    acked.add("ns/s", &push(&srv, "ns/s", &s1), s1);
    acked.add("ns/s", &push(&srv, "ns/s", &s2), s2);
    // A series whose first version shares half its data with the second,
    // then expires: gc's compaction rewrites that half.
    let g1 = random(4 << 20, 20);
    let mut g2 = g1[..2 << 20].to_vec();
    g2.extend_from_slice(&random(2 << 20, 21));
    // Chunk units: g1's containers hold chunks of both halves, so after the
    // expiry they are half dead and a full gc must rewrite them.
    let push_chunks = |data: &[u8]| {
        srv.request(
            "PUT",
            "/v1/series/ns/g/versions?unit=chunk",
            &[("Content-Type", "application/octet-stream")],
            data,
        )
    };
    assert_eq!(push_chunks(&g1).status, 201);
    acked.add("ns/g", &push_chunks(&g2), g2);
    let r = post(&srv, "/v1/series/ns/g/expire", r#"{"version": 1}"#);
    assert_eq!(r.status, 200, "{}", r.text());

    let filler = split.data_fs.path.join("filler");
    let before = data_files(&data);
    fill(&filler);

    // Each write fails with 507, naming the data directory, and leaves
    // nothing behind.
    let r = push(&srv, "ns/a", &random(4 << 20, 30));
    r.assert_error(507, "no_space");
    let m = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        m.contains("data directory") && m.contains("nothing was committed"),
        "{m}"
    );
    assert_eq!(data_files(&data), before, "the failed backup left files");
    assert_eq!(srv.get("/v1/series/ns/a/versions", None).status, 404);

    post(&srv, "/v1/series/ns/s/slide", "").assert_error(507, "no_space");
    assert_eq!(data_files(&data), before, "the failed slide left files");
    let vs = srv.get("/v1/series/ns/s/versions", None).json();
    assert_eq!(vs[0]["form"], "live", "the failed slide changed v1: {vs}");

    post(&srv, "/v1/gc", r#"{"full": true, "compactBelow": 1.0}"#).assert_error(507, "no_space");
    assert_eq!(data_files(&data), before, "the failed gc left files");

    // The metadata was never stuck: ready throughout, no reopen.
    assert_eq!(srv.get("/readyz", None).status, 200);
    assert_eq!(metric(&srv, "revault_store_degraded"), 0.0);
    acked.verify(&srv);

    // Space freed: the same requests succeed at once.
    std::fs::remove_file(&filler).unwrap();
    let a = random(4 << 20, 31);
    acked.add("ns/a", &push(&srv, "ns/a", &a), a);
    let r = post(&srv, "/v1/series/ns/s/slide", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["slid"], serde_json::json!([1]), "{}", r.text());
    let r = post(&srv, "/v1/gc", r#"{"full": true, "compactBelow": 1.0}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["containersCompacted"].as_u64() >= Some(1),
        "gc compacted nothing: {}",
        r.text()
    );
    assert_eq!(metric(&srv, "revault_store_reopens_total"), 0.0);
    acked.verify(&srv);
    stop_and_check(srv, &store);
    eprintln!("took {:?}", started.elapsed());
}

#[test]
fn a_push_that_fills_the_disk_midway_says_the_disk_is_full() {
    // A push whose body is far larger than the room left: the worker fails the backup when its
    // data directory fills, with most of the body still to come. The client used to report
    // "Broken pipe" (the worker answered and closed the socket with unread data, which resets
    // it); the worker now reads and discards the rest while its 507 goes out, so the client
    // shows the worker's message.
    let dir = tempfile::tempdir().unwrap();
    let Some(split) = SplitStore::make(dir.path(), 24) else {
        return;
    };
    let store = split.store.clone();
    let srv = serve(dir.path(), &store, &[]);
    let input = dir.path().join("big");
    std::fs::write(&input, random(96 << 20, 40)).unwrap();
    let url = format!("http://{}", srv.addr);
    // Whether the old server's reset beat its answer was a race (about one push in four got
    // the message): every one of several pushes must.
    for attempt in 1..=6 {
        let out = Command::new(bin())
            .args(["push", "--server", &url, "--series", "ns/big"])
            .arg(&input)
            .env_remove("REVAULT_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "a 96 MiB push into 24 MiB succeeded: {said}"
        );
        assert!(
            said.contains("disk is full") && said.contains("nothing was committed"),
            "push {attempt} does not say the disk is full: {said}"
        );
    }
    assert_eq!(srv.get("/v1/series/ns/big/versions", None).status, 404);
    // The failed backup's files are gone: a backup that fits succeeds at once.
    let small = random(4 << 20, 41);
    let mut acked = Acked::default();
    acked.add("ns/small", &push(&srv, "ns/small", &small), small);
    acked.verify(&srv);
    stop_and_check(srv, &store);
}
