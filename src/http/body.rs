//! Reading a body under the size limit (decompressed as its
//! `Content-Encoding` says: gzip, zstd, deflate or br), and parsing JSON with
//! errors that name the field.

use actix_web::dev::Decompress;
use actix_web::{web, HttpRequest};
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Bodies over the limit are still read (and dropped as they arrive) up to this many times
/// the limit, so the client receives the 413 instead of a reset connection.
const DRAIN_FACTOR: usize = 4;

pub async fn read_json<T: DeserializeOwned>(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<T, ApiError> {
    parse(&read_bytes(req, payload, limit).await?)
}

/// The body's bytes, decompressed, at most `limit` of them (after
/// decompression: a small compressed body cannot expand past the limit).
pub async fn read_bytes(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, ApiError> {
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit.saturating_mul(DRAIN_FACTOR)) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    let mut payload = Decompress::from_headers(payload, req.headers());
    let mut body = web::BytesMut::new();
    let mut over = false;
    let mut read = 0usize;
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(None, format!("cannot read the body: {e}")))?;
        read += chunk.len();
        if read > limit {
            // Read on (without keeping it) so the client gets the 413.
            over = true;
            if read > limit.saturating_mul(DRAIN_FACTOR) {
                break;
            }
            continue;
        }
        body.extend_from_slice(&chunk);
    }
    if over {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    Ok(body)
}

/// Parses a body, naming the field at fault.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            None,
            "the request body is empty; send a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let result: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = result.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let param = (path != ".").then(|| path.clone());
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("the body is not valid JSON: {inner}")
        } else if path == "." {
            format!("invalid request: {inner}")
        } else {
            format!("invalid value for `{path}`: {inner}")
        };
        ApiError::bad_request(param, message)
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(None, format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}
