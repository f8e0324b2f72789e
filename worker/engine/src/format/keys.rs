//! Every column family of the metadata store and every key in it: the one list to read
//! before touching the store's records (docs/format.md describes the same).
//!
//! | column family | key                                | value                                     |
//! |---------------|------------------------------------|-------------------------------------------|
//! | default       | [`CONFIG_KEY`] "config"            | the store's config (JSON)                 |
//! |               | [`COUNTERS_KEY`] "counters"        | id allocators (`records::Counters`)       |
//! |               | [`TOTALS_KEY`] "totals"            | store-wide sums (`records::Totals`, JSON) |
//! |               | [`MARKS_KEPT_KEY`] "marks-kept"    | present once `F` and `Z` keys are kept    |
//! |               |                                    | (see `orphans::adopt_untracked`)          |
//! |               | [`DOMAINS_KEY`] "domains"          | present once dedup domains were used      |
//! |               | [`PROBE_KEY`] "probe"              | never stored: a health probe deletes it   |
//! |               | [`BUCKET_PREFIX`] "objects/b/"     | a bucket of the object API (JSON)         |
//! |               | bucket                             |                                           |
//! |               | [`OBJECT_PREFIX`] "objects/k/"     | an object of the object API (JSON)        |
//! |               | bucket, 0, key                     |                                           |
//! | series        | "ns/name"                          | `records::SeriesRecord` (JSON)            |
//! | versions      | [`version_key`]: series id,        | `records::VersionRecord` (JSON)           |
//! |               | version (BE)                       |                                           |
//! | recipes       | [`part_key`]: series id, version,  | recipe bytes + CRC32C                     |
//! |               | part (BE)                          |                                           |
//! | catalogs      | [`part_key`]                       | catalog bytes (zstd) + CRC32C             |
//! | units         | unit id (BE)                       | `unit::UnitRecord` (binary + CRC32C)      |
//! | refs          | unit id (BE)                       | format 1 only: one unit's counts          |
//! | refcounts     | [`refs_block_key`]: block (BE)     | `refcounts::RefsBlock`: 64 units' counts  |
//! | index         | [`index_key`]: kind byte, fp       | unit ids: where new backups dedup to      |
//! | containers    | container id (BE)                  | `records::ContainerRecord` (binary + CRC) |
//! | sessions      | session id (BE)                    | a write session that has not committed    |
//! | marks         | [`mark_key`] `M` unit, group       | gc: a group's mark of a unit              |
//! |               | [`member_key`] `N` group, unit     | gc: the group's members                   |
//! |               | [`group_key`] `G` group            | the generation a group was marked at      |
//! |               | [`sweep_key`] `S` container        | may hold dead data: gc sweeps it          |
//! |               | [`freed_key`] `F` container        | freed by a commit (proof for gc that its  |
//! |               |                                    | file may be deleted)                      |
//! |               | [`zombie_key`] `Z` unit            | unreferenced while pinned: gc frees it    |

use crate::config::DedupUnit;
use crate::format::container::ContainerId;
use crate::format::fp::Fp;

pub const CF_SERIES: &str = "series";
pub const CF_VERSIONS: &str = "versions";
pub const CF_RECIPES: &str = "recipes";
pub const CF_CATALOGS: &str = "catalogs";
pub const CF_UNITS: &str = "units";
/// Per-unit reference counts of a format-1 store, until a read-write open
/// moves them into `refcounts` (empty afterwards).
pub const CF_REFS: &str = "refs";
/// Reference counts in blocks of [`REFS_BLOCK`](crate::format::refcounts::REFS_BLOCK) units (format 2). A build
/// from before format 2 cannot open a store that has this family (RocksDB
/// refuses to open a store with a column family it does not name), so it
/// cannot misread the counts as zero.
pub const CF_REFCOUNTS: &str = "refcounts";
pub const CF_INDEX: &str = "index";
pub const CF_CONTAINERS: &str = "containers";
pub const CF_SESSIONS: &str = "sessions";
pub const CF_MARKS: &str = "marks";

/// In the default family: the store's config (JSON).
pub const CONFIG_KEY: &[u8] = b"config";
/// In the default family: the id allocators.
pub const COUNTERS_KEY: &[u8] = b"counters";
/// In the default family: the store-wide sums.
pub const TOTALS_KEY: &[u8] = b"totals";

/// In the default family: a bucket of the object API (the `revault-objects` crate), by name.
pub const BUCKET_PREFIX: &[u8] = b"objects/b/";
/// In the default family: an object of the object API, by bucket, a zero byte and its key.
pub const OBJECT_PREFIX: &[u8] = b"objects/k/";

