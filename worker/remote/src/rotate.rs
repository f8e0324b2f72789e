//! Rotating the key file: the data key stays, who can unwrap it changes.
//!
//! The descriptor lists the data key wrapped under each key file that may open the remote
//! ([`crate::keys`]). A rotation adds the new key file's wrapping, then (unless told to keep
//! it) drops the old key file's: two writes of the descriptor, nothing re-encrypted. Other
//! wrappings (an escrow key kept offline) stay. Each write is a whole object, conditional on
//! the descriptor being the one read (`If-Match`), so two rotations cannot silently undo
//! each other; between the two writes both key files open the remote, so a rotation stopped
//! half-way is finished by running it again, and running it once more finds it finished.
//! That middle state is also how a cluster rotates without a window in which its workers
//! cannot open their remote: add the new key file (keeping the old), roll the new key Secret
//! out, then drop the old one (docs/remote.md, "Keys"). A new key file this run creates is
//! never the only key at once: the old one is dropped by a later run, after the user has put
//! a copy somewhere safe.
//!
//! Before anything is written, the data key must open this prefix's generation claims (a
//! descriptor copied from another store would not), and each new descriptor is checked
//! before it is written and read back after: a descriptor nobody can open would make the
//! whole bucket unreadable.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bucket::Bucket;
use crate::error::{RemoteError, Result};
use crate::init::parse_descriptor;
use crate::keys::{create_key_file, Descriptor, KeyFile};
use crate::seal::DataKey;
use crate::state::LocalConfig;
use crate::url::RemoteUrl;
use crate::{block, fence, layout, runtime};

/// What to rotate.
#[derive(Clone, Debug)]
pub struct RotateOptions {
    pub url: RemoteUrl,
    /// The key file being replaced: it opens the remote now (or did, before a rotation that
    /// already dropped it, which is then found finished).
    pub key_file: PathBuf,
    /// The key file that will open it (created, 32 random bytes, if missing).
    pub new_key_file: PathBuf,
    /// Keep the old key file's wrapping (the first half of a rotation in a cluster).
    pub keep_old: bool,
    /// A store whose recorded key file (remote/remote.json) becomes the new one, written
    /// just before the old one is dropped (both open the remote then). The caller holds the
    /// store open, so no other process rewrites that file meanwhile.
    pub store_root: Option<PathBuf>,
}

/// What a rotation did.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RotateReport {
    pub remote: String,
    /// The new key file's id, and whether this run created the file.
    pub new_key_file: String,
    pub created_key_file: bool,
    /// Whether the data key was wrapped for the new key file by this run (false: it already
    /// was, by a rotation stopped half-way or one that kept the old key file).
    pub added: bool,
    /// The key file whose wrapping this run removed (the old one), if it did.
    pub removed: Option<String>,
    /// The old key file opens the remote no more.
    pub finished: bool,
    /// The key files that open the remote now.
    pub key_files: Vec<String>,
    /// Older versions of the descriptor (a versioned bucket keeps them) deleted, and left
    /// because their Object Lock retention has not ended: those still hold the data key
    /// wrapped for the old key file; running the rotation again later deletes them.
    pub old_descriptors_deleted: u32,
    pub old_descriptors_left: u32,
}

/// Rotates the key file of the remote at `opts.url` (see the module's documentation).
pub fn rotate_key(opts: &RotateOptions) -> Result<RotateReport> {
    rotate(opts, &|| {})
}

