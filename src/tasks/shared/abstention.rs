//! Abstention tasks (`/v1/abstention/tasks`) in the shared store: one
//! entry each, keyed `abstention/<id>`, its object the task as the
//! listing shows it.

use serde::{Deserialize, Serialize};

use super::{Entry, EntryKind, Line, Shared, StoreError};
use crate::tasks::abstention::AbstentionTask;
use crate::tasks::FORMAT_VERSION;

/// An abstention task as its object holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredAbstention {
    pub format_version: u32,
    pub task: AbstentionTask,
}

impl Shared {
    /// Writes a version of abstention task `task`, over the version this
    /// replica applied (409 when the store holds another).
    pub fn publish_abstention(&self, task: &AbstentionTask) -> Result<u64, StoreError> {
        let line = Line {
            kind: EntryKind::Abstention,
            id: &task.id,
            name: &task.id,
            status: None,
        };
        let stored = StoredAbstention {
            format_version: FORMAT_VERSION,
            task: task.clone(),
        };
        self.publish_entry(line, &stored, None)
    }

    /// An abstention task's object, parsed and checked.
    pub fn get_abstention(&self, entry: &Entry) -> Result<AbstentionTask, StoreError> {
        let d = entry.object.as_deref().unwrap_or_default();
        let bytes = self.get_object(d)?;
        let short = &d[..12.min(d.len())];
        let stored: StoredAbstention =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Refused {
                reason: "format",
                message: format!("object {short} is not a decisio abstention task ({e})"),
            })?;
        if stored.format_version != FORMAT_VERSION || stored.task.id != entry.id {
            return Err(StoreError::Refused {
                reason: "foreign",
                message: format!(
                    "object {short} holds abstention task `{}`, where the manifest names `{}`",
                    stored.task.id, entry.id
                ),
            });
        }
        Ok(stored.task)
    }

    /// Writes abstention task `id`'s tombstone.
    pub fn remove_abstention(&self, id: &str) -> Result<(), StoreError> {
        self.remove_entry(EntryKind::Abstention, id)
    }
}
