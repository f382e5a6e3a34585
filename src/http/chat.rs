//! `POST /v1/chat/completions`: its request and response bodies, its
//! validation and its handler. A request is one of three things, told
//! apart once ([`classify`]): a decision (a `decisio` object), a chat with
//! image content parts (passed through to the backend's upstream), or text
//! generation, answered whole or streamed.

use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::body::read_json;
use super::decisions::{answer_out, state_out, task_alone, AnswerOut, StateOut};
use super::error::ApiError;
use super::fields::{int, int_in, null_is_false, unsupported};
use super::messages::{self, first_image_part};
use super::sampling::{max_tokens, sampling_fields, single_choice, StopSpec, StreamOptions};
use super::stream::{collect, event_stream, sse, Usage};
use super::{new_id, unix_now, AppState};
use crate::settings::Limits;
use crate::tasks::{Ask, TaskRegistry};
use crate::text_route::decide::check_question;
use crate::text_route::EngineError;
use crate::text_route::{
    GenerationParams, Output, Question, State as RouteState, TokenChoice, TokenOutput,
};

type Result<T> = std::result::Result<T, ApiError>;

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

/// The `decisio` object of a chat completion that asks for a decision.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisioRequest {
    pub options: Option<Vec<String>>,
    pub abstain_below: Option<f64>,
    pub temperature: Option<f64>,
    pub task: Option<String>,
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

/// What a chat completion asks for, validated.
enum ChatJob {
    /// A decision: the state (every message before the question) and the
    /// question, with the task it names.
    Decision(RouteState, Ask),
    /// Image content parts, for a backend that passes them through to its
    /// upstream's chat route: the body it sends.
    Images(Value),
    /// Text generation.
    Text(TextJob),
}

/// A validated text generation.
struct TextJob {
    messages: Vec<Value>,
    add_generation_prompt: bool,
    template_kwargs: Map<String, Value>,
    params: GenerationParams,
    include_usage: bool,
}

/// Validates a chat completion and says what it asks for: a decision when
/// it has a `decisio` object; else a pass-through when it has image
/// content parts (refused, naming the first, where the backend reads no
/// images); else text generation.
fn classify(req: &ChatCompletionRequest, state: &AppState) -> Result<ChatJob> {
    if let Some(d) = &req.decisio {
        let (route_state, ask) = decision(req, d, &state.tasks)?;
        return Ok(ChatJob::Decision(route_state, ask));
    }
    let Some(part) = first_image_part(&req.messages) else {
        return Ok(ChatJob::Text(generation(req, &state.limits, false)?));
    };
    if let Some(why) = state.route.capabilities().image_refusal {
        return Err(ApiError::invalid(&part, why));
    }
    if req.stream {
        return Err(ApiError::invalid(
            "stream",
            "a chat completion with image content parts is answered whole; send it without \
             `stream`",
        ));
    }
    let job = generation(req, &state.limits, true)?;
    Ok(ChatJob::Images(passthrough_body(req, &job)?))
}

/// Text generation's fields; with `images`, every field is checked as for
/// any chat completion, the image parts aside (the upstream checks those).
fn generation(req: &ChatCompletionRequest, limits: &Limits, images: bool) -> Result<TextJob> {
    let fields = sampling_fields!(req);
    fields.refuse_unsupported()?;
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
    fields.check_stream_options()?;
    let messages = messages::messages(&req.messages, images)?;
    Ok(TextJob {
        messages,
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        params: GenerationParams {
            max_tokens: max,
            logprobs,
            ..fields.params(limits, "messages")?
        },
        include_usage: fields.include_usage(),
    })
}