/// [`rotate_key`], calling `before_write` before each write of the descriptor (tests change
/// the bucket there).
fn rotate(opts: &RotateOptions, before_write: &dyn Fn()) -> Result<RotateReport> {
    refuse_key_in_store(opts)?;
    let old = KeyFile::read(&opts.key_file)?;
    let existing = match opts.new_key_file.exists() {
        true => Some(KeyFile::read(&opts.new_key_file)?),
        false => None,
    };
    if existing.as_ref().is_some_and(|n| n.id == old.id) {
        return Err(RemoteError::Invalid(format!(
            "{} and {} are the same key ({}): a rotation needs a new key file",
            opts.key_file.display(),
            opts.new_key_file.display(),
            old.id
        )));
    }
    let rt = runtime()?;
    let bucket = block(&rt, Bucket::connect(opts.url.clone()))?;
    let remote = opts.url.to_string();
    let (desc, etag) = read_tagged(&rt, &bucket)?;
    // The old key file opens it; or, once a rotation dropped it, the new one does: running
    // the same command again then finds it finished instead of failing.
    let key = match (old.unwrap(&remote, &desc), &existing) {
        (Ok(k), _) => k,
        (Err(e @ RemoteError::WrongKey { .. }), Some(n)) => {
            n.unwrap(&remote, &desc).map_err(|_| e)?
        }
        (Err(e), _) => return Err(e),
    };
    desc.verify(&remote, &key)?;
    let generation = this_stores_generation(&rt, &bucket, &key, &desc)?;
    if let Some(root) = &opts.store_root {
        check_store(root, &desc, generation)?;
    }
    // Only once the old key file is known to open the remote: a refused rotation leaves no
    // new key file behind to be mistaken for one that works.
    let created_key_file = existing.is_none();
    if created_key_file {
        create_key_file(&opts.new_key_file)?;
    }
    let new = KeyFile::read(&opts.new_key_file)?;

    let mut now = (desc, etag);
    let added = !now.0.keys.iter().any(|w| w.key_file == new.id);
    if added {
        let mut next = now.0.clone();
        next.keys.push(new.wrap(&next.store, &key));
        before_write();
        now = write(&rt, &bucket, next, &key, &now.1, &new)?;
    }
    // A key file this run created exists only here: the old one goes on opening the remote
    // until the user has put a copy of the new one somewhere safe and runs this again.
    let mut removed = None;
    let wrapped_old = now.0.keys.iter().any(|w| w.key_file == old.id);
    if !opts.keep_old && !created_key_file && wrapped_old {
        // The file must still be the key just wrapped for (not, say, a log or a config file
        // that changed since it was read).
        if KeyFile::read(&opts.new_key_file)?.id != new.id {
            return Err(RemoteError::Invalid(format!(
                "{} changed while the rotation ran; the old key file still opens the remote",
                opts.new_key_file.display()
            )));
        }
        // The store switches to the new key file while both open the remote.
        if let Some(root) = &opts.store_root {
            record_key_file(root, &opts.new_key_file)?;
        }
        let mut next = now.0.clone();
        next.keys.retain(|w| w.key_file != old.id);
        before_write();
        now = write(&rt, &bucket, next, &key, &now.1, &new)?;
        removed = Some(old.id.clone());
    }
    let finished = !now.0.keys.iter().any(|w| w.key_file == old.id);
    if let (Some(root), true) = (&opts.store_root, finished) {
        // Again, for a store whose rotation stopped between the drop and its record.
        record_key_file(root, &opts.new_key_file)?;
    }
    let (deleted, left) = match finished {
        true => delete_old_descriptors(&rt, &bucket)?,
        false => (0, 0),
    };
    Ok(RotateReport {
        remote,
        new_key_file: new.id,
        created_key_file,
        added,
        removed,
        finished,
        key_files: now.0.keys.iter().map(|w| w.key_file.clone()).collect(),
        old_descriptors_deleted: deleted,
        old_descriptors_left: left,
    })
}

/// A key file kept in the store's own directory would be lost with the node, and a file
/// of the store's (remote/remote.json, say) is rewritten by the store: neither may become
/// the only key.
fn refuse_key_in_store(opts: &RotateOptions) -> Result<()> {
    let Some(root) = &opts.store_root else {
        return Ok(());
    };
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    if abs(&opts.new_key_file).starts_with(abs(root)) {
        return Err(RemoteError::Invalid(format!(
            "the new key file {} is inside the store {}: keep it outside (it must survive the node)",
            opts.new_key_file.display(),
            root.display()
        )));
    }
    Ok(())
}

/// The remotes under `url`: each prefix at or below it that holds a store's descriptor (in a
/// cluster, `<remote.url>/<media>/<node>` for each worker that ever had a store).
pub fn stores_under(url: &RemoteUrl) -> Result<Vec<RemoteUrl>> {
    let rt = runtime()?;
    let bucket = block(&rt, Bucket::connect(url.clone()))?;
    let listed = block(&rt, async move { bucket.list("").await })?;
    let suffix = format!("/{}", layout::DESCRIPTOR);
    let mut out: Vec<RemoteUrl> = listed
        .iter()
        .filter_map(|o| {
            let dir = if o.name == layout::DESCRIPTOR {
                ""
            } else {
                o.name.strip_suffix(&suffix)?
            };
            let prefix = match (url.prefix.as_str(), dir) {
                (p, "") => p.to_string(),
                ("", d) => d.to_string(),
                (p, d) => format!("{p}/{d}"),
            };
            Some(RemoteUrl {
                bucket: url.bucket.clone(),
                prefix,
            })
        })
        .collect();
    out.sort_by(|a, b| a.prefix.cmp(&b.prefix));
    Ok(out)
}

