//! A head: one published checkpoint of a store's metadata. The newest head of the highest
//! generation is what `recover` rebuilds; everything it names (its metadata files, and the
//! containers its metadata references) is in the bucket before it is written.

use serde::{Deserialize, Serialize};

/// A metadata file of the checkpoint: its name in the RocksDB directory, its object, size.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MetaFile {
    pub name: String,
    pub object: String,
    pub size: u64,
}

/// What a series had when the head was taken: the versions `recover` brings back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SeriesAt {
    pub name: String,
    /// The newest version, if it had any.
    pub latest: Option<u32>,
    pub versions: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Head {
    pub format: u32,
    pub store: String,
    pub generation: u32,
    pub seq: u64,
    /// RFC 3339.
    pub time: String,
    pub meta_files: Vec<MetaFile>,
    pub containers: u64,
    pub container_bytes: u64,
    /// The highest session id any container of the checkpoint was written under.
    pub max_session: u64,
    pub series: Vec<SeriesAt>,
}

impl Head {
    /// The newest version of `series` this head holds.
    pub fn durable_version(&self, series: &str) -> Option<u32> {
        self.series
            .iter()
            .find(|s| s.name == series)
            .and_then(|s| s.latest)
    }
}

/// What a store knows it published in its generation: the sequence number of the newest head
/// it recorded, and the head it recorded it was about to write (sequence number, BLAKE3 of the
/// sealed object) and may have written without recording it, if it stopped in between.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Published {
    pub(crate) recorded: Option<u64>,
    pub(crate) writing: Option<(u64, [u8; 32])>,
}

/// The newest head of a generation in the bucket, and whether this store wrote it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Newest {
    pub(crate) seq: u64,
    pub(crate) ours: bool,
}

/// The newest head of generation `generation` in the bucket, if any. It is this store's own
/// when it is no newer than the newest the store recorded, or when it is the one the store was
/// writing, byte for byte (a copy of the store, or its disk put back, may have written a head
/// under the same name: sealed with a fresh nonce, its bytes differ). Any other is the sign
/// that another copy of the store went on without this one: it must not be written over, nor
/// anything it names deleted.
pub(crate) async fn newest(
    bucket: &crate::bucket::Bucket,
    generation: u32,
    mine: Published,
) -> crate::error::Result<Option<Newest>> {
    let heads = bucket.list(crate::layout::HEADS).await?;
    let Some(seq) = heads
        .iter()
        .filter_map(|o| crate::layout::parse_head(&o.name))
        .filter(|(g, _)| *g == generation)
        .map(|(_, s)| s)
        .max()
    else {
        return Ok(None);
    };
    let ours = if mine.recorded.is_some_and(|r| seq <= r) {
        true
    } else if let Some((s, hash)) = mine.writing.filter(|(s, _)| *s == seq) {
        let body = bucket.get(&crate::layout::head(generation, s)).await?;
        *blake3::hash(&body).as_bytes() == hash
    } else {
        false
    };
    Ok(Some(Newest { seq, ours }))
}
