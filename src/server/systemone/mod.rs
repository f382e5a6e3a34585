//! `POST /v1/systemone`: TypeSafe's System One wire, as the reference
//! decisio 0.35.0 answers it (`decisio/serve/systemone.py`).
//!
//! A request is a state and a map of typed questions (`noul`, `choice` with
//! 2 to 255 named options, `score` with 2 to 10 levels). Each question is
//! translated onto the text route as the reference asks it
//! ([`to_asked`]: default instructions, index keys hidden, snake_case labels
//! shown with spaces, yes/no as a two-option letter choice with its sides
//! named) and answered there, one continuation of the state each, so an
//! answer is the same bits whatever else the request asks. Answers are keyed
//! by the question ids and the option keys exactly as sent.
//!
//! The files: `request` (the wire's request, validated, every fault
//! named), `ask` (a question as the route asks it, and its answer),
//! `error` (errors in System One's shape), [`abstention`] (the abstention
//! tasks' routes and their decision on an answer); this file holds the
//! handler and the model list.
//!
//! Errors on this route are in System One's shape: 422
//! `{"detail": [{"loc", "msg", "type"}]}` for a body that does not validate,
//! `{"detail": {"error_type", "message"}}` for everything else. Fields
//! beyond the wire's are `x_`-prefixed.

pub mod abstention;
mod ask;
mod error;
mod request;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::{json, Map, Value};

pub use self::ask::{
    canonical_digest, choice_confidence, confidence_of, render_text, score_confidence, state_text,
    task_identity, to_asked, wire_answer, Asked,
};
pub use self::error::{wire_shaped, Detail, WireError};
pub use self::request::{parse_one, parse_request, Criteria, Kind, WireQuestion, WireRequest};
use super::error::ApiError;
use super::AppState;
use crate::prompt::python::CivilTime;
use crate::route::wire::MAX_LABELS;
use crate::route::{Question, State};

/// The model alias every System One client may send (the SDKs' default).
pub const MODEL_ALIAS: &str = "jev-latest";

/// Levels a score question takes.
pub const SCORE_LEVELS: (usize, usize) = (2, 10);

/// Options a choice question takes.
pub const CHOICE_OPTIONS: (usize, usize) = (2, MAX_LABELS);

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
    Ok(HttpResponse::Ok().json(respond(&state, &request).await?))
}

/// A request's questions as the route asks them: each one's keys and
/// layout (`asked`), its task identity, the registered task that answers
/// it (with its name), and the route's question, in the request's order.
pub struct Planned {
    pub asked: Vec<Asked>,
    pub identities: Vec<String>,
    pub tasks: Vec<Option<(Question, String)>>,
    pub questions: Vec<Question>,
}

/// Plans a validated request's questions: a registered task of the
/// question's identity answers it with its temperature, threshold or head
/// (`tasks`); the others are asked with the base's temperature of their
/// type. Serving and an abstention task's registration ask alike.
pub fn plan(state: &AppState, request: &WireRequest) -> Planned {
    let settings = state.route.wire;
    let asked: Vec<Asked> = request
        .questions
        .iter()
        .map(|(_, q)| to_asked(q, settings.noul))
        .collect();
    let identities: Vec<String> = request
        .questions
        .iter()
        .zip(&asked)
        .map(|((_, q), a)| task_identity(q, a, settings.noul))
        .collect();
    let tasks: Vec<Option<(Question, String)>> = identities
        .iter()
        .map(|identity| state.tasks.wire_question(identity))
        .collect();
    let questions: Vec<Question> = request
        .questions
        .iter()
        .zip(&asked)
        .zip(&tasks)
        .map(|(((id, q), a), task)| match task {
            Some((question, _)) => question.clone().with_id(Some(id.clone())),
            None => Question::new(a.instructions.clone(), a.options.clone())
                .with_id(Some(id.clone()))
                .with_temperature(Some(settings.temperature_of(q.kind == Kind::Choice)))
                .with_wire(Some(a.ask.clone())),
        })
        .collect();
    Planned {
        asked,
        identities,
        tasks,
        questions,
    }
}

/// Answers a validated request as `POST /v1/systemone` does: the
/// response body.
pub async fn respond(state: &AppState, request: &WireRequest) -> Result<Value, WireError> {
    let Planned {
        asked,
        identities,
        tasks,
        questions,
    } = plan(state, request);
    // Counted before any work: a state longer than the context is refused
    // from its length alone (413), then the texts are tokenized for
    // `usage.input_tokens` on the blocking pool, off the HTTP worker.
    let text = State::Text(state_text(&request.state));
    state.route.check_state_size(&text)?;
    let mut texts: Vec<String> = state.route.wire_header(&questions).into_iter().collect();
    for q in &questions {
        // An intent task's question is its instructions alone.
        texts.push(match q.head {
            Some(_) => q.text.clone(),
            None => state.route.wire_question_text(q)?,
        });
    }
    let route = state.route.clone();
    let (text, input_tokens) = web::block(move || {
        let mut n = match &text {
            State::Text(state_text) => route.count_state_tokens(state_text)?,
            State::Messages(_) => 0,
        };
        for t in &texts {
            n += route.count_tokens(t)?;
        }
        Ok::<_, crate::route::RouteError>((text, n))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let started = std::time::Instant::now();
    let decision = state
        .route
        .decide_in_orders(text, questions, None, request.orders.unwrap_or(1))
        .await?;
    let per_question = started.elapsed().as_secs_f64() / request.questions.len() as f64;
    let mut answers = Map::new();
    for (((((id, q), a), answer), task), identity) in request
        .questions
        .iter()
        .zip(&asked)
        .zip(&decision.answers)
        .zip(&tasks)
        .zip(&identities)
    {
        let mut out = wire_answer(q, a, answer);
        if let Some((question, name)) = task {
            out.insert("x_task".into(), json!(name));
            if question.abstain_below.is_some() {
                out.insert("x_abstained".into(), json!(answer.abstained));
            }
            // System One sets no temperature of its own.
            let outcome = state.tasks.outcome(name, answer, false);
            if let Some(set) = outcome.prediction_set {
                let keys: Vec<&String> = set.iter().map(|&i| &a.keys[i]).collect();
                out.insert("x_prediction_set".into(), json!(keys));
            }
            if let Some(v) = outcome.verdict {
                out.extend(v.fields(state.reference_field_names));
            }
        } else if let Some(v) = state.tasks.stale_verdict(identity) {
            out.extend(v.fields(state.reference_field_names));
        }
        abstention::apply(state, q, a, &answer.exact, &mut out);
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
    Ok(json!({
        "model": request.model.as_deref().unwrap_or(&state.model_name),
        "answers": answers,
        "usage": {"input_tokens": input_tokens, "output_tokens": request.questions.len()},
        "x_state": {
            "hash": decision.state.hash.hex(),
            "tokens": decision.state.tokens,
            "cached": decision.state.cached,
        },
    }))
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
