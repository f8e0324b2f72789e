//! Concurrency stress through the real server (issue 18): six clients issue
//! random pushes, pulls (fast and slow, block and byte transfer), slides,
//! expiries (by version, by time, by retention), gcs (incremental and full,
//! any `compactBelow`), retention changes and listings, each a real HTTP
//! request, while the server's scheduler slides, expires and collects every
//! second. The series share content with each other and with their own
//! earlier versions, over small containers and segments, so every operation
//! touches units and containers the others use.
//!
//! A model records what was acknowledged (a push answered 201) and what may
//! remove it: only an expiry that named it (by number or time) or the
//! retention of its series, and then only versions those rules no longer keep
//! (`engine/src/retention.rs`). Any other disappearance, a pull of an existing
//! version that fails or differs, or any 5xx fails the test. After the load:
//! the server stops on SIGTERM, `check` is clean with nothing quarantined,
//! every acknowledged, unexpired version restores byte-exact offline, and so
//! again after a full gc.
//!
//! A failure names its seed and keeps its directory (store, server log, the
//! operation log). Environment:
//! - `REVAULT_STRESS_SEED=N`: run only the schedule with seed N (the same
//!   operations per client; their interleaving is up to the machine).
//! - `REVAULT_STRESS_SECONDS=S`: keep starting schedules for S seconds
//!   (default 90: two or three schedules; each loads the server for 10 s,
//!   then verifies for 10 to 20 s).
//! - `REVAULT_TEST_BIN=PATH`: test another `revault` binary (an older build).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::server::{raw_request, Response, Server};
use common::*;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

const CLIENTS: usize = 6;
/// Load per schedule; then the schedule is verified.
const LOAD: Duration = Duration::from_secs(10);
const DEFAULT_SECONDS: u64 = 90;
/// A client process that takes longer has hung: the test fails.
const CLIENT_LIMIT: Duration = Duration::from_secs(120);
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// (series, dedup unit): three namespaces, both units.
const SERIES: [(&str, &str); 6] = [
    ("alpha/db", "segment"),
    ("alpha/logs", "chunk"),
    ("beta/db", "segment"),
    ("beta/files", "chunk"),
    ("gamma/vm", "segment"),
    ("gamma/dump", "chunk"),
];
const ADMIN: &str = "stress-admin-0000";

/// The namespace-scoped token clients use for a series.
fn token(series: &str) -> String {
    format!("stress-{}-0000", series.split('/').next().unwrap())
}

