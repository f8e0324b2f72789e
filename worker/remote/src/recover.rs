//! `revault recover`: a store rebuilt from its remote alone.
//!
//! 1. claim the next generation (the old store, if it still runs, is fenced out from its
//!    next step on), then read the newest head;
//! 2. download the head's metadata files (each checked against the hash it is named by)
//!    into a new store directory, and open it;
//! 3. skip the session ids a fenced store might still use ([`SESSION_GAP`]);
//! 4. download every container the metadata names (unless `lazy`: then they stay in the
//!    bucket and are read on demand), each opened and checked as it arrives;
//! 5. record the remote beside the store and sync once, which publishes a head of the new
//!    generation and removes what no head needs (uploads of a sync the old store never
//!    finished).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use revault_engine::{keys, ContainerId, OpenMode, Store};
use serde::Serialize;

use crate::bucket::Bucket;
use crate::error::{IoCtx, RemoteError, Result};
use crate::fence::{self, Claim};
use crate::head::{Head, SeriesAt};
use crate::init::read_descriptor;
use crate::keys::KeyFile;
use crate::seal::{self, DataKey};
use crate::state::{LocalConfig, State};
use crate::url::RemoteUrl;
use crate::{block, layout, runtime, sync, Parts, Remote};

/// Session ids a recovered store skips: a fenced store that has not yet seen the new
/// generation can write at most a few more sessions (it checks before every 64 uploads), so
/// this many keeps their container names apart.
pub const SESSION_GAP: u64 = 1 << 16;

#[derive(Clone, Debug)]
pub struct RecoverOptions {
    pub url: RemoteUrl,
    pub key_file: PathBuf,
    /// The new store's directory: must not exist, or be empty.
    pub store: PathBuf,
    /// Containers elsewhere (e.g. an HDD), as `init --data-dir`.
    pub data_dir: Option<PathBuf>,
    /// Leave the containers in the bucket; restores read them on demand.
    pub lazy: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoverReport {
    pub store: String,
    pub generation: u32,
    pub head: String,
    pub head_time: String,
    pub series: Vec<SeriesAt>,
    pub containers: u64,
    pub containers_downloaded: u64,
    pub container_bytes_downloaded: u64,
    pub meta_bytes_downloaded: u64,
    pub seconds: f64,
}

/// Rebuilds the store of `opts.url` at `opts.store`; returns it open read-write with its
/// remote attached.
pub fn recover(opts: &RecoverOptions) -> Result<(Store, Remote, RecoverReport)> {
    let t0 = Instant::now();
    let kf = KeyFile::read(&opts.key_file)?;
    let staging = prepare(&opts.store, opts.data_dir.as_deref())?;
    let (store, remote, mut rep) = rebuild(opts, kf, &staging)?;
    // Closed, then moved into place: the store appears whole or not at all.
    drop(store);
    drop(remote);
    finish(&opts.store, &staging, opts.data_dir.as_deref())?;
    let store = Store::open(&opts.store, OpenMode::ReadWrite, "revault recover")?;
    let remote = Remote::attach(&store, Some(&opts.key_file))?.ok_or_else(|| {
        RemoteError::Invalid(format!(
            "{}: the rebuilt store lost its remote",
            opts.store.display()
        ))
    })?;
    rep.seconds = t0.elapsed().as_secs_f64();
    Ok((store, remote, rep))
}

/// Where a rebuild is staged: `STORE/.recovering`, inside the target so that it works when the
/// target is a mount point (a worker's hostPath). Everything moves up when it is complete, the
/// store's marker last; a rebuild cut short (a crash, a power cut) leaves the staging
/// directory, which proves the rest of the target is its own: the next `recover` clears it and
/// starts over. An external data directory (`--data-dir`) gets a marker file for the same
/// purpose.
const STAGING: &str = ".recovering";
const DATA_MARKER: &str = ".revault-recovering";

fn prepare(target: &Path, data_dir: Option<&Path>) -> Result<PathBuf> {
    if let Some(d) = data_dir.filter(|d| d.is_relative()) {
        if d.components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(RemoteError::Invalid(format!(
                "--data-dir {}: a relative data directory lies inside the store (no '..'); give an absolute path for one elsewhere",
                d.display()
            )));
        }
    }
    let staging = target.join(STAGING);
    if staging.exists() {
        if target.join("revault.store").exists() {
            return Err(RemoteError::Invalid(format!(
                "{} is a store already (an earlier recover completed; remove {} to use it)",
                target.display(),
                staging.display()
            )));
        }
        tracing::warn!(store = %target.display(), "clearing what an interrupted recover left");
        clear_dir(target)?;
    } else {
        refuse_non_empty(target)?;
    }
    if let Some(d) = data_dir.filter(|d| d.is_absolute()) {
        if d.join(DATA_MARKER).exists() {
            clear_dir(d)?;
        }
        refuse_non_empty(d)?;
        std::fs::create_dir_all(d).ctx(|| format!("creating {}", d.display()))?;
        write_synced(&d.join(DATA_MARKER), b"")?;
        sync_dir(d)?;
    }
    std::fs::create_dir_all(&staging).ctx(|| format!("creating {}", staging.display()))?;
    sync_dir(target)?;
    Ok(staging)
}

