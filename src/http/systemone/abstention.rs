//! Abstention tasks over the System One wire, the reference decisio's
//! `/v1/abstention/tasks` (`decisio/serve/systemone.py`,
//! `decisio/serve/abstention.py`):
//!
//! - `POST /v1/abstention/tasks` `{id, option: {key}, match?, examples:
//!   [{request, answer}]}`: each example a `/v1/systemone` request with one
//!   choice question, answered as served; `answer` its gold key, or `null`
//!   (or the declared key) for an example that cannot be answered. The
//!   threshold is fitted ([`crate::stats::abstain`]) and the task stored.
//!   The examples are checked in the handler, then answered by a worker
//!   ([`crate::tasks::abstention_worker`]) one at a time, as serving answers them but unobserved (no
//!   serving metric, prefix-cache entry or traffic monitor moves), the
//!   registration kept in the state folder (`crate::tasks::abstention_job`)
//!   and resumed after a kill. Answered with the task once fitted, as the
//!   reference answers; with `Prefer: respond-async`, at once with `202`
//!   and its `Location`.
//! - `GET /v1/abstention/tasks/{id}`: a registration's status and
//!   progress, or the task once fitted.
//! - `GET /v1/abstention/tasks`: every task, in the form the import loads.
//! - `POST /v1/abstention/tasks/import` `{tasks}`: loads them without
//!   scoring again (a 409 when fitted under another model or layout).
//! - `DELETE /v1/abstention/tasks/{id}`.
//!
//! A choice question of a task's option set (keys and descriptions, any
//! order; `match: "option_keys"`: its keys alone) whose options hold the
//! declared key answers that key when its probability is above the
//! threshold, else the best other option, with `x_abstained` and
//! `x_abstention_task`; its probabilities are unchanged. An appended
//! option (the reference's `append`, served only through the imajev
//! extension) is refused: decisio serves declared options only. Errors are
//! in decisio's shape, as on `/v1/tasks`.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use std::time::Duration;

use super::parse_example;
use crate::http::body::{parse, read_bytes};
use crate::http::error::ApiError;
use crate::http::fields::task_name;
use crate::http::{unix_now, AppState};
use crate::tasks::abstention::{AbstainOption, AbstentionTask, Match};
use crate::tasks::abstention_job::{AbstentionJob, JobExample, JobStatus};
use crate::tasks::FORMAT_VERSION;
use crate::text_route::systemone::{option_keys, option_set, Criteria, WireRequest};

type Result<T> = std::result::Result<T, ApiError>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionIn {
    pub key: Option<String>,
    pub append: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExampleIn {
    pub request: Value,
    pub answer: Value,
}

/// `POST /v1/abstention/tasks`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbstentionRequest {
    pub id: String,
    pub option: OptionIn,
    #[serde(rename = "match")]
    pub matches: Option<String>,
    pub examples: Vec<ExampleIn>,
}

/// `POST /v1/abstention/tasks/import`'s body: the listing as
/// `GET /v1/abstention/tasks` gives it (its `enabled` and `store` describe
/// the server that wrote it, and are not loaded).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbstentionImport {
    pub tasks: Vec<AbstentionTask>,
    pub enabled: Option<bool>,
    pub store: Option<Map<String, Value>>,
}

/// One example, validated: its question's digests and its gold key
/// (`None`: it cannot be answered).
struct Checked {
    set: String,
    keys: String,
    gold: Option<String>,
}

