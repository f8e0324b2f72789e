//! Backup slots (`--max-backups`): backups beyond the limit wait their turn,
//! reading nothing, say so in `GET …/backup` and the metrics, then run and
//! commit byte-exact; a retry of a queued backup takes over from it; a server
//! that shuts down answers the waiting ones 503 and lets the running one
//! finish.
//!
//! Each step waits for the state it needs (a backup running, one queued)
//! instead of sleeping, so the interleaving is the same on a busy machine.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::server::{read_response, wait_child, Response, Server};
use common::*;

const LIMIT: Duration = Duration::from_secs(30);

/// A backup sent by hand: its head and `sent` bytes of its body so far; the
/// answer arrives on `answer` once the server gives it.
struct Upload {
    s: TcpStream,
    body: Vec<u8>,
    sent: usize,
    answer: mpsc::Receiver<Response>,
    _reader: JoinHandle<()>,
}

impl Upload {
    /// Opens `PUT …/versions` of `series` and sends the first `first` bytes of `body`.
    fn open(srv: &Server, series: &str, body: Vec<u8>, first: usize) -> Upload {
        let mut s = TcpStream::connect(&srv.addr).unwrap();
        // Longer than any wait of the tests (a worker stopped for over a minute): `wait`
        // bounds the wait for the answer.
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let head = format!(
            "PUT /v1/series/{series}/versions HTTP/1.1\r\nHost: revault\r\nConnection: close\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        let (tx, answer) = mpsc::channel();
        let r = s.try_clone().unwrap();
        let _reader = std::thread::spawn(move || {
            if let Ok(resp) = read_response(r) {
                let _ = tx.send(resp);
            }
        });
        let mut u = Upload {
            s,
            body,
            sent: 0,
            answer,
            _reader,
        };
        u.send(first);
        u
    }

    /// Sends `n` more bytes of the body from a thread of its own: a queued
    /// backup's server reads none of them, so the write may block until its turn.
    fn send(&mut self, n: usize) {
        let end = (self.sent + n).min(self.body.len());
        let part = self.body[self.sent..end].to_vec();
        self.sent = end;
        let mut w = self.s.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = w.write_all(&part);
        });
    }

    fn finish(&mut self) {
        self.send(self.body.len());
    }

    /// Sends nothing more (half-closes the connection), the body unsent.
    fn stop_sending(&self) {
        let _ = self.s.shutdown(std::net::Shutdown::Write);
    }

    fn answered(&self) -> Option<Response> {
        self.answer.try_recv().ok()
    }

    fn wait(&self) -> Response {
        self.answer
            .recv_timeout(Duration::from_secs(60))
            .expect("no answer to the upload within 60 s")
    }
}

fn progress(srv: &Server, series: &str) -> serde_json::Value {
    srv.get(&format!("/v1/series/{series}/backup"), None).json()
}

fn is_queued(srv: &Server, series: &str) -> bool {
    progress(srv, series)["queued"] == true
}

/// Running and reading its body (not queued).
fn is_running(srv: &Server, series: &str) -> bool {
    let p = progress(srv, series);
    p["running"] == true && p["queued"] == false && p["logicalBytes"].as_u64() > Some(0)
}

fn restored(srv: &Server, series: &str) -> Vec<u8> {
    let r = srv.get(&format!("/v1/series/{series}/versions/latest"), None);
    assert_eq!(r.status, 200, "{series}: {}", r.text());
    r.body
}

/// A server with `slots` backup slots, in a new temporary directory, and a backup of
/// `default/a` running on it: the first MiB of `data` sent, the rest for the test to send.
fn with_a_running(slots: &str, data: Vec<u8>) -> (tempfile::TempDir, Server, Upload) {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &["--max-backups", slots]);
    let a = Upload::open(&srv, "default/a", data, 1 << 20);
    srv.wait_for("backup a to run", LIMIT, |s| is_running(s, "default/a"));
    (dir, srv, a)
}

