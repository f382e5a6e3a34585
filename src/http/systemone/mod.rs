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
use crate::text_route::over_limit::Cut;
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
    let (body, cut) = respond(&state, &request).await?;
    let mut response = HttpResponse::Ok();
    if let Some(cut) = cut {
        let said = format!(
            "kept={}; of={}; part={}",
            cut.kept_tokens, cut.of_tokens, cut.part
        );
        response.insert_header(("x-decisio-state-truncated", said));
    }
    Ok(response.json(body))
}

/// Answers a validated request as `POST /v1/systemone` does: the
/// response body, and the cut where the state was cut (`over_limit`). The decision service decides it
/// ([`TaskRegistry::systemone`](crate::tasks::TaskRegistry::systemone));
/// this maps its result onto the wire.
pub async fn respond(
    state: &AppState,
    request: &WireRequest,
) -> Result<(Value, Option<Cut>), WireError> {
    let decided = state.tasks.systemone(request).await?;
    let per_question = decided.seconds / request.questions.len() as f64;
    let mut answers = Map::new();
    for (((id, q), answered), answer) in request
        .questions
        .iter()
        .zip(&decided.questions)
        .zip(&decided.decision.answers)
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
    }
    Ok((out, decided.truncated))
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