fn read_tagged(rt: &tokio::runtime::Runtime, bucket: &Bucket) -> Result<(Descriptor, String)> {
    let b = bucket.clone();
    let (bytes, etag) = block(rt, async move { b.get_tagged(layout::DESCRIPTOR).await })?;
    let d = parse_descriptor(bucket, &bytes)?;
    let etag = etag.ok_or_else(|| RemoteError::Bucket {
        what: format!("reading {}", bucket.url.key(layout::DESCRIPTOR)),
        detail: "the server sent no ETag".into(),
    })?;
    Ok((d, etag))
}

/// The generation of the newest claim of this prefix that opens under `key` and names the
/// descriptor's store. A descriptor copied over this one from another store (whose key file
/// is the same, as in a cluster) opens and verifies, but opens none of this prefix's claims:
/// rewriting it would leave this store's data key wrapped only in an older version.
fn this_stores_generation(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    key: &DataKey,
    desc: &Descriptor,
) -> Result<u32> {
    let (b, k, store) = (bucket.clone(), key.clone(), desc.store.clone());
    let claim = block(rt, async move { fence::highest(&b, &k, &store, 0).await })?;
    claim.map(|c| c.generation).ok_or_else(|| {
        RemoteError::tampered(
            &bucket.url.key(layout::DESCRIPTOR),
            "no generation claim under this prefix opens with its data key: the descriptor is not this store's (copied from another?), or its init never finished; nothing was written",
        )
    })
}

/// The store at `root` must be this remote's current owner: its recorded key file is about to
/// change, and a stale copy (fenced out by a recovery elsewhere) must not rotate the key of
/// the store that took over.
fn check_store(root: &Path, desc: &Descriptor, generation: u32) -> Result<()> {
    let conf = LocalConfig::read(root)?
        .ok_or_else(|| RemoteError::Invalid(format!("{} has no remote", root.display())))?;
    if conf.store != desc.store {
        return Err(RemoteError::Invalid(format!(
            "{} holds store {}, but the store at {} is store {}",
            conf.url,
            desc.store,
            root.display(),
            conf.store
        )));
    }
    if conf.generation != generation {
        return Err(RemoteError::Fenced {
            remote: conf.url.to_string(),
            ours: conf.generation,
            theirs: generation,
            by: String::new(),
        });
    }
    Ok(())
}

fn record_key_file(root: &Path, key_file: &Path) -> Result<()> {
    let mut conf = LocalConfig::read(root)?
        .ok_or_else(|| RemoteError::Invalid(format!("{} has no remote", root.display())))?;
    conf.key_file = std::path::absolute(key_file).unwrap_or_else(|_| key_file.to_path_buf());
    conf.write(root)
}

/// Signs `next`, checks that it opens with `new` (the key file every descriptor a rotation
/// writes keeps), writes it over the descriptor read with ETag `etag` if nobody replaced it
/// since, and reads it back.
fn write(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    mut next: Descriptor,
    key: &DataKey,
    etag: &str,
    new: &KeyFile,
) -> Result<(Descriptor, String)> {
    next.sign(key);
    let remote = bucket.url.to_string();
    opens(&remote, &next, key, new)?;
    let body = serde_json::to_vec_pretty(&next).expect("descriptor serialises");
    let (b, tag) = (bucket.clone(), etag.to_string());
    // Under Object Lock the old descriptor stays as an older version, locked until its
    // retention ends: S3 lets a new version be written over a locked name, never the old
    // one be changed.
    let lock = next.object_lock;
    let written = block(rt, async move {
        b.put_if_match(layout::DESCRIPTOR, body.into(), lock, &tag)
            .await
    })?;
    if written.is_none() {
        return Err(RemoteError::Conflict {
            what: format!("rotating the key of {remote}"),
            detail: "its descriptor was changed by someone else since it was read (another rotation?); this run wrote nothing over it: run it again".into(),
        });
    }
    let back = read_tagged(rt, bucket)?;
    if back.0 != next {
        return Err(RemoteError::Conflict {
            what: format!("rotating the key of {remote}"),
            detail: "reading the descriptor back gave another one: someone else wrote it right after this run (another rotation?); run it again".into(),
        });
    }
    opens(&remote, &back.0, key, new)?;
    Ok(back)
}

