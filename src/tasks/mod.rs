//! Task registration: a question a client asks again and again, taught to
//! the server once.
//!
//! A registration names a question, its options and labelled examples. A
//! background worker runs the letters readout over every example, one
//! engine job per example (so decisions queued meanwhile wait for at most
//! one example), checkpoints the logits, then fits the temperature on the
//! fit split and reports accuracy, NLL, ECE and the reliability table before
//! and after on the holdout, and the abstention threshold. Tasks live in the
//! state folder ([`store`]) and survive a restart; a registration cut short
//! resumes from its checkpoint. Decisions name a ready task instead of
//! options ([`TaskRegistry::question`]).
//!
//! - `decide.rs`: the decision service every decision route hands its
//!   questions to: the task of each, the answers read on the route, and
//!   what a task adds to them, by one rule each ([`TaskRegistry::decide`],
//!   [`TaskRegistry::systemone`]).
//! - `registry.rs`: the tasks of one server: registering, listing,
//!   deleting, and the question a decision naming a task asks.
//! - `worker.rs`: the background worker that scores the examples and fits.
//! - `report.rs`: what a ready task reports, fitted from its scored
//!   examples.
//! - `certificate.rs`: a certified task's split, certificate, serving
//!   stack and the verdict on each of its answers.
//! - `exchange.rs`: exporting ready tasks and importing them into a server
//!   of the same serving stack.
//! - `recertify.rs`: certifying a ready task again on new examples.
//! - [`abstention`]: abstention tasks, a threshold on a declared "can't
//!   tell" option of a System One choice question.
//! - [`store`]: the state folder.
//! - [`shared`]: the task store replicas share (`--task-store`), and
//!   `sync.rs`, which keeps this server's tasks with it.
//!
//! The mathematics (the temperature fit, the figures, the intent head) is
//! in [`crate::stats`]; [`calibrate`], [`conformal`] and [`head`] name its modules here.
//!
//! This module knows nothing of HTTP: the server validates bodies into a
//! [`TaskSpec`] and maps [`TaskError`] to statuses.
//! `docs/design/tasks.md` states every rule.

pub mod abstention;
pub mod abstention_job;
pub mod abstention_worker;
pub mod certificate;
mod decide;
mod exchange;
mod recertify;
mod registry;
mod report;
pub mod shared;
pub mod store;
mod sync;
mod think;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};

use serde::{Deserialize, Serialize};

pub use self::decide::{Abstained, Ask, Decided, Planned, SystemOneAnswered, SystemOneDecided};
pub use self::exchange::{Export, Exported};
pub use self::report::{fit, fit_intent, minimum_holdout, Report, SetsReport};
pub use self::think::{NotThought, Thinking};
pub use crate::stats::{calibrate, conformal, head};

use self::store::Store;
use crate::metrics::Metrics;
use crate::stats::head::Head;
use crate::text_route::TextRoute;

/// What a registered task adds to an answer of its question
/// ([`TaskRegistry::outcome`]).
#[derive(Clone, Debug, Default)]
pub struct TaskOutcome {
    /// The prediction set's options (indices), for a task registered with
    /// a coverage.
    pub prediction_set: Option<Vec<usize>>,
    /// The certificate's verdict, for a certified task.
    pub verdict: Option<certificate::Verdict>,
}

/// The version of the files in the state folder; files of another version
/// are refused at start with a message naming both.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Options read as letters; a fitted temperature.
    Choice,
    /// Labels too many for letters; an intent head.
    Intent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Queued,
    Running,
    Ready,
    Failed,
}

impl Status {
    pub const ALL: [Status; 4] = [
        Status::Queued,
        Status::Running,
        Status::Ready,
        Status::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Ready => "ready",
            Status::Failed => "failed",
        }
    }

    /// Queued or running: the worker still has work on it.
    pub fn pending(self) -> bool {
        matches!(self, Status::Queued | Status::Running)
    }
}

/// How a ready task abstains.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Abstention {
    /// The smallest threshold whose holdout accuracy reaches this.
    TargetAccuracy(f64),
    /// A fixed threshold.
    AbstainBelow(f64),
}

/// One labelled example: a state and the index of its option.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Example {
    pub state: String,
    pub label: usize,
}

