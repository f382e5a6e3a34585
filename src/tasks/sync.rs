//! A server's tasks kept with the fleet's ([`super::shared`]): each change
//! made here is written to the shared store before it is made here, and
//! a follower thread applies the changes other replicas made, takes over
//! the registrations whose replica stopped renewing its claim, and renews
//! this replica's own claims.
//!
//! The state folder stays the replica's own: it caches what the store
//! holds (so a replica that starts while the store is down serves the
//! tasks it had), and keeps the checkpoints of the registrations this
//! replica fits. A state folder that held tasks before the server was
//! given a store is migrated at the first read of the store: its tasks
//! are written to the store unless the store holds them, once (a marker
//! file in the folder says so).

use std::sync::Arc;
use std::time::Duration;

use super::abstention::AbstentionTask;
use super::shared::{key_of, Change, Entry, EntryKind, Manifest, Shared, StoreError, Stored};
use super::{Example, TaskError, TaskRecord, TaskRegistry};

/// The marker of a state folder whose tasks were written to a store.
const MIGRATED: &str = "task-store-migrated.json";

impl From<StoreError> for TaskError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => TaskError::StoreUnavailable(m),
            StoreError::Refused { message, .. } => TaskError::StoreUnavailable(message),
            StoreError::Conflict { param, message } => TaskError::Taken { param, message },
        }
    }
}

impl TaskRegistry {
    /// What this replica applies of the shared store (`None`: it has
    /// none).
    pub fn store_report(&self) -> Option<super::shared::Report> {
        self.shared.as_ref().map(|s| s.report())
    }

    /// Whether this replica fits registration `id`: always without a
    /// store; with one, while it holds the registration's claim.
    pub(super) fn owns(&self, id: &str) -> bool {
        self.shared.as_ref().is_none_or(|s| s.holds(id))
    }

