//! The engine seam: what the text route asks of a backend, and the backends.
//!
//! A backend owns a model and runs jobs on it: generate tokens from a prompt
//! of token ids (with per-token log-probabilities when asked). The route
//! builds prompts and reads results; it never sees MLX arrays or HTTP.
//!
//! [`mlx`] runs a local MLX model on a thread of its own behind a bounded
//! queue; [`vllm`] fronts one or more vLLM servers over HTTP.

pub mod mlx;
pub mod prefix_cache;
pub mod vllm;

use tokio::sync::{mpsc, oneshot};

pub use prefix_cache::StateHash;

/// What a backend serves.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The longest prompt plus completion, in tokens.
    pub context_length: usize,
    /// Rows of the output projection.
    pub vocab_size: usize,
    /// The width of the hidden states (`hidden_size` of config.json), the
    /// embeddings' dimensions; `None` where config.json does not say.
    pub hidden_size: Option<usize>,
    /// The architecture (`model_type` of config.json).
    pub architecture: String,
    /// What identifies the weights (a digest of config.json and the weight
    /// files' names and sizes); part of every state hash.
    pub identity: String,
}

/// A scoring job: a shared prefix (the state) and questions, each its own
/// continuation of the prefix, read at the position after its last token.
#[derive(Clone, Debug)]
pub struct ScoreRequest {
    pub state: StateHash,
    pub prefix: Vec<u32>,
    pub questions: Vec<QuestionTokens>,
    /// Also return each answer position's hidden state: the final norm's
    /// output, or block `hidden_layer`'s when that is set.
    pub hidden: bool,
    /// The block whose output `hidden` returns (`None`: the final norm's);
    /// below [`Engine::hidden_layers`].
    pub hidden_layer: Option<usize>,
    /// How the questions share the prefix (one of [`Capabilities::modes`]).
    pub mode: MultiQuestion,
    /// Look the state up in the prefix cache and keep it there. Off for
    /// work that must not displace serving states (task registration);
    /// the answers are the same bits either way.
    pub cache: bool,
    /// The one prompt of [`MultiQuestion::Packed`] (set by the route in that
    /// mode only; each question's `suffix` is then empty and its `read`
    /// holds the letters as they follow `N: ` in the answer sheet).
    pub packed: Option<PackedPrompt>,
}

/// All questions of a packed request in one prompt, answered in one
/// generation as an answer sheet of one line per question, `N: LETTER`
/// (`docs/design/vllm.md`, "Packed questions").
#[derive(Clone, Debug)]
pub struct PackedPrompt {
    /// The whole prompt: the prefix (the state), then every question and
    /// the instruction, through the chat template's generation cue, and
    /// the answer sheet's first marker `1:`.
    pub prompt: Vec<u32>,
    /// Per question, the tokens that introduce its answer in the sheet
    /// (`N:`); the answer's letters are read at the position right after.
    /// The first is empty: the prompt ends with the first line's `1:`.
    pub markers: Vec<Vec<u32>>,
    /// The tokens between one answer's letter and the next marker (`\n`).
    pub separator: Vec<u32>,
    /// The most tokens the generation may take: every marker, separator
    /// and one letter per question, and one more for the end of the sheet.
    pub max_tokens: usize,
}

/// How several questions on one state are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultiQuestion {
    /// Each question is its own continuation of the prefix, one after another.
    Sequential,
    /// The questions run at once on the shared prefix, computed once (the
    /// vLLM backend: one upstream request of a list of prompts).
    Warm,
    /// All questions in one prompt, answered in one generation, each
    /// answer's letters read at its own position (the vLLM backend).
    Packed,
}

impl MultiQuestion {
    pub fn as_str(self) -> &'static str {
        match self {
            MultiQuestion::Sequential => "sequential",
            MultiQuestion::Warm => "warm",
            MultiQuestion::Packed => "packed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "sequential" => MultiQuestion::Sequential,
            "warm" => MultiQuestion::Warm,
            "packed" => MultiQuestion::Packed,
            _ => return None,
        })
    }
}

