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
//! the rest as a decision's suffix, so a token-id completion of a state
//! and a question gives the same bits as the decision
//! (`docs/design/vllm.md`, parity).

pub mod cache;
pub mod delta;
pub mod gemma4;
pub mod graph;
pub mod host;
pub mod layers;
pub mod llama;
pub mod loader;
pub mod memory;
pub mod profile;
pub mod qwen3_5;
pub mod sample;
pub mod switch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlx_rs::{ops, Array};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::model_config;

use self::cache::ModelCache;
use self::profile::Class;
use self::sample::Rng;
use super::prefix_cache::{PrefixCache, Weighed};
use super::EmbedReceiver;
use super::{
    Capabilities, Engine, EngineError, EngineStatus, FinishReason, GenerateEvent, GenerateRequest,
    GenerateStream, ModelInfo, PadPolicy, QuestionScore, QuestionTokens, ScoreReceiver,
    ScoreRequest, ScoreResult, TokenLogprobs,
};
use crate::metrics::Metrics;

/// Errors of loading or running an MLX model.
#[derive(Debug, thiserror::Error)]
pub enum MlxError {
    #[error("{0}")]
    Config(String),
    #[error("MLX: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
}

pub type MlxResult<T> = Result<T, MlxError>;

/// How weights are held in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Expand quantized matrices into dense ones at load. MLX's CPU backend
    /// multiplies quantized matrices with a kernel of its own, far slower
    /// than an OpenBLAS product on the dense matrix
    /// (runs/2026-11-30_cpu-kernels), so on the CPU the weights are
    /// dequantized once: the same values, more memory. On Metal quantized
    /// kernels are fast and weights stay quantized.
    pub dequantize: bool,
    /// Compute the softmax of attention and the SiLU gate with the host
    /// kernels of [`host`] instead of MLX's ops. MLX's CPU build evaluates
    /// `exp` one element at a time, which made these two steps most of a
    /// question's time; on Metal MLX's own kernels are fast.
    pub host_kernels: bool,
    /// Quantized experts (`gather_qmm`) get their token-expert pairs sorted
    /// by expert from this many pairs on ([`switch::SORT_EXPERTS_FROM`]);
    /// `usize::MAX` never sorts. MLX takes its batched kernel only for
    /// sorted pairs; unsorted, each pair reads its expert's weights again.
    pub sort_experts_from: usize,
    /// Linear attention in MLX ops reads a prompt in blocks of tokens
    /// ([`delta::chunked`]); `false` reads it a token at a time
    /// ([`delta::steps`]), as mlx-lm does. Decoding is a token at a time
    /// either way, and the host kernels have their own loop.
    pub chunked_delta: bool,
}

impl Default for LoadOptions {
    /// The choices for the device MLX computes on, read at run time.
    fn default() -> Self {
        LoadOptions::for_device(Device::current())
    }
}

impl LoadOptions {
    /// On the CPU: dequantized weights and the host kernels; on a GPU
    /// (Metal): neither.
    pub fn for_device(device: Device) -> Self {
        let cpu = device == Device::Cpu;
        LoadOptions {
            dequantize: cpu,
            host_kernels: cpu,
            sort_experts_from: switch::SORT_EXPERTS_FROM,
            chunked_delta: true,
        }
    }
}

/// The kind of device MLX computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

