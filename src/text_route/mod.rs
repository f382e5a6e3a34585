//! The text route: from what a client asked to engine jobs and back.
//!
//! It renders chat messages with the model's template, tokenizes, checks the
//! context length, queues a generation job on the engine, and turns the
//! engine's tokens into text (stop strings, incremental detokenization,
//! log-probabilities with their token texts). It knows nothing of HTTP: the
//! server maps [`RouteError`] to statuses and [`Output`] to OpenAI shapes.
//!
//! `decide/` answers decisions (lettered questions about a state); `wire`
//! holds the System One wire's prompt layout, which decisions asked on
//! `POST /v1/systemone` use; `generate` streams text generations.

pub mod decide;
mod generate;
pub mod header_limit;
pub mod over_limit;
pub mod systemone;

use std::sync::Arc;

use serde_json::{Map, Value};

/// The engine's words the layers above use: they reach the backend only
/// through the route (`scripts/check_layers.py` checks it).
pub use crate::engine::{panic_message, EngineError, EngineStatus, MultiQuestion, Sampling};
pub use decide::{Answer, Decision, PadPolicy, Question, State};
pub use generate::{GenerationStream, Output, TokenChoice, TokenOutput};

use crate::bases::{self, Base};
use crate::engine::{
    Capabilities, ChatReceiver, EmbedReceiver, Engine, GenerateRequest, ModelInfo,
};
use crate::metrics::Metrics;
use crate::prompt::{ChatTemplate, TextTokenizer};
use crate::settings::Limits;
use systemone::WireSettings;

/// Why the route could not serve a request.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The request is malformed or out of range; `param` names the field.
    #[error("{message}")]
    Invalid {
        message: String,
        param: Option<String>,
    },
    /// Prompt plus completion do not fit the model's context; `param` is
    /// the field to change.
    #[error("{message}")]
    ContextLength {
        message: String,
        param: &'static str,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl RouteError {
    /// The error passes with time ([`EngineError::passes`]).
    pub fn passes(&self) -> bool {
        matches!(self, RouteError::Engine(e) if e.passes())
    }

    /// The server's fault rather than the request's
    /// ([`EngineError::servers_fault`]).
    pub fn servers_fault(&self) -> bool {
        matches!(self, RouteError::Engine(e) if e.servers_fault())
    }

    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        RouteError::Invalid {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }
}

/// What to generate, after the prompt.
#[derive(Clone, Debug)]
pub struct GenerationParams {
    /// `None`: up to the end of the context.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    /// Alternatives per generated token; `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// Alternatives per prompt token (completions with `echo`).
    pub prompt_logprobs: Option<usize>,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Report these ids' log-probabilities at each generated token instead
    /// of the most likely ones (vLLM's `logprob_token_ids`).
    pub logprob_token_ids: Vec<u32>,
    /// The request field that carries the prompt, named in errors.
    pub prompt_field: &'static str,
}

/// What the route needs besides the engine and the prompt tools.
pub struct RouteConfig {
    /// Tokens that end a generation (the model's end-of-sequence tokens).
    pub stop_token_ids: Vec<u32>,
    pub limits: Limits,
    /// The served model's name (the `model` label of metrics).
    pub model_name: String,
    /// A digest of the tokenizer's files; part of every state hash.
    pub tokenizer_identity: String,
    /// The letter temperature when neither the request nor a task sets one.
    pub default_temperature: f64,
    /// The production base served, if the model is one.
    pub base: Option<&'static Base>,
    /// How System One questions are asked: the base's settings
    /// ([`WireSettings::SERVED`] for a model of no base), as the serve
    /// flags may change them.
    pub wire: WireSettings,
    /// How states are padded (`--pad-policy`, `--pad-block`, the base's
    /// block), the same on every backend.
    pub padding: PadPolicy,
    pub metrics: Arc<Metrics>,
}

