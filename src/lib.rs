//! decisio: an OpenAI-compatible gateway that turns a chat model into a
//! calibrated decision engine.
//!
//! The layers, from the outside in:
//! - [`server`]: the HTTP surface (actix-web). Typed requests and responses,
//!   validation, errors in OpenAI's shape, auth, metrics. Knows no backend.
//! - [`route`]: the text route. Turns requests into prompts and engine jobs
//!   and engine results into answers. Knows no HTTP.
//! - [`engine`]: the seam the route talks to, and its backends (MLX).
//! - [`prompt`]: chat templates (Hugging Face compatible) and tokenizers.
//! - [`hub`]: models and tokenizers from local folders or the Hugging
//!   Face Hub (through its cache folder).
//! - [`serve`]: the `decisio serve` command: its flags, and a server
//!   started from them.
//! - [`convert`]: GGUF checkpoints to MLX conversion folders.
//! - [`register`]: the `decisio register` client of a running server.
//! - [`suite`]: suites, run records and gates (`decisio suite run`,
//!   `decisio gate`), clients of a running server.
//! - [`client`], [`progress`]: the HTTP client and the progress display
//!   those commands share.
//! - [`tasks`]: task registration: the state folder, the background
//!   worker and the reports.
//! - [`stats`]: the mathematics below the route and the tasks: softmax,
//!   calibration figures, the temperature fit, the intent head.
//! - [`settings`]: every limit and default, in one place.
//! - [`bases`]: the production bases: their conversions, tokenizers,
//!   settings and refusals, as data.
//! - [`model_config`]: the one reader of a conversion's `config.json` and
//!   `generation_config.json`.

pub mod base64;
pub mod bases;
pub mod client;
pub mod convert;
pub mod engine;
pub mod hub;
pub mod metrics;
pub mod model_config;
pub mod progress;
pub mod prompt;
pub mod register;
pub mod rng;
pub mod route;
pub mod serve;
pub mod server;
pub mod settings;
pub mod stats;
pub mod suite;
pub mod tasks;
