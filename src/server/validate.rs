//! Validation in one place: request bodies become route parameters here, or
//! a 400 that names the field and says what is accepted.

use serde_json::{Map, Value};

use super::error::ApiError;
use super::types::{
    ChatCompletionRequest, CompletionRequest, DecideRequest, DecisioRequest, EmbeddingInput,
    EmbeddingRequest, PromptSpec, StopSpec, StreamOptions, TaskRequest,
};
use crate::engine::{MultiQuestion, Sampling};
use crate::route::decide::{check_question, MAX_QUESTIONS};
use crate::route::{GenerationParams, Question, State};
use crate::settings::Limits;
use crate::tasks::{Abstention, DrawSpec, Example, Kind, TaskRegistry, TaskSpec};

/// Roles a chat message may have.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

fn int_in(value: i64, lo: i64, hi: i64, param: &str) -> Result<i64, ApiError> {
    if value < lo || value > hi {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}; got {value}"),
        ));
    }
    Ok(value)
}

fn float_in(value: f64, lo: f64, hi: f64, param: &str) -> Result<f32, ApiError> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be a number between {lo} and {hi}; got {value}"),
        ));
    }
    Ok(value as f32)
}

/// Features the server does not implement are refused rather than ignored.
fn unsupported<T>(value: &Option<T>, param: &str, why: &str) -> Result<(), ApiError> {
    if value.is_some() {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` is not supported: {why}"),
        ));
    }
    Ok(())
}

fn zero_penalty(value: Option<f64>, param: &str) -> Result<(), ApiError> {
    match value {
        None => Ok(()),
        Some(0.0) => Ok(()),
        Some(v) => Err(ApiError::invalid(
            param,
            format!("`{param}` is not supported (only 0); got {v}"),
        )),
    }
}

/// vLLM's sampling fields beyond OpenAI's, which a request may send at
/// their neutral values.
struct NeutralFields {
    top_k: Option<i64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
}

/// The sampling features both generation routes refuse: n > 1, penalties,
/// logit biases, and vLLM's `top_k`, `min_p` and `repetition_penalty` at
/// other than their neutral values (0 or -1, 0, 1): every backend samples
/// with temperature and top_p alone.
fn unsupported_sampling(
    n: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    logit_bias: &Option<Map<String, Value>>,
    neutral: &NeutralFields,
) -> Result<(), ApiError> {
    single_choice(n)?;
    zero_penalty(presence_penalty, "presence_penalty")?;
    zero_penalty(frequency_penalty, "frequency_penalty")?;
    if let Some(k) = neutral.top_k.filter(|k| *k != 0 && *k != -1) {
        return Err(ApiError::invalid(
            "top_k",
            format!("`top_k` is not supported (only 0 or -1, every token); got {k}"),
        ));
    }
    zero_penalty(neutral.min_p, "min_p")?;
    if let Some(p) = neutral.repetition_penalty.filter(|p| *p != 1.0) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            format!("`repetition_penalty` is not supported (only 1); got {p}"),
        ));
    }
    if logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::invalid(
            "logit_bias",
            "`logit_bias` is not supported",
        ));
    }
    Ok(())
}

fn sampling(
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<i64>,
) -> Result<Sampling, ApiError> {
    Ok(Sampling {
        temperature: temperature.map_or(Ok(1.0), |t| float_in(t, 0.0, 2.0, "temperature"))?,
        top_p: match top_p {
            None => 1.0,
            Some(p) if p > 0.0 => float_in(p, 0.0, 1.0, "top_p")?,
            Some(p) => {
                return Err(ApiError::invalid(
                    "top_p",
                    format!("`top_p` must be greater than 0 and at most 1; got {p}"),
                ))
            }
        },
        seed: seed.map(seed_bits).transpose()?,
    })
}

/// A request's `seed`: any signed 64-bit integer but -1, which vLLM reads
/// as no seed (`vllm/sampling_params.py`), so the draw would not repeat.
/// Refused on both backends, so that a request means the same on each.
/// Carried as its bits; the vLLM backend sends the signed value back.
fn seed_bits(seed: i64) -> Result<u64, ApiError> {
    if seed == -1 {
        return Err(ApiError::invalid(
            "seed",
            "`seed` -1 is refused: vLLM reads it as no seed, so the draw would not repeat; \
             send another integer, or leave `seed` out to draw from the clock",
        ));
    }
    Ok(seed as u64)
}

fn stops(stop: &Option<StopSpec>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s.clone()],
        Some(StopSpec::Many(v)) => v.clone(),
    };
    if list.len() > limits.max_stop {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "at most {} stop sequences are allowed; got {}",
                limits.max_stop,
                list.len()
            ),
        ));
    }
    for s in &list {
        if s.is_empty() {
            return Err(ApiError::invalid(
                "stop",
                "stop sequences must not be empty",
            ));
        }
        if s.len() > limits.max_stop_bytes {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "a stop sequence may be at most {} bytes long",
                    limits.max_stop_bytes
                ),
            ));
        }
    }
    Ok(list)
}

fn max_tokens(value: Option<i64>, param: &str) -> Result<Option<usize>, ApiError> {
    value
        .map(|n| int_in(n, 1, i64::from(u32::MAX), param).map(|n| n as usize))
        .transpose()
}

fn single_choice(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(v) => Err(ApiError::invalid(
            "n",
            format!("only n = 1 is supported; got {v}. Send several requests instead."),
        )),
    }
}

/// A chat message's content as the template sees it: a string. Lists of
/// text parts are joined with newlines; other parts are refused.
fn flatten_content(content: &Value, i: usize) -> Result<Value, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        Value::String(_) => Ok(content.clone()),
        // As vLLM 0.33 reads it for a template that takes text
        // (renderers/chat_utils/chat_message.py: `None` becomes no parts,
        // joined into ""): a message without content, such as an
        // assistant's tool call, has empty content.
        Value::Null => Ok(Value::String(String::new())),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => texts.push(t.to_string()),
                    ("image_url" | "input_image" | "image", _) => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}]"),
                            "image content parts are not supported by the MLX backend; the \
                             image route is served through the vLLM backend",
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}]"),
                            "a content part must be {\"type\": \"text\", \"text\": \"...\"}",
                        ))
                    }
                }
            }
            Ok(Value::String(texts.join("\n")))
        }
        _ => Err(ApiError::invalid(
            &param,
            "content must be a string or a list of text parts",
        )),
    }
}

/// The image content parts' types: OpenAI's `image_url`, the Responses
/// API's `input_image`, and `image`, which the gateway takes as a
/// shorthand and forwards as `image_url` ([`image_part`]).
const IMAGE_PARTS: [&str; 3] = ["image_url", "input_image", "image"];

/// Where the first image content part is (`messages[i].content[j]`), if
/// any message has one.
pub fn first_image_part(messages: &[Value]) -> Option<String> {
    messages.iter().enumerate().find_map(|(i, m)| {
        let parts = m.get("content")?.as_array()?;
        let j = parts.iter().position(|p| {
            p.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| IMAGE_PARTS.contains(&t))
        })?;
        Some(format!("messages[{i}].content[{j}]"))
    })
}

/// A content part of type `image` in OpenAI's form, which every upstream
/// chat route takes (vLLM's has no `image` type,
/// `docs/design/vllm.md`): `{"type": "image", "image_url": …}`, `{"type":
/// "image", "image": URL}` and `{"type": "image", "url": URL}` become
/// `{"type": "image_url", "image_url": {"url": URL}}`; other parts are kept.
fn image_part(part: &Value, param: &str) -> Result<Value, ApiError> {
    if part.get("type").and_then(Value::as_str) != Some("image") {
        return Ok(part.clone());
    }
    let url = match (part.get("image_url"), part.get("image"), part.get("url")) {
        (Some(Value::Object(o)), _, _) => o.get("url").and_then(Value::as_str),
        (Some(Value::String(u)), _, _) | (None, Some(Value::String(u)), _) => Some(u.as_str()),
        (None, None, Some(Value::String(u))) => Some(u.as_str()),
        _ => None,
    };
    let url = url.ok_or_else(|| {
        ApiError::invalid(
            param,
            "an `image` part needs its image as `image_url` ({\"url\": URL} or URL), `image` \
             (URL) or `url` (URL); or send {\"type\": \"image_url\", \"image_url\": {\"url\": \
             URL}}",
        )
    })?;
    Ok(serde_json::json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A chat completion with image content parts, for a backend that passes
/// them through to its upstream's chat route: every field is checked as
/// for any chat completion (the image parts aside; the upstream checks
/// those), it is answered whole (no `stream`), and the body sent upstream
/// carries the messages as the client sent them (`image` parts in OpenAI's
/// `image_url` form, `image_part`) and the sampling fields it
/// gave.
pub fn chat_passthrough(req: &ChatCompletionRequest, limits: &Limits) -> Result<Value, ApiError> {
    if req.stream {
        return Err(ApiError::invalid(
            "stream",
            "a chat completion with image content parts is answered whole; send it without \
             `stream`",
        ));
    }
    let mut text_only = req.clone();
    for m in &mut text_only.messages {
        if let Some(parts) = m.get_mut("content").and_then(Value::as_array_mut) {
            parts.retain(|p| p.get("type").and_then(Value::as_str) == Some("text"));
        }
    }
    chat(&text_only, limits)?;
    let mut messages = req.messages.clone();
    for (i, m) in messages.iter_mut().enumerate() {
        if let Some(parts) = m.get_mut("content").and_then(Value::as_array_mut) {
            for (j, p) in parts.iter_mut().enumerate() {
                *p = image_part(p, &format!("messages[{i}].content[{j}]"))?;
            }
        }
    }
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(messages));
    let fields: [(&str, Option<Value>); 10] = [
        ("max_tokens", req.max_tokens.map(Value::from)),
        (
            "max_completion_tokens",
            req.max_completion_tokens.map(Value::from),
        ),
        ("temperature", req.temperature.map(Value::from)),
        ("top_p", req.top_p.map(Value::from)),
        ("seed", req.seed.map(Value::from)),
        (
            "stop",
            stops(&req.stop, limits)
                .ok()
                .filter(|s| !s.is_empty())
                .map(Value::from),
        ),
        ("logprobs", req.logprobs.then_some(Value::Bool(true))),
        ("top_logprobs", req.top_logprobs.map(Value::from)),
        (
            "chat_template_kwargs",
            req.chat_template_kwargs.clone().map(Value::Object),
        ),
        ("ignore_eos", req.ignore_eos.then_some(Value::Bool(true))),
    ];
    for (k, v) in fields {
        if let Some(v) = v {
            body.insert(k.into(), v);
        }
    }
    if let Some(g) = req.add_generation_prompt {
        body.insert("add_generation_prompt".into(), Value::Bool(g));
    }
    Ok(Value::Object(body))
}

/// Checks chat messages and returns them as the template takes them.
pub fn messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let obj = m.as_object().ok_or_else(|| {
                ApiError::invalid(&format!("messages[{i}]"), "a message must be an object")
            })?;
            let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
            if !ROLES.contains(&role) {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!("role must be one of {}; got `{role}`", ROLES.join(", ")),
                ));
            }
            let mut out: Map<String, Value> = obj.clone();
            let content = obj.get("content").unwrap_or(&Value::Null);
            out.insert("content".into(), flatten_content(content, i)?);
            Ok(Value::Object(out))
        })
        .collect()
}

