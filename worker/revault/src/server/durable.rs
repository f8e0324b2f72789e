//! The worker's durable tier: its store's remote, the background uploader, and what the API
//! and `/metrics` say about it.
//!
//! A backup is acknowledged (201) when its commit is durable on the worker's disks; the
//! uploader makes it durable in the bucket soon after, without the backup waiting. It syncs
//! ([`revault_remote::Remote::sync`]) whenever the store changed, at most every
//! `--sync-interval`; a bucket that is away only delays it (retried with backoff up to a
//! minute, `revault_remote_lag_seconds` grows, series bodies keep their older
//! `durableVersion`). A store fenced out by a newer generation (recovered on another node)
//! takes no more writes: requests that would write get 409 `remote_fenced`.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use revault_engine::Store;
use revault_remote::{EvictOptions, Remote, RemoteError};

use super::App;

/// `serve`'s remote flags.
#[derive(Args, Clone, Debug)]
pub struct RemoteArgs {
    /// Keep an encrypted copy of the store in this bucket (s3://BUCKET[/PREFIX]); given to a
    /// store without a remote, it becomes its remote. Credentials and endpoint from the
    /// standard AWS_* variables.
    #[arg(long, env = "REVAULT_REMOTE")]
    pub remote: Option<String>,
    /// The key file of the remote (created if missing when the remote is new).
    #[arg(long, env = "REVAULT_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// A new remote writes every object with S3 Object Lock (compliance mode), kept this many
    /// days (at least the longest keepWithin of the store's series).
    #[arg(long, env = "REVAULT_OBJECT_LOCK_DAYS", value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub object_lock_days: Option<u32>,
    /// With --init: when the store directory is new and the remote holds a store, rebuild it
    /// from the remote (a node that lost its disk) instead of refusing. Only the node whose
    /// store it is does so (the newest claim on the remote is its own); --adopt takes it over
    /// from wherever it is served.
    #[arg(long)]
    pub recover: bool,
    /// With --recover: take over the store whoever holds it (the operator's rebuild of a lost
    /// node's store on another node); a local copy another rebuild superseded is moved aside
    /// (kept, never deleted) and rebuilt.
    #[arg(long, requires = "recover")]
    pub adopt: bool,
    /// Upload at most this often (changes are batched into one head).
    #[arg(long, default_value = "5s", value_parser = super::parse_duration)]
    pub sync_interval: Duration,
    /// Evict from local disk the containers no live version reads once they are this old
    /// and in the bucket (restores read them back on demand); 0 keeps everything local.
    #[arg(long, default_value = "0", value_parser = super::parse_duration)]
    pub evict_after: Duration,
}

/// The uploader's state, for the API and `/metrics`.
#[derive(Default)]
pub struct Durable {
    remote: Mutex<Option<Remote>>,
    /// When the store was first seen ahead of the bucket since the last sync that caught up.
    behind_since: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
    fenced: Mutex<Option<String>>,
}

impl Durable {
    pub fn remote(&self) -> Option<Remote> {
        self.remote.lock().unwrap().clone()
    }

    pub fn set_remote(&self, r: Option<Remote>) {
        *self.remote.lock().unwrap() = r;
    }

    /// Refuses writes from now on: the store was taken over by a newer generation.
    pub fn set_fenced(&self, why: String) {
        *self.fenced.lock().unwrap() = Some(why);
    }

    /// Why writes are refused: the store was taken over by a newer generation.
    pub fn fenced(&self) -> Option<String> {
        self.fenced.lock().unwrap().clone()
    }

    /// The newest version of `series` the bucket holds (`None` without a remote).
    pub fn durable_version(&self, series: &str) -> Option<u32> {
        self.remote()?.durable_version(series)
    }