    /// A new registration's start on the store: its claim (taken before
    /// anyone can see it), its examples and its first version. Nothing is
    /// left claimed when it fails.
    pub(super) fn share_registration(
        &self,
        record: &TaskRecord,
        examples: &[Example],
    ) -> Result<(), TaskError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let written = (|| {
            let examples = shared.put_examples(examples)?;
            if !shared.claim(&record.id)? {
                return Err(StoreError::Unavailable(format!(
                    "task {}: another replica claimed it first",
                    record.id
                )));
            }
            let stored = Stored {
                format_version: super::FORMAT_VERSION,
                record: record.clone(),
                head: None,
            };
            shared.publish(&stored, Some(examples))
        })();
        self.count_write(&written);
        if written.is_err() {
            shared.release(&record.id);
        }
        written.map(|_| ()).map_err(TaskError::from)
    }

    /// Writes task `id`'s current version to the store (a registration
    /// finished, a certificate made again, an import); one the store
    /// cannot take now is written again by the follower.
    pub(super) fn share(&self, id: &str) -> Result<(), TaskError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let stored = {
            let tasks = self.lock();
            let Some(record) = tasks.get(id) else {
                return Ok(());
            };
            Stored {
                format_version: super::FORMAT_VERSION,
                record: record.clone(),
                head: self.heads_lock().get(id).map(|h| (**h).clone()),
            }
        };
        let finished = !stored.record.status.pending();
        let written = shared.publish(&stored, None);
        self.count_write(&written);
        match written {
            Ok(_) => {
                self.unpublished().remove(id);
                if finished {
                    shared.release(id);
                }
                Ok(())
            }
            Err(StoreError::Unavailable(m)) => {
                tracing::warn!("task {id}: not yet written to the task store ({m}); retrying");
                self.unpublished().insert(id.to_string());
                Err(TaskError::StoreUnavailable(m))
            }
            Err(e) => {
                tracing::warn!("task {id}: not written to the task store: {e:?}");
                Err(e.into())
            }
        }
    }

    /// Writes `record` (with its head, or the one held for it) to the
    /// store before it is made here (an import, a certificate made
    /// again): refused, and nothing changed, when the store cannot take
    /// it.
    pub(super) fn share_version(
        &self,
        record: &TaskRecord,
        head: Option<&crate::stats::head::Head>,
    ) -> Result<(), TaskError> {
        if self.shared.is_none() {
            return Ok(());
        }
        let head = head
            .cloned()
            .or_else(|| self.heads_lock().get(&record.id).map(|h| (**h).clone()));
        let stored = Stored {
            format_version: super::FORMAT_VERSION,
            record: record.clone(),
            head,
        };
        self.on_store(|s| s.publish(&stored, None))
    }

    /// Writes an abstention task to the store before it is kept here.
    pub(super) fn share_abstention(&self, task: &AbstentionTask) -> Result<(), TaskError> {
        self.on_store(|s| s.publish_abstention(task))
    }

    /// Writes abstention task `id`'s tombstone.
    pub(super) fn share_abstention_removal(&self, id: &str) -> Result<(), TaskError> {
        self.on_store(|s| s.remove_abstention(id))
    }

    /// Keeps abstention task `task` (another replica's) here, or removes
    /// `id` (`task` `None`), in memory and in the state folder.
    fn apply_abstention(&self, id: &str, task: Option<AbstentionTask>) {
        let mut tasks = self.abstention_lock();
        let mut next = tasks.clone();
        match task {
            Some(t) => {
                next.insert(id.to_string(), t);
            }
            None => {
                if next.remove(id).is_none() {
                    return;
                }
            }
        }
        if let Err(e) = self.store.save_abstention(next.values().cloned().collect()) {
            tracing::warn!("abstention task {id}: not cached in the state folder: {e}");
        }
        *tasks = next;
    }

    /// Writes the result of a registration fitted here, unless another
    /// replica took the registration over (it writes its own).
    pub(super) fn share_fitted(&self, id: &str) {
        if let Some(shared) = &self.shared {
            if !shared.confirm(id) {
                tracing::warn!(
                    "task {id}: fitted here after another replica took it over; not written"
                );
                return;
            }
            let _ = self.share(id);
        }
    }

    /// Writes task `id`'s tombstone: the task is removed on every replica.
    pub(super) fn share_removal(&self, id: &str) -> Result<(), TaskError> {
        self.on_store(|s| s.remove(id))
    }

    /// One write to the shared store, counted by outcome; nothing without
    /// a store.
    fn on_store<T>(
        &self,
        write: impl FnOnce(&Shared) -> Result<T, StoreError>,
    ) -> Result<(), TaskError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let written = write(shared);
        self.count_write(&written);
        written.map(|_| ()).map_err(TaskError::from)
    }

    fn count_write<T>(&self, written: &Result<T, StoreError>) {
        let outcome = match written {
            Ok(_) => "written",
            Err(StoreError::Conflict { .. }) => "conflict",
            Err(_) => "unavailable",
        };
        self.metrics
            .task_store
            .writes
            .with_label_values(&[outcome])
            .inc();
    }

    fn unpublished(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.unpublished.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts following the store: one read now (so a server starts with
    /// the fleet's tasks when the store answers), then the follower.
    pub(super) fn start_following(self: &Arc<Self>) -> Result<(), String> {
        let Some(shared) = self.shared.clone() else {
            return Ok(());
        };
        self.follow_once(&shared);
        let me = self.clone();
        let follower = shared.clone();
        std::thread::Builder::new()
            .name("task-store".into())
            .spawn(move || loop {
                // A little jittered, so that replicas do not read in step.
                let jitter = crate::rng::SplitMix::from_entropy().next_f64() * 0.2 - 0.1;
                let turn = follower.settings.poll.mul_f64(1.0 + jitter);
                std::thread::sleep(turn.max(Duration::from_millis(20)));
                me.follow_once(&follower);
            })
            .map_err(|e| format!("cannot start the task store's follower: {e}"))?;
        // Claims are renewed on a thread of their own, four times a lease,
        // whatever the follower is busy with.
        std::thread::Builder::new()
            .name("task-claims".into())
            .spawn(move || loop {
                std::thread::sleep(shared.settings.lease / 4);
                for id in shared.renew() {
                    tracing::warn!(
                        "task {id}: another replica took over its registration after this one's \
                         claim lapsed; stopping here"
                    );
                }
            })
            .map_err(|e| format!("cannot start the task store's claim renewal: {e}"))?;
        Ok(())
    }

    /// One turn of the follower: the manifest read, its changes applied,
    /// the writes that failed written again, lapsed claims taken over.
    fn follow_once(&self, shared: &Shared) {
        let m = &self.metrics;
        let polled = shared.poll();
        let result = match &polled {
            Ok(Some(_)) => "changed",
            Ok(None) => "unchanged",
            Err(e) => {
                tracing::debug!("task store: {e:?}");
                "failed"
            }
        };
        m.task_store.polls.with_label_values(&[result]).inc();
        let report = shared.report();
        m.task_store.ok.set(report.ok as i64);
        m.task_store
            .manifest_version
            .set(report.manifest_version as i64);
        m.task_store
            .last_sync_age
            .set(report.last_sync_age_seconds.unwrap_or(-1.0));
        if let Some(lag) = report.lag_seconds {
            m.task_store.lag.set(lag);
        }
        let Ok(polled) = polled else {
            return;
        };
        if let Some((manifest, changes)) = polled {
            self.apply(changes);
            self.migrate(&manifest);
        }
        // Claims lapse without a change to the manifest.
        for entry in shared.pending() {
            if !shared.holds(&entry.id) && self.lock().contains_key(&entry.id) {
                self.take_over(shared, &entry);
            }
        }
        let retry: Vec<String> = self.unpublished().iter().cloned().collect();
        for id in retry {
            let _ = self.share(&id);
        }
    }

    /// Applies a manifest's changes here.
    fn apply(&self, changes: Vec<Change>) {
        let m = &self.metrics;
        for change in changes {
            match change {
                Change::Apply { entry, stored } => {
                    self.apply_version(&entry, *stored);
                    m.task_store.changes.with_label_values(&["applied"]).inc();
                }
                Change::Remove { id } => {
                    self.remove_here(&id);
                    m.task_store.changes.with_label_values(&["removed"]).inc();
                }
                Change::ApplyAbstention { entry, task } => {
                    tracing::info!(
                        "abstention task `{}`: version {} applied from the task store",
                        entry.id,
                        entry.version
                    );
                    self.apply_abstention(&entry.id, Some(*task));
                    m.task_store.changes.with_label_values(&["applied"]).inc();
                }
                Change::RemoveAbstention { id } => {
                    self.apply_abstention(&id, None);
                    m.task_store.changes.with_label_values(&["removed"]).inc();
                }
                Change::Refused {
                    id,
                    reason,
                    message,
                } => {
                    tracing::warn!("task store: task {id} refused ({reason}): {message}");
                    m.task_store.changes.with_label_values(&["refused"]).inc();
                }
            }
        }
    }

    /// Applies a version another replica wrote: the record and head, kept
    /// in the state folder too.
    fn apply_version(&self, entry: &Entry, stored: Stored) {
        let Stored { record, head, .. } = stored;
        let id = record.id.clone();
        if let Some(h) = &head {
            if let Err(e) = self.store.save_head(&id, h) {
                tracing::warn!("task {id}: its head is not cached in the state folder: {e}");
            }
            self.heads_lock().insert(id.clone(), Arc::new(h.clone()));
        }
        if let Err(e) = self.store.save(&record) {
            tracing::warn!("task {id}: not cached in the state folder: {e}");
        }
        tracing::info!(
            "task `{}` ({id}): version {} applied from the task store ({})",
            record.spec.name,
            entry.version,
            record.status.as_str()
        );
        let mut tasks = self.lock();
        // A change of this replica's own since the read is newer.
        if self
            .shared
            .as_ref()
            .is_some_and(|s| s.applied(&id) > entry.version)
        {
            return;
        }
        // Fitted on another serving stack (a task answers alike on MLX
        // and vLLM, so the backend apart): kept, not applied.
        let changed: Vec<&'static str> = record
            .stack
            .as_ref()
            .map(|s| s.differences(&self.stack()))
            .unwrap_or_default()
            .into_iter()
            .filter(|d| *d != "backend")
            .collect();
        if changed.is_empty() {
            self.foreign_lock().remove(&id);
        } else {
            tracing::info!(
                "task `{}` ({id}): fitted on another serving stack ({}); kept, not applied",
                record.spec.name,
                changed.join(", ")
            );
            self.foreign_lock().insert(id.clone(), changed);
        }
        let finished = !record.status.pending();
        tasks.insert(id.clone(), record);
        self.update_gauges(&tasks);
        drop(tasks);
        // A registration another replica finished is not this one's; its
        // claim is given up outside the tasks lock (a release may wait for
        // a renewal's request to the store).
        if let Some(shared) = self.shared.as_ref().filter(|_| finished) {
            shared.release(&id);
        }
    }

    /// The tasks of another serving stack, by id ([`TaskRegistry`]'s
    /// `foreign`).
    pub(super) fn foreign_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Vec<&'static str>>> {
        self.foreign.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Removes a task another replica removed.
    fn remove_here(&self, id: &str) {
        if let Some(shared) = &self.shared {
            shared.release(id);
        }
        let mut tasks = self.lock();
        let Some(record) = tasks.remove(id) else {
            return;
        };
        let _ = self.store.remove(id);
        self.heads_lock().remove(id);
        self.foreign_lock().remove(id);
        self.forget_monitor(&record);
        tracing::info!(
            "task `{}` ({id}): removed, as the task store says",
            record.spec.name
        );
        self.update_gauges(&tasks);
    }

    /// Claims a registration whose replica let its claim lapse, and fits
    /// it here from its examples in the store.
    fn take_over(&self, shared: &Shared, entry: &Entry) {
        let claimed = match shared.claim(&entry.id) {
            Ok(c) => c,
            Err(_) => return,
        };
        // The registration may have been finished just before its claim
        // was given up.
        if !claimed || !shared.is_pending(&entry.id).unwrap_or(false) {
            if claimed {
                shared.release(&entry.id);
            }
            return;
        }
        let examples = entry
            .examples
            .as_deref()
            .ok_or_else(|| StoreError::Unavailable("no examples".into()))
            .and_then(|d| shared.get_examples(d));
        let examples = match examples {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(
                    "task {}: cannot take its registration over: {e:?}",
                    entry.id
                );
                shared.release(&entry.id);
                return;
            }
        };
        if let Err(e) = self.store.save_examples(&entry.id, &examples) {
            tracing::warn!("task {}: cannot take its registration over: {e}", entry.id);
            shared.release(&entry.id);
            return;
        }
        self.metrics.task_store.takeovers.inc();
        let mut tasks = self.lock();
        if let Some(r) = tasks.get_mut(&entry.id) {
            r.requeue("its replica's claim lapsed; fitting it here");
        }
        drop(tasks);
        self.wake.notify_all();
    }

    /// Writes the state folder's tasks the store does not hold, at the
    /// first read of a store (the marker says it was done): ready and
    /// failed tasks as they are, registrations to be fitted by whoever
    /// claims them. With the marker, a task of the folder the store does
    /// not hold was removed elsewhere, and is removed here.
    fn migrate(&self, manifest: &Manifest) {
        if self
            .migrated
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let marker = self.store.dir().join(MIGRATED);
        let first = !marker.exists();
        let local: Vec<TaskRecord> = self
            .list()
            .into_iter()
            .filter(|r| !manifest.entries.contains_key(&super::shared::key(&r.id)))
            .collect();
        for record in local {
            if !first {
                self.remove_here(&record.id);
                continue;
            }
            let written = match self.store.load_examples(&record.id) {
                Ok(examples) if record.status.pending() => {
                    self.share_registration(&record, &examples)
                }
                _ => self.share(&record.id),
            };
            match written {
                Ok(()) => tracing::info!(
                    "task `{}` ({}): moved from the state folder to the task store",
                    record.spec.name,
                    record.id
                ),
                Err(e) => {
                    tracing::warn!(
                        "task `{}` ({}): not moved to the task store: {e}",
                        record.spec.name,
                        record.id
                    );
                    // Tried again at the next start.
                    return;
                }
            }
        }
        let local: Vec<AbstentionTask> = self
            .abstention_tasks()
            .into_iter()
            .filter(|t| {
                !manifest
                    .entries
                    .contains_key(&key_of(EntryKind::Abstention, &t.id))
            })
            .collect();
        for t in local {
            if !first {
                self.apply_abstention(&t.id, None);
            } else if let Err(e) = self.share_abstention(&t) {
                tracing::warn!(
                    "abstention task `{}`: not moved to the task store: {e}",
                    t.id
                );
                return;
            }
        }
        let note = serde_json::json!({"store": self.shared.as_ref().map(|s| s.label.clone())});
        if let Err(e) = super::store::write_atomic(&marker, note.to_string().as_bytes()) {
            tracing::warn!("cannot write {}: {e}", marker.display());
        }
    }
}
