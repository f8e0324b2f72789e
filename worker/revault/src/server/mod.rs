//! `revault serve`: the worker as an HTTP service.
//!
//! One process opens its store once, read-write, and serves the routes of
//! `worker/api/openapi.yaml` (see [`routes`]). The engine is synchronous:
//! backups and restores run on tokio's blocking pool, bridged to the HTTP
//! bodies by bounded channels ([`stream`]), so memory is bounded whatever the
//! stream sizes. See `docs/service.md`.

pub mod api;
pub mod auth;
pub mod backup;
pub mod conn;
pub mod durable;
pub mod error;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod objects;
pub mod quota;
pub mod request;
pub mod restore;
pub mod routes;
pub mod scheduler;
pub mod slots;
pub mod stream;
pub mod tls;
mod watched;
pub mod wire;
pub mod work;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use revault_engine::{DedupDomain, InitOptions, OpenMode, Store};
use tokio::sync::{watch, Notify};

use auth::Auth;
use metrics::Metrics;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Store directory.
    #[arg(long, env = "REVAULT_STORE")]
    pub store: PathBuf,
    /// Create the store (default settings) if the directory is not one yet.
    #[arg(long)]
    pub init: bool,
    /// Address to listen on, e.g. 0.0.0.0:8420 or 127.0.0.1:0 (port 0: any free
    /// port; the address is logged and written to --addr-file).
    #[arg(long, default_value = "127.0.0.1:8420")]
    pub listen: SocketAddr,
    /// Write the address actually bound to this file once listening.
    #[arg(long)]
    pub addr_file: Option<PathBuf>,
    /// Bearer tokens, one per line: `TOKEN NAMESPACES` (`*` or a,b,c).
    /// Reloaded when the file changes. Without it, auth is disabled.
    #[arg(long, env = "REVAULT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key. Read again when it
    /// changes (checked at most every --token-reload), so a rotated certificate needs no restart.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// How often the scheduler slides and applies retention to series whose
    /// retention is automatic (e.g. 5m, 30s; 0 disables).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub maintenance_interval: Duration,
    /// How often the scheduler runs gc (0 disables).
    #[arg(long, default_value = "6h", value_parser = parse_duration)]
    pub gc_interval: Duration,
    /// On SIGTERM/SIGINT: keep serving (readiness failing) this long first,
    /// so load balancers stop sending new requests.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// Then let in-flight requests finish for at most this long; backups
    /// still running after it are discarded (never half-visible).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub grace_period: Duration,
    /// Restore memory per request is capped at this many MiB.
    #[arg(long, default_value_t = 1024)]
    pub max_cache_mib: u64,
    /// How often the token file (and the TLS certificate) is checked for changes.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub token_reload: Duration,
    /// When another process holds the store (e.g. the previous worker pod of
    /// a force-deleted one, still exiting), wait this long for it before
    /// failing; readiness stays false meanwhile.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub lock_wait: Duration,
    /// When the store is reopened to recover from a full metadata disk,
    /// in-flight work may run this long before it is cut (docs/service.md).
    #[arg(long, env = "REVAULT_REOPEN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub reopen_grace: Duration,
    /// Look fingerprints up in a sampled index of this many MiB of memory instead of the
    /// exact index on disk (docs/architecture.md, "The index"): for stores whose exact
    /// index outgrows the node's memory. 0: the exact index.
    #[arg(long, env = "REVAULT_INDEX_MIB", default_value_t = 0)]
    pub index_mib: u64,
    /// What backups deduplicate against: `store` (everything stored, the most space
    /// saved) or `namespace` (only data of series of the same namespace, so a backup's
    /// `newBytes` says nothing about other namespaces; docs/service.md, "Dedup domains").
    /// Switching is safe at any time.
    #[arg(long, env = "REVAULT_DEDUP_DOMAIN", default_value = "store")]
    pub dedup_domain: DedupDomain,
    /// Per-namespace quotas, `NAMESPACE BYTES` per line (docs/service.md, "Quotas"):
    /// a namespace whose versions store that much takes no new backup. Re-read when it
    /// changes, like the token file.
    #[arg(long, env = "REVAULT_QUOTA_FILE")]
    pub quota_file: Option<PathBuf>,
    #[command(flatten)]
    pub limits: limits::LimitArgs,
    #[command(flatten)]
    pub remote: durable::RemoteArgs,
}

