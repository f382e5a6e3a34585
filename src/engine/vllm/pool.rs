//! The upstream servers: routing by rendezvous hashing, health checks with
//! ejection and re-admission, bounded retries with backoff, and per-upstream
//! metrics.
//!
//! Each request has a key (the state hash for decisions, a digest of the
//! prompt for generations). Every admitted upstream gets a weight from the
//! key and its URL; the request goes to the heaviest, so every question on
//! one state reaches the replica that holds its prefix, and only the states
//! of a replica that leaves move. A failure that is the replica's (no
//! connection, no answer in time while it answered nothing else,
//! 502/503/504, vLLM's dead-engine 500) is counted against it and the call is repeated on the next upstream in
//! weight order, at most `retries` times, after a backoff that doubles; a
//! failure that is the request's own ([`Fault::Request`]) is answered to
//! its client and counted against no one. A replica is ejected after
//! `eject_after` failures of distinct requests (or health checks) with no
//! success between, so one client repeating one bad request ejects nothing.
//!
//! A routed call first waits its request's turn for its weight in tokens
//! (`fair.rs`): the pool's upstreams hold a bounded amount of work,
//! shared between requests.
//!
//! The pool knows nothing of what it routes: each upstream carries what its
//! probe learned (`P`), which the caller turns into request bodies.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::fair::Gate;
use super::protocol::{error_message, ENGINE_DEAD_MESSAGE};
use crate::engine::EngineError;
use crate::metrics::Metrics;
use crate::settings::UpstreamLimits;

/// How a call to an upstream failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("cannot connect to upstream {url}: {message}")]
    Connect { url: String, message: String },
    #[error("upstream {url} did not answer within {seconds} s")]
    Timeout { url: String, seconds: f64 },
    #[error("upstream {url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("upstream {url} answered with an unexpected body: {message}")]
    Invalid { url: String, message: String },
    #[error("no upstream is available: {0}")]
    NoneAvailable(String),
}

/// Whose fault a failed call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The replica's: it cannot take calls now (no connection, no answer in
    /// time, 502/503/504, or vLLM's dead-engine 500). Counted against it
    /// and retried on the next replica.
    Replica,
    /// Busy (429): retried on the next replica, not counted.
    Busy,
    /// The request's own: a 4xx, an unexpected body, a timeout on a
    /// replica that answered other calls meanwhile (`Pool::fault_of`),
    /// or a 500 that is not
    /// a dead engine (vLLM answers 500 for an exception raised while it
    /// processed that one request; a replica that is broken for every
    /// request fails its `/health`, which answers 503 on a dead engine).
    /// Neither counted nor retried: it would fail alike everywhere.
    Request,
}

impl UpstreamError {
    /// Whose fault it is (`docs/design/vllm.md`, "Faults").
    pub fn fault(&self) -> Fault {
        match self {
            UpstreamError::Connect { .. } | UpstreamError::Timeout { .. } => Fault::Replica,
            UpstreamError::Status {
                status, message, ..
            } => match status {
                429 => Fault::Busy,
                502..=504 => Fault::Replica,
                500 if message.contains(ENGINE_DEAD_MESSAGE) => Fault::Replica,
                _ => Fault::Request,
            },
            UpstreamError::Invalid { .. } | UpstreamError::NoneAvailable(_) => Fault::Request,
        }
    }

    /// Whether the same call may go to another upstream.
    pub fn retryable(&self) -> bool {
        self.fault() != Fault::Request
    }

    /// The `outcome` label of the upstream request metric.
    fn outcome(&self) -> &'static str {
        match self {
            UpstreamError::Connect { .. } => "connect",
            UpstreamError::Timeout { .. } => "timeout",
            UpstreamError::Status { status, .. } if *status >= 500 => "http_5xx",
            UpstreamError::Status { .. } => "http_4xx",
            UpstreamError::Invalid { .. } | UpstreamError::NoneAvailable(_) => "invalid",
        }
    }
}

/// One call to an upstream as its metrics see it: in flight from its
/// start; timed and counted by outcome at its end. A call dropped before
/// its answer (its client left, and the job with it) ends `cancelled`.
struct Counted<'a> {
    metrics: &'a Metrics,
    url: &'a str,
    started: Instant,
    outcome: &'static str,
}

impl<'a> Counted<'a> {
    fn start(metrics: &'a Metrics, url: &'a str) -> Self {
        metrics.upstream_in_flight.with_label_values(&[url]).inc();
        Counted {
            metrics,
            url,
            started: Instant::now(),
            outcome: "cancelled",
        }
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let m = self.metrics;
        m.upstream_in_flight.with_label_values(&[self.url]).dec();
        m.upstream_seconds
            .with_label_values(&[self.url])
            .observe(self.started.elapsed().as_secs_f64());
        m.upstream_requests
            .with_label_values(&[self.url, self.outcome])
            .inc();
    }
}

