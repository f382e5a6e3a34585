//! The HTTP surface (actix-web): OpenAI's routes plus vLLM's extras.
//!
//! One file per endpoint family, each holding that endpoint's request and
//! response bodies, its validation and its handler:
//! - `chat`: `POST /v1/chat/completions` (text generation, streamed or
//!   whole; image content parts passed through; a decision asked with a
//!   `decisio` object);
//! - `completions`: `POST /v1/completions`;
//! - `embeddings`: `POST /v1/embeddings`;
//! - `tokens`: vLLM's `POST /tokenize` and `POST /detokenize`;
//! - `decisions`: `POST /v1/decide`, and the decision's shapes a chat
//!   decision shares;
//! - `tasks`: `POST /v1/tasks`, `GET /v1/tasks` (`?full=1`: an export),
//!   `POST /v1/tasks/import`, `GET` and `DELETE /v1/tasks/{id}`, `POST
//!   /v1/tasks/{id}/certify`;
//! - `systemone`: `POST /v1/systemone`, TypeSafe's System One wire, and
//!   the abstention tasks (`/v1/abstention/tasks`: `POST`, `GET`, `POST
//!   .../import`, `GET` and `DELETE .../{id}`, and their registration
//!   worker), with
//!   its own request, error and answer shapes;
//! - `service`: `GET /v1/models`, `/health`, `/metrics`, `/openapi.json`
//!   ([`openapi`]), and the 404 and 405 answers.
//!
//! What several endpoints share: `messages` (chat messages, for chat and
//! `/tokenize`), `sampling` (the sampling fields chat and completions
//! share, and their rules), `stream` (server-sent events, and a generation
//! collected for an answer sent whole), `fields` (lenient JSON integers and
//! booleans, and the checks several routes make), `body` (reading a body
//! under the size limit) and [`error`] (every failure as an [`ApiError`],
//! in OpenAI's error shape). `auth` (`--api-key`) and `observe` (HTTP
//! metrics) wrap every route. [`types`] names every body.
//!
//! This layer knows nothing of MLX or vLLM: backends meet it through the
//! text route and the `Engine` trait.

mod auth;
mod body;
mod chat;
mod completions;
mod decisions;
mod embeddings;
pub mod error;
mod fields;
mod messages;
mod observe;
pub mod openapi;
mod peer;
mod sampling;
mod service;
mod stream;
pub mod systemone;
mod tasks;
mod tokens;

/// The request and response bodies of every route, by name (each is
/// declared in its endpoint's file).
pub mod types {
    pub use super::chat::{
        ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
        ChatDecision, ChatDelta, ChatLogprobs, ChatMessageOut, ChatTokenLogprob, DecisioReply,
        DecisioRequest, DecisionUsage, PromptTokensDetails, TopLogprob,
    };
    pub use super::completions::{
        Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, PromptSpec,
    };
    pub use super::decisions::{
        AnswerOut, DecideQuestion, DecideRequest, DecideResponse, DecideUsage, StateOut,
    };
    pub use super::embeddings::{
        EmbeddingData, EmbeddingInput, EmbeddingList, EmbeddingRequest, EmbeddingUsage,
        EmbeddingVector,
    };
    pub use super::sampling::{StopSpec, StreamOptions};
    pub use super::service::{ModelCard, ModelList, ServedIdentity};
    pub use super::stream::Usage;
    pub use super::systemone::abstention::{
        AbstentionImport, AbstentionRequest, ExampleIn as AbstentionExampleIn, OptionIn,
    };
    pub use super::tasks::reference::{ReferenceCertify, ReferenceExample, ReferenceTask};
    pub use super::tasks::{
        AbstentionIn, CertifyIn, CertifyRequest, TaskDeleted, TaskExampleIn, TaskHeadIn,
        TaskHeadOut, TaskList, TaskOut, TaskRequest,
    };
    pub use super::tokens::{
        DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
    };
}

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{guard, middleware, web, App, HttpRequest, HttpResponse, HttpServer};

pub use error::ApiError;

