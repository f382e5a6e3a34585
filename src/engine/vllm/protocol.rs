//! The subset of vLLM's OpenAI server this backend speaks, as typed structs:
//! `GET /v1/models`, `GET /health`, `GET /metrics` (its cache configuration
//! only) and `POST /v1/completions` with token-id prompts, `logprobs`,
//! `echo`, and vLLM's extra fields (`logprob_token_ids`,
//! `allowed_token_ids`, `return_tokens_as_token_ids`, `ignore_eos`, the
//! sampling fields `top_k`, `min_p`, `repetition_penalty`). Field names
//! follow vLLM 0.33.0's `CompletionRequest` and `CompletionResponse`
//! (vllm/entrypoints/openai/completion/protocol.py).
//! The head upstream is sent `POST /v1/embeddings` with one token-id input
//! and `encoding_format: "base64"` (OpenAI's shape, which vLLM's pooling
//! server and decisio's MLX backend both serve).
//!
//! With the types, what the backend reads from and writes into them: the
//! request for option letters by each [`LetterMethod`], the first
//! generated position's alternatives, the model card asked for, and
//! whether a state was found in the upstream's prefix cache.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::LetterMethod;

/// vLLM's answer, with status 500, to every request once its engine core
/// has died (`EngineDeadError.CLIENT_MESSAGE`, vllm/v1/engine/exceptions.py;
/// mapped in vllm/entrypoints/serve/exception_handling/error_response.py).
/// Its `/health` then answers 503 (serve/instrumentator/health.py).
pub const ENGINE_DEAD_MESSAGE: &str = "The server had an error while processing your request.";

/// A completion request; unset extensions are left out, so an upstream
/// that does not know one is not sent it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    pub max_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// The sampling fields the MLX backend does not apply, sent at their
    /// neutral values ([`CompletionRequest::new`]): vLLM otherwise takes
    /// them from the model's generation_config.json.
    #[serde(flatten)]
    pub neutral: Option<NeutralSampling>,
    /// Signed, as vLLM takes it (`ge=-(2**63)`, `le=2**63 - 1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<usize>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub echo: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprob_token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub return_tokens_as_token_ids: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ignore_eos: bool,
}

/// A completion's `prompt`: one list of token ids, or a list of them,
/// which vLLM answers with one choice per prompt, `index` the prompt's
/// position (`request_output_to_completion_response` in
/// vllm/entrypoints/openai/completion/serving.py).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    One(Vec<u32>),
    Many(Vec<Vec<u32>>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::One(Vec::new())
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Self {
        Prompt::One(ids)
    }
}

impl Prompt {
    /// `prompts` as one request: a lone prompt is sent as one list of ids,
    /// the shape every server takes; several as a list of them.
    pub fn list(mut prompts: Vec<Vec<u32>>) -> Self {
        if prompts.len() == 1 {
            Prompt::One(prompts.remove(0))
        } else {
            Prompt::Many(prompts)
        }
    }
}

/// The sampling fields vLLM fills from the model's `generation_config.json`
/// when a request leaves them unset (`--generation-config auto`, its
/// default: `get_diff_sampling_param` in vllm/config/model.py; the request
/// value, then that default, then `_DEFAULT_SAMPLING_PARAMS` of
/// completion/protocol.py), which the MLX backend never applies. Sent at
/// `_DEFAULT_SAMPLING_PARAMS`' values, the neutral ones, so one request
/// samples alike on both backends.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct NeutralSampling {
    /// 0: every token is kept.
    pub top_k: i64,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
}

impl NeutralSampling {
    pub const VALUES: NeutralSampling = NeutralSampling {
        top_k: 0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    };
}