fn check(body: &AbstentionRequest, state: &AppState) -> Result<(String, Vec<Checked>)> {
    let limits = &state.limits;
    task_name(&body.id, "id", "an abstention task's id", limits)?;
    let key =
        match (&body.option.key, &body.option.append) {
            (Some(k), None) => k.clone(),
            (None, Some(_)) => return Err(ApiError::invalid(
                "option.append",
                "an appended abstain option is answered only through the imajev extension, which \
                 decisio does not serve; declare one of the question's own keys with \
                 {\"key\": <key>}",
            )),
            _ => return Err(ApiError::invalid(
                "option",
                "`option` takes exactly one of {\"key\": <declared key>} and {\"append\": <text>}",
            )),
        };
    let by_keys = match body.matches.as_deref() {
        None | Some("option_set") => false,
        Some("option_keys") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "match",
                format!(
                    "`match` is `option_set` or `option_keys` (`imajev_extension` needs an \
                     appended option, not served here); got `{other}`"
                ),
            ))
        }
    };
    let n = body.examples.len();
    if n == 0 || n > limits.max_task_examples {
        return Err(ApiError::invalid(
            "examples",
            format!(
                "an abstention task takes 1 to {} examples; got {n}",
                limits.max_task_examples
            ),
        ));
    }
    let mut out = Vec::with_capacity(n);
    for (i, e) in body.examples.iter().enumerate() {
        let field = format!("examples[{i}].request");
        let request = parse_example(e.request.clone()).map_err(|d| {
            let at = d.first().map_or(String::new(), |d| {
                let loc: Vec<String> = d.loc.iter().skip(1).map(|v| v.to_string()).collect();
                format!(" (at {}: {})", loc.join("."), d.msg)
            });
            ApiError::invalid(&field, format!("not a valid /v1/systemone request{at}"))
        })?;
        let [(_, q)] = request.questions.as_slice() else {
            return Err(ApiError::invalid(
                &field,
                format!(
                    "an abstention example asks exactly one question; this one asks {}",
                    request.questions.len()
                ),
            ));
        };
        let Criteria::Choice(options) = &q.criteria else {
            return Err(ApiError::invalid(
                &field,
                "an abstention task's question is a `choice` with the declared key among its \
                 options",
            ));
        };
        if !options.iter().any(|(k, _)| *k == key) {
            return Err(ApiError::invalid(
                &field,
                format!("the declared abstain option `{key}` is not one of the question's keys"),
            ));
        }
        let gold = match &e.answer {
            Value::Null => None,
            Value::String(k) if *k == key => None,
            Value::String(k) if options.iter().any(|(o, _)| o == k) => Some(k.clone()),
            other => {
                return Err(ApiError::invalid(
                    &format!("examples[{i}].answer"),
                    format!(
                        "an answer is one of the question's keys, or null when the example \
                         cannot be answered; got {other}"
                    ),
                ))
            }
        };
        let (set, keys) = (option_set(q), option_keys(q));
        out.push(Checked {
            set: set.unwrap_or_default(),
            keys: keys.unwrap_or_default(),
            gold,
        });
    }
    let digests: std::collections::BTreeSet<&String> = out
        .iter()
        .map(|c| if by_keys { &c.keys } else { &c.set })
        .collect();
    if digests.len() != 1 {
        let msg = if by_keys {
            "the examples of an option-keys task share one set of option keys"
        } else {
            "the examples of an option-set task share one option set (the same keys with the \
             same descriptions); examples that share their keys but not their texts take \
             `match: \"option_keys\"`"
        };
        return Err(ApiError::invalid("examples", msg));
    }
    Ok((key, out))
}

/// How often a handler waiting for a registration looks whether it is
/// done.
const POLL: Duration = Duration::from_millis(100);

