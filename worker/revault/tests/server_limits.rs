//! `revault serve` under hostile clients: connection caps per client address
//! and in all, header and keep-alive timeouts, uploads that stall or trickle,
//! restores whose client stops reading, per-request size limits, and what
//! `/metrics` tells whom.
//!
//! The limits are short here so the tests stay fast. They are set through the
//! flags' environment variables (`REVAULT_HEADER_TIMEOUT`, …), which a server
//! that does not know them ignores: run against an older binary, these tests
//! fail on its behaviour, not on an unknown flag. Every wait is bounded; no
//! test asserts on speed.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{client_ok, read_response, Response, Server};
use common::*;

const ANOTHER_CLIENT: [u8; 4] = [127, 0, 0, 2];
const PROBE: [u8; 4] = [127, 0, 0, 3];

/// Starts `revault serve` with `env` set, optionally under an open-file
/// limit `(soft, hard)`, and waits until it is ready (probing from
/// [`PROBE`], so 127.0.0.1 starts with no connection of its own).
fn start(dir: &Path, env: &[(&str, &str)], args: &[&str], nofile: Option<(u64, u64)>) -> Server {
    let store = dir.join("store");
    let addr_file = dir.join("addr");
    let log = dir.join("serve.log");
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--store", store.to_str().unwrap(), "--init"])
        .args(["--listen", "127.0.0.1:0", "--addr-file"])
        .arg(&addr_file)
        .args(args)
        .envs(env.iter().copied())
        .env("REVAULT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some((soft, hard)) = nofile {
        // SAFETY: only setrlimit(2) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().expect("start revault serve");
    let tls = args.contains(&"--tls-cert");
    let mut srv = Server {
        child,
        addr: String::new(),
        store,
        log,
        scheme: if tls { "https" } else { "http" },
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            srv.addr = a.trim().to_string();
            let ready = if tls {
                srv.log_text().contains("store open; ready")
            } else {
                get_from(PROBE, &srv, "/readyz", None).is_ok_and(|r| r.status == 200)
            };
            if ready {
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

fn server_addr(srv: &Server) -> SocketAddr {
    srv.addr.parse().unwrap()
}

/// A TCP connection from the local address `from` (every 127.x.y.z is local
/// on Linux), so a test can be several clients.
fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(2))?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// One request (`Connection: close`) from the local address `from`.
fn request_from(
    from: [u8; 4],
    srv: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut s = connect_from(from, server_addr(srv))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: revault\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    read_response(s)
}

fn get_from(
    from: [u8; 4],
    srv: &Server,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<Response> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let h: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    request_from(from, srv, "GET", path, &h, b"")
}

/// A sample of `/metrics` (the line starting with `prefix`), asked from `from`.
fn metric_from(from: [u8; 4], srv: &Server, prefix: &str) -> Option<f64> {
    let r = get_from(from, srv, "/metrics", None).expect("GET /metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Whether the server has closed `s` (end of stream or reset), without
/// waiting: data the server sent first is read and ignored.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}

/// Opens up to `n` connections from the addresses `from` in turn that send
/// half a request head and then nothing. Stops early if the server no longer
/// accepts.
fn half_open_flood(srv: &Server, from: &[[u8; 4]], n: usize) -> Vec<TcpStream> {
    let mut flood = Vec::new();
    for i in 0..n {
        match connect_from(from[i % from.len()], server_addr(srv)) {
            Ok(mut s) => {
                let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: revault\r\n");
                flood.push(s);
            }
            Err(_) => break,
        }
    }
    flood
}

/// Waits (bounded) until the server has closed at least `want` of `conns`;
/// returns how many it closed.
fn wait_closed(srv: &Server, conns: &mut [TcpStream], want: usize) -> usize {
    let mut closed = vec![false; conns.len()];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for (c, done) in conns.iter_mut().zip(closed.iter_mut()) {
            if !*done {
                *done = closed_by_server(c);
            }
        }
        let n = closed.iter().filter(|c| **c).count();
        if n >= want || Instant::now() >= deadline {
            assert!(
                n >= want,
                "the server closed {n} of {} connections, expected at least {want}:\n{}",
                conns.len(),
                srv.log_text()
            );
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn one_client_address_cannot_starve_the_others() {
    let dir = tempfile::tempdir().unwrap();
    // A low open-file limit: without caps, this flood exhausts descriptors.
    let srv = start(
        dir.path(),
        &[
            ("REVAULT_MAX_CONNECTIONS_PER_CLIENT", "16"),
            ("REVAULT_HEADER_TIMEOUT", "5m"),
        ],
        &[],
        Some((256, 256)),
    );
    let mut flood = half_open_flood(&srv, &[[127, 0, 0, 1]], 300);
    assert_eq!(flood.len(), 300, "the server stopped accepting connections");

    // Another address still gets answers while the flood holds its share.
    let r = get_from(ANOTHER_CLIENT, &srv, "/healthz", None)
        .unwrap_or_else(|e| panic!("/healthz from 127.0.0.2 failed: {e}\n{}", srv.log_text()));
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "ok\n");

    // All but 16 of the flood were closed at once; 16 stay open.
    let closed = wait_closed(&srv, &mut flood, 300 - 16);
    assert_eq!(closed, 300 - 16, "exactly 16 connections of 127.0.0.1 stay");
    let rejected = metric_from(
        ANOTHER_CLIENT,
        &srv,
        "revault_rejected_connections_total{reason=\"max_connections_per_client\"}",
    );
    assert_eq!(rejected, Some(284.0));
    let open = metric_from(ANOTHER_CLIENT, &srv, "revault_open_connections ").unwrap();
    assert!(open >= 16.0, "revault_open_connections {open}");
    let held = flood
        .iter_mut()
        .filter_map(|s| (!closed_by_server(s)).then_some(()))
        .count();
    assert_eq!(held, 16);

    // Once the flood goes away, 127.0.0.1 is served again.
    drop(flood);
    srv.wait_for(
        "127.0.0.1 to be served again",
        Duration::from_secs(20),
        |s| {
            s.try_request("GET", "/healthz", &[], b"")
                .is_ok_and(|r| r.status == 200)
        },
    );
    srv.stop();
}

#[test]
fn the_connection_cap_keeps_descriptors_for_the_store() {
    let dir = tempfile::tempdir().unwrap();
    // Soft limit 128, hard 256: the server raises the soft limit to 256 and
    // caps connections at half of it, whatever it is asked for.
    let srv = start(
        dir.path(),
        &[
            ("REVAULT_MAX_CONNECTIONS", "1000"),
            ("REVAULT_HEADER_TIMEOUT", "5m"),
        ],
        &[],
        Some((128, 256)),
    );
    // From four addresses, so that no per-address cap (128 here) is reached.
    let many = [
        [127, 0, 1, 1],
        [127, 0, 1, 2],
        [127, 0, 1, 3],
        [127, 0, 1, 4],
    ];
    let mut flood = half_open_flood(&srv, &many, 200);
    assert_eq!(flood.len(), 200, "the server stopped accepting connections");
    // 128 in all: the readiness probe's connection may still count for a moment.
    let closed = wait_closed(&srv, &mut flood, 200 - 128);
    assert!((72..=73).contains(&closed), "closed {closed} of 200");
    // The server works on: a backup and its restore, once the flood is gone.
    drop(flood);
    srv.wait_for(
        "connections to be accepted again",
        Duration::from_secs(20),
        |s| {
            s.try_request("GET", "/healthz", &[], b"")
                .is_ok_and(|r| r.status == 200)
        },
    );
    let rejected = srv
        .metric("revault_rejected_connections_total{reason=\"max_connections\"}")
        .unwrap();
    assert!(rejected >= 72.0, "{rejected}");
    let input = dir.path().join("in.bin");
    let data = random(3 << 20, 5);
    std::fs::write(&input, &data).unwrap();
    let url = srv.url();
    let inp = input.to_str().unwrap();
    client_ok(
        &["push", "--server", &url, "--series", "default/db", inp],
        None,
    );
    let out = dir.path().join("out.bin");
    let outp = out.to_str().unwrap();
    client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--series",
            "default/db",
            "-o",
            outp,
        ],
        None,
    );
    assert_eq!(std::fs::read(&out).unwrap(), data);
    let log = srv.stop();
    assert!(log.contains("open-file limit 256"), "{log}");
}

/// Waits (at most `limit`) for the server to close `s`; panics if it does not.
fn expect_closed_within(srv: &Server, mut s: TcpStream, limit: Duration, what: &str) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            panic!("{what}: still open after {limit:?}:\n{}", srv.log_text())
        }
        Err(_) => {} // reset: closed too
    }
}

fn expect_closed(srv: &Server, s: TcpStream, what: &str) {
    expect_closed_within(srv, s, Duration::from_secs(15), what)
}

#[test]
fn slow_and_idle_connections_are_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), &[("REVAULT_HEADER_TIMEOUT", "1s")], &[], None);
    let to = server_addr(&srv);

    // Half a request head, then nothing.
    let mut s = connect_from([127, 0, 0, 1], to).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: revault\r\n")
        .unwrap();
    expect_closed(&srv, s, "a partial request head");

    // A connection that never sends a byte.
    let s = connect_from([127, 0, 0, 1], to).unwrap();
    expect_closed(&srv, s, "a silent connection");

    // A keep-alive connection: answered, then closed once idle.
    let s = idle_connection(to);
    expect_closed(&srv, s, "an idle keep-alive connection");

    let header = srv.metric("revault_timeouts_total{kind=\"header\"}");
    let idle = srv.metric("revault_timeouts_total{kind=\"idle\"}");
    assert_eq!(header, Some(1.0));
    assert_eq!(idle, Some(2.0));
    srv.stop();
}

