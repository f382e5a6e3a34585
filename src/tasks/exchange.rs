//! Moving ready tasks between servers: an export (`GET /v1/tasks?full=1`)
//! holds each ready task's record (its spec and report: temperature,
//! thresholds, prediction sets, certificate) and an intent task's head,
//! with the serving stack it was fitted on; an import (`POST
//! /v1/tasks/import`) loads it into a server of the same stack without
//! fitting again, so its answers are the same bits. A server of another
//! stack refuses it: its readout differs, and what was fitted on one is
//! not the other's.

use serde::{Deserialize, Serialize};

use super::certificate::Stack;
use super::{Kind, Status, TaskError, TaskRecord, TaskRegistry, FORMAT_VERSION};
use crate::stats::head::Head;

/// An export of a server's ready tasks.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Export {
    /// `tasks.export`.
    pub object: String,
    pub format_version: u32,
    /// The serving stack the tasks were fitted on.
    pub stack: Stack,
    pub tasks: Vec<Exported>,
}

/// One exported task.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exported {
    pub record: TaskRecord,
    /// An intent task's head.
    #[serde(default)]
    pub head: Option<Head>,
}

fn invalid(param: &str, message: String) -> TaskError {
    TaskError::Invalid {
        param: param.into(),
        message,
    }
}

impl TaskRegistry {
    /// Every ready task, with the stack they were fitted on.
    pub fn export(&self) -> Export {
        let tasks = self.lock();
        let heads = self.heads_lock();
        Export {
            object: "tasks.export".into(),
            format_version: FORMAT_VERSION,
            stack: self.stack(),
            tasks: tasks
                .values()
                .filter(|r| r.status == Status::Ready)
                .map(|r| Exported {
                    record: r.clone(),
                    head: heads.get(&r.id).map(|h| (**h).clone()),
                })
                .collect(),
        }
    }

    /// Loads an export: every task or none. Refused when the export is of
    /// another format or serving stack, a task is not ready or lacks its
    /// head, or its name or id is taken here.
    pub fn import(&self, export: Export) -> Result<Vec<String>, TaskError> {
        if export.format_version != FORMAT_VERSION {
            return Err(invalid(
                "format_version",
                format!(
                    "the export is of format {}, this server reads {FORMAT_VERSION}",
                    export.format_version
                ),
            ));
        }
        let here = self.stack();
        let model = &self.route.info().identity;
        let other_model = export.tasks.iter().any(|t| &t.record.model != model);
        if export.stack != here || other_model {
            let mut changed = export.stack.differences(&here);
            if other_model && !changed.contains(&"model") {
                changed.insert(0, "model");
            }
            return Err(TaskError::StackDiffers(format!(
                "the tasks were fitted on another serving stack ({} differ{}); register them \
                 again on this server from their examples",
                changed.join(", "),
                if changed.len() == 1 { "s" } else { "" }
            )));
        }
        for (i, t) in export.tasks.iter().enumerate() {
            let r = &t.record;
            if r.status != Status::Ready || r.report.is_none() {
                return Err(invalid(
                    &format!("tasks[{i}].record.status"),
                    format!(
                        "the task `{}` is not ready; export ready tasks only",
                        r.spec.name
                    ),
                ));
            }
            if r.spec.kind == Kind::Intent && t.head.is_none() {
                return Err(invalid(
                    &format!("tasks[{i}].head"),
                    format!("the intent task `{}` comes without its head", r.spec.name),
                ));
            }
        }
        // The fleet's store first (it refuses a name another replica
        // holds); each task there is applied here below.
        for t in &export.tasks {
            self.share_version(&t.record, t.head.as_ref())?;
        }
        let mut tasks = self.lock();
        if tasks.len() + export.tasks.len() > self.limits.max_tasks {
            return Err(TaskError::Full {
                param: "tasks".into(),
                message: format!(
                    "this server holds {} tasks and takes at most {}; DELETE some first",
                    tasks.len(),
                    self.limits.max_tasks
                ),
            });
        }
        for (i, t) in export.tasks.iter().enumerate() {
            let r = &t.record;
            let clash = tasks
                .values()
                .chain(export.tasks[..i].iter().map(|e| &e.record))
                .any(|o| o.spec.name == r.spec.name || o.id == r.id);
            if clash {
                return Err(TaskError::Taken {
                    param: format!("tasks[{i}]"),
                    message: format!(
                        "a task named `{}` (or of id {}) is already here; DELETE it first",
                        r.spec.name, r.id
                    ),
                });
            }
        }
        let mut ids = Vec::with_capacity(export.tasks.len());
        for t in export.tasks {
            if let Some(h) = &t.head {
                self.store
                    .save_head(&t.record.id, h)
                    .map_err(TaskError::Store)?;
            }
            self.store.save(&t.record).map_err(TaskError::Store)?;
            if let Some(h) = t.head {
                self.heads_lock()
                    .insert(t.record.id.clone(), std::sync::Arc::new(h));
            }
            tracing::info!("task `{}` ({}): imported", t.record.spec.name, t.record.id);
            ids.push(t.record.id.clone());
            tasks.insert(t.record.id.clone(), t.record);
        }
        self.update_gauges(&tasks);
        Ok(ids)
    }
}