/// `POST /v1/abstention/tasks`: the examples checked, then queued for the
/// worker ([`crate::tasks::abstention_worker`]), which answers them as
/// served and fits the threshold.
/// With `Prefer: respond-async` (RFC 7240), answered at once: `202` with
/// the registration's status and its `Location`. Otherwise answered as the
/// reference answers, with the task once fitted; a client that leaves
/// meanwhile leaves the registration running.
pub async fn register(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let bytes = read_bytes(&req, payload, state.limits.max_task_body_bytes).await?;
    state.ready()?;
    let shared = state.clone();
    // Checking up to 100,000 example requests is work: off the HTTP
    // workers, as the rendering of a decision is.
    let job = web::block(move || -> Result<AbstentionJob> {
        let body: AbstentionRequest = parse(&bytes)?;
        let (key, checked) = check(&body, &shared)?;
        let (model, layout) = shared.tasks.abstention_stack();
        let first = &checked[0];
        let matches = if body.matches.as_deref() == Some("option_keys") {
            Match::OptionKeys(first.keys.clone())
        } else {
            Match::OptionSet(first.set.clone())
        };
        let examples: Vec<JobExample> = body
            .examples
            .into_iter()
            .zip(checked)
            .map(|(e, c)| JobExample {
                request: e.request,
                gold: c.gold,
            })
            .collect();
        drop(bytes);
        let job = AbstentionJob {
            format_version: FORMAT_VERSION,
            id: body.id,
            option: AbstainOption { key },
            matches,
            model,
            layout,
            status: JobStatus::Queued,
            error: None,
            server_fault: false,
            total: examples.len(),
            done: 0,
            resumed_from: 0,
            restarts: 0,
            created: unix_now(),
        };
        shared.tasks.submit_abstention(job.clone(), &examples)?;
        Ok(job)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let location = format!("/v1/abstention/tasks/{}", job.id);
    let prefer = req
        .headers()
        .get_all("prefer")
        .filter_map(|v| v.to_str().ok());
    if prefer
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
    {
        return Ok(HttpResponse::Accepted()
            .insert_header(("Location", location))
            .insert_header(("Preference-Applied", "respond-async"))
            .json(job_view(&job)));
    }
    loop {
        match state.tasks.abstention_job(&job.id) {
            Some(j) if j.status.pending() => actix_web::rt::time::sleep(POLL).await,
            Some(j) => return Err(failed(&j)),
            None => {
                let task = state
                    .tasks
                    .abstention_tasks()
                    .into_iter()
                    .find(|t| t.id == job.id);
                return match task {
                    Some(task) => Ok(HttpResponse::Ok().json(task)),
                    None => Err(ApiError::NotFound(format!(
                        "abstention task `{}` was deleted while it was registered",
                        job.id
                    ))),
                };
            }
        }
    }
}

/// A failed registration's error: a 500 for a fault of the server (its
/// state folder), else a 400 naming the example.
fn failed(job: &AbstentionJob) -> ApiError {
    let message = job
        .error
        .clone()
        .unwrap_or_else(|| "the registration failed".into());
    if job.server_fault {
        ApiError::Internal(message)
    } else {
        ApiError::invalid("examples", message)
    }
}

/// A registration as `GET /v1/abstention/tasks/{id}` shows it.
fn job_view(job: &AbstentionJob) -> Value {
    json!({
        "id": job.id,
        "object": "abstention.registration",
        "status": job.status,
        "error": job.error,
        "progress": {
            "done": job.done,
            "total": job.total,
            "resumed_from": job.resumed_from,
            "restarts": job.restarts,
        },
        "option": job.option,
        "match": job.matches,
    })
}

/// `GET /v1/abstention/tasks/{id}`: a registration's status (`queued`,
/// `running`, `failed`, with its progress), or the task once fitted
/// (`status: "ready"`, in the form the listing gives).
pub async fn status(id: web::Path<String>, state: web::Data<AppState>) -> Result<HttpResponse> {
    if let Some(job) = state.tasks.abstention_job(&id) {
        return Ok(HttpResponse::Ok().json(job_view(&job)));
    }
    let task = state
        .tasks
        .abstention_tasks()
        .into_iter()
        .find(|t| t.id == *id);
    match task {
        Some(task) => {
            let mut view = serde_json::to_value(&task).unwrap_or_default();
            view["status"] = json!("ready");
            view["applied"] = json!(state.tasks.abstention_applies(&task));
            Ok(HttpResponse::Ok().json(view))
        }
        None => Err(ApiError::NotFound(format!(
            "there is no abstention task `{id}`; GET /v1/abstention/tasks lists them"
        ))),
    }
}

/// Reads a stored example's `request` as `/v1/systemone` reads a body:
/// the function the registration worker
/// ([`TaskRegistry::work_abstention`](crate::tasks::TaskRegistry::work_abstention))
/// is given.
pub fn read_example(request: Value) -> std::result::Result<WireRequest, String> {
    parse_example(request).map_err(|d| d.first().map_or("invalid".into(), |d| d.msg.clone()))
}

/// `GET /v1/abstention/tasks`.
pub async fn list(state: web::Data<AppState>) -> Result<HttpResponse> {
    let tasks = state.tasks.abstention_tasks();
    let applied = tasks
        .iter()
        .filter(|t| state.tasks.abstention_applies(t))
        .count();
    Ok(HttpResponse::Ok().json(json!({
        "enabled": true,
        "tasks": tasks,
        "store": {"loaded": tasks.len(), "applied": applied, "other_stack": tasks.len() - applied},
    })))
}

/// `POST /v1/abstention/tasks/import`.
pub async fn import(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let bytes = read_bytes(&req, payload, state.limits.max_task_body_bytes).await?;
    let body: AbstentionImport = parse(&bytes)?;
    let tasks = state.tasks.clone();
    let loaded = web::block(move || tasks.import_abstention(body.tasks))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(HttpResponse::Ok().json(json!({"loaded": loaded})))
}

/// `DELETE /v1/abstention/tasks/{id}`.
pub async fn delete(id: web::Path<String>, state: web::Data<AppState>) -> Result<HttpResponse> {
    let tasks = state.tasks.clone();
    let id = id.into_inner();
    let gone = id.clone();
    let removed = web::block(move || tasks.remove_abstention(&gone))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    if !removed {
        return Err(ApiError::NotFound(format!(
            "there is no abstention task `{id}`; GET /v1/abstention/tasks lists them"
        )));
    }
    Ok(HttpResponse::Ok().json(json!({"removed": id})))
}