/// The body a chat completion with image parts goes upstream as: the
/// messages as the client sent them (`image` parts in OpenAI's `image_url`
/// form, [`messages::forwarded`]) and the sampling fields it gave.
fn passthrough_body(req: &ChatCompletionRequest, job: &TextJob) -> Result<Value> {
    let mut body = Map::new();
    body.insert(
        "messages".into(),
        Value::Array(messages::forwarded(&req.messages)?),
    );
    let stop = &job.params.stop;
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
            (!stop.is_empty()).then(|| Value::from(stop.clone())),
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

/// A chat completion with a `decisio` object: the state is every message
/// before the last user message, which is the question.
fn decision(
    req: &ChatCompletionRequest,
    d: &DecisioRequest,
    tasks: &TaskRegistry,
) -> Result<(RouteState, Ask)> {
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
    let not_for_decisions = |set: bool, param: &str, hint: &str| -> Result<()> {
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
    let messages = messages::messages(&req.messages, false)?;
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
        None => Question::new(
            text,
            d.options.clone().ok_or_else(|| {
                ApiError::invalid("decisio.options", "a decision needs `options` (or `task`)")
            })?,
        )
        .with_abstention(d.abstain_below)
        .with_temperature(d.temperature),
    };
    check_question(&question, "decisio")?;
    let state_needed = "a decision needs a state: at least one message before the question";
    if messages.len() < 2 {
        return Err(ApiError::invalid("messages", state_needed));
    }
    let ask = Ask {
        question,
        task: d.task.clone(),
        own_temperature: d.temperature.is_some(),
    };
    Ok((RouteState::Messages(messages[..last].to_vec()), ask))
}

pub async fn chat_completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: ChatCompletionRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    state.ready()?;
    match classify(&body, &state)? {
        ChatJob::Decision(route_state, ask) => answer_decision(&state, route_state, ask).await,
        ChatJob::Images(forwarded) => answer_images(&state, forwarded).await,
        ChatJob::Text(job) => generate(&state, job, body.stream).await,
    }
}

fn choice_top(c: &TokenChoice) -> TopLogprob {
    TopLogprob {
        token: c.text.clone(),
        logprob: c.logprob,
        bytes: c.bytes.clone(),
    }
}

fn chat_logprob(t: &TokenOutput) -> ChatTokenLogprob {
    ChatTokenLogprob {
        token: t.choice.text.clone(),
        logprob: t.choice.logprob,
        bytes: t.choice.bytes.clone(),
        top_logprobs: t.top.iter().map(choice_top).collect(),
    }
}

/// Text generation, answered whole or streamed.
async fn generate(state: &AppState, job: TextJob, stream: bool) -> Result<HttpResponse> {
    let route = &state.route;
    let text = route.render_chat(
        &job.messages,
        job.add_generation_prompt,
        &job.template_kwargs,
    )?;
    let prompt = route.tokenize(&text, false)?;
    let want_logprobs = job.params.logprobs.is_some();
    let generation = route.generate(prompt, job.params)?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let model = state.model_name.clone();

    if !stream {
        let mut logprobs = Vec::new();
        let done = collect(generation, |tokens| {
            logprobs.extend(tokens.iter().map(chat_logprob))
        })
        .await?;
        return Ok(HttpResponse::Ok().json(ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices: vec![ChatChoice {
                index: 0,
                message: ChatMessageOut {
                    role: "assistant",
                    content: done.text,
                },
                logprobs: want_logprobs.then_some(ChatLogprobs { content: logprobs }),
                finish_reason: Some(done.finish_reason),
            }],
            usage: done.usage,
        }));
    }

    let chunk = move |choices: Vec<ChatChunkChoice>, usage: Option<Usage>| ChatCompletionChunk {
        id: id.clone(),
        object: "chat.completion.chunk",
        created,
        model: model.clone(),
        choices,
        usage,
    };
    let include_usage = job.include_usage;
    let first = sse(&chunk(
        vec![ChatChunkChoice {
            index: 0,
            delta: ChatDelta {
                role: Some("assistant"),
                content: Some(String::new()),
            },
            logprobs: None,
            finish_reason: None,
        }],
        None,
    ));
    Ok(event_stream(
        generation,
        (Some(first), Vec::new()),
        move |(first, held), output| {
            let mut out: Vec<Bytes> = first.take().into_iter().collect();
            match output {
                // Tokens without text (the stop token) ride on the finish chunk, as in vLLM.
                Output::Delta { text, tokens } if text.is_empty() => {
                    held.extend(tokens.iter().map(chat_logprob));
                }
                Output::Delta { text, tokens } => out.push(sse(&chunk(
                    vec![ChatChunkChoice {
                        index: 0,
                        delta: ChatDelta {
                            role: None,
                            content: Some(text),
                        },
                        logprobs: want_logprobs.then(|| ChatLogprobs {
                            content: tokens.iter().map(chat_logprob).collect(),
                        }),
                        finish_reason: None,
                    }],
                    None,
                ))),
                Output::Done {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                } => {
                    out.push(sse(&chunk(
                        vec![ChatChunkChoice {
                            index: 0,
                            delta: ChatDelta::default(),
                            logprobs: (want_logprobs && !held.is_empty()).then(|| ChatLogprobs {
                                content: std::mem::take(held),
                            }),
                            finish_reason: Some(finish_reason.as_str()),
                        }],
                        None,
                    )));
                    if include_usage {
                        out.push(sse(&chunk(
                            Vec::new(),
                            Some(Usage::new(prompt_tokens, completion_tokens)),
                        )));
                    }
                }
                Output::Prompt(_) => {}
            }
            out
        },
    ))
}

