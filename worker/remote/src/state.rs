//! What a store knows of its remote, kept beside it in `STORE/remote/` and never in the
//! store's own metadata (so the uploader's bookkeeping is not itself a change to upload):
//!
//! ```text
//! remote/remote.json   which remote, this store's generation, the key file's path
//! remote/state/        RocksDB: the containers uploaded (with their sealed headers), the
//!                      opened ends of evicted ones, the last head published
//! ```
//!
//! Losing `remote/state/` loses nothing: `recover`, or a sync that finds it empty, rebuilds it
//! from a listing of the bucket.

use std::path::{Path, PathBuf};

use revault_engine::ContainerId;
use rocksdb::{Options, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};

use crate::bucket::ObjectLock;
use crate::error::{IoCtx, RemoteError, Result};
use crate::head::Head;
use crate::url::RemoteUrl;

pub const DIR: &str = "remote";
const CONFIG: &str = "remote.json";
const STATE: &str = "state";

/// `remote/remote.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LocalConfig {
    pub url: RemoteUrl,
    pub store: String,
    pub generation: u32,
    /// Where the key file is read from; `--key-file` or `REVAULT_KEY_FILE` override it.
    pub key_file: PathBuf,
    pub object_lock: Option<ObjectLock>,
}

impl LocalConfig {
    pub fn path(store_root: &Path) -> PathBuf {
        store_root.join(DIR).join(CONFIG)
    }

    /// The store's remote, if it has one.
    pub fn read(store_root: &Path) -> Result<Option<LocalConfig>> {
        let p = Self::path(store_root);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| RemoteError::Invalid(format!("{}: {e}", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).ctx(|| format!("reading {}", p.display())),
        }
    }

    /// Written whole or not at all (a new file renamed over the old, both synced).
    pub fn write(&self, store_root: &Path) -> Result<()> {
        let dir = store_root.join(DIR);
        std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!("{CONFIG}.new"));
        let bytes = serde_json::to_vec_pretty(self).expect("config serialises");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).ctx(|| format!("writing {}", tmp.display()))?;
            f.write_all(&bytes)
                .and_then(|_| f.sync_all())
                .ctx(|| format!("writing {}", tmp.display()))?;
        }
        let p = Self::path(store_root);
        std::fs::rename(&tmp, &p).ctx(|| format!("renaming {}", tmp.display()))?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .ctx(|| format!("syncing {}", dir.display()))
    }
}

/// The uploader's records (`remote/state/`).
pub struct State {
    db: DB,
}

const UPLOADED: u8 = b'u';
const STUB: u8 = b't';
const HEAD: &[u8] = b"h";
/// The head being written (generation, sequence number, BLAKE3 of its sealed bytes), until it
/// is recorded as the newest.
const WRITING: &[u8] = b"w";
/// Present while the bucket holds nothing a listing would remove (see [`State::is_clean`]).
const CLEAN: &[u8] = b"c";
/// The ledger of Object Lock retention: object name → when its retention ends at the
/// earliest (Unix seconds).
const LOCKED: u8 = b'l';

fn locked_key(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(LOCKED);
    k.extend_from_slice(name.as_bytes());
    k
}

fn key(kind: u8, id: ContainerId) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = kind;
    k[1..].copy_from_slice(&id.0.to_be_bytes());
    k
}

