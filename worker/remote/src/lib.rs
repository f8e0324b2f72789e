//! Revault's durable tier: a store's encrypted copy on S3-compatible storage.
//!
//! A store with a remote keeps working on local disks — metadata on SSD, containers on SSD or
//! HDD — and copies to a bucket what a new node would need to rebuild it: every sealed
//! container, and checkpoints of the metadata ([`sync`]). `revault recover` rebuilds the store
//! from the bucket alone ([`recover`]); containers evicted from local disk are read back by
//! ranged GETs when a restore, slide or gc needs them ([`tier`]). Everything that leaves the
//! node is sealed under a key only the key file unlocks ([`seal`], [`keys`]); a store that
//! was recovered elsewhere fences the old one out ([`fence`]). docs/remote.md has the design.
//!
//! The crate is synchronous to its callers, like the engine: [`Remote`] runs the S3 client on
//! a small runtime of its own and blocks the calling thread, so the CLI, the engine's restore
//! threads and the server's blocking pool call it alike.

mod bucket;
mod early;
mod error;
mod fence;
#[doc(hidden)]
pub mod fuzzing;
mod head;
mod init;
mod keys;
mod layout;
mod locks;
mod recover;
mod rotate;
mod seal;
mod state;
mod sync;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
mod tier;
mod url;

pub use bucket::ObjectLock;
pub use error::{RemoteError, Result};
pub use fence::{host, Claim};
pub use head::{Head, SeriesAt};
pub use init::{InitRemote, InitReport};
pub use keys::create_key_file;
pub use recover::{owner, recover, RecoverOptions, RecoverReport};
pub use rotate::{rotate_key, stores_under, RotateOptions, RotateReport};
pub use state::LocalConfig;
pub use sync::SyncReport;
pub use tier::{serve_unreachable, EvictOptions, EvictReport};
pub use url::RemoteUrl;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use revault_engine::Store;

use bucket::Bucket;
use keys::{Descriptor, KeyFile};
use seal::DataKey;
use state::State;

/// A store's remote: attached to an open store, it syncs, serves evicted containers and
/// evicts.
#[derive(Clone)]
pub struct Remote {
    inner: Arc<Inner>,
}

struct Inner {
    rt: Option<tokio::runtime::Runtime>,
    bucket: Bucket,
    key: DataKey,
    desc: Descriptor,
    conf: Mutex<LocalConfig>,
    state: State,
    root: PathBuf,
    /// One sync at a time (the server's uploader and a CLI command never overlap anyway:
    /// the store lock keeps them apart).
    sync_lock: Mutex<sync::Progress>,
    /// The newest head this store published.
    head: Mutex<Option<Head>>,
    /// Test hook: the step of a sync that fails as if the process died there.
    failpoint: Mutex<Option<String>>,
    /// Test hook: runs once, between a sync's last fence check and the write of its head.
    before_head: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Containers opened from a whole read-ahead (`tier.rs`), for the tests to see it work.
    whole_opens: std::sync::atomic::AtomicU64,
    early: early::Early,
    /// Whether `remote/state` says the bucket holds nothing a listing would remove (see
    /// [`State::is_clean`]); the lock orders marking it against early uploads.
    clean: Mutex<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle may go on a thread of another runtime, where dropping a runtime
        // would block: let its threads finish on their own.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Which key file to use: the one named, else `REVAULT_KEY_FILE`, else the one the store
/// recorded.
fn key_path(given: Option<&Path>, recorded: &Path) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("REVAULT_KEY_FILE").map(PathBuf::from))
        .unwrap_or_else(|| recorded.to_path_buf())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("revault-remote")
        .enable_all()
        .build()
        .map_err(|e| RemoteError::Io {
            context: "starting the remote's runtime".into(),
            source: e,
        })
}

/// Runs `fut` on `rt` and waits for it, from any thread (also one of another runtime's
/// blocking pool, where `block_on` would panic).
fn block<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    fut: impl Future<Output = T> + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .expect("the remote's runtime runs its tasks to completion")
}

/// What a [`Remote`] is made of, once its bucket, key and records are open.
pub(crate) struct Parts {
    rt: tokio::runtime::Runtime,
    bucket: Bucket,
    key: DataKey,
    desc: Descriptor,
    conf: LocalConfig,
    state: State,
    root: PathBuf,
    head: Option<Head>,
}

impl Remote {
    pub(crate) fn from_parts(p: Parts) -> Result<Remote> {
        let clean = p.state.is_clean()?;
        Ok(Remote {
            inner: Arc::new(Inner {
                rt: Some(p.rt),
                bucket: p.bucket,
                key: p.key,
                desc: p.desc,
                conf: Mutex::new(p.conf),
                state: p.state,
                root: p.root,
                sync_lock: Mutex::new(sync::Progress::new(clean)),
                head: Mutex::new(p.head),
                failpoint: Mutex::new(None),
                before_head: Mutex::new(None),
                whole_opens: Default::default(),
                early: Default::default(),
                clean: Mutex::new(clean),
            }),
        })
    }

