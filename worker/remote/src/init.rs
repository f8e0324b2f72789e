//! Giving a new store a remote: the bucket (created if missing), the descriptor with the
//! wrapped data key, generation 1, and a first head.

use std::path::PathBuf;
use std::sync::Arc;

use revault_engine::Store;

use crate::bucket::{Bucket, ObjectLock};
use crate::error::{RemoteError, Result};
use crate::fence::{self, Claim};
use crate::keys::{create_key_file, Descriptor, KeyFile};
use crate::seal::{random, DataKey, DEFAULT_FRAME_LOG2};
use crate::state::{LocalConfig, State};
use crate::url::RemoteUrl;
use crate::{block, layout, runtime, sync, tier, Parts, Remote};

/// `revault init --remote URL --key-file FILE`.
#[derive(Clone, Debug)]
pub struct InitRemote {
    pub url: RemoteUrl,
    /// Created (32 random bytes, mode 0600) if it does not exist.
    pub key_file: PathBuf,
    pub object_lock: Option<ObjectLock>,
}

/// What `init` did besides the store: whether it made the key file and the bucket.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitReport {
    pub store: String,
    pub created_key_file: bool,
    pub created_bucket: bool,
}

impl Remote {
    /// Gives `store` (new, open read-write, empty) the remote `opts.url`, and publishes its
    /// first head. Refuses a prefix that already holds anything.
    pub fn init(store: &Store, opts: &InitRemote) -> Result<(Remote, InitReport)> {
        let root = store.root().to_path_buf();
        if LocalConfig::read(&root)?.is_some() {
            return Err(RemoteError::Invalid(format!(
                "{} already has a remote (remote/remote.json)",
                root.display()
            )));
        }
        let created_key_file = !opts.key_file.exists();
        if created_key_file {
            create_key_file(&opts.key_file)?;
        }
        let kf = KeyFile::read(&opts.key_file)?;
        let rt = runtime()?;
        let bucket = block(&rt, Bucket::connect(opts.url.clone()))?;
        let created_bucket = {
            let b = bucket.clone();
            let lock = opts.object_lock.is_some();
            block(&rt, async move { b.ensure_bucket(lock).await })?
        };
        let (desc, key) = match interrupted_init(&rt, &bucket, &kf, &opts.url)? {
            Some(found) => found,
            None => new_descriptor(&rt, &bucket, &kf, opts)?,
        };
        let store_id = desc.store.clone();
        let claim = Claim {
            store: store_id.clone(),
            generation: 1,
            host: fence::host(),
            time: desc.created.clone(),
            based_on: String::new(),
        };
        {
            let (b, k, lock) = (bucket.clone(), key.clone(), opts.object_lock);
            // An interrupted init may have claimed it already.
            block(&rt, async move { fence::claim(&b, &k, &claim, lock).await })?;
        }
        let conf = LocalConfig {
            url: opts.url.clone(),
            store: store_id.clone(),
            generation: 1,
            key_file: std::path::absolute(&opts.key_file).unwrap_or_else(|_| opts.key_file.clone()),
            object_lock: opts.object_lock,
        };
        conf.write(&root)?;
        let state = State::open(&root, false)?;
        let remote = Remote::from_parts(Parts {
            rt,
            bucket,
            key,
            desc,
            conf,
            state,
            root,
            head: None,
        })?;
        store.set_cold_tier(Arc::new(tier::Tier::new(remote.clone())));
        remote.sync(store)?;
        Ok((
            remote,
            InitReport {
                store: store_id,
                created_key_file,
                created_bucket,
            },
        ))
    }
}

/// The descriptor and data key of an init that stopped before its first head (its process
/// killed between writing the descriptor and the store's own record of its remote): the prefix
/// holds a descriptor our key file opens and no head, so `init` finishes it. Anything else in
/// the prefix is refused.
fn interrupted_init(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    kf: &KeyFile,
    url: &RemoteUrl,
) -> Result<Option<(Descriptor, DataKey)>> {
    let b = bucket.clone();
    let existing = block(rt, async move { b.list("").await })?;
    if existing.is_empty() {
        return Ok(None);
    }
    let exists = |detail: String| RemoteError::Exists {
        remote: url.to_string(),
        detail,
    };
    if !existing.iter().any(|o| o.name == layout::DESCRIPTOR) {
        return Err(exists(format!(
            "{} objects that are not a Revault store, e.g. {}",
            existing.len(),
            existing[0].name
        )));
    }
    let d = read_descriptor(rt, bucket)?;
    let has_heads = existing.iter().any(|o| o.name.starts_with(layout::HEADS));
    match kf.unwrap(&url.to_string(), &d) {
        Ok(key) if !has_heads && d.verify(&url.to_string(), &key).is_ok() => {
            tracing::warn!(remote = %url, store = %d.store, "finishing an init that was interrupted");
            Ok(Some((d, key)))
        }
        _ => Err(exists(format!("store {} created {}", d.store, d.created))),
    }
}

/// Writes the descriptor of a new store (its id, a new data key wrapped under `kf`).
fn new_descriptor(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    kf: &KeyFile,
    opts: &InitRemote,
) -> Result<(Descriptor, DataKey)> {
    let store_id = hex::encode(random::<16>());
    let key = DataKey::new(1, random());
    let mut desc = Descriptor {
        format: 1,
        store: store_id.clone(),
        created: sync::rfc3339_now(),
        frame_log2: DEFAULT_FRAME_LOG2,
        keys: vec![kf.wrap(&store_id, &key)],
        object_lock: opts.object_lock,
        mac: String::new(),
    };
    desc.sign(&key);
    let b = bucket.clone();
    let body = serde_json::to_vec_pretty(&desc).expect("descriptor serialises");
    let lock = opts.object_lock;
    if !block(rt, async move {
        b.put_new(layout::DESCRIPTOR, body.into(), lock).await
    })? {
        return Err(RemoteError::Exists {
            remote: opts.url.to_string(),
            detail: "another init wrote its descriptor first".into(),
        });
    }
    Ok((desc, key))
}

/// The remote's descriptor, or [`RemoteError::NoStore`].
pub(crate) fn read_descriptor(rt: &tokio::runtime::Runtime, bucket: &Bucket) -> Result<Descriptor> {
    let b = bucket.clone();
    let bytes =
        block(rt, async move { b.get_opt(layout::DESCRIPTOR).await })?.ok_or_else(|| {
            RemoteError::NoStore {
                remote: bucket.url.to_string(),
                detail: format!("no {}", layout::DESCRIPTOR),
            }
        })?;
    parse_descriptor(bucket, &bytes)
}

/// The descriptor in `bytes`, read from `bucket`.
pub(crate) fn parse_descriptor(bucket: &Bucket, bytes: &[u8]) -> Result<Descriptor> {
    let d: Descriptor = serde_json::from_slice(bytes)
        .map_err(|e| RemoteError::tampered(&bucket.url.key(layout::DESCRIPTOR), &e.to_string()))?;
    if d.format != 1 {
        return Err(RemoteError::Invalid(format!(
            "{} is of format {}; this revault reads format 1",
            bucket.url.key(layout::DESCRIPTOR),
            d.format
        )));
    }
    Ok(d)
}