impl Device {
    /// MLX's default device, asked at run time: a GPU with a Metal build on
    /// a Mac whose GPU MLX can use; the CPU with MLX's CPU build, and with a
    /// Metal build that found no usable GPU.
    pub fn current() -> Device {
        match mlx_rs::Device::try_default().and_then(|d| d.get_type()) {
            Ok(mlx_rs::DeviceType::Gpu) => Device::Gpu,
            _ => Device::Cpu,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

/// What the engine asks of an architecture. Each architecture is one file
/// of this module; the engine, the prefix cache and the routes above it see
/// only this.
pub trait Architecture {
    /// Empty caches, one per layer, of the kinds the layers need.
    fn new_cache(&self) -> ModelCache;
    /// Width of the hidden states.
    fn hidden_size(&self) -> usize;
    /// Decoder blocks.
    fn num_layers(&self) -> usize;
    /// Runs `tokens` (`[1, L]`) from position `cache.offset()`, extending
    /// every layer's cache, and returns the final hidden states (after the
    /// last norm) of every position, `[1, L, D]`.
    fn hidden(&self, tokens: &Array, cache: &mut ModelCache) -> MlxResult<Array>;
    /// Like [`Architecture::hidden`] for the last position only (`[1, 1, D]`;
    /// an architecture may skip work no other position needs), and, when
    /// `tap` names a block, that block's output at the last position.
    fn last_hidden(
        &self,
        tokens: &Array,
        cache: &mut ModelCache,
        tap: Option<usize>,
    ) -> MlxResult<LastHidden>;
    /// Logits over the vocabulary for final hidden states.
    fn logits(&self, hidden: &Array) -> MlxResult<Array>;
}

/// The last position's hidden states.
pub struct LastHidden {
    /// After the final norm, `[1, 1, D]`.
    pub normed: Array,
    /// The output of the tapped block, `[1, 1, D]`, when one was asked for.
    pub tap: Option<Array>,
}

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
        let mut last = None;
        for part in tokens.chunks(chunk.max(1)) {
            last = Some(self.last_hidden(part, cache)?);
            if part.len() == chunk {
                cache.eval()?;
            }
        }
        last.ok_or_else(|| MlxError::Config("an empty prompt has no next token".into()))
    }

    /// A question on a state: `suffix` run from `cache` (the state's,
    /// extended), and at its last position the float32 logits of the ids
    /// `read` and their log-probabilities over the vocabulary, and with
    /// `hidden` the final norm's output (or block `tap`'s).
    pub fn read_question(
        &self,
        suffix: &[u32],
        cache: &mut ModelCache,
        read: &[u32],
        hidden: bool,
        tap: Option<usize>,
    ) -> MlxResult<Reading> {
        let taken = self.last_hidden_tap(suffix, cache, tap)?;
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

/// Settings of the engine thread.
#[derive(Clone, Debug)]
pub struct MlxOptions {
    pub load: LoadOptions,
    /// Budget of the prefix cache in MiB (0 turns it off).
    pub prefix_cache_mib: u64,
    pub metrics: Arc<Metrics>,
    /// Jobs that may wait; one more is refused.
    pub max_queue: usize,
    /// Prompt tokens per forward pass while reading a prompt.
    pub prefill_chunk: usize,
    /// Answers remembered with each cached state.
    pub answers_per_state: usize,
    /// How states are padded (`none` unless asked: MLX's cache needs no
    /// blocks; `block` makes prompts equal to a vLLM backend's).
    pub padding: PadPolicy,
}

enum Job {
    Generate {
        request: GenerateRequest,
        events: mpsc::Sender<Result<GenerateEvent, EngineError>>,
    },
    Score {
        request: ScoreRequest,
        reply: oneshot::Sender<Result<ScoreResult, EngineError>>,
    },
    Embed {
        inputs: Vec<Vec<u32>>,
        reply: oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>,
    },
}

/// The model's caches after a state's prefix, as the prefix cache keeps them,
/// with the scores of questions already answered on it.
struct Snapshot {
    cache: ModelCache,
    /// The caches' bytes and room for `answers_per_state` answers.
    bytes: usize,
    answers: Mutex<HashMap<[u8; 32], QuestionScore>>,
}

impl Snapshot {
    fn new(cache: ModelCache, answer_room: usize) -> Self {
        Snapshot {
            bytes: cache.nbytes() + answer_room,
            cache,
            answers: Mutex::new(HashMap::new()),
        }
    }
}

/// What identifies a question's scores on one state: its suffix, the ids
/// read, whether hidden states were asked for and of which block.
fn answer_key(q: &QuestionTokens, hidden: bool, layer: Option<usize>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((q.suffix.len() as u64).to_le_bytes());
    for t in q.suffix.iter().chain(&q.read) {
        h.update(t.to_le_bytes());
    }
    h.update([u8::from(hidden)]);
    if hidden {
        h.update(layer.map_or(u64::MAX, |l| l as u64).to_le_bytes());
    }
    h.finalize().into()
}

// SAFETY: a snapshot holds MLX array handles that are never mutated after
// the snapshot is made (continuing from it clones the handles), and it is
// only created, read and dropped by the engine thread; the prefix cache's
// type bounds need Send + Sync, which MLX arrays do not declare.
unsafe impl Send for Snapshot {}
unsafe impl Sync for Snapshot {}

impl Weighed for Snapshot {
    fn nbytes(&self) -> usize {
        self.bytes
    }
}

/// Prompts whose snapshots are in the prefix cache, by a hash of their
/// token ids, so that a completion finds the longest kept prompt its own
/// starts with. Bounded: the oldest entries are forgotten past
/// [`PromptIndex::CAPACITY`] (their snapshots stay until the cache evicts
/// them); an entry whose snapshot was evicted is simply a miss.
#[derive(Default)]
struct PromptIndex {
    /// (length, hash of the ids) → the snapshot's key in the prefix cache.
    keys: HashMap<(usize, [u8; 32]), super::StateHash>,
    /// How many entries have each length.
    lengths: std::collections::BTreeMap<usize, usize>,
    order: std::collections::VecDeque<(usize, [u8; 32])>,
}

impl PromptIndex {
    const CAPACITY: usize = 4096;

    fn hash(ids: &[u32]) -> [u8; 32] {
        let mut h = Sha256::new();
        for id in ids {
            h.update(id.to_le_bytes());
        }
        h.finalize().into()
    }

    fn record(&mut self, ids: &[u32], key: super::StateHash) {
        let k = (ids.len(), Self::hash(ids));
        if self.keys.insert(k, key).is_some() {
            return;
        }
        *self.lengths.entry(k.0).or_default() += 1;
        self.order.push_back(k);
        while self.order.len() > Self::CAPACITY {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.keys.remove(&old);
            if let Some(n) = self.lengths.get_mut(&old.0) {
                *n -= 1;
                if *n == 0 {
                    self.lengths.remove(&old.0);
                }
            }
        }
    }

    /// Keys of kept prompts that `prompt` strictly extends, longest first.
    fn prefixes_of(&self, prompt: &[u32]) -> Vec<(usize, super::StateHash)> {
        self.lengths
            .range(1..prompt.len())
            .rev()
            .filter_map(|(&len, _)| {
                let key = self.keys.get(&(len, Self::hash(&prompt[..len])))?;
                Some((len, *key))
            })
            .collect()
    }
}

/// The key under which a completion's prompt is kept.
fn prompt_key(ids: &[u32]) -> super::StateHash {
    super::StateHash::new("", "", "completion-prompt", ids)
}

/// The MLX backend behind the [`Engine`] seam.
pub struct MlxEngine {
    info: ModelInfo,
    /// Decoder blocks (`num_hidden_layers` of config.json).
    layers: Option<usize>,
    jobs: mpsc::Sender<Job>,
    depth: Arc<AtomicUsize>,
    status: Arc<Mutex<EngineStatus>>,
    max_queue: usize,
    padding: PadPolicy,
}

impl MlxEngine {
    /// Starts the engine thread, which loads the model and then serves jobs.
    /// Returns at once; [`Engine::status`] says when the model is ready.
    pub fn start(dir: PathBuf, options: MlxOptions) -> MlxResult<Self> {
        let info = MlxModel::describe(&dir)?;
        let layers = model_config::get_usize(&loader::read_config(&dir)?, "num_hidden_layers");
        let max_queue = options.max_queue.max(1);
        let padding = options.padding;
        let (jobs, rx) = mpsc::channel(max_queue);
        let depth = Arc::new(AtomicUsize::new(0));
        let status = Arc::new(Mutex::new(EngineStatus::Loading));
        let (thread_depth, thread_status) = (depth.clone(), status.clone());
        std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || engine_thread(dir, options, rx, thread_depth, thread_status))
            .map_err(|e| MlxError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(MlxEngine {
            info,
            layers,
            jobs,
            depth,
            status,
            max_queue,
            padding,
        })
    }
}

impl MlxEngine {
    fn submit(&self, job: Job) -> Result<(), EngineError> {
        match self.status() {
            EngineStatus::Ready => {}
            EngineStatus::Loading => return Err(EngineError::Loading),
            EngineStatus::Failed(e) => return Err(EngineError::LoadFailed(e)),
            EngineStatus::Unavailable(e) => return Err(EngineError::UpstreamUnavailable(e)),
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        self.jobs.try_send(job).map_err(|e| {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => EngineError::QueueFull(self.max_queue),
                mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
            }
        })
    }
}

impl Engine for MlxEngine {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn status(&self) -> EngineStatus {
        self.status
            .lock()
            .map(|s| s.clone())
            .unwrap_or(EngineStatus::Loading)
    }

    fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateStream, EngineError> {
        let (events, rx) = mpsc::channel(64);
        self.submit(Job::Generate { request, events })?;
        Ok(rx)
    }

    fn score(&self, request: ScoreRequest) -> Result<ScoreReceiver, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Score { request, reply })?;
        Ok(rx)
    }

    fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedReceiver, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Embed { inputs, reply })?;
        Ok(rx)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            padding: self.padding,
            ..Capabilities::default()
        }
    }

    fn hidden_layers(&self) -> Option<usize> {
        self.layers
    }
}