use crate::metrics::Metrics;
use crate::settings::Limits;
use crate::tasks::TaskRegistry;
use crate::text_route::TextRoute;
use crate::text_route::{EngineError, EngineStatus};

/// What every handler shares.
pub struct AppState {
    pub route: Arc<TextRoute>,
    /// The model name clients use (`--served-model-name`).
    pub model_name: String,
    /// Where the model came from (`root` in /v1/models).
    pub model_root: String,
    pub api_key: Option<String>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub tasks: Arc<TaskRegistry>,
    pub created: u64,
    /// Answers of certified tasks carry the reference decisio's field names
    /// (`certified`, `certificate`, `certified_reason`) instead of the
    /// `x_`-prefixed ones (`--reference-field-names`).
    pub reference_field_names: bool,
}

impl AppState {
    pub fn new(
        route: Arc<TextRoute>,
        model_name: String,
        model_root: String,
        api_key: Option<String>,
        limits: Limits,
        tasks: Arc<TaskRegistry>,
    ) -> Self {
        AppState {
            tasks,
            metrics: route.metrics.clone(),
            route,
            model_name,
            model_root,
            api_key,
            limits,
            created: unix_now(),
            reference_field_names: false,
        }
    }

    /// What answers on this server (`decisio` of each `/v1/models` card).
    pub fn identity(&self) -> service::ServedIdentity {
        let (info, caps) = (self.route.info(), self.route.capabilities());
        service::ServedIdentity {
            version: env!("CARGO_PKG_VERSION"),
            backend: caps.name,
            architecture: info.architecture.clone(),
            base: self.route.base.map(|b| b.name),
            model_identity: info.identity.clone(),
            tokenizer_identity: self.route.tokenizer_identity.clone(),
            default_temperature: self.route.default_temperature,
            padding: self.route.padding.label(),
            multi_question: caps.modes.iter().map(|m| m.as_str()).collect(),
        }
    }

    /// What `GET /openapi.json` says of this server, read when asked (a
    /// vLLM backend learns its context from its upstreams).
    pub fn served(&self) -> openapi::Served {
        let caps = self.route.capabilities();
        openapi::Served {
            api_key: self.api_key.is_some(),
            vocab_size: self.route.info().vocab_size,
            context_length: self.route.context_length(),
            max_logprobs: self.limits.max_logprobs,
            hidden_size: self.route.info().hidden_size,
            modes: caps.modes.iter().map(|m| m.as_str()).collect(),
            hidden_layers: self.route.hidden_layers(),
        }
    }

    /// 503 while the backend waits for the servers it fronts (what it
    /// serves is not known yet): every route that runs the model calls it
    /// first.
    pub fn ready(&self) -> Result<(), ApiError> {
        match self.route.status() {
            EngineStatus::Waiting(w) => Err(EngineError::Waiting(w.message).into()),
            _ => Ok(()),
        }
    }

    /// A request may name the served model or leave it out.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model_name => Err(ApiError::ModelNotFound(m.to_string())),
            _ => Ok(()),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Unique-enough ids for responses: time and a counter.
fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}-{t:016x}{n:08x}")
}

/// One route of the server: its method, its path and how its handler is
/// mounted.
pub struct Endpoint {
    pub method: &'static str,
    pub path: &'static str,
    mount: fn(actix_web::Route) -> actix_web::Route,
}

const fn at(
    method: &'static str,
    path: &'static str,
    mount: fn(actix_web::Route) -> actix_web::Route,
) -> Endpoint {
    Endpoint {
        method,
        path,
        mount,
    }
}

