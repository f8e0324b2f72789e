//! Series, their versions and retention, and the requests that act on
//! them (`/v1/series/...`, `/v1/gc`).

use serde::{Deserialize, Serialize};

use revault_engine::{Retention as EngineRetention, SeriesRecord, VersionRecord};

use super::{DedupUnit, RecipeForm, VersionKind};
use crate::cli::format_time;

/// A series' retention: `PUT …/retention` takes it and answers it.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retention {
    #[serde(default)]
    pub keep: Option<u32>,
    #[serde(default)]
    pub keep_within_seconds: Option<u64>,
    /// Calendar thinning (restic's `--keep-hourly` … `--keep-yearly`): the newest version
    /// of each of the last N hours, days, ISO weeks, months, years that have one.
    #[serde(default)]
    pub keep_hourly: Option<u32>,
    #[serde(default)]
    pub keep_daily: Option<u32>,
    #[serde(default)]
    pub keep_weekly: Option<u32>,
    #[serde(default)]
    pub keep_monthly: Option<u32>,
    #[serde(default)]
    pub keep_yearly: Option<u32>,
    /// The IANA time zone those periods are counted in (none: UTC).
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(default = "one")]
    pub live: u32,
    /// Omitted in a request: the series' current setting (automatic for a new series).
    #[serde(default)]
    pub auto: Option<bool>,
}

fn one() -> u32 {
    1
}

impl From<&EngineRetention> for Retention {
    fn from(r: &EngineRetention) -> Self {
        let c = &r.calendar;
        Retention {
            keep: r.keep,
            keep_within_seconds: r.keep_within_secs,
            keep_hourly: c.hourly,
            keep_daily: c.daily,
            keep_weekly: c.weekly,
            keep_monthly: c.monthly,
            keep_yearly: c.yearly,
            timezone: c.timezone.clone(),
            live: r.live,
            auto: Some(r.auto),
        }
    }
}

impl Retention {
    /// The engine's retention, with `auto` resolved (see `revault_engine::auto_or_current`).
    pub fn to_engine(&self, auto: bool) -> EngineRetention {
        EngineRetention {
            keep: self.keep,
            keep_within_secs: self.keep_within_seconds,
            calendar: revault_engine::Calendar {
                hourly: self.keep_hourly,
                daily: self.keep_daily,
                weekly: self.keep_weekly,
                monthly: self.keep_monthly,
                yearly: self.keep_yearly,
                timezone: self.timezone.clone(),
            },
            live: self.live,
            auto,
        }
    }
}

/// A series as listed (`GET /v1/series`).
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Series {
    pub series: String,
    pub unit: DedupUnit,
    pub versions: usize,
    pub latest: Option<u32>,
    pub latest_time: Option<String>,
    pub logical_bytes: u64,
    pub retention: Retention,
    /// The newest version the store's remote (its S3 bucket) holds: a store rebuilt from
    /// the bucket has every version up to it. `null` without a remote, or before the first
    /// upload of the series.
    pub durable_version: Option<u32>,
    /// The address the series was moved to; it takes no new version here. `null` normally.
    pub moved_to: Option<String>,
}

impl Series {
    /// The series `s` whose versions are `vs` (oldest first); `durable` is the newest the
    /// remote holds.
    pub fn new(s: &SeriesRecord, vs: &[VersionRecord], durable: Option<u32>) -> Self {
        Series {
            series: s.name.clone(),
            unit: s.unit.into(),
            versions: vs.len(),
            latest: vs.last().map(|v| v.number),
            latest_time: vs.last().map(|v| format_time(v.time_unix)),
            logical_bytes: vs.iter().map(|v| v.logical_bytes).sum(),
            retention: Retention::from(&s.retention),
            durable_version: durable,
            moved_to: s.moved_to.clone(),
        }
    }
}

/// One series with its versions (`GET /v1/series/{ns}/{name}`).
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct SeriesDetail {
    #[serde(flatten)]
    pub series: Series,
    pub version_list: Vec<Version>,
    /// The versions the series' retention no longer keeps, oldest first:
    /// what the next expiry by retention removes (the engine's plan, so
    /// clients need not repeat its rules).
    pub pending_expiry: Vec<u32>,
}

impl SeriesDetail {
    /// The series `s` whose versions are `vs` (oldest first).
    pub fn new(s: &SeriesRecord, vs: &[VersionRecord], durable: Option<u32>) -> Self {
        // Reading a series never fails on its plan: a retention this build cannot evaluate
        // (a time zone it does not know) plans nothing, and its expiry says why.
        let pending_expiry = revault_engine::plan_expiry(vs, &s.retention).unwrap_or_else(|e| {
            tracing::warn!(series = %s.name, error = %e, "cannot plan the retention");
            Vec::new()
        });
        SeriesDetail {
            series: Series::new(s, vs, durable),
            version_list: vs.iter().map(Version::from).collect(),
            pending_expiry,
        }
    }
}

/// A version as listed.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub number: u32,
    pub time: String,
    pub kind: VersionKind,
    pub form: RecipeForm,
    pub logical_bytes: u64,
    /// Unique data the backup added (uncompressed).
    pub new_bytes: u64,
    /// Container bytes the backup wrote (compressed).
    pub stored_bytes: u64,
    pub chunks: u64,
}

impl From<&VersionRecord> for Version {
    fn from(v: &VersionRecord) -> Self {
        Version {
            number: v.number,
            time: format_time(v.time_unix),
            kind: v.kind.into(),
            form: v.form.into(),
            logical_bytes: v.logical_bytes,
            new_bytes: v.new_vbytes,
            stored_bytes: v.new_container_bytes,
            chunks: v.chunks,
        }
    }
}

/// The backup of a series in progress on this worker, if any
/// (`GET …/backup`): how far it got.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct BackupProgress {
    pub series: String,
    pub running: bool,
    /// Waiting for a backup slot (`--max-backups`): nothing read yet.
    pub queued: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logical_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

// ---- requests ---------------------------------------------------------------------

/// `GET /v1/series?namespace=`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct SeriesListQuery {
    pub namespace: Option<String>,
}

/// `POST …/expire`: exactly one of the three (the handler checks).
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpireRequest {
    pub version: Option<u32>,
    pub before: Option<String>,
    pub apply_retention: Option<bool>,
}

/// `POST /v1/gc` (an empty body is all defaults).
#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GcRequest {
    #[serde(default)]
    pub full: bool,
    #[serde(default)]
    pub compact_below: Option<f64>,
}

/// `PUT …/versions?unit=&time=`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct PutVersionQuery {
    pub unit: Option<String>,
    pub time: Option<String>,
    /// The new version's number (`revault move` keeps a series' numbers); default the next.
    pub version: Option<u32>,
}

/// `PUT …/moved-to`: where the series went (`null`: it takes versions here again).
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MovedTo {
    pub moved_to: Option<String>,
}

/// `GET …/versions/{version}?cache=&cacheMib=`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetVersionQuery {
    pub cache: Option<String>,
    /// `cache_mib` is what restore Jobs of the previous release send; a
    /// worker upgraded before the operator's Jobs still serves them.
    #[serde(alias = "cache_mib")]
    pub cache_mib: Option<u64>,
}
