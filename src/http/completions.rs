//! `POST /v1/completions` (OpenAI's legacy completions, with vLLM's
//! extensions): its request and response bodies, its validation and its
//! handler, answered whole or streamed. A list of prompts is answered as
//! vLLM answers it: one choice per prompt, `index` the prompt's position,
//! each prompt run exactly as if sent alone (one after another), the usage
//! summed; it is not streamed.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::body::read_json;
use super::error::ApiError;
use super::fields::{int, int_in, null_is_false, token_ids, unsupported};
use super::sampling::{max_tokens, sampling_fields, StopSpec, StreamOptions};
use super::stream::{collect, event_stream, sse, Usage};
use super::{new_id, unix_now, AppState};
use crate::settings::Limits;
use crate::text_route::GenerationStream;
use crate::text_route::{GenerationParams, Output, TokenChoice, TokenOutput};

type Result<T> = std::result::Result<T, ApiError>;

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

/// What a completion's prompt is.
enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated completion request.
struct CompletionJob {
    /// One, or several (a list of prompts).
    prompts: Vec<PromptInput>,
    echo: bool,
    params: GenerationParams,
    include_usage: bool,
}

fn validate(req: &CompletionRequest, limits: &Limits) -> Result<CompletionJob> {
    let fields = sampling_fields!(req);
    fields.refuse_unsupported()?;
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    unsupported(&req.suffix, "suffix", "insertion is not supported")?;
    let prompts = match &req.prompt {
        PromptSpec::Text(t) => vec![PromptInput::Text(t.clone())],
        PromptSpec::Tokens(ids) => vec![PromptInput::Tokens(token_ids(ids, "prompt")?)],
        PromptSpec::TextBatch(v) => v.iter().cloned().map(PromptInput::Text).collect(),
        PromptSpec::TokensBatch(v) => v
            .iter()
            .map(|ids| token_ids(ids, "prompt").map(PromptInput::Tokens))
            .collect::<Result<_>>()?,
    };
    check_prompts(&prompts, req.stream, limits)?;
    let logprobs = req
        .logprobs
        .map(|k| int_in(k, 0, limits.max_logprobs as i64, "logprobs").map(|k| k as usize))
        .transpose()?;
    fields.check_stream_options()?;
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
        prompts,
        echo: req.echo,
        params: GenerationParams {
            max_tokens: max,
            logprobs,
            prompt_logprobs: if req.echo { logprobs } else { None },
            logprob_token_ids,
            ..fields.params(limits, "prompt")?
        },
        include_usage: fields.include_usage(),
    })
}

/// The prompts of one request: at least one; a list of several at most
/// the limit, none of them empty, not streamed. Refused on every model, also
/// where the tokenizer's BOS would give an empty text a token, so the
/// description can say it plainly.
fn check_prompts(prompts: &[PromptInput], stream: bool, limits: &Limits) -> Result<()> {
    let empty = |p: &PromptInput| match p {
        PromptInput::Text(t) => t.is_empty(),
        PromptInput::Tokens(ids) => ids.is_empty(),
    };
    match prompts {
        [] => Err(ApiError::invalid(
            "prompt",
            "the list of prompts is empty: send at least one prompt",
        )),
        [PromptInput::Text(t)] if t.is_empty() => {
            Err(ApiError::invalid("prompt", "the prompt is empty"))
        }
        [_] => Ok(()),
        _ if prompts.len() > limits.max_completion_prompts => Err(ApiError::invalid(
            "prompt",
            format!(
                "a request takes at most {} prompts; got {}: split the list over several \
                 requests",
                limits.max_completion_prompts,
                prompts.len()
            ),
        )),
        _ if stream => Err(ApiError::invalid(
            "stream",
            "a list of prompts is answered whole, not streamed: leave `stream` off, or \
             stream one prompt per request",
        )),
        _ => match prompts.iter().position(empty) {
            Some(i) => Err(ApiError::invalid(
                "prompt",
                format!("prompt {i} of the list is empty"),
            )),
            None => Ok(()),
        },
    }
}

