//! Error codes and the error body.

use serde::{Serialize, Serializer};

use revault_engine::ErrorKind;

/// Declares [`ApiCode`] from one list of `Variant => "code"` for the codes the server adds to
/// the engine's, so the enum, its strings and the test list `all()` cannot disagree. The engine's
/// codes are not repeated: [`ApiCode::Engine`] carries the kind and its code.
macro_rules! api_codes {
    ($($variant:ident => $code:literal,)*) => {
        /// Every `code` an error body can carry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ApiCode {
            /// An engine failure, with the engine's own code (the CLI's `--json` carries it too).
            Engine(ErrorKind),
            $($variant,)*
        }

        impl ApiCode {
            /// Every code: the engine's kinds, then the server's, in declaration order.
            #[cfg(test)]
            pub fn all() -> Vec<ApiCode> {
                let engine = ErrorKind::ALL.iter().map(|&k| ApiCode::Engine(k));
                engine.chain([$(ApiCode::$variant,)*]).collect()
            }

            pub fn as_str(self) -> &'static str {
                match self {
                    ApiCode::Engine(kind) => kind.code(),
                    $(ApiCode::$variant => $code,)*
                }
            }
        }
    };
}

api_codes! {
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
    QuotaExceeded => "quota_exceeded",
    Unavailable => "unavailable",
    Starting => "starting",
    ShuttingDown => "shutting_down",
    RequestTimeout => "request_timeout",
    // The durable tier's.
    RemoteFenced => "remote_fenced",
}

impl From<ErrorKind> for ApiCode {
    fn from(k: ErrorKind) -> Self {
        ApiCode::Engine(k)
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
    fn codes_are_distinct() {
        // A server code may not reuse an engine code (or another server code): a client could
        // not tell the two failures apart.
        let all = ApiCode::all();
        let codes: std::collections::BTreeSet<_> = all.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes.len(), all.len(), "two codes share a string");
    }
}
