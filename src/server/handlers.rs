//! The route handlers: body → validation → text route → OpenAI shape.

use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::{Map, Value};

use super::body::read_json;
use super::error::ApiError;
use super::types::*;
use super::validate::{self, EmbeddingInputs, PromptInput};
use super::{unix_now, AppState};
use crate::engine::{EngineError, EngineStatus};
use crate::route::{
    Answer, Decision, GenerationStream, Output, State as RouteState, TokenChoice, TokenOutput,
};
use crate::tasks::{Kind, TaskRecord};

type Result<T> = std::result::Result<T, ApiError>;

/// Unique-enough ids for responses: time and a counter.
fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}-{t:016x}{n:08x}")
}

pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound(format!(
        "There is no route {} {}; GET /openapi.json describes the routes this server has.",
        req.method(),
        req.path()
    ))
    .error_response()
}

pub fn method_not_allowed(req: HttpRequest, allow: String) -> HttpResponse {
    ApiError::MethodNotAllowed {
        message: format!(
            "{} does not take {}; it takes {allow}.",
            req.path(),
            req.method()
        ),
        allow,
    }
    .error_response()
}

pub async fn openapi(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(super::openapi::document(&state.served()))
}

pub async fn health(state: web::Data<AppState>) -> Result<HttpResponse> {
    match state.route.engine().status() {
        EngineStatus::Ready => Ok(HttpResponse::Ok().finish()),
        EngineStatus::Loading => Err(crate::engine::EngineError::Loading.into()),
        EngineStatus::Failed(e) => Err(crate::engine::EngineError::LoadFailed(e).into()),
        EngineStatus::Unavailable(e) => {
            Err(crate::engine::EngineError::UpstreamUnavailable(e).into())
        }
    }
}

pub async fn models(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name.clone(),
            object: "model",
            created: state.created,
            owned_by: "decisio",
            root: state.model_root.clone(),
            max_model_len: state.route.context_length(),
            decisio: state.identity(),
        }],
    })
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

/// One server-sent event.
fn sse<T: Serialize>(value: &T) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "{}".into());
    Bytes::from(format!("data: {json}\n\n"))
}

