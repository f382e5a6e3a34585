//! Abstention tasks (`/v1/abstention/tasks`, the reference decisio's
//! `decisio/serve/abstention.py`): a System One choice question whose
//! options include a declared "can't tell" key, with a threshold on that
//! key's probability fitted from labelled examples
//! ([`crate::stats::abstain`]). A question of the task's option set (or
//! option keys) answers that key when its probability is above the
//! threshold, else the best of the other options; its probabilities are
//! unchanged.
//!
//! The tasks of a server are kept in one file of the state folder
//! ([`super::store::ABSTENTION_FILE`]) and survive a restart. A task
//! fitted under another model or prompt layout is kept but not applied
//! (its threshold is for that model's probabilities), and an import of one
//! is refused.

use serde::{Deserialize, Serialize};

use super::{TaskError, TaskRegistry};
use crate::stats::abstain::AbstentionFit;

/// The declared abstain option: one of the question's own keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbstainOption {
    pub key: String,
}

/// Which questions a task applies to: those of one option set (the keys
/// and their descriptions, in any order, whatever the instructions), or of
/// one set of keys (whatever their descriptions: a family of questions
/// that share labels but not texts). The value is the set's digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Match {
    OptionSet(String),
    OptionKeys(String),
}

/// One abstention task, as `GET /v1/abstention/tasks` lists it and the
/// state folder keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbstentionTask {
    pub id: String,
    pub option: AbstainOption,
    #[serde(rename = "match")]
    pub matches: Match,
    pub config: AbstentionFit,
    /// The served model's identity and the prompt layout's digest it was
    /// fitted under.
    pub model: String,
    pub layout: String,
}

impl TaskRegistry {
    pub(super) fn abstention_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, AbstentionTask>> {
        self.abstention.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any abstention task is held (answers skip the digests
    /// when none is).
    pub fn has_abstention(&self) -> bool {
        !self.abstention_lock().is_empty()
    }

    /// Every abstention task, by id.
    pub fn abstention_tasks(&self) -> Vec<AbstentionTask> {
        self.abstention_lock().values().cloned().collect()
    }

    /// Whether a task was fitted under this server's model and layout.
    pub fn abstention_applies(&self, t: &AbstentionTask) -> bool {
        t.model == self.route.info().identity && t.layout == self.layout
    }

    /// A new task's `model` and `layout`: this server's.
    pub fn abstention_stack(&self) -> (String, String) {
        (self.route.info().identity.clone(), self.layout.clone())
    }

    /// The task a choice question of these digests is answered with: one
    /// of its option set first, then one of its keys; only tasks that
    /// apply to this server.
    pub fn abstention_for(&self, option_set: &str, option_keys: &str) -> Option<AbstentionTask> {
        let tasks = self.abstention_lock();
        let applies = |t: &&AbstentionTask| self.abstention_applies(t);
        tasks
            .values()
            .filter(applies)
            .find(|t| t.matches == Match::OptionSet(option_set.to_string()))
            .or_else(|| {
                tasks
                    .values()
                    .filter(applies)
                    .find(|t| t.matches == Match::OptionKeys(option_keys.to_string()))
            })
            .cloned()
    }

    /// Stores tasks (replacing those of the same ids), saved before they
    /// are served; refused beyond the limit of tasks (256).
    fn store_abstention(&self, new: Vec<AbstentionTask>) -> Result<(), TaskError> {
        let held = {
            let tasks = self.abstention_lock();
            let ids: std::collections::BTreeSet<&String> =
                tasks.keys().chain(new.iter().map(|t| &t.id)).collect();
            ids.len()
        };
        if held > self.limits.max_tasks {
            return Err(TaskError::Full {
                param: "id".into(),
                message: format!(
                    "this server holds at most {} abstention tasks; delete one \
                     with DELETE /v1/abstention/tasks/{{id}} first",
                    self.limits.max_tasks
                ),
            });
        }
        // The fleet's store first (`--task-store`): nothing is kept here
        // when it cannot take them.
        for t in &new {
            self.share_abstention(t)?;
        }
        let mut tasks = self.abstention_lock();
        let mut next = tasks.clone();
        for t in new {
            next.insert(t.id.clone(), t);
        }
        self.store
            .save_abstention(next.values().cloned().collect())
            .map_err(TaskError::Store)?;
        *tasks = next;
        Ok(())
    }

    /// Stores a task fitted here.
    pub fn add_abstention(&self, task: AbstentionTask) -> Result<(), TaskError> {
        let (id, n, applied) = (task.id.clone(), task.config.n, task.config.applied);
        self.store_abstention(vec![task])?;
        tracing::info!("abstention task `{id}`: fitted on {n} examples, applied: {applied}");
        Ok(())
    }

    /// Loads tasks as `GET /v1/abstention/tasks` lists them, without
    /// scoring again: refused (nothing stored) when one was fitted under
    /// another model or layout.
    pub fn import_abstention(&self, tasks: Vec<AbstentionTask>) -> Result<Vec<String>, TaskError> {
        let other: Vec<&str> = tasks
            .iter()
            .filter(|t| !self.abstention_applies(t))
            .map(|t| t.id.as_str())
            .collect();
        if !other.is_empty() {
            return Err(TaskError::StackDiffers(format!(
                "abstention tasks {other:?} were fitted under another served model or prompt \
                 layout than this server's; register them again here"
            )));
        }
        let ids = tasks.iter().map(|t| t.id.clone()).collect();
        self.store_abstention(tasks)?;
        Ok(ids)
    }

    /// Removes a task, and a registration of that id (cancelled when it
    /// is queued or running); `false` when there is neither.
    pub fn remove_abstention(&self, id: &str) -> Result<bool, TaskError> {
        let job = self.drop_abstention_job(id);
        if !self.abstention_lock().contains_key(id) {
            return Ok(job);
        }
        // The fleet's tombstone first (`--task-store`).
        self.share_abstention_removal(id)?;
        let mut tasks = self.abstention_lock();
        if !tasks.contains_key(id) {
            return Ok(true);
        }
        let mut next = tasks.clone();
        next.remove(id);
        self.store
            .save_abstention(next.values().cloned().collect())
            .map_err(TaskError::Store)?;
        *tasks = next;
        Ok(true)
    }
}