impl CompletionRequest {
    /// A completion of at most `max_tokens` after `prompt`, its tokens
    /// named by id, every sampling field the MLX backend does not apply at
    /// its neutral value, and no log-probabilities asked (yet).
    pub fn new(model: &str, prompt: impl Into<Prompt>, max_tokens: usize) -> Self {
        CompletionRequest {
            model: model.to_string(),
            prompt: prompt.into(),
            max_tokens,
            neutral: Some(NeutralSampling::VALUES),
            return_tokens_as_token_ids: true,
            ..Default::default()
        }
    }

    /// Greedy: one of [`CompletionRequest::new`] at temperature 0.
    pub fn greedy(model: &str, prompt: impl Into<Prompt>, max_tokens: usize) -> Self {
        CompletionRequest {
            temperature: Some(0.0),
            ..CompletionRequest::new(model, prompt, max_tokens)
        }
    }
}

/// What an upstream's `/metrics` says of its prefix cache: the labels of
/// vLLM's `vllm:cache_config_info` gauge, one per field of its
/// `CacheConfig`, each value `str()` of the Python value
/// (`CacheConfig.metrics_info`, vllm/config/cache.py;
/// `PrometheusStatLogger.log_metrics_info`, vllm/v1/metrics/loggers.py).
/// It is set once the engine is up, so `block_size` is the size in use,
/// after a hybrid model's alignment
/// (`Platform._align_hybrid_block_size`, vllm/platforms/interface.py).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    /// The scheduler's block, in tokens.
    pub block_size: usize,
    /// Where prefix-cache hits land, in tokens (`cache_hit_alignment_tokens`,
    /// from vLLM 0.33; the block size where absent).
    pub hit_unit: usize,
    pub prefix_caching: bool,
    /// `mamba_cache_mode` (`align` on a hybrid model with prefix caching),
    /// when stated and not `none`.
    pub mamba_cache_mode: Option<String>,
}

/// Reads [`CacheInfo`] off a Prometheus text exposition, from the first
/// `vllm:cache_config_info` sample (one per data-parallel engine, alike).
pub fn cache_info(exposition: &str) -> Option<CacheInfo> {
    let line = exposition
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    let labels = prometheus_labels(line)?;
    let get = |k: &str| {
        labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .filter(|v| *v != "None")
    };
    let block_size: usize = get("block_size")?.parse().ok()?;
    let hit_unit = get("cache_hit_alignment_tokens")
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(block_size);
    Some(CacheInfo {
        block_size,
        hit_unit,
        prefix_caching: get("enable_prefix_caching") == Some("True"),
        mamba_cache_mode: get("mamba_cache_mode")
            .filter(|m| *m != "none")
            .map(str::to_string),
    })
}

