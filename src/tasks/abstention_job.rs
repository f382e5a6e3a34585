//! Abstention registrations in progress: an abstention task's examples are
//! answered one at a time by a worker (`src/http/systemone/abstention.rs`,
//! since it answers them as `/v1/systemone` serves), not in the handler
//! that took them. Each registration is kept in the state folder, under
//! `tasks/abstention/`, as three files:
//!
//! - `<id>.job.json`: what the task will be (its option, its match), the
//!   serving stack it is fitted under, its status and its error;
//! - `<id>.examples.jsonl`: its examples, one line each (the request and
//!   its gold key), written once and read one line at a time;
//! - `<id>.scored.jsonl`: each example's scoring, a line appended as it is
//!   answered and synced at least once a second.
//!
//! A server killed midway resumes from the scored lines (a torn last line
//! is dropped), so a registration of 100,000 examples never starts over,
//! and the worker holds one example at a time whatever their number.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::abstention::{AbstainOption, AbstentionTask, Match};
use super::store::{read_json, write_atomic, Store};
use super::{TaskError, TaskRegistry, FORMAT_VERSION};
use crate::stats::abstain::{self, Scored};

/// Where a registration stands; a fitted one is a task, no longer a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Failed,
}

impl JobStatus {
    pub fn pending(self) -> bool {
        self != JobStatus::Failed
    }
}

/// One abstention registration, as the state folder keeps it and
/// `GET /v1/abstention/tasks/{id}` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AbstentionJob {
    pub format_version: u32,
    pub id: String,
    pub option: AbstainOption,
    #[serde(rename = "match")]
    pub matches: Match,
    /// The served model's identity and the prompt layout's digest it is
    /// fitted under.
    pub model: String,
    pub layout: String,
    pub status: JobStatus,
    pub error: Option<String>,
    /// Whether it failed by a fault of the server (its state folder), not
    /// of an example.
    #[serde(default)]
    pub server_fault: bool,
    /// Its examples.
    pub total: usize,
    /// Examples scored so far (the scored file's lines).
    #[serde(default)]
    pub done: usize,
    /// Examples already scored when this run of it began.
    #[serde(default)]
    pub resumed_from: usize,
    /// Times a stop cut it short.
    #[serde(default)]
    pub restarts: usize,
    pub created: u64,
}

/// One example as a registration keeps it: its `/v1/systemone` request
/// and its gold key (`None`: it cannot be answered).
#[derive(Debug, Serialize, Deserialize)]
pub struct JobExample {
    pub request: Value,
    pub gold: Option<String>,
}

/// A registration's files.
struct Files {
    job: PathBuf,
    examples: PathBuf,
    scored: PathBuf,
}

fn files(store: &Store, id: &str) -> Files {
    let dir = store.abstention_jobs_dir();
    Files {
        job: dir.join(format!("{id}.job.json")),
        examples: dir.join(format!("{id}.examples.jsonl")),
        scored: dir.join(format!("{id}.scored.jsonl")),
    }
}

fn io(path: &std::path::Path, e: std::io::Error) -> String {
    format!("cannot write {}: {e}", path.display())
}

fn save(store: &Store, job: &AbstentionJob) -> Result<(), String> {
    let path = files(store, &job.id).job;
    let bytes = serde_json::to_vec_pretty(job).map_err(|e| e.to_string())?;
    write_atomic(&path, &bytes).map_err(|e| io(&path, e))
}

