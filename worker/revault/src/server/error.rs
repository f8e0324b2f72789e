//! API errors: every failure is JSON `{"code": ..., "message": ...}` with the
//! status that says whose fault it is (4xx: the request; 5xx: storage).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use revault_engine::ErrorKind;
use revault_objects::ObjectError;

use super::wire::{ApiCode, ErrorBody};

/// Set on error responses so the request middleware can count errors by code.
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub ApiCode);

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ApiCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ApiCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: ApiCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: ApiCode, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, ApiCode::Forbidden, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ApiCode::Unauthorized, message)
    }

    /// 409: the store was recovered elsewhere (a newer generation owns its remote).
    pub fn fenced(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, ApiCode::RemoteFenced, message)
    }

    /// 503 while the store opens: worth waiting for (`revault push` does).
    pub fn starting() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiCode::Starting,
            "the store is still opening",
        )
    }

    /// 503 from a server on its way down: a client waits for its replacement (a worker pod's
    /// restart) as it waits for a store still opening, instead of failing at once.
    pub fn shutting_down(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiCode::ShuttingDown,
            message,
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiCode::Unavailable,
            message,
        )
    }

    /// 408: the request body came too slowly (see `limits::PacedBody`).
    pub fn body_timeout(t: &super::limits::BodyTimeout, what_happened: &str) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ApiCode::RequestTimeout,
            format!("{t}; {what_happened}"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ApiCode::Engine(ErrorKind::Internal),
            message,
        )
    }
}

/// The status for each kind of engine error: the caller's mistakes are 4xx,
/// a busy series or store and an `init` in the way of existing data 409, a
/// store not there to serve 503, a full disk 507, storage faults and the
/// engine's own failures 500. No default: a new kind must be placed here.
fn engine_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::UnknownSeries | ErrorKind::UnknownVersion => StatusCode::NOT_FOUND,
        ErrorKind::BadSeriesName
        | ErrorKind::InvalidArgument
        | ErrorKind::BadGzip
        | ErrorKind::UnitMismatch
        | ErrorKind::Cancelled => StatusCode::BAD_REQUEST,
        ErrorKind::SeriesBusy
        | ErrorKind::SeriesMoved
        | ErrorKind::Locked
        | ErrorKind::AlreadyInitialised
        | ErrorKind::NotEmpty => StatusCode::CONFLICT,
        // The worker has no store to serve from (it is not a fault of the request, and it
        // passes once the store is initialised).
        ErrorKind::NotInitialised => StatusCode::SERVICE_UNAVAILABLE,
        // An evicted container's remote copy is out of reach: retry when it is back.
        ErrorKind::RemoteUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        ErrorKind::CorruptContainer
        | ErrorKind::CorruptMetadata
        | ErrorKind::MissingContainer
        | ErrorKind::Io
        | ErrorKind::Metadata
        | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// An engine error as it is: its status, code and message.
    pub fn from_engine(e: &revault_engine::Error) -> Self {
        let kind = e.kind();
        let message = match kind {
            ErrorKind::NoSpace => no_space_message(e),
            _ => e.to_string(),
        };
        ApiError::new(engine_status(kind), ApiCode::from(kind), message)
    }
}

/// A full disk: which one, and what became of the request. Engine writes
/// commit atomically (a backup, one slide, one gc step): a full data
/// directory stops the step before its commit, so nothing was committed. A
/// full metadata disk may fail the commit's own write, which a failed sync
/// can still leave in the log, to land when the store is reopened.
fn no_space_message(e: &revault_engine::Error) -> String {
    match e {
        revault_engine::Error::Db(_) => format!(
            "the metadata's disk is full ({e}); the step that failed did not complete, though if it was a commit it may still land when the store recovers (list the versions before retrying); nothing committed before is lost"
        ),
        _ => format!(
            "the data directory's disk is full ({e}); nothing was committed by the step that failed and nothing committed before is lost: retry once space is freed"
        ),
    }
}

/// Backups: a cancelled run says why the body is gone.
impl From<revault_engine::Error> for ApiError {
    fn from(e: revault_engine::Error) -> Self {
        let mut err = ApiError::from_engine(&e);
        if err.code == ApiCode::Engine(ErrorKind::Cancelled) {
            err.message = "the request body ended before it was complete (or the backup was cancelled); no version was created".to_string();
        }
        err
    }
}