/// A validated chat completion request.
pub struct ChatJob {
    pub messages: Vec<Value>,
    pub add_generation_prompt: bool,
    pub template_kwargs: Map<String, Value>,
    pub params: GenerationParams,
    pub include_usage: bool,
}

pub fn chat(req: &ChatCompletionRequest, limits: &Limits) -> Result<ChatJob, ApiError> {
    unsupported_sampling(
        req.n,
        req.presence_penalty,
        req.frequency_penalty,
        &req.logit_bias,
        &NeutralFields {
            top_k: req.top_k,
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
        },
    )?;
    unsupported(&req.tools, "tools", "this server does not call tools")?;
    unsupported(
        &req.tool_choice,
        "tool_choice",
        "this server does not call tools",
    )?;
    if let Some(format) = &req.response_format {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::invalid(
                "response_format",
                "only {\"type\": \"text\"} is supported",
            ));
        }
    }
    let logprobs = match (req.logprobs, req.top_logprobs) {
        // As vLLM 0.33 (chat_completion/protocol.py, `check_logprobs`):
        // 0 alternatives need no `logprobs`.
        (false, Some(0) | None) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` above 0 needs `logprobs: true`",
            ))
        }
        (true, k) => Some(int_in(
            k.unwrap_or(0),
            0,
            limits.max_logprobs as i64,
            "top_logprobs",
        )? as usize),
    };
    if req.max_tokens.is_some() && req.max_completion_tokens.is_some() {
        return Err(ApiError::invalid(
            "max_completion_tokens",
            "give `max_tokens` or `max_completion_tokens`, not both",
        ));
    }
    let max = max_tokens(req.max_completion_tokens, "max_completion_tokens")?
        .or(max_tokens(req.max_tokens, "max_tokens")?);
    stream_options(req.stream_options.as_ref(), req.stream)?;
    Ok(ChatJob {
        messages: messages(&req.messages)?,
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        params: GenerationParams {
            max_tokens: max,
            sampling: sampling(req.temperature, req.top_p, req.seed)?,
            stop: stops(&req.stop, limits)?,
            logprobs,
            prompt_logprobs: None,
            ignore_eos: req.ignore_eos,
            logprob_token_ids: Vec::new(),
            prompt_field: "messages",
        },
        include_usage: req
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage == Some(true)),
    })
}

/// The inputs of an embeddings request, before tokenization.
pub enum EmbeddingInputs {
    Text(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

/// A validated embeddings request.
pub struct EmbeddingJob {
    pub inputs: EmbeddingInputs,
    /// `encoding_format: "base64"`.
    pub base64: bool,
    /// `dimensions`, which must then equal the hidden size.
    pub dimensions: Option<usize>,
    pub add_special_tokens: bool,
}

/// `POST /v1/embeddings`: 1 to `max_embedding_inputs` inputs, a known
/// encoding, a positive `dimensions`.
pub fn embeddings(req: &EmbeddingRequest, limits: &Limits) -> Result<EmbeddingJob, ApiError> {
    let inputs = match &req.input {
        EmbeddingInput::Text(t) => EmbeddingInputs::Text(vec![t.clone()]),
        EmbeddingInput::TextBatch(v) => EmbeddingInputs::Text(v.clone()),
        EmbeddingInput::Tokens(ids) => EmbeddingInputs::Tokens(vec![token_ids(ids, "input")?]),
        EmbeddingInput::TokensBatch(v) => EmbeddingInputs::Tokens(
            v.iter()
                .enumerate()
                .map(|(i, ids)| token_ids(ids, &format!("input[{i}]")))
                .collect::<Result<_, _>>()?,
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
pub fn embedding_tokens(
    inputs: &[Vec<u32>],
    limits: &Limits,
    context: usize,
) -> Result<usize, ApiError> {
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

/// What a completion's prompt is.
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated completion request.
pub struct CompletionJob {
    pub prompt: PromptInput,
    pub echo: bool,
    pub params: GenerationParams,
    pub include_usage: bool,
}

/// Token ids as sent (checked against the vocabulary later).
pub fn token_ids(ids: &[i64], param: &str) -> Result<Vec<u32>, ApiError> {
    ids.iter()
        .map(|&id| {
            u32::try_from(id).map_err(|_| {
                ApiError::invalid(param, format!("token ids must be non-negative; got {id}"))
            })
        })
        .collect()
}

pub fn completion(req: &CompletionRequest, limits: &Limits) -> Result<CompletionJob, ApiError> {
    unsupported_sampling(
        req.n,
        req.presence_penalty,
        req.frequency_penalty,
        &req.logit_bias,
        &NeutralFields {
            top_k: req.top_k,
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
        },
    )?;
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    unsupported(&req.suffix, "suffix", "insertion is not supported")?;
    let prompt = match &req.prompt {
        PromptSpec::Text(t) => PromptInput::Text(t.clone()),
        PromptSpec::Tokens(ids) => PromptInput::Tokens(token_ids(ids, "prompt")?),
        PromptSpec::TextBatch(v) if v.len() == 1 => PromptInput::Text(v[0].clone()),
        PromptSpec::TokensBatch(v) if v.len() == 1 => {
            PromptInput::Tokens(token_ids(&v[0], "prompt")?)
        }
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "batched prompts are not supported: send one prompt per request",
            ))
        }
    };
    // Refused on every model, also where the tokenizer's BOS would give an
    // empty text a token, so the description can say it plainly.
    if matches!(&prompt, PromptInput::Text(t) if t.is_empty()) {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    let logprobs = req
        .logprobs
        .map(|k| int_in(k, 0, limits.max_logprobs as i64, "logprobs").map(|k| k as usize))
        .transpose()?;
    stream_options(req.stream_options.as_ref(), req.stream)?;
    let max = match req.max_tokens {
        // The legacy API's default.
        None => Some(16),
        Some(0) if req.echo => Some(0),
        m => max_tokens(m, "max_tokens")?,
    };
    let logprob_token_ids = match &req.logprob_token_ids {
        None => Vec::new(),
        Some(ids) if ids.is_empty() => {
            return Err(ApiError::invalid(
                "logprob_token_ids",
                "`logprob_token_ids` must not be an empty list.",
            ))
        }
        Some(_) if logprobs.is_none() => {
            return Err(ApiError::invalid(
                "logprob_token_ids",
                "when using `logprob_token_ids`, `logprobs` must be set.",
            ))
        }
        Some(ids) if ids.len() > limits.max_logprob_token_ids => {
            return Err(ApiError::invalid(
                "logprob_token_ids",
                format!(
                    "`logprob_token_ids` takes at most {} ids (vLLM's limit); got {}: send \
                     fewer, or spread them over several requests",
                    limits.max_logprob_token_ids,
                    ids.len()
                ),
            ))
        }
        Some(ids) => token_ids(ids, "logprob_token_ids")?,
    };
    // As vLLM 0.33 (completion/protocol.py, `check_logprobs`): the ids are
    // read at generated tokens, and this request generates none.
    if req.echo && max == Some(0) && !logprob_token_ids.is_empty() {
        return Err(ApiError::invalid(
            "logprob_token_ids",
            "`logprob_token_ids` is read at generated tokens, and `echo` with `max_tokens: 0` \
             generates none: set `max_tokens` to 1 or more, or leave `logprob_token_ids` out",
        ));
    }
    Ok(CompletionJob {
        prompt,
        echo: req.echo,
        params: GenerationParams {
            max_tokens: max,
            sampling: sampling(req.temperature, req.top_p, req.seed)?,
            stop: stops(&req.stop, limits)?,
            logprobs,
            prompt_logprobs: if req.echo { logprobs } else { None },
            ignore_eos: req.ignore_eos,
            logprob_token_ids,
            prompt_field: "prompt",
        },
        include_usage: req
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage == Some(true)),
    })
}

/// `stream_options` with a field needs `stream: true`; an empty object is
/// taken without it, as vLLM 0.33 does.
fn stream_options(options: Option<&StreamOptions>, stream: bool) -> Result<(), ApiError> {
    if options.is_some_and(StreamOptions::is_set) && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` needs `stream: true`",
        ));
    }
    Ok(())
}

