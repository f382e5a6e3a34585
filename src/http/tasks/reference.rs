//! `POST /v1/tasks` in the reference decisio's form: `{id, examples:
//! [{request, answer}], certify?}`, each example a `/v1/systemone` request
//! with one question. Told apart from decisio's own form by its `id` (and
//! no `name`), turned into that form (a System One choice task named by the
//! `id`), registered, and answered as the reference answers: once the task
//! is ready, with the task, its calibration and its certificate.
//!
//! As the reference does, a choice of at least 10 options with at least 5
//! examples of each is registered as an intent task (a head on the hidden
//! states) where the backend returns hidden states, anything else as a
//! choice task (its labels read with a fitted temperature). Differences,
//! written down in `docs/design/tasks.md`: a failed registration is a 400
//! or 500 in decisio's error shape, and `certify.examples` (a separate
//! certification list) is refused beside a `holdout`.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::validate::MIN_INTENT_OPTIONS;
use super::{shown, CertifyIn, Result, TaskExampleIn, TaskRequest};
use crate::http::body::parse;
use crate::http::error::ApiError;
use crate::http::systemone::parse_example;
use crate::http::AppState;
use crate::tasks::{Status, TaskError, TaskRecord};
use crate::text_route::systemone::WireRequest;

/// How often the handler looks whether the registration is done.
const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The reference's registration body.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceTask {
    /// The task's id: decisio's task name.
    pub id: Value,
    pub examples: Vec<ReferenceExample>,
    pub certify: Option<ReferenceCertify>,
    /// Refused when set, as the reference refuses them.
    pub adapter: Option<Value>,
    pub over_limit: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceExample {
    /// A `/v1/systemone` request with one question.
    pub request: Value,
    /// The answer's key (an option's key, a level's index, `yes`/`no` or
    /// `true`/`false`).
    pub answer: Value,
}

/// The reference's `certify` block: decisio's [`CertifyIn`], its
/// certification examples in the reference's form.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceCertify {
    pub alpha: Option<f64>,
    pub delta: Option<f64>,
    #[serde(default, deserialize_with = "crate::http::fields::int::opt")]
    pub min_examples: Option<i64>,
    pub holdout: Option<f64>,
    pub suspend_on_alert: Option<bool>,
    pub examples: Option<Vec<ReferenceExample>>,
}

/// Whether a body is in the reference's form: an object with `id` and no
/// `name`. The body's top-level keys are scanned and their values skipped
/// unread ([`TopKeys`]): the typed parse that follows is the only one that
/// builds anything from it.
pub fn is_reference_form(body: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<TopKeys>(body),
        Ok(TopKeys {
            id: true,
            name: false
        })
    )
}

/// Which of `id` and `name` a JSON object has at its top level (a key
/// counts whatever its value, `null` included). Anything but an object
/// fails to deserialize.
#[derive(Debug, Default, PartialEq)]
struct TopKeys {
    id: bool,
    name: bool,
}

impl<'de> Deserialize<'de> for TopKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Scan;
        impl<'de> serde::de::Visitor<'de> for Scan {
            type Value = TopKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<TopKeys, A::Error> {
                let mut keys = TopKeys::default();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    match key.as_str() {
                        "id" => keys.id = true,
                        "name" => keys.name = true,
                        _ => {}
                    }
                }
                Ok(keys)
            }
        }
        d.deserialize_map(Scan)
    }
}

/// An example's `request`, read as `/v1/systemone` reads a body, or a
/// 400 naming `param` with the first fault.
pub(super) fn example_request(request: &Value, param: &str) -> Result<WireRequest> {
    parse_example(request.clone()).map_err(|faults| {
        ApiError::invalid(
            param,
            format!(
                "not a /v1/systemone request: {}",
                faults.first().map_or("", |d| d.msg.as_str())
            ),
        )
    })
}

/// An answer as a key: `true`/`false` are `yes`/`no`, numbers their
/// decimal form; `param` names it in errors.
pub(super) fn answer_key(answer: &Value, param: &str) -> Result<String> {
    match answer {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(true) => Ok("yes".into()),
        Value::Bool(false) => Ok("no".into()),
        // An integral number is its integer's decimal form (2.0 is 2).
        Value::Number(n) => Ok(match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        }),
        other => Err(ApiError::invalid(
            param,
            format!("an answer is one of the question's keys; got {other}"),
        )),
    }
}