impl From<UpstreamError> for EngineError {
    fn from(e: UpstreamError) -> Self {
        match &e {
            UpstreamError::Connect { .. } | UpstreamError::NoneAvailable(_) => {
                EngineError::UpstreamUnavailable(e.to_string())
            }
            UpstreamError::Status { status: 503, .. }
            | UpstreamError::Status { status: 429, .. } => {
                EngineError::UpstreamUnavailable(e.to_string())
            }
            UpstreamError::Timeout { .. } => EngineError::UpstreamTimeout(e.to_string()),
            UpstreamError::Status {
                status: 400..=499, ..
            } => EngineError::UpstreamRefused(e.to_string()),
            UpstreamError::Status { .. } | UpstreamError::Invalid { .. } => {
                EngineError::Upstream(e.to_string())
            }
        }
    }
}

/// The replica's failures since its last success: each distinct request
/// counts once (one client repeating one request is one failure), and each
/// failed health check counts.
#[derive(Default)]
struct Failures {
    /// Digests of the failed requests' routing keys, and one entry per
    /// failed check.
    seen: Vec<u64>,
}

/// One upstream server and what routing knows of it. `P` is what its probe
/// learned (the model it serves and how to ask it), opaque to routing.
pub struct Upstream<P> {
    pub url: String,
    probed: Mutex<Option<P>>,
    ejected: AtomicBool,
    failures: Mutex<Failures>,
    successes: AtomicU32,
    /// When it last answered a call (any HTTP answer, health checks
    /// included), in milliseconds of the pool's clock.
    answered_at: AtomicU64,
}

impl<P: Clone> Upstream<P> {
    pub fn probed(&self) -> Option<P> {
        self.probed.lock().ok().and_then(|p| p.clone())
    }

    pub fn set_probed(&self, p: P) {
        if let Ok(mut g) = self.probed.lock() {
            *g = Some(p);
        }
    }

    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }
}

/// The upstreams and the HTTP client that calls them.
pub struct Pool<P> {
    pub upstreams: Vec<Arc<Upstream<P>>>,
    client: reqwest::Client,
    api_key: Option<String>,
    pub limits: UpstreamLimits,
    metrics: Arc<Metrics>,
    /// Numbers failed health checks, so each counts as a distinct failure.
    checks: AtomicU64,
    /// The clock of [`Upstream::answered_at`].
    epoch: Instant,
    /// Fair shares of the upstreams' tokens in flight between jobs.
    gate: Arc<Gate>,
}

/// The rendezvous weight of an upstream for a key.
fn weight(key: &[u8], url: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(key);
    h.update(url.as_bytes());
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().unwrap_or_default())
}

