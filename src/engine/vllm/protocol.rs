//! The subset of vLLM's OpenAI server this backend speaks, as typed structs:
//! `GET /v1/models`, `GET /health` and `POST /v1/completions` with token-id
//! prompts, `logprobs`, `echo`, and vLLM's extra fields
//! (`logprob_token_ids`, `allowed_token_ids`, `return_tokens_as_token_ids`,
//! `ignore_eos`). Field names follow vLLM's `CompletionRequest` and
//! `CompletionResponse` (vllm/entrypoints/openai/completion/protocol.py).
//! The head upstream is sent `POST /v1/embeddings` with one token-id input
//! and `encoding_format: "base64"` (OpenAI's shape, which vLLM's pooling
//! server and decisio's MLX backend both serve).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// A completion request; unset fields are left out, so an upstream that
/// does not know an extension is not sent it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
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

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionResponse {
    pub choices: Vec<CompletionChoice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionChoice {
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

#[derive(Clone, Debug, Deserialize)]
pub struct ModelCard {
    pub id: String,
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
    fn leaves_out_unset_extensions() {
        let body = serde_json::to_value(CompletionRequest {
            model: "m".into(),
            prompt: vec![1, 2],
            max_tokens: 1,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "m", "prompt": [1, 2], "max_tokens": 1})
        );
    }
}