/// The route over one model.
pub struct TextRoute {
    engine: Arc<dyn Engine>,
    pub tokenizer: TextTokenizer,
    pub template: ChatTemplate,
    pub stop_token_ids: Vec<u32>,
    pub limits: Limits,
    pub model_name: String,
    pub tokenizer_identity: String,
    pub default_temperature: f64,
    pub base: Option<&'static Base>,
    pub metrics: Arc<Metrics>,
    /// The letter codes of decisio's own layout with their token ids: `A`
    /// to `Z` (each checked at start to be one token), then `AA`, `AB`, ...
    /// where the bare code is one token, up to 255
    /// ([`systemone::one_token_codes`]).
    pub letter_codes: Vec<(String, u32)>,
    /// The filler token that pads states to a block boundary, when the
    /// tokenizer has one (see [`decide::PAD_TEXT`]).
    pub pad_id: Option<u32>,
    /// How states are padded.
    pub padding: PadPolicy,
    /// Token ids of ` A`..` Z` (the letters after `N: ` in a packed answer
    /// sheet), when each is one token.
    pub packed_letter_ids: Option<Vec<u32>>,
    /// The System One wire's letter codes with their token ids (` A` ...,
    /// ` AA` ..., up to 255; [`systemone::letter_codes`]).
    pub wire_codes: Vec<(String, u32)>,
    /// The token ids `yes` and `no` are read from under the base's prompt
    /// format ([`systemone::label_forms`]: ` yes` and ` no` under the reference's
    /// served one), when each has them (a yes/no question asked in words
    /// reads them).
    pub yes_no_forms: Option<[Vec<u32>; 2]>,
    /// Under summed label forms, the token ids each of [`Self::wire_codes`]
    /// is read from ([`systemone::label_forms`]), in the same order; empty
    /// otherwise.
    pub wire_forms: Vec<Vec<u32>>,
    /// How System One questions are asked on this base.
    pub wire: WireSettings,
    /// The token counts of recent states' texts, by their digest
    /// ([`TextRoute::count_state_tokens`]).
    state_counts: moka::sync::Cache<[u8; 32], usize>,
}

/// States whose token counts are remembered.
const STATE_COUNTS: u64 = 4096;

impl TextRoute {
    /// Fails when an option letter is not a single token of the tokenizer.
    pub fn new(
        engine: Arc<dyn Engine>,
        tokenizer: TextTokenizer,
        template: ChatTemplate,
        config: RouteConfig,
    ) -> Result<Self, String> {
        let letter_ids = Self::letter_ids(&tokenizer)?;
        let letter_codes = systemone::one_token_codes(&tokenizer, "");
        debug_assert!(letter_codes
            .iter()
            .map(|(_, id)| *id)
            .take(26)
            .eq(letter_ids));
        let pad_id = match tokenizer.encode(decide::PAD_TEXT, false) {
            Ok(ids) if ids.len() == 1 => Some(ids[0]),
            _ => None,
        };
        if pad_id.is_none() && config.padding != PadPolicy::None {
            return Err(
                "this tokenizer writes no newline as one token, so states cannot be \
                 front-padded to a block; serve with --pad-policy none"
                    .into(),
            );
        }
        let packed_letter_ids = decide::LETTERS
            .iter()
            .map(|l| match tokenizer.encode(&format!(" {l}"), false) {
                Ok(ids) if ids.len() == 1 => Some(ids[0]),
                _ => None,
            })
            .collect();
        let settings = config.wire;
        let format = settings.format;
        let yes_no_forms = systemone::label_forms(&tokenizer, "yes", &format)
            .zip(systemone::label_forms(&tokenizer, "no", &format))
            .map(|(y, n)| [y, n]);
        let wire_codes = systemone::letter_codes(&tokenizer);
        let wire_forms = match format.variants {
            systemone::LabelVariants::Single => Vec::new(),
            systemone::LabelVariants::Summed => wire_codes
                .iter()
                .map(|(code, id)| {
                    systemone::label_forms(&tokenizer, code, &format).unwrap_or_else(|| vec![*id])
                })
                .collect(),
        };
        if wire_codes.len() < systemone::MAX_LABELS {
            tracing::warn!(
                "this tokenizer writes {} letter codes (` A`, ` B`, ...) as one token each, so \
                 System One choices take at most that many options here, not {}",
                wire_codes.len(),
                systemone::MAX_LABELS
            );
        }
        Ok(TextRoute {
            pad_id,
            padding: config.padding,
            packed_letter_ids,
            wire_codes,
            yes_no_forms,
            wire_forms,
            wire: settings,
            engine,
            tokenizer,
            template,
            stop_token_ids: config.stop_token_ids,
            limits: config.limits,
            model_name: config.model_name,
            tokenizer_identity: config.tokenizer_identity,
            default_temperature: config.default_temperature,
            base: config.base,
            metrics: config.metrics,
            letter_codes,
            state_counts: moka::sync::Cache::new(STATE_COUNTS),
        })
    }

    /// The warning for a state longer than the base is documented for,
    /// also written to the log.
    pub fn long_state_warning(&self, tokens: usize) -> Option<String> {
        let warning = bases::long_state_warning(self.base?, tokens)?;
        tracing::warn!("{warning}");
        Some(warning)
    }