const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// Streams `chunks` built from the route's outputs as server-sent events,
/// closing with `[DONE]`; an error mid-stream is sent as an error event.
fn event_stream<S, F>(stream: GenerationStream, state: S, on_output: F) -> HttpResponse
where
    S: 'static,
    F: FnMut(&mut S, Output) -> Vec<Bytes> + 'static,
{
    struct Feed<S, F> {
        stream: GenerationStream,
        state: S,
        on_output: F,
        finished: bool,
    }
    let feed = Feed {
        stream,
        state,
        on_output,
        finished: false,
    };
    let body = futures::stream::unfold(feed, |mut feed| async move {
        if feed.finished {
            return None;
        }
        let bytes = match feed.stream.next().await {
            Some(Ok(output)) => (feed.on_output)(&mut feed.state, output).concat(),
            Some(Err(e)) => {
                feed.finished = true;
                let mut b = sse(&ApiError::from(e).body()).to_vec();
                b.extend_from_slice(SSE_DONE);
                b
            }
            None => {
                feed.finished = true;
                SSE_DONE.to_vec()
            }
        };
        Some((Ok::<_, actix_web::Error>(Bytes::from(bytes)), feed))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(body)
}

/// A chat completion with image content parts, passed through to the
/// backend (the vLLM backend sends it to an upstream's chat route) and
/// answered with the upstream's completion under this server's model name.
async fn chat_images(state: &AppState, body: &ChatCompletionRequest) -> Result<HttpResponse> {
    let forwarded = validate::chat_passthrough(body, &state.limits)?;
    let rx = state
        .route
        .engine()
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

pub async fn chat_completions(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: ChatCompletionRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    if let Some(d) = &body.decisio {
        return chat_decision(&state, &body, d).await;
    }
    if let Some(part) = validate::first_image_part(&body.messages) {
        return match state.route.engine().capabilities().image_refusal {
            None => chat_images(&state, &body).await,
            Some(why) => Err(ApiError::invalid(&part, why)),
        };
    }
    let job = validate::chat(&body, &state.limits)?;
    let route = &state.route;
    let text = route.render_chat(
        &job.messages,
        job.add_generation_prompt,
        &job.template_kwargs,
    )?;
    let prompt = route.tokenize(&text, false)?;
    let want_logprobs = job.params.logprobs.is_some();
    let mut stream = route.generate(prompt, job.params)?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let model = state.model_name.clone();

    if body.stream {
        let chunk =
            move |choices: Vec<ChatChunkChoice>, usage: Option<Usage>| ChatCompletionChunk {
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
        return Ok(event_stream(stream, Some(first), move |first, output| {
            let mut out: Vec<Bytes> = first.take().into_iter().collect();
            match output {
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
                            logprobs: None,
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
        }));
    }

    let mut content = String::new();
    let mut logprobs = Vec::new();
    loop {
        match stream.next().await {
            Some(Ok(Output::Delta { text, tokens })) => {
                content.push_str(&text);
                logprobs.extend(tokens.iter().map(chat_logprob));
            }
            Some(Ok(Output::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            })) => {
                return Ok(HttpResponse::Ok().json(ChatCompletion {
                    id,
                    object: "chat.completion",
                    created,
                    model,
                    choices: vec![ChatChoice {
                        index: 0,
                        message: ChatMessageOut {
                            role: "assistant",
                            content,
                        },
                        logprobs: want_logprobs.then_some(ChatLogprobs { content: logprobs }),
                        finish_reason: Some(finish_reason.as_str()),
                    }],
                    usage: Usage::new(prompt_tokens, completion_tokens),
                }))
            }
            Some(Ok(Output::Prompt(_))) => {}
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(ApiError::Internal(
                    "the generation ended without a result".into(),
                ))
            }
        }
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
    let job = validate::completion(&body, &state.limits)?;
    let route = &state.route;
    let (prompt_text, prompt) = match job.prompt {
        PromptInput::Text(t) => {
            let ids = route.tokenize(&t, true)?;
            (t, ids)
        }
        PromptInput::Tokens(ids) => {
            route.check_token_ids(&ids, "prompt")?;
            let text = if job.echo {
                route
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?
            } else {
                String::new()
            };
            (text, ids)
        }
    };
    route.check_token_ids(&job.params.logprob_token_ids, "logprob_token_ids")?;
    let want_logprobs = job.params.logprobs.is_some();
    let echo = job.echo;
    let mut stream = route.generate(prompt, job.params)?;
    let id = new_id("cmpl");
    let created = unix_now();
    let model = state.model_name.clone();
    let response = move |text: String,
                         logprobs: Option<CompletionLogprobs>,
                         finish: Option<&'static str>,
                         usage: Option<Usage>| Completion {
        id: id.clone(),
        object: "text_completion",
        created,
        model: model.clone(),
        choices: vec![CompletionChoice {
            index: 0,
            text,
            logprobs,
            finish_reason: finish,
        }],
        usage,
    };

    // With echo, the prompt comes first: its text, and its tokens' log-probabilities.
    let mut builder = CompletionLogprobBuilder::new(0, body.return_tokens_as_token_ids);
    let mut echoed = if echo { prompt_text } else { String::new() };

    if body.stream {
        let include_usage = job.include_usage;
        let mut echo_pending = echo;
        return Ok(event_stream(
            stream,
            (builder, echoed),
            move |(builder, echoed), output| {
                let mut out = Vec::new();
                match output {
                    Output::Prompt(tokens) => {
                        tokens.iter().for_each(|t| builder.push(t));
                    }
                    Output::Delta { text, tokens } => {
                        let mut text = text;
                        if echo_pending {
                            echo_pending = false;
                            text = std::mem::take(echoed) + &text;
                        }
                        tokens.iter().for_each(|t| builder.push(t));
                        out.push(sse(&response(
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
                        let logprobs = (want_logprobs && !builder.lp.tokens.is_empty())
                            .then(|| builder.take());
                        out.push(sse(&response(
                            text,
                            logprobs,
                            Some(finish_reason.as_str()),
                            None,
                        )));
                        if include_usage {
                            let mut last = response(
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
            },
        ));
    }

    loop {
        match stream.next().await {
            Some(Ok(Output::Prompt(tokens))) => tokens.iter().for_each(|t| builder.push(t)),
            Some(Ok(Output::Delta { text, tokens })) => {
                echoed.push_str(&text);
                tokens.iter().for_each(|t| builder.push(t));
            }
            Some(Ok(Output::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            })) => {
                let logprobs = want_logprobs.then(|| builder.take());
                return Ok(HttpResponse::Ok().json(response(
                    echoed,
                    logprobs,
                    Some(finish_reason.as_str()),
                    Some(Usage::new(prompt_tokens, completion_tokens)),
                )));
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(ApiError::Internal(
                    "the generation ended without a result".into(),
                ))
            }
        }
    }
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
        (None, Some(messages)) => {
            let messages = validate::messages(messages)?;
            let text = route.render_chat(
                &messages,
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
    let job = validate::embeddings(&body, &state.limits)?;
    let route = &state.route;
    let caps = route.engine().capabilities();
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
    let tokens = validate::embedding_tokens(&inputs, &state.limits, route.context_length())?;
    let vectors = route
        .engine()
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

pub async fn detokenize(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: DetokenizeRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    let ids = validate::token_ids(&body.tokens, "tokens")?;
    state.route.check_token_ids(&ids, "tokens")?;
    let prompt = state
        .route
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(HttpResponse::Ok().json(DetokenizeResponse { prompt }))
}

fn answer_out(a: &Answer) -> AnswerOut {
    let map = |pairs: &[(String, f32)]| -> Map<String, Value> {
        pairs
            .iter()
            .map(|(l, v)| (l.clone(), Value::from(*v)))
            .collect()
    };
    AnswerOut {
        id: a.id.clone(),
        letter: a.letter,
        index: a.index,
        option: a.option.clone(),
        label: a.intent.then(|| a.option.clone()),
        probabilities: map(&a.probabilities),
        letter_logprobs: map(&a.logprobs),
        temperature: a.temperature,
        abstained: a.abstained,
        abstain_reason: a.abstain_reason.clone(),
        tie: a.tie,
    }
}

fn state_out(d: &Decision) -> StateOut {
    StateOut {
        hash: d.state.hash.hex(),
        tokens: d.state.tokens,
        cached: d.state.cached,
        warning: d.state.warning.clone(),
    }
}

pub async fn decide(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: DecideRequest = read_json(&req, payload, state.limits.max_body_bytes).await?;
    state.check_model(body.model.as_deref())?;
    let (questions, mode) = validate::decide(&body, &state.tasks)?;
    let decision = state
        .route
        .decide(RouteState::Text(body.state), questions, mode)
        .await?;
    Ok(HttpResponse::Ok().json(DecideResponse {
        id: new_id("decide"),
        object: "decision",
        created: unix_now(),
        model: state.model_name.clone(),
        state: state_out(&decision),
        answers: decision.answers.iter().map(answer_out).collect(),
        usage: DecideUsage {
            prompt_tokens: decision.prompt_tokens,
            cached_tokens: decision.cached_tokens,
            completion_tokens: 0,
            total_tokens: decision.prompt_tokens,
        },
    }))
}

/// Labels of an intent answer listed in a chat decision's `top_logprobs`
/// (the most likely first); `decisio.answer.probabilities` has them all.
pub const MAX_INTENT_TOP_LOGPROBS: usize = 20;

/// A chat completion carrying a decision: the letter as content, every
/// option letter in `top_logprobs` with its calibrated log-probability (an
/// intent task: the label, and the most likely labels).
async fn chat_decision(
    state: &AppState,
    body: &ChatCompletionRequest,
    d: &DecisioRequest,
) -> Result<HttpResponse> {
    let (route_state, question) = validate::chat_decision(body, d, &state.tasks)?;
    let decision = state
        .route
        .decide(route_state, vec![question], None)
        .await?;
    let a = &decision.answers[0];
    // Sorted by probability, the earliest option first among equals.
    // (A stable sort: the earliest option first among equals.) An intent
    // task's labels stand for the letters, the most likely
    // MAX_INTENT_TOP_LOGPROBS of them.
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
        a.letter.unwrap_or_default().to_string()
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
            state: state_out(&decision),
            answer: answer_out(a),
        },
    }))
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    state
        .metrics
        .queue_depth
        .set(state.route.engine().queue_depth() as i64);
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

fn task_out(r: &TaskRecord) -> TaskOut {
    TaskOut {
        id: r.id.clone(),
        object: "task",
        name: r.spec.name.clone(),
        kind: r.spec.kind,
        status: r.status,
        created: r.created,
        question: r.spec.question.clone(),
        options: (r.spec.kind == Kind::Choice).then(|| r.spec.labels.clone()),
        labels: (r.spec.kind == Kind::Intent).then(|| r.spec.labels.clone()),
        head: (r.spec.kind == Kind::Intent).then(|| TaskHeadOut {
            layer: r.spec.head_layer.map_or(-1, |l| l as i64),
        }),
        draws: r.spec.draws,
        examples: r.progress.total,
        holdout: r.spec.holdout,
        seed: r.spec.seed,
        abstention: r.spec.abstention,
        progress: r.progress.clone(),
        error: r.error.clone(),
        result: r.report.clone(),
    }
}

/// `POST /v1/tasks`: queues a registration; 202 with the task and its
/// `Location`.
pub async fn create_task(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let body: TaskRequest = read_json(&req, payload, state.limits.max_task_body_bytes).await?;
    let layers = state.route.engine().hidden_layers();
    let caps = state.route.engine().capabilities();
    let (spec, examples) =
        validate::task(&body, &state.limits, layers, caps.name, caps.hidden_hint)?;
    let tasks = state.tasks.clone();
    // Writing the examples to the state folder syncs the disk: off the
    // server's threads.
    let record = web::block(move || tasks.register(spec, examples))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(HttpResponse::Accepted()
        .insert_header(("Location", format!("/v1/tasks/{}", record.id)))
        .json(task_out(&record)))
}

pub async fn list_tasks(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(TaskList {
        object: "list",
        data: state.tasks.list().iter().map(task_out).collect(),
    })
}

pub async fn get_task(id: web::Path<String>, state: web::Data<AppState>) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(task_out(&state.tasks.get(&id)?)))
}

/// `DELETE /v1/tasks/{id}`: removes the task, cancelling its registration
/// first when it is queued or running.
pub async fn delete_task(
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let tasks = state.tasks.clone();
    let id = id.into_inner();
    let deleted = web::block(move || tasks.delete(&id))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(HttpResponse::Ok().json(TaskDeleted {
        id: deleted.record.id,
        object: "task.deleted",
        deleted: true,
        cancelled: deleted.cancelled,
    }))
}
