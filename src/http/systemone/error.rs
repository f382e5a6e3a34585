//! Errors of `POST /v1/systemone`, in System One's shape: 422
//! `{"detail": [{"loc", "msg", "type"}]}` for a body that does not
//! validate, `{"detail": {"error_type", "message"}}` for the rest, with
//! the status and headers the OpenAI routes give.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::{json, Value};

use crate::http::error::ApiError;
use crate::text_route::RouteError;

/// One entry of a 422's `detail`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detail {
    pub loc: Vec<Value>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A fault at `body.<loc...>`.
pub(super) fn detail(loc: &[&str], msg: impl Into<String>, kind: &'static str) -> Detail {
    Detail {
        loc: std::iter::once("body")
            .chain(loc.iter().copied())
            .map(|s| Value::String(s.to_string()))
            .collect(),
        msg: msg.into(),
        kind,
    }
}

/// An error of this route, in System One's shape.
#[derive(Debug)]
pub enum WireError {
    /// 422 with the fields at fault.
    Invalid(Vec<Detail>),
    /// Any other error, with its status and headers as the OpenAI routes
    /// give it.
    Api(ApiError),
}

impl From<ApiError> for WireError {
    fn from(e: ApiError) -> Self {
        WireError::Api(e)
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Invalid(d) => write!(f, "{}", d.first().map_or("invalid", |d| &d.msg)),
            WireError::Api(e) => write!(f, "{e}"),
        }
    }
}

/// System One's `error_type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 | 403 => "authentication_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "api_usage_error",
    }
}

impl ResponseError for WireError {
    fn status_code(&self) -> StatusCode {
        match self {
            WireError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            WireError::Api(e) => e.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            WireError::Invalid(details) => {
                HttpResponse::UnprocessableEntity().json(json!({ "detail": details }))
            }
            WireError::Api(e) => wire_shaped(e.error_response(), &e.to_string()),
        }
    }
}

/// An OpenAI-shaped error response re-written in System One's shape, its
/// status and headers kept.
pub fn wire_shaped(response: HttpResponse, message: &str) -> HttpResponse {
    let status = response.status();
    let mut out = HttpResponse::build(status);
    for (name, value) in response.headers() {
        if name != actix_web::http::header::CONTENT_TYPE
            && name != actix_web::http::header::CONTENT_LENGTH
        {
            out.insert_header((name.clone(), value.clone()));
        }
    }
    out.json(json!({"detail": {"error_type": error_type(status), "message": message}}))
}

impl From<RouteError> for WireError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::Invalid { param, message } => {
                let loc: Vec<&str> = param.as_deref().into_iter().collect();
                WireError::Invalid(vec![detail(&loc, message, "value_error")])
            }
            // System One's clients take 413 for a request over its token
            // budget (jevcompat's SPEC §3.5).
            RouteError::ContextLength { message, .. } => {
                WireError::Api(ApiError::OverLimit(message))
            }
            other => WireError::Api(other.into()),
        }
    }
}