/// `--index-mib`, for every open of the store in this process (the first and the reopens
/// after a full metadata disk).
static INDEX_MIB: AtomicU64 = AtomicU64::new(0);
/// `--dedup-domain` (true: namespace), for every open alike.
static NAMESPACE_DOMAINS: AtomicBool = AtomicBool::new(false);

/// What backups deduplicate against in this process (`--dedup-domain`).
pub(crate) fn dedup_domain() -> DedupDomain {
    if NAMESPACE_DOMAINS.load(Ordering::Relaxed) {
        DedupDomain::Namespace
    } else {
        DedupDomain::Store
    }
}

/// Gives a store opened read-write the settings of this process that are not stored with
/// it: the sampled index `--index-mib` asks for and the `--dedup-domain`.
pub(crate) fn with_settings(mut st: Store) -> revault_engine::Result<Store> {
    if NAMESPACE_DOMAINS.load(Ordering::Relaxed) {
        st.set_dedup_domain(DedupDomain::Namespace)?;
    }
    let mib = INDEX_MIB.load(Ordering::Relaxed);
    if mib > 0 {
        st.use_sampled_index(usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX))?;
        if let Some(s) = st.sampled_index_stats() {
            tracing::info!(
                budget_mib = mib,
                sampling = format!("1/{}", 1u64 << s.shift),
                sampled = s.sampled,
                "backups look up in a sampled index"
            );
        }
    }
    Ok(st)
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (e.g. 30s, 5m, 1h)"))
}

/// Sets up `tracing` for the server: info by default (REVAULT_LOG overrides),
/// text or JSON lines on stderr.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("REVAULT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().flatten_event(true).with_current_span(false).init(),
    }
}

/// Restore reports kept for `/v1/restores/{id}`.
const MAX_REPORTS: usize = 1024;

pub struct RestoreEntry {
    pub owner: String,
    pub report: watch::Receiver<Option<wire::RestoreReport>>,
}

#[derive(Default)]
pub struct Reports {
    map: HashMap<String, RestoreEntry>,
    order: VecDeque<String>,
}

impl Reports {
    pub fn insert(&mut self, id: String, e: RestoreEntry) {
        while self.order.len() >= MAX_REPORTS {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        self.order.push_back(id.clone());
        self.map.insert(id, e);
    }

    pub fn get(
        &self,
        id: &str,
        owner: &str,
    ) -> Option<watch::Receiver<Option<wire::RestoreReport>>> {
        self.map
            .get(id)
            .filter(|e| e.owner == owner)
            .map(|e| e.report.clone())
    }
}

/// Engine work in flight (backups, restores, maintenance): drained on shutdown.
#[derive(Default)]
pub struct Inflight {
    count: AtomicUsize,
    idle: Notify,
    next: AtomicU64,
    /// Work that has ended so far (see `spawn_memory_release`).
    ended: AtomicU64,
    cancels: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

pub struct InflightGuard {
    app: Arc<App>,
    id: u64,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.app.inflight.cancels.lock().unwrap().remove(&self.id);
        self.app.inflight.ended.fetch_add(1, Ordering::SeqCst);
        if self.app.inflight.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.app.inflight.idle.notify_waiters();
        }
    }
}

/// A backup in progress through this server (`GET …/backup`).
pub struct InflightBackup {
    pub started_unix: i64,
    pub logical_bytes: AtomicU64,
    /// Waiting for a backup slot ([`slots`]).
    pub queued: AtomicBool,
    /// Why it was withdrawn while queued, if it was ([`slots::Withdrawn`]).
    pub withdrawn: std::sync::OnceLock<slots::Withdrawn>,
}