/// `new` unwraps `key` from `d`, whose MAC verifies.
fn opens(remote: &str, d: &Descriptor, key: &DataKey, new: &KeyFile) -> Result<()> {
    let got = new.unwrap(remote, d)?;
    if got.bytes() != key.bytes() || got.id != key.id {
        return Err(RemoteError::Invalid(format!(
            "key file {} unwraps another data key from the new descriptor; not written",
            new.id
        )));
    }
    d.verify(remote, key)
}

/// Deletes the older versions of the descriptor a versioned bucket keeps (they wrap the data
/// key for the old key file too); those still under Object Lock are left, and counted.
fn delete_old_descriptors(rt: &tokio::runtime::Runtime, bucket: &Bucket) -> Result<(u32, u32)> {
    let b = bucket.clone();
    block(rt, async move {
        let (mut deleted, mut left) = (0, 0);
        for v in b.list_versions(layout::DESCRIPTOR).await? {
            if v.name != layout::DESCRIPTOR || v.latest {
                continue;
            }
            match b.delete_version(&v.name, &v.version_id).await {
                Ok(()) => deleted += 1,
                Err(e) => {
                    tracing::info!(version = %v.version_id, error = %e, "an older descriptor is kept (Object Lock?)");
                    left += 1;
                }
            }
        }
        Ok((deleted, left))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::random;

    #[test]
    fn a_descriptor_opens_with_each_key_file_it_wraps_for_and_no_other() {
        let (a, b) = (
            KeyFile::from_bytes(&[1u8; 32]).unwrap(),
            KeyFile::from_bytes(&[2u8; 32]).unwrap(),
        );
        let key = DataKey::new(1, random());
        let mut d = Descriptor {
            format: 1,
            store: "s".into(),
            created: "now".into(),
            frame_log2: 16,
            keys: vec![a.wrap("s", &key), b.wrap("s", &key)],
            object_lock: None,
            mac: String::new(),
        };
        d.sign(&key);
        opens("r", &d, &key, &a).unwrap();
        opens("r", &d, &key, &b).unwrap();
        d.keys.retain(|w| w.key_file == b.id);
        // Dropping a wrapping changes what the MAC covers: unsigned, it is refused.
        assert_eq!(
            opens("r", &d, &key, &b).unwrap_err().code(),
            "remote_corrupt"
        );
        d.sign(&key);
        opens("r", &d, &key, &b).unwrap();
        assert_eq!(opens("r", &d, &key, &a).unwrap_err().code(), "wrong_key");
        let other = DataKey::new(1, random());
        assert!(opens("r", &d, &other, &b).is_err());
    }

    /// Two rotations of one remote at once (a retried job on a second machine, say): the one
    /// whose descriptor changed under it writes nothing over the other's (`If-Match`), so the
    /// key file the finished one reports is the one that opens the remote.
    #[cfg(feature = "testing")]
    #[test]
    fn a_rotation_never_overwrites_one_that_ran_meanwhile() {
        use revault_engine::{InitOptions, OpenMode, Store};
        let url = crate::testing::fresh_url("rotate-race");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        Store::init(&root, &InitOptions::default()).unwrap();
        let store = Store::open(&root, OpenMode::ReadWrite, "test").unwrap();
        let init = crate::InitRemote {
            url: url.clone(),
            key_file: dir.path().join("key"),
            object_lock: None,
        };
        drop(crate::Remote::init(&store, &init).unwrap());
        let rotation = |new: &str| {
            let new = dir.path().join(new);
            create_key_file(&new).unwrap();
            RotateOptions {
                url: url.clone(),
                key_file: dir.path().join("key"),
                new_key_file: new,
                keep_old: false,
                store_root: None,
            }
        };
        let (a, b) = (rotation("a"), rotation("b"));
        let ran = std::cell::Cell::new(false);
        let e = rotate(&a, &|| {
            if !ran.replace(true) {
                let rep = rotate_key(&b).unwrap();
                assert!(rep.finished, "{rep:?}");
            }
        })
        .unwrap_err();
        assert_eq!(e.code(), "remote_conflict", "{e}");
        crate::owner(&url, &b.new_key_file).unwrap();
        let lost = crate::owner(&url, &a.new_key_file).unwrap_err();
        assert_eq!(lost.code(), "wrong_key", "{lost}");
    }
}