/// The timer the kernel runs on the server's end of a connection from
/// `client` to `server` (`/proc/net/tcp`'s `tr:tm->when`): which timer
/// (2: keepalive) and in how many clock ticks it fires.
fn server_end_timer(server: SocketAddr, client: SocketAddr) -> Option<(u32, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let (local, remote) = (
        format!(":{:04X}", server.port()),
        format!(":{:04X}", client.port()),
    );
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if !(f[1].ends_with(&local) && f[2].ends_with(&remote)) {
            return None;
        }
        let (tr, when) = f[5].split_once(':')?;
        Some((tr.parse().ok()?, u64::from_str_radix(when, 16).ok()?))
    })
}

/// Connects from 127.0.0.1 and has one request answered (200), so the server
/// has accepted and set up the connection, which stays open and idle.
fn idle_connection(to: SocketAddr) -> TcpStream {
    let mut s = connect_from([127, 0, 0, 1], to).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: revault\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok\n") {
        let n = s.read(&mut buf).expect("the response");
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s
}

/// Every connection has TCP keepalive on (`--tcp-keepalive`, 30 s), so a
/// client whose host vanished (no FIN, no RST ever comes) is noticed within
/// about a minute, not after --body-idle-timeout with its series and backup
/// slot held: the kernel shows the server's end of an idle connection with its
/// keepalive timer running (none runs on an idle connection without
/// keepalive), firing within the flag's time. `0` turns it off.
#[test]
fn the_server_turns_tcp_keepalive_on() {
    // SAFETY: sysconf reads a constant of the system; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    for (env, secs) in [(None, 30), (Some("12s"), 12)] {
        let dir = tempfile::tempdir().unwrap();
        let env: Vec<(&str, &str)> = env
            .map(|v| ("REVAULT_TCP_KEEPALIVE", v))
            .into_iter()
            .collect();
        let srv = start(dir.path(), &env, &[], None);
        let to = server_addr(&srv);
        let s = idle_connection(to);
        let me = s.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let timer = server_end_timer(to, me);
            if let Some((2, when)) = timer {
                assert!(
                    when > 0 && when <= secs * ticks,
                    "keepalive fires in {when} ticks, beyond {secs} s"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the server's end of an idle connection runs no keepalive timer: {timer:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(s);
        srv.stop();
    }

    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), &[("REVAULT_TCP_KEEPALIVE", "0")], &[], None);
    let to = server_addr(&srv);
    let s = idle_connection(to);
    let me = s.local_addr().unwrap();
    for _ in 0..20 {
        let timer = server_end_timer(to, me);
        assert!(timer.is_some(), "the connection is not in /proc/net/tcp");
        assert_ne!(timer.unwrap().0, 2, "--tcp-keepalive 0 still probes");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(s);
    srv.stop();
}