pub struct App {
    /// The open store; `None` until it is open, and while it is reopened.
    store: RwLock<Option<Arc<Store>>>,
    /// Whether the store takes writes (see [`health`]).
    pub health: health::Health,
    pub auth: Auth,
    pub quotas: quota::Quotas,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub draining: AtomicBool,
    pub reports: Mutex<Reports>,
    /// Backups in progress through this server (at most one per series),
    /// with how far each got.
    pub backups: Mutex<HashMap<String, Arc<InflightBackup>>>,
    /// How many of them may run at once (`--max-backups`).
    pub backup_slots: slots::BackupSlots,
    /// Object buckets (one writer per bucket).
    pub objects: revault_objects::Objects,
    /// The store's remote and its uploader's state.
    pub durable: durable::Durable,
    pub inflight: Inflight,
    pub max_cache_mib: u64,
    /// Bumped whenever the server gives up on in-flight work (shutdown's
    /// grace is over, or the store is reopened): bodies being received or
    /// sent when it changes break off (see [`stream`]).
    pub abort: watch::Sender<u64>,
}

impl App {
    pub fn new(
        auth: Auth,
        quotas: quota::Quotas,
        max_cache_mib: u64,
        max_backups: usize,
    ) -> Arc<App> {
        Arc::new(App {
            store: RwLock::new(None),
            health: health::Health::default(),
            auth,
            quotas,
            metrics: Arc::new(Metrics::new()),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            reports: Mutex::new(Reports::default()),
            backups: Mutex::new(HashMap::new()),
            backup_slots: slots::BackupSlots::new(max_backups),
            objects: revault_objects::Objects::new(),
            durable: durable::Durable::default(),
            inflight: Inflight::default(),
            max_cache_mib,
            abort: watch::Sender::new(0),
        })
    }

    /// The store for work that writes: refused (503) while the store is
    /// degraded, as well as whenever [`App::store_to_read`] refuses.
    pub fn store(&self) -> Result<Arc<Store>, error::ApiError> {
        let store = self.store_to_read()?;
        if let Some(why) = self.health.refusal() {
            return Err(error::ApiError::unavailable(health::degraded_message(&why)));
        }
        if let Some(why) = self.durable.fenced() {
            return Err(error::ApiError::fenced(why));
        }
        Ok(store)
    }