/// `multi_question`: one of the mode names; whether the backend runs it is
/// the route's to say.
pub fn multi_question(mode: Option<&str>) -> Result<Option<MultiQuestion>, ApiError> {
    mode.map(|m| {
        MultiQuestion::parse(m).ok_or_else(|| {
            ApiError::invalid(
                "multi_question",
                format!("multi_question must be `sequential`, `warm` or `packed`; got `{m}`"),
            )
        })
    })
    .transpose()
}

/// The questions of `POST /v1/decide`.
pub fn decide(
    req: &DecideRequest,
    tasks: &TaskRegistry,
) -> Result<(Vec<Question>, Option<MultiQuestion>), ApiError> {
    let mode = multi_question(req.multi_question.as_deref())?;
    if req.state.trim().is_empty() {
        return Err(ApiError::invalid("state", "the state is empty"));
    }
    if req.questions.is_empty() || req.questions.len() > MAX_QUESTIONS {
        return Err(ApiError::invalid(
            "questions",
            format!(
                "a request takes 1 to {MAX_QUESTIONS} questions; got {}",
                req.questions.len()
            ),
        ));
    }
    let questions = req
        .questions
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let param = format!("questions[{i}]");
            if let Some(name) = &q.task {
                // The request's shape first, then what the server holds.
                task_alone(q.text.is_some(), q.options.is_some(), &param)?;
                let question = tasks.question(
                    name,
                    q.id.clone(),
                    q.abstain_below,
                    q.temperature,
                    &format!("{param}.task"),
                )?;
                check_question(&question, &param)?;
                return Ok(question);
            }
            let text = q.text.clone().ok_or_else(|| {
                ApiError::invalid(&format!("{param}.text"), "a question needs `text`")
            })?;
            let options = q.options.clone().ok_or_else(|| {
                ApiError::invalid(&format!("{param}.options"), "a question needs `options`")
            })?;
            let question = Question {
                id: q.id.clone(),
                text,
                options,
                abstain_below: q.abstain_below,
                temperature: q.temperature,
                head: None,
            };
            check_question(&question, &param)?;
            Ok(question)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok((questions, mode))
}

