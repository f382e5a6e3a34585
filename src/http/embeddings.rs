//! `POST /v1/embeddings` (OpenAI's shape, with vLLM's
//! `add_special_tokens`): its request and response bodies, its validation
//! and its handler. An embedding is the hidden state at the last position
//! of an input.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::body::read_json;
use super::completions::PromptSpec;
use super::error::ApiError;
use super::fields::{int, token_ids};
use super::AppState;
use crate::settings::Limits;
use crate::text_route::EngineError;

type Result<T> = std::result::Result<T, ApiError>;

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

/// The inputs of an embeddings request, before tokenization.
enum EmbeddingInputs {
    Text(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

/// A validated embeddings request.
struct EmbeddingJob {
    inputs: EmbeddingInputs,
    /// `encoding_format: "base64"`.
    base64: bool,
    /// `dimensions`, which must then equal the hidden size.
    dimensions: Option<usize>,
    add_special_tokens: bool,
}

/// 1 to `max_embedding_inputs` inputs, a known encoding, a positive
/// `dimensions`.
fn validate(req: &EmbeddingRequest, limits: &Limits) -> Result<EmbeddingJob> {
    let inputs = match &req.input {
        EmbeddingInput::Text(t) => EmbeddingInputs::Text(vec![t.clone()]),
        EmbeddingInput::TextBatch(v) => EmbeddingInputs::Text(v.clone()),
        EmbeddingInput::Tokens(ids) => EmbeddingInputs::Tokens(vec![token_ids(ids, "input")?]),
        EmbeddingInput::TokensBatch(v) => EmbeddingInputs::Tokens(
            v.iter()
                .enumerate()
                .map(|(i, ids)| token_ids(ids, &format!("input[{i}]")))
                .collect::<Result<_>>()?,
        ),
    };
    let n = match &inputs {
        EmbeddingInputs::Text(v) => v.len(),
        EmbeddingInputs::Tokens(v) => v.len(),
    };
    // Refused on every model, also where special tokens would give an
    // empty text a token: an embedding of nothing is no one's intent.
    if let EmbeddingInputs::Text(v) = &inputs {
        if let Some(i) = v.iter().position(String::is_empty) {
            return Err(ApiError::invalid(
                "input",
                format!("input {i} is an empty string; an embedding needs text"),
            ));
        }
    }
    if n == 0 || n > limits.max_embedding_inputs {
        return Err(ApiError::invalid(
            "input",
            format!(
                "an embeddings request takes 1 to {} inputs; got {n}",
                limits.max_embedding_inputs
            ),
        ));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("`encoding_format` must be `float` or `base64`; got `{other}`"),
            ))
        }
    };
    let dimensions = match req.dimensions {
        None => None,
        Some(d) if d >= 1 => Some(d as usize),
        Some(d) => {
            return Err(ApiError::invalid(
                "dimensions",
                format!("`dimensions` must be at least 1; got {d}"),
            ))
        }
    };
    Ok(EmbeddingJob {
        inputs,
        base64,
        dimensions,
        add_special_tokens: req.add_special_tokens.unwrap_or(true),
    })
}

/// The token counts of embedding inputs: each 1 to `context` tokens, all
/// together at most `max_embedding_tokens`. Returns the total.
fn count_tokens(inputs: &[Vec<u32>], limits: &Limits, context: usize) -> Result<usize> {
    for (i, ids) in inputs.iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::invalid(
                "input",
                format!("input {i} has no tokens; an embedding is read at the last one"),
            ));
        }
        if ids.len() > context {
            return Err(ApiError::ContextLength {
                message: format!(
                    "This model's maximum context length is {context} tokens. However, input \
                     {i} has {} tokens; shorten it.",
                    ids.len()
                ),
                param: "input",
            });
        }
    }
    let total: usize = inputs.iter().map(Vec::len).sum();
    if total > limits.max_embedding_tokens {
        return Err(ApiError::invalid(
            "input",
            format!(
                "the inputs of one embeddings request take at most {} tokens together; got \
                 {total}; send them in several requests",
                limits.max_embedding_tokens
            ),
        ));
    }
    Ok(total)
}

/// `POST /v1/embeddings`: the hidden state at the last position of each
/// input (the final norm's output, as a decision's answer position computes
/// it; not normalised).
pub async fn embeddings(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: EmbeddingRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    state.ready()?;
    let job = validate(&body, &state.limits)?;
    let route = &state.route;
    let caps = route.capabilities();
    if !caps.embeddings {
        return Err(ApiError::bad_request(
            None,
            format!(
                "embeddings are not served by the {} backend{}",
                caps.name, caps.hidden_hint
            ),
        ));
    }
    let inputs: Vec<Vec<u32>> = match job.inputs {
        EmbeddingInputs::Text(texts) => texts
            .iter()
            .map(|t| route.tokenize(t, job.add_special_tokens))
            .collect::<std::result::Result<_, _>>()?,
        EmbeddingInputs::Tokens(ids) => {
            for (i, v) in ids.iter().enumerate() {
                route.check_token_ids(v, &format!("input[{i}]"))?;
            }
            ids
        }
    };
    let tokens = count_tokens(&inputs, &state.limits, route.context_length())?;
    let vectors = route
        .embed(inputs)?
        .await
        .map_err(|_| EngineError::Stopped)??;
    if let Some(d) = job.dimensions {
        let width = vectors.first().map_or(0, Vec::len);
        if d != width {
            return Err(ApiError::invalid(
                "dimensions",
                format!(
                    "`dimensions` must equal the hidden size, {width}: embeddings are hidden \
                     states and are not shortened; got {d}"
                ),
            ));
        }
    }
    Ok(HttpResponse::Ok().json(EmbeddingList {
        object: "list",
        data: vectors
            .into_iter()
            .enumerate()
            .map(|(index, v)| EmbeddingData {
                object: "embedding",
                index,
                embedding: if job.base64 {
                    EmbeddingVector::Base64(crate::base64::encode_f32(&v))
                } else {
                    EmbeddingVector::Float(v)
                },
            })
            .collect(),
        model: state.model_name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }))
}
