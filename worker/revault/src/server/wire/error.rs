//! Error codes and the error body.

use serde::{Serialize, Serializer};

use revault_engine::ErrorKind;

/// Declares [`ApiCode`] from one list of `Variant => "code"`, so the enum, its string and the
/// test list `ALL` cannot disagree (a code added at the end of a hand-kept `ALL` went unchecked).
macro_rules! api_codes {
    ($($variant:ident => $code:literal,)*) => {
        /// Every `code` an error body can carry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ApiCode {
            $($variant,)*
        }

        impl ApiCode {
            /// Every code, in declaration order.
            #[cfg(test)]
            pub const ALL: &'static [ApiCode] = &[$(ApiCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ApiCode::$variant => $code,)*
                }
            }
        }
    };
}

api_codes! {
    // The engine's (one per [`ErrorKind`]).
    NotInitialised => "not_initialised",
    AlreadyInitialised => "already_initialised",
    NotEmpty => "not_empty",
    Locked => "locked",
    BadSeriesName => "bad_series_name",
    UnknownSeries => "unknown_series",
    UnknownVersion => "unknown_version",
    SeriesBusy => "series_busy",
    UnitMismatch => "unit_mismatch",
    CorruptContainer => "corrupt_container",
    CorruptMetadata => "corrupt_metadata",
    MissingContainer => "missing_container",
    InvalidArgument => "invalid_argument",
    BadGzip => "bad_gzip",
    IoError => "io_error",
    MetadataError => "metadata_error",
    NoSpace => "no_space",
    Cancelled => "cancelled",
    Internal => "internal",
    // The object layer's.
    UnknownObject => "unknown_object",
    UnknownBucket => "unknown_bucket",
    NotABucket => "not_a_bucket",
    BadKey => "bad_key",
    BadBucketName => "bad_bucket_name",
    // The server's own: requests it cannot take.
    NotFound => "not_found",
    MethodNotAllowed => "method_not_allowed",
    BadPath => "bad_path",
    BadQuery => "bad_query",
    BadJson => "bad_json",
    BadBody => "bad_body",
    BadContentType => "bad_content_type",
    UnsupportedMediaType => "unsupported_media_type",
    BucketSeries => "bucket_series",
    UnknownRestore => "unknown_restore",
    Unauthorized => "unauthorized",
    Forbidden => "forbidden",
    Unavailable => "unavailable",
    RequestTimeout => "request_timeout",
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
        for &k in ErrorKind::ALL {
            assert_eq!(ApiCode::from(k).as_str(), k.code(), "{k:?}");
        }
    }
}
