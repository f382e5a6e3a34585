//! The abstention registration worker: one registration at a time, oldest
//! first, each example answered as `/v1/systemone` serves it but
//! unobserved ([`TaskRegistry::systemone_unobserved`]: no serving metric,
//! prefix-cache entry or certified task's traffic monitor sees it), its
//! scoring appended to the state folder ([`super::abstention_job`]), then
//! the fit. Decisions queued meanwhile wait for at most one example.
//!
//! The examples are kept as the client sent them; the HTTP layer, which
//! owns System One's request rules, hands the worker the function that
//! reads one ([`ReadRequest`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::abstention_job::{AbstentionJob, JobExample};
use super::TaskRegistry;
use crate::stats::abstain::{self, Scored};
use crate::text_route::systemone::WireRequest;

/// Reads a stored example's `request` into a System One request, or says
/// why it is not one.
pub type ReadRequest = fn(Value) -> Result<WireRequest, String>;

/// How long the worker sleeps when there is nothing to do (a registration
/// wakes it sooner).
const IDLE: Duration = Duration::from_secs(1);

/// How long it waits before retrying an engine that is busy or loading.
const BUSY: Duration = Duration::from_millis(200);

/// How long it waits after the state folder failed to list registrations.
const UNREADABLE: Duration = Duration::from_secs(5);

/// How often a running registration syncs its scorings to disk.
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// A failure: its message, and whether it is the server's fault (a 500
/// rather than a 400 when the registration's status is asked).
type Failure = (String, bool);

impl TaskRegistry {
    /// The worker; runs for the server's life.
    pub async fn work_abstention(self: Arc<Self>, read: ReadRequest) {
        loop {
            match self.next_abstention_job() {
                Ok(Some((job, scored))) => self.register_abstention(read, job, scored).await,
                Ok(None) => {
                    let woken = self.abstention_wake.notified();
                    let _ = tokio::time::timeout(IDLE, woken).await;
                }
                Err(e) => {
                    tracing::error!("abstention registrations cannot be read: {e}");
                    tokio::time::sleep(UNREADABLE).await;
                }
            }
        }
    }

    /// Scores a registration's examples from where it stands, then fits it.
    async fn register_abstention(
        self: &Arc<Self>,
        read: ReadRequest,
        job: AbstentionJob,
        mut scored: Vec<Scored>,
    ) {
        let outcome = match self.score_all(read, &job, &mut scored).await {
            Ok(false) => return,
            Ok(true) => {
                let (tasks, id) = (self.clone(), job.id.clone());
                tokio::task::spawn_blocking(move || tasks.finish_abstention_job(&id, &scored))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map(|_| ()).map_err(|e| e.to_string()))
                    .map_err(|e| (e, true))
            }
            Err(e) => Err(e),
        };
        if let Err((message, server_fault)) = outcome {
            let _ = self.fail_abstention_job(&job.id, message, server_fault);
        }
    }

    /// Scores every example not scored yet; `false` when the registration
    /// was deleted meanwhile. An engine that is busy or loading is waited
    /// for.
    async fn score_all(
        &self,
        read: ReadRequest,
        job: &AbstentionJob,
        scored: &mut Vec<Scored>,
    ) -> Result<bool, Failure> {
        let server = |e: String| (e, true);
        let examples = self.abstention_examples(&job.id).map_err(server)?;
        let mut synced = Instant::now();
        for (i, example) in examples.enumerate().skip(scored.len()) {
            let example = example.map_err(server)?;
            let s = loop {
                match self.score_one(read, &job.option.key, &example).await {
                    Ok(s) => break s,
                    Err(Fault::Passing) => {
                        if self.abstention_job(&job.id).is_none() {
                            return Ok(false);
                        }
                        tokio::time::sleep(BUSY).await;
                    }
                    Err(Fault::Failed(e, fault)) => {
                        return Err((format!("examples[{i}].request: {e}"), fault));
                    }
                }
            };
            let sync = synced.elapsed() >= SYNC_EVERY || i + 1 == job.total;
            if sync {
                synced = Instant::now();
            }
            if !self.record_scored(&job.id, &s, sync).map_err(server)? {
                return Ok(false);
            }
            scored.push(s);
        }
        Ok(true)
    }

    /// One example answered as served, and scored against its gold key.
    async fn score_one(
        &self,
        read: ReadRequest,
        key: &str,
        example: &JobExample,
    ) -> Result<Scored, Fault> {
        let request = read(example.request.clone()).map_err(|e| Fault::Failed(e, false))?;
        let (asked, answers) =
            self.systemone_unobserved(&request)
                .await
                .map_err(|e| match e.passes() {
                    true => Fault::Passing,
                    false => Fault::Failed(e.to_string(), e.servers_fault()),
                })?;
        let (keys, p) = (&asked[0].keys, &answers[0].exact);
        let at = keys.iter().position(|k| k == key).unwrap_or(0);
        let gold = example
            .gold
            .as_ref()
            .and_then(|g| keys.iter().position(|k| k == g));
        let (plain_abstains, best) = abstain::decide(p, at, None);
        Ok(Scored::new(
            p[at],
            gold.is_none(),
            gold == Some(best),
            plain_abstains,
        ))
    }
}

/// Why an example was not scored.
enum Fault {
    /// The engine is busy or loading: try again.
    Passing,
    /// The message, and whether it is the server's fault.
    Failed(String, bool),
}