/// A chat completion with a `decisio` object: the state is every message
/// before the last user message, which is the question.
pub fn chat_decision(
    req: &ChatCompletionRequest,
    d: &DecisioRequest,
    tasks: &TaskRegistry,
) -> Result<(State, Question), ApiError> {
    if req.stream {
        return Err(ApiError::invalid(
            "stream",
            "a decision is answered whole; send it without `stream`",
        ));
    }
    single_choice(req.n)?;
    if d.task.is_some() {
        task_alone(false, d.options.is_some(), "decisio")?;
    }
    let task = d
        .task
        .as_ref()
        .map(|name| tasks.question(name, None, d.abstain_below, d.temperature, "decisio.task"))
        .transpose()?;
    // Generation settings do not apply to a decision: refuse rather than ignore.
    let not_for_decisions = |set: bool, param: &str, hint: &str| -> Result<(), ApiError> {
        if set {
            return Err(ApiError::invalid(
                param,
                format!("`{param}` does not apply to a decision{hint}"),
            ));
        }
        Ok(())
    };
    not_for_decisions(
        req.temperature.is_some(),
        "temperature",
        "; the letters' temperature is `decisio.temperature`",
    )?;
    not_for_decisions(req.top_p.is_some(), "top_p", "")?;
    not_for_decisions(req.stop.is_some(), "stop", "")?;
    not_for_decisions(req.seed.is_some(), "seed", "")?;
    not_for_decisions(req.tools.is_some(), "tools", "")?;
    not_for_decisions(req.tool_choice.is_some(), "tool_choice", "")?;
    not_for_decisions(req.response_format.is_some(), "response_format", "")?;
    not_for_decisions(req.ignore_eos, "ignore_eos", "")?;
    not_for_decisions(
        req.presence_penalty.is_some_and(|p| p != 0.0),
        "presence_penalty",
        "",
    )?;
    not_for_decisions(
        req.frequency_penalty.is_some_and(|p| p != 0.0),
        "frequency_penalty",
        "",
    )?;
    not_for_decisions(
        req.logit_bias.as_ref().is_some_and(|m| !m.is_empty()),
        "logit_bias",
        "",
    )?;
    not_for_decisions(req.top_k.is_some_and(|k| k != 0 && k != -1), "top_k", "")?;
    not_for_decisions(req.min_p.is_some_and(|p| p != 0.0), "min_p", "")?;
    not_for_decisions(
        req.repetition_penalty.is_some_and(|p| p != 1.0),
        "repetition_penalty",
        "",
    )?;
    not_for_decisions(
        req.chat_template_kwargs.is_some(),
        "chat_template_kwargs",
        "; decisions render with the template's defaults and thinking off",
    )?;
    for (value, param) in [
        (req.max_tokens, "max_tokens"),
        (req.max_completion_tokens, "max_completion_tokens"),
    ] {
        not_for_decisions(
            value.is_some_and(|n| n != 1),
            param,
            "; a decision is one token (send 1 or leave it out)",
        )?;
    }
    let messages = messages(&req.messages)?;
    let last = messages.len() - 1;
    if messages[last].get("role").and_then(Value::as_str) != Some("user") {
        return Err(ApiError::invalid(
            &format!("messages[{last}].role"),
            "the last message of a decision must be the user's question",
        ));
    }
    let text = messages[last]
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let question = match task {
        // The task's own question is asked; the last user message must
        // still be there, as on every decision.
        Some(question) => question,
        None => Question {
            id: None,
            text,
            options: d.options.clone().ok_or_else(|| {
                ApiError::invalid("decisio.options", "a decision needs `options` (or `task`)")
            })?,
            abstain_below: d.abstain_below,
            temperature: d.temperature,
            head: None,
        },
    };
    check_question(&question, "decisio")?;
    if messages.len() < 2 {
        return Err(ApiError::invalid(
            "messages",
            "a decision needs a state: at least one message before the question",
        ));
    }
    Ok((State::Messages(messages[..last].to_vec()), question))
}

