//! Every error the HTTP surface answers, as one enum mapped to statuses and
//! to OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, HttpResponseBuilder, ResponseError};
use serde::Serialize;

use crate::tasks::TaskError;
use crate::text_route::EngineError;
use crate::text_route::RouteError;

/// How long a client should wait before it retries a 503, as the two
/// headers clients read: `Retry-After` (RFC 9110 §10.2.3, whole seconds)
/// and `retry-after-ms` (milliseconds; typesafe-sdk and the OpenAI SDKs read
/// it first).
pub const RETRY_AFTER_MS: u64 = 1000;

/// Adds the retry headers of a 503 ([`RETRY_AFTER_MS`]).
pub fn retry_after(response: &mut HttpResponseBuilder) -> &mut HttpResponseBuilder {
    response
        .insert_header(("Retry-After", RETRY_AFTER_MS.div_ceil(1000).to_string()))
        .insert_header(("retry-after-ms", RETRY_AFTER_MS.to_string()))
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: a malformed body or a field out of range (`param` names it).
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
    },
    /// 400 with code `context_length_exceeded`.
    #[error("{message}")]
    ContextLength {
        message: String,
        param: &'static str,
    },
    /// 401: no API key, or the wrong one.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: a model this server does not serve.
    #[error(
        "The model `{0}` does not exist on this server (LoRA adapters are not served); \
         GET /v1/models lists the one it serves."
    )]
    ModelNotFound(String),
    /// 404 with code `task_not_found`: a question names a task that is
    /// not registered (`param` names the field).
    #[error("{message}")]
    TaskNotFound { message: String, param: String },
    /// 404: no such route.
    #[error("{0}")]
    NotFound(String),
    /// 405: a route called with a method it does not take; `allow` is
    /// the `Allow` header, the methods it takes (RFC 9110 §15.5.6).
    #[error("{message}")]
    MethodNotAllowed { message: String, allow: String },
    /// 409: valid, but not with what the server holds: a task that cannot
    /// answer (not ready, failed, cancelled), a task name already taken,
    /// the limit of tasks reached. `param` names the field.
    #[error("{message}")]
    Conflict {
        message: String,
        param: String,
        code: &'static str,
    },
    /// 413: the body is over the configured limit.
    #[error("The request body is larger than the limit of {0} bytes (--max-body-mb).")]
    PayloadTooLarge(usize),
    /// 413: a request over a token limit, on a route whose clients take
    /// 413 for it (System One's); the message names the limit and the
    /// request's figure.
    #[error("{0}")]
    OverLimit(String),
    /// 415: a body that is not JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 503, with the retry headers ([`retry_after`]): the queue is full,
    /// the model is not loaded, or no upstream can take the request; all of
    /// them pass by themselves.
    #[error("{message}")]
    Unavailable { message: String, code: &'static str },
    /// 500: a failure inside the server.
    #[error("{0}")]
    Internal(String),
    /// 400: an upstream server refused the request for what it asks (its
    /// 4xx other than 429), with the upstream's message.
    #[error("{0}")]
    UpstreamRefused(String),
    /// 502: an upstream server answered with an error or a malformed body.
    #[error("{0}")]
    BadGateway(String),
    /// 504: an upstream server did not answer in time.
    #[error("{0}")]
    GatewayTimeout(String),
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    pub fn bad_request(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
            param: param.into(),
        }
    }

    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request(Some(param.to_string()), message)
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::NotFound(_) | ApiError::ModelNotFound(_) | ApiError::TaskNotFound { .. } => {
                "not_found_error"
            }
            ApiError::Unavailable { .. } => "service_unavailable_error",
            ApiError::Internal(_) | ApiError::BadGateway(_) | ApiError::GatewayTimeout(_) => {
                "server_error"
            }
            _ => "invalid_request_error",
        }
    }

    fn code(&self) -> Option<&'static str> {
        Some(match self {
            ApiError::ContextLength { .. } => "context_length_exceeded",
            ApiError::Unauthorized(_) => "invalid_api_key",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::TaskNotFound { .. } => "task_not_found",
            ApiError::PayloadTooLarge(_) | ApiError::OverLimit(_) => "request_too_large",
            ApiError::Conflict { code, .. } => code,
            ApiError::Unavailable { code, .. } => code,
            ApiError::BadGateway(_) => "upstream_error",
            ApiError::UpstreamRefused(_) => "upstream_refused",
            ApiError::GatewayTimeout(_) => "upstream_timeout",
            _ => return None,
        })
    }

    fn param(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { param, .. } => param.as_deref(),
            ApiError::ContextLength { param, .. } => Some(param),
            ApiError::Conflict { param, .. } | ApiError::TaskNotFound { param, .. } => Some(param),
            ApiError::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// The JSON body, also used for errors inside an event stream.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind(),
                param: self.param(),
                code: self.code(),
            },
        })
        .unwrap_or_default()
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. }
            | ApiError::ContextLength { .. }
            | ApiError::UpstreamRefused(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) | ApiError::TaskNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) | ApiError::OverLimit(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Unavailable { .. } => {
                retry_after(&mut response);
            }
            // RFC 9110 §11.6.1: a 401 says which scheme it wants.
            ApiError::Unauthorized(_) => {
                response.insert_header(("WWW-Authenticate", "Bearer"));
            }
            ApiError::MethodNotAllowed { allow, .. } => {
                response.insert_header(("Allow", allow.as_str()));
            }
            _ => {}
        }
        response.json(self.body())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::QueueFull(_) => ApiError::Unavailable {
                message: e.to_string(),
                code: "queue_full",
            },
            EngineError::Loading | EngineError::LoadFailed(_) | EngineError::Stopped => {
                ApiError::Unavailable {
                    message: e.to_string(),
                    code: "model_not_loaded",
                }
            }
            EngineError::Model(m) => ApiError::Internal(m),
            EngineError::OutOfMemory(_) => ApiError::Unavailable {
                message: e.to_string(),
                code: "out_of_memory",
            },
            EngineError::Unsupported(m) => ApiError::BadRequest {
                message: m,
                param: None,
            },
            EngineError::UpstreamUnavailable(m) | EngineError::Waiting(m) => {
                ApiError::Unavailable {
                    message: m,
                    code: "upstream_unavailable",
                }
            }
            EngineError::UpstreamTimeout(m) => ApiError::GatewayTimeout(m),
            EngineError::Upstream(m) => ApiError::BadGateway(m),
            EngineError::UpstreamRefused(m) => ApiError::UpstreamRefused(m),
        }
    }
}

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::Invalid { message, param } => ApiError::BadRequest { message, param },
            RouteError::ContextLength { message, param } => {
                ApiError::ContextLength { message, param }
            }
            RouteError::Engine(e) => e.into(),
        }
    }
}

