//! The metadata store's records: series, versions, containers, sessions, the store-wide
//! totals and id counters. Encodings only; `meta` reads and writes them.

use serde::{Deserialize, Serialize};

use crate::config::DedupUnit;
use crate::error::{corrupt_meta, Result};
use crate::format::codec::{open_crc, put_uvarint, seal_crc, Reader};
use crate::format::container::ContainerId;

pub(crate) fn decode_version(series: &str, v: u32, b: &[u8]) -> Result<VersionRecord> {
    serde_json::from_slice(b)
        .map_err(|e| corrupt_meta(format!("series {series} version {v}"), e.to_string()))
}

/// Id allocators, persisted in every commit (and at session start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub next_session: u64,
    pub next_unit: u64,
    pub next_series: u32,
}

impl Counters {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        put_uvarint(&mut v, self.next_session);
        put_uvarint(&mut v, self.next_unit);
        put_uvarint(&mut v, u64::from(self.next_series));
        seal_crc(&mut v);
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self> {
        let bad = || corrupt_meta("id counters", "checksum or format mismatch");
        let body = open_crc(b).ok_or_else(bad)?;
        let mut r = Reader::new(body);
        Ok(Counters {
            next_session: r.uvarint().ok_or_else(bad)?,
            next_unit: r.uvarint().ok_or_else(bad)?,
            next_series: u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?,
        })
    }

    /// Merges another writer's high-water marks into these.
    pub fn max(self, o: Counters) -> Counters {
        Counters {
            next_session: self.next_session.max(o.next_session),
            next_unit: self.next_unit.max(o.next_unit),
            next_series: self.next_series.max(o.next_series),
        }
    }
}

/// Store-wide sums, updated in every commit so `stats` costs one read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Logical bytes of every version currently stored.
    pub logical_bytes: u64,
    pub versions: u64,
    /// Uncompressed chunk bytes held by live units.
    pub unit_vbytes: u64,
    /// Bytes of container files on disk (compressed).
    pub container_bytes: u64,
    /// Uncompressed bytes in container files (live and dead).
    pub container_vbytes: u64,
    pub containers: u64,
    pub units: u64,
    /// Bytes of recipes and catalogs (metadata that grows with versions).
    pub recipe_bytes: u64,
    pub catalog_bytes: u64,
}

impl Totals {
    /// Logical bytes per byte of unique (deduplicated, uncompressed) data; 0 for an empty store.
    pub fn dedup_ratio(&self) -> f64 {
        ratio(self.logical_bytes, self.unit_vbytes)
    }

    /// Logical bytes per byte of container files on disk (dedup and compression); 0 when empty.
    pub fn total_ratio(&self) -> f64 {
        ratio(self.logical_bytes, self.container_bytes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        0.0
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep the newest this many versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
    /// Keep versions less than this many seconds older than the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_within_secs: Option<u64>,
    /// Calendar thinning: the newest version of each of the last N hours, days, ISO weeks,
    /// months and years that have one, in `timezone` (see `maintenance/retention.rs`).
    #[serde(default, skip_serializing_if = "Calendar::is_empty")]
    pub calendar: Calendar,
    /// Versions in the live window (default 1).
    #[serde(default = "default_live")]
    pub live: u32,
    /// After each backup, slide versions out of the live window and expire
    /// what retention no longer keeps.
    #[serde(default)]
    pub auto: bool,
}

/// What a series gets until someone sets its retention: every version kept, a live window
/// of one, and automatic slides — the mode docs/retention.md describes (segment dedup inline,
/// chunk-level reverse dedup as versions leave the window). A series that never slid got
/// segment dedup only (2.6x on the kube series instead of 9x; issue 21).
impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep: None,
            keep_within_secs: None,
            calendar: Calendar::default(),
            live: 1,
            auto: true,
        }
    }
}

/// How many hourly, daily, weekly, monthly and yearly versions a retention keeps, and the
/// time zone whose clock says where an hour, day, week, month or year begins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calendar {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hourly: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weekly: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yearly: Option<u32>,
    /// An IANA time zone name (`Europe/Berlin`); none means UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

impl Calendar {
    pub fn is_empty(&self) -> bool {
        self == &Calendar::default()
    }