#[test]
fn backups_beyond_the_limit_wait_their_turn_and_then_commit_byte_exact() {
    let (a_data, b_data) = (random(4 << 20, 1), random(2 << 20, 2));
    let (_dir, srv, mut a) = with_a_running("1", a_data.clone());
    let mut b = Upload::open(&srv, "default/b", b_data.clone(), 0);
    b.finish();
    srv.wait_for("backup b to queue", LIMIT, |s| is_queued(s, "default/b"));
    assert_eq!(srv.metric("revault_queued_backups "), Some(1.0));
    assert_eq!(srv.metric("revault_inflight_backups "), Some(1.0));

    // A second backup of the running series is refused at once (one of a
    // queued series takes over instead: see the hang-up test).
    let dup = srv.request(
        "PUT",
        "/v1/series/default/a/versions",
        &[("Content-Type", "application/octet-stream")],
        b"x",
    );
    dup.assert_error(409, "series_busy");

    // While a runs, b reads nothing and commits nothing, however long a takes.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            is_queued(&srv, "default/b"),
            "{}",
            progress(&srv, "default/b")
        );
        assert_eq!(progress(&srv, "default/b")["logicalBytes"], 0);
        assert!(b.answered().is_none());
    }
    let none = srv.get("/v1/series/default/b/versions/latest", None);
    assert_eq!(none.status, 404, "{}", none.text());

    a.finish();
    let ra = a.wait();
    assert_eq!(ra.status, 201, "{}", ra.text());
    let rb = b.wait();
    assert_eq!(rb.status, 201, "{}", rb.text());
    assert_eq!(rb.json()["logicalBytes"], b_data.len() as u64);
    assert!(
        restored(&srv, "default/a") == a_data,
        "a restores byte-exact"
    );
    assert!(
        restored(&srv, "default/b") == b_data,
        "b restores byte-exact"
    );
    assert_eq!(srv.metric("revault_queued_backups "), Some(0.0));
    assert_eq!(progress(&srv, "default/b")["running"], false);
}

/// A client that gives up while queued is noticed only when its turn comes
/// (nothing reads its body before): its retry takes over its series at once
/// instead of being refused as busy, the old request commits nothing, and the
/// queue goes on.
#[test]
fn a_client_that_gives_up_while_queued_can_retry_at_once() {
    let (_dir, srv, mut a) = with_a_running("1", random(2 << 20, 3));
    let b = Upload::open(&srv, "default/b", random(1 << 20, 4), 0);
    srv.wait_for("backup b to queue", LIMIT, |s| is_queued(s, "default/b"));
    let c_data = random(1 << 20, 5);
    let mut c = Upload::open(&srv, "default/c", c_data.clone(), 0);
    c.finish();
    srv.wait_for("backup c to queue", LIMIT, |s| is_queued(s, "default/c"));
    assert_eq!(srv.metric("revault_queued_backups "), Some(2.0));
    // b's client stops sending (it still reads here, so that the test sees
    // the takeover happen before the slot is freed).
    b.stop_sending();

    // The retry of b (a Job's next pod) is queued, not refused; the old
    // request is told why it ended.
    let b2_data = random(1 << 20, 8);
    let mut b2 = Upload::open(&srv, "default/b", b2_data.clone(), 0);
    b2.finish();
    let old = b.wait();
    old.assert_error(409, "series_busy");
    assert!(old.text().contains("took over"), "{}", old.text());
    assert!(b2.answered().is_none(), "b's retry was refused");
    assert!(is_queued(&srv, "default/b"));

    a.finish();
    assert_eq!(a.wait().status, 201);
    let rc = c.wait();
    assert_eq!(rc.status, 201, "{}", rc.text());
    let rb2 = b2.wait();
    assert_eq!(rb2.status, 201, "{}", rb2.text());
    assert_eq!(rb2.json()["version"], 1, "the old b committed nothing");
    assert!(restored(&srv, "default/c") == c_data);
    assert!(restored(&srv, "default/b") == b2_data);
    assert_eq!(srv.metric("revault_queued_backups "), Some(0.0));
    assert_eq!(progress(&srv, "default/b")["running"], false);
}