fn rfc3339(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

// ---- the model ------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
struct Policy {
    keep: Option<u32>,
    within: Option<u64>,
    live: u32,
    auto: bool,
}

impl Policy {
    fn none() -> Policy {
        Policy {
            keep: None,
            within: None,
            live: 1,
            auto: false,
        }
    }

    fn random(rng: &mut ChaCha8Rng) -> Policy {
        let keep = rng.random_bool(0.7).then(|| rng.random_range(1..=4));
        let within = rng
            .random_bool(0.4)
            .then(|| [0, 20, 45, 90][rng.random_range(0..4)]);
        Policy {
            keep,
            within,
            live: rng.random_range(1..=keep.unwrap_or(2).min(2)),
            auto: rng.random_bool(0.7),
        }
    }

    fn json(&self) -> String {
        serde_json::json!({
            "keep": self.keep,
            "keepWithinSeconds": self.within,
            "live": self.live,
            "auto": self.auto,
        })
        .to_string()
    }

    /// Whether this policy would expire a version with `newer` versions
    /// newer than it (by time, as restic's forget orders them; of equal
    /// times the higher number), `age` seconds older than the newest time of
    /// its series (`retention::plan`: kept when any rule keeps it; a
    /// keep-within of 0 is no rule; the newest always). The engine also keeps
    /// the newest by number and the live window: it never removes more.
    fn removes(&self, newer: usize, age: i64) -> bool {
        let within = self.within.filter(|d| *d > 0);
        if self.keep.is_none() && within.is_none() || newer == 0 {
            return false;
        }
        let by_count = self.keep.is_some_and(|k| newer < k as usize);
        let by_age = within.is_some_and(|d| age < d as i64);
        !(by_count || by_age)
    }
}

struct Version {
    time: i64,
    sha: String,
    bytes: usize,
    /// Expired: a report named it.
    gone: bool,
    /// The retention of its series may have expired it unseen (the
    /// scheduler, or the automatic expiry after another backup).
    retention_may: bool,
    /// Bumped whenever something starts that may remove it.
    risk: u64,
}

/// An explicit expiry in flight, and what it may remove.
#[derive(Clone, Copy)]
enum Explicit {
    Version(u32),
    Before(i64),
}

impl Explicit {
    fn covers(&self, n: u32, time: i64) -> bool {
        match self {
            Explicit::Version(v) => *v == n,
            Explicit::Before(t) => time < *t,
        }
    }
}

/// One series as the clients know it.
#[derive(Default)]
struct SeriesModel {
    versions: BTreeMap<u32, Version>,
    /// Pushes in flight (op id → the version's time): each may commit a
    /// newer version at any moment.
    pushing: BTreeMap<u64, i64>,
    explicit: BTreeMap<u64, Explicit>,
    /// `applyRetention` expiries in flight: they apply rules without `auto`.
    retention_ops: u32,
    /// Retention history; `policies[confirmed..]` may be in force (a PUT in
    /// flight). The test sends one PUT per series at a time.
    policies: Vec<Policy>,
    confirmed: usize,
    /// Versions expired (confirmed gone) so far.
    shrinks: u64,
    /// Pushes started so far.
    push_seq: u64,
    /// Versions a report expired before their own push was processed.
    pre_gone: BTreeSet<u32>,
    clock: i64,
}

impl SeriesModel {
    fn new() -> SeriesModel {
        SeriesModel {
            policies: vec![Policy::none()],
            clock: 1_700_000_000,
            ..Default::default()
        }
    }

    /// A version that nothing may remove right now: it must be listed and
    /// restore.
    fn must_exist(&self, n: u32) -> bool {
        let v = &self.versions[&n];
        !v.gone && !v.retention_may && !self.explicit.values().any(|e| e.covers(n, v.time))
    }

    /// Whether the retention in force (or about to be) may expire version
    /// `n` now: over every version that may exist, including pushes that may
    /// commit. Removing a version only makes the others safer, so this
    /// over-approximates what any moment allows (never a false alarm).
    fn retention_allows(&self, n: u32) -> bool {
        let live = || self.versions.iter().filter(|(_, v)| !v.gone);
        let t = self.versions[&n].time;
        // Pushes in flight get higher numbers: newer when their time is not older.
        let newer = live()
            .filter(|(m, v)| v.time > t || (v.time == t && **m > n))
            .count()
            + self.pushing.values().filter(|p| **p >= t).count();
        let newest_time = live()
            .map(|(_, v)| v.time)
            .chain(self.pushing.values().copied())
            .max()
            .unwrap_or(i64::MIN);
        let age = newest_time - self.versions[&n].time;
        self.policies[self.confirmed..]
            .iter()
            .filter(|p| p.auto || self.retention_ops > 0)
            .any(|p| p.removes(newer, age))
    }

    /// Marks every version retention may now expire (sticky).
    fn refresh(&mut self) {
        let ns: Vec<u32> = self.versions.keys().copied().collect();
        for n in ns {
            if !self.versions[&n].gone
                && !self.versions[&n].retention_may
                && self.retention_allows(n)
            {
                let v = self.versions.get_mut(&n).unwrap();
                v.retention_may = true;
                v.risk += 1;
            }
        }
    }

    fn next_time(&mut self, rng: &mut ChaCha8Rng) -> i64 {
        let t = match rng.random_range(0..10) {
            0 => self.clock - rng.random_range(1..=40), // out of order
            1 => self.clock,
            _ => self.clock + rng.random_range(5..=30),
        };
        self.clock = self.clock.max(t);
        t
    }

    /// Marks `n` expired (a report named it).
    fn expired(&mut self, n: u32) {
        match self.versions.get_mut(&n) {
            Some(v) => {
                v.gone = true;
                self.shrinks += 1;
            }
            // Acknowledged, but that push's answer is not processed yet.
            None => {
                self.pre_gone.insert(n);
            }
        }
    }
}

// ---- a schedule --------------------------------------------------------------

#[derive(Default)]
struct Totals {
    schedules: u64,
    /// Scheduled gcs, and scheduled retention passes that slid or expired.
    scheduler: (u64, u64),
    ops: BTreeMap<String, u64>,
    pulls_verified: u64,
    restores_verified: u64,
}

struct Ctx<'a> {
    url: String,
    addr: String,
    dir: &'a Path,
    pool: Vec<u8>,
    model: Mutex<Vec<SeriesModel>>,
    contents: Vec<Mutex<Vec<u8>>>,
    retention_locks: Vec<Mutex<()>>,
    log: &'a Mutex<Vec<String>>,
    started: Instant,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
    counts: Mutex<BTreeMap<String, u64>>,
    pulls_verified: AtomicU64,
    next_id: AtomicU64,
    /// Client processes running: pid → deadline.
    children: Mutex<BTreeMap<u32, (Instant, String)>>,
    server_log: PathBuf,
}

type Step = Result<(), String>;