/// Moves the staged store up into `target`, the marker last.
fn finish(target: &Path, staging: &Path, data_dir: Option<&Path>) -> Result<()> {
    let marker = "revault.store";
    for e in std::fs::read_dir(staging).ctx(|| format!("reading {}", staging.display()))? {
        let e = e.ctx(|| format!("reading {}", staging.display()))?;
        if e.file_name() != marker && e.file_name() != "lock" {
            let to = target.join(e.file_name());
            std::fs::rename(e.path(), &to)
                .ctx(|| format!("moving {} to {}", e.path().display(), to.display()))?;
        }
    }
    sync_dir(target)?;
    std::fs::rename(staging.join(marker), target.join(marker))
        .ctx(|| format!("moving the store marker into {}", target.display()))?;
    sync_dir(target)?;
    std::fs::remove_dir_all(staging).ctx(|| format!("removing {}", staging.display()))?;
    if let Some(d) = data_dir.filter(|d| d.is_absolute()) {
        std::fs::remove_file(d.join(DATA_MARKER))
            .ctx(|| format!("removing {}", d.join(DATA_MARKER).display()))?;
        sync_dir(d)?;
    }
    sync_dir(target)
}

fn clear_dir(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).ctx(|| format!("reading {}", dir.display()))? {
        let p = e.ctx(|| format!("reading {}", dir.display()))?.path();
        let r = if p.is_dir() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.ctx(|| format!("removing {}", p.display()))?;
    }
    sync_dir(dir)
}

/// Everything but the move into place, in `root` (the staging directory).
fn rebuild(
    opts: &RecoverOptions,
    kf: KeyFile,
    root: &Path,
) -> Result<(Store, Remote, RecoverReport)> {
    let rt = runtime()?;
    let bucket = block(&rt, Bucket::connect(opts.url.clone()))?;
    let desc = read_descriptor(&rt, &bucket)?;
    let key = kf.unwrap(&opts.url.to_string(), &desc)?;
    desc.verify(&opts.url.to_string(), &key)?;
    let (generation, head_name, head) =
        claim_next(&rt, &bucket, &key, &desc.store, desc.object_lock)?;
    let mut rep = RecoverReport {
        store: desc.store.clone(),
        generation,
        head: head_name,
        head_time: head.time.clone(),
        series: head.series.clone(),
        ..Default::default()
    };
    rep.meta_bytes_downloaded = download_meta(&rt, &bucket, &key, &head, root)?;
    Store::init_recovered(root, opts.data_dir.clone())?;
    let store = Store::open(root, OpenMode::ReadWrite, "revault recover")?;
    let listed = {
        let b = bucket.clone();
        block(&rt, async move { b.list(layout::DATA).await })?
    };
    let in_bucket: HashSet<ContainerId> = listed
        .iter()
        .filter_map(|o| layout::parse_container(&o.name))
        .collect();
    let max_session = in_bucket
        .iter()
        .map(|c| c.session())
        .max()
        .unwrap_or(0)
        .max(head.max_session);
    store.skip_sessions_to(max_session + SESSION_GAP)?;
    let ids = containers_of(&store)?;
    rep.containers = ids.len() as u64;
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !in_bucket.contains(id))
        .map(|id| id.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(RemoteError::NotFound {
            object: format!(
                "{} (containers the newest head's metadata names: {}{})",
                bucket.url.key(layout::DATA),
                missing
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
                if missing.len() > 5 {
                    format!(" and {} more", missing.len() - 5)
                } else {
                    String::new()
                }
            ),
        });
    }
    let mut uploaded: Vec<(ContainerId, Vec<u8>)> =
        ids.iter().map(|id| (*id, Vec::new())).collect();
    if !opts.lazy {
        let got = download_containers(&rt, &bucket, &key, store.data_dir(), &ids)?;
        rep.containers_downloaded = got.len() as u64;
        rep.container_bytes_downloaded = got.iter().map(|(_, _, n)| n).sum();
        uploaded = got.into_iter().map(|(id, h, _)| (id, h)).collect();
    }
    let conf = LocalConfig {
        url: opts.url.clone(),
        store: desc.store.clone(),
        generation,
        key_file: std::path::absolute(&opts.key_file).unwrap_or_else(|_| opts.key_file.clone()),
        object_lock: desc.object_lock,
    };
    conf.write(root)?;
    let state = State::open(root, false)?;
    state.reset(&uploaded, &head)?;
    let remote = Remote::from_parts(Parts {
        rt,
        bucket,
        key,
        desc,
        conf,
        state,
        root: root.to_path_buf(),
        head: Some(head),
    })?;
    remote.serve_cold_reads(&store);
    remote.sync(&store)?;
    Ok((store, remote, rep))
}

