//! Rotating the key file: the data key stays, who can unwrap it changes.
//!
//! The descriptor lists the data key wrapped under each key file that may open the remote
//! ([`crate::keys`]). A rotation adds the new key file's wrapping, then (unless told to keep
//! them) drops every other one: two writes of the descriptor, nothing re-encrypted. Each
//! write is a whole object, so a reader sees the old descriptor or the new one; between the
//! two writes both key files open the remote, so a rotation stopped half-way is finished by
//! running it again. That middle state is also how a cluster rotates without a window in
//! which its workers cannot open their remote: add the new key file (keeping the old), roll
//! the new key Secret out, then drop the old one (docs/remote.md, "Keys").
//!
//! Each new descriptor is checked before it is written (every key file it keeps unwraps the
//! same data key, its MAC verifies) and read back after: a descriptor nobody can open would
//! make the whole bucket unreadable.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bucket::Bucket;
use crate::error::{RemoteError, Result};
use crate::init::read_descriptor;
use crate::keys::{create_key_file, Descriptor, KeyFile};
use crate::seal::DataKey;
use crate::state::LocalConfig;
use crate::url::RemoteUrl;
use crate::{block, layout, runtime};

/// What to rotate.
#[derive(Clone, Debug)]
pub struct RotateOptions {
    pub url: RemoteUrl,
    /// A key file that opens the remote now.
    pub key_file: PathBuf,
    /// The key file that will open it (created, 32 random bytes, if missing).
    pub new_key_file: PathBuf,
    /// Keep the wrappings of the other key files (the first half of a rotation in a cluster).
    pub keep_old: bool,
    /// A store whose recorded key file (remote/remote.json) becomes the new one, written
    /// between the two halves. The caller holds the store open, so no other process rewrites
    /// that file meanwhile.
    pub store_root: Option<PathBuf>,
}

/// What a rotation did.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RotateReport {
    pub remote: String,
    /// The new key file's id, and whether the rotation created the file.
    pub new_key_file: String,
    pub created_key_file: bool,
    /// Whether the data key was wrapped for the new key file by this run (false: it already
    /// was, by a rotation stopped half-way or one that kept the old key files).
    pub added: bool,
    /// The key files whose wrapping this run removed.
    pub removed: Vec<String>,
    /// The key files that open the remote now.
    pub key_files: Vec<String>,
}

/// Rotates the key file of the remote at `opts.url` (see the module's documentation).
pub fn rotate_key(opts: &RotateOptions) -> Result<RotateReport> {
    let current = KeyFile::read(&opts.key_file)?;
    let rt = runtime()?;
    let bucket = block(&rt, Bucket::connect(opts.url.clone()))?;
    let remote = opts.url.to_string();
    let desc = read_descriptor(&rt, &bucket)?;
    let key = current.unwrap(&remote, &desc)?;
    desc.verify(&remote, &key)?;
    if let Some(root) = &opts.store_root {
        check_store(root, &desc)?;
    }
    // Only once the current key file is known to open the remote: a refused rotation
    // leaves no new key file behind to be mistaken for one that works.
    let created_key_file = !opts.new_key_file.exists();
    if created_key_file {
        create_key_file(&opts.new_key_file)?;
    }
    let new = KeyFile::read(&opts.new_key_file)?;

    let added = !desc.keys.iter().any(|w| w.key_file == new.id);
    let mut now = desc;
    if added {
        let mut next = now.clone();
        next.keys.push(new.wrap(&next.store, &key));
        now = write(&rt, &bucket, next, &key, &[&current, &new])?;
    }
    if let Some(root) = &opts.store_root {
        record_key_file(root, &opts.new_key_file)?;
    }
    let mut removed = Vec::new();
    if !opts.keep_old && now.keys.len() > 1 {
        let mut next = now.clone();
        removed = next
            .keys
            .iter()
            .filter(|w| w.key_file != new.id)
            .map(|w| w.key_file.clone())
            .collect();
        next.keys.retain(|w| w.key_file == new.id);
        now = write(&rt, &bucket, next, &key, &[&new])?;
    }
    Ok(RotateReport {
        remote,
        new_key_file: new.id,
        created_key_file,
        added,
        removed,
        key_files: now.keys.iter().map(|w| w.key_file.clone()).collect(),
    })
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

/// The store at `root` must be this remote's: its recorded key file is about to change.
fn check_store(root: &Path, desc: &Descriptor) -> Result<()> {
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
    Ok(())
}

fn record_key_file(root: &Path, key_file: &Path) -> Result<()> {
    let mut conf = LocalConfig::read(root)?
        .ok_or_else(|| RemoteError::Invalid(format!("{} has no remote", root.display())))?;
    conf.key_file = std::path::absolute(key_file).unwrap_or_else(|_| key_file.to_path_buf());
    conf.write(root)
}

/// Signs `next`, checks that each of `openers` unwraps `key` from it, writes it over the
/// descriptor and reads it back.
fn write(
    rt: &tokio::runtime::Runtime,
    bucket: &Bucket,
    mut next: Descriptor,
    key: &DataKey,
    openers: &[&KeyFile],
) -> Result<Descriptor> {
    next.sign(key);
    let remote = bucket.url.to_string();
    opens(&remote, &next, key, openers)?;
    let body = serde_json::to_vec_pretty(&next).expect("descriptor serialises");
    let b = bucket.clone();
    // Under Object Lock the old descriptor stays as an older version, locked until its
    // retention ends: S3 lets a new version be written over a locked name, never the old
    // one be changed.
    let lock = next.object_lock;
    block(rt, async move {
        b.put(layout::DESCRIPTOR, body.into(), lock).await
    })?;
    let back = read_descriptor(rt, bucket)?;
    if back != next {
        return Err(RemoteError::Bucket {
            what: format!("writing {}", bucket.url.key(layout::DESCRIPTOR)),
            detail: "reading it back gave another descriptor (was it changed meanwhile?)".into(),
        });
    }
    opens(&remote, &back, key, openers)?;
    Ok(back)
}

/// Each of `openers` unwraps `key` from `d`, whose MAC verifies.
fn opens(remote: &str, d: &Descriptor, key: &DataKey, openers: &[&KeyFile]) -> Result<()> {
    for kf in openers {
        let got = kf.unwrap(remote, d)?;
        if got.bytes() != key.bytes() || got.id != key.id {
            return Err(RemoteError::Invalid(format!(
                "key file {} unwraps another data key from the new descriptor; not written",
                kf.id
            )));
        }
    }
    d.verify(remote, key)
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
        opens("r", &d, &key, &[&a, &b]).unwrap();
        d.keys.retain(|w| w.key_file == b.id);
        // Dropping a wrapping changes what the MAC covers: unsigned, it is refused.
        assert_eq!(
            opens("r", &d, &key, &[&b]).unwrap_err().code(),
            "remote_corrupt"
        );
        d.sign(&key);
        opens("r", &d, &key, &[&b]).unwrap();
        assert_eq!(opens("r", &d, &key, &[&a]).unwrap_err().code(), "wrong_key");
        let other = DataKey::new(1, random());
        assert!(opens("r", &d, &other, &[&b]).is_err());
    }
}
