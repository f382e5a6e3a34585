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
//! The mathematics (the temperature fit, the figures, the intent head) is
//! in [`crate::stats`]; [`calibrate`] and [`head`] name its modules here.
//!
//! This module knows nothing of HTTP: the server validates bodies into a
//! [`TaskSpec`] and maps [`TaskError`] to statuses.
//! `docs/design/tasks.md` states every rule.

pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use crate::stats::{calibrate, head};

use self::store::Store;
use crate::engine::EngineError;
use crate::metrics::Metrics;
use crate::route::{Question, RouteError, State, TextRoute};
use crate::stats::calibrate::{Figures, Threshold};
use crate::stats::head::{DrawsReport, Head, HeadReport};

/// The version of the files in the state folder; files of another version
/// are refused at start with a message naming both.
pub const FORMAT_VERSION: u32 = 1;

/// How often a running registration checkpoints its logits and progress.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// How often a running registration logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What the worker waits before offering a job again when the engine's
/// queue is full (serving comes first).
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(20);

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

/// What a ready task was fitted to and how well.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The fitted temperature (of the letters, or of an intent head).
    pub temperature: f64,
    pub fit_examples: usize,
    pub holdout_examples: usize,
    /// The held-out examples' indices, ascending.
    pub holdout_indices: Vec<usize>,
    /// Holdout figures at the base's default temperature.
    pub before: Figures,
    /// Holdout figures at the fitted temperature.
    pub after: Figures,
    /// The abstention threshold and what it costs on the holdout.
    pub abstention: Option<Threshold>,
    /// Seconds of scoring and fitting (over all restarts).
    pub seconds: f64,
    /// An intent task's served head: how it was fitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<HeadReport>,
    /// An intent task's heads over draws, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draws: Option<DrawsReport>,
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
    wake: Condvar,
    store: Store,
    route: Arc<TextRoute>,
    metrics: Arc<Metrics>,
    limits: TaskLimits,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("task-{t:016x}{n:04x}")
}

