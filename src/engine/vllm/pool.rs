//! The upstream servers: routing by rendezvous hashing, health checks with
//! ejection and re-admission, bounded retries with backoff, and per-upstream
//! metrics.
//!
//! Each request has a key (the state hash for decisions, a digest of the
//! prompt for generations). Every admitted upstream gets a weight from the
//! key and its URL; the request goes to the heaviest, so every question on
//! one state reaches the replica that holds its prefix, and only the states
//! of a replica that leaves move. On a connection error, a timeout or a 5xx
//! the call is repeated on the next upstream in weight order, at most
//! `retries` times, after a backoff that doubles.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::protocol::error_message;
use super::LetterMethod;
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

impl UpstreamError {
    /// Whether the same call may go to another upstream.
    pub fn retryable(&self) -> bool {
        match self {
            UpstreamError::Connect { .. } | UpstreamError::Timeout { .. } => true,
            UpstreamError::Status { status, .. } => *status >= 500 || *status == 429,
            UpstreamError::Invalid { .. } | UpstreamError::NoneAvailable(_) => false,
        }
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
            UpstreamError::Status { .. } | UpstreamError::Invalid { .. } => {
                EngineError::Upstream(e.to_string())
            }
        }
    }
}

/// What the start-up probe learned about one upstream.
#[derive(Clone, Debug)]
pub struct Probed {
    /// The model name it serves (sent as `model`).
    pub model: String,
    pub max_model_len: Option<usize>,
    /// How option letters are read (a head upstream reads none: it holds
    /// the default, unused).
    pub method: LetterMethod,
    /// The width of a head upstream's embeddings (`None` on the
    /// completions upstreams).
    pub hidden_size: Option<usize>,
}

/// One upstream server and what routing knows of it.
pub struct Upstream {
    pub url: String,
    pub probed: Mutex<Option<Probed>>,
    ejected: AtomicBool,
    failures: AtomicU32,
    successes: AtomicU32,
}

impl Upstream {
    pub fn probed(&self) -> Option<Probed> {
        self.probed.lock().ok().and_then(|p| p.clone())
    }

    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }
}

/// The upstreams and the HTTP client that calls them.
pub struct Pool {
    pub upstreams: Vec<Arc<Upstream>>,
    client: reqwest::Client,
    api_key: Option<String>,
    pub limits: UpstreamLimits,
    metrics: Arc<Metrics>,
}

/// The rendezvous weight of an upstream for a key.
fn weight(key: &[u8], url: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(key);
    h.update(url.as_bytes());
    let d = h.finalize();
    u64::from_be_bytes(d[..8].try_into().unwrap_or_default())
}

