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

    #[error("series {series} was moved to {to}: it takes no new version here")]
    SeriesMoved { series: String, to: String },

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

    /// The durable tier could not be read (a container evicted from the data directory
    /// whose remote copy is out of reach): try again when the remote is back.
    #[error("{0}")]
    RemoteUnavailable(String),

    #[error("operation cancelled")]
    Cancelled,

    /// A failure of the engine itself (a thread that panicked, an invariant
    /// a commit refused to break): never the caller's fault.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Declares [`ErrorKind`] from one list of `Kind => "code"`: the enum, its `ALL` and its codes
/// cannot disagree.
macro_rules! error_kinds {
    ($($(#[$doc:meta])* $kind:ident => $code:literal,)*) => {
        /// What kind of failure an [`Error`] is, one kind per machine-readable code.
        /// Callers that act on errors (the server's status for each, the CLI's JSON)
        /// match on the kind, so a new variant must pick a kind here and a new kind
        /// must be placed by each of them: neither can fall into a default.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorKind {
            $($(#[$doc])* $kind,)*
        }

        impl ErrorKind {
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind,)*];

            /// The stable machine-readable code, used by the CLI's `--json` output
            /// and the server's error bodies.
            pub fn code(self) -> &'static str {
                match self {
                    $(ErrorKind::$kind => $code,)*
                }
            }
        }
    };
}

error_kinds! {
    NotInitialised => "not_initialised",
    AlreadyInitialised => "already_initialised",
    NotEmpty => "not_empty",
    Locked => "locked",
    BadSeriesName => "bad_series_name",
    UnknownSeries => "unknown_series",
    UnknownVersion => "unknown_version",
    SeriesBusy => "series_busy",
    /// The series was moved to another worker; back it up there.
    SeriesMoved => "series_moved",
    UnitMismatch => "unit_mismatch",
    CorruptContainer => "corrupt_container",
    CorruptMetadata => "corrupt_metadata",
    MissingContainer => "missing_container",
    InvalidArgument => "invalid_argument",
    BadGzip => "bad_gzip",
    /// A file operation failed (not a full disk).
    Io => "io_error",
    /// The metadata store failed (not a full disk).
    Metadata => "metadata_error",
    /// A disk or quota was full (see [`Error::is_no_space`]).
    NoSpace => "no_space",
    /// A container's copy in the durable tier is out of reach for now.
    RemoteUnavailable => "remote_unavailable",
    Cancelled => "cancelled",
    /// A failure of the engine itself, never the caller's fault.
    Internal => "internal",
}

impl ErrorKind {
    /// True when the error is the caller's fault (bad name, unknown
    /// version, ...), as opposed to a storage fault or a busy store.
    pub fn is_user_error(self) -> bool {
        match self {
            ErrorKind::NotInitialised
            | ErrorKind::AlreadyInitialised
            | ErrorKind::NotEmpty
            | ErrorKind::BadSeriesName
            | ErrorKind::UnknownSeries
            | ErrorKind::UnknownVersion
            | ErrorKind::UnitMismatch
            | ErrorKind::InvalidArgument
            | ErrorKind::SeriesMoved
            | ErrorKind::BadGzip => true,
            ErrorKind::Locked
            | ErrorKind::SeriesBusy
            | ErrorKind::CorruptContainer
            | ErrorKind::CorruptMetadata
            | ErrorKind::MissingContainer
            | ErrorKind::Io
            | ErrorKind::Metadata
            | ErrorKind::NoSpace
            | ErrorKind::RemoteUnavailable
            | ErrorKind::Cancelled
            | ErrorKind::Internal => false,
        }
    }
}

impl Error {
    /// What kind of failure this is. A full disk is [`ErrorKind::NoSpace`]
    /// whichever write found it.
    pub fn kind(&self) -> ErrorKind {
        if self.is_no_space() {
            return ErrorKind::NoSpace;
        }
        match self {
            Error::NotInitialised(_) => ErrorKind::NotInitialised,
            Error::AlreadyInitialised(_) => ErrorKind::AlreadyInitialised,
            Error::NotEmpty { .. } => ErrorKind::NotEmpty,
            Error::Locked { .. } => ErrorKind::Locked,
            Error::BadSeriesName(_) => ErrorKind::BadSeriesName,
            Error::UnknownSeries(_) => ErrorKind::UnknownSeries,
            Error::UnknownVersion { .. } => ErrorKind::UnknownVersion,
            Error::SeriesBusy { .. } => ErrorKind::SeriesBusy,
            Error::SeriesMoved { .. } => ErrorKind::SeriesMoved,
            Error::UnitMismatch { .. } => ErrorKind::UnitMismatch,
            Error::CorruptContainer { .. } => ErrorKind::CorruptContainer,
            Error::CorruptMetadata { .. } => ErrorKind::CorruptMetadata,
            Error::MissingContainer { .. } => ErrorKind::MissingContainer,
            Error::Invalid(_) => ErrorKind::InvalidArgument,
            Error::BadGzip(_) => ErrorKind::BadGzip,
            Error::Io { .. } => ErrorKind::Io,
            Error::Db(_) => ErrorKind::Metadata,
            Error::RemoteUnavailable(_) => ErrorKind::RemoteUnavailable,
            Error::Cancelled => ErrorKind::Cancelled,
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// A stable machine-readable code: [`ErrorKind::code`] of its kind.
    pub fn code(&self) -> &'static str {
        self.kind().code()
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

    /// True when the error is the caller's fault (see
    /// [`ErrorKind::is_user_error`]).
    pub fn is_user_error(&self) -> bool {
        self.kind().is_user_error()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_code() {
        // ALL lists every kind in declaration order (the macro makes both from one list).
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        assert_eq!(ErrorKind::Internal as usize + 1, ErrorKind::ALL.len());
        let codes: std::collections::BTreeSet<_> =
            ErrorKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes.len(), ErrorKind::ALL.len(), "{codes:?}");
    }

    #[test]
    fn a_full_disk_is_its_own_kind() {
        let full = Error::Io {
            context: "writing container 1".into(),
            source: io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(full.kind(), ErrorKind::NoSpace);
        assert_eq!(full.code(), "no_space");
        let other = Error::Io {
            context: "reading container 1".into(),
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        assert_eq!(other.kind(), ErrorKind::Io);
        assert!(!other.is_user_error() && !full.is_user_error());
    }
}
