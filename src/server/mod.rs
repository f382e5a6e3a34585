//! The HTTP surface (actix-web): OpenAI's routes plus vLLM's extras.
//!
//! Handlers read a body (`body`), validate it ([`validate`]), hand it to the
//! text route and shape the result (`handlers`). Every failure is an
//! [`ApiError`] in OpenAI's error shape. This layer knows nothing of MLX or
//! vLLM: backends meet it through the text route and the `Engine` trait.

mod auth;
mod body;
pub mod error;
mod handlers;
mod observe;
pub mod openapi;
pub mod types;
pub mod validate;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::{guard, middleware, web, App, HttpRequest, HttpResponse, HttpServer};

pub use error::ApiError;

use crate::metrics::Metrics;
use crate::route::TextRoute;
use crate::settings::Limits;
use crate::tasks::TaskRegistry;

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
        }
    }

    /// What answers on this server (`decisio` of each `/v1/models` card).
    pub fn identity(&self) -> types::ServedIdentity {
        let engine = self.route.engine();
        let (info, caps) = (engine.info(), engine.capabilities());
        types::ServedIdentity {
            version: env!("CARGO_PKG_VERSION"),
            backend: caps.name,
            architecture: info.architecture.clone(),
            base: self.route.base.map(|b| b.name),
            model_identity: info.identity.clone(),
            tokenizer_identity: self.route.tokenizer_identity.clone(),
            default_temperature: self.route.default_temperature,
            padding: caps.padding.label(),
            multi_question: caps.modes.iter().map(|m| m.as_str()).collect(),
        }
    }

    /// What `GET /openapi.json` says of this server, read when asked (a
    /// vLLM backend learns its context from its upstreams).
    pub fn served(&self) -> openapi::Served {
        let caps = self.route.engine().capabilities();
        openapi::Served {
            api_key: self.api_key.is_some(),
            vocab_size: self.route.engine().info().vocab_size,
            context_length: self.route.context_length(),
            max_logprobs: self.limits.max_logprobs,
            hidden_size: self.route.engine().info().hidden_size,
            modes: caps.modes.iter().map(|m| m.as_str()).collect(),
            hidden_layers: self.route.engine().hidden_layers(),
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

/// Every route the server has, as (method, path); `openapi/openapi.yaml`
/// describes exactly these (a test checks it).
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/decide"),
    ("GET", "/metrics"),
    ("POST", "/v1/tasks"),
    ("GET", "/v1/tasks"),
    ("GET", "/v1/tasks/{id}"),
    ("DELETE", "/v1/tasks/{id}"),
    ("GET", "/openapi.json"),
];

/// The methods `path` takes, as its `Allow` header: the methods of its
/// routes, HEAD wherever GET is (answered as GET, without the body) and
/// OPTIONS (answered 204 with this header), as RFC 9110 §9.3 has them.
pub fn allowed_methods(path: &str) -> String {
    let mut methods: Vec<&str> = Vec::new();
    for &(method, _) in ROUTES.iter().filter(|(_, p)| *p == path) {
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
    for &(_, path) in ROUTES {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    for path in paths {
        let allow = allowed_methods(path);
        let mut resource = web::resource(path);
        for &(method, _) in ROUTES.iter().filter(|(_, p)| *p == path) {
            let route = match method {
                "GET" => web::route().guard(guard::Any(guard::Get()).or(guard::Head())),
                "DELETE" => web::delete(),
                _ => web::post(),
            };
            let route = match (method, path) {
                (_, "/health") => route.to(handlers::health),
                (_, "/v1/models") => route.to(handlers::models),
                (_, "/v1/chat/completions") => route.to(handlers::chat_completions),
                (_, "/v1/completions") => route.to(handlers::completions),
                (_, "/v1/embeddings") => route.to(handlers::embeddings),
                (_, "/tokenize") => route.to(handlers::tokenize),
                (_, "/detokenize") => route.to(handlers::detokenize),
                (_, "/v1/decide") => route.to(handlers::decide),
                (_, "/metrics") => route.to(handlers::metrics),
                ("POST", "/v1/tasks") => route.to(handlers::create_task),
                ("GET", "/v1/tasks") => route.to(handlers::list_tasks),
                ("GET", "/v1/tasks/{id}") => route.to(handlers::get_task),
                ("DELETE", "/v1/tasks/{id}") => route.to(handlers::delete_task),
                (_, "/openapi.json") => route.to(handlers::openapi),
                other => unreachable!("no handler for {other:?}"),
            };
            resource = resource.route(route);
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
            async move { handlers::method_not_allowed(req, allow) }
        })));
    }
}

/// Serves until the process is stopped.
pub async fn serve(state: AppState, host: &str, port: u16) -> std::io::Result<()> {
    let state = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(middleware::from_fn(auth::require_api_key))
            .wrap(middleware::from_fn(observe::record))
            .configure(configure)
            .default_service(web::to(handlers::not_found))
    })
    .bind((host, port))?;
    for addr in server.addrs() {
        tracing::info!("listening on http://{addr}");
    }
    server.run().await
}