fn engine_thread(
    dir: PathBuf,
    options: MlxOptions,
    mut jobs: mpsc::Receiver<Job>,
    depth: Arc<AtomicUsize>,
    status: Arc<Mutex<EngineStatus>>,
) {
    let set = |s: EngineStatus| {
        if let Ok(mut g) = status.lock() {
            *g = s;
        }
    };
    let started = std::time::Instant::now();
    // The weights must fit the device; MLX's limits follow from them.
    let device = Device::current();
    let limits = loader::weight_bytes(&dir).and_then(|weights| {
        memory::plan(
            device,
            memory::working_set(device),
            weights,
            (options.prefix_cache_mib as usize) << 20,
        )
        .map_err(MlxError::Config)
    });
    match limits.and_then(|l| memory::apply(&l).map(|()| l).map_err(MlxError::from)) {
        Ok(l) => tracing::info!(
            working_set = l.working_set,
            wired = l.wired,
            cache = l.cache,
            "MLX memory limits"
        ),
        Err(e) => {
            tracing::error!("{} cannot be served: {e}", dir.display());
            set(EngineStatus::Failed(e.to_string()));
            return;
        }
    }
    let model = match MlxModel::load_with(&dir, options.load) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("loading {} failed: {e}", dir.display());
            set(EngineStatus::Failed(e.to_string()));
            return;
        }
    };
    if let Err(e) = model.warm_up() {
        tracing::error!("the first pass through {} failed: {e}", dir.display());
        set(EngineStatus::Failed(e.to_string()));
        return;
    }
    let _ = mlx_rs::memory::clear_cache();
    tracing::info!(
        "loaded {} ({}) in {:.1} s, {:.1} MiB held",
        dir.display(),
        model.info.architecture,
        started.elapsed().as_secs_f64(),
        mlx_rs::memory::active_memory().unwrap_or(0) as f64 / (1u64 << 20) as f64
    );
    export_memory(&options.metrics);
    set(EngineStatus::Ready);
    let prefix_cache: PrefixCache<Snapshot> =
        PrefixCache::new(options.prefix_cache_mib, options.metrics.clone());
    let mut prompts = PromptIndex::default();
    while let Some(job) = jobs.blocking_recv() {
        match job {
            Job::Generate { request, events } => {
                let kept = Kept {
                    cache: &prefix_cache,
                    index: &mut prompts,
                };
                if let Err(e) = generate(&model, &options, kept, &request, &events) {
                    let _ = events.blocking_send(Err(EngineError::Model(e.to_string())));
                }
            }
            Job::Score { request, reply } => {
                if !reply.is_closed() {
                    let result = score(&model, &options, &prefix_cache, &request)
                        .map_err(|e| EngineError::Model(e.to_string()));
                    if request.cache
                        && result.is_ok()
                        && prefix_cache.peek(&request.state).is_some()
                    {
                        prompts.record(&request.prefix, request.state);
                    }
                    let _ = reply.send(result);
                }
            }
            Job::Embed { inputs, reply } => {
                if !reply.is_closed() {
                    let mut out = Vec::with_capacity(inputs.len());
                    let mut failed = None;
                    for ids in &inputs {
                        let kept = Kept {
                            cache: &prefix_cache,
                            index: &mut prompts,
                        };
                        match embed_one(&model, &options, kept, ids) {
                            Ok(v) => out.push(v),
                            Err(e) => {
                                failed = Some(EngineError::Model(e.to_string()));
                                break;
                            }
                        }
                    }
                    let _ = reply.send(match failed {
                        Some(e) => Err(e),
                        None => Ok(out),
                    });
                }
            }
        }
        depth.fetch_sub(1, Ordering::Relaxed);
        export_memory(&options.metrics);
    }
}