#[test]
fn a_stalled_tls_handshake_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let srv = start(
        dir.path(),
        &[
            ("REVAULT_TLS_HANDSHAKE_TIMEOUT", "1s"),
            ("REVAULT_HEADER_TIMEOUT", "5m"),
        ],
        &["--tls-cert", c, "--tls-key", k],
        None,
    );
    let to = server_addr(&srv);
    // Nothing at all, and the first bytes of a ClientHello. The bound is
    // well past the 1 s asked for and short of the 10 s a fixed default
    // would take.
    let s = connect_from([127, 0, 0, 1], to).unwrap();
    expect_closed_within(&srv, s, Duration::from_secs(6), "a silent TLS connection");
    let mut s = connect_from([127, 0, 0, 1], to).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0x00])
        .unwrap();
    expect_closed_within(&srv, s, Duration::from_secs(6), "half a ClientHello");
    // A real client is served.
    let port = srv.addr.rsplit(':').next().unwrap().to_string();
    let url = format!("https://localhost:{port}");
    let f = dir.path().join("f");
    std::fs::write(&f, random(1 << 20, 52)).unwrap();
    let fp = f.to_str().unwrap();
    client_ok(
        &[
            "push",
            "--server",
            &url,
            "--ca-cert",
            c,
            "--series",
            "default/tls",
            fp,
        ],
        None,
    );
    let out = client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--ca-cert",
            c,
            "--series",
            "default/tls",
        ],
        None,
    );
    assert_eq!(out.stdout, std::fs::read(&f).unwrap());
    srv.stop();
}

