//! Request and response bodies of the OpenAI (and vLLM-extra) routes.
//!
//! Requests deny unknown fields, so nothing a client sends is silently
//! ignored; numbers are read wide (`i64`, `f64`) and range-checked in
//! [`super::validate`], which names the offending field.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// OpenAI's schemas allow `null` for optional booleans: read it as `false`.
fn null_is_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// Integers as JSON Schema and vLLM's request models (pydantic, lax mode)
/// read them: `3` and `3.0` are the integer 3; `3.5` is refused. Used with
/// `deserialize_with` on every integer field of a request.
mod int {
    use serde::de::{self, Deserializer, Visitor};
    use serde::Deserialize;

    struct Int(i64);

    impl<'de> Deserialize<'de> for Int {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct IntVisitor;
            impl Visitor<'_> for IntVisitor {
                type Value = Int;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an integer")
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                    Ok(Int(v))
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                    i64::try_from(v)
                        .map(Int)
                        .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
                }
                fn visit_f64<E: de::Error>(self, v: f64) -> Result<Int, E> {
                    // Only where every integer is a float: an integer
                    // literal beyond i64 also arrives here, rounded.
                    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
                    if v.fract() == 0.0 && v.abs() <= EXACT {
                        Ok(Int(v as i64))
                    } else {
                        Err(E::invalid_value(de::Unexpected::Float(v), &self))
                    }
                }
            }
            d.deserialize_any(IntVisitor)
        }
    }

    pub fn opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Ok(Option::<Int>::deserialize(d)?.map(|i| i.0))
    }

    pub fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
        Ok(Vec::<Int>::deserialize(d)?
            .into_iter()
            .map(|i| i.0)
            .collect())
    }

    pub fn opt_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<i64>>, D::Error> {
        Ok(Option::<Vec<Int>>::deserialize(d)?.map(|l| l.into_iter().map(|i| i.0).collect()))
    }

    pub fn lists<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<i64>>, D::Error> {
        Ok(Vec::<Vec<Int>>::deserialize(d)?
            .into_iter()
            .map(|l| l.into_iter().map(|i| i.0).collect())
            .collect())
    }
}

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// `Some` when the field was sent (`null` reads as `false`).
    #[serde(default, deserialize_with = "present_bool")]
    pub include_usage: Option<bool>,
}

impl StreamOptions {
    /// Whether the object has a field: vLLM 0.33 refuses `stream_options`
    /// without `stream` only then (`if data.get("stream_options")`, an
    /// empty object being false; entrypoints/openai/*/protocol.py).
    pub fn is_set(&self) -> bool {
        self.include_usage.is_some()
    }
}

/// A boolean that may be `null` (read as `false`), remembering that it
/// was sent.
fn present_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(Some(Option::<bool>::deserialize(d)?.unwrap_or(false)))
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<Value>,
    #[serde(default, deserialize_with = "int::opt")]
    pub max_tokens: Option<i64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub n: Option<i64>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StopSpec>,
    #[serde(default, deserialize_with = "int::opt")]
    pub seed: Option<i64>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub logprobs: bool,
    #[serde(default, deserialize_with = "int::opt")]
    pub top_logprobs: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<Map<String, Value>>,
    /// vLLM's sampling extensions, taken at their neutral values only
    /// (`top_k` 0 or -1, `min_p` 0, `repetition_penalty` 1).
    #[serde(default, deserialize_with = "int::opt")]
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub user: Option<String>,
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// vLLM's extension: keyword arguments of the chat template
    /// (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub add_generation_prompt: Option<bool>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub ignore_eos: bool,
    /// A decision instead of a generation.
    pub decisio: Option<DecisioRequest>,
}

