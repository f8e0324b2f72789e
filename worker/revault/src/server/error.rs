//! API errors: every failure is JSON `{"code": ..., "message": ...}` with the
//! status that says whose fault it is (4xx: the request; 5xx: storage).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Set on error responses so the request middleware can count errors by code.
#[derive(Clone, Debug)]
pub struct ErrorCode(pub String);

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
        }
    }

    pub fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(code: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// 408: the request body came too slowly (see `limits::PacedBody`).
    pub fn body_timeout(t: &super::limits::BodyTimeout, what_happened: &str) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!("{t}; {what_happened}"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

/// The status for an engine error: the caller's mistakes are 4xx, storage
/// faults 5xx.
fn engine_status(e: &revault_engine::Error) -> StatusCode {
    match e.code() {
        "unknown_series" | "unknown_version" => StatusCode::NOT_FOUND,
        "bad_series_name" | "invalid_argument" | "bad_gzip" | "unit_mismatch" | "cancelled" => {
            StatusCode::BAD_REQUEST
        }
        "series_busy" | "locked" => StatusCode::CONFLICT,
        "no_space" => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// An engine error as it is: its status, code and message.
    pub fn from_engine(e: &revault_engine::Error) -> Self {
        let message = if e.is_no_space() {
            no_space_message(e)
        } else {
            e.to_string()
        };
        ApiError::new(engine_status(e), e.code(), message)
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
        if matches!(e, revault_engine::Error::Cancelled) {
            err.message = "the request body ended before it was complete (or the backup was cancelled); no version was created".to_string();
        }
        err
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(serde_json::json!({ "code": self.code, "message": self.message })),
        )
            .into_response();
        r.extensions_mut().insert(ErrorCode(self.code));
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
