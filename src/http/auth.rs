//! `--api-key`: every route but `/health` and `/metrics` needs
//! `Authorization: Bearer <key>`. Keys are compared in constant time (as
//! SHA-256 digests, so neither content nor length leaks through timing).
//! The refusal is in the route's shape: OpenAI's, or System One's on
//! `/v1/systemone` (`error_type` `authentication_error`).

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, Error, ResponseError};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;

/// Routes anyone may call.
const PUBLIC: &[&str] = &["/health", "/metrics"];

pub fn keys_match(given: &str, expected: &str) -> bool {
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.ct_eq(&b).into()
}

pub async fn require_api_key(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let expected = req
        .app_data::<web::Data<AppState>>()
        .and_then(|s| s.api_key.clone());
    if let Some(expected) = expected {
        if !PUBLIC.contains(&req.path()) {
            let given = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    let (scheme, key) = v.split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then_some(key)
                });
            let error = match given {
                None => Some("No API key was given: send `Authorization: Bearer <key>`."),
                Some(k) if !keys_match(k.trim(), &expected) => {
                    Some("The API key is not valid for this server.")
                }
                Some(_) => None,
            };
            if let Some(message) = error {
                let mut response = ApiError::Unauthorized(message.into()).error_response();
                if req.path() == "/v1/systemone" {
                    response = super::systemone::wire_shaped(response, message);
                }
                return Ok(req.into_response(response));
            }
        }
    }
    Ok(next.call(req).await?.map_into_boxed_body())
}

#[cfg(test)]
mod tests {
    use super::keys_match;

    #[test]
    fn keys_compare_exactly() {
        assert!(keys_match("secret", "secret"));
        assert!(!keys_match("secret", "secreT"));
        assert!(!keys_match("secre", "secret"));
        assert!(!keys_match("", "secret"));
    }
}
