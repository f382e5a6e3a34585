//! Certifying a ready task again (`POST /v1/tasks/{id}/certify`): new
//! labelled examples, none of them an input the fit saw, read through the
//! task as it serves them on this server's stack, and a new certificate
//! made on them; the fit is kept.

use std::collections::HashSet;
use std::sync::Arc;

use super::certificate::{self, CertifySpec, Method};
use super::worker::scored_question;
use super::{Example, Kind, Report, Status, TaskError, TaskRecord, TaskRegistry, TaskSpec};

fn invalid(param: &str, message: String) -> TaskError {
    TaskError::Invalid {
        param: param.into(),
        message,
    }
}

impl TaskRegistry {
    /// The task of id `key`, else the task named `key`.
    pub fn find(&self, key: &str) -> Result<TaskRecord, TaskError> {
        let tasks = self.lock();
        tasks
            .get(key)
            .or_else(|| tasks.values().find(|r| r.spec.name == key))
            .cloned()
            .ok_or_else(|| TaskError::NotFound(key.to_string()))
    }

    /// Certifies the ready task `id` again on `examples` with `spec`: the
    /// new certificate replaces the old (and its traffic monitor starts
    /// again). Refused when the task was registered without certification,
    /// is not ready, was fitted on another model, when there are fewer
    /// examples than `spec.min_examples`, or when an example's input is
    /// one the fit saw.
    pub fn recertify(
        &self,
        id: &str,
        examples: &[Example],
        spec: CertifySpec,
    ) -> Result<TaskRecord, TaskError> {
        let record = self.find(id)?;
        let name = record.spec.name.clone();
        let report = self.certifiable(&record)?;
        if examples.len() < spec.min_examples {
            return Err(invalid(
                "examples",
                format!(
                    "{} labelled examples, and at least {} are needed to certify at alpha {} and \
                     delta {}",
                    examples.len(),
                    spec.min_examples,
                    spec.alpha,
                    spec.delta
                ),
            ));
        }
        self.check_unseen(&record, report, examples)?;
        let head = match record.spec.kind {
            Kind::Choice => None,
            Kind::Intent => Some(self.heads_lock().get(&record.id).cloned().ok_or_else(|| {
                TaskError::NotReady {
                    param: "id".into(),
                    message: format!("the task `{name}` has no head loaded; register it again"),
                }
            })?),
        };
        let question = scored_question(&record.spec);
        // Read in the served order alone: what the task serves.
        let read_spec = TaskSpec {
            rotations: 1,
            ..record.spec.clone()
        };
        let mut rows = Vec::with_capacity(examples.len());
        for (i, e) in examples.iter().enumerate() {
            let row = self
                .readout(&e.state, &question, &read_spec, i)
                .map_err(TaskError::Store)?;
            rows.push(match &head {
                Some(h) => Arc::clone(h).logits(&row),
                None => report.served_logits(&row),
            });
        }
        let labels: Vec<usize> = examples.iter().map(|e| e.label).collect();
        let mut task_spec = record.spec.clone();
        task_spec.certify = Some(spec);
        let cert = certificate::of_holdout(
            &task_spec,
            &rows,
            &labels,
            report.temperature,
            report.fit_examples,
            self.stack(),
            Method::Recertified,
        );
        let mut updated = record.clone();
        updated.spec.certify = Some(spec);
        if let Some(rep) = updated.report.as_mut() {
            rep.certificate = cert;
        }
        // The fleet's store first: nothing changes here when it cannot
        // take the new certificate.
        self.share_version(&updated, None)?;
        let mut tasks = self.lock();
        let Some(r) = tasks.get_mut(&record.id) else {
            return Err(TaskError::NotFound(id.to_string()));
        };
        r.spec.certify = updated.spec.certify;
        if let Some(rep) = r.report.as_mut() {
            rep.certificate = updated.report.as_ref().and_then(|u| u.certificate.clone());
        }
        self.store.save(r).map_err(TaskError::Store)?;
        let updated = r.clone();
        drop(tasks);
        self.forget_monitor(&updated);
        tracing::info!("task `{name}` ({}): certified again", updated.id);
        Ok(updated)
    }

    /// The report of a task that may be certified again: ready,
    /// registered with certification, fitted on this model.
    fn certifiable<'r>(&self, record: &'r TaskRecord) -> Result<&'r Report, TaskError> {
        let name = &record.spec.name;
        let Some(report) = record
            .report
            .as_ref()
            .filter(|_| record.status == Status::Ready)
        else {
            return Err(TaskError::NotReady {
                param: "id".into(),
                message: format!("the task `{name}` is not ready; certify it once it is"),
            });
        };
        if record.spec.certify.is_none() {
            return Err(invalid(
                "id",
                format!(
                    "the task `{name}` was registered without certification: register it again \
                     with a certify block"
                ),
            ));
        }
        if record.model != self.route.info().identity {
            return Err(TaskError::NotReady {
                param: "id".into(),
                message: format!(
                    "the task `{name}` was fitted on another model; register it again on this one"
                ),
            });
        }
        Ok(report)
    }

    /// Refuses examples whose input the task's fit saw (its registration's
    /// examples but the held-out ones).
    fn check_unseen(
        &self,
        record: &TaskRecord,
        report: &Report,
        examples: &[Example],
    ) -> Result<(), TaskError> {
        let registered = self
            .store
            .load_examples(&record.id)
            .map_err(TaskError::Store)?;
        let held: HashSet<usize> = report.holdout_indices.iter().copied().collect();
        let fit: HashSet<String> = registered
            .iter()
            .enumerate()
            .filter(|(i, _)| !held.contains(i))
            .map(|(_, e)| record.spec.input_of(&e.state))
            .collect();
        let seen = examples
            .iter()
            .filter(|e| fit.contains(&record.spec.input_of(&e.state)))
            .count();
        if seen > 0 {
            return Err(invalid(
                "examples",
                format!(
                    "{seen} of the {} examples are inputs the fit saw; certify on examples it has \
                     not seen",
                    examples.len()
                ),
            ));
        }
        Ok(())
    }
}
