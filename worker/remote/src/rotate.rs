//! Rotating the key file: the data key stays, who can unwrap it changes.
//!
//! The descriptor lists the data key wrapped under each key file that may open the remote
//! ([`crate::keys`]). A rotation takes two steps, each a run of the command: the first adds
//! the new key file's wrapping; the second, told so explicitly (`drop_old`) once the new file
//! is copied somewhere safe (and in a cluster rolled out to the workers), drops the old key
//! file's. Nothing is re-encrypted, and other wrappings (an escrow key kept offline) stay.
//! Running a step again is harmless: adding finds the key added, dropping finds the rotation
//! finished. Each write is a whole object, conditional on the descriptor being the one read
//! (`If-Match`), so two rotations cannot silently undo each other (docs/remote.md, "Keys").
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
    /// The key file being replaced: it opens the remote now (or did, before a run that
    /// dropped it, which is then found finished).
    pub key_file: PathBuf,
    /// The key file that will open it (created, 32 random bytes, by a run that adds it).
    pub new_key_file: PathBuf,
    /// The second step: drop the old key file's wrapping (the new one must be added already).
    /// Without it a run only adds the new key file.
    pub drop_old: bool,
    /// A store whose recorded key file (remote/remote.json) becomes the new one once the old
    /// one is dropped. The caller holds the store open, so no other process rewrites that
    /// file, nor opens the store, meanwhile.
    pub store_root: Option<PathBuf>,
}

/// What a run of a rotation did.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RotateReport {
    pub remote: String,
    /// The new key file's id, and whether this run created the file.
    pub new_key_file: String,
    pub created_key_file: bool,
    /// This run wrapped the data key for the new key file (the first run).
    pub added: bool,
    /// The key file whose wrapping this run removed (the old one, by the second run).
    pub removed: Option<String>,
    /// The old key file opens the remote no more.
    pub finished: bool,
    /// The key files that open the remote now.
    pub key_files: Vec<String>,
    /// The old and the new key file are one key, and the only one that opens the remote:
    /// nothing to rotate (with `--store`, the record after a finished rotation).
    pub same_key: bool,
    /// Older versions of the descriptor a versioned bucket keeps (they wrap the data key for
    /// the key files of their day); `None` if the bucket could not list them.
    pub older_descriptor_versions: Option<u32>,
}

/// Runs one step of the rotation of the remote at `opts.url` (see the module's
/// documentation).
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
    let rt = runtime()?;
    let bucket = block(&rt, Bucket::connect(opts.url.clone()))?;
    let remote = opts.url.to_string();
    let (desc, etag) = read_tagged(&rt, &bucket)?;
    let key = match (old.unwrap(&remote, &desc), &existing) {
        (Ok(k), _) => k,
        // Once the old key file is dropped, the new one opens the remote: a run after the
        // last (or after a drop whose answer was lost) finds the rotation finished.
        (Err(e @ RemoteError::WrongKey { .. }), Some(n)) => match n.unwrap(&remote, &desc) {
            Ok(k) => k,
            Err(_) => return Err(e),
        },
        (Err(e), _) => return Err(e),
    };
    desc.verify(&remote, &key)?;
    let generation = this_stores_generation(&rt, &bucket, &key, &desc)?;
    if let Some(root) = &opts.store_root {
        check_store(root, &desc, generation)?;
    }
    let ids: Vec<String> = desc.keys.iter().map(|w| w.key_file.clone()).collect();
    if let Some(n) = &existing {
        if n.id == old.id || !ids.contains(&old.id) {
            return only_key_left(opts, &rt, &bucket, n, &old, ids);
        }
    }
    if opts.drop_old {
        return drop_old(
            opts,
            &rt,
            &bucket,
            (desc, etag),
            &key,
            &old,
            existing,
            before_write,
        );
    }
    // Only once the old key file is known to open the remote: a refused rotation leaves no
    // new key file behind to be mistaken for one that works.
    let created_key_file = existing.is_none();
    if created_key_file {
        create_key_file(&opts.new_key_file)?;
    }
    let new = KeyFile::read(&opts.new_key_file)?;
    let added = !ids.contains(&new.id);
    let mut now = desc;
    if added {
        let mut next = now.clone();
        next.keys.push(new.wrap(&next.store, &key));
        before_write();
        now = write(&rt, &bucket, next, &key, &etag, &new)?.0;
    }
    Ok(report(
        opts,
        &rt,
        &bucket,
        &new,
        &old,
        &now,
        created_key_file,
        added,
        None,
    ))
}

/// The second step: the new key file is added already; the old one's wrapping goes, then
/// the store's record names the new one.
#[allow(clippy::too_many_arguments)]
fn drop_old(
    opts: &RotateOptions,
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    (desc, etag): (Descriptor, String),
    key: &DataKey,
    old: &KeyFile,
    new: Option<KeyFile>,
    before_write: &dyn Fn(),
) -> Result<RotateReport> {
    let not_added = || {
        RemoteError::Invalid(format!(
            "{} does not open {} yet: run the rotation without --drop-old first (it adds it), and copy the key file somewhere safe",
            opts.new_key_file.display(),
            opts.url
        ))
    };
    let new = new.ok_or_else(not_added)?;
    if !desc.keys.iter().any(|w| w.key_file == new.id) {
        return Err(not_added());
    }
    let mut next = desc;
    next.keys.retain(|w| w.key_file != old.id);
    before_write();
    let (now, _) = write(rt, bucket, next, key, &etag, &new)?;
    // After the drop, not before: a drop that failed leaves the record naming the old key
    // file, which still opens the remote, and the same command finishes it. One stopped
    // between the drop and this finds it finished when run again (and writes this then).
    if let Some(root) = &opts.store_root {
        record_key_file(root, &opts.new_key_file)?;
    }
    Ok(report(
        opts,
        rt,
        bucket,
        &new,
        old,
        &now,
        false,
        false,
        Some(old.id.clone()),
    ))
}