/// Every route the server has, each declared once: the table the server
/// mounts is the one `openapi/openapi.yaml` is checked against (a test
/// checks that it describes exactly these). A new endpoint is a handler
/// and a row here (and its description).
pub const ROUTES: &[Endpoint] = &[
    at("GET", "/health", |r| r.to(service::health)),
    at("GET", "/v1/models", |r| r.to(service::models)),
    at("POST", "/v1/chat/completions", |r| {
        r.to(chat::chat_completions)
    }),
    at("POST", "/v1/completions", |r| {
        r.to(completions::completions)
    }),
    at("POST", "/v1/embeddings", |r| r.to(embeddings::embeddings)),
    at("POST", "/tokenize", |r| r.to(tokens::tokenize)),
    at("POST", "/detokenize", |r| r.to(tokens::detokenize)),
    at("POST", "/v1/decide", |r| r.to(decisions::decide)),
    at("POST", "/v1/systemone", |r| r.to(systemone::systemone)),
    at("GET", "/metrics", |r| r.to(service::metrics)),
    at("POST", "/v1/tasks", |r| r.to(tasks::create_task)),
    at("GET", "/v1/tasks", |r| r.to(tasks::list_tasks)),
    at("POST", "/v1/tasks/import", |r| r.to(tasks::import_tasks)),
    at("POST", "/v1/tasks/{id}/certify", |r| {
        r.to(tasks::certify_task)
    }),
    at("GET", "/v1/tasks/{id}", |r| r.to(tasks::get_task)),
    at("DELETE", "/v1/tasks/{id}", |r| r.to(tasks::delete_task)),
    at("POST", "/v1/abstention/tasks", |r| {
        r.to(systemone::abstention::register)
    }),
    at("GET", "/v1/abstention/tasks", |r| {
        r.to(systemone::abstention::list)
    }),
    at("POST", "/v1/abstention/tasks/import", |r| {
        r.to(systemone::abstention::import)
    }),
    at("GET", "/v1/abstention/tasks/{id}", |r| {
        r.to(systemone::abstention::status)
    }),
    at("DELETE", "/v1/abstention/tasks/{id}", |r| {
        r.to(systemone::abstention::delete)
    }),
    at("GET", "/openapi.json", |r| r.to(service::openapi)),
];

/// The methods `path` takes, as its `Allow` header: the methods of its
/// routes, HEAD wherever GET is (answered as GET, without the body) and
/// OPTIONS (answered 204 with this header), as RFC 9110 §9.3 has them.
pub fn allowed_methods(path: &str) -> String {
    let mut methods: Vec<&str> = Vec::new();
    for method in ROUTES.iter().filter(|e| e.path == path).map(|e| e.method) {
        methods.push(method);
        if method == "GET" {
            methods.push("HEAD");
        }
    }
    methods.push("OPTIONS");
    methods.join(", ")
}

/// Registers every route of [`ROUTES`], one resource per path.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let mut paths: Vec<&str> = Vec::new();
    for e in ROUTES {
        if !paths.contains(&e.path) {
            paths.push(e.path);
        }
    }
    for path in paths {
        let allow = allowed_methods(path);
        let mut resource = web::resource(path);
        for e in ROUTES.iter().filter(|e| e.path == path) {
            let route = match e.method {
                "GET" => web::route().guard(guard::Any(guard::Get()).or(guard::Head())),
                "DELETE" => web::delete(),
                _ => web::post(),
            };
            resource = resource.route((e.mount)(route));
        }
        let options_allow = allow.clone();
        resource = resource.route(web::route().guard(guard::Options()).to(move || {
            let allow = options_allow.clone();
            async move {
                HttpResponse::NoContent()
                    .insert_header(("Allow", allow))
                    .finish()
            }
        }));
        cfg.service(resource.default_service(web::to(move |req: HttpRequest| {
            let allow = allow.clone();
            async move { service::method_not_allowed(req, allow) }
        })));
    }
}

/// Serves until the process is stopped.
pub async fn serve(state: AppState, host: &str, port: u16) -> std::io::Result<()> {
    let state = web::Data::new(state);
    // The abstention registrations' worker answers its examples on the
    // server's runtime, beside the handlers; System One's request rules,
    // which read its examples, are the HTTP layer's to give.
    actix_web::rt::spawn(
        state
            .tasks
            .clone()
            .work_abstention(systemone::abstention::read_example),
    );
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(middleware::from_fn(auth::require_api_key))
            .wrap(middleware::from_fn(observe::record))
            .configure(configure)
            .default_service(web::to(service::not_found))
    })
    .on_connect(peer::on_connect)
    .bind((host, port))?;
    for addr in server.addrs() {
        tracing::info!("listening on http://{addr}");
    }
    server.run().await
}
