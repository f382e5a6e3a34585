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

/// What [`MlxModel::read_questions`] reads at a question's last position.
pub struct Reading {
    /// The float32 logits of the ids read.
    pub logits: Vec<f32>,
    /// Their log-probabilities over the vocabulary.
    pub logprobs: Vec<f32>,
    /// The hidden state, when asked.
    pub hidden: Option<Vec<f32>>,
}

/// A pass of question rows in progress ([`MlxModel::begin_rows`]): the
/// question cache so far, each row's last hidden states once its last
/// token is read, and the next column.
pub struct RowPass {
    cache: ModelCache,
    picked: Vec<Option<(Array, Option<Array>)>>,
    start: usize,
    width: usize,
    tap: Option<usize>,
}

impl RowPass {
    /// Each row's final hidden state at its last token (`[B, D]`), block
    /// `tap`'s there, and the question cache, once every column is read.
    pub fn finish(self) -> MlxResult<(LastHidden, ModelCache)> {
        if self.start < self.width {
            return Err(MlxError::Config(
                "a pass was finished before it was read".into(),
            ));
        }
        let picked: Vec<(Array, Option<Array>)> = self.picked.into_iter().flatten().collect();
        let normed: Vec<&Array> = picked.iter().map(|(n, _)| n).collect();
        let normed = ops::concatenate(&normed, 0)?;
        let tap = match self.tap {
            Some(_) => {
                let taps: Vec<&Array> = picked.iter().filter_map(|(_, t)| t.as_ref()).collect();
                Some(ops::concatenate(&taps, 0)?)
            }
            None => None,
        };
        Ok((LastHidden { normed, tap }, self.cache))
    }
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
        let (h, _) = self.arch.hidden(&ids, cache, None)?;
        cache.advance(tokens.len());
        Ok(h)
    }

    /// One pass of questions on a state (`state`, as prefilled): each of
    /// `rows` a continuation of the state, all of them read together as
    /// the rows of one batch on a question cache (the state's keys shared,
    /// never copied per row), right-padded to the longest and run in
    /// column chunks of at most `chunk` tokens. Returns each row's final
    /// hidden state at its last token (`[B, D]`) and block `tap`'s there,
    /// and the question cache after the pass.
    pub fn read_rows(
        &self,
        state: &ModelCache,
        rows: &[&[u32]],
        chunk: usize,
        tap: Option<usize>,
    ) -> MlxResult<(LastHidden, ModelCache)> {
        let mut pass = self.begin_rows(state, rows, tap)?;
        while !self.read_chunk(&mut pass, rows, chunk)? {}
        pass.finish()
    }

    /// A pass of `rows` on `state` ([`MlxModel::read_rows`]) not read yet:
    /// [`MlxModel::read_chunk`] reads it a column chunk at a time, so the
    /// engine thread can take turns between chunks of a long question.
    pub fn begin_rows(
        &self,
        state: &ModelCache,
        rows: &[&[u32]],
        tap: Option<usize>,
    ) -> MlxResult<RowPass> {
        self.check_tap(tap)?;
        if rows.is_empty() || rows.iter().any(|r| r.is_empty()) {
            return Err(MlxError::Config(
                "an empty question has no next token".into(),
            ));
        }
        Ok(RowPass {
            cache: state.for_questions(rows.len())?,
            picked: vec![None; rows.len()],
            start: 0,
            width: rows.iter().map(|r| r.len()).max().unwrap_or(0),
            tap,
        })
    }

    /// Reads the next column chunk (at most `chunk` tokens of every row)
    /// of `pass`, begun on the same `rows`; true once every column is
    /// read. The chunks are the same however many steps they take, so
    /// the answers are the same bits.
    pub fn read_chunk(&self, pass: &mut RowPass, rows: &[&[u32]], chunk: usize) -> MlxResult<bool> {
        let (b, start) = (rows.len(), pass.start);
        if b != pass.picked.len() {
            return Err(MlxError::Config(
                "a pass read on other rows than it began".into(),
            ));
        }
        let cols = chunk.max(1).min(pass.width - start);
        let mut ids = Vec::with_capacity(b * cols);
        for r in rows {
            // Right padding (token 0) past a row's end: no real token
            // of the row attends to it.
            ids.extend((start..start + cols).map(|c| r.get(c).copied().unwrap_or(0)));
        }
        let ids = Array::from_slice(&ids, &[b as i32, cols as i32]);
        let (h, tapped) = self.arch.hidden(&ids, &mut pass.cache, pass.tap)?;
        pass.cache.advance(cols);
        // Each row's last hidden states, picked in the chunk that holds
        // its last token.
        let ending: Vec<(usize, i32)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| (start..start + cols).contains(&(r.len() - 1)))
            .map(|(i, r)| (i, (i * cols + r.len() - 1 - start) as i32))
            .collect();
        if !ending.is_empty() {
            let at: Vec<i32> = ending.iter().map(|&(_, at)| at).collect();
            let at = Array::from_slice(&at, &[at.len() as i32]);
            let pick = |a: &Array| -> MlxResult<Array> {
                let flat = ops::reshape(a, &[(b * cols) as i32, -1])?;
                Ok(ops::indexing::take_axis(&flat, &at, 0)?)
            };
            let normed = pick(&h)?;
            let tapped = tapped.as_ref().map(pick).transpose()?;
            let mut arrays = vec![&normed];
            arrays.extend(tapped.iter());
            mlx_rs::transforms::eval(arrays)?;
            for (n, &(row, _)) in ending.iter().enumerate() {
                let one = Array::from_slice(&[n as i32], &[1]);
                let take =
                    |a: &Array| -> MlxResult<Array> { Ok(ops::indexing::take_axis(a, &one, 0)?) };
                pass.picked[row] = Some((take(&normed)?, tapped.as_ref().map(take).transpose()?));
            }
        }
        pass.cache.eval()?;
        pass.start += cols;
        Ok(pass.start >= pass.width)
    }

    /// `suffix` continuing the state `state` as a question does (a pass of
    /// one row), and the caches after it made whole, so that a completion
    /// continuing a kept prompt reads what a decision's question reads.
    /// Returns the last position's final hidden state (`[1, 1, D]`).
    pub fn continue_state(
        &self,
        state: &ModelCache,
        suffix: &[u32],
        chunk: usize,
    ) -> MlxResult<(Array, ModelCache)> {
        let (last, cache) = self.read_rows(state, &[suffix], chunk, None)?;
        let d = last.normed.shape()[1];
        Ok((ops::reshape(&last.normed, &[1, 1, d])?, cache.merged()?))
    }

    /// Questions on a state, read in one pass ([`MlxModel::read_rows`]):
    /// for each, at its last position, the float32 logits of its ids
    /// `reads[i]` and their log-probabilities over the vocabulary, and
    /// with `hidden` the final norm's output (or block `tap`'s).
    pub fn read_questions(
        &self,
        state: &ModelCache,
        suffixes: &[&[u32]],
        reads: &[&[u32]],
        chunk: usize,
        hidden: bool,
        tap: Option<usize>,
    ) -> MlxResult<Vec<Reading>> {
        let tap = tap.filter(|_| hidden);
        let (last, _) = self.read_rows(state, suffixes, chunk, tap)?;
        self.readings(&last, reads, hidden)
    }

    /// What the rows of a pass read ([`MlxModel::read_rows`]) give at
    /// their last positions: the float32 logits of each row's ids
    /// `reads[i]`, their log-probabilities over the vocabulary, and with
    /// `hidden` the final norm's output (or the tapped block's).
    pub fn readings(
        &self,
        last: &LastHidden,
        reads: &[&[u32]],
        hidden: bool,
    ) -> MlxResult<Vec<Reading>> {
        let logits = self.logits(&last.normed)?.as_type::<f32>()?;
        let v = logits.shape()[1];
        let norm = ops::reshape(&ops::logsumexp_axis(&logits, -1, false)?, &[-1])?;
        // Every row's ids in one gather from the flattened logits.
        let mut at = Vec::new();
        let mut row_of = Vec::new();
        for (r, read) in reads.iter().enumerate() {
            at.extend(read.iter().map(|&t| r as i32 * v + t as i32));
            row_of.extend(std::iter::repeat_n(r as i32, read.len()));
        }
        let count = at.len() as i32;
        let flat = ops::reshape(&logits, &[-1])?;
        let picked = ops::indexing::take_axis(&flat, Array::from_slice(&at, &[count]), 0)?;
        let norms = ops::indexing::take_axis(&norm, Array::from_slice(&row_of, &[count]), 0)?;
        let logprobs = ops::subtract(&picked, &norms)?;
        let hidden = hidden
            .then(|| last.tap.as_ref().unwrap_or(&last.normed).as_type::<f32>())
            .transpose()?;
        let mut arrays = vec![&picked, &logprobs];
        arrays.extend(hidden.iter());
        // The cast, the vocabulary's log-normalisers and the letters' rows.
        let flops = 4.0 * profile::elements(&logits);
        profile::op(Class::Softmax, flops, || {
            mlx_rs::transforms::eval(arrays)?;
            Ok(picked.clone())
        })?;
        Ok(profile::host(Class::Transfers, 0.0, || {
            let (picked, logprobs) = (picked.as_slice::<f32>(), logprobs.as_slice::<f32>());
            let hidden = hidden.as_ref().map(|h| h.as_slice::<f32>());
            let width = hidden.map_or(0, |h| h.len() / reads.len().max(1));
            let mut from = 0;
            reads
                .iter()
                .enumerate()
                .map(|(r, read)| {
                    let span = from..from + read.len();
                    from += read.len();
                    Reading {
                        logits: picked[span.clone()].to_vec(),
                        logprobs: logprobs[span].to_vec(),
                        hidden: hidden.map(|h| h[r * width..(r + 1) * width].to_vec()),
                    }
                })
                .collect()
        }))
    }

    fn check_tap(&self, tap: Option<usize>) -> MlxResult<()> {
        match tap.filter(|&t| t >= self.num_layers()) {
            Some(t) => Err(MlxError::Config(format!(
                "layer {t} does not exist: the model has {} blocks",
                self.num_layers()
            ))),
            None => Ok(()),
        }
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
        self.check_tap(tap)?;
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

    /// A question on a state: a pass of one ([`MlxModel::read_questions`]).
    pub fn read_question(
        &self,
        suffix: &[u32],
        cache: &ModelCache,
        chunk: usize,
        read: &[u32],
        hidden: bool,
        tap: Option<usize>,
    ) -> MlxResult<Reading> {
        let mut out = self.read_questions(cache, &[suffix], &[read], chunk, hidden, tap)?;
        Ok(out.remove(0))
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