/// MLX's memory figures as the `decisio_mlx_memory_bytes` gauges
/// (`memory.rs` says what bounds them).
fn export_memory(metrics: &Metrics) {
    use mlx_rs::memory;
    for (kind, bytes) in [
        ("active", memory::active_memory()),
        ("peak", memory::peak_memory()),
        ("cache", memory::cache_memory()),
    ] {
        if let Ok(b) = bytes {
            metrics
                .mlx_memory_bytes
                .with_label_values(&[kind])
                .set(b as i64);
        }
    }
}

/// The state after `request.prefix`, from the prefix cache or computed (and
/// offered to the cache), then each question as its own continuation of it.
fn score(
    model: &MlxModel,
    options: &MlxOptions,
    prefix_cache: &PrefixCache<Snapshot>,
    request: &ScoreRequest,
) -> MlxResult<ScoreResult> {
    let found = if request.cache {
        prefix_cache.get(&request.state)
    } else {
        None
    };
    let (snapshot, cached, new_state_seconds) = match found {
        Some(snapshot) => (snapshot, true, None),
        None => {
            let started = Instant::now();
            let mut cache = model.new_cache();
            model.prefill(&request.prefix, &mut cache, options.prefill_chunk)?;
            cache.eval()?;
            // The prefill's scratch buffers go back to the system, not to
            // MLX's cache (src/engine/mlx/memory.rs).
            let _ = mlx_rs::memory::clear_cache();
            let seconds = started.elapsed().as_secs_f64();
            let room = options.answers_per_state * answer_bytes(model, request);
            let snapshot = Arc::new(Snapshot::new(cache, room));
            if request.cache {
                options.metrics.new_state_seconds.observe(seconds);
                prefix_cache.insert(request.state, snapshot.clone());
            }
            (snapshot, false, Some(seconds))
        }
    };
    let mut questions = Vec::with_capacity(request.questions.len());
    for q in &request.questions {
        let key = answer_key(q, request.hidden, request.hidden_layer);
        if let Some(known) = lock(&snapshot.answers).get(&key) {
            questions.push(QuestionScore {
                seconds: 0.0,
                memoised: true,
                ..known.clone()
            });
            continue;
        }
        let started = Instant::now();
        let mut cache = snapshot.cache.clone();
        let tap = request.hidden_layer.filter(|_| request.hidden);
        let reading = model.read_question(&q.suffix, &mut cache, &q.read, request.hidden, tap)?;
        let score = QuestionScore {
            logits: reading.logits,
            logprobs: reading.logprobs,
            hidden: reading.hidden,
            seconds: started.elapsed().as_secs_f64(),
            memoised: false,
        };
        let mut answers = lock(&snapshot.answers);
        if answers.len() < options.answers_per_state {
            answers.insert(key, score.clone());
        }
        drop(answers);
        questions.push(score);
    }
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions,
    })
}