impl From<TaskError> for ApiError {
    fn from(e: TaskError) -> Self {
        match e {
            TaskError::Invalid { param, message } => ApiError::BadRequest {
                message,
                param: Some(param),
            },
            TaskError::NotFound(_) => ApiError::NotFound(e.to_string()),
            TaskError::UnknownName { param, message } => ApiError::TaskNotFound { message, param },
            TaskError::NotReady { param, message } => ApiError::Conflict {
                message,
                param,
                code: "task_not_ready",
            },
            TaskError::Taken { param, message } => ApiError::Conflict {
                message,
                param,
                code: "task_exists",
            },
            TaskError::Full { param, message } => ApiError::Conflict {
                message,
                param,
                code: "task_limit_reached",
            },
            TaskError::Store(m) => ApiError::Internal(m),
            TaskError::StoreUnavailable(_) => ApiError::Unavailable {
                message: e.to_string(),
                code: "task_store_unavailable",
            },
            TaskError::StackDiffers(message) => ApiError::Conflict {
                message,
                param: "stack".into(),
                code: "serving_stack_changed",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's own account of its errors ([`EngineError::passes`],
    /// [`EngineError::servers_fault`], which the task worker acts on) agrees
    /// with the statuses this layer answers them with: an error that passes
    /// is a 503, the server's fault is a 5xx, and the request's is a 4xx.
    #[test]
    fn an_engine_errors_status_agrees_with_what_the_engine_says_of_it() {
        let m = || "m".to_string();
        let every = [
            EngineError::QueueFull(3),
            EngineError::Loading,
            EngineError::LoadFailed(m()),
            EngineError::Stopped,
            EngineError::Model(m()),
            EngineError::OutOfMemory(m()),
            EngineError::Unsupported(m()),
            EngineError::UpstreamUnavailable(m()),
            EngineError::UpstreamTimeout(m()),
            EngineError::Upstream(m()),
            EngineError::UpstreamRefused(m()),
            EngineError::Waiting(m()),
        ];
        for e in every {
            let (passes, servers_fault) = (e.passes(), e.servers_fault());
            let status = ApiError::from(e.clone()).status_code();
            assert_eq!(passes, status == StatusCode::SERVICE_UNAVAILABLE, "{e:?}");
            assert_eq!(servers_fault, status.is_server_error(), "{e:?}");
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{e:?}"
            );
        }
    }
}
