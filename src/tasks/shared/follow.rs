//! Following the manifest: the conditional read of each poll, the
//! objects of the entries newer than this replica applies, and what
//! `/health` says of it.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

use super::{now_ms, Change, EntryKind, Manifest, Shared, StoreError};
use crate::tasks::Status;

impl Shared {
    /// What changed in the manifest since this replica last read it, with
    /// the objects of the entries to apply; `Ok(None)` when nothing did.
    pub fn poll(&self) -> Result<Option<(Manifest, Vec<Change>)>, StoreError> {
        // What was applied (or written) here before the read: an entry of
        // it the read lacks was removed elsewhere. Taken after the read, a
        // write of this replica's landing in between would look removed.
        let (unless, applied) = {
            let f = self.followed();
            (f.tag.clone(), f.applied.clone())
        };
        let read = self.read_manifest(unless.as_ref());
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                self.followed().last_error = Some(match &e {
                    StoreError::Unavailable(m) | StoreError::Conflict { message: m, .. } => {
                        m.clone()
                    }
                    StoreError::Refused { message, .. } => message.clone(),
                });
                return Err(e);
            }
        };
        let Some((manifest, tag)) = read else {
            let mut f = self.followed();
            f.synced = Some(Instant::now());
            f.last_error = None;
            return Ok(None);
        };
        let mut changes = Vec::new();
        let mut seen = HashMap::new();
        let mut complete = true;
        for (k, e) in &manifest.entries {
            let have = applied.get(k).copied().unwrap_or(0);
            if e.version <= have {
                seen.insert(k.clone(), have);
                continue;
            }
            if e.deleted {
                changes.push(removal(e.kind, &e.id));
                seen.insert(k.clone(), e.version);
                continue;
            }
            let read = match e.kind {
                EntryKind::Task => self.get_task(e).map(|stored| Change::Apply {
                    entry: e.clone(),
                    stored: Box::new(stored),
                }),
                EntryKind::Abstention => {
                    self.get_abstention(e).map(|task| Change::ApplyAbstention {
                        entry: e.clone(),
                        task: Box::new(task),
                    })
                }
            };
            match read {
                Ok(change) => {
                    changes.push(change);
                    seen.insert(k.clone(), e.version);
                }
                Err(StoreError::Refused { reason, message }) => {
                    changes.push(Change::Refused {
                        id: e.id.clone(),
                        reason,
                        message,
                    });
                    seen.insert(k.clone(), e.version);
                }
                // Read again at the next poll.
                Err(_) => {
                    complete = false;
                    seen.insert(k.clone(), have);
                }
            }
        }
        // An entry gone from the manifest (a tombstone dropped before this
        // replica read it): the task is gone.
        for (k, v) in &applied {
            if *v > 0 && !manifest.entries.contains_key(k) {
                if let Some(id) = k.strip_prefix("task/") {
                    changes.push(removal(EntryKind::Task, id));
                } else if let Some(id) = k.strip_prefix("abstention/") {
                    changes.push(removal(EntryKind::Abstention, id));
                }
            }
        }
        let mut f = self.followed();
        // Merged, not replaced: a write of this replica's since the read
        // has the newer version.
        for (k, v) in seen {
            let have = f.applied.entry(k).or_insert(0);
            *have = (*have).max(v);
        }
        for (k, v) in &applied {
            if !manifest.entries.contains_key(k) && f.applied.get(k) == Some(v) {
                f.applied.remove(k);
            }
        }
        f.pending = manifest
            .entries
            .values()
            .filter(|e| !e.deleted && e.status.is_some_and(Status::pending))
            .cloned()
            .collect();
        // An incomplete read is read whole again at the next poll.
        f.tag = if complete { tag } else { None };
        f.manifest_version = manifest.version;
        f.synced = Some(Instant::now());
        f.last_error = None;
        if changes.iter().any(|c| !matches!(c, Change::Refused { .. })) {
            f.lag_seconds = Some(now_ms().saturating_sub(manifest.updated_ms) as f64 / 1000.0);
        }
        Ok(Some((manifest, changes)))
    }

    /// The manifest version this replica applies, seconds since its last
    /// read of the store, and the lag of the last change applied.
    pub fn report(&self) -> Report {
        let f = self.followed();
        Report {
            url: self.label.clone(),
            replica: self.replica.clone(),
            poll_seconds: self.settings.poll.as_secs_f64(),
            manifest_version: f.manifest_version,
            entries_applied: f.applied.values().filter(|v| **v > 0).count(),
            last_sync_age_seconds: f.synced.map(|t| t.elapsed().as_secs_f64()),
            lag_seconds: f.lag_seconds,
            ok: f.last_error.is_none() && f.synced.is_some(),
            last_error: f.last_error.clone(),
            claims: self.claims().len(),
        }
    }
}

/// What `/health` says of the store.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub url: String,
    pub replica: String,
    pub poll_seconds: f64,
    pub manifest_version: u64,
    pub entries_applied: usize,
    pub last_sync_age_seconds: Option<f64>,
    pub lag_seconds: Option<f64>,
    pub ok: bool,
    pub last_error: Option<String>,
    /// Registrations this replica fits for the fleet.
    pub claims: usize,
}

/// The change that removes entry `id` of `kind` here.
fn removal(kind: EntryKind, id: &str) -> Change {
    let id = id.to_string();
    match kind {
        EntryKind::Task => Change::Remove { id },
        EntryKind::Abstention => Change::RemoveAbstention { id },
    }
}
