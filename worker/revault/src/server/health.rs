//! The store's health, and recovery from a full metadata disk without a
//! restart.
//!
//! After a write or flush fails for want of space, RocksDB stops taking
//! writes and stays stopped until it is reopened, even once space is back.
//! A server that went on as if nothing happened would answer every backup
//! with an error while `/readyz` said all was well. Instead:
//!
//! - A watcher probes the metadata with a tiny synced write: every
//!   [`PROBE_EVERY`], and at once after an engine failure (5xx).
//! - A failed probe makes the store *degraded*: `/readyz` answers 503 saying
//!   why, new work that writes is refused with 503, reads (listings,
//!   restores) are still served, `revault_store_degraded` is 1. `/healthz`
//!   stays 200: restarting would not free any space.
//! - Once the metadata's filesystem has room again ([`room_again`]), the
//!   server closes the store and opens it again: in-flight work gets
//!   `--reopen-grace` to finish, then it is cut (a backup then commits
//!   nothing; a restore's body breaks off, never looks complete). The
//!   reopened store is probed; if it takes writes the server is ready again.
//! - If work still holds the store after it was cut, the store cannot be
//!   closed: the server reports itself *wedged* and `/healthz` fails, so
//!   Kubernetes restarts it (without Kubernetes it tries again later).
//! - A reopen that fails leaves the store open read-only, if it opens, so
//!   reads go on; the next try reopens it read-write.
//! - A commit whose metadata write failed (RocksDB may also recover by
//!   itself once space is back) fails the probe too: the reopen is what
//!   settles its session's files.
//!
//! Nothing committed is at risk in any of this: the server only stops,
//! cuts uncommitted work and reopens (see docs/service.md, "What is
//! guaranteed").

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use revault_engine::{OpenMode, Store};
use tokio::sync::Notify;

use super::App;

/// How often a healthy store's metadata is probed.
const PROBE_EVERY: Duration = Duration::from_secs(10);
/// How often a degraded store looks for space again.
const SPACE_POLL: Duration = Duration::from_secs(1);
/// A reopen that fails (or is followed by the same failure) waits this long
/// before the next, doubling up to [`MAX_BACKOFF`]: a disk that fills again
/// at once does not cut restores over and over.
const MIN_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// After in-flight work was cut, how long it may take to let go of the
/// store: gc and slides are not cut, they finish their step.
const CUT_WAIT: Duration = Duration::from_secs(120);
/// Room the metadata's filesystem needs before a reopen is tried: this much
/// or 1% of it, whichever is more (RocksDB flushes its log to tables first).
const MIN_ROOM: u64 = 16 << 20;

#[derive(Clone, Debug)]
enum State {
    Healthy,
    /// The metadata takes no writes.
    Degraded {
        reason: String,
    },
    /// The store could not be closed for a reopen: only a restart helps.
    Wedged {
        reason: String,
    },
}

pub struct Health {
    state: Mutex<State>,
    /// Wakes the watcher to probe now (an engine failure was seen).
    kick: Notify,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            state: Mutex::new(State::Healthy),
            kick: Notify::new(),
        }
    }
}

impl Health {
    /// Why new work that writes is refused, if it is.
    pub fn refusal(&self) -> Option<String> {
        match &*self.state.lock().unwrap() {
            State::Healthy => None,
            State::Degraded { reason } | State::Wedged { reason } => Some(reason.clone()),
        }
    }

    /// Why `/healthz` fails: only when a restart is the way out.
    pub fn wedged(&self) -> Option<String> {
        match &*self.state.lock().unwrap() {
            State::Wedged { reason } => Some(reason.clone()),
            _ => None,
        }
    }

    /// Asks the watcher to probe the metadata now.
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    fn set(&self, s: State) {
        *self.state.lock().unwrap() = s;
    }
}

/// What a refused request or `/readyz` says while the store is degraded.
pub fn degraded_message(reason: &str) -> String {
    format!("the store is degraded and takes no new work until space is freed: {reason}")
}

