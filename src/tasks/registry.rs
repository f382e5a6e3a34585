//! The registry of one server's tasks: opening the state folder (and
//! resuming what a stop cut short), registering, listing, deleting, and
//! the question a decision naming a task asks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::certificate::{CertificateReport, Reason, Stack, Verdict};
use super::shared::Shared;
use super::store::Store;
use super::{
    Deleted, Example, Kind, Progress, SetsReport, Status, TaskError, TaskLimits, TaskOutcome,
    TaskRecord, TaskRegistry, TaskSpec, FORMAT_VERSION,
};
use crate::stats::head::Head;
use crate::stats::monitor::Monitor;
use crate::text_route::EngineStatus;
use crate::text_route::{Answer, Question, TextRoute};

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
        shared: Option<Shared>,
    ) -> Result<Arc<Self>, String> {
        let store = Store::open(root)?;
        let model = route.info().identity.clone();
        // A backend waiting for its servers does not know its model yet: the
        // worker compares when it runs the registration.
        let waiting = matches!(route.status(), EngineStatus::Waiting(_));
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
                if record.model != model && !waiting {
                    record.status = Status::Failed;
                    record.error = Some(
                        "the server restarted on another model before this registration \
                         finished; register it again"
                            .into(),
                    );
                } else {
                    record.requeue("resuming its registration");
                }
                store.save(&record)?;
            }
            tasks.insert(record.id.clone(), record);
        }
        let abstention: BTreeMap<String, _> = store
            .load_abstention()?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        let abstention_jobs = super::abstention_job::load(&store, &model, waiting)?;
        tracing::info!(
            "state folder {}: {} task(s), {} abstention task(s), {} abstention registration(s)",
            root.display(),
            tasks.len(),
            abstention.len(),
            abstention_jobs.len()
        );
        let registry = Arc::new(TaskRegistry {
            tasks: Mutex::new(tasks),
            heads: Mutex::new(heads),
            monitors: Mutex::new(HashMap::new()),
            layout: Stack::layout_of(
                route.template.source(),
                &format!("{:?}/{:?}", route.wire.format, route.wire.noul),
            ),
            abstention: Mutex::new(abstention),
            abstention_jobs: Mutex::new(abstention_jobs),
            abstention_wake: tokio::sync::Notify::new(),
            wake: Condvar::new(),
            store,
            metrics: route.metrics.clone(),
            route,
            limits,
            shared: shared.map(Arc::new),
            foreign: Mutex::new(HashMap::new()),
            unpublished: Mutex::new(BTreeSet::new()),
            migrated: AtomicBool::new(false),
        });
        registry.update_gauges(&registry.lock());
        registry.start_following()?;
        let worker = registry.clone();
        std::thread::Builder::new()
            .name("task-registration".into())
            .spawn(move || worker.work())
            .map_err(|e| format!("cannot start the registration worker: {e}"))?;
        Ok(registry)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, BTreeMap<String, TaskRecord>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn heads_lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Head>>> {
        self.heads.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn update_gauges(&self, tasks: &BTreeMap<String, TaskRecord>) {
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
            model: self.route.info().identity.clone(),
            progress: Progress {
                total: examples.len(),
                ..Progress::default()
            },
            spec: spec.clone(),
            status: Status::Queued,
            error: None,
            report: None,
            seconds: 0.0,
            stack: None,
        };
        // On the shared store first: its manifest says whether the name is
        // the fleet's already.
        if let Err(e) = self.share_registration(&record, &examples) {
            let _ = self.store.remove(&record.id);
            return Err(e);
        }
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
        // The fleet's tombstone first: nothing is removed here when the
        // shared store cannot take it.
        if self.shared.is_some() {
            drop(tasks);
            self.share_removal(id)?;
            tasks = self.lock();
            if !tasks.contains_key(id) {
                return Err(TaskError::NotFound(id.to_string()));
            }
        }
        let record = &tasks[id];
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
        self.forget_monitor(&record);
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
        if record.spec.wire.is_some() {
            return Err(TaskError::Invalid {
                param: param.to_string(),
                message: format!(
                    "the task `{name}` was registered from a System One question and applies \
                     to that question on POST /v1/systemone; ask it there"
                ),
            });
        }
        let mut question = self.applied(record, param)?;
        question.id = id;
        question.abstain_below = abstain_below.or(question.abstain_below);
        question.temperature = temperature.or(question.temperature);
        Ok(question)
    }

    /// The task a System One question of `identity` matches, as the
    /// question it asks and the task's name: a ready task registered from
    /// a question of that identity on this model (the newest, when several
    /// are). A question no such task matches is answered as it is.
    pub fn wire_question(&self, identity: &str) -> Option<(Question, String)> {
        let tasks = self.lock();
        let record = tasks
            .values()
            .filter(|r| r.spec.wire.as_ref().is_some_and(|w| w.identity == identity))
            .filter(|r| r.status == Status::Ready)
            .max_by_key(|r| r.created)?;
        let question = self.applied(record, "systemone").ok()?;
        Some((question, record.spec.name.clone()))
    }

    /// The serving stack a certificate made now would name.
    pub fn stack(&self) -> Stack {
        let r = &self.route;
        Stack {
            model: r.info().identity.clone(),
            tokenizer: r.tokenizer_identity.clone(),
            backend: r.capabilities().name.to_string(),
            layout: self.layout.clone(),
        }
    }

    /// The verdict of certificate `cert` of the task `name` (id `id`) on
    /// an answer: its chosen option, its top probability, and
    /// `as_certified`, false when the request changed what is served. The
    /// answer is counted by the task's traffic monitor and metrics.
    fn verdict(
        &self,
        (name, id): (&str, String),
        cert: CertificateReport,
        (chosen, conf): (usize, f64),
        as_certified: bool,
    ) -> Verdict {
        let mut monitors = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        let monitor = monitors
            .entry(id)
            .or_insert_with(|| Monitor::new(cert.monitor.clone()));
        let verdict = cert.verdict(
            &self.stack(),
            conf,
            as_certified,
            monitor.confidence_alerting(),
        );
        // Answers served as certified are the traffic the promise is for.
        if !matches!(verdict.reason, Some(Reason::ServingStackChanged)) {
            monitor.observe(chosen, verdict.certified, conf);
        }
        self.export_verdict(name, &verdict, &monitor.facts());
        verdict
    }

    /// What the task named `name` adds to an answer of its question, by
    /// one rule on every route: the prediction set (option indices) of a
    /// task registered with a coverage, and the verdict of a certified one.
    /// `own_temperature`: the request set the temperature, so the answer,
    /// like one averaged over orders, is not what was certified.
    pub fn outcome(&self, name: &str, answer: &Answer, own_temperature: bool) -> TaskOutcome {
        self.outcome_of(name, answer, own_temperature, None)
    }

    /// [`TaskRegistry::outcome`] of an answer read from a prompt unlike
    /// the examples' for `reason`: a state cut to the prompt ceiling
    /// (`over_limit`), or a header that lists fewer of the request's
    /// questions (`--header-limit`). Never certified (the promise is for
    /// whole inputs rendered like the examples), and unseen by the task's
    /// traffic monitor.
    pub fn outcome_unlike_examples(
        &self,
        name: &str,
        answer: &Answer,
        reason: Reason,
    ) -> TaskOutcome {
        self.outcome_of(name, answer, false, Some(reason))
    }

    fn outcome_of(
        &self,
        name: &str,
        answer: &Answer,
        own: bool,
        unlike: Option<Reason>,
    ) -> TaskOutcome {
        // The task is looked up once: its prediction sets and certificate.
        let found = {
            let tasks = self.lock();
            tasks
                .values()
                .find(|r| r.spec.name == name)
                .and_then(|r| Some((r.id.clone(), r.report.as_ref()?)))
                .map(|(id, report)| {
                    let sets: Option<SetsReport> = report.prediction_sets.clone();
                    (id, sets, report.certificate.clone())
                })
        };
        let Some((id, sets, cert)) = found else {
            return TaskOutcome::default();
        };
        let as_certified = !own && answer.orders == 1;
        TaskOutcome {
            prediction_set: sets.map(|s| s.set(&answer.exact)),
            verdict: cert.map(|cert| match unlike {
                Some(reason) => {
                    self.metrics
                        .certified_task_answers
                        .with_label_values(&[name, reason.as_str()])
                        .inc();
                    Verdict {
                        certified: false,
                        certificate: cert.id,
                        reason: Some(reason),
                    }
                }
                None => {
                    let answered = (answer.top, answer.confidence());
                    self.verdict((name, id), cert, answered, as_certified)
                }
            }),
        }
    }

    /// The verdict on a System One question of `identity` that no task
    /// serves because the certified task registered for it was fitted on
    /// another model: not certified, the stack changed.
    pub fn stale_verdict(&self, identity: &str) -> Option<Verdict> {
        let tasks = self.lock();
        let model = &self.route.info().identity;
        let r = tasks
            .values()
            .filter(|r| r.spec.wire.as_ref().is_some_and(|w| w.identity == identity))
            .filter(|r| r.status == Status::Ready && &r.model != model)
            .max_by_key(|r| r.created)?;
        let cert = r.report.as_ref()?.certificate.as_ref()?;
        Some(Verdict {
            certified: false,
            certificate: cert.id.clone(),
            reason: Some(Reason::ServingStackChanged),
        })
    }

    /// A certified task's state, as the reference shows it: `suspended`
    /// (the serving stack changed: what changed, and how to certify
    /// again), `traffic_changed` (a traffic signal alerts) or `ok`, with
    /// the monitor's facts; `None` without a certificate.
    pub fn certificate_status(&self, r: &TaskRecord) -> Option<serde_json::Value> {
        let cert = r.report.as_ref()?.certificate.as_ref()?;
        let now = self.stack();
        if cert.stack != now {
            return Some(serde_json::json!({
                "state": "suspended",
                "text": "suspended: serving stack changed",
                "changed": cert.stack.differences(&now),
                "recertify": format!(
                    "POST /v1/tasks/{}/certify with new labelled examples",
                    r.id
                ),
            }));
        }
        let facts = self.traffic(&r.id);
        let state = facts.as_ref().map_or("ok", |f| f.state);
        let text = match (&facts, state) {
            (Some(f), "traffic_changed") => {
                let suspended = cert.suspend_on_alert && f.signals.contains(&"confidence");
                format!(
                    "traffic changed: {} moved away from the certification examples'{}",
                    f.signals
                        .iter()
                        .map(|s| match *s {
                            "answer_mix" => "the mix of chosen options",
                            _ => "the confidences",
                        })
                        .collect::<Vec<_>>()
                        .join(" and "),
                    if suspended {
                        "; certification is suspended (every answer is certified: false) \
                         until the alert clears"
                    } else {
                        " (the certificate is not suspended)"
                    }
                )
            }
            _ => "ok".to_string(),
        };
        let mut out = serde_json::json!({"state": state, "text": text});
        if let Some(f) = facts {
            out["monitor"] = serde_json::to_value(f).unwrap_or_default();
        }
        Some(out)
    }

    /// The traffic facts of a certified task's monitor (`None` before its
    /// first answer since the server started, or without a certificate).
    pub fn traffic(&self, id: &str) -> Option<crate::stats::monitor::Facts> {
        let monitors = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        monitors.get(id).map(Monitor::facts)
    }

    fn export_verdict(&self, name: &str, verdict: &Verdict, facts: &crate::stats::monitor::Facts) {
        let m = &self.metrics;
        let label = match verdict.reason {
            None => "certified",
            Some(r) => r.as_str(),
        };
        m.certified_task_answers
            .with_label_values(&[name, label])
            .inc();
        if let Some(d) = facts.distance {
            m.certified_task_mix_distance
                .with_label_values(&[name])
                .set(d);
        }
        m.certified_task_mix_line
            .with_label_values(&[name])
            .set(facts.line);
        if let (Some(s), Some(l)) = (facts.statistic, facts.limit) {
            m.certified_task_confidence_statistic
                .with_label_values(&[name])
                .set(s);
            m.certified_task_confidence_limit
                .with_label_values(&[name])
                .set(l);
        }
        for signal in ["answer_mix", "confidence"] {
            m.certified_task_alert
                .with_label_values(&[name, signal])
                .set(facts.signals.contains(&signal) as i64);
        }
    }

    /// Drops a deleted task's monitor and its metric series.
    pub(super) fn forget_monitor(&self, record: &TaskRecord) {
        let mut monitors = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        if monitors.remove(&record.id).is_none() {
            return;
        }
        let m = &self.metrics;
        let name = record.spec.name.as_str();
        for verdict in ["certified"]
            .into_iter()
            .chain(Reason::ALL.map(Reason::as_str))
        {
            let _ = m
                .certified_task_answers
                .remove_label_values(&[name, verdict]);
        }
        for g in [
            &m.certified_task_mix_distance,
            &m.certified_task_mix_line,
            &m.certified_task_confidence_statistic,
            &m.certified_task_confidence_limit,
        ] {
            let _ = g.remove_label_values(&[name]);
        }
        for signal in ["answer_mix", "confidence"] {
            let _ = m.certified_task_alert.remove_label_values(&[name, signal]);
        }
    }

    /// The question a ready task asks: its question and options, its
    /// fitted temperature and threshold, its head; or why it cannot answer.
    fn applied(&self, record: &TaskRecord, param: &str) -> Result<Question, TaskError> {
        let name = &record.spec.name;
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
        if record.model != self.route.info().identity {
            return Err(TaskError::NotReady {
                param: param.to_string(),
                message: format!(
                    "the task `{name}` was fitted on another model; register it again on this one"
                ),
            });
        }
        // Another replica's task fitted on another serving stack is kept,
        // not applied ([`Self::foreign_lock`]).
        if let Some(changed) = self.foreign_lock().get(&record.id) {
            return Err(TaskError::NotReady {
                param: param.to_string(),
                message: format!(
                    "the task `{name}` was fitted on another serving stack ({} differ{}); \
                     register it again on this server",
                    changed.join(", "),
                    if changed.len() == 1 { "s" } else { "" }
                ),
            });
        }
        let head = match record.spec.kind {
            Kind::Choice => None,
            Kind::Intent => {
                if self.route.hidden_layers().is_none() {
                    return Err(TaskError::Invalid {
                        param: param.to_string(),
                        message: format!(
                            "the task `{name}` is an intent task, answered from hidden states, \
                             which the {} backend does not return{}",
                            self.route.capabilities().name,
                            self.route.capabilities().hidden_hint
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
        let bias = report.debias.as_ref().and_then(|d| d.applied());
        Ok(
            Question::new(record.spec.question.clone(), record.spec.labels.clone())
                .with_abstention(report.abstention.as_ref().and_then(|a| a.abstain_below))
                .with_temperature(Some(report.temperature))
                .with_bias(bias.map(Arc::from))
                .with_head(head)
                .with_wire(record.spec.asked_on_wire()),
        )
    }
}