pub fn bucket_key(bucket: &str) -> Vec<u8> {
    [BUCKET_PREFIX, bucket.as_bytes()].concat()
}

/// The prefix of every object key of `bucket`.
pub fn bucket_objects_prefix(bucket: &str) -> Vec<u8> {
    [OBJECT_PREFIX, bucket.as_bytes(), b"\0"].concat()
}

pub fn object_key(bucket: &str, key: &str) -> Vec<u8> {
    [bucket_objects_prefix(bucket).as_slice(), key.as_bytes()].concat()
}

/// `F`+container in `marks`: a commit freed this container. Its file is
/// unlinked after the commit (or, while a reader may still need it, later);
/// the key is what lets gc delete a file no record names, since a file
/// without one may be the only copy of data whose metadata was lost.
pub fn freed_key(c: ContainerId) -> [u8; 9] {
    prefixed(b'F', c.0)
}

/// `S`+container in `marks`: the container may hold dead data (it lost
/// units, or a unit in it lost its last link); gc's next sweep looks at it.
pub fn sweep_key(c: ContainerId) -> [u8; 9] {
    prefixed(b'S', c.0)
}

/// `Z`+unit in `marks`: the unit's references reached zero while a backup in
/// flight had it pinned, so the commit could not free it; gc does, even after
/// a restart.
pub fn zombie_key(unit: u64) -> [u8; 9] {
    prefixed(b'Z', unit)
}

/// A `marks` key: a kind byte, then an id (big-endian).
pub fn prefixed(p: u8, id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = p;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The id in a key made by [`freed_key`] or [`zombie_key`].
pub fn prefixed_id(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(k.get(1..9)?.try_into().ok()?))
}

/// In the default family: this store records freed containers (`F`) and
/// zombie units (`Z`); a store from before them gets it at its first
/// read-write open (`orphans::adopt_untracked`).
pub const MARKS_KEPT_KEY: &[u8] = b"marks-kept";

/// In the default family: the store was opened with namespace dedup domains, so its unit
/// records may carry a domain (the store marker says format 3; `Store::set_dedup_domain`).
pub const DOMAINS_KEY: &[u8] = b"domains";

/// The key [`Meta::probe_write`](crate::meta::Meta::probe_write) deletes, in the default family; never stored.
pub const PROBE_KEY: &[u8] = b"probe";

/// Every key of the default family, or the prefix of its keys (docs/format.md lists them all).
pub const DEFAULT_KEYS: &[&[u8]] = &[
    CONFIG_KEY,
    COUNTERS_KEY,
    TOTALS_KEY,
    MARKS_KEPT_KEY,
    DOMAINS_KEY,
    PROBE_KEY,
    BUCKET_PREFIX,
    OBJECT_PREFIX,
];

/// Every column family besides the default one.
pub const ALL_CFS: &[&str] = &[
    CF_SERIES,
    CF_VERSIONS,
    CF_RECIPES,
    CF_CATALOGS,
    CF_UNITS,
    CF_REFS,
    CF_REFCOUNTS,
    CF_INDEX,
    CF_CONTAINERS,
    CF_SESSIONS,
    CF_MARKS,
];

pub fn version_key(series: u32, v: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&series.to_be_bytes());
    k[4..].copy_from_slice(&v.to_be_bytes());
    k
}

pub fn part_key(series: u32, v: u32, part: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&version_key(series, v));
    k[8..].copy_from_slice(&part.to_be_bytes());
    k
}

pub fn index_key(kind: DedupUnit, fp: &Fp) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = match kind {
        DedupUnit::Segment => b'S',
        DedupUnit::Chunk => b'C',
    };
    k[1..].copy_from_slice(&fp.0);
    k
}

/// Key of block `block` (units `block * 64 .. block * 64 + 63`) in
/// [`CF_REFCOUNTS`]: the block number, u64 BE.
pub fn refs_block_key(block: u64) -> [u8; 8] {
    block.to_be_bytes()
}

pub fn mark_key(unit: u64, group: u32) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = b'M';
    k[1..9].copy_from_slice(&unit.to_be_bytes());
    k[9..].copy_from_slice(&group.to_be_bytes());
    k
}

pub fn member_key(group: u32, unit: u64) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = b'N';
    k[1..5].copy_from_slice(&group.to_be_bytes());
    k[5..].copy_from_slice(&unit.to_be_bytes());
    k
}

pub fn group_key(group: u32) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[0] = b'G';
    k[1..].copy_from_slice(&group.to_be_bytes());
    k
}
