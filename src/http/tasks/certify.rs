//! `POST /v1/tasks/{id}/certify`: certify a ready task again on new
//! labelled examples (the reference decisio's route). `{id}` is the task's
//! id or name; the examples are in either form of registration: the
//! reference's `{request, answer}` (a `/v1/systemone` request asking the
//! task's question) or decisio's `{state, label}`. The settings (`alpha`,
//! `delta`, `min_examples`, `suspend_on_alert`) are read at the top level,
//! as the reference reads them. Answered with the task in the reference's
//! shape.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::Value;

use super::certify_block::certify_spec;
use super::input::example_state;
use super::reference::{answer_key, example_request, reference_out};
use super::{CertifyIn, Result};
use crate::http::body::{parse, read_bytes};
use crate::http::error::ApiError;
use crate::http::AppState;
use crate::tasks::{Example, TaskRecord};
use crate::text_route::systemone::{task_identity, to_asked};

/// The body of `POST /v1/tasks/{id}/certify`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertifyRequest {
    /// `{request, answer}` or `{state, label}`.
    pub examples: Vec<Value>,
    pub alpha: Option<f64>,
    pub delta: Option<f64>,
    #[serde(default, deserialize_with = "crate::http::fields::int::opt")]
    pub min_examples: Option<i64>,
    pub suspend_on_alert: Option<bool>,
}

/// One example as the task's state and label index.
fn example(r: &TaskRecord, v: &Value, i: usize, state: &AppState) -> Result<Example> {
    let wire = r.spec.wire.as_ref();
    let keys = wire.map_or(&r.spec.labels, |w| &w.keys);
    let param = format!("examples[{i}]");
    let (text, key) = match (
        v.get("request"),
        v.get("answer"),
        v.get("state"),
        v.get("label"),
    ) {
        (Some(request), Some(answer), None, None) => {
            let Some(w) = wire else {
                return Err(ApiError::invalid(
                    &param,
                    "this task was not registered from a System One question: give \
                     `{state, label}` examples",
                ));
            };
            let parsed = example_request(request, &format!("{param}.request"))?;
            let noul = state.route.wire.noul;
            let same = parsed.questions.len() == 1
                && parsed
                    .questions
                    .iter()
                    .all(|(_, q)| task_identity(q, &to_asked(q, noul), noul) == w.identity);
            if !same {
                return Err(ApiError::invalid(
                    &format!("{param}.request.questions"),
                    "an example asks exactly one question, the task's (its type, options in \
                     order and instructions)",
                ));
            }
            (
                example_state(&parsed.state, true, &param)?,
                answer_key(answer, &format!("{param}.answer"))?,
            )
        }
        (None, None, Some(s), Some(Value::String(label))) => (
            example_state(s, wire.is_some(), &param)?,
            label.trim().to_string(),
        ),
        _ => {
            return Err(ApiError::invalid(
                &param,
                "an example is `{request, answer}` (the reference's form) or `{state, label}`",
            ))
        }
    };
    let label = keys.iter().position(|k| *k == key).ok_or_else(|| {
        ApiError::invalid(
            &param,
            format!(
                "`{key}` is not one of the task's answers ({})",
                keys.join(", ")
            ),
        )
    })?;
    Ok(Example { state: text, label })
}

pub async fn certify_task(
    req: HttpRequest,
    id: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let bytes = read_bytes(&req, payload, state.limits.max_task_body_bytes).await?;
    let body: CertifyRequest = parse(&bytes)?;
    state.ready()?;
    let record = state.tasks.find(&id)?;
    let spec = certify_spec(
        &CertifyIn {
            alpha: body.alpha,
            delta: body.delta,
            min_examples: body.min_examples,
            holdout: None,
            suspend_on_alert: body.suspend_on_alert,
            examples: None,
        },
        "",
        "",
    )?;
    let examples = body
        .examples
        .iter()
        .enumerate()
        .map(|(i, v)| example(&record, v, i, &state))
        .collect::<Result<Vec<_>>>()?;
    let tasks = state.tasks.clone();
    let key = record.id.clone();
    let updated = web::block(move || tasks.recertify(&key, &examples, spec))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(HttpResponse::Ok().json(reference_out(&updated, &state)))
}