/// The scorings in a registration's scored file, in example order; a
/// torn last line (a kill while it was written) is cut off the file.
fn load_scored(store: &Store, id: &str) -> Result<Vec<Scored>, String> {
    let path = files(store, id).scored;
    let Ok(text) = fs::read(&path) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut whole = 0;
    for line in text.split_inclusive(|&b| b == b'\n') {
        match serde_json::from_slice::<Scored>(line) {
            Ok(s) if line.ends_with(b"\n") => {
                out.push(s);
                whole += line.len();
            }
            _ => break,
        }
    }
    if whole < text.len() {
        let f = File::options()
            .write(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.set_len(whole as u64).map_err(|e| io(&path, e))?;
        f.sync_all().map_err(|e| io(&path, e))?;
    }
    Ok(out)
}

/// The registrations a stop left in the state folder: a running one is
/// queued again, counted as restarted, its progress read from its scored
/// file; one of another model fails.
pub(super) fn load(
    store: &Store,
    model: &str,
    waiting: bool,
) -> Result<BTreeMap<String, AbstentionJob>, String> {
    let dir = store.abstention_jobs_dir();
    fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot create the state folder {}: {e}", dir.display()))?;
    let mut out = BTreeMap::new();
    let mut names: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort();
    for path in names {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = fs::remove_file(&path);
            continue;
        }
        if !name.ends_with(".job.json") {
            continue;
        }
        let mut job: AbstentionJob = read_json(&path)?;
        if job.format_version != FORMAT_VERSION {
            return Err(format!(
                "{} is in task format {}; this decisio reads format {FORMAT_VERSION} only",
                path.display(),
                job.format_version
            ));
        }
        if job.status.pending() {
            if job.model != model && !waiting {
                job.status = JobStatus::Failed;
                job.error = Some(
                    "the server restarted on another model before this registration finished; \
                     register it again"
                        .into(),
                );
            } else {
                if job.status == JobStatus::Running {
                    job.restarts += 1;
                }
                job.status = JobStatus::Queued;
                job.done = load_scored(store, &job.id)?.len();
                tracing::info!(
                    "abstention task `{}`: resuming its registration, {} of {} examples scored",
                    job.id,
                    job.done,
                    job.total
                );
            }
            save(store, &job)?;
        }
        out.insert(job.id.clone(), job);
    }
    Ok(out)
}