/// The labels of one sample line `name{a="x",b="y"} value`, unescaped
/// (`\\`, `\"`, `\n`, as the text format escapes them).
fn prometheus_labels(line: &str) -> Option<Vec<(String, String)>> {
    let body = &line[line.find('{')? + 1..];
    let mut out = Vec::new();
    let mut chars = body.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek() == Some(&'}') {
            return Some(out);
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                c => value.push(c),
            }
        }
        out.push((name.trim().to_string(), value));
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionResponse {
    pub choices: Vec<CompletionChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionChoice {
    /// The prompt's position in a request of several (with `n` 1).
    #[serde(default)]
    pub index: Option<usize>,
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The legacy completions log-probabilities: one entry per token.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct CompletionLogprobs {
    #[serde(default)]
    pub tokens: Vec<String>,
    #[serde(default)]
    pub token_logprobs: Vec<Option<f64>>,
    #[serde(default)]
    pub top_logprobs: Vec<Option<HashMap<String, f64>>>,
}

impl CompletionLogprobs {
    /// The ids of the tokens, each named `token_id:N`
    /// (`return_tokens_as_token_ids`); an error names any other name.
    pub fn token_ids(&self) -> Result<Vec<u32>, String> {
        self.tokens
            .iter()
            .map(|t| {
                token_id(t).ok_or_else(|| {
                    format!(
                        "the upstream named a token `{t}`, not `token_id:N` \
                         (return_tokens_as_token_ids)"
                    )
                })
            })
            .collect()
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: Option<usize>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ModelList {
    pub data: Vec<ModelCard>,
}

impl ModelList {
    /// The card of the model named `wanted` (`--upstream-model`), else the
    /// first. Where it lists no `wanted`, `strict` makes that an error
    /// naming what it serves; otherwise the first is taken.
    pub fn card(self, wanted: Option<&str>, strict: bool) -> Result<ModelCard, String> {
        match wanted {
            Some(m) if strict || self.data.iter().any(|c| c.id == m) => self
                .data
                .iter()
                .find(|c| c.id == m)
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "it does not serve `{m}` (it serves {})",
                        self.data
                            .iter()
                            .map(|c| format!("`{}`", c.id))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }),
            _ => self
                .data
                .into_iter()
                .next()
                .ok_or_else(|| "GET /v1/models lists no model".into()),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// What the server was started with: vLLM's `args.model`, the Hugging
    /// Face repository or folder it loaded (`root` of vLLM's `ModelCard`,
    /// vllm/entrypoints/serve/engine/protocol.py).
    #[serde(default)]
    pub root: Option<String>,
    #[serde(default)]
    pub max_model_len: Option<usize>,
}

/// An embeddings request of one token-id input. Nothing beyond OpenAI's
/// fields is sent: the pooling (last token, not normalised) is the head
/// upstream's own setting, checked by the probe.
#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: Vec<u32>,
    /// `base64`: little-endian float32 bytes, exact bits.
    pub encoding_format: &'static str,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EmbeddingResponse {
    pub data: Vec<EmbeddingData>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct EmbeddingData {
    pub embedding: EmbeddingValue,
}

/// An embedding as base64 of little-endian float32 bytes, or as numbers.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingValue {
    Base64(String),
    Floats(Vec<f64>),
}

impl EmbeddingValue {
    /// The float32 values: base64's bytes exactly; numbers narrowed from
    /// their f64 reading (float32 text written shortest round-trips).
    pub fn into_f32(self) -> Result<Vec<f32>, String> {
        match self {
            EmbeddingValue::Base64(text) => crate::base64::decode_f32(&text),
            EmbeddingValue::Floats(v) => Ok(v.into_iter().map(|x| x as f32).collect()),
        }
    }
}

/// `base` asking for the log-probabilities of `letters` at its first
/// generated position, by `method` (the top-k method asks for its `k`).
/// Most ids vLLM takes in one request's `logprob_token_ids`
/// (`MAX_LOGPROB_TOKEN_IDS`, `vllm/sampling_params.py`, 0.32.0 and 0.33.0).
pub const MAX_LOGPROB_TOKEN_IDS: usize = 128;

pub fn letter_request(
    method: LetterMethod,
    base: CompletionRequest,
    letters: &[u32],
) -> CompletionRequest {
    match method {
        LetterMethod::TokenIds => CompletionRequest {
            logprobs: Some(1),
            logprob_token_ids: Some(letters.to_vec()),
            ..base
        },
        LetterMethod::AllowedTokens => CompletionRequest {
            logprobs: Some(letters.len()),
            allowed_token_ids: Some(letters.to_vec()),
            ..base
        },
        LetterMethod::TopK { k } => CompletionRequest {
            logprobs: Some(k),
            ..base
        },
    }
}

/// The choices of a list request's response, in the order of its prompts
/// (by `index`, vLLM's position of the prompt).
pub fn by_prompt(r: &CompletionResponse, n: usize) -> Result<Vec<usize>, String> {
    let mut at = vec![None; n];
    for (i, c) in r.choices.iter().enumerate() {
        let index = c.index.unwrap_or(i);
        match at.get_mut(index) {
            Some(slot @ None) => *slot = Some(i),
            _ => {
                return Err(format!(
                    "the upstream answered a request of {n} prompts with choice index {index} \
                     (twice, or past the prompts)"
                ))
            }
        }
    }
    at.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| {
        format!(
            "the upstream answered a request of {n} prompts with {} choices",
            r.choices.len()
        )
    })
}

/// The first generated position's alternatives, by token id.
pub fn first_position(r: &CompletionResponse) -> Result<HashMap<u32, f64>, String> {
    r.choices
        .first()
        .ok_or_else(|| "the completion has no choices".to_string())
        .and_then(choice_position)
}

/// One choice's first generated position's alternatives, by token id.
pub fn choice_position(c: &CompletionChoice) -> Result<HashMap<u32, f64>, String> {
    let top = c
        .logprobs
        .as_ref()
        .and_then(|l| l.top_logprobs.first())
        .and_then(|t| t.as_ref())
        .ok_or("the completion has no top_logprobs")?;
    Ok(top
        .iter()
        .filter_map(|(name, &lp)| token_id(name).map(|id| (id, lp)))
        .collect())
}

/// The upstream's count of cached prompt tokens, where it reports one
/// (vLLM with `--enable-prompt-tokens-details`).
pub fn cached_tokens(usage: Option<&Usage>) -> Option<usize> {
    usage
        .and_then(|u| u.prompt_tokens_details.as_ref())
        .and_then(|d| d.cached_tokens)
}

/// Whether a state of `state` tokens, the start of a prompt of `prompt`
/// tokens, was found in the upstream's prefix cache, from `cached`, the
/// upstream's count of cached prompt tokens. vLLM never counts the whole
/// prompt: a hit is at most the prompt less its last token, in whole units
/// of `unit` tokens (`max_cache_hit_length = request.num_tokens - 1` in
/// vllm/v1/core/kv_cache_manager.py; whole blocks in
/// single_type_kv_cache_manager.py). So the state was found when the count
/// reaches the most vLLM can report of it; a state shorter than that
/// reports nothing either way and counts as read.
pub fn state_found(cached: Option<usize>, state: usize, prompt: usize, unit: usize) -> bool {
    let unit = unit.max(1);
    let most = state.min(prompt.saturating_sub(1)) / unit * unit;
    most > 0 && cached.is_some_and(|c| c >= most)
}

/// The token id in a `token_id:N` name (`return_tokens_as_token_ids`).
pub fn token_id(name: &str) -> Option<u32> {
    name.strip_prefix("token_id:")?.parse().ok()
}

/// The message of an upstream's error body: OpenAI's `{"error": {"message"}}`,
/// vLLM's older `{"object": "error", "message"}`, FastAPI's `{"detail"}`, or
/// the text itself.
pub fn error_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return text.chars().take(2000).collect();
    };
    let message = v
        .pointer("/error/message")
        .or_else(|| v.get("message"))
        .or_else(|| v.get("detail"));
    match message {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => text.chars().take(2000).collect(),
    }
}

