//! The start-up wait: each upstream (and the head upstream) is probed until
//! it passes, with a back-off that doubles from `wait_first_backoff_s` to
//! `wait_max_backoff_s`, and admitted the moment it passes. Until the first
//! completions upstream (and the head upstream, when there is one) passed,
//! the backend reports [`EngineStatus::Waiting`] with what it waits for;
//! past `--upstream-wait` seconds it reports the failure that stops the
//! process.
//!
//! Generic over what a probe learns, as [`Pool`] is: the caller gives the
//! probe and how to describe its outcome in the log.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::pool::{Pool, Upstream, UpstreamError};
use crate::engine::{Waiting, WaitingFor};

/// The role of the completions upstreams in the log and in [`Waiting`].
pub const UPSTREAM: &str = "upstream";
/// The role of the head upstream.
pub const HEAD: &str = "head upstream";

/// What the wait has seen of each server.
pub struct WaitState {
    started: Instant,
    since: u64,
    limit_s: Option<f64>,
    servers: Mutex<Vec<WaitingFor>>,
    /// Why the process gives up, once `limit_s` passed with the backend
    /// not ready.
    gave_up: OnceLock<String>,
}

impl WaitState {
    /// The servers in order: the completions upstreams, then the head
    /// upstream.
    pub fn new(upstreams: &[String], head: Option<&String>, limit_s: Option<f64>) -> Self {
        let servers = upstreams
            .iter()
            .map(|u| (u, UPSTREAM))
            .chain(head.map(|h| (h, HEAD)))
            .map(|(url, role)| WaitingFor {
                url: url.trim_end_matches('/').to_string(),
                role,
                admitted: false,
                probes: 0,
                last_error: None,
            })
            .collect();
        WaitState {
            started: Instant::now(),
            since: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            limit_s,
            servers: Mutex::new(servers),
            gave_up: OnceLock::new(),
        }
    }

    pub fn waited_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn servers(&self) -> Vec<WaitingFor> {
        self.servers.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// `upstream` or `head upstream`.
    fn role(&self, slot: usize) -> &'static str {
        self.servers
            .lock()
            .ok()
            .and_then(|s| s.get(slot).map(|s| s.role))
            .unwrap_or(UPSTREAM)
    }

    /// Counts a probe of server `slot` and keeps its outcome; returns the
    /// probes tried so far.
    fn record(&self, slot: usize, error: Option<String>) -> u32 {
        let Ok(mut servers) = self.servers.lock() else {
            return 0;
        };
        let Some(s) = servers.get_mut(slot) else {
            return 0;
        };
        s.probes += 1;
        s.admitted = error.is_none();
        if error.is_some() {
            s.last_error = error;
        }
        s.probes
    }

    /// Why the process gives up, once it did.
    pub fn gave_up(&self) -> Option<String> {
        self.gave_up.get().cloned()
    }

    /// What is waited for, for `GET /health` and the 503s.
    pub fn report(&self) -> Waiting {
        let servers = self.servers();
        let waited_s = self.waited_s();
        let pending: Vec<String> = servers
            .iter()
            .filter(|s| !s.admitted)
            .map(|s| {
                format!(
                    "{} {} ({} probe{}{})",
                    s.role,
                    s.url,
                    s.probes,
                    if s.probes == 1 { "" } else { "s" },
                    s.last_error
                        .as_ref()
                        .map_or(String::new(), |e| format!(", last: {e}"))
                )
            })
            .collect();
        Waiting {
            message: format!(
                "the gateway has waited {waited_s:.1} s for its upstream servers to pass their \
                 start-up probe; waiting for {}; retry once GET /health answers 200",
                pending.join("; ")
            ),
            since: self.since,
            waited_s,
            limit_s: self.limit_s,
            upstreams: servers,
        }
    }

    /// The failure that stops the process: the old start-up messages, with
    /// the time waited.
    fn give_up(&self, ready: bool) {
        if ready {
            return;
        }
        let servers = self.servers();
        let errors = |role: &str| -> Vec<String> {
            servers
                .iter()
                .filter(|s| s.role == role && !s.admitted)
                .map(|s| {
                    s.last_error
                        .clone()
                        .unwrap_or_else(|| format!("upstream {} was not probed", s.url))
                })
                .collect()
        };
        let within = self.limit_s.map_or(String::new(), |l| {
            format!(" within {l} s (--upstream-wait)")
        });
        let message = if servers.iter().any(|s| s.role == UPSTREAM && s.admitted) {
            format!(
                "the head upstream failed its probe{within}: {}",
                errors(HEAD).join("; ")
            )
        } else {
            format!(
                "no upstream answered the start-up probe{within}: {}",
                errors(UPSTREAM).join("; ")
            )
        };
        tracing::error!("{message}");
        let _ = self.gave_up.set(message);
    }
}

/// One probe of one server: on success what it learned is kept, it is
/// admitted to routing and the log says so (`describe` says what it
/// serves); on failure the error is kept for [`WaitState::report`].
pub async fn attempt<P, Fut>(
    wait: &WaitState,
    pool: &Pool<P>,
    u: &Upstream<P>,
    slot: usize,
    probe: Fut,
    describe: fn(&P) -> String,
) -> Result<(), UpstreamError>
where
    P: Clone,
    Fut: Future<Output = Result<P, UpstreamError>>,
{
    let role = wait.role(slot);
    match probe.await {
        Ok(p) => {
            tracing::info!("{role} {}: {}", u.url, describe(&p));
            u.set_probed(p);
            pool.admit(u);
            let n = wait.record(slot, None);
            tracing::info!(
                "{role} {} admitted after {:.1} s ({n} probe{})",
                u.url,
                wait.waited_s(),
                if n == 1 { "" } else { "s" }
            );
            Ok(())
        }
        Err(e) => {
            wait.record(slot, Some(e.to_string()));
            Err(e)
        }
    }
}

/// Probes a server until it passes (nothing when it already did), waiting
/// `first` after the first failure, then twice as long each time up to
/// `most`.
pub async fn keep_probing<P, F, Fut>(
    wait: &WaitState,
    pool: &Pool<P>,
    u: &Arc<Upstream<P>>,
    slot: usize,
    probe: F,
    describe: fn(&P) -> String,
    (first, most): (Duration, Duration),
) where
    P: Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<P, UpstreamError>>,
{
    let mut delay = first;
    while u.probed().is_none() {
        let Err(e) = attempt(wait, pool, u, slot, probe(), describe).await else {
            return;
        };
        let role = wait.role(slot);
        tracing::warn!(
            "{role} {} has not passed its start-up probe ({:.1} s waited): {e}; probed again in \
             {:.1} s",
            u.url,
            wait.waited_s(),
            delay.as_secs_f64()
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(most);
    }
}

/// After `limit` seconds, gives up unless `ready` says the backend is.
pub async fn give_up_after(wait: &WaitState, limit: f64, ready: impl Fn() -> bool) {
    tokio::time::sleep(Duration::from_secs_f64(limit.max(0.0))).await;
    wait.give_up(ready());
}
