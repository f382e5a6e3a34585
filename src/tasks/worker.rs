//! The registration worker: one task at a time, oldest first, one engine
//! job per example (so decisions queued meanwhile wait for at most one
//! example), the logits checkpointed now and then, then the fit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    certificate, fit, fit_intent, Example, Kind, Report, Status, TaskRecord, TaskRegistry, TaskSpec,
};
use crate::stats::head::Head;
use crate::text_route::{EngineError, EngineStatus};
use crate::text_route::{Question, RouteError, State};

/// How often a running registration checkpoints its logits and progress.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// How often a running registration logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What the worker waits before offering a job again when the engine's
/// queue is full (serving comes first).
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(20);

impl TaskRegistry {
    /// The worker: registrations one at a time, oldest first.
    pub(super) fn work(self: Arc<Self>) {
        loop {
            let id = {
                let mut tasks = self.lock();
                loop {
                    // With a shared store, only the registrations this
                    // replica holds the claim of.
                    if let Some(r) = tasks
                        .values()
                        .find(|r| r.status == Status::Queued && self.owns(&r.id))
                    {
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
            self.share_fitted(id);
        }
    }

    /// Scores every example not yet in the checkpoint, then fits.
    fn run(&self, id: &str) -> Result<(), String> {
        // A backend waiting for its servers knows its model once they came.
        while matches!(self.route.status(), EngineStatus::Waiting(_)) {
            std::thread::sleep(Duration::from_millis(200));
        }
        let record = self.get(id).map_err(|e| e.to_string())?;
        if record.model != self.route.info().identity {
            return Err(
                "the server restarted on another model before this registration \
                        finished; register it again"
                    .into(),
            );
        }
        let spec = record.spec.clone();
        let examples = self.store.load_examples(id)?;
        let (mut logits, mut sealed) = self.store.load_checkpoint(id)?;
        // A choice task's rows are its letters' logits in each rotation,
        // one after another; an intent task's, hidden states of one width.
        let width = match spec.kind {
            Kind::Choice => Some(spec.labels.len() * spec.rotations),
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
        let Some(mut logits) =
            self.score_examples(id, &spec, &examples, logits, sealed, (before, started))?
        else {
            return Ok(());
        };
        let (mut report, head) = self.fitted(&spec, &examples, &mut logits)?;
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
            r.stack = Some(self.stack());
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
        self.share_fitted(id);
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

    /// Scores the examples from `logits.len()` on, checkpointing now and
    /// then; `None` when the registration was deleted or cancelled
    /// meanwhile. `(before, started)`: the seconds spent in earlier runs,
    /// and when this one started.
    fn score_examples(
        &self,
        id: &str,
        spec: &TaskSpec,
        examples: &[Example],
        mut logits: Vec<Vec<f32>>,
        mut sealed: usize,
        (before, started): (f64, Instant),
    ) -> Result<Option<Vec<Vec<f32>>>, String> {
        let resumed = logits.len();
        let question = scored_question(spec);
        let (mut last_save, mut last_log) = (Instant::now(), Instant::now());
        for i in resumed..examples.len() {
            if !self.pending(id) {
                self.store.remove_checkpoint(id);
                return Ok(None);
            }
            logits.push(self.readout(&examples[i].state, &question, spec, i)?);
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
        Ok(Some(logits))
    }

    /// The task's report (and an intent task's head) fitted on its scored
    /// `logits`, with the certificate of a certified task; a choice task's
    /// `logits` are left as the served order's rows.
    fn fitted(
        &self,
        spec: &TaskSpec,
        examples: &[Example],
        logits: &mut Vec<Vec<f32>>,
    ) -> Result<(Report, Option<Head>), String> {
        let labels: Vec<usize> = examples.iter().map(|e| e.label).collect();
        let split = spec.split(examples);
        let (mut report, head) = match spec.kind {
            Kind::Choice => {
                // Each row's rotations apart; the served order's first.
                let n = spec.labels.len();
                let reads: Vec<Vec<Vec<f32>>> = logits
                    .iter()
                    .map(|row| row.chunks(n).map(<[f32]>::to_vec).collect())
                    .collect();
                *logits = reads.iter().map(|r| r[0].clone()).collect();
                (
                    fit(spec, &reads, &labels, self.route.default_temperature, split),
                    None,
                )
            }
            Kind::Intent => {
                let (report, head) = fit_intent(spec, logits, &labels, split)?;
                (report, Some(head))
            }
        };
        // The certificate, on the held-out answers as served: the letters'
        // logits, or the head's on the hidden states.
        if spec.certify.is_some() {
            let held = &report.holdout_indices;
            let held_rows: Vec<Vec<f32>> = held
                .iter()
                .map(|&i| match &head {
                    Some(h) => h.logits(&logits[i]),
                    None => report.served_logits(&logits[i]),
                })
                .collect();
            let held_labels: Vec<usize> = held.iter().map(|&i| labels[i]).collect();
            report.certificate = certificate::of_holdout(
                spec,
                &held_rows,
                &held_labels,
                report.temperature,
                report.fit_examples,
                self.stack(),
                if spec.certify_examples > 0 {
                    certificate::Method::Supplied
                } else {
                    certificate::Method::Holdout
                },
            );
        }
        Ok((report, head))
    }

    /// Whether the worker goes on with registration `id`: it was neither
    /// deleted nor taken over by another replica.
    fn pending(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|r| r.status.pending()) && self.owns(id)
    }

    /// The letter logits (an intent task: the hidden state) of one
    /// example: one engine job, offered again while the engine's queue is
    /// full or the model is loading.
    pub(super) fn readout(
        &self,
        state: &str,
        question: &Question,
        spec: &TaskSpec,
        i: usize,
    ) -> Result<Vec<f32>, String> {
        loop {
            let state = State::Text(state.to_string());
            let result = match spec.kind {
                Kind::Choice => futures::executor::block_on(self.route.readout_rotations(
                    state,
                    question.clone(),
                    spec.rotations,
                ))
                .map(|rows| rows.concat()),
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
                Err(RouteError::Engine(EngineError::Loading | EngineError::Waiting(_))) => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Err(e) => return Err(format!("examples[{i}]: {e}")),
            }
        }
    }
}

/// The question a registration's examples are read with: the task's
/// question and options as asked, at no temperature (the logits are kept).
pub(super) fn scored_question(spec: &TaskSpec) -> Question {
    Question::new(spec.question.clone(), spec.labels.clone()).with_wire(spec.asked_on_wire())
}

/// The question an intent task's examples are read with: the task's
/// question alone (a head stands in for the letters).
fn intent_probe(question: &Question) -> Question {
    question.clone().with_head(Some(Arc::new(Head {
        layer: None,
        dim: 0,
        labels: question.options.len(),
        mean: Vec::new(),
        scale: Vec::new(),
        weights: Vec::new(),
        bias: Vec::new(),
        temperature: 1.0,
        c: 1.0,
    })))
}
