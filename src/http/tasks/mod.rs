//! The `/v1/tasks` routes: registering a task (`POST`, answered 202 while
//! it fits in the background), listing, reading and deleting tasks; their
//! request and response bodies; `validate.rs` checks a registration;
//! `reference.rs` takes a registration in the reference decisio's form;
//! `certify_block.rs` checks its certify block, `input.rs` reads the
//! pieces read alike; `certify.rs` certifies a
//! ready task again.

mod certify;
mod certify_block;
mod input;
pub mod reference;
mod validate;

pub use self::certify::{certify_task, CertifyRequest};

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use self::validate::validate;
use super::body::{parse, read_bytes};
use super::error::ApiError;
use super::fields::int;
use super::AppState;
use crate::tasks::conformal::Score;
use crate::tasks::{Kind, TaskRecord};

type Result<T> = std::result::Result<T, ApiError>;

/// `POST /v1/tasks`: a registration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    pub name: String,
    /// `choice` (the default) or `intent`.
    pub kind: Option<String>,
    /// The question (with `options` or `labels`); or `systemone` instead.
    pub question: Option<String>,
    /// A System One question (`{type, instructions?, criteria}`) in place
    /// of `question` and `options`/`labels`: the task applies to the
    /// `/v1/systemone` questions of its identity.
    pub systemone: Option<serde_json::Value>,
    /// The options of a choice task.
    pub options: Option<Vec<String>>,
    /// The labels of an intent task.
    pub labels: Option<Vec<String>>,
    pub examples: Vec<TaskExampleIn>,
    /// Share of the examples held out for the figures (default 0.2).
    pub holdout: Option<f64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub seed: Option<i64>,
    pub abstention: Option<AbstentionIn>,
    /// An intent task's head: `{"layer": -1}` (the final norm's output,
    /// the default) or a block's index.
    pub head: Option<TaskHeadIn>,
    /// Heads fitted on `draws` draws of `shots` examples per label (intent
    /// tasks; both or neither).
    #[serde(default, deserialize_with = "int::opt")]
    pub draws: Option<i64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub shots: Option<i64>,
    /// Answers with prediction sets of this coverage, `1 − alpha`,
    /// calibrated on the holdout.
    pub x_coverage: Option<f64>,
    /// The sets' conformal score: `lac` (the default) or `aps`.
    pub x_conformal_score: Option<String>,
    /// Certified answers (the reference form's `certify`).
    pub x_certify: Option<CertifyIn>,
    /// Cyclic rotations of the options each example is read in, for the
    /// letter-bias removal (default: as many as options, at most 4).
    #[serde(default, deserialize_with = "int::opt")]
    pub x_rotations: Option<i64>,
    /// The name the certify block came under (`certify` in the reference
    /// form), for errors.
    #[serde(skip)]
    pub certify_name: Option<&'static str>,
}

impl TaskRequest {
    /// The request's name of its certify block.
    pub fn certify_param(&self) -> &'static str {
        self.certify_name.unwrap_or("x_certify")
    }
}