impl Ctx<'_> {
    fn note(&self, client: usize, what: impl std::fmt::Display) {
        let ms = self.started.elapsed().as_millis();
        self.log
            .lock()
            .unwrap()
            .push(format!("{ms:>7}ms c{client} {what}"));
    }

    fn count(&self, kind: &str) {
        *self.counts.lock().unwrap().entry(kind.into()).or_default() += 1;
    }

    fn fail(&self, msg: String) {
        let mut f = self.failure.lock().unwrap();
        if f.is_none() {
            self.log.lock().unwrap().push(format!("FAILURE: {msg}"));
            *f = Some(msg);
        }
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The server log's lines saying a restore of `series` version `n` failed.
    fn restore_failures(&self, series: &str, n: u32) -> Vec<String> {
        let log = std::fs::read_to_string(&self.server_log).unwrap_or_default();
        let key = format!("restore failed series={series} version={n} ");
        log.lines()
            .filter(|l| l.contains(&key))
            .map(str::to_string)
            .collect()
    }

    /// Why the server says a restore of `series` version `n` failed, from
    /// the first such line after the `before` there were when the pull
    /// began. The server logs the failure just after it cuts the body off,
    /// so the client may exit first: wait for the line (bounded).
    fn server_reason(&self, series: &str, n: u32, before: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = self.restore_failures(series, n);
            if lines.len() > before || Instant::now() > deadline {
                return lines
                    .get(before)
                    .and_then(|l| l.split(" error=").nth(1))
                    .map(|e| format!(" (server: {e})"))
                    .unwrap_or_default();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    /// An API request with a token; an I/O error or a 5xx fails the test.
    fn api(&self, method: &str, path: &str, tok: &str, body: &str) -> Result<Response, String> {
        let auth = format!("Bearer {tok}");
        let mut h = vec![("Authorization", auth.as_str())];
        if !body.is_empty() {
            h.push(("Content-Type", "application/json"));
        }
        let r = raw_request(&self.addr, method, path, &h, body.as_bytes())
            .map_err(|e| format!("{method} {path} {body}: no answer: {e}"))?;
        if r.status >= 500 {
            return Err(format!("{method} {path} {body}: {} {}", r.status, r.text()));
        }
        Ok(r)
    }

    /// Starts a client process, registered with the watchdog.
    fn spawn(&self, args: &[&str], tok: &str) -> Child {
        let child = Command::new(bin())
            .args(args)
            .env("REVAULT_LOG", "warn")
            .env("REVAULT_TOKEN", tok)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start revault");
        self.children
            .lock()
            .unwrap()
            .insert(child.id(), (Instant::now() + CLIENT_LIMIT, args.join(" ")));
        child
    }

    /// Reads a client's stderr and waits for it to exit (its stdout was
    /// read already). It is reaped and unregistered in one step under the
    /// watchdog's lock, so the watchdog never signals a reaped pid.
    fn finish(&self, mut child: Child, stdout: Vec<u8>) -> Output {
        let mut stderr = Vec::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_end(&mut stderr)
            .unwrap();
        let pid = child.id();
        let status = loop {
            {
                let mut running = self.children.lock().unwrap();
                if let Some(st) = child.try_wait().unwrap() {
                    running.remove(&pid);
                    break st;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            status,
            stdout,
            stderr,
        }
    }

    fn run_client(&self, args: &[&str], tok: &str) -> Output {
        let mut child = self.spawn(args, tok);
        let mut stdout = Vec::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_end(&mut stdout)
            .unwrap();
        self.finish(child, stdout)
    }

    /// Kills client processes past their deadline (they hung: a failure).
    fn watchdog(&self, done: &AtomicBool) {
        while !done.load(Ordering::SeqCst) {
            let now = Instant::now();
            for (pid, (deadline, what)) in self.children.lock().unwrap().iter() {
                if now > *deadline {
                    self.fail(format!(
                        "`revault {what}` did not finish in {CLIENT_LIMIT:?}"
                    ));
                    // SAFETY: our own child, not reaped yet (see `finish`).
                    unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn series_path(s: usize) -> String {
    format!("/v1/series/{}", SERIES[s].0)
}

/// Error code of a failed client process (`--json` prints it on stdout),
/// else the `server said STATUS CODE` of its message, else "".
fn client_error(out: &Output) -> String {
    if let Ok(j) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
        if let Some(c) = j["error"]["code"].as_str() {
            return c.to_string();
        }
    }
    let err = String::from_utf8_lossy(&out.stderr);
    err.rsplit("server said ")
        .next()
        .filter(|_| err.contains("server said "))
        .and_then(|s| s.split([' ', ')']).nth(1))
        .unwrap_or("")
        .to_string()
}

// ---- content ------------------------------------------------------------------

/// What every series draws from: random data and compressible text.
fn make_pool(seed: u64) -> Vec<u8> {
    let mut p = random(24 * MIB, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7e57);
    let words = [
        "backup ", "restore ", "segment ", "chunk ", "series ", "version ", "gc ", "\n",
    ];
    while p.len() < 32 * MIB {
        p.extend_from_slice(words[rng.random_range(0..words.len())].as_bytes());
    }
    p
}

/// A slice of the pool; half of them start at one of 16 hot spots, so the
/// series repeat each other's segments, not only chunks.
fn pool_slice<'p>(rng: &mut ChaCha8Rng, pool: &'p [u8], min: usize, max: usize) -> &'p [u8] {
    let len = rng.random_range(min..=max);
    let start = if rng.random_bool(0.5) {
        rng.random_range(0..16) * (pool.len() / 16)
    } else {
        rng.random_range(0..pool.len())
    };
    let start = start.min(pool.len() - len);
    &pool[start..start + len]
}

fn fresh_content(rng: &mut ChaCha8Rng, pool: &[u8]) -> Vec<u8> {
    let target = rng.random_range(4 * MIB..16 * MIB);
    let mut d = Vec::with_capacity(target + 2 * MIB);
    while d.len() < target {
        d.extend_from_slice(pool_slice(rng, pool, 256 * KIB, 2 * MIB));
    }
    d
}

/// The next version of a series: its current content with a few edits
/// (overwrites, inserts from the pool, deletions, zero runs, internal
/// repeats), now and then something new.
fn next_content(rng: &mut ChaCha8Rng, pool: &[u8], cur: &[u8]) -> Vec<u8> {
    if cur.is_empty() || rng.random_bool(0.1) {
        return fresh_content(rng, pool);
    }
    let mut d = cur.to_vec();
    for _ in 0..rng.random_range(1..=8) {
        let at = rng.random_range(0..=d.len());
        match rng.random_range(0..6) {
            0 => {
                let end = (at + rng.random_range(1..=16 * KIB)).min(d.len());
                rng.fill_bytes(&mut d[at..end]);
            }
            1 => {
                let s = pool_slice(rng, pool, 64 * KIB, MIB);
                d.splice(at..at, s.iter().copied());
            }
            2 => {
                let end = (at + rng.random_range(4 * KIB..=512 * KIB)).min(d.len());
                d.drain(at..end);
            }
            3 => {
                let n = rng.random_range(64 * KIB..=512 * KIB);
                d.splice(at..at, std::iter::repeat_n(0u8, n));
            }
            4 => {
                let len = rng.random_range(64 * KIB..=512 * KIB).min(d.len());
                let from = rng.random_range(0..=d.len() - len);
                let copy = d[from..from + len].to_vec();
                d.splice(at..at, copy);
            }
            _ => d.extend_from_slice(pool_slice(rng, pool, 64 * KIB, MIB)),
        }
    }
    d.truncate(20 * MIB);
    while d.len() < 4 * MIB {
        d.extend_from_slice(pool_slice(rng, pool, 256 * KIB, MIB));
    }
    d
}

// ---- operations -----------------------------------------------------------------

fn push(ctx: &Ctx<'_>, c: usize, rng: &mut ChaCha8Rng, s: usize) -> Step {
    let (name, unit) = SERIES[s];
    // Now and then a series takes up another's content (a database moved
    // to another namespace): it deduplicates against units the other
    // series may have slid and gc may be trimming right now.
    let other = rng.random_range(0..SERIES.len());
    let base = if other != s && rng.random_bool(0.15) {
        ctx.contents[other].lock().unwrap().clone()
    } else {
        ctx.contents[s].lock().unwrap().clone()
    };
    let data = next_content(rng, &ctx.pool, &base);
    *ctx.contents[s].lock().unwrap() = data.clone();
    let sha = hex::encode(Sha256::digest(&data));
    let file = ctx.dir.join(format!("push-{c}"));
    std::fs::write(&file, &data).unwrap();
    let id = ctx.id();
    let (time, others, seq) = {
        let mut m = ctx.model.lock().unwrap();
        let t = m[s].next_time(rng);
        let others = !m[s].pushing.is_empty();
        m[s].pushing.insert(id, t);
        m[s].push_seq += 1;
        m[s].refresh();
        (t, others, m[s].push_seq)
    };
    let when = rfc3339(time);
    ctx.note(
        c,
        format!("push {name} {} MiB time {when}", data.len() / MIB),
    );
    let out = ctx.run_client(
        &[
            "push",
            "--server",
            &ctx.url,
            "--series",
            name,
            "--unit",
            unit,
            "--time",
            &when,
            "--json",
            file.to_str().unwrap(),
        ],
        &token(name),
    );
    let mut m = ctx.model.lock().unwrap();
    let sm = &mut m[s];
    sm.pushing.remove(&id);
    if !out.status.success() {
        let code = client_error(&out);
        ctx.note(c, format!("push {name}: {code}"));
        if code == "series_busy" {
            ctx.count("push (409 busy)");
            return Ok(());
        }
        // The server answers 409 before reading the body and closes the
        // connection, so a client still sending a large body may see the
        // connection break instead of the answer (reported; not a loss).
        let err = String::from_utf8_lossy(&out.stderr);
        let overlapped = others || sm.push_seq != seq;
        if overlapped && err.contains("error writing a body to connection") {
            ctx.count("push (busy, connection cut before the 409)");
            return Ok(());
        }
        return Err(format!(
            "push {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = rep["version"].as_u64().unwrap() as u32;
    let auto: Vec<u32> = rep["expire"]["expired"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .unwrap_or_default();
    ctx.note(
        c,
        format!("push {name}: version {n}, auto-expired {auto:?}"),
    );
    ctx.count("push");
    let gone = sm.pre_gone.remove(&n);
    if sm.versions.contains_key(&n) {
        return Err(format!("push {name}: version {n} acknowledged twice"));
    }
    sm.versions.insert(
        n,
        Version {
            time,
            sha,
            bytes: data.len(),
            gone,
            retention_may: false,
            risk: 0,
        },
    );
    // The backup's automatic retention ran while this push could commit.
    for e in auto {
        if let Some(v) = sm.versions.get(&e) {
            if !v.retention_may {
                return Err(format!(
                    "push {name} (version {n}) expired version {e}, which the retention keeps"
                ));
            }
        }
        sm.expired(e);
    }
    sm.refresh();
    Ok(())
}

/// Picks a version that exists in the model: mostly one that must exist.
fn pick_version(sm: &SeriesModel, rng: &mut ChaCha8Rng) -> Option<u32> {
    let all: Vec<u32> = sm
        .versions
        .iter()
        .filter(|(_, v)| !v.gone)
        .map(|(n, _)| *n)
        .collect();
    let must: Vec<u32> = all.iter().copied().filter(|n| sm.must_exist(*n)).collect();
    let from = if !must.is_empty() && rng.random_bool(0.8) {
        &must
    } else {
        &all
    };
    (!from.is_empty()).then(|| from[rng.random_range(0..from.len())])
}

fn pull(ctx: &Ctx<'_>, c: usize, rng: &mut ChaCha8Rng, s: usize, slow: bool) -> Step {
    let name = SERIES[s].0;
    let (n, sha, must, risk) = {
        let m = ctx.model.lock().unwrap();
        let largest = m[s]
            .versions
            .iter()
            .filter(|(n, v)| !v.gone && m[s].must_exist(**n))
            .max_by_key(|(_, v)| v.bytes)
            .map(|(n, _)| *n);
        // Slow pulls like large versions: those outlast the server's
        // response queue (8 MiB and more), so its restore waits mid-way.
        let pick = match largest {
            Some(n) if slow && rng.random_bool(0.5) => Some(n),
            _ => pick_version(&m[s], rng),
        };
        let Some(n) = pick else {
            return Ok(());
        };
        let v = &m[s].versions[&n];
        (n, v.sha.clone(), m[s].must_exist(n), v.risk)
    };
    let transfer = if rng.random_bool(0.5) {
        "blocks"
    } else {
        "bytes"
    };
    let cache_mib = [1, 2, 8, 64][rng.random_range(0..4)].to_string();
    let kind = format!("pull {transfer}{}", if slow { " slow" } else { "" });
    ctx.note(c, format!("{kind} {name} v{n} cache {cache_mib} MiB"));
    let nv = n.to_string();
    let failures_before = ctx.restore_failures(name, n).len();
    let mut child = ctx.spawn(
        &[
            "pull",
            "--server",
            &ctx.url,
            "--series",
            name,
            "--version",
            &nv,
            "--transfer",
            transfer,
            "--cache-mib",
            &cache_mib,
            "--json",
            "-o",
            "-",
        ],
        &token(name),
    );
    let mut stdout = child.stdout.take().unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * KIB];
    let mut tail = Vec::new();
    if slow {
        // Stop reading for a while, as a client on a slow link or disk:
        // the server's restore fills its queue and waits, with its reads
        // planned from a snapshot, while other clients expire and collect.
        std::thread::sleep(Duration::from_millis(rng.random_range(500..3000)));
    }
    loop {
        let k = stdout.read(&mut buf).unwrap_or(0);
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        // The end of stdout: where `--json` puts an error.
        tail.extend_from_slice(&buf[..k]);
        tail.drain(..tail.len().saturating_sub(4 * KIB));
        if slow {
            // Then ~5 MiB/s.
            std::thread::sleep(Duration::from_millis(rng.random_range(5..20)));
        }
    }
    drop(stdout);
    let pat = b"{\n  \"error\"";
    let json_at = tail.windows(pat.len()).rposition(|w| w == pat);
    let out = ctx.finish(
        child,
        json_at.map(|i| tail[i..].to_vec()).unwrap_or_default(),
    );
    let got = hex::encode(h.finalize());
    let m = ctx.model.lock().unwrap();
    let v = &m[s].versions[&n];
    let at_risk = !must || v.risk != risk || v.gone || !m[s].must_exist(n);
    if out.status.success() {
        if got != sha {
            return Err(format!(
                "{kind} {name} v{n}: restored bytes differ (sha256 {got}, pushed {sha})"
            ));
        }
        ctx.pulls_verified.fetch_add(1, Ordering::SeqCst);
        ctx.count(&kind);
        ctx.note(c, format!("{kind} {name} v{n}: ok"));
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let code = client_error(&out);
    ctx.note(c, format!("{kind} {name} v{n}: {err}"));
    // Expired before the server resolved it: 404. Expired after that but
    // before the restore read its snapshot: the server has sent its answer's
    // head (or was about to) and breaks the connection off, and says why in
    // its log (every restore failure there is checked at the end).
    // (A 404 comes before the restore starts: nothing is logged then.)
    let why = if code == "unknown_version" {
        String::new()
    } else {
        ctx.server_reason(name, n, failures_before)
    };
    let vanished = code == "unknown_version" || why.contains("has no version");
    if at_risk && vanished {
        ctx.count(&format!("{kind} (version expired meanwhile)"));
        return Ok(());
    }
    Err(format!(
        "{kind} {name} v{n} (must exist: {must}): {err}{why}"
    ))
}

fn slide(ctx: &Ctx<'_>, c: usize, s: usize) -> Step {
    let name = SERIES[s].0;
    let r = ctx.api(
        "POST",
        &format!("{}/slide", series_path(s)),
        &token(name),
        "",
    )?;
    ctx.note(c, format!("slide {name}: {} {}", r.status, r.text()));
    match r.status {
        200 => ctx.count("slide"),
        409 => ctx.count("slide (409 busy)"),
        _ => return Err(format!("slide {name}: {} {}", r.status, r.text())),
    }
    Ok(())
}

fn expired_list(r: &Response) -> Vec<u32> {
    r.json()["expired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Expires one version (`POST …/expire {"version": N}` or `DELETE
/// …/versions/N`) or every version before a time.
fn expire_explicit(ctx: &Ctx<'_>, c: usize, rng: &mut ChaCha8Rng, s: usize) -> Step {
    let name = SERIES[s].0;
    let id = ctx.id();
    let (sel, risks) = {
        let mut m = ctx.model.lock().unwrap();
        let sm = &mut m[s];
        let Some(n) = pick_version(sm, rng) else {
            return Ok(());
        };
        let sel = if rng.random_bool(0.7) {
            Explicit::Version(n)
        } else {
            Explicit::Before(sm.versions[&n].time + 1)
        };
        // Per version: its risk once this expiry counts, whether nothing
        // else could remove it (other expiries in flight included), and
        // whether it was expired already.
        let mut risks = BTreeMap::new();
        for k in sm.versions.keys().copied().collect::<Vec<_>>() {
            let sure = sm.must_exist(k);
            let v = sm.versions.get_mut(&k).unwrap();
            if sel.covers(k, v.time) {
                v.risk += 1;
            }
            risks.insert(k, (v.risk, sure, v.gone));
        }
        sm.explicit.insert(id, sel);
        (sel, risks)
    };
    let (kind, r) = match sel {
        Explicit::Version(n) if rng.random_bool(0.5) => (
            format!("expire {name} v{n} (DELETE)"),
            ctx.api(
                "DELETE",
                &format!("{}/versions/{n}", series_path(s)),
                &token(name),
                "",
            ),
        ),
        Explicit::Version(n) => (
            format!("expire {name} v{n}"),
            ctx.api(
                "POST",
                &format!("{}/expire", series_path(s)),
                &token(name),
                &format!("{{\"version\":{n}}}"),
            ),
        ),
        Explicit::Before(t) => (
            format!("expire {name} before {}", rfc3339(t)),
            ctx.api(
                "POST",
                &format!("{}/expire", series_path(s)),
                &token(name),
                &format!("{{\"before\":\"{}\"}}", rfc3339(t)),
            ),
        ),
    };
    let mut m = ctx.model.lock().unwrap();
    let sm = &mut m[s];
    sm.explicit.remove(&id);
    let r = r?;
    ctx.note(c, format!("{kind}: {} {}", r.status, r.text()));
    match (r.status, &sel) {
        (200, _) => {
            let expired = expired_list(&r);
            for e in &expired {
                if let Some(v) = sm.versions.get(e) {
                    // The newest version (of those not expired when this
                    // began, or acknowledged since) is always kept.
                    let newest = !sm
                        .versions
                        .keys()
                        .any(|k| k > e && risks.get(k).is_none_or(|r| !r.2))
                        && sm.pushing.is_empty();
                    let ok = match sel {
                        Explicit::Version(n) => *e == n,
                        Explicit::Before(t) => v.time < t && !newest,
                    };
                    if !ok || v.gone {
                        return Err(format!("{kind} expired version {e}: {}", r.text()));
                    }
                }
            }
            for e in expired {
                sm.expired(e);
            }
            ctx.count(match sel {
                Explicit::Version(_) => "expire version",
                Explicit::Before(_) => "expire before",
            });
        }
        (409, _) => ctx.count("expire (409 busy)"),
        (404, Explicit::Version(n)) if r.json()["code"] == "unknown_version" => {
            // Only if something else may have expired it meanwhile.
            let (risk, sure, _) = risks[n];
            if sure && sm.versions[n].risk == risk && sm.must_exist(*n) {
                return Err(format!(
                    "{kind}: 404 for a version nothing expired: {}",
                    r.text()
                ));
            }
            ctx.count("expire version (404 expired meanwhile)");
        }
        _ => return Err(format!("{kind}: {} {}", r.status, r.text())),
    }
    Ok(())
}

/// `POST …/expire {"applyRetention": true}`: only what the retention in
/// force no longer keeps.
fn expire_retention(ctx: &Ctx<'_>, c: usize, s: usize) -> Step {
    let name = SERIES[s].0;
    {
        let mut m = ctx.model.lock().unwrap();
        m[s].retention_ops += 1;
        m[s].refresh();
    }
    let r = ctx.api(
        "POST",
        &format!("{}/expire", series_path(s)),
        &token(name),
        "{\"applyRetention\":true}",
    );
    let mut m = ctx.model.lock().unwrap();
    let sm = &mut m[s];
    sm.retention_ops -= 1;
    let r = r?;
    ctx.note(
        c,
        format!("expire {name} by retention: {} {}", r.status, r.text()),
    );
    match r.status {
        200 => {
            for e in expired_list(&r) {
                if sm.versions.get(&e).is_some_and(|v| !v.retention_may) {
                    return Err(format!(
                        "expire {name} by retention removed version {e}, which the retention keeps: {}",
                        r.text()
                    ));
                }
                sm.expired(e);
            }
            ctx.count("expire by retention");
        }
        409 => ctx.count("expire (409 busy)"),
        _ => {
            return Err(format!(
                "expire {name} by retention: {} {}",
                r.status,
                r.text()
            ))
        }
    }
    Ok(())
}

fn gc(ctx: &Ctx<'_>, c: usize, rng: &mut ChaCha8Rng) -> Step {
    let full = rng.random_bool(0.5);
    let below = if rng.random_bool(0.5) {
        1.0
    } else {
        (rng.random_range(0..=100) as f64) / 100.0
    };
    let body = format!("{{\"full\":{full},\"compactBelow\":{below}}}");
    ctx.note(c, format!("gc {body}"));
    let r = ctx.api("POST", "/v1/gc", ADMIN, &body)?;
    ctx.note(c, format!("gc {body}: {}", r.status));
    if r.status != 200 {
        return Err(format!("gc {body}: {} {}", r.status, r.text()));
    }
    ctx.count(if full { "gc full" } else { "gc" });
    let rep: serde_json::Value = serde_json::from_slice(&r.body).map_err(|e| format!("gc: {e}"))?;
    if rep["containersCompacted"].as_u64().unwrap_or(0) > 0 {
        ctx.count("gc that compacted");
    }
    Ok(())
}

fn set_retention(ctx: &Ctx<'_>, c: usize, rng: &mut ChaCha8Rng, s: usize) -> Step {
    let name = SERIES[s].0;
    let _one_at_a_time = ctx.retention_locks[s].lock().unwrap();
    let p = Policy::random(rng);
    {
        let mut m = ctx.model.lock().unwrap();
        m[s].policies.push(p.clone());
        m[s].refresh();
    }
    let r = ctx.api(
        "PUT",
        &format!("{}/retention", series_path(s)),
        &token(name),
        &p.json(),
    );
    let mut m = ctx.model.lock().unwrap();
    let sm = &mut m[s];
    let r = r?;
    ctx.note(c, format!("retention {name} {}: {}", p.json(), r.status));
    match r.status {
        // 201: the retention created the series (no push reached it yet).
        200 | 201 => {
            sm.confirmed = sm.policies.len() - 1;
            ctx.count("retention");
        }
        409 => {
            sm.policies.pop();
            ctx.count("retention (409 busy)");
        }
        _ => return Err(format!("retention {name}: {} {}", r.status, r.text())),
    }
    Ok(())
}

/// Lists a series: every version that had to exist throughout is listed,
/// and no expired version comes back.
fn list(ctx: &Ctx<'_>, c: usize, s: usize) -> Step {
    let name = SERIES[s].0;
    let (before, policies, shrinks) = {
        let m = ctx.model.lock().unwrap();
        let sm = &m[s];
        let st: BTreeMap<u32, (bool, bool, u64)> = sm
            .versions
            .iter()
            .map(|(n, v)| (*n, (sm.must_exist(*n), v.gone, v.risk)))
            .collect();
        let pending = sm.confirmed + 1 != sm.policies.len();
        (st, (!pending).then_some(sm.policies.len()), sm.shrinks)
    };
    let r = ctx.api(
        "GET",
        &format!("{}/versions", series_path(s)),
        &token(name),
        "",
    )?;
    if r.status != 200 {
        return Err(format!("list {name}: {} {}", r.status, r.text()));
    }
    let listed: BTreeSet<u32> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["number"].as_u64().unwrap() as u32)
        .collect();
    ctx.note(c, format!("list {name}: {listed:?}"));
    ctx.count("list");
    let mut m = ctx.model.lock().unwrap();
    let sm = &mut m[s];
    for (n, (must, was_gone, risk)) in &before {
        let v = &sm.versions[n];
        if *must && !listed.contains(n) && !v.gone && v.risk == *risk {
            return Err(format!(
                "list {name}: acknowledged version {n} disappeared; nothing expired it (listed {listed:?})"
            ));
        }
        if *was_gone && listed.contains(n) {
            return Err(format!(
                "list {name}: expired version {n} is listed again ({listed:?})"
            ));
        }
    }
    // Listed now, with the same retention and nothing expired since the
    // listing began: retention may remove it again only if the rules say so.
    if policies == Some(sm.policies.len())
        && shrinks == sm.shrinks
        && sm.confirmed + 1 == sm.policies.len()
    {
        for n in listed {
            if sm
                .versions
                .get(&n)
                .is_some_and(|v| v.retention_may && !v.gone)
            {
                let may = sm.retention_allows(n);
                sm.versions.get_mut(&n).unwrap().retention_may = may;
            }
        }
    }
    Ok(())
}

fn client(ctx: &Ctx<'_>, c: usize, rng: &mut ChaCha8Rng) -> Step {
    while !ctx.stop.load(Ordering::SeqCst) {
        let s = rng.random_range(0..SERIES.len());
        match rng.random_range(0..100) {
            0..28 => push(ctx, c, rng, s)?,
            28..48 => {
                let slow = rng.random_bool(0.4);
                pull(ctx, c, rng, s, slow)?
            }
            48..56 => slide(ctx, c, s)?,
            56..66 => expire_explicit(ctx, c, rng, s)?,
            66..70 => expire_retention(ctx, c, s)?,
            70..82 => gc(ctx, c, rng)?,
            82..87 => set_retention(ctx, c, rng, s)?,
            _ => list(ctx, c, s)?,
        }
    }
    Ok(())
}

// ---- after the load --------------------------------------------------------------

fn check_clean(store: &Path, when: &str) -> Result<serde_json::Value, String> {
    let c = json_of(&["check", "--store", store.to_str().unwrap()])?;
    if c["ok"] != true || !c["errors"].as_array().unwrap().is_empty() {
        return Err(format!("check {when}: {c}"));
    }
    let q = store.join("data").join("quarantine");
    if q.exists() {
        return Err(format!("check {when}: files were quarantined in {q:?}"));
    }
    Ok(c)
}

/// The server log must show no warning or error (failed maintenance, a
/// quarantined file, a freed file it could not remove, ...) and no restore
/// that failed for another reason than its version being expired meanwhile.
/// Returns how many scheduled gcs and retention passes did work.
fn scan_server_log(log: &str) -> Result<(u64, u64), String> {
    let (mut gcs, mut passes) = (0, 0);
    for l in log.lines() {
        let bad = l.contains("panicked")
            || l.contains(" WARN ")
            || l.contains(" ERROR ")
            || (l.contains("restore failed") && !l.contains("has no version"));
        if bad {
            return Err(format!("server log: {l}"));
        }
        gcs += u64::from(l.contains("scheduled gc "));
        passes += u64::from(l.contains("scheduled retention "));
    }
    Ok((gcs, passes))
}

/// Every acknowledged version is listed unless something may have expired
/// it, no expired or unknown version is listed, and each listed one
/// restores byte-exact. Returns how many were restored.
fn verify_offline(ctx: &Ctx<'_>, store: &Path, when: &str) -> Result<u64, String> {
    let st = store.to_str().unwrap();
    let m = ctx.model.lock().unwrap();
    let mut restored = 0;
    for (s, (name, _)) in SERIES.iter().enumerate() {
        let l = json_of(&["list", "--store", st, "--series", name])?;
        let listed: BTreeSet<u32> = l["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["number"].as_u64().unwrap() as u32)
            .collect();
        let sm = &m[s];
        for (n, v) in &sm.versions {
            if v.gone && listed.contains(n) {
                return Err(format!("{when}: {name} v{n} was expired but is listed"));
            }
            if sm.must_exist(*n) && !listed.contains(n) {
                return Err(format!(
                    "{when}: {name} v{n} was acknowledged, nothing expired it, and it is gone (listed {listed:?})"
                ));
            }
        }
        for n in &listed {
            let Some(v) = sm.versions.get(n) else {
                return Err(format!(
                    "{when}: {name} v{n} is listed but was never acknowledged"
                ));
            };
            let ver = n.to_string();
            let r = revault(&[
                "restore",
                "--store",
                st,
                "--series",
                name,
                "--version",
                &ver,
            ]);
            if !r.status.success() {
                return Err(format!(
                    "{when}: restore {name} v{n}: {}",
                    String::from_utf8_lossy(&r.stderr).trim()
                ));
            }
            let got = hex::encode(Sha256::digest(&r.stdout));
            if got != v.sha {
                return Err(format!("{when}: {name} v{n} restores different bytes"));
            }
            restored += 1;
        }
    }
    Ok(restored)
}

// ---- the test ----------------------------------------------------------------------

/// One schedule: a store, the server, the load, the verification.
fn run_schedule(seed: u64, dir: &Path, log: &Mutex<Vec<String>>, totals: &mut Totals) -> Step {
    let started = Instant::now();
    let store = dir.join("store");
    let st = store.to_str().unwrap().to_string();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Small containers and segments: little data makes many units and
    // containers, so gc and slides have plenty to move and free.
    json_of(&[
        "init",
        "--store",
        &st,
        "--container-mib",
        "1",
        "--segment-kib",
        "256",
        "--compression",
        "zstd:1",
    ])?;
    let tokens = dir.join("tokens");
    let mut tf = format!("{ADMIN} *\n");
    for ns in ["alpha", "beta", "gamma"] {
        tf.push_str(&format!("{} {ns}\n", token(&format!("{ns}/x"))));
    }
    std::fs::write(&tokens, tf).unwrap();
    let interval = format!("{}ms", rng.random_range(500..1500));
    let gc_interval = format!("{}ms", rng.random_range(500..1500));
    let srv = Server::start(
        &store,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--maintenance-interval",
            &interval,
            "--gc-interval",
            &gc_interval,
        ],
    );
    let ctx = Ctx {
        url: srv.url(),
        addr: srv.addr.clone(),
        dir,
        pool: make_pool(seed),
        model: Mutex::new((0..SERIES.len()).map(|_| SeriesModel::new()).collect()),
        contents: (0..SERIES.len()).map(|_| Mutex::new(Vec::new())).collect(),
        retention_locks: (0..SERIES.len()).map(|_| Mutex::new(())).collect(),
        log,
        started,
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
        counts: Mutex::new(BTreeMap::new()),
        pulls_verified: AtomicU64::new(0),
        next_id: AtomicU64::new(0),
        children: Mutex::new(BTreeMap::new()),
        server_log: srv.log.clone(),
    };
    ctx.note(
        0,
        format!("seed {seed}: scheduler every {interval}, gc every {gc_interval}"),
    );
    // Each series starts with a version (it fixes the unit) and a retention.
    for s in 0..SERIES.len() {
        push(&ctx, 0, &mut rng, s)?;
        if rng.random_bool(0.6) {
            set_retention(&ctx, 0, &mut rng, s)?;
        }
    }
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| ctx.watchdog(&done));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let mut r = ChaCha8Rng::seed_from_u64(seed ^ ((c as u64 + 1) << 48));
                let ctx = &ctx;
                sc.spawn(move || {
                    if let Err(e) = client(ctx, c, &mut r) {
                        ctx.fail(e);
                    }
                })
            })
            .collect();
        let load_end = Instant::now() + LOAD;
        while Instant::now() < load_end && !ctx.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
        ctx.stop.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    if let Some(f) = ctx.failure.lock().unwrap().take() {
        return Err(format!("{f}\nserver log: {:?}", srv.log));
    }
    let load_done = Instant::now();
    // A last listing of every series through the server.
    for s in 0..SERIES.len() {
        list(&ctx, 0, s)?;
    }
    srv.signal(libc::SIGTERM);
    let mut srv = srv;
    let status = srv.wait(Duration::from_secs(60));
    let server_log = srv.log_text();
    if !status.success() {
        return Err(format!("revault serve exited with {status}:\n{server_log}"));
    }
    let (gcs, passes) = scan_server_log(&server_log)?;
    check_clean(&store, "after the load")?;
    let mut restored = verify_offline(&ctx, &store, "after the load")?;
    json_of(&["gc", "--store", &st, "--full", "--compact-below", "1.0"])?;
    let c = check_clean(&store, "after a full gc")?;
    let orphans = orphan_warnings(&c);
    if !orphans.is_empty() {
        return Err(format!("orphans after a full gc: {orphans:?}"));
    }
    restored += verify_offline(&ctx, &store, "after a full gc")?;

    totals.schedules += 1;
    totals.scheduler.0 += gcs;
    totals.scheduler.1 += passes;
    totals.pulls_verified += ctx.pulls_verified.load(Ordering::SeqCst);
    totals.restores_verified += restored;
    for (k, v) in ctx.counts.lock().unwrap().iter() {
        *totals.ops.entry(k.clone()).or_default() += v;
    }
    eprintln!(
        "stress: seed {seed}: {} operations, scheduler: {gcs} gcs and {passes} retention passes, {} pulls and {restored} offline restores verified; load {:.1}s, verification {:.1}s",
        ctx.counts.lock().unwrap().values().sum::<u64>(),
        ctx.pulls_verified.load(Ordering::SeqCst),
        (load_done - started).as_secs_f64(),
        load_done.elapsed().as_secs_f64()
    );
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: expected a number"))
    })
}

#[test]
fn random_concurrent_operations_lose_nothing_acknowledged() {
    let replay = env_u64("REVAULT_STRESS_SEED");
    let budget = Duration::from_secs(env_u64("REVAULT_STRESS_SECONDS").unwrap_or(DEFAULT_SECONDS));
    let first = replay.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            % 1_000_000_000
    });
    eprintln!("stress: binary {}, first seed {first}", bin());
    let started = Instant::now();
    let mut totals = Totals::default();
    let mut longest = Duration::ZERO;
    for seed in first.. {
        let t = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("revault-stress-{seed}-"))
            .tempdir()
            .unwrap();
        let log = Mutex::new(Vec::new());
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_schedule(seed, dir.path(), &log, &mut totals)
        }));
        let failure = match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(p) => Some(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into()),
            ),
        };
        if let Some(f) = failure {
            let kept = dir.keep();
            let lines = log.into_inner().unwrap();
            let path = kept.join("operations.log");
            std::fs::write(&path, lines.join("\n")).unwrap();
            let tail = lines[lines.len().saturating_sub(60)..].join("\n");
            panic!(
                "stress schedule with seed {seed} failed: {f}\n\
                 replay: REVAULT_STRESS_SEED={seed}; store, server log and the whole operation log kept in {kept:?}\n\
                 last operations:\n{tail}"
            );
        }
        longest = longest.max(t.elapsed());
        if replay.is_some() || started.elapsed() + longest > budget {
            break;
        }
    }
    eprintln!(
        "stress: {} schedules in {:.0}s; operations: {:?}; scheduler: {} gcs, {} retention passes that slid or expired; versions verified: {} pulls, {} offline restores",
        totals.schedules,
        started.elapsed().as_secs_f64(),
        totals.ops,
        totals.scheduler.0,
        totals.scheduler.1,
        totals.pulls_verified,
        totals.restores_verified
    );
    // A run that never reached the races it is for proves nothing: every
    // kind of operation the races need must have happened.
    let ran = |prefix: &str| -> u64 {
        totals
            .ops
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    };
    let missing: Vec<&str> = [
        "push",
        "pull bytes slow",
        "pull blocks slow",
        "gc full",
        "gc that compacted",
        "expire version",
        "expire by retention",
        "slide",
        "retention",
    ]
    .into_iter()
    .filter(|k| ran(k) == 0)
    .collect();
    assert!(missing.is_empty(), "the load never ran: {missing:?}");
    assert!(totals.scheduler.0 > 0, "the scheduler never ran gc");
    assert!(
        totals.pulls_verified > 0 && totals.restores_verified > 0,
        "nothing was verified"
    );
}