/// The logprobs cap in a refusal of too many: vLLM's "Requested sample
/// logprobs of N, which is greater than max allowed: M", or decisio's
/// "`logprobs` must be between 0 and M".
pub fn logprobs_cap(message: &str) -> Option<usize> {
    let after = |marker: &str| {
        let rest = &message[message.find(marker)? + marker.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    after("max allowed:").or_else(|| after("between 0 and"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cap_from_both_servers_texts() {
        assert_eq!(
            logprobs_cap(
                "Requested sample logprobs of 49152, which is greater than max allowed: 20"
            ),
            Some(20)
        );
        assert_eq!(
            logprobs_cap("`logprobs` must be between 0 and 5; got 49152"),
            Some(5)
        );
        assert_eq!(logprobs_cap("something else"), None);
    }

    #[test]
    fn reads_error_messages_of_each_shape() {
        assert_eq!(error_message(br#"{"error": {"message": "m1"}}"#), "m1");
        assert_eq!(
            error_message(br#"{"object": "error", "message": "m2", "code": 400}"#),
            "m2"
        );
        assert_eq!(error_message(br#"{"detail": "m3"}"#), "m3");
        assert_eq!(
            error_message(b"Internal Server Error"),
            "Internal Server Error"
        );
        assert_eq!(token_id("token_id:42"), Some(42));
        assert_eq!(token_id("A"), None);
    }

    #[test]
    fn reads_embeddings_of_both_encodings() {
        let r: EmbeddingResponse = serde_json::from_str(
            r#"{"object": "list", "data": [{"object": "embedding", "index": 0,
                "embedding": "AACAPwAAwL8="}], "model": "m",
                "usage": {"prompt_tokens": 2, "total_tokens": 2}}"#,
        )
        .unwrap();
        let v = r.data.into_iter().next().unwrap().embedding.into_f32();
        assert_eq!(v.unwrap(), vec![1.0, -1.5]);
        let r: EmbeddingResponse =
            serde_json::from_str(r#"{"data": [{"embedding": [0.1, -2.5]}]}"#).unwrap();
        let v = r.data.into_iter().next().unwrap().embedding.into_f32();
        assert_eq!(v.unwrap(), vec![0.1f32, -2.5]);
    }

    #[test]
    fn leaves_out_unset_extensions_and_sends_neutral_sampling() {
        let body = serde_json::to_value(CompletionRequest {
            model: "m".into(),
            prompt: vec![1, 2].into(),
            max_tokens: 1,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "m", "prompt": [1, 2], "max_tokens": 1})
        );
        let body = serde_json::to_value(CompletionRequest::greedy("m", vec![1], 1)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "m", "prompt": [1], "max_tokens": 1,
                "temperature": 0.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "return_tokens_as_token_ids": true})
        );
    }

    #[test]
    fn reads_the_cache_configuration_off_vllm_metrics() {
        let text = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
            # TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"1056\",user_specified_block_size=\"False\",\
            enable_prefix_caching=\"True\",mamba_cache_mode=\"align\",\
            kv_cache_dtype_skip_layers=\"[]\",hash_block_size=\"1056\",\
            cache_hit_alignment_tokens=\"1056\",engine=\"0\"} 1.0\n";
        assert_eq!(
            cache_info(text),
            Some(CacheInfo {
                block_size: 1056,
                hit_unit: 1056,
                prefix_caching: true,
                mamba_cache_mode: Some("align".into()),
            })
        );
        let text = "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"False\",\
            mamba_cache_mode=\"None\",cache_hit_alignment_tokens=\"None\",engine=\"0\"} 1.0";
        let info = cache_info(text).unwrap();
        assert_eq!((info.block_size, info.hit_unit), (16, 16));
        assert!(!info.prefix_caching);
        assert_eq!(info.mamba_cache_mode, None);
        assert_eq!(cache_info("decisio_requests_total 3"), None);
    }

    #[test]
    fn a_state_is_found_when_the_count_reaches_what_vllm_can_report() {
        // A 32-token state alone, blocks of 16: vLLM reports at most 16.
        assert!(state_found(Some(16), 32, 32, 16));
        assert!(!state_found(Some(0), 32, 32, 16));
        // The same state under a question: up to 32 of it.
        assert!(state_found(Some(32), 32, 40, 16));
        assert!(!state_found(Some(16), 32, 40, 16));
        // A state of 40 tokens reports its two full blocks.
        assert!(state_found(Some(32), 40, 48, 16));
        // A hybrid model's 1,056-token unit: a 3,000-token state, found.
        assert!(state_found(Some(2112), 3000, 3000, 1056));
        // Shorter than one unit: nothing is ever reported; read.
        assert!(!state_found(Some(0), 10, 10, 16));
        // No count reported.
        assert!(!state_found(None, 32, 40, 16));
        // An exact counter (a decisio gateway), unit 1.
        assert!(state_found(Some(39), 40, 40, 1));
    }
}
