//! Helpers for tests that run a real `revault serve` on 127.0.0.1.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::bin;

pub struct Server {
    pub child: Child,
    pub addr: String,
    pub store: PathBuf,
    pub log: PathBuf,
    pub scheme: &'static str,
}

impl Server {
    /// Starts `revault serve --store STORE --init` on a free port and waits
    /// until it is ready.
    pub fn start(store: &Path, extra: &[&str]) -> Server {
        Self::start_env(store, extra, &[])
    }

    /// [`Server::start`] with these environment variables set (e.g. `NODE_NAME`).
    pub fn start_env(store: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let s = Self::spawn(store, extra, env);
        s.wait_ready(Instant::now() + Duration::from_secs(30));
        s
    }

    /// Starts `revault serve` and returns once it listens, ready or not (its store may still
    /// be opening).
    pub fn spawn(store: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = store.parent().unwrap();
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let addr_file = dir.join(format!("addr-{n}"));
        let log = dir.join(format!("serve-{n}.log"));
        let child = Command::new(bin())
            .args(["serve", "--store", store.to_str().unwrap(), "--init"])
            .args(["--listen", "127.0.0.1:0", "--addr-file"])
            .arg(&addr_file)
            .args(extra)
            .env("REVAULT_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start revault serve");
        let scheme = if extra.contains(&"--tls-cert") {
            "https"
        } else {
            "http"
        };
        let mut s = Server {
            child,
            addr: String::new(),
            store: store.to_path_buf(),
            log,
            scheme,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                s.addr = a.trim().to_string();
                break;
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                panic!("revault serve exited with {st}:\n{}", s.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "revault serve did not start:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// Waits until the server says it is ready, or panics at `deadline`.
    pub fn wait_ready(&self, deadline: Instant) {
        if self.scheme == "https" {
            let limit = deadline.saturating_duration_since(Instant::now());
            self.wait_for("the store to open", limit, |s| {
                s.log_text().contains("store open; ready")
            });
            return;
        }
        loop {
            if let Ok(r) = self.try_request("GET", "/readyz", &[], b"") {
                if r.status == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "revault serve never became ready:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits (bounded) for the server to exit.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "revault serve did not exit:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self) -> String {
        self.signal(libc::SIGTERM);
        let st = self.wait(Duration::from_secs(60));
        assert!(
            st.success(),
            "revault serve exited with {st}:\n{}",
            self.log_text()
        );
        self.log_text()
    }

    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        raw_request(&self.addr, method, path, headers, body)
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn get(&self, path: &str, token: Option<&str>) -> Response {
        let auth = token.map(|t| format!("Bearer {t}"));
        let h: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        self.request("GET", path, &h, b"")
    }

    /// A metric's value (the first sample whose line starts with `prefix`).
    pub fn metric(&self, prefix: &str) -> Option<f64> {
        let r = self.get("/metrics", None);
        r.text()
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Polls until `f` holds (bounded).
    pub fn wait_for(&self, what: &str, limit: Duration, mut f: impl FnMut(&Server) -> bool) {
        let deadline = Instant::now() + limit;
        while !f(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts an error response: status, JSON `{code, message}`.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.text());
        let j = self.json();
        assert_eq!(j["code"], code, "body: {}", self.text());
        assert!(j["message"].as_str().is_some_and(|m| !m.is_empty()), "{j}");
    }
}

/// A minimal HTTP/1.1 client (Connection: close), enough to send exactly
/// the bytes a test wants, including malformed requests.
pub fn raw_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    let mut has_len = false;
    for (k, v) in headers {
        has_len |=
            k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding");
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_len && (!body.is_empty() || matches!(method, "PUT" | "POST")) {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    // A server may answer before it has read the whole request (431 for a head too big) and
    // close: the write then fails, but the answer is there to read.
    let sent = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body));
    match (read_response(s), sent) {
        (Ok(r), _) => Ok(r),
        (Err(e), Ok(())) => Err(e),
        (Err(_), Err(write_err)) => Err(write_err),
    }
}

pub fn read_response(mut s: TcpStream) -> std::io::Result<Response> {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> std::io::Result<Response> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no response head"))?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let raw = &buf[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(raw).ok_or_else(|| bad("bad chunked body"))?
    } else {
        raw.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = raw.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(
            std::str::from_utf8(&raw[..nl])
                .ok()?
                .split(';')
                .next()?
                .trim(),
            16,
        )
        .ok()?;
        raw = &raw[nl + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Runs the real `revault` client with a token in the environment.
pub fn client(args: &[&str], token: Option<&str>) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("REVAULT_LOG", "warn")
        .env_remove("REVAULT_TOKEN")
        .stdin(Stdio::null());
    if let Some(t) = token {
        c.env("REVAULT_TOKEN", t);
    }
    c.output().expect("run revault")
}

/// A push reading stdin, so the test controls when the body ends.
pub fn slow_push(url: &str, series: &str, token: Option<&str>) -> Child {
    let mut c = Command::new(bin());
    c.args(["push", "--server", url, "--series", series, "-"])
        .env("REVAULT_LOG", "warn")
        .env_remove("REVAULT_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(t) = token {
        c.env("REVAULT_TOKEN", t);
    }
    c.spawn().expect("start revault push")
}

/// Waits (bounded) for a client to exit; kills it past `limit`.
pub fn wait_child(c: Child, limit: Duration) -> Output {
    let pid = c.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: killing our own child process.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("revault push did not finish in {limit:?}");
        }
    }
}

pub fn client_ok(args: &[&str], token: Option<&str>) -> Output {
    let out = client(args, token);
    assert!(
        out.status.success(),
        "revault {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