/// A question that names a task takes its text and options from the task.
fn task_alone(text: bool, options: bool, param: &str) -> Result<(), ApiError> {
    for (set, field) in [(text, "text"), (options, "options")] {
        if set {
            return Err(ApiError::invalid(
                &format!("{param}.{field}"),
                format!("a question that names a `task` takes its {field} from the task; leave `{field}` out"),
            ));
        }
    }
    Ok(())
}

/// Bounds of a share or probability in (0, 1] (or (0, 1) when `open`).
fn unit(value: f64, open: bool, param: &str) -> Result<f64, ApiError> {
    let ok = value.is_finite() && value > 0.0 && (value < 1.0 || (!open && value == 1.0));
    if !ok {
        let range = if open { "(0, 1)" } else { "(0, 1]" };
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be in {range}; got {value}"),
        ));
    }
    Ok(value)
}

/// A registration: a task spec and its examples, each label an option's
/// index, or a 400 naming the field.
/// `layers` is the backend's tappable blocks (`None`: it returns no hidden
/// states, so intent tasks are refused), `backend` its name and `hint`
/// what would make it return them.
pub fn task(
    req: &TaskRequest,
    limits: &Limits,
    layers: Option<usize>,
    backend: &str,
    hint: &str,
) -> Result<(TaskSpec, Vec<Example>), ApiError> {
    let name = req.name.trim();
    if name.is_empty()
        || name.len() > limits.max_task_name_bytes
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(ApiError::invalid(
            "name",
            format!(
                "a task name is 1 to {} characters of A-Z, a-z, 0-9, `-`, `_` and `.`; got `{}`",
                limits.max_task_name_bytes, req.name
            ),
        ));
    }
    let kind = match req.kind.as_deref() {
        None | Some("choice") => Kind::Choice,
        Some("intent") => Kind::Intent,
        Some(other) => {
            return Err(ApiError::invalid(
                "kind",
                format!("`kind` must be `choice` or `intent`; got `{other}`"),
            ))
        }
    };
    let (labels, field, head_layer, draws) = match kind {
        Kind::Choice => {
            choice_only(req)?;
            (choice_options(req)?, "options", None, None)
        }
        Kind::Intent => {
            let Some(layers) = layers else {
                return Err(ApiError::invalid(
                    "kind",
                    format!(
                        "`intent` tasks read hidden states, which the {backend} backend does \
                         not return{hint}; register a `choice` task (up to 26 options)"
                    ),
                ));
            };
            (
                intent_labels(req, limits)?,
                "labels",
                head_layer(req, layers)?,
                draws(req, limits)?,
            )
        }
    };
    let n = req.examples.len();
    if n < 2 || n > limits.max_task_examples {
        return Err(ApiError::invalid(
            "examples",
            format!(
                "a registration takes 2 to {} examples; got {n}",
                limits.max_task_examples
            ),
        ));
    }
    let mut counts = vec![0usize; labels.len()];
    let mut examples = Vec::with_capacity(n);
    for (i, e) in req.examples.iter().enumerate() {
        if e.state.trim().is_empty() {
            return Err(ApiError::invalid(
                &format!("examples[{i}].state"),
                "the state is empty",
            ));
        }
        let label = labels
            .iter()
            .position(|l| l == e.label.trim())
            .ok_or_else(|| {
                ApiError::invalid(
                    &format!("examples[{i}].label"),
                    format!("the label `{}` is not one of the task's {field}", e.label),
                )
            })?;
        counts[label] += 1;
        examples.push(Example {
            state: e.state.clone(),
            label,
        });
    }
    if let Some(j) = counts.iter().position(|&c| c == 0) {
        return Err(ApiError::invalid(
            &format!("{field}[{j}]"),
            format!(
                "the {} `{}` has no example",
                &field[..field.len() - 1],
                labels[j]
            ),
        ));
    }
    let holdout = unit(req.holdout.unwrap_or(0.2), true, "holdout")?;
    let seed = match req.seed {
        None => 0,
        Some(s) if s >= 0 => s as u64,
        Some(s) => {
            return Err(ApiError::invalid(
                "seed",
                format!("`seed` must be 0 or more; got {s}"),
            ))
        }
    };
    let abstention = match &req.abstention {
        None => None,
        Some(a) => match (a.target_accuracy, a.abstain_below) {
            (Some(t), None) => Some(Abstention::TargetAccuracy(unit(
                t,
                false,
                "abstention.target_accuracy",
            )?)),
            (None, Some(b)) => Some(Abstention::AbstainBelow(unit(
                b,
                false,
                "abstention.abstain_below",
            )?)),
            _ => {
                return Err(ApiError::invalid(
                    "abstention",
                    "`abstention` takes exactly one of `target_accuracy` and `abstain_below`",
                ))
            }
        },
    };
    Ok((
        TaskSpec {
            name: name.to_string(),
            kind,
            question: req.question.trim().to_string(),
            labels,
            holdout,
            seed,
            abstention,
            head_layer,
            draws,
        },
        examples,
    ))
}

