//! A real S3-compatible server for tests (feature `testing`): the durable tier's own tests and
//! the CLI's run against versitygw (hack/s3-server.sh installs it; `make test` does so first).
//!
//! Each test binary starts one server on a free loopback port, over a directory of its own,
//! and points the standard AWS variables at it; each test then uses buckets of its own. The
//! server keeps objects as plain files (`DIR/BUCKET/KEY`), which is how tamper tests reach
//! into the bucket.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::RemoteUrl;

pub struct S3 {
    pub dir: PathBuf,
    pub addr: String,
    /// The supervising shell: it stops the server when told, or when this process exits
    /// (its stdin closes) and then also removes the directory.
    child: Mutex<Option<(Child, ChildStdin)>>,
}

static SERVER: OnceLock<S3> = OnceLock::new();
static BUCKETS: AtomicU32 = AtomicU32::new(0);

/// Runs the server in the background and waits on stdin: a line `stop` stops it and keeps
/// the objects; end of input (the test process is gone, however it ended) stops it and
/// removes them, so no server outlives its tests.
const SUPERVISE: &str = r#"dir=$1; shift; "$@" & pid=$!; read -r cmd; kill "$pid"; wait "$pid"; [ "$cmd" = stop ] || rm -rf "$dir" "$dir.log""#;

fn server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("REVAULT_S3_SERVER") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("REVAULT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/revault"));
    let p = cache.join("bin/versitygw");
    assert!(
        p.exists(),
        "no S3 server at {}: run hack/s3-server.sh install (make test does), or set REVAULT_S3_SERVER",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl S3 {
    fn start(dir: &Path, addr: &str) -> (Child, ChildStdin) {
        // Objects under DIR/root, object versions (Object Lock needs them) beside it.
        std::fs::create_dir_all(dir.join("root")).unwrap();
        std::fs::create_dir_all(dir.join("versions")).unwrap();
        let log = std::fs::File::create(dir.with_extension("log")).unwrap();
        let mut child = Command::new("sh")
            .args(["-c", SUPERVISE, "sh"])
            .arg(dir)
            .arg(server_bin())
            .args([
                "--access",
                "revault-test",
                "--secret",
                "revault-test-secret",
                "--port",
                addr,
            ])
            .arg("posix")
            .arg("--versioning-dir")
            .arg(dir.join("versions"))
            .arg(dir.join("root"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting versitygw");
        let stdin = child.stdin.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "versitygw did not listen on {addr} (see {}.log)",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        (child, stdin)
    }

    /// Stops the server (the bucket becomes unreachable) until [`S3::resume`].
    pub fn stop(&self) {
        if let Some((mut c, mut stdin)) = self.child.lock().unwrap().take() {
            let _ = stdin.write_all(b"stop\n");
            drop(stdin);
            let _ = c.wait();
        }
    }

    pub fn resume(&self) {
        let mut c = self.child.lock().unwrap();
        if c.is_none() {
            *c = Some(S3::start(&self.dir, &self.addr));
        }
    }

    /// Where object `key` of `bucket` is kept on disk.
    pub fn object_path(&self, url: &RemoteUrl, name: &str) -> PathBuf {
        self.dir.join("root").join(&url.bucket).join(url.key(name))
    }

    /// The object names under `url` (relative to its prefix), and their total size.
    pub fn objects(&self, url: &RemoteUrl) -> Vec<(String, u64)> {
        let root = self.dir.join("root").join(&url.bucket).join(&url.prefix);
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out.sort();
        out
    }
}

fn walk(root: &Path, d: &Path, out: &mut Vec<(String, u64)>) {
    let Ok(rd) = std::fs::read_dir(d) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(root, &p, out);
        } else {
            let name = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                out.push((name, e.metadata().unwrap().len()));
            }
        }
    }
}

/// The test binary's S3 server (started on first use; the AWS variables point at it).
pub fn s3() -> &'static S3 {
    SERVER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("revault-s3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = S3::start(&dir, &addr);
        // Before any client exists; every test reaches the server through here first.
        std::env::set_var("AWS_ACCESS_KEY_ID", "revault-test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "revault-test-secret");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://{addr}"));
        std::env::remove_var("AWS_PROFILE");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        S3 {
            dir,
            addr,
            child: Mutex::new(Some(child)),
        }
    })
}

/// A URL in a bucket no other test uses.
pub fn fresh_url(what: &str) -> RemoteUrl {
    s3();
    let n = BUCKETS.fetch_add(1, Ordering::SeqCst);
    RemoteUrl::parse(&format!(
        "s3://t{}-{n}-{what}/cluster/node-a",
        std::process::id()
    ))
    .unwrap()
}
