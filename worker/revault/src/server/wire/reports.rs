//! What the store and its maintenance report: the engine's reports as the
//! wire carries them (camelCase; a figure another body also carries has the
//! same name there: `newBytes`, `storedBytes`, `time`). Each conversion
//! names every field of the engine's struct (no `..`): a field the engine
//! adds fails to compile here until someone decides whether clients get it.

use serde::{Deserialize, Serialize};

use revault_engine::{
    BackupReport as EngineBackup, DedupDomain, ExpireReport as EngineExpire, GcReport as EngineGc,
    OrphanReport as EngineOrphans, RestoreReport as EngineRestore, SlideReport as EngineSlide,
    Totals,
};

use super::{DedupUnit, ErrorBody, VersionKind};
use crate::cli::format_time;

/// Store totals (`GET /v1/stats`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Logical bytes of every version currently stored.
    pub logical_bytes: u64,
    pub versions: u64,
    /// Uncompressed chunk bytes held by live units (the unique data).
    pub unique_bytes: u64,
    /// Bytes of container files on disk (compressed).
    pub container_bytes: u64,
    /// Uncompressed bytes in container files (live and dead).
    pub container_uncompressed_bytes: u64,
    pub containers: u64,
    pub units: u64,
    pub recipe_bytes: u64,
    pub catalog_bytes: u64,
    /// Logical bytes per unique byte (0 for an empty store).
    pub dedup_ratio: f64,
    /// Logical bytes per byte on disk (0 for an empty store).
    pub total_ratio: f64,
    /// The store's remote, if it has one.
    pub remote: Option<RemoteStats>,
    /// Room on the filesystems holding the store (None when it cannot be read).
    pub disk: Option<DiskSpace>,
    /// What backups deduplicate against (`--dedup-domain`): `store` or `namespace`.
    pub dedup_domain: String,
    /// Why the store takes no new work that writes (a full disk), while it still serves
    /// reads; None when it takes work.
    pub degraded: Option<String>,
}

/// `GET /readyz?exclude=writes`: a check to leave out (the Kubernetes API server's style).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ReadyQuery {
    pub exclude: Option<ReadyCheck>,
}

/// A check `/readyz` can leave out.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ReadyCheck {
    /// Whether the store takes work that writes (not while a full disk degrades it).
    Writes,
}

/// Size and free room of the filesystems holding a store's containers and its metadata (the
/// same one unless the data directory is elsewhere), as `statvfs` reports them; free is what
/// an unprivileged writer may still use.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpace {
    pub data_total_bytes: u64,
    pub data_free_bytes: u64,
    pub meta_total_bytes: u64,
    pub meta_free_bytes: u64,
}

/// The durable tier, as `GET /v1/stats` reports it.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct RemoteStats {
    /// `s3://BUCKET/PREFIX`.
    pub url: String,
    pub store: String,
    pub generation: u32,
    /// When the newest head the bucket holds was taken (RFC 3339).
    pub head_time: Option<String>,
    /// Age of the oldest change the bucket does not hold yet (0: it holds everything).
    pub lag_seconds: f64,
    /// The last sync's error, until a sync succeeds.
    pub last_error: Option<String>,
    /// The store was rebuilt elsewhere and takes no writes here.
    pub fenced: bool,
}

impl From<Totals> for Stats {
    fn from(t: Totals) -> Self {
        let Totals {
            logical_bytes,
            versions,
            unit_vbytes,
            container_bytes,
            container_vbytes,
            containers,
            units,
            recipe_bytes,
            catalog_bytes,
        } = t;
        Stats {
            logical_bytes,
            versions,
            unique_bytes: unit_vbytes,
            container_bytes,
            container_uncompressed_bytes: container_vbytes,
            containers,
            units,
            recipe_bytes,
            catalog_bytes,
            dedup_ratio: t.dedup_ratio(),
            total_ratio: t.total_ratio(),
            remote: None,
            disk: None,
            dedup_domain: DedupDomain::default().to_string(),
            degraded: None,
        }
    }
}

/// What gc did (`POST /v1/gc`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct GcReport {
    pub orphans: OrphanReport,
    pub groups: u64,
    pub groups_marked: u64,
    pub units_marked: u64,
    pub containers_swept: u64,
    pub units_freed: u64,
    pub units_trimmed: u64,
    pub containers_compacted: u64,
    pub containers_freed: u64,
    /// Container bytes freed and written (net reclaimed = freed - written).
    pub bytes_freed: u64,
    pub bytes_written: u64,
    pub mark_seconds: f64,
    pub sweep_seconds: f64,
    pub seconds: f64,
}