impl Pool {
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
                    failures: AtomicU32::new(0),
                    successes: AtomicU32::new(0),
                })
            })
            .collect();
        Ok(Pool {
            upstreams,
            client,
            api_key,
            limits,
            metrics,
        })
    }

    /// The admitted upstreams, heaviest first for `key`.
    pub fn order(&self, key: &[u8]) -> Vec<Arc<Upstream>> {
        let mut admitted: Vec<(u64, Arc<Upstream>)> = self
            .upstreams
            .iter()
            .filter(|u| !u.is_ejected())
            .map(|u| (weight(key, &u.url), u.clone()))
            .collect();
        admitted.sort_by_key(|a| std::cmp::Reverse(a.0));
        admitted.into_iter().map(|(_, u)| u).collect()
    }

    fn set_ejected(&self, u: &Upstream, ejected: bool) {
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

    /// Counts a failed call or check; ejects after `eject_after` in a row.
    pub fn failed(&self, u: &Upstream) {
        u.successes.store(0, Ordering::Relaxed);
        let n = u.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.limits.eject_after {
            self.set_ejected(u, true);
        }
    }

    /// Counts a passed check; admits a probed upstream after `readmit_after`
    /// in a row.
    pub fn passed(&self, u: &Upstream) {
        u.failures.store(0, Ordering::Relaxed);
        let n = u.successes.fetch_add(1, Ordering::Relaxed) + 1;
        if u.is_ejected() && n >= self.limits.readmit_after && u.probed().is_some() {
            self.set_ejected(u, false);
        }
    }

    /// Admits an upstream at once (after its first successful probe).
    pub fn admit(&self, u: &Upstream) {
        u.failures.store(0, Ordering::Relaxed);
        self.set_ejected(u, false);
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
        u: &Upstream,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<T, UpstreamError> {
        let url = format!("{}{path}", u.url);
        let in_flight = self.metrics.upstream_in_flight.with_label_values(&[&u.url]);
        in_flight.inc();
        let started = Instant::now();
        let result = self.send(&url, &u.url, body, timeout).await;
        in_flight.dec();
        self.metrics
            .upstream_seconds
            .with_label_values(&[&u.url])
            .observe(started.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.outcome(),
        };
        self.metrics
            .upstream_requests
            .with_label_values(&[&u.url, outcome])
            .inc();
        result
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        url: &str,
        base: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<T, UpstreamError> {
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
        if bytes.is_empty() {
            // `/health` answers 200 with no body.
            return serde_json::from_slice(b"null").map_err(|e| UpstreamError::Invalid {
                url: base.to_string(),
                message: e.to_string(),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| UpstreamError::Invalid {
            url: base.to_string(),
            message: e.to_string(),
        })
    }

    /// A call that is safe to repeat, on the heaviest admitted upstream for
    /// `key`, then the next ones on retryable failures. `make` builds the
    /// body for the chosen upstream (its model name and reading method).
    pub async fn call_routed<B, T, F>(
        &self,
        key: &[u8],
        path: &str,
        timeout: Duration,
        make: F,
    ) -> Result<(Probed, T), UpstreamError>
    where
        B: Serialize,
        T: DeserializeOwned,
        F: Fn(&Probed) -> B,
    {
        let order = self.order(key);
        if order.is_empty() {
            return Err(UpstreamError::NoneAvailable(format!(
                "all {} upstream servers are ejected (failing their health checks or not yet \
                 probed); retry later",
                self.upstreams.len()
            )));
        }
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
            match self.call(u, path, Some(&body), timeout).await {
                Ok(v) => return Ok((probed, v)),
                Err(e) if e.retryable() => {
                    tracing::warn!("{e}; {} attempts left", attempts.saturating_sub(i + 1));
                    self.failed(u);
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| UpstreamError::NoneAvailable("no upstream was tried".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> Pool {
        let urls: Vec<String> = urls.iter().map(|s| s.to_string()).collect();
        let p = Pool::new(
            &urls,
            None,
            UpstreamLimits::default(),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        for u in &p.upstreams {
            p.admit(u);
        }
        p
    }

    #[test]
    fn rendezvous_moves_only_the_keys_of_a_replica_that_leaves() {
        let p = pool(&["http://a:1", "http://b:1", "http://c:1"]);
        let keys: Vec<[u8; 8]> = (0u64..3000).map(|i| i.to_le_bytes()).collect();
        let first = |p: &Pool, k: &[u8]| p.order(k)[0].url.clone();
        let before: Vec<String> = keys.iter().map(|k| first(&p, k)).collect();
        // Spread over all three, roughly evenly.
        for url in ["http://a:1", "http://b:1", "http://c:1"] {
            let n = before.iter().filter(|u| *u == url).count();
            assert!((800..1200).contains(&n), "{url}: {n}");
        }
        // Eject b: only b's keys move; a's and c's stay.
        p.set_ejected(&p.upstreams[1], true);
        for (k, was) in keys.iter().zip(&before) {
            let now = first(&p, k);
            if was != "http://b:1" {
                assert_eq!(&now, was);
            } else {
                assert_ne!(now, "http://b:1");
            }
        }
        // Admit it again: every key is back where it was.
        p.admit(&p.upstreams[1]);
        let again: Vec<String> = keys.iter().map(|k| first(&p, k)).collect();
        assert_eq!(again, before);
    }

    #[test]
    fn ejection_and_readmission_follow_the_counts() {
        let p = pool(&["http://a:1"]);
        let u = &p.upstreams[0];
        *u.probed.lock().unwrap() = Some(Probed {
            model: "m".into(),
            max_model_len: None,
            method: LetterMethod::TokenIds,
            hidden_size: None,
        });
        p.failed(u);
        assert!(u.is_ejected(), "eject_after is 1");
        p.passed(u);
        assert!(u.is_ejected(), "readmit_after is 2");
        p.passed(u);
        assert!(!u.is_ejected());
        assert!(p.order(b"k").len() == 1);
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let status = |s| UpstreamError::Status {
            url: "u".into(),
            status: s,
            message: String::new(),
        };
        assert!(status(500).retryable());
        assert!(status(503).retryable());
        assert!(!status(400).retryable());
        assert!(UpstreamError::Timeout {
            url: "u".into(),
            seconds: 1.0
        }
        .retryable());
        assert!(!UpstreamError::Invalid {
            url: "u".into(),
            message: String::new()
        }
        .retryable());
        assert!(matches!(
            EngineError::from(status(400)),
            EngineError::Upstream(_)
        ));
        assert!(matches!(
            EngineError::from(status(503)),
            EngineError::UpstreamUnavailable(_)
        ));
    }
}