    /// The backend, for the route's own rooms only: the layers above ask
    /// the route (the methods below), never the engine.
    fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }

    /// The served model as the backend describes it (its identity, vocabulary
    /// and hidden sizes).
    pub fn info(&self) -> &ModelInfo {
        self.engine.info()
    }

    /// Whether the backend is loading, ready, or waiting for an upstream.
    pub fn status(&self) -> EngineStatus {
        self.engine.status()
    }

    /// Jobs waiting for the backend.
    pub fn queue_depth(&self) -> usize {
        self.engine.queue_depth()
    }

    /// What the backend serves (its name, multi-question modes, refusals).
    pub fn capabilities(&self) -> Capabilities {
        self.engine.capabilities()
    }

    /// The blocks whose output an intent head may read (`None` where the
    /// backend reads no hidden states).
    pub fn hidden_layers(&self) -> Option<usize> {
        self.engine.hidden_layers()
    }

    /// Embeddings of token ids (the backend's own, or an upstream's).
    pub fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedReceiver, EngineError> {
        self.engine.embed(inputs)
    }

    /// A chat completion with images, passed through to the backend's
    /// upstream chat route.
    pub fn chat_passthrough(&self, body: Value) -> Result<ChatReceiver, EngineError> {
        self.engine.chat_passthrough(body)
    }

    /// The model's context, or `--max-model-len` where that is smaller.
    pub fn context_length(&self) -> usize {
        let model = self.engine.info().context_length;
        self.limits
            .max_model_len
            .map_or(model, |cap| cap.min(model))
    }

    /// Renders chat messages into the prompt text.
    pub fn render_chat(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        template_kwargs: &Map<String, Value>,
    ) -> Result<String, RouteError> {
        self.template
            .render(messages, add_generation_prompt, template_kwargs)
            .map_err(|e| RouteError::invalid("messages", e.to_string()))
    }

    /// How many tokens a text is, alone (System One's `usage` counts the
    /// state and each question's own text so).
    pub fn count_tokens(&self, text: &str) -> Result<usize, RouteError> {
        Ok(self.tokenize(text, false)?.len())
    }

    /// [`TextRoute::count_tokens`] of a state's text, remembered by its
    /// digest for the last few thousand states: a state asked about again
    /// (the common case: a document, then its questions) is counted once,
    /// not once a request.
    pub fn count_state_tokens(&self, text: &str) -> Result<usize, RouteError> {
        use sha2::{Digest, Sha256};
        let key: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        if let Some(n) = self.state_counts.get(&key) {
            return Ok(n);
        }
        let n = self.count_tokens(text)?;
        self.state_counts.insert(key, n);
        Ok(n)
    }

    /// Token ids of a text (a rendered chat prompt carries its own special
    /// tokens, so none are added for it).
    pub fn tokenize(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, RouteError> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| RouteError::invalid("prompt", e.to_string()))
    }

    /// Checks token ids against the vocabulary.
    pub fn check_token_ids(&self, ids: &[u32], param: &str) -> Result<(), RouteError> {
        let vocab = self.engine.info().vocab_size;
        match ids.iter().find(|&&id| id as usize >= vocab) {
            Some(id) => Err(RouteError::invalid(
                param,
                format!("token id {id} is outside the vocabulary (0..{vocab})"),
            )),
            None => Ok(()),
        }
    }

    /// Queues a generation on `prompt` and returns its output stream.
    pub fn generate(
        self: &Arc<Self>,
        prompt: Vec<u32>,
        params: GenerationParams,
    ) -> Result<GenerationStream, RouteError> {
        let context = self.context_length();
        if prompt.is_empty() {
            return Err(RouteError::invalid(
                params.prompt_field,
                "the prompt is empty",
            ));
        }
        if prompt.len() >= context {
            return Err(RouteError::ContextLength {
                message: format!(
                    "This model's maximum context length is {context} tokens. However, your \
                     prompt has {} tokens; shorten it so that at least one token can be generated.",
                    prompt.len()
                ),
                param: params.prompt_field,
            });
        }
        let room = context - prompt.len();
        let max_tokens = match params.max_tokens {
            Some(n) if n > room => {
                return Err(RouteError::ContextLength {
                    message: format!(
                        "This model's maximum context length is {context} tokens. However, you \
                         requested {} tokens ({} in the prompt, {n} for the completion). Lower \
                         max_tokens or shorten the prompt.",
                        prompt.len() + n,
                        prompt.len()
                    ),
                    param: "max_tokens",
                })
            }
            Some(n) => n,
            None => room,
        };
        let events = self.engine.generate(GenerateRequest {
            prompt: prompt.clone(),
            max_tokens,
            sampling: params.sampling,
            logprobs: params.logprobs,
            prompt_logprobs: params.prompt_logprobs,
            logprob_token_ids: params.logprob_token_ids,
            stop_token_ids: if params.ignore_eos {
                Vec::new()
            } else {
                self.stop_token_ids.clone()
            },
        })?;
        Ok(GenerationStream::new(
            self.clone(),
            events,
            prompt,
            params.stop,
        ))
    }
}
