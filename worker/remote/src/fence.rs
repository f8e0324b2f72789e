//! Fencing: one remote, one writer.
//!
//! A store writes to its remote under a *generation*. `init` claims generation 1; every
//! `recover` claims the next one (`gens/GGGGGGGG`, written with `If-None-Match: *`, so two
//! recoveries cannot claim the same one) before it reads the newest head. A store checks the
//! claims before each step that could hurt a newer owner — uploading containers (every batch of
//! at most 64, early uploads included), publishing a head, deleting anything — and stops with [`RemoteError::Fenced`] once a higher generation
//! exists. Why that is enough (with S3's read-after-write consistency for PUT and LIST): a
//! deletion the old store makes after its check is of an object its own newest head no longer
//! names; the recovering store claimed after that check, so the head it reads afterwards is
//! that one or newer, and needs nothing deleted. What the old store uploads after the claim is
//! never named by a head the new store reads, and the new store skips the old one's session
//! ids by a wide margin so their container names cannot collide (docs/remote.md, "Fencing").

use serde::{Deserialize, Serialize};

use crate::bucket::{Bucket, ObjectLock};
use crate::error::{RemoteError, Result};
use crate::layout;
use crate::seal::{self, DataKey};

/// What a generation's claim records: who took the remote over, when, from which head.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub store: String,
    pub generation: u32,
    pub host: String,
    pub time: String,
    /// The head the new owner started from (empty for `init`).
    pub based_on: String,
}

/// Claims generation `claim.generation`; false if it was already claimed.
pub async fn claim(
    bucket: &Bucket,
    key: &DataKey,
    claim: &Claim,
    lock: Option<ObjectLock>,
) -> Result<bool> {
    let name = layout::generation(claim.generation);
    let body = seal::seal(
        key,
        &name,
        &serde_json::to_vec(claim).expect("claim serialises"),
        seal::DEFAULT_FRAME_LOG2,
    );
    bucket.put_new(&name, body.into(), lock).await
}

/// The highest generation claimed above `above` (0: any) by a claim that opens under the data
/// key and names this store, with the claim: an object anyone could write under `gens/` is
/// no claim (it would fence every writer out for good).
pub async fn highest(
    bucket: &Bucket,
    key: &DataKey,
    store: &str,
    above: u32,
) -> Result<Option<Claim>> {
    let mut gens: Vec<u32> = bucket
        .list(layout::GENS)
        .await?
        .iter()
        .filter_map(|o| layout::parse_generation(&o.name))
        .filter(|g| *g > above)
        .collect();
    gens.sort_unstable_by(|a, b| b.cmp(a));
    for g in gens {
        match read(bucket, key, g).await {
            Ok(c) if c.generation == g && c.store == store => return Ok(Some(c)),
            Ok(_) | Err(RemoteError::Tampered { .. }) => {
                tracing::warn!(generation = g, remote = %bucket.url, "ignoring a generation claim that is not this store's");
            }
            Err(RemoteError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Fails with [`RemoteError::Fenced`] when a generation above `ours` was claimed.
pub async fn check(bucket: &Bucket, key: &DataKey, store: &str, ours: u32) -> Result<()> {
    match highest(bucket, key, store, ours).await? {
        None => Ok(()),
        Some(c) => Err(RemoteError::Fenced {
            remote: bucket.url.to_string(),
            ours,
            theirs: c.generation,
            by: format!("{} at {}", c.host, c.time),
        }),
    }
}

pub async fn read(bucket: &Bucket, key: &DataKey, generation: u32) -> Result<Claim> {
    let name = layout::generation(generation);
    let sealed = bucket.get(&name).await?;
    let plain = bucket.open_sealed(key, &name, &sealed)?;
    serde_json::from_slice(&plain)
        .map_err(|e| RemoteError::tampered(&bucket.url.key(&name), &e.to_string()))
}

/// This machine's name, for claims ("recovered by …").
pub fn host() -> String {
    std::env::var("NODE_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown host".into())
}