/// Fields of intent tasks, refused on a choice task.
fn choice_only(req: &TaskRequest) -> Result<(), ApiError> {
    for (set, field) in [
        (req.labels.is_some(), "labels"),
        (req.head.is_some(), "head"),
        (req.draws.is_some(), "draws"),
        (req.shots.is_some(), "shots"),
    ] {
        if set {
            return Err(ApiError::invalid(
                field,
                format!(
                    "`{field}` applies to `intent` tasks only (a `choice` task takes `options`)"
                ),
            ));
        }
    }
    Ok(())
}

/// A choice task's options, checked as a decision's question is.
fn choice_options(req: &TaskRequest) -> Result<Vec<String>, ApiError> {
    let options = req
        .options
        .clone()
        .ok_or_else(|| ApiError::invalid("options", "a `choice` task needs `options`"))?;
    let probe = Question {
        id: None,
        text: req.question.clone(),
        options,
        abstain_below: None,
        temperature: None,
        head: None,
    };
    // The same rules as a decision's question, with the registration's names.
    check_question(&probe, "task").map_err(|e| match ApiError::from(e) {
        ApiError::BadRequest { message, param } => ApiError::BadRequest {
            message,
            param: param.map(|p| {
                p.trim_start_matches("task.")
                    .replacen("text", "question", 1)
            }),
        },
        other => other,
    })?;
    Ok(probe.options.iter().map(|o| o.trim().to_string()).collect())
}