impl From<ObjectError> for ApiError {
    fn from(e: ObjectError) -> Self {
        let (status, code) = match &e {
            ObjectError::NotFound { .. } => (StatusCode::NOT_FOUND, ApiCode::UnknownObject),
            ObjectError::NoBucket(_) => (StatusCode::NOT_FOUND, ApiCode::UnknownBucket),
            ObjectError::NotABucket(_) => (StatusCode::CONFLICT, ApiCode::NotABucket),
            ObjectError::BadKey { .. } => (StatusCode::BAD_REQUEST, ApiCode::BadKey),
            ObjectError::BadGzip(_) => {
                (StatusCode::BAD_REQUEST, ApiCode::Engine(ErrorKind::BadGzip))
            }
            ObjectError::Engine(inner) => return ApiError::from_engine(inner),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code;
        let body = ErrorBody {
            code,
            message: self.message,
        };
        let mut r = (self.status, Json(body)).into_response();
        r.extensions_mut().insert(ErrorCode(code));
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io;
    use std::path::PathBuf;

    use revault_engine::Error;

    use super::*;

    /// The variant's name; a variant this does not list fails to compile,
    /// so the table below cannot miss one.
    fn variant(e: &Error) -> &'static str {
        match e {
            Error::NotInitialised(_) => "NotInitialised",
            Error::AlreadyInitialised(_) => "AlreadyInitialised",
            Error::NotEmpty { .. } => "NotEmpty",
            Error::Locked { .. } => "Locked",
            Error::BadSeriesName(_) => "BadSeriesName",
            Error::UnknownSeries(_) => "UnknownSeries",
            Error::UnknownVersion { .. } => "UnknownVersion",
            Error::SeriesBusy { .. } => "SeriesBusy",
            Error::SeriesMoved { .. } => "SeriesMoved",
            Error::UnitMismatch { .. } => "UnitMismatch",
            Error::CorruptContainer { .. } => "CorruptContainer",
            Error::CorruptMetadata { .. } => "CorruptMetadata",
            Error::MissingContainer { .. } => "MissingContainer",
            Error::Invalid(_) => "Invalid",
            Error::BadGzip(_) => "BadGzip",
            Error::Io { .. } => "Io",
            Error::Db(_) => "Db",
            Error::RemoteUnavailable(_) => "RemoteUnavailable",
            Error::Cancelled => "Cancelled",
            Error::Internal(_) => "Internal",
        }
    }

    const VARIANTS: usize = 20;

    fn io(context: &str, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A real RocksDB error: opening a database below a file.
    fn db_error() -> rocksdb::Error {
        let f = tempfile::NamedTempFile::new().unwrap();
        rocksdb::DB::open_default(f.path().join("db")).unwrap_err()
    }

    /// Every engine error (and each way an I/O error can be a full disk),
    /// with the status and code the server answers it with.
    fn table() -> Vec<(Error, u16, &'static str)> {
        let s = || "default/db".to_string();
        let p = || PathBuf::from("/store");
        vec![
            (Error::NotInitialised(p()), 503, "not_initialised"),
            (Error::AlreadyInitialised(p()), 409, "already_initialised"),
            (
                Error::NotEmpty {
                    path: p(),
                    found: "files".into(),
                },
                409,
                "not_empty",
            ),
            (
                Error::Locked {
                    path: p(),
                    holder: "pid 1".into(),
                },
                409,
                "locked",
            ),
            (Error::BadSeriesName("X".into()), 400, "bad_series_name"),
            (Error::UnknownSeries(s()), 404, "unknown_series"),
            (
                Error::UnknownVersion {
                    series: s(),
                    version: "7".into(),
                    latest: Some(5),
                },
                404,
                "unknown_version",
            ),
            (Error::SeriesBusy { series: s() }, 409, "series_busy"),
            (
                Error::SeriesMoved {
                    series: s(),
                    to: "https://w2:8420".into(),
                },
                409,
                "series_moved",
            ),
            (
                Error::UnitMismatch {
                    series: s(),
                    existing: "segment".into(),
                    requested: "chunk".into(),
                },
                400,
                "unit_mismatch",
            ),
            (
                Error::CorruptContainer {
                    container: "c1".into(),
                    detail: "bad checksum".into(),
                },
                500,
                "corrupt_container",
            ),
            (
                Error::CorruptMetadata {
                    what: "unit 1".into(),
                    detail: "short".into(),
                },
                500,
                "corrupt_metadata",
            ),
            (
                Error::MissingContainer {
                    container: "c1".into(),
                    path: p(),
                },
                500,
                "missing_container",
            ),
            (Error::Invalid("x".into()), 400, "invalid_argument"),
            (Error::BadGzip("x".into()), 400, "bad_gzip"),
            (
                io("reading", io::Error::from_raw_os_error(libc::ENOENT)),
                500,
                "io_error",
            ),
            (
                io("writing", io::Error::from_raw_os_error(libc::ENOSPC)),
                507,
                "no_space",
            ),
            (
                io("writing", io::Error::from_raw_os_error(libc::EDQUOT)),
                507,
                "no_space",
            ),
            (
                io("writing", io::Error::from(io::ErrorKind::StorageFull)),
                507,
                "no_space",
            ),
            (Error::Db(db_error()), 500, "metadata_error"),
            (
                Error::RemoteUnavailable("reading container 1 from the remote: refused".into()),
                503,
                "remote_unavailable",
            ),
            (Error::Cancelled, 400, "cancelled"),
            (Error::Internal("x".into()), 500, "internal"),
        ]
    }

    #[test]
    fn every_engine_error_keeps_its_status_and_code() {
        let covered: BTreeSet<_> = table().iter().map(|(e, ..)| variant(e)).collect();
        assert_eq!(
            covered.len(),
            VARIANTS,
            "the table misses a variant: {covered:?}"
        );
        // The status follows the kind: a kind added to the engine needs a row here too
        // (`VARIANTS` is kept by hand, `ErrorKind::ALL` is not).
        let kinds: BTreeSet<_> = table().iter().map(|(e, ..)| e.kind().code()).collect();
        let all: BTreeSet<_> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(kinds, all, "the table misses a kind");
        // Three copies: an engine error is not Clone.
        let answers = table().into_iter().zip(table()).zip(table());
        for (((e, status, code), (e2, ..)), (e3, ..)) in answers {
            let want = (status, code.to_string());
            let msg = e.to_string();
            let a = ApiError::from_engine(&e);
            assert_eq!((a.status.as_u16(), a.code.to_string()), want, "{e:?}");
            if code == "no_space" {
                assert!(a.message.contains("disk is full"), "{}", a.message);
                assert!(a.message.contains(&msg), "{}", a.message);
            } else {
                assert_eq!(a.message, msg);
            }
            // Through `?` (a cancelled backup says what became of it) and
            // wrapped in an object error: the same status and code.
            let b = ApiError::from(e2);
            assert_eq!((b.status.as_u16(), b.code.to_string()), want, "{msg}");
            if code == "cancelled" {
                assert!(
                    b.message.contains("no version was created"),
                    "{}",
                    b.message
                );
            } else {
                assert_eq!(b.message, a.message);
            }
            let c = ApiError::from(ObjectError::Engine(e3));
            assert_eq!((c.status.as_u16(), c.code.to_string()), want, "{msg}");
            assert_eq!(c.message, a.message);
        }
    }

    #[test]
    fn object_errors_keep_their_status_and_code() {
        let (b, k) = (|| "velero/bsl".to_string(), || "k".to_string());
        for (e, status, code) in [
            (
                ObjectError::NotFound {
                    bucket: b(),
                    key: k(),
                },
                404,
                "unknown_object",
            ),
            (ObjectError::NoBucket(b()), 404, "unknown_bucket"),
            (ObjectError::NotABucket(b()), 409, "not_a_bucket"),
            (
                ObjectError::BadKey {
                    key: k(),
                    why: "empty".into(),
                },
                400,
                "bad_key",
            ),
            (ObjectError::BadGzip("truncated".into()), 400, "bad_gzip"),
        ] {
            let msg = e.to_string();
            let a = ApiError::from(e);
            let got = (a.status.as_u16(), a.code.to_string(), a.message);
            assert_eq!(got, (status, code.to_string(), msg));
        }
    }
}