/// Examples in the reference's form as decisio's `{state, label}`, each
/// asking the one question every example asks (`question`, set by the
/// first); `param` names the list in errors.
fn reference_examples(
    list: &[ReferenceExample],
    param: &str,
    question: &mut Option<Value>,
) -> Result<Vec<TaskExampleIn>> {
    let mut examples = Vec::with_capacity(list.len());
    for (i, ex) in list.iter().enumerate() {
        let request = example_request(&ex.request, &format!("{param}[{i}].request"))?;
        if request.orders.is_some() {
            return Err(ApiError::invalid(
                &format!("{param}[{i}].request.x_orders"),
                "an example is read in its options' order as asked: `x_orders` is not taken in \
                 a task's examples",
            ));
        }
        let q = match ex.request.get("questions").and_then(Value::as_object) {
            Some(qs) if qs.len() == 1 && request.questions.len() == 1 => {
                qs.values().next().cloned().unwrap_or_default()
            }
            _ => {
                return Err(ApiError::invalid(
                    &format!("{param}[{i}].request.questions"),
                    "an example carries exactly one question",
                ))
            }
        };
        match question {
            None => *question = Some(q),
            // The task's identity is checked on the parsed question when it
            // is validated; here the wire forms must agree.
            Some(first) if *first == q => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("{param}[{i}].request.questions"),
                    "the examples must share one question: the same type, options in the same \
                     order and instructions",
                ))
            }
        }
        examples.push(TaskExampleIn {
            state: request.state,
            label: answer_key(&ex.answer, &format!("{param}[{i}].answer"))?,
        });
    }
    Ok(examples)
}

/// The fewest examples of every answer key for the reference form to
/// register an intent head (`MIN_PER_OPTION` of the reference's
/// `decisio/readout/intent_head.py`); the fewest options is
/// [`MIN_INTENT_OPTIONS`].
pub const MIN_PER_OPTION: usize = 5;

/// The registration in decisio's form: an intent task where the reference
/// fits its intent head (a choice of at least [`MIN_INTENT_OPTIONS`]
/// options, at least [`MIN_PER_OPTION`] examples of each, and a backend
/// that returns hidden states: `hidden`), else a choice task.
fn to_request(body: ReferenceTask, hidden: bool) -> Result<TaskRequest> {
    for (field, v) in [("adapter", &body.adapter), ("over_limit", &body.over_limit)] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                field,
                format!(
                    "`{field}` is not accepted when registering a task: a task is fitted on the \
                     served model's readout of whole states"
                ),
            ));
        }
    }
    let Value::String(name) = body.id else {
        return Err(ApiError::invalid("id", "`id` is the task's name, a string"));
    };
    let mut question: Option<Value> = None;
    let examples = reference_examples(&body.examples, "examples", &mut question)?;
    let x_certify = match body.certify {
        None => None,
        Some(c) => Some(CertifyIn {
            alpha: c.alpha,
            delta: c.delta,
            min_examples: c.min_examples,
            holdout: c.holdout,
            suspend_on_alert: c.suspend_on_alert,
            examples: c
                .examples
                .map(|list| reference_examples(&list, "certify.examples", &mut question))
                .transpose()?,
        }),
    };
    let mut counts: std::collections::HashMap<&str, usize> = Default::default();
    for e in &examples {
        *counts.entry(e.label.as_str()).or_default() += 1;
    }
    let keys = question
        .as_ref()
        .and_then(|q| q.get("criteria"))
        .and_then(Value::as_object)
        .filter(|_| question.as_ref().is_some_and(|q| q["type"] == "choice"))
        .map(|c| c.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    let intent = hidden
        && keys.len() >= MIN_INTENT_OPTIONS
        && keys
            .iter()
            .all(|k| counts.get(k.as_str()).copied().unwrap_or(0) >= MIN_PER_OPTION);
    Ok(TaskRequest {
        name,
        kind: intent.then(|| "intent".to_string()),
        question: None,
        systemone: question,
        options: None,
        labels: None,
        examples,
        holdout: None,
        seed: None,
        abstention: None,
        head: None,
        draws: None,
        shots: None,
        x_coverage: None,
        x_conformal_score: None,
        x_certify,
        x_rotations: None,
        certify_name: Some("certify"),
    })
}