/// Accumulates legacy completion log-probabilities.
struct CompletionLogprobBuilder {
    lp: CompletionLogprobs,
    offset: usize,
    /// Name tokens `token_id:N` (vLLM's `return_tokens_as_token_ids`).
    as_ids: bool,
}

impl CompletionLogprobBuilder {
    fn new(offset: usize, as_ids: bool) -> Self {
        CompletionLogprobBuilder {
            lp: CompletionLogprobs::default(),
            offset,
            as_ids,
        }
    }

    fn name(&self, c: &TokenChoice) -> String {
        if self.as_ids {
            format!("token_id:{}", c.id)
        } else {
            c.text.clone()
        }
    }

    fn push(&mut self, t: &TokenOutput) {
        self.lp.tokens.push(self.name(&t.choice));
        self.lp.text_offset.push(self.offset);
        self.offset += t.choice.text.chars().count();
        if t.has_logprob {
            self.lp.token_logprobs.push(Some(t.choice.logprob));
            let mut top = Map::new();
            for c in &t.top {
                top.entry(self.name(c)).or_insert(Value::from(c.logprob));
            }
            self.lp.top_logprobs.push(Some(top));
        } else {
            self.lp.token_logprobs.push(None);
            self.lp.top_logprobs.push(None);
        }
    }

    fn take(&mut self) -> CompletionLogprobs {
        std::mem::take(&mut self.lp)
    }
}

pub async fn completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: CompletionRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    state.ready()?;
    let job = validate(&body, &state.limits)?;
    let route = &state.route;
    let mut prompts = job
        .prompts
        .into_iter()
        .map(|p| prompt_ids(route, p, job.echo))
        .collect::<Result<Vec<_>>>()?;
    route.check_token_ids(&job.params.logprob_token_ids, "logprob_token_ids")?;
    let want_logprobs = job.params.logprobs.is_some();
    let echo = job.echo;
    if prompts.len() > 1 {
        return several(
            &state,
            prompts,
            job.params,
            echo,
            body.return_tokens_as_token_ids,
        )
        .await;
    }
    let (prompt_text, prompt) = prompts.remove(0);
    let generation = route.generate(prompt, job.params)?;
    let shape = Shape {
        id: new_id("cmpl"),
        created: unix_now(),
        model: state.model_name.clone(),
    };

    // With echo, the prompt comes first: its text, and its tokens' log-probabilities.
    let mut builder = CompletionLogprobBuilder::new(0, body.return_tokens_as_token_ids);
    let echoed = if echo { prompt_text } else { String::new() };

    if !body.stream {
        let done = collect(generation, |tokens| {
            tokens.iter().for_each(|t| builder.push(t))
        })
        .await?;
        let logprobs = want_logprobs.then(|| builder.take());
        return Ok(HttpResponse::Ok().json(shape.completion(
            echoed + &done.text,
            logprobs,
            Some(done.finish_reason),
            Some(done.usage),
        )));
    }
    Ok(streamed(
        generation,
        shape,
        (builder, echoed),
        want_logprobs,
        job.include_usage,
    ))
}

/// What every chunk of one completion repeats.
struct Shape {
    id: String,
    created: u64,
    model: String,
}

impl Shape {
    /// The completion (or a chunk of it) of one choice.
    fn completion(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
        usage: Option<Usage>,
    ) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs,
                finish_reason: finish,
            }],
            usage,
        }
    }
}