impl State {
    pub fn open(store_root: &Path, read_only: bool) -> Result<State> {
        let path = store_root.join(DIR).join(STATE);
        let mut o = Options::default();
        o.create_if_missing(!read_only);
        let db = if read_only {
            DB::open_for_read_only(&o, &path, false)
        } else {
            DB::open(&o, &path)
        }
        .map_err(|e| RemoteError::Io {
            context: format!("opening {}", path.display()),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(State { db })
    }

    fn put(&self, b: WriteBatch, sync: bool) -> Result<()> {
        let mut o = WriteOptions::default();
        o.set_sync(sync);
        self.db.write_opt(b, &o).map_err(db_err)
    }

    /// Containers uploaded, each with its sealed object's header.
    pub fn uploaded(&self) -> Result<Vec<(ContainerId, Vec<u8>)>> {
        let mut out = Vec::new();
        for kv in self.db.prefix_iterator([UPLOADED]) {
            let (k, v) = kv.map_err(db_err)?;
            if k.first() != Some(&UPLOADED) {
                break;
            }
            if let Ok(b) = <[u8; 8]>::try_from(&k[1..]) {
                out.push((ContainerId(u64::from_be_bytes(b)), v.to_vec()));
            }
        }
        Ok(out)
    }

    pub fn sealed_header(&self, id: ContainerId) -> Result<Option<Vec<u8>>> {
        self.db.get(key(UPLOADED, id)).map_err(db_err)
    }

    /// Records uploads (not synced: a crash only means uploading them again).
    pub fn set_uploaded(&self, items: &[(ContainerId, Vec<u8>)]) -> Result<()> {
        let mut b = WriteBatch::default();
        for (id, h) in items {
            b.put(key(UPLOADED, *id), h);
        }
        self.put(b, false)
    }

    /// Forgets deleted containers.
    pub fn forget(&self, ids: &[ContainerId]) -> Result<()> {
        let mut b = WriteBatch::default();
        for id in ids {
            b.delete(key(UPLOADED, *id));
            b.delete(key(STUB, *id));
        }
        self.put(b, true)
    }

    /// The ledger: every object with a recorded retention, and when it ends at the earliest.
    pub fn locked(&self) -> Result<Vec<(String, i64)>> {
        let mut out = Vec::new();
        for kv in self.db.prefix_iterator([LOCKED]) {
            let (k, v) = kv.map_err(db_err)?;
            if k.first() != Some(&LOCKED) {
                break;
            }
            let (Ok(name), Ok(until)) = (std::str::from_utf8(&k[1..]), <[u8; 8]>::try_from(&*v))
            else {
                continue; // not ours to read: the next extension rewrites it
            };
            out.push((name.to_string(), i64::from_be_bytes(until)));
        }
        Ok(out)
    }

    /// Records that the retention of `names` ends at `until` at the earliest. Not synced: a
    /// lost record only means extending those objects again.
    pub fn set_locked(&self, names: &[String], until: i64) -> Result<()> {
        let mut b = WriteBatch::default();
        for n in names {
            b.put(locked_key(n), until.to_be_bytes());
        }
        self.put(b, false)
    }

    pub fn forget_locked(&self, names: &[String]) -> Result<()> {
        let mut b = WriteBatch::default();
        for n in names {
            b.delete(locked_key(n));
        }
        self.put(b, false)
    }

    pub fn stub(&self, id: ContainerId) -> Result<Option<Vec<u8>>> {
        self.db.get(key(STUB, id)).map_err(db_err)
    }

    pub fn set_stub(&self, id: ContainerId, stub: &[u8]) -> Result<()> {
        let mut b = WriteBatch::default();
        b.put(key(STUB, id), stub);
        self.put(b, true)
    }

    /// Whether the bucket holds nothing but what the newest head and these records name: no
    /// upload of a sync or an early upload that was not followed by a finished sync, no
    /// deletion left to do. When it is not (or these records were lost), the next process
    /// lists the bucket for leftovers; when it is, that listing, which costs a request per
    /// thousand objects, is skipped.
    pub fn is_clean(&self) -> Result<bool> {
        Ok(self.db.get(CLEAN).map_err(db_err)?.is_some())
    }

    /// Sets or removes the clean marker (synced: removing it must be durable before an
    /// upload starts, and setting it records that every upload before it is accounted for).
    pub fn set_clean(&self, clean: bool) -> Result<()> {
        let mut b = WriteBatch::default();
        if clean {
            b.put(CLEAN, []);
        } else {
            b.delete(CLEAN);
        }
        self.put(b, true)
    }

    pub fn head(&self) -> Result<Option<Head>> {
        match self.db.get(HEAD).map_err(db_err)? {
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                RemoteError::Invalid(format!("the last head recorded in remote/state: {e}"))
            }),
            None => Ok(None),
        }
    }

    /// Records, durably, that head (`generation`, `seq`), whose sealed bytes hash to `hash`
    /// (BLAKE3), is about to be written: if the process stops between writing it and
    /// [`State::set_head`], the next one can tell that head in the bucket is its own
    /// ([`crate::head::newest`]), not a sign that its disk went back in time.
    pub fn set_writing_head(&self, generation: u32, seq: u64, hash: &[u8; 32]) -> Result<()> {
        let mut b = WriteBatch::default();
        let mut v = generation.to_be_bytes().to_vec();
        v.extend_from_slice(&seq.to_be_bytes());
        v.extend_from_slice(hash);
        b.put(WRITING, v);
        self.put(b, true)
    }

    /// The head recorded by [`State::set_writing_head`] and not yet by [`State::set_head`]:
    /// (generation, sequence number, hash).
    pub fn writing_head(&self) -> Result<Option<(u32, u64, [u8; 32])>> {
        Ok(self.db.get(WRITING).map_err(db_err)?.and_then(|v| {
            let g = u32::from_be_bytes(v.get(..4)?.try_into().ok()?);
            let s = u64::from_be_bytes(v.get(4..12)?.try_into().ok()?);
            let h: [u8; 32] = v.get(12..44)?.try_into().ok()?;
            Some((g, s, h))
        }))
    }

    pub fn set_head(&self, h: &Head) -> Result<()> {
        let mut b = WriteBatch::default();
        b.delete(WRITING);
        b.put(HEAD, serde_json::to_vec(h).expect("head serialises"));
        self.put(b, true)
    }

    /// Replaces everything with `uploaded` and `head` (after `recover`).
    pub fn reset(&self, uploaded: &[(ContainerId, Vec<u8>)], head: &Head) -> Result<()> {
        let mut b = WriteBatch::default();
        b.delete_range(&[0u8][..], &[0xffu8; 10][..]);
        for (id, h) in uploaded {
            b.put(key(UPLOADED, *id), h);
        }
        b.put(HEAD, serde_json::to_vec(head).expect("head serialises"));
        self.put(b, true)
    }
}

fn db_err(e: rocksdb::Error) -> RemoteError {
    RemoteError::Io {
        context: "the remote's state database (remote/state)".into(),
        source: std::io::Error::other(e.to_string()),
    }
}
