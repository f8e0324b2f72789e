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

    /// `init` over a directory that holds store content without a marker:
    /// initialising would reset the metadata of the backups it holds.
    #[error("{path} holds {found} but no revault.store marker; refusing to initialise over it (that would reset the metadata of the backups it holds). If this is a store whose marker file was lost, write the marker back (docs/format.md, \"Store directory\"); to start afresh, empty the directory first", path = .path.display())]
    NotEmpty { path: PathBuf, found: String },

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

    /// A failure of the engine itself (a thread that panicked, an invariant
    /// a commit refused to break): never the caller's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// A stable machine-readable code, used by the CLI's `--json` output and the
    /// server's error bodies.
    pub fn code(&self) -> &'static str {
        if self.is_no_space() {
            return "no_space";
        }
        match self {
            Error::NotInitialised(_) => "not_initialised",
            Error::AlreadyInitialised(_) => "already_initialised",
            Error::NotEmpty { .. } => "not_empty",
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
            Error::Internal(_) => "internal",
        }
    }

    /// True when a disk (or quota) was full: the data directory's for a
    /// container, the metadata's for RocksDB. The step that failed did not
    /// complete (a commit whose own metadata write failed may still land when
    /// the store is reopened).
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::Io { source, .. } => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                ) || source.kind() == io::ErrorKind::StorageFull
            }
            // RocksDB reports errno as text ("IO error: No space left on
            // device: ..."), also when an earlier failure put it in read-only
            // mode ("... Background error ... No space left on device").
            Error::Db(e) => {
                let m = e.to_string();
                m.contains("No space left on device") || m.contains("Disk quota exceeded")
            }
            _ => false,
        }
    }

    /// True when the error is the caller's fault (bad name, unknown version, ...),
    /// as opposed to a storage fault.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::NotInitialised(_)
                | Error::AlreadyInitialised(_)
                | Error::NotEmpty { .. }
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

/// The error for an engine thread that panicked, with the panic's message:
/// an internal failure, reported as such (a 5xx for the server).
pub fn panicked(thread: &str, payload: Box<dyn std::any::Any + Send>) -> Error {
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    Error::Internal(format!("the {thread} thread panicked: {msg}"))
}

pub(crate) fn corrupt_meta(what: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::CorruptMetadata {
        what: what.into(),
        detail: detail.into(),
    }
}