    /// The store for reads: while it is open and the server not draining.
    pub fn store_to_read(&self) -> Result<Arc<Store>, error::ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(error::ApiError::shutting_down(
                "the server is shutting down",
            ));
        }
        self.open_store()
            .ok_or_else(|| match self.health.refusal() {
                Some(why) => {
                    error::ApiError::unavailable(format!("the store is being reopened: {why}"))
                }
                None => error::ApiError::starting(),
            })
    }

    /// The store if it is open, whatever else holds.
    pub fn open_store(&self) -> Option<Arc<Store>> {
        self.store.read().unwrap().clone()
    }

    fn take_store(&self) -> Option<Arc<Store>> {
        self.store.write().unwrap().take()
    }

    fn put_store(&self, store: Arc<Store>) {
        *self.store.write().unwrap() = Some(store);
    }

    /// Breaks off every request body being received or sent now.
    fn cut_inflight(&self) {
        self.abort.send_modify(|g| *g += 1);
    }

    /// Registers engine work; `cancel` is set if shutdown's grace runs out.
    pub fn begin(self: &Arc<Self>, cancel: Option<Arc<AtomicBool>>) -> InflightGuard {
        self.inflight.count.fetch_add(1, Ordering::SeqCst);
        let id = self.inflight.next.fetch_add(1, Ordering::SeqCst);
        if let Some(c) = cancel {
            self.inflight.cancels.lock().unwrap().insert(id, c);
        }
        InflightGuard {
            app: self.clone(),
            id,
        }
    }

    fn cancel_all(&self) -> usize {
        let c = self.inflight.cancels.lock().unwrap();
        for f in c.values() {
            f.store(true, Ordering::SeqCst);
        }
        c.len()
    }

    async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.inflight.idle.notified();
            if self.inflight.count.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.inflight.count.load(Ordering::SeqCst) == 0;
            }
        }
    }

    /// Refreshes the store-wide gauges (cheap: one metadata read). Done on
    /// every scrape of `/metrics`, the only reader of these gauges, so the
    /// operations that change the totals need not refresh them.
    pub fn refresh_totals(&self, store: &Store) {
        if let Ok(t) = store.totals() {
            let m = &self.metrics;
            m.stored_bytes.set(t.container_bytes as i64);
            m.logical_bytes.set(t.logical_bytes as i64);
            m.unique_bytes.set(t.unit_vbytes as i64);
            m.versions.set(t.versions as i64);
            m.containers.set(t.containers as i64);
            m.dedup_ratio.set(t.dedup_ratio());
        }
        self.metrics
            .remote_lag_seconds
            .set(self.durable.lag_seconds());
        self.metrics
            .remote_fenced
            .set(self.durable.fenced().is_some() as i64);
    }

    /// Refreshes every series' gauges (at start, after a reopen).
    pub fn refresh_all_series(&self, store: &Store) {
        if let Ok(all) = store.list_series() {
            for s in all {
                self.refresh_series(store, &s.name);
            }
        }
    }

    /// Refreshes one series' gauges from its versions.
    pub fn refresh_series(&self, store: &Store, name: &str) {
        match store.series(name).and_then(|s| store.versions(&s)) {
            Ok(vs) => {
                let logical = vs.iter().map(|v| v.logical_bytes).sum();
                let new = vs.iter().map(|v| v.new_vbytes).sum();
                self.metrics.set_series(name, logical, new, true);
            }
            Err(_) => self.metrics.set_series(name, 0, 0, false),
        }
    }
}

pub fn run(a: ServeArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("revault-serve")
        .build()
        .context("starting the async runtime")?;
    let r = rt.block_on(serve(a));
    rt.shutdown_timeout(Duration::from_secs(5));
    r
}

/// The connection-serving task (see [`conn::serve`]).
type ServerTask = tokio::task::JoinHandle<std::io::Result<()>>;

/// The server's life: listen, open the store (ready from then on), serve
/// until a signal, then drain.
async fn serve(a: ServeArgs) -> Result<()> {
    let auth = Auth::load(a.token_file.clone())?;
    INDEX_MIB.store(a.index_mib, Ordering::Relaxed);
    NAMESPACE_DOMAINS.store(a.dedup_domain == DedupDomain::Namespace, Ordering::Relaxed);
    tracing::info!(dedup_domain = %a.dedup_domain, "backups deduplicate within the {}", a.dedup_domain);
    let quotas = quota::Quotas::load(a.quota_file.clone());
    let app = App::new(
        auth,
        quotas,
        a.max_cache_mib.max(1),
        usize::from(a.limits.max_backups),
    );
    app.metrics.tokens.set(app.auth.count() as i64);
    let (mut server, handle) = listen(&a, &app)?;
    let (store, remote, fenced) = tokio::task::spawn_blocking({
        let (root, init, lock_wait, ra) = (a.store.clone(), a.init, a.lock_wait, a.remote.clone());
        move || open_store(&root, init, lock_wait, &ra)
    })
    .await
    .context("opening the store")??;
    app.durable.set_remote(remote);
    if let Some(why) = fenced {
        app.durable.set_fenced(why);
    }
    become_ready(&app, Arc::new(store)).await?;
    let uploader = durable::spawn(app.clone(), &a.remote);

    auth::spawn_reloader(app.clone(), a.token_reload.max(Duration::from_millis(100)));
    let sched = scheduler::spawn(app.clone(), a.maintenance_interval, a.gc_interval);
    let watcher = health::spawn(app.clone(), a.store.clone(), a.reopen_grace);
    spawn_memory_release(app.clone());

    // Run until a signal (or the server fails).
    tokio::select! {
        r = &mut server => {
            app.ready.store(false, Ordering::SeqCst);
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("the server failed")),
                Err(e) => Err(anyhow::Error::new(e).context("the server task failed")),
            };
        }
        sig = shutdown_signal() => tracing::info!(signal = sig, "shutting down: readiness off"),
    }
    app.ready.store(false, Ordering::SeqCst);
    if !a.shutdown_delay.is_zero() {
        tokio::time::sleep(a.shutdown_delay).await;
    }
    // Stop accepting; let in-flight requests finish within the grace period.
    app.draining.store(true, Ordering::SeqCst);
    sched.abort();
    uploader.abort();
    // The watcher is not aborted: it stops by itself when draining, and a
    // reopen under way hands the store back instead of dropping it here.
    drop(watcher);
    drain(&app, server, handle, a.grace_period).await;
    durable::final_sync(&app, FINAL_SYNC_LIMIT).await;
    Ok(())
}