/// What a backend offers the route beyond [`ModelInfo`].
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// The multi-question modes it runs; the first is its default.
    pub modes: Vec<MultiQuestion>,
    /// The backend's name in error messages (`MLX`, `vLLM`).
    pub name: &'static str,
    /// Why chat completions with image content parts are refused, or
    /// `None` where they are passed through ([`Engine::chat_passthrough`]).
    pub image_refusal: Option<String>,
    /// Hidden states of whole prompts are served ([`Engine::embed`]).
    pub embeddings: bool,
    /// Where the backend returns no hidden states: what would make it
    /// return them, appended to the refusals of intent tasks and
    /// embeddings (empty when nothing would).
    pub hidden_hint: &'static str,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            modes: vec![MultiQuestion::Sequential],
            name: "MLX",
            image_refusal: Some(
                "image content parts are not supported by the MLX backend; the image route is \
                 served through the vLLM backend"
                    .into(),
            ),
            embeddings: true,
            hidden_hint: "",
        }
    }
}

#[derive(Clone, Debug)]
pub struct QuestionTokens {
    pub suffix: Vec<u32>,
    /// Token ids whose next-token logits are read (the option letters).
    pub read: Vec<u32>,
}

/// What a scoring job found.
#[derive(Clone, Debug)]
pub struct ScoreResult {
    /// The state came from the prefix cache.
    pub cached: bool,
    /// Seconds spent computing the state when it was not cached.
    pub new_state_seconds: Option<f64>,
    pub questions: Vec<QuestionScore>,
}

#[derive(Clone, Debug)]
pub struct QuestionScore {
    /// Next-token logits of the `read` ids, as float32.
    pub logits: Vec<f32>,
    /// The same ids' log-probabilities over the whole vocabulary.
    pub logprobs: Vec<f32>,
    pub hidden: Option<Vec<f32>>,
    /// Seconds spent on this question (its suffix and readout).
    pub seconds: f64,
    /// The same question was answered on this state before and its scores
    /// were remembered (no token of the suffix was run).
    pub memoised: bool,
}

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 picks the most likely token (greedy); otherwise logits are divided
    /// by it before sampling.
    pub temperature: f32,
    /// Nucleus sampling: only the smallest set of tokens whose probability
    /// adds up to `top_p` is drawn from.
    pub top_p: f32,
    /// Seed of the draw; the same seed and prompt give the same tokens.
    pub seed: Option<u64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            seed: None,
        }
    }
}

/// A generation job.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    /// At most this many new tokens.
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Report each generated token's log-probability and this many
    /// alternatives (0: the token's own only); `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability and this many alternatives
    /// (for completions with `echo`); `None`: not computed.
    pub prompt_logprobs: Option<usize>,
    /// Tokens that end the generation: the one drawn is reported as
    /// [`GenerateEvent::StopToken`] (counted, with its log-probabilities,
    /// never turned into text), as vLLM reports it.
    pub stop_token_ids: Vec<u32>,
    /// When not empty, each generated token's alternatives are these ids
    /// (in this order) instead of the `logprobs` most likely ones (vLLM's
    /// `logprob_token_ids`).
    pub logprob_token_ids: Vec<u32>,
}

/// A token's log-probability and the most likely alternatives at its
/// position, in descending order (ties by lower token id).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token (or, decided by the route, a stop string).
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What a generation job reports, in order: the prompt's log-probabilities
/// if asked, each token, then the end.
#[derive(Clone, Debug)]
pub enum GenerateEvent {
    /// One entry per prompt token; the first is `None` (nothing precedes it).
    Prompt(Vec<Option<TokenLogprobs>>),
    Token {
        id: u32,
        logprobs: Option<TokenLogprobs>,
    },
    /// The stop token that ended the generation, with its
    /// log-probabilities when asked: a generated token (counted, listed in
    /// log-probabilities) that adds no text, as vLLM keeps it in a
    /// completion's token ids but not in its text
    /// (`vllm/v1/engine/detokenizer.py`). `Finished(Stop)` follows.
    StopToken {
        id: u32,
        logprobs: Option<TokenLogprobs>,
    },
    Finished(FinishReason),
}