/// A completion streamed as server-sent events: the echoed prompt (with
/// `echo`) before the first text, each chunk's log-probabilities with it,
/// the finish reason last and, when asked, a chunk of usage alone.
fn streamed(
    generation: GenerationStream,
    shape: Shape,
    echo: (CompletionLogprobBuilder, String),
    want_logprobs: bool,
    include_usage: bool,
) -> HttpResponse {
    let mut echo_pending = !echo.1.is_empty();
    event_stream(generation, echo, move |(builder, echoed), output| {
        let mut out = Vec::new();
        match output {
            Output::Prompt(tokens) => {
                tokens.iter().for_each(|t| builder.push(t));
            }
            // Tokens without text (the stop token that ended the
            // generation) ride on the next chunk, the last: vLLM sends
            // its stop token with the finish reason.
            Output::Delta { text, tokens } if text.is_empty() => {
                tokens.iter().for_each(|t| builder.push(t));
            }
            Output::Delta { text, tokens } => {
                let mut text = text;
                if echo_pending {
                    echo_pending = false;
                    text = std::mem::take(echoed) + &text;
                }
                tokens.iter().for_each(|t| builder.push(t));
                out.push(sse(&shape.completion(
                    text,
                    want_logprobs.then(|| builder.take()),
                    None,
                    None,
                )));
            }
            Output::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            } => {
                let text = if echo_pending {
                    echo_pending = false;
                    std::mem::take(echoed)
                } else {
                    String::new()
                };
                let logprobs =
                    (want_logprobs && !builder.lp.tokens.is_empty()).then(|| builder.take());
                out.push(sse(&shape.completion(
                    text,
                    logprobs,
                    Some(finish_reason.as_str()),
                    None,
                )));
                if include_usage {
                    let mut last = shape.completion(
                        String::new(),
                        None,
                        None,
                        Some(Usage::new(prompt_tokens, completion_tokens)),
                    );
                    last.choices.clear();
                    out.push(sse(&last));
                }
            }
        }
        out
    })
}

/// A prompt's text (for `echo`) and token ids.
fn prompt_ids(
    route: &crate::text_route::TextRoute,
    prompt: PromptInput,
    echo: bool,
) -> Result<(String, Vec<u32>)> {
    Ok(match prompt {
        PromptInput::Text(t) => {
            let ids = route.tokenize(&t, true)?;
            (t, ids)
        }
        PromptInput::Tokens(ids) => {
            route.check_token_ids(&ids, "prompt")?;
            let text = if echo {
                route
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?
            } else {
                String::new()
            };
            (text, ids)
        }
    })
}

/// A list of prompts, answered whole: each run as if sent alone, one after
/// another, its choice at its position in the list (vLLM's `index` with
/// `n` 1), the usage summed over them as vLLM sums it (prompt and
/// completion tokens; `request_output_to_completion_response`,
/// vllm/entrypoints/openai/completion/serving.py).
async fn several(
    state: &AppState,
    prompts: Vec<(String, Vec<u32>)>,
    params: GenerationParams,
    echo: bool,
    as_ids: bool,
) -> Result<HttpResponse> {
    let want_logprobs = params.logprobs.is_some();
    let mut choices = Vec::with_capacity(prompts.len());
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (index, (text, ids)) in prompts.into_iter().enumerate() {
        let generation = state.route.generate(ids, params.clone())?;
        let mut builder = CompletionLogprobBuilder::new(0, as_ids);
        let done = collect(generation, |tokens| {
            tokens.iter().for_each(|t| builder.push(t))
        })
        .await?;
        prompt_tokens += done.usage.prompt_tokens;
        completion_tokens += done.usage.completion_tokens;
        choices.push(CompletionChoice {
            index,
            text: if echo { text + &done.text } else { done.text },
            logprobs: want_logprobs.then(|| builder.take()),
            finish_reason: Some(done.finish_reason),
        });
    }
    Ok(HttpResponse::Ok().json(Completion {
        id: new_id("cmpl"),
        object: "text_completion",
        created: unix_now(),
        model: state.model_name.clone(),
        choices,
        usage: Some(Usage::new(prompt_tokens, completion_tokens)),
    }))
}