/// How long a shutting-down worker tries to hand its last changes to the bucket.
const FINAL_SYNC_LIMIT: Duration = Duration::from_secs(30);

/// Binds the listening socket and starts serving connections (readiness
/// stays false until the store is open); writes `--addr-file`.
fn listen(a: &ServeArgs, app: &Arc<App>) -> Result<(ServerTask, conn::Shutdown)> {
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => {
            // Looked at as often as the token file: a rotated certificate arrives the same way.
            let files = tls::CertFiles::load(c, k, a.token_reload.max(Duration::from_millis(100)))?;
            Some(tls::server_config(files)?)
        }
        _ => None,
    };
    // Connections and the store's files share the open-file limit.
    let open_files = limits::raise_open_files();
    let caps = limits::connection_caps(&a.limits, open_files);
    if caps.0 < a.limits.max_connections {
        tracing::warn!(
            asked = a.limits.max_connections,
            open_files,
            "--max-connections lowered to half the open-file limit"
        );
    }
    tracing::info!(
        "connection caps: {} in all (open-file limit {open_files}), {} per client address",
        caps.0,
        caps.1
    );
    let listener = std::net::TcpListener::bind(a.listen)
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    let addr = listener.local_addr()?;
    let router = limits::pace_bodies(
        routes::router(app.clone()),
        limits::Pace::new(&a.limits),
        app.metrics.clone(),
    );
    // Request heads over 64 KiB or with over 100 headers get 431.
    let served = conn::serve(listener, router, tls, &a.limits, caps, app.metrics.clone())?;
    tracing::info!(
        %addr,
        tls = a.tls_cert.is_some(),
        auth = app.auth.enabled(),
        store = %a.store.display(),
        "listening"
    );
    if let Some(f) = &a.addr_file {
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, addr.to_string())
            .and_then(|_| std::fs::rename(&tmp, f))
            .with_context(|| format!("cannot write {}", f.display()))?;
    }
    Ok(served)
}

/// Opens the store read-write (creating it with `init`, or rebuilding it from its remote
/// with `--recover`), waiting up to `lock_wait` for another process that holds it to exit,
/// and attaches its remote.
/// A store, its remote, and why it takes no writes (it was rebuilt elsewhere), if so.
type Opened = (Store, Option<revault_remote::Remote>, Option<String>);

fn open_store(
    root: &Path,
    init: bool,
    lock_wait: Duration,
    ra: &durable::RemoteArgs,
) -> Result<Opened> {
    if init && !root.join("revault.store").exists() {
        if let Some((store, remote)) = durable::recover_if_asked(root, ra)? {
            return Ok((with_settings(store)?, remote, None));
        }
        Store::init(root, &InitOptions::default())?;
        tracing::info!(store = %root.display(), "initialised a new store");
    }
    let store = open_locked(root, lock_wait)?;
    let remote = durable::attach(&store, ra)?;
    // A store that was rebuilt elsewhere while this copy slept (its node was lost, or an
    // adopted store's pod came back to a host it left) must not serve as if current.
    if let Some(r) = &remote {
        match r.check_fence() {
            Err(e @ revault_remote::RemoteError::Fenced { .. }) => {
                if durable::superseded(root, ra, &e)? {
                    drop(store);
                    drop(remote);
                    return open_store(root, init, lock_wait, ra);
                }
                return Ok((store, remote, Some(e.to_string())));
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "the remote is not reachable; the uploader checks again")
            }
            Err(e) => return Err(e.into()),
            Ok(()) => {}
        }
    }
    Ok((store, remote, None))
}