/// The events of one job. Dropping the receiver cancels the job.
pub type GenerateStream = mpsc::Receiver<Result<GenerateEvent, EngineError>>;

#[derive(Clone, Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the request queue is full ({0} jobs waiting); retry later or raise --max-queue")]
    QueueFull(usize),
    #[error("the model is still loading; retry once GET /health answers 200")]
    Loading,
    #[error("the model failed to load: {0}")]
    LoadFailed(String),
    #[error("the engine has stopped")]
    Stopped,
    /// A fault of the server or of the model's computation (a bug, or an
    /// MLX exception other than an allocation failure): the server's fault.
    #[error("model error: {0}")]
    Model(String),
    /// The computation could not allocate the memory it needed
    /// ([`EngineError::computation`]): it passes as other requests finish.
    #[error(
        "the server ran out of memory for this request ({0}); retry later, or send a shorter \
         state or fewer questions"
    )]
    OutOfMemory(String),
    /// The request asks for something this backend does not serve
    /// (embeddings, image parts or hidden states where it has none): the
    /// request's fault, never retried.
    #[error("{0}")]
    Unsupported(String),
    /// No upstream server could take the request (all ejected, refused, or
    /// answering 503): the client may retry.
    #[error("{0}")]
    UpstreamUnavailable(String),
    /// An upstream server did not answer within its timeout.
    #[error("{0}")]
    UpstreamTimeout(String),
    /// An upstream server answered with an error or with a body that is not
    /// what its protocol promises; the message carries the upstream's own.
    #[error("{0}")]
    Upstream(String),
    /// An upstream server refused the request for what it asks (a 4xx
    /// other than 429: a field over one of its limits, a prompt it cannot
    /// take): the request's fault, never retried, and it would be refused
    /// alike on every upstream. The message carries the upstream's own.
    #[error("{0}")]
    UpstreamRefused(String),
    /// The backend waits for its servers to come up ([`EngineStatus::Waiting`]);
    /// the message says which.
    #[error("{0}")]
    Waiting(String),
}

impl EngineError {
    /// The error passes with time (the queue full, the model loading or
    /// out of memory, the servers not up): a client, or a worker, retries.
    /// The HTTP layer answers these with 503.
    pub fn passes(&self) -> bool {
        matches!(
            self,
            EngineError::QueueFull(_)
                | EngineError::Loading
                | EngineError::LoadFailed(_)
                | EngineError::Stopped
                | EngineError::OutOfMemory(_)
                | EngineError::UpstreamUnavailable(_)
                | EngineError::Waiting(_)
        )
    }

    /// The server's fault (or its upstream's), not the request's: the
    /// errors that pass, the model's faults and the upstreams' failures.
    pub fn servers_fault(&self) -> bool {
        !matches!(
            self,
            EngineError::Unsupported(_) | EngineError::UpstreamRefused(_)
        )
    }

    /// An error of the model's computation: [`EngineError::OutOfMemory`]
    /// where it is an allocation failure, as MLX words them (`[malloc]
    /// Unable to allocate N bytes.` of its allocator, `[metal::malloc]` of
    /// Metal's, or a C++ `std::bad_alloc`), else [`EngineError::Model`].
    pub fn computation(message: String) -> Self {
        let allocation = ["Unable to allocate", "[metal::malloc]", "bad_alloc"];
        if allocation.iter().any(|a| message.contains(a)) {
            EngineError::OutOfMemory(message)
        } else {
            EngineError::Model(message)
        }
    }
}

/// The message a caught panic carries (`panic!` with a literal or a
/// formatted message), for the log and the 500 that answer it.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// The error a job gets when its work panicked: the server's fault,
/// logged with the panic's message (both backends).
pub fn panicked(panic: &(dyn std::any::Any + Send)) -> EngineError {
    let message = panic_message(panic);
    tracing::error!(
        "a job's work panicked: {message}; its clients get a 500, the engine serves on"
    );
    EngineError::Model(format!(
        "the engine failed on this request ({message}); the server logged it and serves on"
    ))
}