/// Deleting a series withdraws its queued backup: one whose client sent its
/// whole body and went (a Job's pod deleted with its series) would otherwise
/// bring the series back once a slot frees.
#[test]
fn deleting_a_series_withdraws_its_queued_backup() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &["--max-backups", "1"]);
    let put = |series: &str, data: &[u8]| {
        srv.request(
            "PUT",
            &format!("/v1/series/{series}/versions"),
            &[("Content-Type", "application/octet-stream")],
            data,
        )
    };
    assert_eq!(put("default/b", &random(200_000, 9)).status, 201);
    let mut a = Upload::open(&srv, "default/a", random(2 << 20, 10), 1 << 20);
    srv.wait_for("backup a to run", LIMIT, |s| is_running(s, "default/a"));
    let mut b = Upload::open(&srv, "default/b", random(100_000, 11), 0);
    b.finish();
    srv.wait_for("backup b to queue", LIMIT, |s| is_queued(s, "default/b"));

    let del = srv.request("DELETE", "/v1/series/default/b", &[], b"");
    assert_eq!(del.status, 200, "{}", del.text());
    let rb = b.wait();
    rb.assert_error(409, "series_busy");
    assert!(rb.text().contains("was deleted"), "{}", rb.text());

    a.finish();
    assert_eq!(a.wait().status, 201);
    let gone = srv.get("/v1/series/default/b/versions/latest", None);
    assert_eq!(
        gone.status,
        404,
        "the deleted series came back: {}",
        gone.text()
    );
    assert_eq!(srv.metric("revault_queued_backups "), Some(0.0));
}

#[test]
fn shutting_down_answers_the_waiting_backups_and_lets_the_running_one_finish() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut srv = Server::start(&store, &["--max-backups", "1", "--grace-period", "60s"]);
    let a_data = random(3 << 20, 6);
    let mut a = Upload::open(&srv, "default/a", a_data.clone(), 1 << 20);
    srv.wait_for("backup a to run", LIMIT, |s| is_running(s, "default/a"));
    let mut b = Upload::open(&srv, "default/b", random(1 << 20, 7), 0);
    b.finish();
    srv.wait_for("backup b to queue", LIMIT, |s| is_queued(s, "default/b"));

    srv.signal(libc::SIGTERM);
    let rb = b.wait();
    rb.assert_error(503, "shutting_down");
    assert!(
        rb.text().contains("waiting for a slot") && rb.text().contains("no version was created"),
        "{}",
        rb.text()
    );
    assert!(a.answered().is_none(), "the running backup was cut");
    a.finish();
    let ra = a.wait();
    assert_eq!(ra.status, 201, "{}", ra.text());
    let st = srv.wait(Duration::from_secs(60));
    assert!(st.success(), "{st}:\n{}", srv.log_text());

    let srv = Server::start(&store, &[]);
    assert!(restored(&srv, "default/a") == a_data);
    let none = srv.get("/v1/series/default/b/versions/latest", None);
    assert_eq!(none.status, 404, "{}", none.text());
}

/// The real client waits in the queue for as long as its turn takes. A queued
/// backup's server reads nothing, so the client's socket sits at a zero
/// window; a TCP user timeout on the client (reqwest's default is 30 s) makes
/// its own kernel abort such a connection ("Connection timed out"), and the
/// backup Job failed while its request still held the series on the worker
/// (e2e 13: fifty series scheduled at once).
#[test]
fn a_push_queued_longer_than_a_tcp_user_timeout_still_commits() {
    let (dir, srv, mut a) = with_a_running("1", random(2 << 20, 9));

    // More than the socket buffers of both ends hold, so the window closes.
    let b_data = random(32 << 20, 10);
    let b_file = dir.path().join("b.bin");
    std::fs::write(&b_file, &b_data).unwrap();
    let (mut push, lines) = start_push(&srv, "default/b", &b_file, "2m", true);
    srv.wait_for("push b to queue", LIMIT, |s| is_queued(s, "default/b"));

    // Longer than 30 s in the queue, the client still waits.
    let queued = std::time::Instant::now();
    while queued.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(st) = push.try_wait().unwrap() {
            let out = push.wait_with_output().unwrap();
            panic!(
                "the queued push gave up after {:?} ({st}): {} {:?}",
                queued.elapsed(),
                String::from_utf8_lossy(&out.stdout),
                lines.try_iter().collect::<Vec<_>>()
            );
        }
    }
    assert!(
        is_queued(&srv, "default/b"),
        "{}",
        progress(&srv, "default/b")
    );

    a.finish();
    assert_eq!(a.wait().status, 201);
    let out = wait_child(push, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["version"], 1, "{rep}");
    assert!(
        restored(&srv, "default/b") == b_data,
        "b restores byte-exact"
    );
}