/// `prompt` of a completion: text, or token ids.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptSpec {
    Text(String),
    Tokens(#[serde(deserialize_with = "int::list")] Vec<i64>),
    TextBatch(Vec<String>),
    TokensBatch(#[serde(deserialize_with = "int::lists")] Vec<Vec<i64>>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptSpec,
    #[serde(default, deserialize_with = "int::opt")]
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub n: Option<i64>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StopSpec>,
    #[serde(default, deserialize_with = "int::opt")]
    pub seed: Option<i64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub logprobs: Option<i64>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub echo: bool,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<Map<String, Value>>,
    /// vLLM's sampling extensions, taken at their neutral values only
    /// (`top_k` 0 or -1, `min_p` 0, `repetition_penalty` 1).
    #[serde(default, deserialize_with = "int::opt")]
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
    pub user: Option<String>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub ignore_eos: bool,
    /// vLLM's extension: the log-probabilities of these token ids at each
    /// generated position, in place of the most likely ones.
    #[serde(default, deserialize_with = "int::opt_list")]
    pub logprob_token_ids: Option<Vec<i64>>,
    /// vLLM's extension: name tokens in `logprobs` as `token_id:N`.
    #[serde(default, deserialize_with = "null_is_false")]
    pub return_tokens_as_token_ids: bool,
}

/// `input` of an embeddings request: text, or token ids, one or a list,
/// as a completion's `prompt`.
pub type EmbeddingInput = PromptSpec;

/// `POST /v1/embeddings` (OpenAI's shape, with vLLM's
/// `add_special_tokens`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: EmbeddingInput,
    /// `float` (the default) or `base64` (little-endian float32 bytes).
    pub encoding_format: Option<String>,
    /// Served only when equal to the hidden size (nothing is shortened).
    #[serde(default, deserialize_with = "int::opt")]
    pub dimensions: Option<i64>,
    pub user: Option<String>,
    /// Add the tokenizer's special tokens to text inputs (default: true,
    /// as vLLM's embeddings do); token-id inputs are taken as they are.
    pub add_special_tokens: Option<bool>,
}

/// One embedding: float32 numbers (written in their shortest float32
/// form, which reads back to the same bits), or base64 of their
/// little-endian bytes.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingData {
    pub object: &'static str,
    pub index: usize,
    pub embedding: EmbeddingVector,
}

#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

/// vLLM's `POST /tokenize`: a prompt, or chat messages.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<Value>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub return_token_strs: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    #[serde(deserialize_with = "int::list")]
    pub tokens: Vec<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub max_model_len: usize,
    /// What a run record needs to name the configuration that answers.
    pub decisio: ServedIdentity,
}

/// The identity of what answers on this server: a run record keeps it, and
/// `decisio gate` refuses to compare records whose bases or tokenizers
/// differ.
#[derive(Clone, Debug, Serialize)]
pub struct ServedIdentity {
    /// The server's version (`decisio --version`).
    pub version: &'static str,
    /// `MLX` or `vLLM`.
    pub backend: &'static str,
    /// `model_type` of config.json.
    pub architecture: String,
    /// The production base served (`--base`), if any.
    pub base: Option<&'static str>,
    /// A digest of config.json and the weight files' names and sizes (the
    /// upstream's model name and root for the vLLM backend).
    pub model_identity: String,
    /// A digest of the tokenizer's files.
    pub tokenizer_identity: String,
    /// The letters' temperature when neither a request nor a task sets one.
    pub default_temperature: f64,
    /// How states are padded (`none`, `block16`).
    pub padding: String,
    /// The multi-question modes served; the first is the default.
    pub multi_question: Vec<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// One alternative in chat `logprobs`.
#[derive(Clone, Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One token in chat `logprobs.content`.
#[derive(Clone, Debug, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    pub content: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Legacy completions `logprobs`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    pub text_offset: Vec<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One question of `POST /v1/decide`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideQuestion {
    pub id: Option<String>,
    pub text: Option<String>,
    pub options: Option<Vec<String>>,
    pub abstain_below: Option<f64>,
    pub temperature: Option<f64>,
    pub task: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    pub model: Option<String>,
    pub state: String,
    pub questions: Vec<DecideQuestion>,
    pub multi_question: Option<String>,
}

/// The `decisio` object of a chat completion that asks for a decision.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisioRequest {
    pub options: Option<Vec<String>>,
    pub abstain_below: Option<f64>,
    pub temperature: Option<f64>,
    pub task: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StateOut {
    pub hash: String,
    pub tokens: usize,
    pub cached: bool,
    /// Set when the state is longer than the served base is documented for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AnswerOut {
    pub id: Option<String>,
    pub letter: Option<&'static str>,
    pub index: Option<usize>,
    pub option: Option<String>,
    /// An intent task's answer: the chosen label (null when abstained);
    /// absent on letter answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<Option<String>>,
    /// Calibrated probability of each option, by letter (an intent task's:
    /// of each label, by label).
    pub probabilities: Map<String, Value>,
    /// Raw log-probability of each option's letter over the vocabulary
    /// (empty for an intent task).
    pub letter_logprobs: Map<String, Value>,
    pub temperature: f32,
    pub abstained: bool,
    pub abstain_reason: Option<String>,
    pub tie: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecideUsage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecideResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub state: StateOut,
    pub answers: Vec<AnswerOut>,
    pub usage: DecideUsage,
}