impl TaskRegistry {
    fn jobs_lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AbstentionJob>> {
        self.abstention_jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a registration: its examples and its record written, then
    /// the worker told. Refused while one of the same id is pending, and
    /// when the tasks and registrations held reach the limit.
    pub fn submit_abstention(
        &self,
        mut job: AbstentionJob,
        examples: &[JobExample],
    ) -> Result<(), TaskError> {
        // Serialized before the lock: only the checks, the file's atomic
        // write and the insertion hold it.
        let mut lines = Vec::new();
        for e in examples {
            serde_json::to_writer(&mut lines, e).map_err(|e| TaskError::Store(e.to_string()))?;
            lines.push(b'\n');
        }
        let mut jobs = self.jobs_lock();
        if jobs.get(&job.id).is_some_and(|j| j.status.pending()) {
            return Err(TaskError::Taken {
                param: "id".into(),
                message: format!(
                    "abstention task `{}` is being registered; GET /v1/abstention/tasks/{} says \
                     how far, or DELETE it first",
                    job.id, job.id
                ),
            });
        }
        let held =
            self.abstention_tasks().len() + jobs.values().filter(|j| j.status.pending()).count();
        if held >= self.limits.max_tasks {
            return Err(TaskError::Full {
                param: "id".into(),
                message: format!(
                    "this server holds at most {} abstention tasks and registrations; delete one \
                     with DELETE /v1/abstention/tasks/{{id}} first",
                    self.limits.max_tasks
                ),
            });
        }
        let f = files(&self.store, &job.id);
        let _ = fs::remove_file(&f.scored);
        write_atomic(&f.examples, &lines).map_err(|e| TaskError::Store(io(&f.examples, e)))?;
        job.status = JobStatus::Queued;
        job.total = examples.len();
        job.done = 0;
        save(&self.store, &job).map_err(TaskError::Store)?;
        jobs.insert(job.id.clone(), job);
        drop(jobs);
        self.abstention_wake.notify_one();
        Ok(())
    }

    /// A registration queued, running or failed.
    pub fn abstention_job(&self, id: &str) -> Option<AbstentionJob> {
        self.jobs_lock().get(id).cloned()
    }

    /// The oldest queued registration, marked running, with the scorings
    /// a stop left of it.
    pub fn next_abstention_job(&self) -> Result<Option<(AbstentionJob, Vec<Scored>)>, String> {
        let mut jobs = self.jobs_lock();
        let Some(job) = jobs
            .values_mut()
            .filter(|j| j.status == JobStatus::Queued)
            .min_by_key(|j| j.created)
        else {
            return Ok(None);
        };
        let scored = load_scored(&self.store, &job.id)?;
        job.status = JobStatus::Running;
        job.done = scored.len();
        job.resumed_from = scored.len();
        save(&self.store, job)?;
        Ok(Some((job.clone(), scored)))
    }

    /// A registration's examples, read one line at a time.
    pub fn abstention_examples(
        &self,
        id: &str,
    ) -> Result<impl Iterator<Item = Result<JobExample, String>>, String> {
        let path = files(&self.store, id).examples;
        let f = File::open(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(BufReader::new(f).lines().map(move |line| {
            let line = line.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            serde_json::from_str(&line).map_err(|e| format!("{} is torn: {e}", path.display()))
        }))
    }

    /// Appends an example's scoring (synced when `sync`); `false` when the
    /// registration is gone (deleted meanwhile).
    pub fn record_scored(&self, id: &str, scored: &Scored, sync: bool) -> Result<bool, String> {
        let mut jobs = self.jobs_lock();
        let Some(job) = jobs.get_mut(id).filter(|j| j.status == JobStatus::Running) else {
            return Ok(false);
        };
        let path = files(&self.store, id).scored;
        let mut f = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        let mut line = serde_json::to_vec(scored).map_err(|e| e.to_string())?;
        line.push(b'\n');
        f.write_all(&line).map_err(|e| io(&path, e))?;
        if sync {
            f.sync_data().map_err(|e| io(&path, e))?;
        }
        job.done += 1;
        Ok(true)
    }

    /// Fits a registration whose examples are all scored, stores its task
    /// and removes its files; `None` when it was deleted meanwhile.
    pub fn finish_abstention_job(
        &self,
        id: &str,
        scored: &[Scored],
    ) -> Result<Option<AbstentionTask>, TaskError> {
        let Some(job) = self
            .abstention_job(id)
            .filter(|j| j.status == JobStatus::Running)
        else {
            return Ok(None);
        };
        let task = AbstentionTask {
            id: job.id.clone(),
            option: job.option.clone(),
            matches: job.matches.clone(),
            config: abstain::fit(scored),
            model: job.model.clone(),
            layout: job.layout.clone(),
        };
        self.add_abstention(task.clone())?;
        self.drop_abstention_job(id);
        Ok(Some(task))
    }

    /// Marks a registration failed with `message` (kept, with its error,
    /// until it is registered again or deleted).
    pub fn fail_abstention_job(
        &self,
        id: &str,
        message: String,
        server_fault: bool,
    ) -> Result<(), String> {
        let mut jobs = self.jobs_lock();
        let Some(job) = jobs.get_mut(id).filter(|j| j.status.pending()) else {
            return Ok(());
        };
        tracing::warn!("abstention task `{id}`: registration failed: {message}");
        job.status = JobStatus::Failed;
        job.error = Some(message);
        job.server_fault = server_fault;
        let _ = fs::remove_file(files(&self.store, id).scored);
        save(&self.store, job)
    }

    /// Removes a registration and its files; `false` when there is none.
    pub fn drop_abstention_job(&self, id: &str) -> bool {
        let gone = self.jobs_lock().remove(id).is_some();
        let f = files(&self.store, id);
        for path in [f.job, f.examples, f.scored] {
            let _ = fs::remove_file(path);
        }
        gone
    }
}