/// Who owns the store at `url` now: the newest claim that opens under its key (generation,
/// host, time), or `None` when nothing was ever claimed there (no store yet).
pub fn owner(url: &RemoteUrl, key_file: &Path) -> Result<Option<Claim>> {
    let kf = KeyFile::read(key_file)?;
    let rt = runtime()?;
    let bucket = block(&rt, Bucket::connect(url.clone()))?;
    let desc = match read_descriptor(&rt, &bucket) {
        Ok(d) => d,
        Err(RemoteError::NoStore { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let key = kf.unwrap(&url.to_string(), &desc)?;
    desc.verify(&url.to_string(), &key)?;
    let store = desc.store.clone();
    block(&rt, async move {
        fence::highest(&bucket, &key, &store, 0).await
    })
}

fn refuse_non_empty(dir: &Path) -> Result<()> {
    match std::fs::read_dir(dir).map(|mut d| d.next().is_some()) {
        Ok(true) => Err(RemoteError::Invalid(format!(
            "{} is not empty; recover builds a new store in an empty or new directory",
            dir.display()
        ))),
        Ok(false) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).ctx(|| format!("reading {}", dir.display())),
    }
}

/// Claims the generation after every one claimed or published, then names the newest head
/// published before it.
fn claim_next(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    key: &DataKey,
    store: &str,
    lock: Option<crate::bucket::ObjectLock>,
) -> Result<(u32, String, Head)> {
    let (b, k, st) = (bucket.clone(), key.clone(), store.to_string());
    let claimed =
        block(rt, async move { fence::highest(&b, &k, &st, 0).await })?.map_or(0, |c| c.generation);
    let published = newest_head(rt, bucket, key, store, u32::MAX)?.map_or(0, |(g, _, _)| g);
    let generation = claimed.max(published).checked_add(1).ok_or_else(|| {
        RemoteError::Invalid(format!("{}: no generation is left to claim", bucket.url))
    })?;
    let claim = Claim {
        store: store.to_string(),
        generation,
        host: fence::host(),
        time: sync::rfc3339_now(),
        based_on: String::new(),
    };
    let (b, k) = (bucket.clone(), key.clone());
    if !block(rt, async move { fence::claim(&b, &k, &claim, lock).await })? {
        return Err(RemoteError::Invalid(format!(
            "generation {generation} of {} was claimed by another recover at the same time; two stores must not share a remote",
            bucket.url
        )));
    }
    // Read the heads after the claim: whatever the old store published before it saw the
    // claim is complete, and it publishes nothing after.
    let (g, s, head) =
        newest_head(rt, bucket, key, store, generation)?.ok_or_else(|| RemoteError::NoStore {
            remote: bucket.url.to_string(),
            detail: "no head was ever published".into(),
        })?;
    Ok((generation, layout::head(g, s), head))
}

/// The newest head below generation `below` that opens under the data key and is this
/// store's. A name anyone could write under `heads/` is no head; when heads exist and none
/// opens, the newest one's error says why.
fn newest_head(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    key: &DataKey,
    store: &str,
    below: u32,
) -> Result<Option<(u32, u64, Head)>> {
    let b = bucket.clone();
    let mut heads: Vec<(u32, u64)> = block(rt, async move { b.list(layout::HEADS).await })?
        .iter()
        .filter_map(|o| layout::parse_head(&o.name))
        .filter(|(g, _)| *g < below)
        .collect();
    heads.sort_unstable_by(|a, b| b.cmp(a));
    let mut first_err = None;
    for (g, s) in heads {
        let name = layout::head(g, s);
        match read_head(rt, bucket, key, &name) {
            Ok(h) if h.store == store && h.generation == g && h.seq == s => {
                return Ok(Some((g, s, h)))
            }
            Ok(h) => {
                first_err.get_or_insert(RemoteError::tampered(
                    &bucket.url.key(&name),
                    &format!("it is head {}-{} of store {}", h.generation, h.seq, h.store),
                ));
            }
            Err(e @ RemoteError::Tampered { .. }) => {
                first_err.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

fn read_head(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    key: &DataKey,
    name: &str,
) -> Result<Head> {
    let b = bucket.clone();
    let n = name.to_string();
    let sealed = block(rt, async move { b.get(&n).await })?;
    let plain = bucket.open_sealed(key, name, &sealed)?;
    serde_json::from_slice(&plain)
        .map_err(|e| RemoteError::tampered(&bucket.url.key(name), &e.to_string()))
}

/// Downloads the head's metadata files into `store/meta` (through `meta.partial`, renamed
/// when complete); returns the bytes.
fn download_meta(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    key: &DataKey,
    head: &Head,
    store: &Path,
) -> Result<u64> {
    let partial = store.join("meta.partial");
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).ctx(|| format!("creating {}", partial.display()))?;
    let mut total = 0;
    for f in &head.meta_files {
        if f.name.contains('/') || f.name.starts_with('.') {
            return Err(RemoteError::tampered(
                &bucket.url.key(&f.object),
                "a metadata file name with a path in it",
            ));
        }
        let b = bucket.clone();
        let o = f.object.clone();
        let sealed = block(rt, async move { b.get(&o).await })?;
        let plain = bucket.open_sealed(key, &f.object, &sealed)?;
        if layout::meta_file(&blake3::hash(&plain)) != f.object {
            return Err(RemoteError::tampered(
                &bucket.url.key(&f.object),
                "its content does not match its name",
            ));
        }
        let p = partial.join(&f.name);
        write_synced(&p, &plain)?;
        total += plain.len() as u64;
    }
    sync_dir(&partial)?;
    let meta = store.join(revault_engine::META_DIR);
    std::fs::rename(&partial, &meta).ctx(|| format!("renaming {}", partial.display()))?;
    sync_dir(store)?;
    Ok(total)
}

fn containers_of(store: &Store) -> Result<Vec<ContainerId>> {
    let mut ids = Vec::new();
    store
        .meta()
        .for_each_prefix(keys::CF_CONTAINERS, b"", |k, _| {
            if let Ok(b) = <[u8; 8]>::try_from(k) {
                ids.push(ContainerId(u64::from_be_bytes(b)));
            }
            Ok(true)
        })?;
    Ok(ids)
}

/// Downloads containers `ids` into `data_dir`: (id, sealed header, bytes).
fn download_containers(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    key: &DataKey,
    data_dir: &Path,
    ids: &[ContainerId],
) -> Result<Vec<(ContainerId, Vec<u8>, u64)>> {
    let mut out = Vec::new();
    let mut dirs = HashSet::new();
    for batch in ids.chunks(64) {
        let (b, k, d, batch) = (
            bucket.clone(),
            key.clone(),
            data_dir.to_path_buf(),
            batch.to_vec(),
        );
        let got = block(rt, async move { download_batch(b, k, d, batch).await })?;
        for (id, _, _) in &got {
            dirs.insert(id.path(data_dir).parent().map(Path::to_path_buf));
        }
        out.extend(got);
    }
    for d in dirs.into_iter().flatten() {
        sync_dir(&d)?;
    }
    sync_dir(data_dir)?;
    Ok(out)
}

async fn download_batch(
    b: Bucket,
    key: DataKey,
    data_dir: PathBuf,
    ids: Vec<ContainerId>,
) -> Result<Vec<(ContainerId, Vec<u8>, u64)>> {
    let sem = Arc::new(tokio::sync::Semaphore::new(8));
    let mut set = tokio::task::JoinSet::new();
    for id in ids {
        let (b, key, sem, data_dir) = (b.clone(), key.clone(), sem.clone(), data_dir.clone());
        set.spawn(async move {
            let _permit = sem.acquire_owned().await.expect("semaphore open");
            let name = layout::container(id);
            let sealed: Bytes = b.get(&name).await?;
            let header = sealed[..seal::HEADER_LEN.min(sealed.len())].to_vec();
            let plain = b.open_sealed(&key, &name, &sealed)?;
            let n = plain.len() as u64;
            tokio::task::spawn_blocking(move || {
                let path = id.path(&data_dir);
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
                }
                write_synced(&path, &plain)
            })
            .await
            .map_err(|e| RemoteError::Bucket {
                what: "a download task".into(),
                detail: e.to_string(),
            })??;
            Ok::<_, RemoteError>((id, header, n))
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.push(r.map_err(|e| RemoteError::Bucket {
            what: "a download task".into(),
            detail: e.to_string(),
        })??);
    }
    Ok(out)
}

pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).ctx(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .ctx(|| format!("writing {}", path.display()))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .ctx(|| format!("syncing {}", dir.display()))
}