/// Opens the store read-write, waiting up to `lock_wait` for another process that holds it
/// to exit.
pub(crate) fn open_locked(root: &Path, lock_wait: Duration) -> Result<Store> {
    let deadline = std::time::Instant::now() + lock_wait;
    let mut said = false;
    loop {
        match Store::open(root, OpenMode::ReadWrite, "revault serve") {
            Err(revault_engine::Error::Locked { holder, .. })
                if std::time::Instant::now() < deadline =>
            {
                if !said {
                    tracing::warn!(%holder, wait = ?lock_wait, "the store is locked; waiting for its holder to exit");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            r => {
                let st = r?;
                st.settle();
                return Ok(with_settings(st)?);
            }
        }
    }
}

/// Hands the open store to the app, with its series' gauges filled in:
/// from now on the server is ready.
async fn become_ready(app: &Arc<App>, store: Arc<Store>) -> Result<()> {
    {
        let st = store.clone();
        let app2 = app.clone();
        tokio::task::spawn_blocking(move || app2.refresh_all_series(&st)).await?;
    }
    app.put_store(store);
    app.ready.store(true, Ordering::SeqCst);
    tracing::info!("store open; ready");
    Ok(())
}

/// Lets in-flight requests finish for at most `grace`, then cuts what is
/// left (unfinished backups are discarded, never half-visible) and waits
/// for engine work to end before the store closes.
async fn drain(app: &Arc<App>, mut server: ServerTask, handle: conn::Shutdown, grace: Duration) {
    tracing::info!(grace = ?grace, "draining in-flight requests");
    handle.graceful();
    let grace = tokio::time::sleep(grace);
    tokio::pin!(grace);
    tokio::select! {
        _ = &mut server => {}
        _ = &mut grace => {
            // Give up on what is still running: unfinished backups are
            // discarded (their bodies count as cut short, their engine runs
            // are cancelled) before the connections are closed.
            let n = app.cancel_all();
            app.cut_inflight();
            tracing::warn!(requests = handle.connection_count(), backups = n, "grace period over: closing connections, discarding unfinished backups");
            tokio::time::sleep(Duration::from_millis(200)).await;
            handle.close();
            let _ = server.await;
        }
    }
    app.cancel_all();
    app.cut_inflight();
    // Engine work still running (a backup committing, a restore ending)
    // finishes or is cancelled before the store closes.
    if !app.wait_idle(Duration::from_secs(30)).await {
        tracing::warn!("engine work still running after shutdown; exiting anyway");
    }
    tracing::info!("stopped");
}

/// Hands the memory the allocator kept for reuse (see `crate::alloc`) back
/// to the kernel once the server has been idle for a while: engine work has
/// ended, and none ran or ended during a whole tick of a second. After a
/// burst of backups and restores the server goes back to its idle size
/// instead of holding its peak; between jobs that follow each other, freed
/// memory is reused rather than faulted in again.
fn spawn_memory_release(app: Arc<App>) {
    tokio::spawn(async move {
        // `ended` when memory was last released, and at the last tick.
        let (mut released_at, mut seen) = (0, 0);
        let mut t = tokio::time::interval(Duration::from_secs(1));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            let ended = app.inflight.ended.load(Ordering::SeqCst);
            let busy = app.inflight.count.load(Ordering::SeqCst) > 0;
            if !busy && ended == seen && ended != released_at {
                released_at = ended;
                let _ = tokio::task::spawn_blocking(crate::alloc::release_free).await;
            }
            seen = ended;
        }
    });
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
