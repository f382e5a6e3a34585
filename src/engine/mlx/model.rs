//! A loaded model: the table of architectures by `model_type`, and
//! [`MlxModel`], the forward passes the engine thread runs (a prompt's
//! hidden states, a question read on a state, logits).

use std::path::Path;

use mlx_rs::{ops, Array};
use sha2::{Digest, Sha256};

use super::architecture::Architecture;
use super::cache::ModelCache;
use super::error::{MlxError, MlxResult};
use super::layers::LastHidden;
use super::options::LoadOptions;
use super::profile::{self, Class};
use super::{gemma4, llama, loader, qwen3_5};
use crate::engine::ModelInfo;
use crate::model_config;

type Loader = fn(&serde_json::Value, &loader::Weights) -> MlxResult<Box<dyn Architecture>>;

/// The architectures this backend implements, by `model_type`.
const LOADERS: &[(&str, Loader)] = &[
    ("llama", llama::Model::boxed),
    ("gemma4", gemma4::Model::boxed),
    ("gemma4_text", gemma4::Model::boxed),
    ("gemma4_unified", gemma4::Model::boxed),
    ("qwen3_5", qwen3_5::Model::boxed),
    ("qwen3_5_moe", qwen3_5::Model::boxed),
];

/// The `model_type`s this backend implements.
pub fn architectures() -> impl Iterator<Item = &'static str> {
    LOADERS.iter().map(|(name, _)| *name)
}

/// What [`MlxModel::read_question`] reads at a question's last position.
pub struct Reading {
    /// The float32 logits of the ids read.
    pub logits: Vec<f32>,
    /// Their log-probabilities over the vocabulary.
    pub logprobs: Vec<f32>,
    /// The hidden state, when asked.
    pub hidden: Option<Vec<f32>>,
}

/// A loaded model: forward passes over token ids with a cache.
pub struct MlxModel {
    arch: Box<dyn Architecture>,
    pub info: ModelInfo,
}

impl MlxModel {
    /// Reads the model description (no weights) of the conversion in `dir`.
    pub fn describe(dir: &Path) -> MlxResult<ModelInfo> {
        let config = loader::read_config(dir)?;
        let mut info = describe_config(&config)?;
        info.identity = identity(dir)?;
        Ok(info)
    }

    /// Loads the conversion in `dir` as [`LoadOptions::default`] says.
    pub fn load(dir: &Path) -> MlxResult<Self> {
        Self::load_with(dir, LoadOptions::default())
    }

    pub fn load_with(dir: &Path, options: LoadOptions) -> MlxResult<Self> {
        let info = Self::describe(dir)?;
        let config = loader::read_config(dir)?;
        let weights = loader::Weights::load(dir, &config, options)?;
        let load = LOADERS
            .iter()
            .find(|(name, _)| *name == info.architecture)
            .map(|(_, load)| *load)
            .ok_or_else(|| unsupported(&info.architecture))?;
        let arch = load(&config, &weights)?;
        weights.finish()?;
        Ok(MlxModel { arch, info })
    }

    pub fn new_cache(&self) -> ModelCache {
        self.arch.new_cache()
    }

    /// Computes what the weights still owe (a dequantized copy, a stacked
    /// expert, a norm folded at load): one token through every layer and
    /// the output head, evaluated and dropped, so the first request runs
    /// at full speed.
    pub fn warm_up(&self) -> MlxResult<()> {
        let mut cache = self.new_cache();
        let last = self.last_hidden(&[0], &mut cache)?;
        self.logits(&last)?.eval()?;
        Ok(())
    }

    /// Final hidden states of `tokens` (`[1, L]`), extending `cache`.
    pub fn hidden(&self, tokens: &[u32], cache: &mut ModelCache) -> MlxResult<Array> {
        let ids = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        let h = self.arch.hidden(&ids, cache)?;
        cache.advance(tokens.len());
        Ok(h)
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> usize {
        self.arch.hidden_size()
    }

    /// Decoder blocks.
    pub fn num_layers(&self) -> usize {
        self.arch.num_layers()
    }

    /// The final hidden state of the last of `tokens` (`[1, 1, D]`),
    /// extending `cache` by all of them.
    pub fn last_hidden(&self, tokens: &[u32], cache: &mut ModelCache) -> MlxResult<Array> {
        Ok(self.last_hidden_tap(tokens, cache, None)?.normed)
    }

    /// Like [`MlxModel::last_hidden`], with block `tap`'s output at the last
    /// position as well when it is given.
    pub fn last_hidden_tap(
        &self,
        tokens: &[u32],
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden> {
        if let Some(t) = tap.filter(|&t| t >= self.num_layers()) {
            return Err(MlxError::Config(format!(
                "layer {t} does not exist: the model has {} blocks",
                self.num_layers()
            )));
        }
        let ids = Array::from_slice(tokens, &[1, tokens.len() as i32]);
        let h = self.arch.last_hidden(&ids, cache, tap)?;
        cache.advance(tokens.len());
        Ok(h)
    }

    /// Logits over the vocabulary for hidden states.
    pub fn logits(&self, hidden: &Array) -> MlxResult<Array> {
        self.arch.logits(hidden)
    }

    /// Runs `tokens` in chunks of at most `chunk` and returns the final
    /// hidden state of the last position (`[1, 1, D]`).
    pub fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut ModelCache,
        chunk: usize,
    ) -> MlxResult<Array> {
        Ok(self.run_chunked(tokens, cache, chunk, None)?.normed)
    }

    /// Runs `tokens` from `cache` in chunks of at most `chunk`, evaluating
    /// the cache after each whole chunk, and returns the last position's
    /// final hidden state (and block `tap`'s). A state's prefill and a
    /// question's suffix run alike: one pass when they fit in a chunk, and
    /// a long suffix (a choice among hundreds of options) costs what a
    /// prefill of its length costs, not the square of one pass's
    /// attention scores.
    pub fn run_chunked(
        &self,
        tokens: &[u32],
        cache: &mut ModelCache,
        chunk: usize,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden> {
        let chunk = chunk.max(1);
        let mut parts = tokens.chunks(chunk).peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                let last = self.last_hidden_tap(part, cache, tap)?;
                if part.len() == chunk {
                    cache.eval()?;
                }
                return Ok(last);
            }
            self.last_hidden(part, cache)?;
            cache.eval()?;
        }
        Err(MlxError::Config("an empty prompt has no next token".into()))
    }