impl<P: Clone> Pool<P> {
    pub fn new(
        urls: &[String],
        api_key: Option<String>,
        limits: UpstreamLimits,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs_f64(limits.connect_timeout_s))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let upstreams = urls
            .iter()
            .map(|u| {
                metrics.upstream_ejected.with_label_values(&[u]).set(1);
                metrics.upstream_in_flight.with_label_values(&[u]).set(0);
                Arc::new(Upstream {
                    url: u.trim_end_matches('/').to_string(),
                    probed: Mutex::new(None),
                    // Admitted once probed.
                    ejected: AtomicBool::new(true),
                    failures: Mutex::new(Failures::default()),
                    successes: AtomicU32::new(0),
                    answered_at: AtomicU64::new(0),
                })
            })
            .collect();
        let gate = Gate::new(
            limits.fair_seconds,
            limits.fair_tokens.saturating_mul(urls.len()),
        );
        Ok(Pool {
            gate,
            upstreams,
            client,
            api_key,
            limits,
            metrics,
            checks: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// The admitted upstreams, heaviest first for `key`.
    pub fn order(&self, key: &[u8]) -> Vec<Arc<Upstream<P>>> {
        self.order_where(key, |_| true)
    }

    /// The admitted upstreams whose probe `accept`s, heaviest first for
    /// `key`.
    fn order_where(&self, key: &[u8], accept: impl Fn(&P) -> bool) -> Vec<Arc<Upstream<P>>> {
        let mut admitted: Vec<(u64, Arc<Upstream<P>>)> = self
            .upstreams
            .iter()
            .filter(|u| !u.is_ejected() && u.probed().is_some_and(|p| accept(&p)))
            .map(|u| (weight(key, &u.url), u.clone()))
            .collect();
        admitted.sort_by_key(|a| std::cmp::Reverse(a.0));
        admitted.into_iter().map(|(_, u)| u).collect()
    }

    fn set_ejected(&self, u: &Upstream<P>, ejected: bool) {
        let was = u.ejected.swap(ejected, Ordering::Relaxed);
        if was != ejected {
            if ejected {
                tracing::warn!("upstream {} ejected from routing", u.url);
            } else {
                tracing::info!("upstream {} admitted to routing", u.url);
            }
        }
        self.metrics
            .upstream_ejected
            .with_label_values(&[&u.url])
            .set(i64::from(ejected));
    }

    /// Counts a failure of the replica's own: a failed health check
    /// (`key` `None`, always a new failure) or a request that failed for a
    /// [`Fault::Replica`] reason (counted once per distinct key). Ejects
    /// once `eject_after` distinct failures came without a success between.
    pub fn failed(&self, u: &Upstream<P>, key: Option<&[u8]>) {
        u.successes.store(0, Ordering::Relaxed);
        let id = match key {
            Some(k) => weight(k, ""),
            None => self.checks.fetch_add(1, Ordering::Relaxed) | (1 << 63),
        };
        let n = match u.failures.lock() {
            Ok(mut f) => {
                if !f.seen.contains(&id) {
                    f.seen.push(id);
                }
                f.seen.len()
            }
            Err(_) => return,
        };
        if n >= self.limits.eject_after as usize {
            self.set_ejected(u, true);
        }
    }

    /// Milliseconds of the pool's clock, from 1.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whose fault a call begun at `started` ([`Pool::now_ms`]) is: as
    /// [`UpstreamError::fault`] says, but a timeout is the replica's only
    /// if it answered nothing since the call began. One that answered other
    /// calls meanwhile (its health checks at least) is alive: the request
    /// took too long there by its own size, would take as long elsewhere,
    /// and its client gets the timeout.
    fn fault_of(&self, u: &Upstream<P>, e: &UpstreamError, started: u64) -> Fault {
        match e {
            UpstreamError::Timeout { .. } if u.answered_at.load(Ordering::Relaxed) > started => {
                Fault::Request
            }
            _ => e.fault(),
        }
    }

    fn clear_failures(&self, u: &Upstream<P>) {
        if let Ok(mut f) = u.failures.lock() {
            f.seen.clear();
        }
    }

    /// Counts a passed check; admits a probed upstream after `readmit_after`
    /// in a row.
    pub fn passed(&self, u: &Upstream<P>) {
        self.clear_failures(u);
        let n = u.successes.fetch_add(1, Ordering::Relaxed) + 1;
        if u.is_ejected() && n >= self.limits.readmit_after && u.probed().is_some() {
            self.set_ejected(u, false);
        }
    }

    /// Admits an upstream at once (after its first successful probe).
    pub fn admit(&self, u: &Upstream<P>) {
        self.clear_failures(u);
        self.set_ejected(u, false);
    }

    /// One round of health checks: `GET /health` on every upstream that
    /// passed its start-up probe once (the others are probed by the
    /// start-up wait until they pass), a failure counted against it; an
    /// ejected upstream that answers is probed again (it may have
    /// restarted with other settings) before its pass counts towards
    /// re-admission.
    pub async fn check_health<F, Fut>(&self, probe: F)
    where
        F: Fn(Arc<Upstream<P>>) -> Fut,
        Fut: Future<Output = Result<P, UpstreamError>>,
    {
        let timeout = Duration::from_secs_f64(self.limits.probe_timeout_s.max(0.001));
        let once = self.upstreams.iter().filter(|u| u.probed().is_some());
        let checks = once.map(|u| {
            let reprobe = probe(u.clone());
            async move {
                let healthy = self
                    .call::<(), serde_json::Value>(u, "/health", None, timeout)
                    .await
                    .is_ok();
                if !healthy {
                    self.failed(u, None);
                    return;
                }
                if u.is_ejected() {
                    match reprobe.await {
                        Ok(p) => u.set_probed(p),
                        Err(e) => {
                            tracing::warn!("upstream {} failed its probe: {e}", u.url);
                            self.failed(u, None);
                            return;
                        }
                    }
                }
                self.passed(u);
            }
        });
        futures::future::join_all(checks).await;
    }

    fn request(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => builder.bearer_auth(k),
            None => builder,
        }
    }

    /// One call to one upstream, timed and counted.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        u: &Upstream<P>,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<T, UpstreamError> {
        let bytes = self.call_raw(u, path, body, timeout).await?;
        let text: &[u8] = if bytes.is_empty() {
            // `/health` answers 200 with no body.
            b"null"
        } else {
            &bytes
        };
        serde_json::from_slice(text).map_err(|e| UpstreamError::Invalid {
            url: u.url.clone(),
            message: e.to_string(),
        })
    }

