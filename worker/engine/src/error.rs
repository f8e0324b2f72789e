//! Errors the engine reports. Every message is written for the person running the
//! command: it names the store, series, version or container involved.

use std::io;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: not a Revault store (run `revault init --store {path}` first)", path = .0.display())]
    NotInitialised(PathBuf),

    #[error("{path}: a Revault store already exists here", path = .0.display())]
    AlreadyInitialised(PathBuf),

    #[error("store {path} is locked by {holder}; try again when it has finished", path = .path.display())]
    Locked { path: PathBuf, holder: String },

    #[error("invalid series name {0:?}: expected NAMESPACE/NAME, lowercase letters, digits, '-' and '.'")]
    BadSeriesName(String),

    #[error("no series {0} in this store")]
    UnknownSeries(String),

    #[error("series {series} has no version {version} ({latest})", latest = match .latest {
        Some(l) => format!("latest is {l}"),
        None => "it has no versions".to_string(),
    })]
    UnknownVersion {
        series: String,
        version: String,
        latest: Option<u32>,
    },

    #[error("series {series} already has a backup in progress")]
    SeriesBusy { series: String },

    #[error("series {series} uses unit {existing}; a backup asked for {requested} (a series keeps one dedup unit)")]
    UnitMismatch {
        series: String,
        existing: String,
        requested: String,
    },

    #[error("corrupt container {container}: {detail}")]
    CorruptContainer { container: String, detail: String },

    #[error("corrupt metadata for {what}: {detail}")]
    CorruptMetadata { what: String, detail: String },

    #[error("container {container} is missing from the data directory ({path})", path = .path.display())]
    MissingContainer { container: String, path: PathBuf },

    #[error("invalid argument: {0}")]
    Invalid(String),

    /// A gzip-encoded input that does not decode (corrupt or truncated).
    #[error("the upload is not a valid gzip stream: {0}")]
    BadGzip(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    #[error("metadata store: {0}")]
    Db(#[from] rocksdb::Error),

    #[error("operation cancelled")]
    Cancelled,
}

impl Error {
    /// A stable machine-readable code, used by the CLI's `--json` output and the
    /// server's error bodies.
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotInitialised(_) => "not_initialised",
            Error::AlreadyInitialised(_) => "already_initialised",
            Error::Locked { .. } => "locked",
            Error::BadSeriesName(_) => "bad_series_name",
            Error::UnknownSeries(_) => "unknown_series",
            Error::UnknownVersion { .. } => "unknown_version",
            Error::SeriesBusy { .. } => "series_busy",
            Error::UnitMismatch { .. } => "unit_mismatch",
            Error::CorruptContainer { .. } => "corrupt_container",
            Error::CorruptMetadata { .. } => "corrupt_metadata",
            Error::MissingContainer { .. } => "missing_container",
            Error::Invalid(_) => "invalid_argument",
            Error::BadGzip(_) => "bad_gzip",
            Error::Io { .. } => "io_error",
            Error::Db(_) => "metadata_error",
            Error::Cancelled => "cancelled",
        }
    }

    /// True when the error is the caller's fault (bad name, unknown version, ...),
    /// as opposed to a storage fault.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::NotInitialised(_)
                | Error::AlreadyInitialised(_)
                | Error::BadSeriesName(_)
                | Error::UnknownSeries(_)
                | Error::UnknownVersion { .. }
                | Error::UnitMismatch { .. }
                | Error::Invalid(_)
                | Error::BadGzip(_)
        )
    }
}

/// Attach context to an `io::Error`: `file.read(..).ctx(|| format!("reading {p}"))`.
pub trait IoContext<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: f(),
            source,
        })
    }
}

pub(crate) fn corrupt_meta(what: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::CorruptMetadata {
        what: what.into(),
        detail: detail.into(),
    }
}