/// A registration, validated (examples apart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub name: String,
    pub kind: Kind,
    pub question: String,
    /// The options (choice) or labels (intent), in order.
    pub labels: Vec<String>,
    /// Share of the examples held out for the figures.
    pub holdout: f64,
    pub seed: u64,
    pub abstention: Option<Abstention>,
    /// An intent head's feature: block `head_layer`'s output, or the final
    /// norm's when `None`.
    #[serde(default)]
    pub head_layer: Option<usize>,
    /// Heads fitted on draws of few examples per label (intent tasks).
    #[serde(default)]
    pub draws: Option<DrawSpec>,
    /// Registered from a System One question: applied to the wire's
    /// questions with its identity (`None`: asked by name on
    /// `/v1/decide`).
    #[serde(default)]
    pub wire: Option<WireTask>,
    /// Prediction sets of this coverage (`x_coverage`), calibrated on the
    /// holdout.
    #[serde(default)]
    pub coverage: Option<Coverage>,
    /// Certified answers: the held-out side is chosen by
    /// [`certificate::hash_split`] and certified on.
    #[serde(default)]
    pub certify: Option<certificate::CertifySpec>,
    /// Cyclic rotations of the options each example is read in
    /// (`x_rotations`; 1 for an intent task or a yes/no question asked in
    /// words): the letter-bias removal's data ([`crate::stats::debias`]).
    #[serde(default = "one")]
    pub rotations: usize,
    /// The last this many examples were sent apart for certification
    /// (`certify.examples`): they are the held-out side, and the fit sees
    /// every other example. 0: the held-out side is the hash split's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub certify_examples: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn one() -> usize {
    1
}

/// The rotations a choice task's examples are read in unless the
/// registration says otherwise: every rotation up to this many options,
/// this many spread evenly beyond.
pub const DEFAULT_ROTATIONS: usize = 4;

/// What a task's prediction sets promise: the true option is in the set
/// with probability at least `level` for questions like the examples, with
/// sets of the options whose `score` passes the holdout's conformal
/// threshold ([`crate::stats::conformal`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    pub level: f64,
    pub score: crate::stats::conformal::Score,
}

/// A task registered from a System One question (`POST /v1/tasks` with
/// `systemone`): how the wire asks it, its answer keys and its identity.
/// The spec's `question` and `labels` are the question as asked (its
/// instructions and shown options).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireTask {
    /// How a choice task's examples and questions are asked (an intent
    /// task is asked as its instructions alone, as on `/v1/decide`).
    pub ask: crate::text_route::systemone::WireAsk,
    /// The answer keys, in the order asked (option keys, `0`..`n-1`, or
    /// `no` and `yes`).
    pub keys: Vec<String>,
    /// The question's identity: the sha256 of its type, options in order
    /// and instructions as the reference decisio keys a task
    /// (`decisio/serve/tasks.py`, `task_key`).
    pub identity: String,
    /// The wire question as registered (shown by `GET /v1/tasks`).
    pub question: serde_json::Value,
}

impl TaskSpec {
    /// What identifies an example's input for the certified split: its
    /// state and the question (its identity on the wire, else its text and
    /// options).
    pub fn input_of(&self, state: &str) -> String {
        let question = match &self.wire {
            Some(w) => w.identity.clone(),
            None => serde_json::json!([self.question, self.labels]).to_string(),
        };
        format!("{question}\u{0}{state}")
    }

    /// A certified task's fit and held-out indices of `examples`; `None`
    /// when the task certifies nothing (its split is then the seeded one).
    pub fn certified_split(&self, examples: &[Example]) -> Option<(Vec<usize>, Vec<usize>)> {
        self.certify?;
        if self.certify_examples > 0 {
            let fit = examples.len().saturating_sub(self.certify_examples);
            return Some(((0..fit).collect(), (fit..examples.len()).collect()));
        }
        let inputs: Vec<String> = examples.iter().map(|e| self.input_of(&e.state)).collect();
        Some(certificate::hash_split(&self.name, &inputs, self.holdout))
    }

    /// The task's fit and held-out example indices, by one rule wherever
    /// they are needed (the registration's checks of its holdout, the
    /// worker's fit): a certified task's split
    /// ([`Self::certified_split`]), else the seeded split of a choice
    /// task's examples or the seeded stratified split of an intent task's.
    pub fn split(&self, examples: &[Example]) -> (Vec<usize>, Vec<usize>) {
        if let Some(split) = self.certified_split(examples) {
            return split;
        }
        match self.kind {
            Kind::Choice => calibrate::split(examples.len(), self.holdout, self.seed),
            Kind::Intent => {
                let labels: Vec<usize> = examples.iter().map(|e| e.label).collect();
                head::stratified_split(&labels, self.labels.len(), self.holdout, self.seed)
            }
        }
    }

    /// How the task's questions are put to the model: a System One choice
    /// task's in the wire's layout (its examples were read so); an intent
    /// task's, and a task asked by name, in decisio's own.
    pub fn asked_on_wire(&self) -> Option<crate::text_route::systemone::WireAsk> {
        match (&self.wire, self.kind) {
            (Some(w), Kind::Choice) => Some(w.ask.clone()),
            _ => None,
        }
    }
}

/// `draws` heads, each fitted on `shots` examples per label.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrawSpec {
    pub draws: usize,
    pub shots: usize,
}