/// Starts the watcher. `root` is the store's directory (to reopen it);
/// `grace` is how long in-flight work may run before a reopen cuts it.
pub fn spawn(app: Arc<App>, root: PathBuf, grace: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let meta_dir = root.join(revault_engine::META_DIR);
        let mut backoff = MIN_BACKOFF;
        let mut next_reopen = Instant::now();
        let mut last_reopen: Option<Instant> = None;
        loop {
            let degraded = app.health.refusal().is_some();
            let wait = if degraded { SPACE_POLL } else { PROBE_EVERY };
            tokio::select! {
                _ = app.health.kick.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            if app.draining.load(Ordering::SeqCst) {
                return;
            }
            // Wedged too: the holder may have let go since; the next reopen
            // (after the backoff) finds out.
            match probe(&app).await {
                Probe::Fine if degraded => recovered(&app, "the metadata takes writes again"),
                // Healthy for long after a reopen: the next failure is a new one.
                Probe::Fine if last_reopen.is_some_and(|t| t.elapsed() > MAX_BACKOFF * 2) => {
                    backoff = MIN_BACKOFF
                }
                Probe::Fine => {}
                Probe::Failed(reason) if !degraded => degrade(&app, reason),
                Probe::Failed(_) | Probe::Closed => {
                    if Instant::now() < next_reopen || !room_again(&meta_dir) {
                        continue;
                    }
                    last_reopen = Some(Instant::now());
                    match reopen(&app, &root, grace).await {
                        Ok(()) => recovered(&app, "the store was reopened"),
                        // Degraded, or wedged: only the reopen knows which
                        // (a wedged store once became "degraded" here, and
                        // /healthz never asked for the restart it needs).
                        Err(state) => {
                            tracing::warn!(state = ?state, retry_in = ?backoff, "reopening the store failed");
                            app.health.set(state);
                        }
                    }
                    // A store that degrades again soon after waits longer.
                    next_reopen = Instant::now() + backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    })
}

enum Probe {
    Fine,
    Failed(String),
    /// No store is open (a reopen failed half-way).
    Closed,
}

async fn probe(app: &Arc<App>) -> Probe {
    let Some(store) = app.open_store() else {
        return Probe::Closed;
    };
    let r = tokio::task::spawn_blocking(move || store.probe_metadata()).await;
    match r {
        Ok(Ok(())) => Probe::Fine,
        Ok(Err(e)) => Probe::Failed(format!("the store takes no writes ({e})")),
        Err(e) => Probe::Failed(format!("probing the metadata failed: {e}")),
    }
}

fn degrade(app: &App, reason: String) {
    tracing::error!(%reason, "store degraded: refusing new work, serving reads; it reopens by itself once space is freed");
    app.metrics.store_degraded.set(1);
    app.health.set(State::Degraded { reason });
}

fn recovered(app: &App, how: &str) {
    tracing::info!("{how}; the store takes new work again");
    app.metrics.store_degraded.set(0);
    app.health.set(State::Healthy);
}

/// True when the filesystem holding `dir` has room again (see [`MIN_ROOM`]).
fn room_again(dir: &Path) -> bool {
    match rustix::fs::statvfs(dir) {
        Ok(s) => {
            let available = s.f_bavail.saturating_mul(s.f_frsize);
            available >= room_needed(s.f_blocks.saturating_mul(s.f_frsize))
        }
        // Cannot tell: try, the reopen says what is wrong.
        Err(_) => true,
    }
}

/// Free bytes a filesystem of `size` bytes needs before a reopen: 1 % of
/// it, at least [`MIN_ROOM`], at most 1 GiB (1 % of a huge volume would be
/// tens of gigabytes, and a degraded server with that much free would never
/// come back).
fn room_needed(size: u64) -> u64 {
    MIN_ROOM.max((size / 100).min(1 << 30))
}

#[cfg(test)]
#[test]
fn the_room_a_reopen_waits_for_is_one_percent_within_bounds() {
    const GIB: u64 = 1 << 30;
    assert_eq!(room_needed(100 << 20), MIN_ROOM);
    assert_eq!(room_needed(50 * GIB), GIB / 2);
    assert_eq!(room_needed(10 << 40), GIB);
}

/// Closes the store once in-flight work has let go of it (cutting that work
/// after `grace`), and opens it again. On `Err` the state the server is in
/// now (degraded, or wedged if the store could not be closed) says why, and
/// the server keeps a store to read from if it can: the old one (wedged, or
/// shutting down meanwhile), or the store opened read-only.
async fn reopen(app: &Arc<App>, root: &Path, grace: Duration) -> Result<(), State> {
    if let Some(old) = app.take_store() {
        tracing::info!(grace = ?grace, "closing the store to reopen it");
        let let_go = released(app, &old, grace, false).await || {
            if !app.draining.load(Ordering::SeqCst) {
                let n = app.cancel_all();
                app.cut_inflight();
                tracing::warn!(
                    cancelled = n,
                    "reopen: in-flight work still running after the grace; cut it"
                );
            }
            released(app, &old, CUT_WAIT, true).await
        };
        if !let_go {
            app.put_store(old);
            if app.draining.load(Ordering::SeqCst) {
                return Err(State::Degraded {
                    reason: "the server is shutting down".into(),
                });
            }
            let reason = format!(
                "the store could not be closed to reopen it: work still held it {CUT_WAIT:?} after it was cut; restart the server"
            );
            tracing::error!(%reason, "store wedged");
            return Err(State::Wedged { reason });
        }
        // The last reference: dropping it closes RocksDB and the store lock.
        let _ = tokio::task::spawn_blocking(move || drop(old)).await;
    }
    let root = root.to_path_buf();
    let (store, result) = tokio::task::spawn_blocking(move || open_again(&root))
        .await
        .map_err(|e| State::Degraded {
            reason: format!("reopening the store failed: {e}"),
        })?;
    if let Some(st) = store {
        // Containers evicted to the remote are read through it by the new store too.
        if let Some(r) = app.durable.remote() {
            r.serve_cold_reads(&st);
        }
        app.put_store(Arc::new(st));
        app.metrics.store_reopens.inc();
        let a = app.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(st) = a.open_store() {
                a.refresh_all_series(&st);
            }
        })
        .await;
    }
    result.map_err(|reason| State::Degraded { reason })
}

