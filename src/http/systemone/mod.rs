//! `POST /v1/systemone`: TypeSafe's System One wire, as the reference
//! decisio 0.35.0 answers it (`decisio/serve/systemone.py`).
//!
//! A request is a state and a map of typed questions (`noul`, `choice` with
//! 2 to 255 named options, `score` with 2 to 10 levels). This layer parses
//! and validates it into a typed [`WireRequest`], hands it to the decision
//! service ([`crate::tasks::TaskRegistry::systemone`]), which asks each
//! question as the reference does ([`crate::text_route::systemone::to_asked`]:
//! default instructions, index keys hidden, snake_case labels shown with
//! spaces, yes/no as a two-option letter choice with its sides named), one
//! continuation of the state each, so an answer is the same bits whatever
//! else the request asks, and maps the result onto the wire. Answers are
//! keyed by the question ids and the option keys exactly as sent.
//!
//! The files: `request` (the wire's request, validated, every fault
//! named), `answer` (an answer in the wire's shape), `error` (errors in
//! System One's shape), [`abstention`] (the abstention tasks' routes); this
//! file holds the handler and the model list.
//!
//! Errors on this route are in System One's shape: 422
//! `{"detail": [{"loc", "msg", "type"}]}` for a body that does not validate,
//! `{"detail": {"error_type", "message"}}` for everything else. Fields
//! beyond the wire's are `x_`-prefixed.

pub mod abstention;
mod answer;
mod error;
mod request;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::{json, Map, Value};

pub use self::answer::wire_answer;
pub use self::error::{wire_shaped, Detail, WireError};
pub use self::request::{parse_example, parse_one, parse_request, parse_value};
use super::error::ApiError;
use super::AppState;
use crate::prompt::python::CivilTime;
use crate::tasks::{NotThought, Thinking};
use crate::text_route::systemone::WireRequest;

/// The model alias every System One client may send (the SDKs' default).
pub const MODEL_ALIAS: &str = "jev-latest";

/// Whether `model` names what this server serves.
fn serves(state: &AppState, model: &Option<String>) -> bool {
    match model {
        None => true,
        Some(m) => m == &state.model_name || m == MODEL_ALIAS,
    }
}