    /// Seconds since the oldest change the bucket does not hold yet (0 when it holds all).
    pub fn lag_seconds(&self) -> f64 {
        self.behind_since
            .lock()
            .unwrap()
            .map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// What `GET /v1/stats` says of the remote.
    pub fn stats(&self) -> Option<super::wire::RemoteStats> {
        let r = self.remote()?;
        Some(super::wire::RemoteStats {
            url: r.url().to_string(),
            store: r.store_id().to_string(),
            generation: r.generation(),
            head_time: r.head().map(|h| h.time),
            lag_seconds: self.lag_seconds(),
            last_error: self.last_error.lock().unwrap().clone(),
            fenced: self.fenced().is_some(),
        })
    }
}

/// The store at `root` was superseded: another rebuild of it owns its remote now. An adopted
/// store's pod (--adopt) moves this copy aside — kept, never deleted — and rebuilds the store
/// from the remote; any other worker goes on with it fenced (reads only, 409 on writes).
pub fn superseded(root: &std::path::Path, a: &RemoteArgs, e: &RemoteError) -> anyhow::Result<bool> {
    if !a.adopt {
        tracing::error!(error = %e, "this store was rebuilt elsewhere: serving reads only");
        return Ok(false);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = root.with_file_name(format!(
        "{}.superseded-{stamp}",
        root.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    tracing::warn!(error = %e, aside = %aside.display(), "this copy of the store was superseded: moving it aside and rebuilding it from the remote");
    std::fs::rename(root, &aside).map_err(|err| {
        anyhow::anyhow!(
            "moving {} aside to {}: {err}",
            root.display(),
            aside.display()
        )
    })?;
    Ok(true)
}

/// Attaches (or gives) the store its remote as `a` says; `None` when it has none.
pub fn attach(store: &Store, a: &RemoteArgs) -> anyhow::Result<Option<Remote>> {
    let key = a.key_file.as_deref();
    if let Some(r) = Remote::attach(store, key)? {
        if let Some(url) = &a.remote {
            let want = revault_remote::RemoteUrl::parse(url)?;
            anyhow::ensure!(
                &want == r.url(),
                "the store's remote is {}, not {want} (--remote); a store keeps its remote",
                r.url()
            );
        }
        return Ok(Some(r));
    }
    let Some(url) = &a.remote else {
        return Ok(None);
    };
    let Some(key_file) = a.key_file.clone() else {
        anyhow::bail!("--remote needs --key-file (or REVAULT_KEY_FILE)");
    };
    let (r, rep) = Remote::init(
        store,
        &revault_remote::InitRemote {
            url: revault_remote::RemoteUrl::parse(url)?,
            key_file,
            object_lock: a.object_lock_days.map(|days| revault_remote::ObjectLock {
                compliance: true,
                seconds: u64::from(days) * 86_400,
            }),
        },
    )?;
    tracing::info!(remote = %r.url(), store = %rep.store, created_bucket = rep.created_bucket, created_key_file = rep.created_key_file, "the store has a remote now");
    Ok(Some(r))
}

/// `serve --init --recover`: a new store directory whose remote holds a store is rebuilt from
/// it (a node that came back with an empty disk); `None` when there is nothing to rebuild.
pub fn recover_if_asked(
    root: &std::path::Path,
    a: &RemoteArgs,
) -> anyhow::Result<Option<(Store, Option<Remote>)>> {
    let (true, Some(url), Some(key_file)) = (a.recover, &a.remote, &a.key_file) else {
        return Ok(None);
    };
    let url_parsed = revault_remote::RemoteUrl::parse(url)?;
    if !a.adopt {
        // A node that comes back with an empty disk rebuilds its own store, never one that was
        // rebuilt and is served elsewhere meanwhile (that would fence the serving copy out).
        if let Some(c) = revault_remote::owner(&url_parsed, key_file)? {
            let me = revault_remote::host();
            anyhow::ensure!(
                c.host == me,
                "the store at {url} is served from {} since {} (generation {}), not from this node ({me}): it was rebuilt there after this node was lost. This worker does not take it back; see docs/operator.md, \"Losing a node\"",
                c.host,
                c.time,
                c.generation
            );
        }
    }
    let opts = revault_remote::RecoverOptions {
        url: url_parsed,
        key_file: key_file.clone(),
        store: root.to_path_buf(),
        data_dir: None,
        lazy: false,
    };
    match revault_remote::recover(&opts) {
        Ok((store, remote, rep)) => {
            tracing::info!(remote = %url, generation = rep.generation, head = %rep.head, series = rep.series.len(), containers = rep.containers_downloaded, seconds = rep.seconds, "rebuilt the store from its remote");
            store.settle();
            Ok(Some((store, Some(remote))))
        }
        // A worker that starts on an empty disk with a remote that holds nothing yet starts
        // a new store; one adopting a lost node's store must not serve an empty one under
        // that node's series (the operator adopts only a store the bucket holds versions of).
        Err(e @ RemoteError::NoStore { .. }) if a.adopt => Err(anyhow::Error::new(e).context(
            "adopting a lost node's store: the remote holds nothing to rebuild it from, and an empty store must not be served in its place",
        )),
        Err(RemoteError::NoStore { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How often an idle worker checks that its store was not rebuilt elsewhere.
const FENCE_EVERY: Duration = Duration::from_secs(30);

/// Starts the uploader.
pub fn spawn(app: Arc<App>, a: &RemoteArgs) -> tokio::task::JoinHandle<()> {
    let interval = a.sync_interval.max(Duration::from_millis(100));
    let evict_after = a.evict_after;
    tokio::spawn(async move {
        let mut backoff = interval;
        let mut last_evict: Option<Instant> = None;
        let mut last_fence_check = Instant::now();
        loop {
            tokio::time::sleep(backoff).await;
            if app.draining.load(Ordering::SeqCst) {
                return;
            }
            let (Some(store), Some(remote)) = (app.open_store(), app.durable.remote()) else {
                continue;
            };
            let d = &app.durable;
            if !remote.needs_sync(&store) {
                *d.behind_since.lock().unwrap() = None;
                backoff = interval;
                // An idle store would not notice it was taken over until its next change.
                if last_fence_check.elapsed() > FENCE_EVERY {
                    last_fence_check = Instant::now();
                    let r = remote.clone();
                    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || r.check_fence()).await {
                        failed(&app, &e);
                    }
                }
                if !evict_after.is_zero()
                    && last_evict
                        .is_none_or(|t| t.elapsed() > evict_after.min(Duration::from_secs(600)))
                {
                    last_evict = Some(Instant::now());
                    evict(&app, store, remote, evict_after).await;
                }
                continue;
            }
            // A sync with nothing new to upload (deletions, Object Lock upkeep) is no lag.
            if remote.is_behind(&store) {
                d.behind_since
                    .lock()
                    .unwrap()
                    .get_or_insert_with(Instant::now);
            }
            let _work = app.begin(None);
            let r = {
                let (store, remote) = (store.clone(), remote.clone());
                tokio::task::spawn_blocking(move || remote.sync(&store)).await
            };
            let m = &app.metrics;
            match r {
                Ok(Ok(rep)) => {
                    super::metrics::Metrics::result(&m.remote_syncs, true);
                    m.remote_uploaded_bytes
                        .inc_by(rep.container_bytes_uploaded + rep.meta_bytes_uploaded);
                    m.remote_deleted_objects.inc_by(rep.objects_deleted);
                    m.remote_locks_extended.inc_by(rep.locks_extended);
                    if !remote.is_behind(&store) {
                        *d.behind_since.lock().unwrap() = None;
                    }
                    // The upkeep's failure, if any: the change is in the bucket, but what it
                    // needs may fall out of its lock.
                    *d.last_error.lock().unwrap() = rep.lock_upkeep_error.clone();
                    backoff = interval;
                }
                Ok(Err(e)) => {
                    super::metrics::Metrics::result(&m.remote_syncs, false);
                    failed(&app, &e);
                    backoff = (backoff * 2).clamp(interval, Duration::from_secs(60));
                }
                Err(e) => {
                    tracing::error!(error = %e, "the uploader's sync task failed");
                    backoff = (backoff * 2).clamp(interval, Duration::from_secs(60));
                }
            }
        }
    })
}

/// On shutdown, after in-flight work ended: one last sync, so what was acknowledged since the
/// last one is in the bucket before the process ends (a pod replaced on another node, a node
/// drained). Bounded by `limit`; what it cannot upload stays on local disk for the next start.
pub async fn final_sync(app: &Arc<App>, limit: Duration) {
    let (Some(store), Some(remote)) = (app.open_store(), app.durable.remote()) else {
        return;
    };
    if !remote.needs_sync(&store) || app.durable.fenced().is_some() {
        return;
    }
    let task = tokio::task::spawn_blocking(move || remote.sync(&store));
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(Ok(_))) => tracing::info!("the remote holds everything this worker acknowledged"),
        Ok(Ok(Err(e))) => {
            tracing::warn!(error = %e, "the last upload before shutdown failed; the next start uploads it")
        }
        Ok(Err(e)) => tracing::error!(error = %e, "the last upload's task failed"),
        Err(_) => {
            tracing::warn!(limit = ?limit, "the last upload before shutdown did not finish in time; the next start uploads it")
        }
    }
}

fn failed(app: &App, e: &RemoteError) {
    let d = &app.durable;
    *d.last_error.lock().unwrap() = Some(e.to_string());
    if let RemoteError::Fenced { .. } | RemoteError::Diverged { .. } = e {
        if d.fenced.lock().unwrap().replace(e.to_string()).is_none() {
            tracing::error!(error = %e, "this store was taken over; it takes no more writes");
        }
    } else if e.is_transient() {
        tracing::warn!(error = %e, lag_seconds = d.lag_seconds(), "the remote is not reachable; retrying");
    } else {
        tracing::error!(error = %e, "uploading to the remote failed; retrying");
    }
}

async fn evict(app: &Arc<App>, store: Arc<Store>, remote: Remote, older_than: Duration) {
    let _work = app.begin(None);
    let r = tokio::task::spawn_blocking(move || remote.evict(&store, &EvictOptions { older_than }))
        .await;
    match r {
        Ok(Ok(rep)) if rep.evicted > 0 => {
            tracing::info!(
                evicted = rep.evicted,
                bytes = rep.evicted_bytes,
                "evicted containers no live version reads (they are in the bucket)"
            )
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => failed(app, &e),
        Err(e) => tracing::error!(error = %e, "the eviction task failed"),
    }
}