#[test]
fn request_heads_and_json_bodies_have_size_limits() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("store"), &[]);
    // A head of 60 KiB is read; one over 64 KiB gets 431, however it is sent.
    let h = "x".repeat(60 << 10);
    assert_eq!(
        srv.request("GET", "/healthz", &[("X-Pad", &h)], b"").status,
        200
    );
    for kib in [65, 500, 2048] {
        let h = "x".repeat(kib << 10);
        let r = srv.request("GET", "/healthz", &[("X-Pad", &h)], b"");
        assert_eq!(r.status, 431, "{kib} KiB: {}", r.text());
    }
    // 100 headers pass, 101 do not (the request adds Host and Connection).
    let names: Vec<String> = (0..99).map(|i| format!("X-H{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    assert_eq!(srv.request("GET", "/healthz", &many[..98], b"").status, 200);
    assert_eq!(srv.request("GET", "/healthz", &many, b"").status, 431);

    // JSON bodies: 64 KiB is read, a byte more is refused.
    let js = [("Content-Type", "application/json")];
    let mut body = vec![b' '; 64 << 10];
    body[..2].copy_from_slice(b"{}");
    let r = srv.request("POST", "/v1/gc", &js, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    body.push(b' ');
    srv.request("POST", "/v1/gc", &js, &body)
        .assert_error(400, "bad_body");
    srv.stop();
}

/// Sends a backup's head and then `trickle` bytes of its body, one every
/// `every`, until the server answers (or 20 s pass). Returns the answer.
fn trickle_upload(srv: &Server, series: &str, trickle: usize, every: Duration) -> Response {
    let head = format!(
        "PUT /v1/series/{series}/versions HTTP/1.1\r\nHost: revault\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
    );
    trickle_body(srv, &head, trickle, every)
}

/// Sends `head`, then `trickle` bytes of a body, one every `every`, until
/// the server answers (or 20 s pass). Returns the answer.
fn trickle_body(srv: &Server, head: &str, trickle: usize, every: Duration) -> Response {
    let mut s = connect_from([127, 0, 0, 1], server_addr(srv)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let reader = s.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read_response(reader));
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    let answer = loop {
        match rx.recv_timeout(every) {
            Ok(r) => break r,
            Err(_) if Instant::now() >= deadline => {
                panic!(
                    "no answer to a trickling upload in 20 s:\n{}",
                    srv.log_text()
                )
            }
            Err(_) => {}
        }
        if sent < trickle && s.write_all(b"x").is_ok() {
            sent += 1;
        }
    };
    answer.unwrap_or_else(|e| panic!("reading the answer: {e}\n{}", srv.log_text()))
}

fn assert_no_version(srv: &Server, series: &str) {
    let r = srv.get(&format!("/v1/series/{series}/versions"), None);
    if r.status == 200 {
        assert_eq!(r.json().as_array().unwrap().len(), 0, "{}", r.text());
    } else {
        r.assert_error(404, "unknown_series");
    }
}

#[test]
fn trickling_and_stalled_uploads_are_cut_and_leave_no_version() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(
        dir.path(),
        &[
            ("REVAULT_BODY_IDLE_TIMEOUT", "1s"),
            ("REVAULT_BODY_MIN_RATE", "1000"),
            ("REVAULT_BODY_RATE_WINDOW", "2s"),
        ],
        &[],
        None,
    );
    let url = srv.url();
    let input = dir.path().join("in.bin");
    let data = random(4 << 20, 9);
    std::fs::write(&input, &data).unwrap();
    let inp = input.to_str().unwrap();

    // A byte every 300 ms: never idle for a second, but far below 1000 B/s.
    let r = trickle_upload(
        &srv,
        "default/trickle",
        usize::MAX,
        Duration::from_millis(300),
    );
    r.assert_error(408, "request_timeout");
    assert!(
        r.json()["message"].as_str().unwrap().contains("no version"),
        "{}",
        r.text()
    );
    assert_no_version(&srv, "default/trickle");
    // The series claim is gone: a new backup starts and commits at once.
    let out = client_ok(
        &[
            "push",
            "--server",
            &url,
            "--series",
            "default/trickle",
            inp,
            "--json",
        ],
        None,
    );
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["version"], 1, "{rep}");

    // Ten bytes, then nothing.
    let r = trickle_upload(&srv, "default/stall", 10, Duration::from_millis(50));
    r.assert_error(408, "request_timeout");
    assert_no_version(&srv, "default/stall");
    client_ok(
        &["push", "--server", &url, "--series", "default/stall", inp],
        None,
    );

    // A JSON body is paced too.
    let gc = "POST /v1/gc HTTP/1.1\r\nHost: revault\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    trickle_body(&srv, gc, 2, Duration::from_millis(50)).assert_error(408, "request_timeout");

    assert_eq!(
        srv.metric("revault_timeouts_total{kind=\"body_rate\"}"),
        Some(1.0)
    );
    assert_eq!(
        srv.metric("revault_timeouts_total{kind=\"body_idle\"}"),
        Some(2.0)
    );
    assert_eq!(srv.metric("revault_inflight_backups "), Some(0.0));
    // What was committed restores byte-exact.
    for series in ["default/trickle", "default/stall"] {
        let out = dir.path().join("out.bin");
        let outp = out.to_str().unwrap();
        client_ok(
            &["pull", "--server", &url, "--series", series, "-o", outp],
            None,
        );
        assert_eq!(std::fs::read(&out).unwrap(), data, "{series}");
    }
    let store = srv.store.clone();
    srv.stop();
    assert_check_ok(&store);
}