/// How far a registration has come.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Examples scored, of `total`.
    pub done: usize,
    pub total: usize,
    /// Examples per second since the registration (re)started.
    pub rate: Option<f64>,
    /// Seconds left at that rate.
    pub eta_seconds: Option<f64>,
    /// Examples found in the checkpoint when the registration last started.
    pub resumed_from: usize,
    /// Times the registration was resumed after the server stopped.
    pub restarts: u32,
}

/// A task as the state folder keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub format_version: u32,
    pub id: String,
    /// Unix seconds of the registration.
    pub created: u64,
    /// The identity of the model the task was registered on.
    pub model: String,
    pub spec: TaskSpec,
    pub status: Status,
    pub error: Option<String>,
    pub progress: Progress,
    pub report: Option<Report>,
    /// Seconds spent scoring before the last restart.
    #[serde(default)]
    pub seconds: f64,
    /// The serving stack the task was fitted on (set when it is ready): a
    /// replica of another model, tokenizer or prompt layout that reads the
    /// task from the shared store keeps it but does not apply it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<certificate::Stack>,
}

impl TaskRecord {
    /// Queues the registration again (a restart, or a takeover from a
    /// replica that stopped), counting a restart when it was running, and
    /// logs `why`.
    pub(crate) fn requeue(&mut self, why: &str) {
        if self.status == Status::Running {
            self.progress.restarts += 1;
        }
        self.status = Status::Queued;
        tracing::info!("task `{}` ({}): {why}", self.spec.name, self.id);
    }
}

/// Why a task operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A bad registration or task reference; `param` names the field.
    #[error("{message}")]
    Invalid { param: String, message: String },
    /// No task with this id.
    #[error("there is no task `{0}`; GET /v1/tasks lists the tasks")]
    NotFound(String),
    /// A question names a task no registration has (`param` names the
    /// field): a 404, as a `model` this server does not serve is.
    #[error("{message}")]
    UnknownName { param: String, message: String },
    /// The name is another task's (`param` names the field): a 409, the
    /// request being valid but for what the server holds.
    #[error("{message}")]
    Taken { param: String, message: String },
    /// The server holds its limit of tasks: a 409, as `Taken`.
    #[error("{message}")]
    Full { param: String, message: String },
    /// The task exists but cannot answer yet (or any more).
    #[error("{message}")]
    NotReady { param: String, message: String },
    /// The state folder could not be written.
    #[error("{0}")]
    Store(String),
    /// The shared task store could not be reached or written: nothing
    /// was changed (503, with `Retry-After`).
    #[error("{0}; the change was not made, retry once the task store answers")]
    StoreUnavailable(String),
    /// An import fitted on another serving stack: a 409.
    #[error("{0}")]
    StackDiffers(String),
}

/// What `DELETE` removed: the task with its files, its registration
/// cancelled first when it was queued or running.
#[derive(Debug)]
pub struct Deleted {
    pub record: TaskRecord,
    pub cancelled: bool,
}

/// Limits of registrations (from [`crate::settings::Limits`]).
#[derive(Clone, Debug)]
pub struct TaskLimits {
    pub max_tasks: usize,
}

/// The tasks of one server, and the worker that registers them.
pub struct TaskRegistry {
    tasks: Mutex<BTreeMap<String, TaskRecord>>,
    /// The heads of ready intent tasks, by task id.
    heads: Mutex<HashMap<String, Arc<Head>>>,
    /// The traffic monitors of certified tasks, by task id (in memory:
    /// they start again with the server).
    monitors: Mutex<HashMap<String, crate::stats::monitor::Monitor>>,
    /// The digest of the prompt layout (the chat template and the wire's
    /// settings), fixed for the server's life: part of every [`certificate::Stack`].
    layout: String,
    /// The abstention tasks, by id.
    abstention: Mutex<BTreeMap<String, abstention::AbstentionTask>>,
    /// The abstention registrations queued, running or failed, by id.
    abstention_jobs: Mutex<BTreeMap<String, abstention_job::AbstentionJob>>,
    /// Told when an abstention registration is queued (its worker runs on
    /// the server's runtime: it answers examples as served).
    pub abstention_wake: tokio::sync::Notify,
    wake: Condvar,
    store: Store,
    route: Arc<TextRoute>,
    metrics: Arc<Metrics>,
    limits: TaskLimits,
    /// The store the fleet's replicas share (`--task-store`), if any.
    shared: Option<Arc<shared::Shared>>,
    /// Tasks whose last version the shared store could not take yet.
    unpublished: Mutex<std::collections::BTreeSet<String>>,
    /// The tasks applied from the shared store that were fitted on
    /// another serving stack (the backend apart), and what differs: kept
    /// and listed, not applied.
    foreign: Mutex<HashMap<String, Vec<&'static str>>>,
    /// Whether the state folder was compared with the shared store.
    migrated: std::sync::atomic::AtomicBool,
}