impl From<EngineGc> for GcReport {
    fn from(r: EngineGc) -> Self {
        let EngineGc {
            orphans,
            groups,
            groups_marked,
            units_marked,
            containers_swept,
            units_freed,
            units_trimmed,
            containers_compacted,
            containers_freed,
            bytes_freed,
            bytes_written,
            mark_secs,
            sweep_secs,
            seconds,
        } = r;
        GcReport {
            orphans: orphans.into(),
            groups,
            groups_marked,
            units_marked,
            containers_swept,
            units_freed,
            units_trimmed,
            containers_compacted,
            containers_freed,
            bytes_freed,
            bytes_written,
            mark_seconds: mark_secs,
            sweep_seconds: sweep_secs,
            seconds,
        }
    }
}

/// Files in the data directory that gc found no record for.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct OrphanReport {
    /// Freed container files deleted (a crash came between their commit and
    /// their unlink).
    pub orphan_files: u64,
    pub orphan_bytes: u64,
    pub empty_dirs: u64,
    /// Files no record names and no commit freed, moved to quarantine.
    pub quarantined_files: u64,
    pub quarantined_bytes: u64,
}

impl From<EngineOrphans> for OrphanReport {
    fn from(r: EngineOrphans) -> Self {
        let EngineOrphans {
            orphan_files,
            orphan_bytes,
            empty_dirs,
            quarantined_files,
            quarantined_bytes,
        } = r;
        OrphanReport {
            orphan_files,
            orphan_bytes,
            empty_dirs,
            quarantined_files,
            quarantined_bytes,
        }
    }
}

/// What a slide did (`POST …/slide`, and after a backup).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct SlideReport {
    pub series: String,
    /// Versions moved to the archival window.
    pub slid: Vec<u32>,
    /// Chunks that became references into the next version.
    pub indirect_chunks: u64,
    pub direct_chunks: u64,
    pub units_trimmed: u64,
    pub units_freed: u64,
    /// Shared units moved out of split containers.
    pub units_moved: u64,
    /// Links from surviving units into trimmed ones, replaced by the bytes.
    pub links_resolved: u64,
    /// Data written (uncompressed) and containers freed.
    pub bytes_written: u64,
    pub containers_freed: u64,
    pub bytes_freed: u64,
    pub seconds: f64,
}

impl From<EngineSlide> for SlideReport {
    fn from(r: EngineSlide) -> Self {
        let EngineSlide {
            series,
            slid,
            indirect_chunks,
            direct_chunks,
            units_trimmed,
            units_freed,
            units_moved,
            links_resolved,
            bytes_written,
            containers_freed,
            bytes_freed,
            seconds,
        } = r;
        SlideReport {
            series,
            slid,
            indirect_chunks,
            direct_chunks,
            units_trimmed,
            units_freed,
            units_moved,
            links_resolved,
            bytes_written,
            containers_freed,
            bytes_freed,
            seconds,
        }
    }
}

/// What was expired (`POST …/expire`, the deletes, and after a backup).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ExpireReport {
    pub series: String,
    pub expired: Vec<u32>,
    /// Older versions whose references were spliced onto a deleted one's.
    pub spliced: Vec<u32>,
    pub units_freed: u64,
    pub containers_freed: u64,
    pub bytes_freed: u64,
    pub logical_bytes_expired: u64,
    pub seconds: f64,
}

impl From<EngineExpire> for ExpireReport {
    fn from(r: EngineExpire) -> Self {
        let EngineExpire {
            series,
            expired,
            spliced,
            units_freed,
            containers_freed,
            bytes_freed,
            logical_bytes_expired,
            seconds,
        } = r;
        ExpireReport {
            series,
            expired,
            spliced,
            units_freed,
            containers_freed,
            bytes_freed,
            logical_bytes_expired,
            seconds,
        }
    }
}

/// The committed version (`PUT …/versions`).
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    pub series: String,
    pub version: u32,
    pub kind: VersionKind,
    pub unit: DedupUnit,
    /// The version's time (RFC 3339, as in the version's listing).
    pub time: String,
    pub logical_bytes: u64,
    pub chunks: u64,
    /// Distinct units the version references.
    pub units: u64,
    pub new_units: u64,
    /// New unique data (uncompressed) and the container bytes it took on
    /// disk (compressed): the version listing's `newBytes` and `storedBytes`.
    pub new_bytes: u64,
    pub stored_bytes: u64,
    pub zero_bytes: u64,
    pub catalog_entries: u64,
    pub recipe_bytes: u64,
    pub catalog_bytes: u64,
    pub seconds: f64,
    /// Rewrite policy used, and the duplicates it stored again.
    pub rewrite: String,
    pub rewritten_units: u64,
    pub rewritten_chunks: u64,
    pub rewritten_bytes: u64,
    /// Bytes whose chunk boundaries came from the previous version.
    pub predicted_bytes: u64,
    /// What the series' automatic retention did after the backup committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slide: Option<SlideReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire: Option<ExpireReport>,
    /// Why automatic retention failed after the commit (the version exists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_error: Option<String>,
}