/// The `decisio` object of a chat completion's reply.
#[derive(Clone, Debug, Serialize)]
pub struct DecisioReply {
    pub state: StateOut,
    pub answer: AnswerOut,
}

#[derive(Clone, Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecisionUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// A chat completion that carries a decision.
#[derive(Clone, Debug, Serialize)]
pub struct ChatDecision {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: DecisionUsage,
    pub decisio: DecisioReply,
}

/// `POST /v1/tasks`: a registration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub name: String,
    /// `choice` (the default) or `intent`.
    pub kind: Option<String>,
    pub question: String,
    /// The options of a choice task.
    pub options: Option<Vec<String>>,
    /// The labels of an intent task.
    pub labels: Option<Vec<String>>,
    pub examples: Vec<TaskExampleIn>,
    /// Share of the examples held out for the figures (default 0.2).
    pub holdout: Option<f64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub seed: Option<i64>,
    pub abstention: Option<AbstentionIn>,
    /// An intent task's head: `{"layer": -1}` (the final norm's output,
    /// the default) or a block's index.
    pub head: Option<TaskHeadIn>,
    /// Heads fitted on `draws` draws of `shots` examples per label (intent
    /// tasks; both or neither).
    #[serde(default, deserialize_with = "int::opt")]
    pub draws: Option<i64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub shots: Option<i64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskHeadIn {
    #[serde(default, deserialize_with = "int::opt")]
    pub layer: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskHeadOut {
    /// `-1`: the final norm's output; else the block's index.
    pub layer: i64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskExampleIn {
    pub state: String,
    /// One of the task's options (or labels), verbatim after trimming.
    pub label: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbstentionIn {
    pub target_accuracy: Option<f64>,
    pub abstain_below: Option<f64>,
}

/// A task as `GET /v1/tasks/{id}` shows it (the examples by count only).
#[derive(Clone, Debug, Serialize)]
pub struct TaskOut {
    pub id: String,
    pub object: &'static str,
    pub name: String,
    pub kind: crate::tasks::Kind,
    pub status: crate::tasks::Status,
    pub created: u64,
    pub question: String,
    /// A choice task's options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// An intent task's labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// An intent task's head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<TaskHeadOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draws: Option<crate::tasks::DrawSpec>,
    pub examples: usize,
    pub holdout: f64,
    pub seed: u64,
    pub abstention: Option<crate::tasks::Abstention>,
    pub progress: crate::tasks::Progress,
    pub error: Option<String>,
    /// The fitted figures, once ready.
    pub result: Option<crate::tasks::Report>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskList {
    pub object: &'static str,
    pub data: Vec<TaskOut>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskDeleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
    /// Whether a queued or running registration was cancelled.
    pub cancelled: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detok(body: &str) -> Result<Vec<i64>, String> {
        serde_json::from_str::<DetokenizeRequest>(body)
            .map(|r| r.tokens)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn integers_may_be_written_without_a_fraction() {
        assert_eq!(detok(r#"{"tokens": [1, 2.0, -3.0]}"#).unwrap(), [1, 2, -3]);
        assert_eq!(
            detok(r#"{"tokens": [-9223372036854775808]}"#).unwrap(),
            [i64::MIN]
        );
        // A fraction, or an integer literal beyond i64 (read as a rounded
        // float), is refused.
        assert!(detok(r#"{"tokens": [2.5]}"#).is_err());
        assert!(detok(r#"{"tokens": [-9223372036854775809]}"#).is_err());
        assert!(detok(r#"{"tokens": [18446744073709551616]}"#).is_err());
        assert!(detok(r#"{"tokens": [1e300]}"#).is_err());
        let req: ChatCompletionRequest =
            serde_json::from_str(r#"{"messages": [], "max_tokens": 16.0, "seed": null}"#).unwrap();
        assert_eq!((req.max_tokens, req.seed), (Some(16), None));
        let req: CompletionRequest = serde_json::from_str(r#"{"prompt": [[5.0, 6]]}"#).unwrap();
        assert!(matches!(req.prompt, PromptSpec::TokensBatch(ref v) if v == &[vec![5, 6]]));
    }
}