/// A chat completion with image content parts, passed through to the
/// backend (the vLLM backend sends it to an upstream's chat route) and
/// answered with the upstream's completion under this server's model name.
async fn answer_images(state: &AppState, forwarded: Value) -> Result<HttpResponse> {
    let rx = state
        .route
        .chat_passthrough(forwarded)
        .map_err(ApiError::from)?;
    let mut answer = rx
        .await
        .map_err(|_| ApiError::from(EngineError::Stopped))?
        .map_err(ApiError::from)?;
    if let Some(o) = answer.as_object_mut() {
        o.insert("model".into(), Value::String(state.model_name.clone()));
    }
    Ok(HttpResponse::Ok().json(answer))
}

/// Labels of an intent answer listed in a chat decision's `top_logprobs`
/// (the most likely first); `decisio.answer.probabilities` has them all.
pub const MAX_INTENT_TOP_LOGPROBS: usize = 20;

/// A chat completion carrying a decision: the letter as content, every
/// option letter in `top_logprobs` with its calibrated log-probability (an
/// intent task: the label, and the most likely labels), and what its task
/// adds, from the decision service.
async fn answer_decision(
    state: &AppState,
    route_state: RouteState,
    ask: Ask,
) -> Result<HttpResponse> {
    let decided = state.tasks.decide(route_state, vec![ask], None, 1).await?;
    let decision = &decided.decision;
    let a = &decision.answers[0];
    // Sorted by probability (a stable sort: the earliest option first among
    // equals); an intent task's labels stand for the letters, the most
    // likely MAX_INTENT_TOP_LOGPROBS of them.
    let mut letters: Vec<(String, f32)> = a.calibrated_logprobs.clone();
    letters.sort_by(|x, y| y.1.total_cmp(&x.1));
    if a.intent {
        letters.truncate(MAX_INTENT_TOP_LOGPROBS);
    }
    let top: Vec<TopLogprob> = letters
        .iter()
        .map(|(l, lp)| TopLogprob {
            token: l.clone(),
            logprob: *lp,
            bytes: l.as_bytes().to_vec(),
        })
        .collect();
    let chosen = a.calibrated_logprobs[a.top].clone();
    let completion_tokens = usize::from(!a.abstained);
    let content = if a.intent {
        a.option.clone().unwrap_or_default()
    } else {
        a.letter.clone().unwrap_or_default()
    };
    Ok(HttpResponse::Ok().json(ChatDecision {
        id: new_id("chatcmpl"),
        object: "chat.completion",
        created: unix_now(),
        model: state.model_name.clone(),
        choices: vec![ChatChoice {
            index: 0,
            message: ChatMessageOut {
                role: "assistant",
                content,
            },
            logprobs: Some(ChatLogprobs {
                content: vec![ChatTokenLogprob {
                    token: chosen.0.clone(),
                    logprob: chosen.1,
                    bytes: chosen.0.as_bytes().to_vec(),
                    top_logprobs: top,
                }],
            }),
            finish_reason: Some("stop"),
        }],
        usage: DecisionUsage {
            prompt_tokens: decision.prompt_tokens,
            completion_tokens,
            total_tokens: decision.prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: decision.cached_tokens,
            },
        },
        decisio: DecisioReply {
            state: state_out(decision),
            answer: answer_out(a).with_outcome(
                &decided.outcomes[0],
                a,
                state.reference_field_names,
            ),
        },
    }))
}
