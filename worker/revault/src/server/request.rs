//! Reading requests: path and query rejections as API errors, bounded JSON
//! bodies, the declared length of an upload.

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ApiResult};
use super::wire::ApiCode;

/// Largest JSON request body accepted.
const JSON_LIMIT: usize = 64 << 10;

pub(crate) fn path_err(e: PathRejection) -> ApiError {
    ApiError::bad_request(ApiCode::BadPath, format!("bad path: {}", e.body_text()))
}

pub(crate) fn query_err(e: QueryRejection) -> ApiError {
    ApiError::bad_request(ApiCode::BadQuery, format!("bad query: {}", e.body_text()))
}

/// Reads a JSON body (bounded); an empty body is `None`.
pub(crate) async fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Option<T>> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::bad_request(
                ApiCode::BadContentType,
                format!("expected Content-Type application/json, got {ct:?}"),
            ));
        }
    }
    let bytes = axum::body::to_bytes(body, JSON_LIMIT).await.map_err(|e| {
        if let Some(t) = super::limits::body_timeout(&e) {
            return ApiError::body_timeout(t, "nothing was done");
        }
        ApiError::bad_request(
            ApiCode::BadBody,
            format!("cannot read the request body (at most {JSON_LIMIT} bytes of JSON): {e}"),
        )
    })?;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ApiError::bad_request(ApiCode::BadJson, format!("invalid JSON body: {e}")))
}

/// A JSON body the request must have: an empty one is `400 bad_json` saying what was
/// `expected` (an example body).
pub(crate) async fn required_json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    expected: &str,
) -> ApiResult<T> {
    json_body(headers, body)
        .await?
        .ok_or_else(|| ApiError::bad_request(ApiCode::BadJson, format!("expected {expected}")))
}

/// The Content-Length a request declared, if any: a body that ends short of
/// it is cut, not complete.
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}
