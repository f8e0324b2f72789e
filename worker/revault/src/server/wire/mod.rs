//! The wire contract: every JSON body the server reads or writes, the query
//! strings it parses, and the error codes it answers with. Handlers build
//! these types and nothing else: no engine struct is serialised on the wire,
//! so a change inside the engine cannot change what clients parse. The
//! engine's reports keep their own `Serialize` (the offline CLI's `--json`).
//!
//! `worker/api/openapi.yaml` describes the same bodies under the same names
//! (`Stats`, `GcReport`, `Series`, ...); `schema_tests` compares the two.
//!
//! One casing: every key and query parameter is camelCase (as Kubernetes
//! APIs are); `schema_tests` checks the bodies and the spec. A figure two
//! bodies carry has one name in both (`newBytes`, `storedBytes`), and every
//! time is an RFC 3339 string (`format_time`), never unix seconds. The
//! offline CLI's `--json` keeps the engine's own (snake_case) serialisation.

mod error;
mod objects;
mod reports;
#[cfg(test)]
mod schema_tests;
mod series;

use serde::Serialize;

use revault_engine::{
    DedupUnit as EngineUnit, RecipeForm as EngineForm, VersionKind as EngineKind,
};

pub use error::{ApiCode, ErrorBody};
pub use objects::{
    Bucket, GetObjectQuery, KeyQuery, Object, ObjectDeleted, ObjectList, ObjectListQuery,
    PutObjectQuery, SignRequest, SignedQuery, SignedUrl, StoredObject,
};
pub use reports::{
    BackupReport, DiskSpace, ExpireReport, GcReport, ReadyCheck, ReadyQuery, RemoteStats,
    RestoreReport, SlideReport, Stats,
};
pub use series::{
    BackupProgress, ExpireRequest, GcRequest, GetVersionQuery, MovedTo, PutVersionQuery, Retention,
    Series, SeriesDetail, SeriesListQuery, Version,
};

/// What a version holds (`X-Revault-Kind` too).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VersionKind {
    Stream,
    Tree,
}

impl VersionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionKind::Stream => "stream",
            VersionKind::Tree => "tree",
        }
    }
}

impl From<EngineKind> for VersionKind {
    fn from(k: EngineKind) -> Self {
        match k {
            EngineKind::Stream => VersionKind::Stream,
            EngineKind::Tree => VersionKind::Tree,
        }
    }
}

/// A series' dedup unit.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DedupUnit {
    Segment,
    Chunk,
}

impl From<EngineUnit> for DedupUnit {
    fn from(u: EngineUnit) -> Self {
        match u {
            EngineUnit::Segment => DedupUnit::Segment,
            EngineUnit::Chunk => DedupUnit::Chunk,
        }
    }
}

/// How a version's recipe is kept: live (whole units) or archival (slid).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RecipeForm {
    Live,
    Archival,
}

impl From<EngineForm> for RecipeForm {
    fn from(f: EngineForm) -> Self {
        match f {
            EngineForm::Live => RecipeForm::Live,
            EngineForm::Archival => RecipeForm::Archival,
        }
    }
}