/// An intent task's labels: 2 to `max_task_labels`, none empty, none
/// twice, none longer than `max_task_label_bytes`.
fn intent_labels(req: &TaskRequest, limits: &Limits) -> Result<Vec<String>, ApiError> {
    if req.options.is_some() {
        return Err(ApiError::invalid(
            "options",
            "an `intent` task takes `labels`; `options` are for `choice` tasks",
        ));
    }
    if req.question.trim().is_empty() {
        return Err(ApiError::invalid("question", "the question is empty"));
    }
    let labels = req
        .labels
        .as_ref()
        .ok_or_else(|| ApiError::invalid("labels", "an `intent` task needs `labels`"))?;
    let max = limits.max_task_labels;
    if labels.len() < 2 || labels.len() > max {
        return Err(ApiError::invalid(
            "labels",
            format!(
                "an intent task takes 2 to {max} labels; got {}",
                labels.len()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(labels.len());
    for (i, l) in labels.iter().enumerate() {
        let l = l.trim();
        if l.is_empty() {
            return Err(ApiError::invalid(
                &format!("labels[{i}]"),
                "a label is empty",
            ));
        }
        if l.len() > limits.max_task_label_bytes {
            return Err(ApiError::invalid(
                &format!("labels[{i}]"),
                format!(
                    "a label is at most {} bytes; this one is {}",
                    limits.max_task_label_bytes,
                    l.len()
                ),
            ));
        }
        if !seen.insert(l) {
            return Err(ApiError::invalid(
                &format!("labels[{i}]"),
                format!("the label `{l}` appears twice"),
            ));
        }
        out.push(l.to_string());
    }
    Ok(out)
}

/// `head.layer`: -1 or absent for the final norm's output, else a block
/// index below `layers`.
fn head_layer(req: &TaskRequest, layers: usize) -> Result<Option<usize>, ApiError> {
    match req.head.as_ref().and_then(|h| h.layer) {
        None | Some(-1) => Ok(None),
        Some(k) if layers == 0 => Err(ApiError::invalid(
            "head.layer",
            format!(
                "this backend returns the final norm's output only (its head upstream's \
                 embeddings), so `head.layer` must be -1 or left out; got {k}"
            ),
        )),
        Some(k) if k >= 0 && (k as u64) < layers as u64 => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid(
            "head.layer",
            format!(
                "`head.layer` is -1 (the final norm's output) or a block of this model, 0 to {}; \
                 got {k}",
                layers.saturating_sub(1)
            ),
        )),
    }
}

/// `draws` and `shots`: both or neither, draws 1 to `max_task_draws`,
/// shots 1 to `max_task_examples`.
fn draws(req: &TaskRequest, limits: &Limits) -> Result<Option<DrawSpec>, ApiError> {
    match (req.draws, req.shots) {
        (None, None) => Ok(None),
        (Some(d), Some(s)) => {
            if d < 1 || d as u64 > limits.max_task_draws as u64 {
                return Err(ApiError::invalid(
                    "draws",
                    format!("`draws` is 1 to {}; got {d}", limits.max_task_draws),
                ));
            }
            if s < 1 || s as u64 > limits.max_task_examples as u64 {
                return Err(ApiError::invalid(
                    "shots",
                    format!(
                        "`shots` (examples per label in each draw) is 1 to {}; got {s}",
                        limits.max_task_examples
                    ),
                ));
            }
            Ok(Some(DrawSpec {
                draws: d as usize,
                shots: s as usize,
            }))
        }
        (Some(_), None) => Err(ApiError::invalid(
            "shots",
            "`draws` needs `shots`: the examples per label in each draw",
        )),
        (None, Some(_)) => Err(ApiError::invalid(
            "draws",
            "`shots` needs `draws`: how many heads to fit",
        )),
    }
}