/// The final norm's output at the last position of `ids`, as float32: the
/// prompt is continued from the longest kept prompt it extends (as a
/// decision's question continues its state) or prefilled from position 0
/// and kept (as a decision prefills its state), so that the embedding of a
/// state and then of the state and a question gives the bits of the
/// decision's hidden state.
fn embed_one(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    ids: &[u32],
) -> MlxResult<Vec<f32>> {
    let (last, _) = prefill_prompt(model, options, kept, ids)?;
    let v = ops::reshape(last.as_type::<f32>()?, &[-1])?;
    v.eval()?;
    Ok(v.as_slice::<f32>().to_vec())
}

/// Room one remembered answer takes: the logits and log-probabilities of
/// the ids read (26 letters, or more if a request reads more), a hidden
/// state, the key and the map's own share.
fn answer_bytes(model: &MlxModel, request: &ScoreRequest) -> usize {
    let read = request
        .questions
        .iter()
        .map(|q| q.read.len())
        .max()
        .unwrap_or(0);
    read.max(26) * 8 + model.hidden_size() * 4 + 32 + 128
}

/// The guarded value, also after a panic elsewhere (the data stays valid:
/// every writer inserts whole entries).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies a `[.., V]` float32 array with one row out to the host.
fn host_row(a: &Array) -> MlxResult<Vec<f32>> {
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

/// The prefix cache and its index of prompts, for the generate path.
struct Kept<'a> {
    cache: &'a PrefixCache<Snapshot>,
    index: &'a mut PromptIndex,
}

