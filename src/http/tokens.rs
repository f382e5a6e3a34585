//! vLLM's `POST /tokenize` and `POST /detokenize`: a prompt or chat
//! messages to token ids with the served tokenizer (and its chat
//! template), and token ids back to text.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::body::read_json;
use super::error::ApiError;
use super::fields::{int, null_is_false, token_ids};
use super::messages::messages;
use super::AppState;

type Result<T> = std::result::Result<T, ApiError>;

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

pub async fn tokenize(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: TokenizeRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    let route = &state.route;
    let tokens = match (&body.prompt, &body.messages) {
        (Some(prompt), None) => route.tokenize(prompt, body.add_special_tokens.unwrap_or(true))?,
        (None, Some(m)) => {
            let text = route.render_chat(
                &messages(m, false)?,
                body.add_generation_prompt.unwrap_or(true),
                &body.chat_template_kwargs.clone().unwrap_or_default(),
            )?;
            route.tokenize(&text, body.add_special_tokens.unwrap_or(false))?
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give either `prompt` (a string) or `messages` (chat messages), not both",
            ))
        }
    };
    let token_strs = body.return_token_strs.then(|| {
        tokens
            .iter()
            .map(|&t| route.tokenizer.id_to_token(t).unwrap_or_default())
            .collect()
    });
    Ok(HttpResponse::Ok().json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: route.context_length(),
        tokens,
        token_strs,
    }))
}

pub async fn detokenize(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: DetokenizeRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    let ids = token_ids(&body.tokens, "tokens")?;
    state.route.check_token_ids(&ids, "tokens")?;
    let prompt = state
        .route
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(HttpResponse::Ok().json(DetokenizeResponse { prompt }))
}
