//! `POST /v1/decide`: its request and response bodies, its validation and
//! its handler; and the decision's shapes that a chat completion's
//! `decisio` reply shares (the state, an answer).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::body::read_json;
use super::error::ApiError;
use super::fields::int;
use super::{new_id, unix_now, AppState};
use crate::tasks::{Ask, TaskOutcome, TaskRegistry};
use crate::text_route::decide::{check_question, checked_orders, is_blank, MAX_QUESTIONS};
use crate::text_route::MultiQuestion;
use crate::text_route::{Answer, Decision, Question, State as RouteState};

type Result<T> = std::result::Result<T, ApiError>;

/// One question of `POST /v1/decide`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideQuestion {
    pub id: Option<String>,
    pub text: Option<String>,
    pub options: Option<Vec<String>>,
    pub abstain_below: Option<f64>,
    pub temperature: Option<f64>,
    pub task: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    pub model: Option<String>,
    pub state: String,
    pub questions: Vec<DecideQuestion>,
    pub multi_question: Option<String>,
    /// Each question read in this many cyclic orders of its options and
    /// answered from their average (`text_route::decide::orders`).
    #[serde(default, deserialize_with = "int::opt")]
    pub x_orders: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StateOut {
    pub hash: String,
    pub tokens: usize,
    pub cached: bool,
    /// Set when the state is longer than the served base is documented for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AnswerOut {
    pub id: Option<String>,
    pub letter: Option<String>,
    pub index: Option<usize>,
    pub option: Option<String>,
    /// An intent task's answer: the chosen label (null when abstained);
    /// absent on letter answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<Option<String>>,
    /// Calibrated probability of each option, by letter (an intent task's:
    /// of each label, by label).
    pub probabilities: Map<String, Value>,
    /// Raw log-probability of each option's letter over the vocabulary
    /// (empty for an intent task).
    pub letter_logprobs: Map<String, Value>,
    pub temperature: f32,
    pub abstained: bool,
    pub abstain_reason: Option<String>,
    pub tie: bool,
    /// The cyclic orders the answer was averaged over, when the request
    /// asked `x_orders`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_orders: Option<usize>,
    /// The options (letters, or an intent task's labels) of the prediction
    /// set, when the question names a task registered with `x_coverage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_prediction_set: Option<Vec<String>>,
    /// A certified task's verdict: `x_certified`, `x_certificate` and,
    /// when not certified, `x_certified_reason` (unprefixed with
    /// `--reference-field-names`).
    #[serde(flatten)]
    pub certification: Map<String, Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecideUsage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct DecideResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub state: StateOut,
    pub answers: Vec<AnswerOut>,
    pub usage: DecideUsage,
}

/// `multi_question`: one of the mode names; whether the backend runs it is
/// the route's to say.
fn multi_question(mode: Option<&str>) -> Result<Option<MultiQuestion>> {
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
fn validate(
    req: &DecideRequest,
    tasks: &TaskRegistry,
) -> Result<(Vec<Ask>, Option<MultiQuestion>)> {
    let mode = multi_question(req.multi_question.as_deref())?;
    if is_blank(&req.state) {
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
                return Ok(Ask {
                    question,
                    task: Some(name.clone()),
                    own_temperature: q.temperature.is_some(),
                });
            }
            let text = q.text.clone().ok_or_else(|| {
                ApiError::invalid(&format!("{param}.text"), "a question needs `text`")
            })?;
            let options = q.options.clone().ok_or_else(|| {
                ApiError::invalid(&format!("{param}.options"), "a question needs `options`")
            })?;
            let question = Question::new(text, options)
                .with_id(q.id.clone())
                .with_abstention(q.abstain_below)
                .with_temperature(q.temperature);
            check_question(&question, &param)?;
            Ok(Ask {
                question,
                task: None,
                own_temperature: q.temperature.is_some(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((questions, mode))
}

/// A question that names a task takes its text and options from the task.
pub fn task_alone(text: bool, options: bool, param: &str) -> Result<()> {
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

pub fn answer_out(a: &Answer) -> AnswerOut {
    let map = |pairs: &[(String, f32)]| -> Map<String, Value> {
        pairs
            .iter()
            .map(|(l, v)| (l.clone(), Value::from(*v)))
            .collect()
    };
    AnswerOut {
        id: a.id.clone(),
        letter: a.letter.clone(),
        index: a.index,
        option: a.option.clone(),
        label: a.intent.then(|| a.option.clone()),
        probabilities: map(&a.probabilities),
        letter_logprobs: map(&a.logprobs),
        temperature: a.temperature,
        abstained: a.abstained,
        abstain_reason: a.abstain_reason.clone(),
        tie: a.tie,
        x_orders: None,
        x_prediction_set: None,
        certification: Map::new(),
    }
}

impl AnswerOut {
    /// The answer with what its question's task adds (the decision
    /// service's [`TaskOutcome`]): the prediction set by the answer's own
    /// names (letters, or an intent task's labels) and the certificate's
    /// fields. `/v1/decide` and a chat decision add them alike.
    pub fn with_outcome(self, outcome: &TaskOutcome, a: &Answer, reference_names: bool) -> Self {
        Self {
            x_prediction_set: outcome
                .prediction_set
                .as_ref()
                .map(|set| set.iter().map(|&i| a.probabilities[i].0.clone()).collect()),
            certification: outcome
                .verdict
                .as_ref()
                .map(|v| v.fields(reference_names))
                .unwrap_or_default(),
            ..self
        }
    }
}

pub fn state_out(d: &Decision) -> StateOut {
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
    state.ready()?;
    let (asks, mode) = validate(&body, &state.tasks)?;
    let orders = body.x_orders.map_or(Ok(1), checked_orders)?;
    let decided = state
        .tasks
        .decide(RouteState::Text(body.state), asks, mode, orders)
        .await?;
    let decision = &decided.decision;
    Ok(HttpResponse::Ok().json(DecideResponse {
        id: new_id("decide"),
        object: "decision",
        created: unix_now(),
        model: state.model_name.clone(),
        state: state_out(decision),
        answers: decision
            .answers
            .iter()
            .zip(&decided.outcomes)
            .map(|(a, outcome)| AnswerOut {
                x_orders: body.x_orders.map(|_| a.orders),
                ..answer_out(a).with_outcome(outcome, a, state.reference_field_names)
            })
            .collect(),
        usage: DecideUsage {
            prompt_tokens: decision.prompt_tokens,
            cached_tokens: decision.cached_tokens,
            completion_tokens: 0,
            total_tokens: decision.prompt_tokens,
        },
    }))
}