impl From<EngineBackup> for BackupReport {
    fn from(r: EngineBackup) -> Self {
        let EngineBackup {
            series,
            version,
            kind,
            unit,
            time_unix,
            logical_bytes,
            chunks,
            units,
            new_units,
            new_vbytes,
            new_container_bytes,
            zero_bytes,
            catalog_entries,
            recipe_bytes,
            catalog_bytes,
            seconds,
            rewrite,
            rewritten_units,
            rewritten_chunks,
            rewritten_bytes,
            predicted_bytes,
            slide,
            expire,
            retention_error,
        } = r;
        BackupReport {
            series,
            version,
            kind: kind.into(),
            unit: unit.into(),
            time: format_time(time_unix),
            logical_bytes,
            chunks,
            units,
            new_units,
            new_bytes: new_vbytes,
            stored_bytes: new_container_bytes,
            zero_bytes,
            catalog_entries,
            recipe_bytes,
            catalog_bytes,
            seconds,
            rewrite,
            rewritten_units,
            rewritten_chunks,
            rewritten_bytes,
            predicted_bytes,
            slide: slide.map(SlideReport::from),
            expire: expire.map(ExpireReport::from),
            retention_error,
        }
    }
}

/// A restore's report (`GET /v1/restores/{id}`), by its `state`.
#[derive(Serialize, Clone, Debug)]
#[serde(
    tag = "state",
    rename_all = "lowercase",
    rename_all_fields = "camelCase"
)]
pub enum RestoreReport {
    /// The body was sent whole: what it took.
    Done {
        id: String,
        #[serde(flatten)]
        figures: RestoreFigures,
    },
    /// The body ended in an error. `series` and `version` are absent when
    /// the restore task ended without a report.
    Failed {
        id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        series: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        version: Option<u32>,
        error: ErrorBody,
    },
    /// Still sending when the server stopped waiting for it.
    Running { id: String },
}

/// What a restore that completed read and held.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct RestoreFigures {
    pub series: String,
    pub version: u32,
    pub kind: Option<VersionKind>,
    pub logical_bytes: u64,
    pub container_reads: u64,
    /// Stored (compressed) bytes read from container files.
    pub bytes_read: u64,
    /// Uncompressed bytes decoded from blocks.
    pub bytes_decoded: u64,
    /// Bytes decoded per byte restored (1.0 means nothing wasted).
    pub read_amplification: f64,
    /// MiB restored per container read; null when nothing was read.
    pub speed_factor: Option<f64>,
    /// Levels of indirect references followed (0 for a live version).
    pub chain_depth: u32,
    /// The cache that ran (what `auto` chose, when it was asked for).
    pub cache: String,
    /// Whether `cache` was chosen by `auto`.
    pub cache_auto: bool,
    pub cache_bytes: u64,
    /// The most memory the cache held (never more than `cache_bytes`).
    pub peak_cache_bytes: u64,
    /// Bytes of repeated chunks served from memory, and the most held for
    /// that (part of `peak_cache_bytes`).
    pub reused_bytes: u64,
    pub reuse_peak_bytes: u64,
    pub seconds: f64,
    pub warnings: Vec<String>,
}

impl From<EngineRestore> for RestoreFigures {
    fn from(r: EngineRestore) -> Self {
        let EngineRestore {
            series,
            version,
            kind,
            logical_bytes,
            container_reads,
            bytes_read,
            bytes_decoded,
            read_amplification,
            speed_factor,
            chain_depth,
            cache,
            cache_auto,
            cache_bytes,
            peak_cache_bytes,
            reused_bytes,
            reuse_peak_bytes,
            seconds,
            warnings,
        } = r;
        RestoreFigures {
            series,
            version,
            kind: kind.map(VersionKind::from),
            logical_bytes,
            container_reads,
            bytes_read,
            bytes_decoded,
            read_amplification,
            speed_factor,
            chain_depth,
            cache,
            cache_auto,
            cache_bytes,
            peak_cache_bytes,
            reused_bytes,
            reuse_peak_bytes,
            seconds,
            warnings,
        }
    }
}