impl TaskRegistry {
    /// Opens the state folder `root`, resumes the registrations a stop cut
    /// short, and starts the worker. Fails with a message naming the
    /// folder when it cannot be read or holds another format.
    pub fn open(
        root: &Path,
        route: Arc<TextRoute>,
        limits: TaskLimits,
    ) -> Result<Arc<Self>, String> {
        let store = Store::open(root)?;
        let model = route.engine().info().identity.clone();
        let mut tasks = BTreeMap::new();
        let mut heads = HashMap::new();
        for mut record in store.load()? {
            if record.status == Status::Ready && record.spec.kind == Kind::Intent {
                match store.load_head(&record.id) {
                    Ok(h) => {
                        heads.insert(record.id.clone(), Arc::new(h));
                    }
                    Err(e) => {
                        record.status = Status::Failed;
                        record.error = Some(format!("its head cannot be read: {e}"));
                        store.save(&record)?;
                    }
                }
            }
            if record.status.pending() {
                if record.model != model {
                    record.status = Status::Failed;
                    record.error = Some(
                        "the server restarted on another model before this registration \
                         finished; register it again"
                            .into(),
                    );
                } else {
                    if record.status == Status::Running {
                        record.progress.restarts += 1;
                    }
                    record.status = Status::Queued;
                    tracing::info!(
                        "task `{}` ({}): resuming its registration",
                        record.spec.name,
                        record.id
                    );
                }
                store.save(&record)?;
            }
            tasks.insert(record.id.clone(), record);
        }
        tracing::info!("state folder {}: {} task(s)", root.display(), tasks.len());
        let registry = Arc::new(TaskRegistry {
            tasks: Mutex::new(tasks),
            heads: Mutex::new(heads),
            wake: Condvar::new(),
            store,
            metrics: route.metrics.clone(),
            route,
            limits,
        });
        registry.update_gauges(&registry.lock());
        let worker = registry.clone();
        std::thread::Builder::new()
            .name("task-registration".into())
            .spawn(move || worker.work())
            .map_err(|e| format!("cannot start the registration worker: {e}"))?;
        Ok(registry)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, TaskRecord>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn heads_lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Head>>> {
        self.heads.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_gauges(&self, tasks: &BTreeMap<String, TaskRecord>) {
        for s in Status::ALL {
            let n = tasks.values().filter(|r| r.status == s).count();
            self.metrics
                .task_registration_tasks
                .with_label_values(&[s.as_str()])
                .set(n as i64);
        }
    }

    /// Queues a registration; returns the new task.
    pub fn register(
        &self,
        spec: TaskSpec,
        examples: Vec<Example>,
    ) -> Result<TaskRecord, TaskError> {
        let taken = |tasks: &BTreeMap<String, TaskRecord>| -> Result<(), TaskError> {
            if tasks.values().any(|r| r.spec.name == spec.name) {
                return Err(TaskError::Taken {
                    param: "name".into(),
                    message: format!(
                        "a task named `{}` already exists; DELETE it first or choose another name",
                        spec.name
                    ),
                });
            }
            if tasks.len() >= self.limits.max_tasks {
                return Err(TaskError::Full {
                    param: "name".into(),
                    message: format!(
                        "this server holds its limit of {} tasks; DELETE one first",
                        self.limits.max_tasks
                    ),
                });
            }
            Ok(())
        };
        taken(&self.lock())?;
        let id = new_id();
        // The examples (the large part) are written before the registry is
        // locked; the worker only sees a task once its record is in.
        self.store
            .save_examples(&id, &examples)
            .map_err(TaskError::Store)?;
        let record = TaskRecord {
            format_version: FORMAT_VERSION,
            id,
            created: unix_now(),
            model: self.route.engine().info().identity.clone(),
            progress: Progress {
                total: examples.len(),
                ..Progress::default()
            },
            spec: spec.clone(),
            status: Status::Queued,
            error: None,
            report: None,
            seconds: 0.0,
        };
        let mut tasks = self.lock();
        // Checked again: another registration may have taken the name meanwhile.
        if let Err(e) =
            taken(&tasks).and_then(|()| self.store.save(&record).map_err(TaskError::Store))
        {
            drop(tasks);
            let _ = self.store.remove(&record.id);
            return Err(e);
        }
        tracing::info!(
            "task `{}` ({}): queued, {} examples",
            record.spec.name,
            record.id,
            examples.len()
        );
        tasks.insert(record.id.clone(), record.clone());
        self.update_gauges(&tasks);
        self.wake.notify_all();
        Ok(record)
    }

    /// Every task, oldest first.
    pub fn list(&self) -> Vec<TaskRecord> {
        self.lock().values().cloned().collect()
    }

    pub fn get(&self, id: &str) -> Result<TaskRecord, TaskError> {
        self.lock()
            .get(id)
            .cloned()
            .ok_or_else(|| TaskError::NotFound(id.to_string()))
    }

    /// Cancels a pending registration, or removes a finished task.
    pub fn delete(&self, id: &str) -> Result<Deleted, TaskError> {
        let mut tasks = self.lock();
        let record = tasks
            .get(id)
            .ok_or_else(|| TaskError::NotFound(id.to_string()))?;
        let cancelled = record.status.pending();
        if cancelled {
            // The worker finds the task gone before its next example and
            // stops; what it writes meanwhile is removed after it (`work`).
            self.metrics
                .task_registrations
                .with_label_values(&["cancelled"])
                .inc();
            tracing::info!("task `{}` ({id}): cancelled", record.spec.name);
        }
        self.store.remove(id).map_err(TaskError::Store)?;
        let record = tasks.remove(id).expect("present");
        self.heads_lock().remove(id);
        tracing::info!("task `{}` ({id}): removed", record.spec.name);
        self.update_gauges(&tasks);
        Ok(Deleted { record, cancelled })
    }

    /// The question a decision asks when it names task `name`: the task's
    /// question and options, the request's temperature else the fitted one,
    /// the request's `abstain_below` else the task's threshold. `param`
    /// names the request's field in errors.
    pub fn question(
        &self,
        name: &str,
        id: Option<String>,
        abstain_below: Option<f64>,
        temperature: Option<f64>,
        param: &str,
    ) -> Result<Question, TaskError> {
        let tasks = self.lock();
        let record = tasks
            .values()
            .find(|r| r.spec.name == name)
            .ok_or_else(|| TaskError::UnknownName {
                param: param.to_string(),
                message: format!(
                    "no task named `{name}` is registered on this server; register it with \
                     POST /v1/tasks or give `options` instead"
                ),
            })?;
        let report = match (&record.report, record.status) {
            (Some(r), Status::Ready) => r,
            (_, status) => {
                let detail = match status {
                    Status::Queued | Status::Running => format!(
                        "its registration is {} ({} of {} examples scored); retry when GET \
                         /v1/tasks/{} says ready",
                        status.as_str(),
                        record.progress.done,
                        record.progress.total,
                        record.id
                    ),
                    Status::Failed | Status::Ready => format!(
                        "its registration failed ({}); register it again",
                        record.error.as_deref().unwrap_or("no reason recorded")
                    ),
                };
                return Err(TaskError::NotReady {
                    param: param.to_string(),
                    message: format!("the task `{name}` is not ready: {detail}"),
                });
            }
        };
        if record.model != self.route.engine().info().identity {
            return Err(TaskError::NotReady {
                param: param.to_string(),
                message: format!(
                    "the task `{name}` was fitted on another model; register it again on this one"
                ),
            });
        }
        let head = match record.spec.kind {
            Kind::Choice => None,
            Kind::Intent => {
                if self.route.engine().hidden_layers().is_none() {
                    return Err(TaskError::Invalid {
                        param: param.to_string(),
                        message: format!(
                            "the task `{name}` is an intent task, answered from hidden states, \
                             which the {} backend does not return{}",
                            self.route.engine().capabilities().name,
                            self.route.engine().capabilities().hidden_hint
                        ),
                    });
                }
                let head = self.heads_lock().get(&record.id).cloned();
                Some(head.ok_or_else(|| TaskError::NotReady {
                    param: param.to_string(),
                    message: format!("the task `{name}` has no head loaded; register it again"),
                })?)
            }
        };
        Ok(Question {
            id,
            text: record.spec.question.clone(),
            options: record.spec.labels.clone(),
            abstain_below: abstain_below
                .or_else(|| report.abstention.as_ref().and_then(|a| a.abstain_below)),
            temperature: temperature.or(Some(report.temperature)),
            head,
        })
    }

    /// The worker: registrations one at a time, oldest first.
    fn work(self: Arc<Self>) {
        loop {
            let id = {
                let mut tasks = self.lock();
                loop {
                    if let Some(r) = tasks.values().find(|r| r.status == Status::Queued) {
                        break r.id.clone();
                    }
                    tasks = self.wake.wait(tasks).unwrap_or_else(|p| p.into_inner());
                }
            };
            if let Err(e) = self.run(&id) {
                self.fail(&id, e);
            }
            // Deleted while it ran: nothing it wrote meanwhile (a
            // checkpoint, a head) stays behind.
            if !self.lock().contains_key(&id) {
                let _ = self.store.remove(&id);
            }
        }
    }

    /// Applies `f` to the task's record and saves it; `None` when the task
    /// is gone or no longer pending (deleted or cancelled meanwhile).
    fn update(&self, id: &str, f: impl FnOnce(&mut TaskRecord)) -> Result<Option<()>, String> {
        let mut tasks = self.lock();
        let Some(record) = tasks.get_mut(id).filter(|r| r.status.pending()) else {
            return Ok(None);
        };
        f(record);
        self.store.save(record)?;
        self.update_gauges(&tasks);
        Ok(Some(()))
    }

    fn fail(&self, id: &str, message: String) {
        let mut name = String::new();
        let saved = self.update(id, |r| {
            name = r.spec.name.clone();
            r.status = Status::Failed;
            r.error = Some(message.clone());
            r.progress.rate = None;
            r.progress.eta_seconds = None;
            // Counted before the status is published, so that a client who
            // sees `failed` also sees it counted.
            self.metrics
                .task_registrations
                .with_label_values(&["failed"])
                .inc();
        });
        if let Ok(Some(())) = saved {
            tracing::warn!("task `{name}` ({id}): registration failed: {message}");
            self.store.remove_checkpoint(id);
        }
    }

    /// Scores every example not yet in the checkpoint, then fits.
    fn run(&self, id: &str) -> Result<(), String> {
        let record = self.get(id).map_err(|e| e.to_string())?;
        let spec = record.spec.clone();
        let examples = self.store.load_examples(id)?;
        let (mut logits, mut sealed) = self.store.load_checkpoint(id)?;
        // A choice task's rows are its letters' logits; an intent task's,
        // hidden states of one width.
        let width = match spec.kind {
            Kind::Choice => Some(spec.labels.len()),
            Kind::Intent => logits.first().map(|l| l.len()),
        };
        if logits.len() > examples.len() || logits.iter().any(|l| Some(l.len()) != width) {
            logits.clear();
            sealed = 0;
        }
        let resumed = logits.len();
        let started = Instant::now();
        let before = record.seconds;
        let Some(()) = self.update(id, |r| {
            r.status = Status::Running;
            r.progress.done = resumed;
            r.progress.resumed_from = resumed;
        })?
        else {
            return Ok(());
        };
        tracing::info!(
            "task `{}` ({id}): running, {} of {} examples scored",
            spec.name,
            resumed,
            examples.len()
        );
        let question = Question {
            id: None,
            text: spec.question.clone(),
            options: spec.labels.clone(),
            abstain_below: None,
            temperature: None,
            head: None,
        };
        let (mut last_save, mut last_log) = (Instant::now(), Instant::now());
        for i in resumed..examples.len() {
            if !self.pending(id) {
                self.store.remove_checkpoint(id);
                return Ok(());
            }
            logits.push(self.readout(&examples[i].state, &question, &spec, i)?);
            self.metrics.task_registration_examples.inc();
            let done = logits.len();
            let elapsed = started.elapsed().as_secs_f64();
            let rate = (done - resumed) as f64 / elapsed.max(1e-9);
            self.metrics.task_registration_rate.set(rate);
            let progress = |r: &mut TaskRecord| {
                r.progress.done = done;
                r.progress.rate = Some(rate);
                r.progress.eta_seconds = Some((r.progress.total - done) as f64 / rate);
                r.seconds = before + elapsed;
            };
            // The checkpoint and the record are saved together now and then;
            // progress is kept in memory after every example.
            if last_save.elapsed() >= CHECKPOINT_EVERY || done == examples.len() {
                last_save = Instant::now();
                self.store.save_checkpoint(id, &logits, &mut sealed)?;
                self.update(id, progress)?;
            } else {
                let mut tasks = self.lock();
                if let Some(r) = tasks.get_mut(id).filter(|r| r.status.pending()) {
                    progress(r);
                }
            }
            if last_log.elapsed() >= LOG_EVERY {
                last_log = Instant::now();
                tracing::info!(
                    "task `{}` ({id}): {done} of {} examples, {rate:.2}/s",
                    spec.name,
                    examples.len()
                );
            }
        }
        let labels: Vec<usize> = examples.iter().map(|e| e.label).collect();
        let (mut report, head) = match spec.kind {
            Kind::Choice => (
                fit(&spec, &logits, &labels, self.route.default_temperature),
                None,
            ),
            Kind::Intent => {
                let (report, head) = fit_intent(&spec, &logits, &labels)?;
                (report, Some(head))
            }
        };
        report.seconds = before + started.elapsed().as_secs_f64();
        if let Some(h) = &head {
            // The head is on disk before the record says ready.
            self.store.save_head(id, h)?;
            self.heads_lock()
                .insert(id.to_string(), Arc::new(h.clone()));
        }
        let figures = (report.temperature, report.before.ece, report.after.ece);
        let Some(()) = self.update(id, |r| {
            r.status = Status::Ready;
            r.progress.done = logits.len();
            r.progress.eta_seconds = Some(0.0);
            r.seconds = report.seconds;
            r.report = Some(report);
            // Counted before the status is published (see `fail`).
            self.metrics
                .task_registrations
                .with_label_values(&["ready"])
                .inc();
        })?
        else {
            return Ok(());
        };
        self.store.remove_checkpoint(id);
        self.metrics.task_registration_rate.set(0.0);
        tracing::info!(
            "task `{}` ({id}): ready, T = {:.4}, holdout ECE {:.4} -> {:.4}",
            spec.name,
            figures.0,
            figures.1,
            figures.2
        );
        Ok(())
    }

    fn pending(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|r| r.status.pending())
    }

    /// The letter logits (an intent task: the hidden state) of one
    /// example: one engine job, offered again while the engine's queue is
    /// full or the model is loading.
    fn readout(
        &self,
        state: &str,
        question: &Question,
        spec: &TaskSpec,
        i: usize,
    ) -> Result<Vec<f32>, String> {
        loop {
            let state = State::Text(state.to_string());
            let result = match spec.kind {
                Kind::Choice => {
                    futures::executor::block_on(self.route.readout(state, question.clone()))
                }
                Kind::Intent => futures::executor::block_on(self.route.features(
                    state,
                    intent_probe(question),
                    spec.head_layer,
                )),
            };
            match result {
                Ok(logits) => return Ok(logits),
                Err(RouteError::Engine(EngineError::QueueFull(_))) => {
                    std::thread::sleep(QUEUE_FULL_WAIT)
                }
                Err(RouteError::Engine(EngineError::Loading)) => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Err(e) => return Err(format!("examples[{i}]: {e}")),
            }
        }
    }
}

/// Fits a choice task on its scored examples: the seeded split, the
/// temperature on the fit split, the figures and the threshold on the
/// holdout.
pub fn fit(spec: &TaskSpec, logits: &[Vec<f32>], labels: &[usize], default_t: f64) -> Report {
    let (fit_idx, held_idx) = calibrate::split(logits.len(), spec.holdout, spec.seed);
    let pick = |idx: &[usize]| -> (Vec<Vec<f32>>, Vec<usize>) {
        (
            idx.iter().map(|&i| logits[i].clone()).collect(),
            idx.iter().map(|&i| labels[i]).collect(),
        )
    };
    let (fl, fy) = pick(&fit_idx);
    let (hl, hy) = pick(&held_idx);
    let t = calibrate::fit_temperature(&fl, &fy);
    let pairs = calibrate::confidences(&hl, &hy, t);
    let abstention = spec.abstention.map(|a| match a {
        Abstention::TargetAccuracy(target) => calibrate::threshold_for_target(&pairs, target),
        Abstention::AbstainBelow(b) => calibrate::threshold_fixed(&pairs, b),
    });
    Report {
        temperature: t,
        fit_examples: fl.len(),
        holdout_examples: hl.len(),
        holdout_indices: held_idx,
        before: calibrate::figures(&hl, &hy, default_t),
        after: calibrate::figures(&hl, &hy, t),
        abstention,
        seconds: 0.0,
        head: None,
        draws: None,
    }
}

/// The question an intent task's examples are read with: the task's
/// question alone (a head stands in for the letters).
fn intent_probe(question: &Question) -> Question {
    Question {
        head: Some(Arc::new(Head {
            layer: None,
            dim: 0,
            labels: question.options.len(),
            mean: Vec::new(),
            scale: Vec::new(),
            weights: Vec::new(),
            bias: Vec::new(),
            temperature: 1.0,
            c: 1.0,
        })),
        ..question.clone()
    }
}

/// Fits an intent task on its examples' hidden states: the seeded
/// stratified split, the head on the fit split (cross-validated strength
/// and the head on its head part, the temperature on its calibration part),
/// the figures and the threshold on the holdout, and the draws when asked
/// for.
pub fn fit_intent(
    spec: &TaskSpec,
    features: &[Vec<f32>],
    labels: &[usize],
) -> Result<(Report, Head), String> {
    let n_labels = spec.labels.len();
    let (fit_idx, held_idx) = head::stratified_split(labels, n_labels, spec.holdout, spec.seed);
    let rows: Vec<&[f32]> = features.iter().map(|f| f.as_slice()).collect();
    let fx: Vec<&[f32]> = fit_idx.iter().map(|&i| rows[i]).collect();
    let fy: Vec<usize> = fit_idx.iter().map(|&i| labels[i]).collect();
    let hx: Vec<&[f32]> = held_idx.iter().map(|&i| rows[i]).collect();
    let hy: Vec<usize> = held_idx.iter().map(|&i| labels[i]).collect();
    let mut fitted = head::fit(&fx, &fy, n_labels, spec.head_layer, spec.seed)?;
    // The temperature's examples, as indices of the task's examples.
    for i in fitted.report.calibration_indices.iter_mut() {
        *i = fit_idx[*i];
    }
    let (before, after) = head::figures(&fitted.head, &hx, &hy);
    let held_logits = head::logits(&fitted.head, &hx);
    let pairs = calibrate::confidences(&held_logits, &hy, fitted.head.temperature);
    let abstention = spec.abstention.map(|a| match a {
        Abstention::TargetAccuracy(target) => calibrate::threshold_for_target(&pairs, target),
        Abstention::AbstainBelow(b) => calibrate::threshold_fixed(&pairs, b),
    });
    let draws = match spec.draws {
        Some(d) => Some(head::draws(
            &rows,
            labels,
            n_labels,
            &fit_idx,
            &held_idx,
            d.draws,
            d.shots,
            spec.head_layer,
            spec.seed,
        )?),
        None => None,
    };
    Ok((
        Report {
            temperature: fitted.head.temperature,
            fit_examples: fx.len(),
            holdout_examples: hx.len(),
            holdout_indices: held_idx,
            before,
            after,
            abstention,
            seconds: 0.0,
            head: Some(fitted.report),
            draws,
        },
        fitted.head,
    ))
}
