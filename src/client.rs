//! The HTTP client of the commands that talk to a running server
//! (`decisio register`, `decisio suite run`): one `ureq` agent with a
//! timeout, the API key, JSON bodies, and retries where the server asks for
//! them or is briefly away.
//!
//! A request is retried, for up to `retry_for` in all, when the connection
//! fails (the server is restarting) or the server answers 503 (its queue is
//! full; `Retry-After` says when to come back, else one second). Every other
//! status is the caller's to read.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The largest reply body read (a task list, an OpenAPI description).
const MAX_BODY: u64 = 64 << 20;

/// A server's reply: its status and JSON body (`null` when not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// The server's error, as `STATUS (param): message`.
    pub fn error(&self) -> String {
        let e = &self.body["error"];
        match (e["message"].as_str(), e["param"].as_str()) {
            (Some(m), Some(p)) => format!("{} ({p}): {m}", self.status),
            (Some(m), None) => format!("{}: {m}", self.status),
            _ => format!("HTTP {}", self.status),
        }
    }
}

/// A client of one decisio server.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    base: String,
    key: Option<String>,
    retry_for: Duration,
}

impl Client {
    /// A client of the server at `base` (`http://host:port`, or `https://`
    /// where the build has TLS), each request given `timeout`.
    pub fn new(base: &str, key: Option<String>, timeout: Duration) -> Result<Self> {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server must be an http:// or https:// URL; got `{base}`");
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Client {
            agent,
            base: base.trim_end_matches('/').to_string(),
            key,
            retry_for: Duration::from_secs(120),
        })
    }

    /// How long a request keeps retrying a server that is away or busy.
    pub fn retry_for(mut self, d: Duration) -> Self {
        self.retry_for = d;
        self
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn get(&self, path: &str) -> Result<Reply> {
        self.send("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Reply> {
        self.send("POST", path, Some(&serde_json::to_vec(body)?))
    }

    /// POST of a body already serialized (a registration file as given).
    pub fn post_raw(&self, path: &str, body: &[u8]) -> Result<Reply> {
        self.send("POST", path, Some(body))
    }

    pub fn delete(&self, path: &str) -> Result<Reply> {
        self.send("DELETE", path, None)
    }

    /// The plain-text body of a GET (`/metrics`).
    pub fn text(&self, path: &str) -> Result<(u16, String)> {
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url);
        if let Some(k) = &self.key {
            req = req.header("Authorization", format!("Bearer {k}"));
        }
        let mut resp = req.call().with_context(|| format!("GET {url}"))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_string()?;
        Ok((status, text))
    }

    fn send(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Reply> {
        let url = format!("{}{path}", self.base);
        let started = Instant::now();
        let mut wait = Duration::from_millis(250);
        loop {
            let outcome = self.once(method, &url, body);
            let retry_after = match &outcome {
                Ok((reply, after)) if reply.status == 503 => {
                    Some(after.unwrap_or(Duration::from_secs(1)))
                }
                Ok(_) => None,
                Err(
                    ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::HostNotFound,
                ) => {
                    wait = (wait * 2).min(Duration::from_secs(4));
                    Some(wait)
                }
                Err(_) => None,
            };
            match (retry_after, outcome) {
                (Some(d), outcome) if started.elapsed() + d <= self.retry_for => {
                    let _ = outcome;
                    std::thread::sleep(d);
                }
                (_, Ok((reply, _))) => return Ok(reply),
                (_, Err(e)) => {
                    return Err(e).with_context(|| {
                        format!(
                        "{method} {url} failed (after {:.0} s of retries); is the server running?",
                        started.elapsed().as_secs_f64()
                    )
                    })
                }
            }
        }
    }

    fn once(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
    ) -> Result<(Reply, Option<Duration>), ureq::Error> {
        let auth = self.key.as_ref().map(|k| format!("Bearer {k}"));
        let mut resp = match (method, body) {
            ("POST", Some(b)) => {
                let mut r = self
                    .agent
                    .post(url)
                    .header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b)?
            }
            ("DELETE", _) => {
                let mut r = self.agent.delete(url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()?
            }
            _ => {
                let mut r = self.agent.get(url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()?
            }
        };
        let status = resp.status().as_u16();
        let after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|s| Duration::from_secs_f64(s.clamp(0.0, 60.0)));
        let raw = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()?;
        let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        Ok((Reply { status, body }, after))
    }
}