/// Opens the store read-write and probes it. If that fails, the store
/// opened read-only (if it opens) still serves reads until the next try.
fn open_again(root: &Path) -> (Option<Store>, Result<(), String>) {
    let err = match Store::open(root, OpenMode::ReadWrite, "revault serve") {
        Ok(st) => {
            st.settle();
            match st.probe_metadata().and_then(|()| super::with_settings(st)) {
                Ok(st) => return (Some(st), Ok(())),
                Err(e) => format!("the reopened store takes no writes ({e})"),
            }
        }
        Err(e) => format!("reopening the store failed: {e}"),
    };
    let ro = Store::open(root, OpenMode::ReadOnly, "revault serve").ok();
    (ro, Err(err))
}

/// Waits up to `limit` for every other holder of `store` to drop it (not
/// past the start of a shutdown). With `cut`, in-flight work is cut every
/// round: a request that took the store just before it was taken may
/// register its work only after the first cut (no new request gets the
/// store meanwhile).
async fn released(app: &App, store: &Arc<Store>, limit: Duration, cut: bool) -> bool {
    let deadline = Instant::now() + limit;
    while Arc::strong_count(store) > 1 {
        if Instant::now() >= deadline || app.draining.load(Ordering::SeqCst) {
            return false;
        }
        if cut {
            app.cancel_all();
            app.cut_inflight();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}