    /// The counts, finest period first, with their names.
    pub fn counts(&self) -> [(&'static str, Option<u32>); 5] {
        [
            ("hourly", self.hourly),
            ("daily", self.daily),
            ("weekly", self.weekly),
            ("monthly", self.monthly),
            ("yearly", self.yearly),
        ]
    }
}

fn default_live() -> u32 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesRecord {
    pub id: u32,
    pub name: String,
    pub unit: DedupUnit,
    pub created_unix: i64,
    pub next_version: u32,
    #[serde(default)]
    pub retention: Retention,
    /// Bumped by every change to the series' versions; gc re-marks a series
    /// only when this differs from the generation it marked.
    #[serde(default)]
    pub generation: u64,
    /// A version was deleted since gc last marked this series, so containers
    /// it referenced may hold dead data.
    #[serde(default)]
    pub deleted_since_gc: bool,
    /// Rewrite selection on the inline path.
    #[serde(default)]
    pub rewrite: crate::config::RewriteSettings,
    /// The last backup's shape, for rewrite budgets.
    #[serde(default)]
    pub last: VersionHint,
    /// Set when the series was moved to another worker (its address): it takes no new
    /// version here, so a producer that still has this address is told, not acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionKind {
    /// One byte stream (a file or stdin).
    Stream,
    /// A directory tree: contents in the recipe, metadata in the catalog.
    Tree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecipeForm {
    /// References whole units (segments or chunks).
    Live,
    /// References chunks: direct, indirect (into a newer version) or zero.
    Archival,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub number: u32,
    /// Backup time, unix seconds (from `--time` or the clock).
    pub time_unix: i64,
    pub kind: VersionKind,
    pub form: RecipeForm,
    pub logical_bytes: u64,
    /// Chunk positions in the recipe (every chunk, zero chunks included).
    pub chunks: u64,
    pub recipe_parts: u32,
    pub recipe_bytes: u64,
    pub catalog_parts: u32,
    pub catalog_bytes: u64,
    pub catalog_entries: u64,
    /// What this backup added to the store.
    pub new_units: u64,
    pub new_vbytes: u64,
    pub new_container_bytes: u64,
    pub zero_bytes: u64,
    pub backup_secs: f64,
}

/// A container file known to the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRecord {
    pub file_bytes: u64,
    pub vbytes: u64,
    /// Uncompressed bytes of units still stored in it.
    pub live_vbytes: u64,
    /// Units still stored in it.
    pub live_units: u64,
    /// The version whose leftovers were repacked into it (series id, version), if any.
    pub owner: Option<(u32, u32)>,
}

impl ContainerRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(40);
        v.push(1);
        put_uvarint(&mut v, self.file_bytes);
        put_uvarint(&mut v, self.vbytes);
        put_uvarint(&mut v, self.live_vbytes);
        put_uvarint(&mut v, self.live_units);
        match self.owner {
            None => v.push(0),
            Some((s, n)) => {
                v.push(1);
                put_uvarint(&mut v, u64::from(s));
                put_uvarint(&mut v, u64::from(n));
            }
        }
        seal_crc(&mut v);
        v
    }

    pub fn decode(id: ContainerId, b: &[u8]) -> Result<Self> {
        let bad = || {
            corrupt_meta(
                format!("container record {id}"),
                "checksum or format mismatch",
            )
        };
        let body = open_crc(b).ok_or_else(bad)?;
        let mut r = Reader::new(body);
        if r.u8().ok_or_else(bad)? != 1 {
            return Err(bad());
        }
        let file_bytes = r.uvarint().ok_or_else(bad)?;
        let vbytes = r.uvarint().ok_or_else(bad)?;
        let live_vbytes = r.uvarint().ok_or_else(bad)?;
        let live_units = r.uvarint().ok_or_else(bad)?;
        let owner = match r.u8().ok_or_else(bad)? {
            0 => None,
            1 => Some((
                u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?,
                u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?,
            )),
            _ => return Err(bad()),
        };
        Ok(ContainerRecord {
            file_bytes,
            vbytes,
            live_vbytes,
            live_units,
            owner,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub kind: String,
    pub started_unix: i64,
    pub pid: u32,
}

/// What the series' previous version looked like: FCRC and LBW size their
/// rewrite budgets from it (Cao et al. use the previous version's unique
/// chunks as the estimate for the current one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionHint {
    pub chunks: u64,
    pub unique_chunks: u64,
    pub logical_bytes: u64,
}

impl VersionHint {
    /// Whether the previous version's unique chunks estimate this one's, as
    /// FCRC's budget assumes. Not when most of it was new (a series' first
    /// backup, or a complete change): an incremental version after a first
    /// full backup would get a budget the size of the whole first version.
    /// The budget then comes from this backup's own running counts, the
    /// paper's estimate for streams without a previous version.
    pub fn estimates_an_increment(&self) -> bool {
        self.unique_chunks > 0 && self.logical_bytes > 0 && self.unique_chunks * 2 <= self.chunks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_record_round_trips() {
        for owner in [None, Some((4, 17))] {
            let c = ContainerRecord {
                file_bytes: 1,
                vbytes: 2,
                live_vbytes: 3,
                live_units: 4,
                owner,
            };
            assert_eq!(
                ContainerRecord::decode(ContainerId(1), &c.encode()).unwrap(),
                c
            );
        }
    }
}
