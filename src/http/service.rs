//! What the server says of itself: `GET /v1/models` (the served model and
//! what answers for it), `GET /health`, `GET /metrics` and
//! `GET /openapi.json`; and the answers to a path without a route (404) or
//! a method its route does not take (405).

use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;

use super::error::{retry_after, ApiError};
use super::AppState;
use crate::text_route::{EngineError, EngineStatus};

#[derive(Clone, Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub max_model_len: usize,
    /// What a run record needs to name the configuration that answers.
    pub decisio: ServedIdentity,
}

/// The identity of what answers on this server: a run record keeps it, and
/// `decisio gate` refuses to compare records whose bases or tokenizers
/// differ.
#[derive(Clone, Debug, Serialize)]
pub struct ServedIdentity {
    /// The server's version (`decisio --version`).
    pub version: &'static str,
    /// `MLX` or `vLLM`.
    pub backend: &'static str,
    /// `model_type` of config.json.
    pub architecture: String,
    /// The production base served (`--base`), if any.
    pub base: Option<&'static str>,
    /// A digest of config.json and the weight files' names and sizes (the
    /// upstream's model name and root for the vLLM backend).
    pub model_identity: String,
    /// A digest of the tokenizer's files.
    pub tokenizer_identity: String,
    /// The letters' temperature when neither a request nor a task sets one.
    pub default_temperature: f64,
    /// How states are padded (`none`, `block16`).
    pub padding: String,
    /// The multi-question modes served; the first is the default.
    pub multi_question: Vec<&'static str>,
}

/// `GET /v1/models`: OpenAI's list (`object`, `data`) and System One's
/// (`models`: every name a System One request's `model` may give), so the
/// OpenAI SDKs and TypeSafe's SDK both read it.
#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
    pub models: Vec<super::systemone::ModelMetadata>,
}

pub async fn models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name.clone(),
            object: "model",
            created: state.created,
            owned_by: "decisio",
            root: state.model_root.clone(),
            max_model_len: state.route.context_length(),
            decisio: state.identity(),
        }],
        models: super::systemone::model_metadata(&state.model_name, state.created),
    })
}

pub async fn health(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match state.route.status() {
        // With a shared task store, also what this replica applies of it.
        EngineStatus::Ready => {
            let mut body = serde_json::json!({ "status": "ok" });
            if let Some(r) = state.tasks.store_report() {
                body["task_store"] = serde_json::to_value(r).unwrap_or_default();
            }
            Ok(HttpResponse::Ok().json(body))
        }
        EngineStatus::Loading => Err(EngineError::Loading.into()),
        EngineStatus::Failed(e) => Err(EngineError::LoadFailed(e).into()),
        EngineStatus::Unavailable(e) => Err(EngineError::UpstreamUnavailable(e).into()),
        // The error object, and what is waited for.
        EngineStatus::Waiting(w) => {
            let e = ApiError::from(EngineError::Waiting(w.message.clone()));
            let mut body = e.body();
            body["waiting"] = serde_json::to_value(&w).unwrap_or_default();
            Ok(retry_after(&mut HttpResponse::ServiceUnavailable()).json(body))
        }
    }
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    state
        .metrics
        .queue_depth
        .set(state.route.queue_depth() as i64);
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

pub async fn openapi(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(super::openapi::document(&state.served()))
}

pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!(
        "There is no route {} {}; GET /openapi.json describes the routes this server has.",
        req.method(),
        req.path()
    ))
    .error_response()
}

pub fn method_not_allowed(req: HttpRequest, allow: String) -> HttpResponse {
    ApiError::MethodNotAllowed {
        message: format!(
            "{} does not take {}; it takes {allow}.",
            req.path(),
            req.method()
        ),
        allow,
    }
    .error_response()
}