/// Whether a backend can take jobs.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineStatus {
    Loading,
    Ready,
    Failed(String),
    /// Loaded, but nothing can serve now (the vLLM backend with every
    /// upstream ejected); it may recover by itself.
    Unavailable(String),
    /// Started, but waiting for the servers it fronts to come up (the vLLM
    /// backend before an upstream passed its start-up probe): what it
    /// serves is not known yet, and no job is taken.
    Waiting(Waiting),
}

/// What a backend waits for before it can serve.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Waiting {
    /// One line for people: what is waited for, for how long, the last
    /// errors.
    pub message: String,
    /// When the wait began, in Unix seconds.
    pub since: u64,
    /// Seconds waited so far.
    pub waited_s: f64,
    /// Seconds after which the process gives up and exits; `None`: never.
    pub limit_s: Option<f64>,
    /// Every server the backend fronts, admitted or not.
    pub upstreams: Vec<WaitingFor>,
}

/// One server a backend waits for (or no longer waits for).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WaitingFor {
    pub url: String,
    /// What it serves the backend: `upstream`, `head upstream`.
    pub role: &'static str,
    /// It passed its probe and takes jobs.
    pub admitted: bool,
    /// Probes tried so far.
    pub probes: u32,
    /// Why its last probe failed.
    pub last_error: Option<String>,
}

/// The seam between the route and a backend.
pub trait Engine: Send + Sync + 'static {
    fn info(&self) -> &ModelInfo;
    fn status(&self) -> EngineStatus;
    /// Jobs waiting or running.
    fn queue_depth(&self) -> usize;
    /// Queues a generation job; fails at once when the queue is full or the
    /// model is not ready.
    fn generate(&self, request: GenerateRequest) -> Result<GenerateStream, EngineError>;
    /// Queues a scoring job, likewise.
    fn score(&self, request: ScoreRequest) -> Result<ScoreReceiver, EngineError>;
    /// Multi-question modes and padding; the default is the MLX backend's.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// The decoder blocks a scoring job can tap for hidden states; `None`
    /// when the backend returns no hidden states (intent tasks are then
    /// refused); `Some(0)` when it returns the final norm's output only
    /// (no block can be tapped: `head.layer` other than -1 is refused).
    fn hidden_layers(&self) -> Option<usize> {
        None
    }

    /// Hidden states of whole prompts of token ids: for each input, the
    /// final norm's output at its last position, as float32 and not
    /// normalised. It is computed as a decision computes its answer
    /// position: a prompt that extends a prompt the backend keeps (a
    /// decision's state, a completion's or an embedding's prompt) continues
    /// from it, so the embedding of a state and then of the state and a
    /// question gives the same bits as the decision's hidden state. Served
    /// where [`Capabilities::embeddings`] says so.
    fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedReceiver, EngineError> {
        let _ = inputs;
        Err(EngineError::Unsupported(
            "embeddings are not served by this backend".into(),
        ))
    }

    /// Sends a chat completion body as it is (image content parts included)
    /// to the backend's own chat route and answers it whole. Served only
    /// where [`Capabilities::image_refusal`] is `None`.
    fn chat_passthrough(&self, body: serde_json::Value) -> Result<ChatReceiver, EngineError> {
        let _ = body;
        Err(EngineError::Unsupported(
            "image content parts are not served by this backend".into(),
        ))
    }
}

pub type ChatReceiver = oneshot::Receiver<Result<serde_json::Value, EngineError>>;

pub type ScoreReceiver = oneshot::Receiver<Result<ScoreResult, EngineError>>;

/// The hidden states of an [`Engine::embed`] job, one per input, in order.
pub type EmbedReceiver = oneshot::Receiver<Result<Vec<Vec<f32>>, EngineError>>;