    /// One call to one upstream whose answer is read as text (`/metrics`).
    pub async fn get_text(
        &self,
        u: &Upstream<P>,
        path: &str,
        timeout: Duration,
    ) -> Result<String, UpstreamError> {
        let bytes = self.call_raw::<()>(u, path, None, timeout).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn call_raw<B: Serialize>(
        &self,
        u: &Upstream<P>,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<Vec<u8>, UpstreamError> {
        let url = format!("{}{path}", u.url);
        let mut call = Counted::start(&self.metrics, &u.url);
        let result = self.send(&url, &u.url, body, timeout).await;
        if let Ok(_) | Err(UpstreamError::Status { .. } | UpstreamError::Invalid { .. }) = &result {
            u.answered_at.store(self.now_ms(), Ordering::Relaxed);
        }
        call.outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.outcome(),
        };
        result
    }

    async fn send<B: Serialize>(
        &self,
        url: &str,
        base: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<Vec<u8>, UpstreamError> {
        let builder = match body {
            Some(b) => self.client.post(url).json(b),
            None => self.client.get(url),
        };
        let classify = |e: reqwest::Error| {
            if e.is_timeout() {
                UpstreamError::Timeout {
                    url: base.to_string(),
                    seconds: timeout.as_secs_f64(),
                }
            } else {
                UpstreamError::Connect {
                    url: base.to_string(),
                    message: e.to_string(),
                }
            }
        };
        let fetch = async {
            let response = self.request(builder).send().await.map_err(classify)?;
            let status = response.status();
            let bytes = response.bytes().await.map_err(classify)?;
            Ok::<_, UpstreamError>((status, bytes))
        };
        // One deadline for connecting, sending and reading the whole body.
        let (status, bytes) =
            tokio::time::timeout(timeout, fetch)
                .await
                .map_err(|_| UpstreamError::Timeout {
                    url: base.to_string(),
                    seconds: timeout.as_secs_f64(),
                })??;
        if !status.is_success() {
            return Err(UpstreamError::Status {
                url: base.to_string(),
                status: status.as_u16(),
                message: error_message(&bytes),
            });
        }
        Ok(bytes.to_vec())
    }

    /// The most tokens one call may weigh and still run beside others'
    /// (`Gate::budget`); `None` when nothing is kept back.
    pub fn fair_budget(&self) -> Option<usize> {
        self.gate.budget()
    }

    /// A call that is safe to repeat, on the heaviest admitted upstream for
    /// `key`, then the next ones on failures that are not the request's
    /// own ([`Fault`]). `make` builds the body for the chosen upstream from
    /// what its probe learned. The call waits its job's turn for `weight`
    /// tokens of the upstreams' budget (`fair.rs`) first; its
    /// timeout runs from when it is sent.
    pub async fn call_routed<B, T, F>(
        &self,
        key: &[u8],
        path: &str,
        timeout: Duration,
        weight: usize,
        make: F,
    ) -> Result<(P, T), UpstreamError>
    where
        B: Serialize,
        T: DeserializeOwned,
        F: Fn(&P) -> B,
    {
        self.call_routed_where(key, path, timeout, weight, |_| true, make)
            .await
    }

    /// [`Pool::call_routed`] among the upstreams whose probe `accept`s.
    pub async fn call_routed_where<B, T, F>(
        &self,
        key: &[u8],
        path: &str,
        timeout: Duration,
        weight: usize,
        accept: impl Fn(&P) -> bool,
        make: F,
    ) -> Result<(P, T), UpstreamError>
    where
        B: Serialize,
        T: DeserializeOwned,
        F: Fn(&P) -> B,
    {
        let order = self.order_where(key, accept);
        if order.is_empty() {
            let admitted = self.order(key).len();
            return Err(UpstreamError::NoneAvailable(if admitted == 0 {
                format!(
                    "all {} upstream servers are ejected (failing their health checks or not \
                     yet probed); retry later",
                    self.upstreams.len()
                )
            } else {
                format!("none of the {admitted} admitted upstream servers takes this request")
            }));
        }
        let _turn = self.gate.enter(weight).await;
        let attempts = self.limits.retries as usize + 1;
        let mut last = None;
        let mut backoff = Duration::from_millis(self.limits.backoff_ms);
        for (i, u) in order.iter().cycle().take(attempts).enumerate() {
            if i > 0 {
                self.metrics.upstream_retries.inc();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(self.limits.max_backoff_ms));
            }
            let Some(probed) = u.probed() else { continue };
            let body = make(&probed);
            let started = self.now_ms();
            match self.call(u, path, Some(&body), timeout).await {
                Ok(v) => {
                    self.clear_failures(u);
                    return Ok((probed, v));
                }
                Err(e) => match self.fault_of(u, &e, started) {
                    Fault::Request => return Err(e),
                    fault => {
                        tracing::warn!("{e}; {} attempts left", attempts.saturating_sub(i + 1));
                        if fault == Fault::Replica {
                            self.failed(u, Some(key));
                        }
                        last = Some(e);
                    }
                },
            }
        }
        Err(last.unwrap_or_else(|| UpstreamError::NoneAvailable("no upstream was tried".into())))
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