/// The last hidden state of `prompt` and the caches after it: continued
/// from the longest kept prompt it extends (its rest run as a decision runs
/// a question's suffix), else prefilled from position 0 as a decision
/// prefills a state and then kept for later prompts.
fn prefill_prompt(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    prompt: &[u32],
) -> MlxResult<(Array, ModelCache)> {
    for (len, key) in kept.index.prefixes_of(prompt) {
        if let Some(snapshot) = kept.cache.peek(&key) {
            tracing::debug!(
                "completion of {} tokens continues a kept prompt of {len}",
                prompt.len()
            );
            let mut cache = snapshot.cache.clone();
            // In one pass, as a decision runs a question's suffix (whatever
            // its length: both are bounded by the context length).
            let last = model.last_hidden(&prompt[len..], &mut cache)?;
            return Ok((last, cache));
        }
    }
    tracing::debug!("completion of {} tokens: no kept prompt", prompt.len());
    let mut cache = model.new_cache();
    let last = model.prefill(prompt, &mut cache, options.prefill_chunk)?;
    cache.eval()?;
    if kept.cache.enabled() {
        let key = prompt_key(prompt);
        if kept
            .cache
            .insert(key, Arc::new(Snapshot::new(cache.clone(), 0)))
        {
            kept.index.record(prompt, key);
        }
    }
    Ok((last, cache))
}

fn generate(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    request: &GenerateRequest,
    events: &mpsc::Sender<Result<GenerateEvent, EngineError>>,
) -> MlxResult<()> {
    let send = |e: GenerateEvent| events.blocking_send(Ok(e)).is_ok();
    let (mut hidden, mut cache) = if let Some(k) = request.prompt_logprobs {
        let mut cache = model.new_cache();
        let (last, lps) = prompt_logprobs(model, &request.prompt, &mut cache, k, options)?;
        if !send(GenerateEvent::Prompt(lps)) {
            return Ok(());
        }
        (last, cache)
    } else {
        prefill_prompt(model, options, kept, &request.prompt)?
    };
    let mut rng = request
        .sampling
        .seed
        .map_or_else(Rng::from_entropy, Rng::new);
    for step in 0..request.max_tokens {
        if events.is_closed() {
            return Ok(());
        }
        let row = host_row(&model.log_softmax(&hidden)?)?;
        let token = sample::pick(&row, &request.sampling, &mut rng);
        if request.stop_token_ids.contains(&token) {
            send(GenerateEvent::Finished(FinishReason::Stop));
            return Ok(());
        }
        let logprobs = request.logprobs.map(|k| {
            if request.logprob_token_ids.is_empty() {
                sample::token_logprobs(&row, token, k)
            } else {
                sample::named_logprobs(&row, token, &request.logprob_token_ids)
            }
        });
        if !send(GenerateEvent::Token {
            id: token,
            logprobs,
        }) {
            return Ok(());
        }
        if step + 1 < request.max_tokens {
            hidden = model.last_hidden(&[token], &mut cache)?;
        }
    }
    send(GenerateEvent::Finished(FinishReason::Length));
    Ok(())
}

/// Reads the prompt in chunks, recording each token's log-probability given
/// the tokens before it, and returns the last hidden state.
fn prompt_logprobs(
    model: &MlxModel,
    prompt: &[u32],
    cache: &mut ModelCache,
    k: usize,
    options: &MlxOptions,
) -> MlxResult<(Array, Vec<Option<TokenLogprobs>>)> {
    let mut out: Vec<Option<TokenLogprobs>> = vec![None];
    let mut last = None;
    let chunk = options.prefill_chunk.clamp(1, 256);
    for (c, part) in prompt.chunks(chunk).enumerate() {
        let h = model.hidden(part, cache)?;
        let lp = model.log_softmax(&h)?;
        lp.eval()?;
        let v = lp.shape()[2] as usize;
        let rows = lp.as_slice::<f32>();
        for (i, row) in rows.chunks(v).enumerate() {
            let next = c * chunk + i + 1;
            if let Some(&token) = prompt.get(next) {
                out.push(Some(sample::token_logprobs(row, token, k)));
            }
        }
        let n = h.shape()[1];
        last = Some(ops::indexing::take_axis(
            &h,
            Array::from_slice(&[n - 1], &[1]),
            1,
        )?);
        cache.eval()?;
    }
    let last = last.ok_or_else(|| MlxError::Config("an empty prompt has no next token".into()))?;
    Ok((last, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_device_mlx_computes_on() {
        let cpu = LoadOptions::for_device(Device::Cpu);
        assert!(cpu.dequantize && cpu.host_kernels);
        let gpu = LoadOptions::for_device(Device::Gpu);
        assert!(!gpu.dequantize && !gpu.host_kernels);
        assert_eq!(
            LoadOptions::default(),
            LoadOptions::for_device(Device::current())
        );
        // MLX's CPU build (Linux) has no other device.
        if cfg!(not(target_os = "macos")) {
            assert_eq!(Device::current(), Device::Cpu);
        }
    }
}
