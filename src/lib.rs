//! decisio: an OpenAI-compatible gateway that turns a chat model into a
//! calibrated decision engine.
//!
//! The floors, highest first (`docs/design/layout.md`; the layers check,
//! `scripts/check_layers.py`, keeps every import pointing down):
//! - the commands `main` dispatches to: [`serve`] (`decisio serve`: its
//!   flags, and a server started from them), [`convert`] (GGUF checkpoints
//!   to MLX folders), [`register`] (`decisio register`), [`suite`] (suites,
//!   run records and gates; `decisio suite run`, `decisio gate`).
//! - [`http`]: the HTTP surface (actix-web), one room per endpoint family:
//!   typed bodies, validation, errors in each wire's shape, auth. It maps a
//!   wire onto the decision service and back, and knows no backend.
//! - [`tasks`]: the decision service every decision route hands its
//!   questions to ([`tasks::TaskRegistry::decide`],
//!   [`tasks::TaskRegistry::systemone`]), and task registration: the state
//!   folder, the background worker, reports and certificates. It too knows
//!   no backend: it asks the text route.
//! - [`text_route`]: the text route. Turns questions into prompts and
//!   engine jobs, and engine results into answers; System One's questions
//!   and prompt layout ([`text_route::systemone`]). Knows no HTTP.
//! - [`engine`]: the seam the text route talks to, and its backends (MLX,
//!   and vLLM servers upstream).
//! - leaves: [`prompt`] (chat templates and tokenizers), [`bases`] (the
//!   production bases as data), [`hub`] (models from local folders or the
//!   Hugging Face Hub's cache), [`metrics`], [`settings`] (every limit and
//!   default, in one place), [`client`] and [`progress`] (what the client
//!   commands share).
//! - pure leaves: [`stats`] (softmax, the readout rule, calibration,
//!   certificates, conformal sets, the intent head), [`model_config`] (the
//!   one reader of a conversion's `config.json` and
//!   `generation_config.json`), [`rng`], [`base64`].

pub mod base64;
pub mod bases;
pub mod client;
pub mod convert;
pub mod engine;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod model_config;
pub mod progress;
pub mod prompt;
pub mod register;
pub mod rng;
pub mod serve;
pub mod settings;
pub mod stats;
pub mod suite;
pub mod tasks;
pub mod text_route;