    /// A question on a state: `suffix` run from `cache` (the state's,
    /// extended) in chunks of at most `chunk`, and at its last position the float32 logits of the ids
    /// `read` and their log-probabilities over the vocabulary, and with
    /// `hidden` the final norm's output (or block `tap`'s).
    pub fn read_question(
        &self,
        suffix: &[u32],
        cache: &mut ModelCache,
        chunk: usize,
        read: &[u32],
        hidden: bool,
        tap: Option<usize>,
    ) -> MlxResult<Reading> {
        let taken = self.run_chunked(suffix, cache, chunk, tap)?;
        let last = taken.normed;
        let logits = ops::reshape(self.logits(&last)?.as_type::<f32>()?, &[-1])?;
        let norm = ops::logsumexp(&logits, false)?;
        let read: Vec<i32> = read.iter().map(|&t| t as i32).collect();
        let picked =
            ops::indexing::take_axis(&logits, Array::from_slice(&read, &[read.len() as i32]), 0)?;
        let logprobs = ops::subtract(&picked, &norm)?;
        let hidden = hidden
            .then(|| ops::reshape(taken.tap.as_ref().unwrap_or(&last).as_type::<f32>()?, &[-1]))
            .transpose()?;
        let mut arrays = vec![&picked, &logprobs];
        arrays.extend(hidden.iter());
        // The cast, the vocabulary's log-normaliser and the letters' rows.
        let flops = 4.0 * profile::elements(&logits);
        profile::op(Class::Softmax, flops, || {
            mlx_rs::transforms::eval(arrays)?;
            Ok(picked.clone())
        })?;
        Ok(profile::host(Class::Transfers, 0.0, || Reading {
            logits: picked.as_slice::<f32>().to_vec(),
            logprobs: logprobs.as_slice::<f32>().to_vec(),
            hidden: hidden.map(|h| h.as_slice::<f32>().to_vec()),
        }))
    }

    /// Float32 log-probabilities over the vocabulary from hidden states
    /// `[.., D]` → `[.., V]`.
    pub fn log_softmax(&self, hidden: &Array) -> MlxResult<Array> {
        let logits = self.logits(hidden)?.as_type::<f32>()?;
        let norm = ops::logsumexp_axis(&logits, -1, true)?;
        Ok(ops::subtract(&logits, &norm)?)
    }

    /// The float32 logits of the last position of `tokens` on a fresh cache.
    pub fn last_logits(&self, tokens: &[u32]) -> MlxResult<Vec<f32>> {
        let mut cache = self.new_cache();
        let last = self.last_hidden(tokens, &mut cache)?;
        let logits = self.logits(&last)?.as_type::<f32>()?;
        logits.eval()?;
        Ok(logits.as_slice::<f32>().to_vec())
    }
}

fn unsupported(model_type: &str) -> MlxError {
    MlxError::Config(format!(
        "model_type `{model_type}` is not supported by the MLX backend (supported: {})",
        architectures().collect::<Vec<_>>().join(", ")
    ))
}

/// A digest of config.json and the names and sizes of the weight files.
fn identity(dir: &Path) -> MlxResult<String> {
    let mut h = Sha256::new();
    let config = std::fs::read(dir.join("config.json"))
        .map_err(|e| MlxError::Config(format!("cannot read config.json: {e}")))?;
    h.update(&config);
    for (name, size) in loader::safetensors_sizes(dir)? {
        h.update(name.as_bytes());
        h.update(size.to_le_bytes());
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn describe_config(config: &serde_json::Value) -> MlxResult<ModelInfo> {
    let model_type = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .ok_or_else(|| MlxError::Config("config.json has no model_type".into()))?;
    if !architectures().any(|a| a == model_type) {
        return Err(unsupported(model_type));
    }
    let get = |k: &str| model_config::get_usize(config, k);
    Ok(ModelInfo {
        context_length: get("max_position_embeddings").unwrap_or(4096),
        vocab_size: get("vocab_size")
            .ok_or_else(|| MlxError::Config("config.json has no vocab_size".into()))?,
        hidden_size: get("hidden_size"),
        architecture: model_type.to_string(),
        identity: String::new(),
    })
}