/// `POST /v1/systemone`.
pub async fn systemone(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, WireError> {
    let body = super::body::read_bytes(&req, payload, state.limits.max_body_bytes).await?;
    let request = parse_request(&body).map_err(WireError::Invalid)?;
    if !serves(&state, &request.model) {
        return Err(ApiError::ModelNotFound(request.model.unwrap_or_default()).into());
    }
    state.ready()?;
    let (body, headers) = respond(&state, &request).await?;
    let mut response = HttpResponse::Ok();
    for header in headers {
        response.insert_header(header);
    }
    Ok(response.json(body))
}

/// Answers a validated request as `POST /v1/systemone` does: the
/// response body, and the headers that say what was done beyond a plain
/// read (a cut state, a header limited, thinking). The decision service decides it
/// ([`TaskRegistry::systemone`](crate::tasks::TaskRegistry::systemone));
/// this maps its result onto the wire.
pub async fn respond(
    state: &AppState,
    request: &WireRequest,
) -> Result<(Value, Vec<(&'static str, String)>), WireError> {
    let decided = state.tasks.systemone(request).await?;
    let per_question = decided.seconds / request.questions.len() as f64;
    let mut answers = Map::new();
    for (i, (((id, q), answered), answer)) in request
        .questions
        .iter()
        .zip(&decided.questions)
        .zip(&decided.decision.answers)
        .enumerate()
    {
        let a = &answered.asked;
        let mut out = wire_answer(q, a, answer, answered.abstention.as_ref());
        if let Some(name) = &answered.task {
            out.insert("x_task".into(), json!(name));
            if answered.abstains {
                out.insert("x_abstained".into(), json!(answer.abstained));
            }
        }
        if let Some(set) = &answered.outcome.prediction_set {
            let keys: Vec<&String> = set.iter().map(|&i| &a.keys[i]).collect();
            out.insert("x_prediction_set".into(), json!(keys));
        }
        if let Some(v) = &answered.outcome.verdict {
            out.extend(v.fields(state.reference_field_names));
        }
        if let Some(abstention) = &answered.abstention {
            out.insert("x_abstained".into(), json!(abstention.abstained));
            out.insert("x_abstention_task".into(), json!(abstention.task));
        }
        if let Some(thinking) = &decided.thinking {
            out.extend(thought_fields(&thinking.per_question[i]));
        }
        let kind = q.kind.as_str();
        state
            .metrics
            .wire_questions
            .with_label_values(&[kind])
            .inc();
        state
            .metrics
            .wire_question_seconds
            .with_label_values(&[kind])
            .observe(per_question);
        // The temperature as set (1.506), not its float32's widening
        // (1.50600004196167): the shortest decimal that reads back as it.
        let temperature: f64 = answer.temperature.to_string().parse().unwrap_or(f64::NAN);
        out.insert("x_temperature".into(), json!(temperature));
        if request.orders.is_some() {
            out.insert("x_orders".into(), json!(answer.orders));
        }
        answers.insert(id.clone(), Value::Object(out));
    }
    let decision = &decided.decision;
    let mut out = json!({
        "model": request.model.as_deref().unwrap_or(&state.model_name),
        "answers": answers,
        "usage": {"input_tokens": decided.input_tokens, "output_tokens": request.questions.len()},
        "x_state": {
            "hash": decision.state.hash.hex(),
            "tokens": decision.state.tokens,
            "cached": decision.state.cached,
        },
    });
    let mut headers = Vec::new();
    if let Some(cut) = &decided.truncated {
        state.metrics.states_truncated.inc();
        state
            .metrics
            .state_tokens_dropped
            .inc_by(cut.dropped() as u64);
        let name = match state.reference_field_names {
            true => "state_truncated",
            false => "x_truncated",
        };
        let mut report = serde_json::to_value(cut).unwrap_or_default();
        report["dropped_tokens"] = json!(cut.dropped());
        out[name] = report;
        let said = format!(
            "kept={}; of={}; part={}",
            cut.kept_tokens, cut.of_tokens, cut.part
        );
        headers.push(("x-decisio-state-truncated", said));
    }
    if let Some(limited) = &decided.header {
        state.metrics.headers_limited.inc();
        state
            .metrics
            .header_lines_dropped
            .inc_by((limited.of - limited.listed) as u64);
        let name = match state.reference_field_names {
            true => "header_limited",
            false => "x_header_limited",
        };
        out[name] = serde_json::to_value(limited).unwrap_or_default();
        headers.push(("x-decisio-layout", limited.header_value()));
    }
    if let Some(thinking) = &decided.thinking {
        let tokens = thinking.tokens();
        let (report, usage) = match state.reference_field_names {
            true => ("thinking", "thinking_tokens"),
            false => ("x_thinking", "x_thinking_tokens"),
        };
        out["usage"]["output_tokens"] = json!(request.questions.len() + tokens);
        out["usage"][usage] = json!(tokens);
        out[report] = thinking_report(request, thinking);
        headers.push((
            "x-decisio-think-ms",
            format!("{:.1}", thinking.seconds * 1e3),
        ));
        headers.push(("x-decisio-think-tokens", tokens.to_string()));
        observe_thinking(state, thinking);
    }
    Ok((out, headers))
}

/// An answer's `x_thought`, and `x_thought_why` where it did not think.
fn thought_fields(thought: &Result<usize, NotThought>) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("x_thought".into(), json!(thought.is_ok()));
    if let Err(why) = thought {
        out.insert("x_thought_why".into(), json!(why.why()));
    }
    out
}

/// The request's `x_thinking`: the reference's `thinking` report.
fn thinking_report(request: &WireRequest, thinking: &Thinking) -> Value {
    let per_question: Map<String, Value> = request
        .questions
        .iter()
        .zip(&thinking.per_question)
        .map(|((id, _), q)| {
            let said = match q {
                Ok(tokens) => json!({"thought": true, "tokens": tokens}),
                Err(why) => json!({"thought": false, "why": why.why()}),
            };
            (id.clone(), said)
        })
        .collect();
    let settings = &thinking.settings;
    json!({
        "questions": thinking.questions(),
        "of": request.questions.len(),
        "tokens": thinking.tokens(),
        "ms": (thinking.seconds * 1e4).round() / 10.0,
        "factor": settings.factor,
        "budget": settings.budget,
        "types": settings.type_names(),
        "per_question": per_question,
    })
}

/// Thinking's metrics: each question's outcome, the tokens and the time.
fn observe_thinking(state: &AppState, thinking: &Thinking) {
    let m = &state.metrics;
    for q in &thinking.per_question {
        let outcome = q.map_or_else(NotThought::label, |_| "thought");
        m.think_questions.with_label_values(&[outcome]).inc();
    }
    m.think_tokens.inc_by(thinking.tokens() as u64);
    if thinking.questions() > 0 {
        m.think_seconds.observe(thinking.seconds);
    }
}

/// One entry of System One's model list.
#[derive(Clone, Debug, Serialize)]
pub struct ModelMetadata {
    pub name: String,
    pub description: &'static str,
    /// `YYYY-MM-DD`: the day this server started serving the model.
    pub release_date: String,
}

/// `GET /v1/models`'s System One part: every name a request's `model` may
/// give (the served name and [`MODEL_ALIAS`]).
pub fn model_metadata(model_name: &str, created: u64) -> Vec<ModelMetadata> {
    let day = CivilTime::from_unix(created as i64, 0);
    let date = format!("{:04}-{:02}-{:02}", day.year, day.month, day.day);
    [model_name, MODEL_ALIAS]
        .iter()
        .map(|name| ModelMetadata {
            name: name.to_string(),
            description: "calibrated answers read from the served model's next-token logits",
            release_date: date.clone(),
        })
        .collect()
}