/// The new key file opens the remote, and either it is the old one too or the old one does
/// not open the remote (dropped by an earlier run, or never one of its keys): finished, and
/// the store's record switched, if the new key file is the only one left. Otherwise which
/// key file is the old one cannot be told, and nothing is done.
fn only_key_left(
    opts: &RotateOptions,
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    new: &KeyFile,
    old: &KeyFile,
    ids: Vec<String>,
) -> Result<RotateReport> {
    if ids != [new.id.clone()] {
        return Err(RemoteError::Invalid(format!(
            "{} is opened by key files {}: {} (given as the key file to replace) is {}; give the key file to replace as --key-file",
            opts.url,
            ids.join(", "),
            opts.key_file.display(),
            if old.id == new.id { "the new key file itself".to_string() } else { format!("key file {}, not one of them", old.id) }
        )));
    }
    if let Some(root) = &opts.store_root {
        record_key_file(root, &opts.new_key_file)?;
    }
    Ok(RotateReport {
        remote: opts.url.to_string(),
        new_key_file: new.id.clone(),
        created_key_file: false,
        added: false,
        removed: None,
        finished: true,
        key_files: ids,
        same_key: old.id == new.id,
        older_descriptor_versions: older_versions(rt, bucket),
    })
}

#[allow(clippy::too_many_arguments)]
fn report(
    opts: &RotateOptions,
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    new: &KeyFile,
    old: &KeyFile,
    now: &Descriptor,
    created_key_file: bool,
    added: bool,
    removed: Option<String>,
) -> RotateReport {
    RotateReport {
        remote: opts.url.to_string(),
        new_key_file: new.id.clone(),
        created_key_file,
        added,
        removed,
        finished: !now.keys.iter().any(|w| w.key_file == old.id),
        key_files: now.keys.iter().map(|w| w.key_file.clone()).collect(),
        same_key: false,
        older_descriptor_versions: older_versions(rt, bucket),
    }
}

/// A key file kept in the store's own directory would be lost with the node, and a file
/// of the store's (remote/remote.json, say) is rewritten by the store: neither may become
/// the only key.
fn refuse_key_in_store(opts: &RotateOptions) -> Result<()> {
    let Some(root) = &opts.store_root else {
        return Ok(());
    };
    // Symlinks and `..` resolved: the key file's directory exists (or the file cannot be made).
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let dir = opts
        .new_key_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if real(dir).starts_with(real(root)) {
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
    if conf.generation < generation {
        return Err(RemoteError::Fenced {
            remote: conf.url.to_string(),
            ours: conf.generation,
            theirs: generation,
            by: String::new(),
        });
    }
    if conf.generation > generation {
        return Err(RemoteError::Invalid(format!(
            "the store at {} records generation {}, but the newest claim in {} is generation {}",
            root.display(),
            conf.generation,
            conf.url,
            generation
        )));
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
    let back = read_tagged(rt, bucket)?;
    // A 412 may also answer a retry of a write that went through (its response lost): then
    // the descriptor is ours.
    if written.is_none() && back.0 != next {
        return Err(RemoteError::Conflict {
            what: format!("rotating the key of {remote}"),
            detail: "its descriptor was changed by someone else since it was read (another rotation?); this run did not replace it: run it again".into(),
        });
    }
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

/// How many older versions of the descriptor the bucket keeps, if it can list them. They
/// are not deleted here: each wraps the data key for the key files of its day, but telling
/// that a version is this store's, and never the current one, on every S3 server is more
/// than a count is worth (docs/remote.md, "Keys", says how to remove them).
fn older_versions(rt: &tokio::runtime::Runtime, bucket: &Bucket) -> Option<u32> {
    let b = bucket.clone();
    let listed = block(rt, async move { b.list_versions(layout::DESCRIPTOR).await });
    let older = listed
        .ok()?
        .iter()
        .filter(|v| v.name == layout::DESCRIPTOR && !v.latest && !v.delete_marker)
        .count();
    Some(older as u32)
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
                drop_old: false,
                store_root: None,
            }
        };
        let (a, b) = (rotation("a"), rotation("b"));
        let ran = std::cell::Cell::new(false);
        let e = rotate(&a, &|| {
            if !ran.replace(true) {
                let rep = rotate_key(&b).unwrap();
                assert!(rep.added, "{rep:?}");
            }
        })
        .unwrap_err();
        assert_eq!(e.code(), "remote_conflict", "{e}");
        crate::owner(&url, &b.new_key_file).unwrap();
        let lost = crate::owner(&url, &a.new_key_file).unwrap_err();
        assert_eq!(lost.code(), "wrong_key", "{lost}");
    }
}