/// Registers a task sent in the reference's form and answers once it is
/// ready. A task of the same `id` is replaced, as the reference replaces
/// it: removed once the new registration is validated.
pub async fn register(body: &[u8], state: web::Data<AppState>) -> Result<HttpResponse> {
    let reference: ReferenceTask = parse(body)?;
    let hidden = state.route.hidden_layers().is_some();
    let request = to_request(reference, hidden)?;
    let (spec, examples) = super::validated(&request, &state)?;
    let tasks = state.tasks.clone();
    let name = spec.name.clone();
    let record = web::block(move || {
        if let Some(old) = tasks.list().into_iter().find(|r| r.spec.name == name) {
            tasks.delete(&old.id)?;
        }
        tasks.register(spec, examples)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let id = record.id.clone();
    let record = loop {
        let r = match state.tasks.get(&id) {
            Ok(r) => r,
            Err(TaskError::NotFound(_)) => {
                return Err(ApiError::Conflict {
                    message: format!(
                        "the task `{}` was deleted while it registered",
                        record.spec.name
                    ),
                    param: "id".into(),
                    code: "task_deleted",
                })
            }
            Err(e) => return Err(e.into()),
        };
        if !r.status.pending() {
            break r;
        }
        tokio::time::sleep(POLL).await;
    };
    if record.status == Status::Failed {
        return Err(ApiError::Internal(format!(
            "the registration of `{}` failed: {}; register it again",
            record.spec.name,
            record.error.as_deref().unwrap_or("no reason recorded")
        )));
    }
    Ok(HttpResponse::Ok().json(reference_out(&record, &state)))
}

/// A ready task as the reference shows it, with decisio's own record
/// beside it under `x_task`.
pub fn reference_out(r: &TaskRecord, state: &AppState) -> Value {
    let report = r.report.as_ref();
    let wire = r.spec.wire.as_ref();
    let mut out = json!({
        "id": r.spec.name,
        "key": wire.map(|w| w.identity.clone()),
        "type": wire.map(|w| w.question["type"].clone()),
        "options": wire.map(|w| w.keys.clone()),
        // The examples fitted on, as the reference counts them: a
        // certified task's held-out side apart.
        "n_examples": r.progress.total
            - report
                .filter(|_| r.spec.certify.is_some())
                .map_or(0, |rep| rep.holdout_examples),
        "calibration": report.map(|rep| json!({
            "temperature": rep.temperature,
            "fit_examples": rep.fit_examples,
            "holdout_examples": rep.holdout_examples,
            "before": rep.before,
            "after": rep.after,
        })),
        "x_task": shown(r, state),
    });
    if let Some(cert) = report.and_then(|rep| rep.certificate.as_ref()) {
        out["certificate"] = serde_json::to_value(cert).unwrap_or_default();
        out["status"] = state.tasks.certificate_status(r).unwrap_or_default();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::is_reference_form;

    #[test]
    fn the_form_is_told_by_its_top_level_keys_alone() {
        let cases: [(&str, bool); 9] = [
            (r#"{"id": "t", "examples": []}"#, true),
            (r#"{"id": null}"#, true),
            (r#"{"examples": [{"id": 1}], "id": {"name": 2}}"#, true),
            (r#"{"id": "t", "name": "t"}"#, false),
            (r#"{"name": "t", "examples": [{"id": 1}]}"#, false),
            (r#"{"examples": []}"#, false),
            (r#"["id"]"#, false),
            (r#"{"id": "t""#, false),
            (r#""id""#, false),
        ];
        for (body, reference) in cases {
            let oracle = matches!(
                serde_json::from_str::<serde_json::Value>(body),
                Ok(serde_json::Value::Object(m)) if m.contains_key("id") && !m.contains_key("name")
            );
            assert_eq!(oracle, reference, "{body}");
            assert_eq!(is_reference_form(body.as_bytes()), reference, "{body}");
        }
    }
}
