//! The MLX backend: a local MLX conversion served from a thread that owns the
//! model.
//!
//! HTTP handlers never touch MLX. They queue jobs through a bounded channel
//! (a full queue is an immediate error, not a wait) and read the job's events
//! from a channel of its own; dropping that receiver cancels the job between
//! two tokens.
//!
//! Completions reuse prefilled prompts as vLLM's automatic prefix cache
//! does: every state a decision prefilled and every completion prompt is
//! kept in the prefix cache and listed in a `PromptIndex` by its token
//! ids; a completion whose prompt starts with a kept prompt continues from
//! its snapshot and runs only the rest. The prefix is then computed exactly
//! as a decision computes its state (the same chunks from position 0) and
//! the rest as a decision's question (a pass of one row), so a token-id
//! completion of a state and a question gives the same bits as the decision
//! (`docs/design/vllm.md`, parity).
//!
//! The files, by job:
//!
//! - the model: `options` (how weights are held, for the device MLX
//!   computes on), `architecture` (the [`Architecture`] seam), `model` (the
//!   architectures by `model_type`, [`MlxModel`]'s forward passes), [`loader`] (the checkpoint's tensors
//!   and quantization), [`layers`] (the blocks every architecture shares:
//!   linear layers, norms, rope, the gated MLP, the decoder stack),
//!   [`attention`] (causal, sliding-window and split attention),
//!   [`switch`] (mixtures of experts), [`cache`] (per-layer caches and
//!   question caches), [`delta`] (the gated delta rule);
//! - the architectures, one file each: [`llama`], [`qwen3_5`], [`gemma4`]
//!   (its config beside it, in `gemma4/config.rs`);
//! - the CPU: [`host`] (host kernels for MLX's slow CPU ops), [`profile`]
//!   (where a pass spends its time), [`graph`] (op counts);
//! - serving: `engine` (the engine thread and its turns), `passes` (a
//!   state's questions read in passes, and jobs merged), `whole` (jobs run
//!   whole: completions and embeddings), `kept` (the
//!   prefix cache's snapshots and the index of kept prompts), [`sample`]
//!   (choosing a token), [`memory`] (MLX's memory limits);
//! - `error`: [`MlxError`].

mod architecture;
pub mod attention;
pub mod cache;
pub mod delta;
mod engine;
mod error;
mod fault;
pub mod gemma4;
pub mod graph;
pub mod host;
mod kept;
pub mod layers;
pub mod llama;
pub mod loader;
pub mod memory;
mod model;
mod options;
mod passes;
pub mod profile;
pub mod qwen3_5;
pub mod sample;
pub mod switch;
mod whole;

pub use self::architecture::Architecture;
pub use self::engine::MlxEngine;
pub use self::error::{MlxError, MlxResult};
pub use self::layers::LastHidden;
pub use self::model::{architectures, MlxModel, Reading};
pub use self::options::MlxOptions;
pub use self::options::{Device, LoadOptions};