/// Starts `revault push FILE` to `series` with `--wait-ready wait` (`--json` prints no
/// progress); its stderr lines arrive on the returned channel as it prints them.
fn start_push(
    srv: &Server,
    series: &str,
    file: &std::path::Path,
    wait: &str,
    json: bool,
) -> (std::process::Child, mpsc::Receiver<String>) {
    let url = srv.url();
    let mut push = std::process::Command::new(bin())
        .args(json.then_some("--json"))
        .args(["push", "--server", &url, "--series", series])
        .args(["--wait-ready", wait])
        .arg(file)
        .env("REVAULT_LOG", "warn")
        .env_remove("REVAULT_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let err = push.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (push, rx)
}

/// `revault push` to a series whose backup is running waits for it (within --wait-ready),
/// saying so, and then commits the next version: the running one may be an earlier attempt of
/// the same backup (a Job's failed pod) that the worker has not yet dropped. Past
/// --wait-ready it sends anyway and reports the worker's 409.
#[test]
fn a_push_waits_for_the_running_backup_of_its_series() {
    let (dir, srv, mut a) = with_a_running("2", random(2 << 20, 11));

    let file = dir.path().join("next.bin");
    let next = random(3 << 20, 12);
    std::fs::write(&file, &next).unwrap();
    let (push, lines) = start_push(&srv, "default/a", &file, "60s", false);
    let said = lines
        .recv_timeout(LIMIT)
        .expect("the push says why it waits");
    assert!(
        said.contains("series default/a has a backup in progress"),
        "{said}"
    );
    assert!(a.answered().is_none());
    a.finish();
    let ra = a.wait();
    assert_eq!(ra.status, 201, "{}", ra.text());
    assert_eq!(ra.json()["version"], 1);
    let out = wait_child(push, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{:?}",
        lines.try_iter().collect::<Vec<_>>()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("default/a version 2:"), "{stdout}");
    assert!(
        restored(&srv, "default/a") == next,
        "the push restores byte-exact"
    );

    // A backup that does not end within --wait-ready: the push sends anyway and is refused.
    let c = Upload::open(&srv, "default/a", random(2 << 20, 13), 1 << 20);
    srv.wait_for("backup c to run", LIMIT, |s| is_running(s, "default/a"));
    // A small body: the 409 comes before the worker reads any of it, and a large one still
    // being sent could meet a reset connection instead of the answer.
    let small = dir.path().join("small.bin");
    std::fs::write(&small, random(1024, 14)).unwrap();
    let (push, lines) = start_push(&srv, "default/a", &small, "1s", true);
    let out = wait_child(push, Duration::from_secs(60));
    assert!(!out.status.success());
    let said: Vec<String> = lines.try_iter().collect();
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "series_busy", "{err} {said:?}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already has a backup in progress"),
        "{err}"
    );
    c.stop_sending();
    let rc = c.wait();
    assert_ne!(rc.status, 201, "{}", rc.text());
}

/// A push waiting in the queue of a worker that stops answering (a node lost, a process
/// stopped) gives up once the worker has neither read its upload nor answered for --wait-ready
/// (a minute at least, whatever the flag says), saying so: its socket, sending into a zero
/// window, would not fail for half an hour or more (never, here: a stopped process's kernel
/// still answers the window probes). Its backup creates no version.
#[test]
fn a_queued_push_gives_up_on_a_worker_that_answers_nothing() {
    let a_data = random(2 << 20, 15);
    let (dir, srv, mut a) = with_a_running("1", a_data.clone());
    let file = dir.path().join("b.bin");
    std::fs::write(&file, random(16 << 20, 16)).unwrap();
    let (mut push, lines) = start_push(&srv, "default/b", &file, "3s", true);
    srv.wait_for("push b to queue", LIMIT, |s| is_queued(s, "default/b"));

    assert!(
        push.try_wait().unwrap().is_none(),
        "the push gave up before the worker stopped"
    );
    srv.signal(libc::SIGSTOP);
    let out = wait_child(push, Duration::from_secs(180));
    srv.signal(libc::SIGCONT);
    assert!(!out.status.success());
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("has neither read the upload nor answered for 1m"),
        "{err} {:?}",
        lines.try_iter().collect::<Vec<_>>()
    );

    a.finish();
    assert_eq!(a.wait().status, 201);
    assert!(restored(&srv, "default/a") == a_data);
    srv.wait_for("b's abandoned backup to end", LIMIT, |s| {
        progress(s, "default/b")["running"] == false
    });
    let none = srv.get("/v1/series/default/b/versions/latest", None);
    assert_eq!(none.status, 404, "{}", none.text());
}
