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