    /// The remote of the store at `root`, if it has one: connected, its key unwrapped, and
    /// set as the store's cold tier. `key_file` overrides the recorded key file's path.
    pub fn attach(store: &Store, key_file: Option<&Path>) -> Result<Option<Remote>> {
        let root = store.root().to_path_buf();
        let Some(conf) = LocalConfig::read(&root)? else {
            return Ok(None);
        };
        let read_only = store.mode() == revault_engine::OpenMode::ReadOnly;
        let r = Remote::connect(&root, conf, key_file, read_only)?;
        r.serve_cold_reads(store);
        Ok(Some(r))
    }

    /// Fails with [`RemoteError::Fenced`] when another store took this remote over (a
    /// recovery elsewhere claimed a newer generation).
    pub fn check_fence(&self) -> Result<()> {
        self.fence_check(self.generation())
    }

    /// Makes `store` (this remote's store, e.g. reopened) read the containers missing from
    /// its data directory from the bucket.
    pub fn serve_cold_reads(&self, store: &Store) {
        store.set_cold_tier(Arc::new(tier::Tier::new(self.clone())));
    }

    fn connect(
        root: &Path,
        conf: LocalConfig,
        key_file: Option<&Path>,
        read_only: bool,
    ) -> Result<Remote> {
        let rt = runtime()?;
        let kf = KeyFile::read(&key_path(key_file, &conf.key_file))?;
        let url = conf.url.clone();
        let bucket = block(&rt, Bucket::connect(url.clone()))?;
        let desc = init::read_descriptor(&rt, &bucket)?;
        if desc.store != conf.store {
            return Err(RemoteError::Invalid(format!(
                "{url} holds store {}, but this store ({}) is store {}; was remote/remote.json copied from another store?",
                desc.store,
                root.display(),
                conf.store
            )));
        }
        let key = kf.unwrap(&url.to_string(), &desc)?;
        desc.verify(&url.to_string(), &key)?;
        // The descriptor (authenticated) says whether objects are locked, not a local file.
        let mut conf = conf;
        conf.object_lock = desc.object_lock;
        let state = State::open(root, read_only)?;
        let head = state.head()?;
        Remote::from_parts(Parts {
            rt,
            bucket,
            key,
            desc,
            conf,
            state,
            root: root.to_path_buf(),
            head,
        })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.inner
            .rt
            .as_ref()
            .expect("the runtime lives as long as the remote")
    }

    /// Runs `f` (given a bucket handle) on the remote's runtime and waits for it.
    fn run<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
        &self,
        f: impl FnOnce(Bucket) -> F,
    ) -> T {
        block(self.rt(), f(self.inner.bucket.clone()))
    }

    pub fn url(&self) -> &RemoteUrl {
        &self.inner.bucket.url
    }

    pub fn store_id(&self) -> &str {
        &self.inner.desc.store
    }

    pub fn generation(&self) -> u32 {
        self.inner.conf.lock().generation
    }

    /// The newest head this store published (what the remote holds for sure).
    pub fn head(&self) -> Option<Head> {
        self.inner.head.lock().clone()
    }

    /// The newest version of `series` the remote holds.
    pub fn durable_version(&self, series: &str) -> Option<u32> {
        self.inner.head.lock().as_ref()?.durable_version(series)
    }

    /// How many containers this remote opened from a whole read-ahead rather than by
    /// requests of their own (a restore's read-ahead at work; for the tests).
    #[doc(hidden)]
    pub fn whole_opens(&self) -> u64 {
        self.inner
            .whole_opens
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Test hook: the next sync stops at step `at` (`sync.uploaded`, `sync.meta`,
    /// `sync.published`, `sync.deleting`) with an error, leaving the bucket as a process
    /// killed there would.
    #[doc(hidden)]
    pub fn set_failpoint(&self, at: Option<&str>) {
        *self.inner.failpoint.lock() = at.map(str::to_string);
    }

    /// Test hook: every version in the bucket as (name, version id, current, delete marker).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn versions_for_test(&self) -> Result<Vec<(String, String, bool, bool)>> {
        let v = self.run(|b| async move { b.list_versions("").await })?;
        Ok(v.into_iter()
            .map(|v| (v.name, v.version_id, v.latest, v.delete_marker))
            .collect())
    }

    /// Test hook: writes `body` as object `name` (with the remote's Object Lock) and reads it
    /// back; large bodies go up in parts.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn put_get_for_test(&self, name: &str, body: Vec<u8>) -> Result<Vec<u8>> {
        let (n, lock) = (name.to_string(), self.inner.conf.lock().object_lock);
        self.run(move |b| async move {
            b.put(&n, body.into(), lock).await?;
            Ok(b.get(&n).await?.to_vec())
        })
    }

    /// Test hook: deletes one version for good, as an attacker holding the credentials would.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn delete_version_for_test(&self, name: &str, id: &str) -> Result<()> {
        let (n, i) = (name.to_string(), id.to_string());
        self.run(move |b| async move { b.delete_version(&n, &i).await })
    }

    /// Test hook: `f` runs once, in the next sync, right before it writes its head (after its
    /// fence check): what a recovery elsewhere at that instant does to it.
    #[doc(hidden)]
    pub fn before_head(&self, f: Box<dyn FnOnce() + Send>) {
        *self.inner.before_head.lock() = Some(f);
    }

    fn failpoint(&self, at: &str) -> Result<()> {
        if self.inner.failpoint.lock().as_deref() == Some(at) {
            return Err(RemoteError::Bucket {
                what: format!("failpoint {at}"),
                detail: "the test stopped the sync here".into(),
            });
        }
        Ok(())
    }
}