/// A `certify` block: the promise's `alpha` and `delta`, the fewest
/// held-out examples, the held-out share or a list of certification
/// examples, and whether a traffic alert suspends certification.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertifyIn {
    pub alpha: Option<f64>,
    pub delta: Option<f64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub min_examples: Option<i64>,
    pub holdout: Option<f64>,
    pub suspend_on_alert: Option<bool>,
    /// Certification examples apart from the fit's: the held-out side
    /// (then every example in `examples` is fitted on).
    pub examples: Option<Vec<TaskExampleIn>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskHeadIn {
    #[serde(default, deserialize_with = "int::opt")]
    pub layer: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskHeadOut {
    /// `-1`: the final norm's output; else the block's index.
    pub layer: i64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskExampleIn {
    /// A string; a System One task's may also be an object or an array,
    /// shown as the wire shows its states.
    pub state: serde_json::Value,
    /// One of the task's options (or labels), verbatim after trimming; a
    /// System One task's answer key (an option's key, a level's index
    /// `0`..`n-1`, or `yes`/`no`).
    pub label: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbstentionIn {
    pub target_accuracy: Option<f64>,
    pub abstain_below: Option<f64>,
}

/// A task as `GET /v1/tasks/{id}` shows it (the examples by count only).
#[derive(Clone, Debug, Serialize)]
pub struct TaskOut {
    pub id: String,
    pub object: &'static str,
    pub name: String,
    pub kind: crate::tasks::Kind,
    pub status: crate::tasks::Status,
    pub created: u64,
    pub question: String,
    /// A task registered from a System One question: that question, and
    /// its answer keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub systemone: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// A choice task's options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// An intent task's labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// An intent task's head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<TaskHeadOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draws: Option<crate::tasks::DrawSpec>,
    pub examples: usize,
    pub holdout: f64,
    pub seed: u64,
    pub abstention: Option<crate::tasks::Abstention>,
    /// The prediction sets' coverage and score, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_coverage: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_conformal_score: Option<Score>,
    /// Rotations of the options each example is read in.
    pub x_rotations: usize,
    pub progress: crate::tasks::Progress,
    pub error: Option<String>,
    /// The fitted figures, once ready.
    pub result: Option<crate::tasks::Report>,
    /// A certified task's state: `ok`, `traffic_changed` or `suspended`
    /// (the serving stack changed), with its traffic monitor's facts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_certificate_status: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskList {
    pub object: &'static str,
    pub data: Vec<TaskOut>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskDeleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
    /// Whether a queued or running registration was cancelled.
    pub cancelled: bool,
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
        systemone: r.spec.wire.as_ref().map(|w| w.question.clone()),
        keys: r.spec.wire.as_ref().map(|w| w.keys.clone()),
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
        x_coverage: r.spec.coverage.map(|c| c.level),
        x_conformal_score: r.spec.coverage.map(|c| c.score),
        x_rotations: r.spec.rotations,
        progress: r.progress.clone(),
        error: r.error.clone(),
        result: r.report.clone(),
        x_certificate_status: None,
    }
}

/// A task as the routes show it: [`task_out`] with its certificate's
/// state.
fn shown(r: &TaskRecord, state: &AppState) -> TaskOut {
    TaskOut {
        x_certificate_status: state.tasks.certificate_status(r),
        ..task_out(r)
    }
}

/// A registration validated against this server's backend and base.
fn validated(
    body: &TaskRequest,
    state: &AppState,
) -> Result<(crate::tasks::TaskSpec, Vec<crate::tasks::Example>)> {
    state.ready()?;
    let layers = state.route.hidden_layers();
    let caps = state.route.capabilities();
    validate(
        body,
        &state.limits,
        layers,
        caps.name,
        caps.hidden_hint,
        state.route.wire.noul,
    )
}

/// `POST /v1/tasks`: queues a registration; 202 with the task and its
/// `Location`. A body in the reference decisio's form (`id`, no `name`) is
/// registered as the reference registers it, answered once ready
/// ([`reference`]).
pub async fn create_task(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let bytes = read_bytes(&req, payload, state.limits.max_task_body_bytes).await?;
    if reference::is_reference_form(&bytes) {
        return reference::register(&bytes, state).await;
    }
    let body: TaskRequest = parse(&bytes)?;
    let (spec, examples) = validated(&body, &state)?;
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

/// `GET /v1/tasks`'s query.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `1`: the export `POST /v1/tasks/import` loads, in place of the list.
    pub full: Option<u8>,
}

/// `GET /v1/tasks`: every task, oldest first; with `?full=1` the ready
/// tasks as an export.
pub async fn list_tasks(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse> {
    let query = web::Query::<ListQuery>::from_query(req.query_string()).map_err(|e| {
        ApiError::invalid(
            "full",
            format!("the query is `full=0` (the list) or `full=1` (the export): {e}"),
        )
    })?;
    match query.full {
        None | Some(0) => Ok(HttpResponse::Ok().json(TaskList {
            object: "list",
            data: state
                .tasks
                .list()
                .iter()
                .map(|r| shown(r, &state))
                .collect(),
        })),
        Some(1) => Ok(HttpResponse::Ok().json(state.tasks.export())),
        Some(n) => Err(ApiError::invalid(
            "full",
            format!("`full` is 0 (the list) or 1 (the export); got {n}"),
        )),
    }
}

/// `POST /v1/tasks/import`: loads an export of a server of the same
/// serving stack, without fitting again; the ids loaded.
pub async fn import_tasks(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse> {
    let bytes = read_bytes(&req, payload, state.limits.max_task_body_bytes).await?;
    let export: crate::tasks::Export = parse(&bytes)?;
    state.ready()?;
    let tasks = state.tasks.clone();
    let ids = web::block(move || tasks.import(export))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(HttpResponse::Ok().json(serde_json::json!({"object": "tasks.import", "loaded": ids})))
}

pub async fn get_task(id: web::Path<String>, state: web::Data<AppState>) -> Result<HttpResponse> {
    Ok(HttpResponse::Ok().json(shown(&state.tasks.get(&id)?, &state)))
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