#[test]
fn a_pull_whose_client_stops_reading_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), &[("REVAULT_SEND_TIMEOUT", "1s")], &[], None);
    let url = srv.url();
    // Far more than the response queue (8 MiB at cacheMib=1) and the
    // sockets' buffers hold.
    let size = 96usize << 20;
    let input = dir.path().join("big.bin");
    std::fs::write(&input, random(size, 11)).unwrap();
    client_ok(
        &[
            "push",
            "--server",
            &url,
            "--series",
            "default/big",
            input.to_str().unwrap(),
        ],
        None,
    );

    let mut s = connect_from([127, 0, 0, 1], server_addr(&srv)).unwrap();
    s.write_all(
        b"GET /v1/series/default/big/versions/latest?cacheMib=1 HTTP/1.1\r\nHost: revault\r\n\r\n",
    )
    .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the response head");
        head.extend_from_slice(&buf[..n]);
    }
    let head_text = String::from_utf8_lossy(&head).into_owned();
    assert!(head_text.starts_with("HTTP/1.1 200"), "{head_text}");
    let id = head_text
        .lines()
        .find_map(|l| l.strip_prefix("x-revault-restore-id: "))
        .expect("a restore id")
        .trim()
        .to_string();
    // The client stops reading: the restore is given up and its engine work ends.
    srv.wait_for(
        "the in-flight restore to end",
        Duration::from_secs(30),
        |s| s.metric("revault_inflight_restores ") == Some(0.0),
    );
    let report = srv.get(&format!("/v1/restores/{id}"), None).json();
    assert_eq!(report["state"], "failed", "{report}");
    assert_eq!(
        srv.metric("revault_timeouts_total{kind=\"send\"}"),
        Some(1.0)
    );
    // The response was cut, not completed.
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut total = head.len();
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    assert!(total < size, "the whole body arrived ({total} bytes)");
    // The server is fine: a full pull works.
    let out = dir.path().join("out.bin");
    client_ok(
        &[
            "pull",
            "--server",
            &url,
            "--series",
            "default/big",
            "-o",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(sha256_file(&out), sha256_file(&input));
    srv.stop();
}

#[test]
fn metrics_name_series_only_to_tokens_that_may_see_them() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "admin-0123456789 *\nteam-a-token-0001 team-a\nteam-b-token-0002 team-b\n",
    )
    .unwrap();
    let srv = start(
        dir.path(),
        &[],
        &["--token-file", tokens.to_str().unwrap()],
        None,
    );
    let url = srv.url();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, random(1 << 20, 3)).unwrap();
    let inp = input.to_str().unwrap();
    let (ta, tb) = (Some("team-a-token-0001"), Some("team-b-token-0002"));
    client_ok(
        &["push", "--server", &url, "--series", "team-a/db", inp],
        ta,
    );
    client_ok(
        &[
            "push",
            "--server",
            &url,
            "--series",
            "team-b/secret-db",
            inp,
        ],
        tb,
    );
    let obj = srv.request(
        "PUT",
        "/v1/buckets/team-b/secret-bucket/object?key=k",
        &[
            ("Authorization", "Bearer team-b-token-0002"),
            ("Content-Type", "application/octet-stream"),
        ],
        b"hello",
    );
    assert_eq!(obj.status, 201, "{}", obj.text());

    // Without a token: store-wide figures only.
    let m = srv.get("/metrics", None);
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(text.contains("revault_stored_bytes"), "{text}");
    assert!(text.contains("revault_versions"), "{text}");
    for name in ["team-a", "team-b", "secret", "series="] {
        assert!(
            !text.contains(name),
            "{name} in unauthenticated metrics:\n{text}"
        );
    }
    // A scoped token: its namespaces only.
    let text = srv.get("/metrics", ta).text();
    assert!(text.contains("series=\"team-a/db\""), "{text}");
    assert!(!text.contains("team-b"), "{text}");
    // `*`: every series and bucket.
    let text = srv.get("/metrics", Some("admin-0123456789")).text();
    for s in ["team-a/db", "team-b/secret-db", "team-b/secret-bucket"] {
        assert!(text.contains(&format!("series=\"{s}\"")), "{s}:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    // A wrong token: 401, as everywhere.
    srv.get("/metrics", Some("wrong-token-xyz"))
        .assert_error(401, "unauthorized");
    srv.stop();
}
