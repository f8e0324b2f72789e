//! Error codes and the error body.

use serde::{Serialize, Serializer};

use revault_engine::error::ErrorKind;

/// Every `code` an error body can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApiCode {
    // The engine's (one per [`ErrorKind`]).
    NotInitialised,
    AlreadyInitialised,
    NotEmpty,
    Locked,
    BadSeriesName,
    UnknownSeries,
    UnknownVersion,
    SeriesBusy,
    UnitMismatch,
    CorruptContainer,
    CorruptMetadata,
    MissingContainer,
    InvalidArgument,
    BadGzip,
    IoError,
    MetadataError,
    NoSpace,
    Cancelled,
    Internal,
    // The object layer's.
    UnknownObject,
    UnknownBucket,
    NotABucket,
    BadKey,
    // The server's own: requests it cannot take.
    NotFound,
    MethodNotAllowed,
    BadPath,
    BadQuery,
    BadJson,
    BadBody,
    BadContentType,
    UnsupportedMediaType,
    BucketSeries,
    UnknownRestore,
    Unauthorized,
    Forbidden,
    Unavailable,
    RequestTimeout,
}

impl ApiCode {
    /// Every code, in declaration order.
    #[cfg(test)]
    pub const ALL: [ApiCode; 37] = [
        ApiCode::NotInitialised,
        ApiCode::AlreadyInitialised,
        ApiCode::NotEmpty,
        ApiCode::Locked,
        ApiCode::BadSeriesName,
        ApiCode::UnknownSeries,
        ApiCode::UnknownVersion,
        ApiCode::SeriesBusy,
        ApiCode::UnitMismatch,
        ApiCode::CorruptContainer,
        ApiCode::CorruptMetadata,
        ApiCode::MissingContainer,
        ApiCode::InvalidArgument,
        ApiCode::BadGzip,
        ApiCode::IoError,
        ApiCode::MetadataError,
        ApiCode::NoSpace,
        ApiCode::Cancelled,
        ApiCode::Internal,
        ApiCode::UnknownObject,
        ApiCode::UnknownBucket,
        ApiCode::NotABucket,
        ApiCode::BadKey,
        ApiCode::NotFound,
        ApiCode::MethodNotAllowed,
        ApiCode::BadPath,
        ApiCode::BadQuery,
        ApiCode::BadJson,
        ApiCode::BadBody,
        ApiCode::BadContentType,
        ApiCode::UnsupportedMediaType,
        ApiCode::BucketSeries,
        ApiCode::UnknownRestore,
        ApiCode::Unauthorized,
        ApiCode::Forbidden,
        ApiCode::Unavailable,
        ApiCode::RequestTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiCode::NotInitialised => "not_initialised",
            ApiCode::AlreadyInitialised => "already_initialised",
            ApiCode::NotEmpty => "not_empty",
            ApiCode::Locked => "locked",
            ApiCode::BadSeriesName => "bad_series_name",
            ApiCode::UnknownSeries => "unknown_series",
            ApiCode::UnknownVersion => "unknown_version",
            ApiCode::SeriesBusy => "series_busy",
            ApiCode::UnitMismatch => "unit_mismatch",
            ApiCode::CorruptContainer => "corrupt_container",
            ApiCode::CorruptMetadata => "corrupt_metadata",
            ApiCode::MissingContainer => "missing_container",
            ApiCode::InvalidArgument => "invalid_argument",
            ApiCode::BadGzip => "bad_gzip",
            ApiCode::IoError => "io_error",
            ApiCode::MetadataError => "metadata_error",
            ApiCode::NoSpace => "no_space",
            ApiCode::Cancelled => "cancelled",
            ApiCode::Internal => "internal",
            ApiCode::UnknownObject => "unknown_object",
            ApiCode::UnknownBucket => "unknown_bucket",
            ApiCode::NotABucket => "not_a_bucket",
            ApiCode::BadKey => "bad_key",
            ApiCode::NotFound => "not_found",
            ApiCode::MethodNotAllowed => "method_not_allowed",
            ApiCode::BadPath => "bad_path",
            ApiCode::BadQuery => "bad_query",
            ApiCode::BadJson => "bad_json",
            ApiCode::BadBody => "bad_body",
            ApiCode::BadContentType => "bad_content_type",
            ApiCode::UnsupportedMediaType => "unsupported_media_type",
            ApiCode::BucketSeries => "bucket_series",
            ApiCode::UnknownRestore => "unknown_restore",
            ApiCode::Unauthorized => "unauthorized",
            ApiCode::Forbidden => "forbidden",
            ApiCode::Unavailable => "unavailable",
            ApiCode::RequestTimeout => "request_timeout",
        }
    }
}

impl From<ErrorKind> for ApiCode {
    fn from(k: ErrorKind) -> Self {
        match k {
            ErrorKind::NotInitialised => ApiCode::NotInitialised,
            ErrorKind::AlreadyInitialised => ApiCode::AlreadyInitialised,
            ErrorKind::NotEmpty => ApiCode::NotEmpty,
            ErrorKind::Locked => ApiCode::Locked,
            ErrorKind::BadSeriesName => ApiCode::BadSeriesName,
            ErrorKind::UnknownSeries => ApiCode::UnknownSeries,
            ErrorKind::UnknownVersion => ApiCode::UnknownVersion,
            ErrorKind::SeriesBusy => ApiCode::SeriesBusy,
            ErrorKind::UnitMismatch => ApiCode::UnitMismatch,
            ErrorKind::CorruptContainer => ApiCode::CorruptContainer,
            ErrorKind::CorruptMetadata => ApiCode::CorruptMetadata,
            ErrorKind::MissingContainer => ApiCode::MissingContainer,
            ErrorKind::InvalidArgument => ApiCode::InvalidArgument,
            ErrorKind::BadGzip => ApiCode::BadGzip,
            ErrorKind::Io => ApiCode::IoError,
            ErrorKind::Metadata => ApiCode::MetadataError,
            ErrorKind::NoSpace => ApiCode::NoSpace,
            ErrorKind::Cancelled => ApiCode::Cancelled,
            ErrorKind::Internal => ApiCode::Internal,
        }
    }
}

impl std::fmt::Display for ApiCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ApiCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The body of every error response (and a failed restore's `error`).
#[derive(Serialize, Clone, Debug)]
pub struct ErrorBody {
    pub code: ApiCode,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_the_engine_ones_unchanged() {
        for (i, c) in ApiCode::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "ALL is out of order at {c:?}");
        }
        assert_eq!(ApiCode::RequestTimeout as usize + 1, ApiCode::ALL.len());
        let codes: std::collections::BTreeSet<_> =
            ApiCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes.len(), ApiCode::ALL.len());
        // An engine error keeps the code the engine gives it (the CLI's).
        for k in ErrorKind::ALL {
            assert_eq!(ApiCode::from(k).as_str(), k.code(), "{k:?}");
        }
    }
}
