//! The vLLM backend: the [`Engine`] seam over HTTP to one or more vLLM
//! servers (or anything that speaks the same subset of its OpenAI server,
//! such as a decisio gateway with the MLX backend).
//!
//! The gateway renders and tokenizes every prompt itself, so the upstream
//! only sees token ids on `POST /v1/completions`. A decision question is one
//! completion of one token whose log-probabilities of the option letters
//! are read by the method the start-up probe found (`docs/design/vllm.md`):
//!
//! - [`LetterMethod::TokenIds`]: vLLM's `logprob_token_ids`, the exact
//!   log-probability of every letter;
//! - [`LetterMethod::AllowedTokens`]: `allowed_token_ids` set to the letters,
//!   on an upstream started with `--logprobs-mode processed_logprobs`, so
//!   the returned top-k are the letters, renormalised over them;
//! - [`LetterMethod::TopK`]: the top `k` (the upstream's cap), and for each
//!   letter outside them one more request that echoes the prompt followed
//!   by the letter and reads that token's log-probability.
//!
//! A letter that no method returned is an error, never a silent zero.
//!
//! Packed questions (`multi_question: "packed"`) are one greedy completion
//! of a prompt holding every question, generating an answer sheet of one
//! line per question, `N: LETTER`; each answer's letters are read at its
//! position of that generation, or, where the sheet broke its format, by a
//! teacher-forced completion (`docs/design/vllm.md`).
//! Every call has a timeout; routing, retries and health checks live in
//! [`pool`]; the wire types in [`protocol`].
//!
//! Intent tasks read hidden states, which a completions server does not
//! return: with `--head-upstream` they come from a second engine, a
//! pooling server (last-token pooling, not normalised) asked for the
//! embedding of the same token ids the completions upstream is sent for the
//! answer position, state first and then state and question (the second
//! continues the first in the upstream's prefix cache, as a decision's
//! question continues its state).

pub mod pool;
pub mod protocol;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use self::pool::{Pool, Probed, Upstream, UpstreamError};
use self::protocol::{
    token_id, CompletionRequest, CompletionResponse, EmbeddingRequest, EmbeddingResponse, ModelList,
};
use super::{
    Capabilities, ChatReceiver, EmbedReceiver, Engine, EngineError, EngineStatus, FinishReason,
    GenerateEvent, GenerateRequest, GenerateStream, ModelInfo, MultiQuestion, PackedPrompt,
    PadPolicy, QuestionScore, QuestionTokens, ScoreReceiver, ScoreRequest, ScoreResult,
    TokenLogprobs,
};
use crate::metrics::Metrics;
use crate::settings::UpstreamLimits;

/// How the option letters' log-probabilities are read from an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LetterMethod {
    /// `logprob_token_ids`: the named ids' log-probabilities.
    TokenIds,
    /// `allowed_token_ids` with processed log-probabilities.
    AllowedTokens,
    /// The top `k`, then an echo request per letter outside them.
    TopK { k: usize },
}

impl std::fmt::Display for LetterMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LetterMethod::TokenIds => write!(f, "logprob_token_ids"),
            LetterMethod::AllowedTokens => {
                write!(f, "allowed_token_ids with processed log-probabilities")
            }
            LetterMethod::TopK { k } => write!(
                f,
                "top-{k} logprobs, and an echo request for each letter outside them"
            ),
        }
    }
}

/// Which reading method to use: the best the probe finds, or a fixed one
/// (still checked by the probe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodChoice {
    Auto,
    TokenIds,
    AllowedTokens,
    TopK,
}

/// Settings of the vLLM backend.
#[derive(Clone, Debug)]
pub struct VllmOptions {
    /// Base URLs of the upstream servers (`http://host:port`).
    pub upstreams: Vec<String>,
    /// Sent as `Authorization: Bearer` to every upstream.
    pub api_key: Option<String>,
    /// The model name to send; default: the one each upstream serves.
    pub model: Option<String>,
    pub method: MethodChoice,
    pub padding: PadPolicy,
    /// The default multi-question mode (`warm` or `sequential`).
    pub mode: MultiQuestion,
    /// Token ids of the letters A..Z, for the probe.
    pub letter_ids: Vec<u32>,
    /// The vocabulary size of the prompt side's tokenizer/config.
    pub vocab_size: usize,
    /// The context length of the prompt side's config, used when no
    /// upstream states `max_model_len`.
    pub context_length: usize,
    pub architecture: String,
    /// Scoring and generation jobs in flight at once; one more is refused.
    pub max_queue: usize,
    pub limits: UpstreamLimits,
    pub metrics: Arc<Metrics>,
    /// Base URL of the head upstream: a pooling server whose embeddings
    /// are the hidden states of intent tasks (`--head-upstream`).
    pub head_upstream: Option<String>,
    /// The hidden size of the prompt side's config.json, which the head
    /// upstream's embeddings must have.
    pub hidden_size: Option<usize>,
}

struct Inner {
    pool: Pool,
    /// The head upstream, when one is configured.
    head: Option<Pool>,
    options: VllmOptions,
    depth: AtomicUsize,
    ready: AtomicBool,
}

/// The vLLM backend behind the [`Engine`] seam.
pub struct VllmEngine {
    inner: Arc<Inner>,
    info: ModelInfo,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for VllmEngine {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.001))
}

impl VllmEngine {
    /// Probes every upstream (at least one must answer), logs what was
    /// found, and starts the health checks.
    pub fn start(options: VllmOptions) -> Result<Self, String> {
        if options.upstreams.is_empty() {
            return Err("the vLLM backend needs at least one --upstream URL".into());
        }
        if options.upstreams.len() > options.limits.max_upstreams {
            return Err(format!(
                "{} upstreams given; at most {} are allowed",
                options.upstreams.len(),
                options.limits.max_upstreams
            ));
        }
        for u in options.upstreams.iter().chain(&options.head_upstream) {
            if !u.starts_with("http://") {
                return Err(format!(
                    "--upstream {u}: only http:// URLs are served (put TLS in front of the \
                     upstream on a private network, or a sidecar proxy next to the gateway)"
                ));
            }
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("vllm-client")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the HTTP client's runtime: {e}"))?;
        let pool = Pool::new(
            &options.upstreams,
            options.api_key.clone(),
            options.limits.clone(),
            options.metrics.clone(),
        )?;
        let head = match &options.head_upstream {
            Some(url) => Some(Pool::new(
                std::slice::from_ref(url),
                options.api_key.clone(),
                options.limits.clone(),
                options.metrics.clone(),
            )?),
            None => None,
        };
        let inner = Arc::new(Inner {
            pool,
            head,
            options,
            depth: AtomicUsize::new(0),
            ready: AtomicBool::new(false),
        });
        let probe_all = {
            let inner = inner.clone();
            async move {
                let probes = inner.pool.upstreams.iter().map(|u| {
                    let inner = inner.clone();
                    let u = u.clone();
                    async move { (u.clone(), probe(&inner, &u).await) }
                });
                futures::future::join_all(probes).await
            }
        };
        let results = runtime.block_on(probe_all);
        let mut errors = Vec::new();
        for (u, r) in &results {
            match r {
                Ok(p) => {
                    tracing::info!(
                        "upstream {}: serves `{}`, max_model_len {}, letters read by {}",
                        u.url,
                        p.model,
                        p.max_model_len.map_or("unknown".into(), |n| n.to_string()),
                        p.method
                    );
                    if let Ok(mut g) = u.probed.lock() {
                        *g = Some(p.clone());
                    }
                    inner.pool.admit(u);
                }
                Err(e) => {
                    tracing::warn!("upstream {} failed its probe: {e}", u.url);
                    errors.push(e.to_string());
                }
            }
        }
        let probed: Vec<Probed> = results
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok().cloned())
            .collect();
        if probed.is_empty() {
            return Err(format!(
                "no upstream answered the start-up probe: {}",
                errors.join("; ")
            ));
        }
        if let Some(head) = &inner.head {
            let u = &head.upstreams[0];
            match runtime.block_on(probe_head(&inner, head, u)) {
                Ok(p) => {
                    tracing::info!(
                        "head upstream {}: serves `{}`, embeddings of {} values (last-token \
                         hidden states, not normalised), max_model_len {}",
                        u.url,
                        p.model,
                        p.hidden_size.unwrap_or(0),
                        p.max_model_len.map_or("unknown".into(), |n| n.to_string()),
                    );
                    if let Ok(mut g) = u.probed.lock() {
                        *g = Some(p);
                    }
                    head.admit(u);
                }
                Err(e) => return Err(format!("the head upstream failed its probe: {e}")),
            }
        }
        let context_length = probed
            .iter()
            .filter_map(|p| p.max_model_len)
            .chain(
                inner
                    .head
                    .iter()
                    .filter_map(|h| h.upstreams[0].probed())
                    .filter_map(|p| p.max_model_len),
            )
            .min()
            .unwrap_or(inner.options.context_length);
        let info = ModelInfo {
            context_length,
            vocab_size: inner.options.vocab_size,
            hidden_size: inner.options.hidden_size,
            architecture: inner.options.architecture.clone(),
            identity: format!("vllm:{}", probed[0].model),
        };
        inner.ready.store(true, Ordering::Relaxed);
        runtime.spawn(health_loop(inner.clone()));
        Ok(VllmEngine {
            inner,
            info,
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> Result<&tokio::runtime::Runtime, EngineError> {
        self.runtime.as_ref().ok_or(EngineError::Stopped)
    }

    /// Counts a job in; refuses it when `max_queue` are in flight.
    fn admit(&self) -> Result<DepthGuard, EngineError> {
        let max = self.inner.options.max_queue.max(1);
        let n = self.inner.depth.fetch_add(1, Ordering::Relaxed);
        let guard = DepthGuard(self.inner.clone());
        if n >= max {
            return Err(EngineError::QueueFull(max));
        }
        Ok(guard)
    }
}

/// Counts a job out when dropped.
struct DepthGuard(Arc<Inner>);

impl Drop for DepthGuard {
    fn drop(&mut self) {
        self.0.depth.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Engine for VllmEngine {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn status(&self) -> EngineStatus {
        if !self.inner.ready.load(Ordering::Relaxed) {
            return EngineStatus::Loading;
        }
        let upstreams = &self.inner.pool.upstreams;
        if upstreams.iter().all(|u| u.is_ejected()) {
            return EngineStatus::Unavailable(format!(
                "all {} upstream servers are ejected (failing their health checks); retry later",
                upstreams.len()
            ));
        }
        EngineStatus::Ready
    }

    fn queue_depth(&self) -> usize {
        self.inner.depth.load(Ordering::Relaxed)
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateStream, EngineError> {
        let guard = self.admit()?;
        let (events, rx) = mpsc::channel(64);
        let inner = self.inner.clone();
        self.handle()?.spawn(async move {
            let _guard = guard;
            if let Err(e) = generate(&inner, &request, &events).await {
                let _ = events.send(Err(e)).await;
            }
        });
        Ok(rx)
    }

    fn score(&self, request: ScoreRequest) -> Result<ScoreReceiver, EngineError> {
        let guard = self.admit()?;
        let (reply, rx) = oneshot::channel();
        let inner = self.inner.clone();
        self.handle()?.spawn(async move {
            let _guard = guard;
            let result = score(&inner, &request).await;
            let _ = reply.send(result);
        });
        Ok(rx)
    }

    fn hidden_layers(&self) -> Option<usize> {
        // The final norm's output only: a pooling server taps no block.
        self.inner.head.as_ref().map(|_| 0)
    }

    fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedReceiver, EngineError> {
        if self.inner.head.is_none() {
            return Err(EngineError::Model(format!(
                "embeddings are not served by the vLLM backend without a head upstream{}",
                NO_HEAD_HINT
            )));
        }
        let guard = self.admit()?;
        let (reply, rx) = oneshot::channel();
        let inner = self.inner.clone();
        self.handle()?.spawn(async move {
            let _guard = guard;
            let fan_out = inner.options.limits.fan_out.max(1);
            let all = inputs.into_iter().map(|ids| {
                let inner = inner.clone();
                async move {
                    let mut h = Sha256::new();
                    for id in &ids {
                        h.update(id.to_le_bytes());
                    }
                    let key: [u8; 32] = h.finalize().into();
                    head_hidden(&inner, &key, &ids).await
                }
            });
            let result: Result<Vec<Vec<f32>>, EngineError> = futures::stream::iter(all)
                .buffered(fan_out)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect();
            let _ = reply.send(result);
        });
        Ok(rx)
    }

    fn capabilities(&self) -> Capabilities {
        let default = self.inner.options.mode;
        let mut modes = vec![default];
        for m in [
            MultiQuestion::Warm,
            MultiQuestion::Sequential,
            MultiQuestion::Packed,
        ] {
            if m != default {
                modes.push(m);
            }
        }
        Capabilities {
            modes,
            padding: self.inner.options.padding,
            name: "vLLM",
            images: true,
            embeddings: self.inner.head.is_some(),
            hidden_hint: if self.inner.head.is_some() {
                ""
            } else {
                NO_HEAD_HINT
            },
        }
    }

    fn chat_passthrough(&self, body: serde_json::Value) -> Result<ChatReceiver, EngineError> {
        let guard = self.admit()?;
        let (reply, rx) = oneshot::channel();
        let inner = self.inner.clone();
        self.handle()?.spawn(async move {
            let _guard = guard;
            let _ = reply.send(chat_passthrough(&inner, body).await);
        });
        Ok(rx)
    }
}

/// A chat completion with image parts, sent to an upstream's
/// `/v1/chat/completions` with the upstream's model name; routed by a
/// SHA-256 of the body, so the same request reaches the same replica.
async fn chat_passthrough(
    inner: &Inner,
    body: serde_json::Value,
) -> Result<serde_json::Value, EngineError> {
    use sha2::{Digest, Sha256};
    let key: [u8; 32] = Sha256::digest(body.to_string().as_bytes()).into();
    let timeout = secs(inner.options.limits.generate_timeout_s);
    let (_, answer): (Probed, serde_json::Value) = inner
        .pool
        .call_routed(&key, "/v1/chat/completions", timeout, |p| {
            let mut b = body.clone();
            b["model"] = serde_json::Value::String(p.model.clone());
            b
        })
        .await?;
    Ok(answer)
}

/// What makes the vLLM backend return hidden states.
const NO_HEAD_HINT: &str = " (start the gateway with --head-upstream URL, a pooling server \
     whose /v1/embeddings are the model's last-token hidden states, to serve them)";

/// Asks the head upstream what it serves and checks its embeddings: as
/// wide as the prompt side's hidden size, finite, and not normalised (a
/// vector of norm 1 is a pooler that normalises, which no head was fitted
/// on).
async fn probe_head(inner: &Inner, pool: &Pool, u: &Upstream) -> Result<Probed, UpstreamError> {
    let o = &inner.options;
    let timeout = secs(o.limits.probe_timeout_s);
    let invalid = |message: String| UpstreamError::Invalid {
        url: u.url.clone(),
        message,
    };
    let models: ModelList = pool.call(u, "/v1/models", None::<&()>, timeout).await?;
    let card = match &o.model {
        Some(m) => models.data.iter().find(|c| &c.id == m),
        None => None,
    }
    .or(models.data.first())
    .ok_or_else(|| invalid("GET /v1/models lists no model".into()))?;
    let body = EmbeddingRequest {
        model: card.id.clone(),
        input: vec![o.letter_ids[0], o.letter_ids[1]],
        encoding_format: "base64",
    };
    let r: EmbeddingResponse = pool.call(u, "/v1/embeddings", Some(&body), timeout).await?;
    let v = r
        .data
        .into_iter()
        .next()
        .ok_or_else(|| invalid("the embeddings answer has no data".into()))?
        .embedding
        .into_f32()
        .map_err(invalid)?;
    if let Some(want) = o.hidden_size.filter(|&w| w != v.len()) {
        return Err(invalid(format!(
            "its embeddings have {} values; the model's hidden size is {want} (serve the same \
             model, without `dimensions` or a projection)",
            v.len()
        )));
    }
    if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
        return Err(invalid(
            "its embedding is empty or not finite (base64 must be little-endian float32)".into(),
        ));
    }
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if (norm - 1.0).abs() < 1e-3 {
        return Err(invalid(
            "its embeddings are normalised (norm 1); start the pooling server with last-token \
             pooling and normalisation off: `--pooler-config '{\"pooling_type\": \"LAST\", \
             \"use_activation\": false}'` (vLLM 0.14 and later; docs/design/vllm.md gives the \
             older forms)"
                .into(),
        ));
    }
    Ok(Probed {
        model: card.id.clone(),
        max_model_len: card.max_model_len,
        method: LetterMethod::TokenIds,
        hidden_size: Some(v.len()),
    })
}

/// The hidden state at the last of `ids`: the head upstream's embedding of
/// them, exactly as sent (base64 float32).
async fn head_hidden(inner: &Inner, key: &[u8], ids: &[u32]) -> Result<Vec<f32>, EngineError> {
    let head = inner.head.as_ref().ok_or_else(|| {
        EngineError::Model(format!(
            "hidden states are not served by the vLLM backend without a head upstream{NO_HEAD_HINT}"
        ))
    })?;
    let (probed, response): (Probed, EmbeddingResponse) = head
        .call_routed(key, "/v1/embeddings", score_timeout(inner), |p| {
            EmbeddingRequest {
                model: p.model.clone(),
                input: ids.to_vec(),
                encoding_format: "base64",
            }
        })
        .await?;
    let url = head.upstreams.first().map_or("", |u| u.url.as_str());
    let v = response
        .data
        .into_iter()
        .next()
        .ok_or_else(|| format!("head upstream {url}: the embeddings answer has no data"))
        .and_then(|d| {
            d.embedding
                .into_f32()
                .map_err(|e| format!("head upstream {url}: {e}"))
        })
        .map_err(EngineError::Upstream)?;
    if probed.hidden_size.is_some_and(|n| n != v.len()) {
        return Err(EngineError::Upstream(format!(
            "head upstream {url} answered an embedding of {} values; it was probed with {}",
            v.len(),
            probed.hidden_size.unwrap_or(0)
        )));
    }
    Ok(v)
}

/// Asks an upstream what it serves and how it reads letters.
async fn probe(inner: &Inner, u: &Upstream) -> Result<Probed, UpstreamError> {
    let pool = &inner.pool;
    let o = &inner.options;
    let timeout = secs(o.limits.probe_timeout_s);
    let models: ModelList = pool.call(u, "/v1/models", None::<&()>, timeout).await?;
    let card = models.data.first().ok_or_else(|| UpstreamError::Invalid {
        url: u.url.clone(),
        message: "GET /v1/models lists no model".into(),
    })?;
    let model = match &o.model {
        Some(m) => {
            if !models.data.iter().any(|c| &c.id == m) {
                return Err(UpstreamError::Invalid {
                    url: u.url.clone(),
                    message: format!(
                        "it does not serve `{m}` (it serves {})",
                        models
                            .data
                            .iter()
                            .map(|c| format!("`{}`", c.id))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
            m.clone()
        }
        None => card.id.clone(),
    };
    let max_model_len = models
        .data
        .iter()
        .find(|c| c.id == model)
        .and_then(|c| c.max_model_len);
    let letters = &o.letter_ids;
    let prompt = vec![letters[0], letters[1]];
    let base = CompletionRequest {
        model: model.clone(),
        prompt: prompt.clone(),
        max_tokens: 1,
        temperature: Some(0.0),
        return_tokens_as_token_ids: true,
        ..Default::default()
    };
    let auto = o.method == MethodChoice::Auto;
    let complete = |r: &CompletionResponse, normalised: bool| {
        let Ok(found) = first_position(r) else {
            return false;
        };
        let got: Vec<f64> = letters
            .iter()
            .filter_map(|l| found.get(l).copied())
            .collect();
        if got.len() != letters.len() {
            return false;
        }
        !normalised || (logsumexp(&got)).abs() < 1e-3
    };
    let mut notes = Vec::new();
    if auto || o.method == MethodChoice::TokenIds {
        let body = CompletionRequest {
            logprobs: Some(1),
            logprob_token_ids: Some(letters.clone()),
            ..base.clone()
        };
        match pool
            .call::<_, CompletionResponse>(u, "/v1/completions", Some(&body), timeout)
            .await
        {
            Ok(r) if complete(&r, false) => {
                return Ok(Probed {
                    model,
                    max_model_len,
                    method: LetterMethod::TokenIds,
                    hidden_size: None,
                })
            }
            Ok(_) => notes.push("logprob_token_ids is ignored".to_string()),
            Err(
                e @ UpstreamError::Status {
                    status: 400..=499, ..
                },
            ) => notes.push(format!("logprob_token_ids is refused ({e})")),
            Err(e) => return Err(e),
        }
    }
    if auto || o.method == MethodChoice::AllowedTokens {
        let body = CompletionRequest {
            logprobs: Some(letters.len()),
            allowed_token_ids: Some(letters.clone()),
            ..base.clone()
        };
        match pool
            .call::<_, CompletionResponse>(u, "/v1/completions", Some(&body), timeout)
            .await
        {
            Ok(r) if complete(&r, true) => {
                return Ok(Probed {
                    model,
                    max_model_len,
                    method: LetterMethod::AllowedTokens,
                    hidden_size: None,
                })
            }
            Ok(_) => notes.push(
                "allowed_token_ids does not give processed log-probabilities (start vLLM with \
                 --logprobs-mode processed_logprobs for it)"
                    .to_string(),
            ),
            Err(
                e @ UpstreamError::Status {
                    status: 400..=499, ..
                },
            ) => notes.push(format!("allowed_token_ids is refused ({e})")),
            Err(e) => return Err(e),
        }
    }
    if auto || o.method == MethodChoice::TopK {
        // Ask for more than any cap: the refusal states the cap.
        let body = CompletionRequest {
            logprobs: Some(o.vocab_size + 1),
            ..base.clone()
        };
        let cap = match pool
            .call::<_, CompletionResponse>(u, "/v1/completions", Some(&body), timeout)
            .await
        {
            Ok(_) => o.vocab_size,
            Err(UpstreamError::Status {
                status: 400,
                message,
                ..
            }) => protocol::logprobs_cap(&message).ok_or_else(|| UpstreamError::Invalid {
                url: u.url.clone(),
                message: format!("its refusal of many logprobs states no cap: {message}"),
            })?,
            Err(e) => return Err(e),
        };
        if !notes.is_empty() {
            tracing::info!("upstream {}: {}", u.url, notes.join("; "));
        }
        return Ok(Probed {
            model,
            max_model_len,
            method: LetterMethod::TopK {
                k: cap.min(o.vocab_size),
            },
            hidden_size: None,
        });
    }
    Err(UpstreamError::Invalid {
        url: u.url.clone(),
        message: format!(
            "it does not honour the chosen letter method: {}",
            notes.join("; ")
        ),
    })
}

fn logsumexp(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max + v.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// The first generated position's alternatives, by token id.
fn first_position(r: &CompletionResponse) -> Result<std::collections::HashMap<u32, f64>, String> {
    let top = r
        .choices
        .first()
        .and_then(|c| c.logprobs.as_ref())
        .and_then(|l| l.top_logprobs.first())
        .and_then(|t| t.as_ref())
        .ok_or("the completion has no top_logprobs")?;
    Ok(top
        .iter()
        .filter_map(|(name, &lp)| token_id(name).map(|id| (id, lp)))
        .collect())
}

/// Periodic `/health` checks: eject on failure, re-probe and re-admit on
/// success.
async fn health_loop(inner: Arc<Inner>) {
    let interval = secs(inner.options.limits.health_interval_s);
    let timeout = secs(inner.options.limits.probe_timeout_s);
    loop {
        tokio::time::sleep(interval).await;
        let checks = inner.pool.upstreams.iter().map(|u| {
            let inner = inner.clone();
            let u = u.clone();
            async move {
                let pool = &inner.pool;
                let healthy = pool
                    .call::<(), serde_json::Value>(&u, "/health", None, timeout)
                    .await
                    .is_ok();
                if !healthy {
                    pool.failed(&u);
                    return;
                }
                if u.is_ejected() {
                    // It may have restarted with other settings: probe again.
                    match probe(&inner, &u).await {
                        Ok(p) => {
                            if let Ok(mut g) = u.probed.lock() {
                                *g = Some(p);
                            }
                        }
                        Err(e) => {
                            tracing::warn!("upstream {} failed its probe: {e}", u.url);
                            pool.failed(&u);
                            return;
                        }
                    }
                }
                pool.passed(&u);
            }
        });
        let head_checks = inner.head.iter().flat_map(|h| &h.upstreams).map(|u| {
            let inner = inner.clone();
            let u = u.clone();
            async move {
                let Some(pool) = inner.head.as_ref() else {
                    return;
                };
                let healthy = pool
                    .call::<(), serde_json::Value>(&u, "/health", None, timeout)
                    .await
                    .is_ok();
                if !healthy {
                    pool.failed(&u);
                    return;
                }
                if u.is_ejected() {
                    match probe_head(&inner, pool, &u).await {
                        Ok(p) => {
                            if let Ok(mut g) = u.probed.lock() {
                                *g = Some(p);
                            }
                        }
                        Err(e) => {
                            tracing::warn!("head upstream {} failed its probe: {e}", u.url);
                            pool.failed(&u);
                            return;
                        }
                    }
                }
                pool.passed(&u);
            }
        });
        futures::future::join(
            futures::future::join_all(checks),
            futures::future::join_all(head_checks),
        )
        .await;
    }
}

/// The deadline of one scoring call.
fn score_timeout(inner: &Inner) -> Duration {
    secs(inner.options.limits.request_timeout_s)
}

/// One question's letters, read from the upstream that holds its state.
/// Returns the letters' log-probabilities (in `read` order) and the
/// upstream's count of prompt tokens it found cached, when it reports it.
async fn read_letters(
    inner: &Inner,
    key: &[u8],
    prompt: &[u32],
    read: &[u32],
) -> Result<(Vec<f32>, Option<usize>), EngineError> {
    let pool = &inner.pool;
    let timeout = score_timeout(inner);
    let (probed, response): (Probed, CompletionResponse) = pool
        .call_routed(key, "/v1/completions", timeout, |p| {
            let base = CompletionRequest {
                model: p.model.clone(),
                prompt: prompt.to_vec(),
                max_tokens: 1,
                temperature: Some(0.0),
                return_tokens_as_token_ids: true,
                ..Default::default()
            };
            match p.method {
                LetterMethod::TokenIds => CompletionRequest {
                    logprobs: Some(1),
                    logprob_token_ids: Some(read.to_vec()),
                    ..base
                },
                LetterMethod::AllowedTokens => CompletionRequest {
                    logprobs: Some(read.len()),
                    allowed_token_ids: Some(read.to_vec()),
                    ..base
                },
                LetterMethod::TopK { k } => CompletionRequest {
                    logprobs: Some(k),
                    ..base
                },
            }
        })
        .await?;
    let cached = response
        .usage
        .as_ref()
        .and_then(|u| u.prompt_tokens_details.as_ref())
        .and_then(|d| d.cached_tokens);
    let found = first_position(&response).map_err(|m| EngineError::Upstream(m.to_string()))?;
    let out = letters_at(inner, key, &probed, &found, read, || prompt.to_vec(), "").await?;
    Ok((out, cached))
}

/// The log-probability of `letter` after `prompt`, from an echo of
/// `prompt ++ [letter]` (the letter's prompt log-probability).
async fn echo_letter(
    inner: &Inner,
    key: &[u8],
    prompt: &[u32],
    letter: u32,
) -> Result<f32, EngineError> {
    let mut ids = prompt.to_vec();
    ids.push(letter);
    let at = prompt.len();
    let (_, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(key, "/v1/completions", score_timeout(inner), |p| {
            CompletionRequest {
                model: p.model.clone(),
                prompt: ids.clone(),
                max_tokens: 0,
                logprobs: Some(0),
                echo: true,
                return_tokens_as_token_ids: true,
                ..Default::default()
            }
        })
        .await?;
    let lp = response
        .choices
        .first()
        .and_then(|c| c.logprobs.as_ref())
        .filter(|l| l.tokens.get(at).and_then(|t| token_id(t)) == Some(letter))
        .and_then(|l| l.token_logprobs.get(at).copied().flatten());
    lp.map(|v| v as f32).ok_or_else(|| {
        EngineError::Upstream(format!(
            "the echo of the prompt did not return the log-probability of letter token {letter}"
        ))
    })
}

/// Prefills a state on the upstream that holds it: a completion of the
/// state's tokens alone (one token, discarded), so that vLLM's prefix cache
/// (or a decisio upstream's kept prompts) holds exactly the state. Returns
/// the upstream's count of cached prompt tokens, when it reports it.
async fn prefill_state(
    inner: &Inner,
    key: &[u8],
    prefix: &[u32],
) -> Result<Option<usize>, EngineError> {
    let (_, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(key, "/v1/completions", score_timeout(inner), |p| {
            CompletionRequest {
                model: p.model.clone(),
                prompt: prefix.to_vec(),
                max_tokens: 1,
                temperature: Some(0.0),
                return_tokens_as_token_ids: true,
                ..Default::default()
            }
        })
        .await?;
    Ok(response
        .usage
        .as_ref()
        .and_then(|u| u.prompt_tokens_details.as_ref())
        .and_then(|d| d.cached_tokens))
}

async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    if request.hidden {
        if inner.head.is_none() {
            return Err(EngineError::Model(format!(
                "hidden states are not served by the vLLM backend without a head \
                 upstream{NO_HEAD_HINT}"
            )));
        }
        if let Some(layer) = request.hidden_layer {
            return Err(EngineError::Model(format!(
                "the vLLM backend's head upstream returns the final norm's output only, not \
                 block {layer}'s"
            )));
        }
    }
    let key = request.state.0;
    let prefix_len = request.prefix.len();
    // The head upstream embeds the state alone first, so that each
    // question's embedding continues it (its prefix cache), as a decision's
    // question continues its state.
    let head_warm = async {
        if request.hidden && !request.prefix.is_empty() {
            head_hidden(inner, &key, &request.prefix).await?;
        }
        Ok::<_, EngineError>(())
    };
    let one = |q: &QuestionTokens| {
        let mut prompt = request.prefix.clone();
        prompt.extend_from_slice(&q.suffix);
        let read = q.read.clone();
        async move {
            let started = Instant::now();
            let hidden = async {
                if request.hidden {
                    head_hidden(inner, &key, &prompt).await.map(Some)
                } else {
                    Ok(None)
                }
            };
            let ((lps, cached), hidden) =
                futures::future::try_join(read_letters(inner, &key, &prompt, &read), hidden)
                    .await?;
            Ok::<_, EngineError>((
                QuestionScore {
                    logits: lps.clone(),
                    logprobs: lps,
                    hidden,
                    seconds: started.elapsed().as_secs_f64(),
                    memoised: false,
                },
                cached,
            ))
        }
    };
    let mut results = Vec::with_capacity(request.questions.len());
    // The state-only request of warm mode: the upstream's count of cached
    // prompt tokens, and when it was sent.
    let mut warmed: Option<(Option<usize>, Instant)> = None;
    match request.mode {
        MultiQuestion::Sequential => {
            head_warm.await?;
            for q in &request.questions {
                results.push(one(q).await?);
            }
        }
        MultiQuestion::Warm if request.questions.len() > 1 && !request.prefix.is_empty() => {
            // One request prefills the state alone; then every question
            // finds it cached and they all go out at once.
            let started = Instant::now();
            let (cached, ()) =
                futures::future::try_join(prefill_state(inner, &key, &request.prefix), head_warm)
                    .await?;
            warmed = Some((cached, started));
            let rest: Vec<_> = futures::stream::iter(request.questions.iter().map(one))
                .buffered(inner.options.limits.fan_out.max(1))
                .collect()
                .await;
            for r in rest {
                results.push(r?);
            }
        }
        MultiQuestion::Warm => {
            head_warm.await?;
            let mut questions = request.questions.iter();
            if let Some(first) = questions.next() {
                results.push(one(first).await?);
            }
            let rest: Vec<_> = futures::stream::iter(questions.map(one))
                .buffered(inner.options.limits.fan_out.max(1))
                .collect()
                .await;
            for r in rest {
                results.push(r?);
            }
        }
        MultiQuestion::Packed => {
            drop(head_warm);
            return score_packed(inner, request).await;
        }
    }
    let cached = match warmed {
        Some((c, _)) => c,
        None => results.first().and_then(|(_, c)| *c),
    }
    .is_some_and(|c| c >= prefix_len);
    let new_state_seconds = (!cached).then(|| match warmed {
        Some((_, started)) => started.elapsed().as_secs_f64(),
        None => results.first().map_or(0.0, |(q, _)| q.seconds),
    });
    if let Some(s) = new_state_seconds {
        inner.options.metrics.new_state_seconds.observe(s);
    }
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions: results.into_iter().map(|(q, _)| q).collect(),
    })
}

/// Where a packed answer's letters are read.
enum PackedRead {
    /// At this position of the generation, whose alternatives there are
    /// given by token id.
    Generated {
        position: usize,
        found: std::collections::HashMap<u32, f64>,
    },
    /// From a teacher-forced prompt: the prompt, the well-formed part of
    /// the sheet and the question's marker.
    Fallback(Vec<u32>),
}

/// The answers' positions in a packed sheet: question `i`'s line (the
/// separator, then its marker; the first line is its marker alone, which
/// the route puts at the end of the prompt, so that it is empty here) must
/// follow the previous answer's letter exactly, and its letters are read
/// right after the marker. An answer whose generated token there is not one
/// of its letters is still read there, but ends the well-formed part of the
/// sheet: every later question, and every question whose line is not where
/// it belongs, falls back to a teacher-forced sheet, the well-formed part
/// followed by its own line. Returns, per question, the answer position
/// (`Ok`) or the fallback sheet (`Err`).
fn locate_answers(
    generated: &[u32],
    markers: &[Vec<u32>],
    separator: &[u32],
    reads: &[&[u32]],
) -> Vec<Result<usize, Vec<u32>>> {
    let mut out = Vec::with_capacity(markers.len());
    // The end of the well-formed part; `None` once it broke.
    let mut cursor = Some(0usize);
    let mut kept = 0usize;
    for (i, (marker, read)) in markers.iter().zip(reads).enumerate() {
        let line = || {
            let mut l = if i == 0 {
                Vec::new()
            } else {
                separator.to_vec()
            };
            l.extend_from_slice(marker);
            l
        };
        let position = cursor.and_then(|c| {
            let l = line();
            let end = c + l.len();
            (generated[c..].starts_with(&l) && end < generated.len()).then_some(end)
        });
        match position {
            Some(p) => {
                out.push(Ok(p));
                if read.contains(&generated[p]) {
                    cursor = Some(p + 1);
                    kept = p + 1;
                } else {
                    cursor = None;
                }
            }
            None => {
                cursor = None;
                let mut sheet = generated[..kept].to_vec();
                sheet.extend(line());
                out.push(Err(sheet));
            }
        }
    }
    out
}

/// Packed questions: the one prompt, one greedy generation of the answer
/// sheet with the letters' log-probabilities at every position, and each
/// answer's letters read at its own position (`docs/design/vllm.md`,
/// "Packed questions").
async fn score_packed(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    let packed: &PackedPrompt = request.packed.as_ref().ok_or_else(|| {
        EngineError::Model("a packed scoring job came without its packed prompt".into())
    })?;
    if request.hidden {
        return Err(EngineError::Model(
            "packed questions read option letters, not hidden states".into(),
        ));
    }
    if packed.markers.len() != request.questions.len() {
        return Err(EngineError::Model(format!(
            "a packed prompt of {} markers for {} questions",
            packed.markers.len(),
            request.questions.len()
        )));
    }
    let key = request.state.0;
    let started = Instant::now();
    // Every letter any question reads, once.
    let mut letters: Vec<u32> = Vec::new();
    for q in &request.questions {
        for id in &q.read {
            if !letters.contains(id) {
                letters.push(*id);
            }
        }
    }
    let timeout = secs(inner.options.limits.generate_timeout_s);
    let (probed, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(&key, "/v1/completions", timeout, |p| {
            let base = CompletionRequest {
                model: p.model.clone(),
                prompt: packed.prompt.clone(),
                max_tokens: packed.max_tokens,
                temperature: Some(0.0),
                // Always asked: the token names carry the generated ids.
                logprobs: Some(0),
                return_tokens_as_token_ids: true,
                ..Default::default()
            };
            match p.method {
                LetterMethod::TokenIds => CompletionRequest {
                    logprobs: Some(1),
                    logprob_token_ids: Some(letters.clone()),
                    ..base
                },
                LetterMethod::TopK { k } => CompletionRequest {
                    logprobs: Some(k),
                    ..base
                },
                // `allowed_token_ids` would constrain the sheet itself to
                // letters: the sheet is generated freely and each answer is
                // read by a teacher-forced request.
                LetterMethod::AllowedTokens => base,
            }
        })
        .await?;
    let cached = response
        .usage
        .as_ref()
        .and_then(|u| u.prompt_tokens_details.as_ref())
        .and_then(|d| d.cached_tokens)
        .is_some_and(|c| c >= request.prefix.len());
    let lp = response
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.logprobs)
        .ok_or_else(|| EngineError::Upstream("the packed generation has no logprobs".into()))?;
    let generated: Vec<u32> = lp
        .tokens
        .iter()
        .map(|t| {
            token_id(t).ok_or_else(|| {
                EngineError::Upstream(format!(
                    "the upstream named a token `{t}`, not `token_id:N` \
                     (return_tokens_as_token_ids)"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let reads: Vec<&[u32]> = request.questions.iter().map(|q| &q.read[..]).collect();
    let plans: Vec<PackedRead> =
        locate_answers(&generated, &packed.markers, &packed.separator, &reads)
            .into_iter()
            .map(|r| match r {
                Ok(position) => PackedRead::Generated {
                    position,
                    found: lp
                        .top_logprobs
                        .get(position)
                        .and_then(|m| m.as_ref())
                        .map(|m| {
                            m.iter()
                                .filter_map(|(n, &v)| token_id(n).map(|id| (id, v)))
                                .collect()
                        })
                        .unwrap_or_default(),
                },
                Err(sheet) => {
                    let mut prompt = packed.prompt.clone();
                    prompt.extend(sheet);
                    PackedRead::Fallback(prompt)
                }
            })
            .collect();
    let metrics = &inner.options.metrics;
    let mut reads = Vec::with_capacity(plans.len());
    for (plan, q) in plans.into_iter().zip(&request.questions) {
        let label = match plan {
            PackedRead::Generated { .. } => "generated",
            PackedRead::Fallback(_) => "fallback",
        };
        metrics.packed_answers.with_label_values(&[label]).inc();
        reads.push(read_packed(
            inner, &key, &probed, packed, &generated, plan, &q.read,
        ));
    }
    let values: Vec<Vec<f32>> = futures::stream::iter(reads)
        .buffered(inner.options.limits.fan_out.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let new_state_seconds = (!cached).then_some(seconds);
    if let Some(s) = new_state_seconds {
        metrics.new_state_seconds.observe(s);
    }
    let each = seconds / values.len().max(1) as f64;
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions: values
            .into_iter()
            .map(|lps| QuestionScore {
                logits: lps.clone(),
                logprobs: lps,
                hidden: None,
                seconds: each,
                memoised: false,
            })
            .collect(),
    })
}

/// One packed answer's letters, where [`locate_answers`] found them.
async fn read_packed(
    inner: &Inner,
    key: &[u8],
    probed: &Probed,
    packed: &PackedPrompt,
    generated: &[u32],
    plan: PackedRead,
    read: &[u32],
) -> Result<Vec<f32>, EngineError> {
    let (position, found) = match plan {
        PackedRead::Fallback(prompt) => {
            return Ok(read_letters(inner, key, &prompt, read).await?.0)
        }
        PackedRead::Generated { position, found } => (position, found),
    };
    // The prompt as the answer position saw it, for the reads that need a
    // request of their own.
    let teacher = || {
        let mut p = packed.prompt.clone();
        p.extend_from_slice(&generated[..position]);
        p
    };
    if probed.method == LetterMethod::AllowedTokens {
        return Ok(read_letters(inner, key, &teacher(), read).await?.0);
    }
    let at = format!(" at packed answer position {position}");
    letters_at(inner, key, probed, &found, read, teacher, &at).await
}

/// The log-probabilities of the letters `read` among `found`, the
/// alternatives one position returned. With a top-k upstream a letter
/// outside the top k is read by an echo of `prompt()`, the prompt that
/// position saw; with any other method a missing letter is an error (never
/// a zero), naming the position (`at`).
async fn letters_at(
    inner: &Inner,
    key: &[u8],
    probed: &Probed,
    found: &std::collections::HashMap<u32, f64>,
    read: &[u32],
    prompt: impl FnOnce() -> Vec<u32>,
    at: &str,
) -> Result<Vec<f32>, EngineError> {
    let mut out = Vec::with_capacity(read.len());
    let mut missing = Vec::new();
    for (i, id) in read.iter().enumerate() {
        match found.get(id) {
            Some(&v) => out.push(v as f32),
            None => {
                out.push(f32::NAN);
                missing.push(i);
            }
        }
    }
    if missing.is_empty() {
        return Ok(out);
    }
    if !matches!(probed.method, LetterMethod::TopK { .. }) {
        return Err(EngineError::Upstream(format!(
            "the upstream did not return the log-probability of {} option letter(s) \
             (token ids {:?}){at} with {}",
            missing.len(),
            missing.iter().map(|&i| read[i]).collect::<Vec<_>>(),
            probed.method
        )));
    }
    let prompt = prompt();
    let echoes = missing
        .iter()
        .map(|&i| echo_letter(inner, key, &prompt, read[i]));
    let values = futures::future::try_join_all(echoes).await?;
    for (&i, v) in missing.iter().zip(values) {
        out[i] = v;
    }
    Ok(out)
}

/// Alternatives at one position: the named ids in order, or the top `k`
/// without the token itself when it came on top of them.
fn alternatives(
    map: Option<&std::collections::HashMap<String, f64>>,
    token: u32,
    k: usize,
    named: &[u32],
) -> Vec<(u32, f32)> {
    let Some(map) = map else { return Vec::new() };
    let by_id: std::collections::HashMap<u32, f32> = map
        .iter()
        .filter_map(|(n, &v)| token_id(n).map(|id| (id, v as f32)))
        .collect();
    if !named.is_empty() {
        return named
            .iter()
            .filter_map(|id| by_id.get(id).map(|&v| (*id, v)))
            .collect();
    }
    let mut all: Vec<(u32, f32)> = by_id.into_iter().collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if all.len() > k {
        if let Some(pos) = all.iter().position(|(id, _)| *id == token) {
            all.remove(pos);
        }
    }
    all.truncate(k);
    all
}

/// A generation, forwarded as one token-id completion (not streamed from
/// the upstream: the events are sent once it answers).
async fn generate(
    inner: &Inner,
    request: &GenerateRequest,
    events: &mpsc::Sender<Result<GenerateEvent, EngineError>>,
) -> Result<(), EngineError> {
    let key: [u8; 32] = {
        let mut h = Sha256::new();
        for id in &request.prompt {
            h.update(id.to_le_bytes());
        }
        h.finalize().into()
    };
    let k = request.logprobs.unwrap_or(0);
    let echo = request.prompt_logprobs.is_some();
    let timeout = secs(inner.options.limits.generate_timeout_s);
    let (_, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(&key, "/v1/completions", timeout, |p| CompletionRequest {
            model: p.model.clone(),
            prompt: request.prompt.clone(),
            max_tokens: request.max_tokens,
            temperature: Some(request.sampling.temperature),
            top_p: Some(request.sampling.top_p),
            // The request's signed seed, carried as its bits (validate.rs).
            seed: request.sampling.seed.map(|s| s as i64),
            // Always asked: the token names carry the generated ids.
            logprobs: Some(k.max(request.prompt_logprobs.unwrap_or(0))),
            echo,
            logprob_token_ids: (!request.logprob_token_ids.is_empty())
                .then(|| request.logprob_token_ids.clone()),
            return_tokens_as_token_ids: true,
            ignore_eos: request.stop_token_ids.is_empty(),
            ..Default::default()
        })
        .await?;
    let choice = response
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| EngineError::Upstream("the completion has no choices".into()))?;
    let lp = choice.logprobs.unwrap_or_default();
    let n = lp.tokens.len();
    let ids: Vec<u32> = lp
        .tokens
        .iter()
        .map(|t| {
            token_id(t).ok_or_else(|| {
                EngineError::Upstream(format!(
                    "the upstream named a token `{t}`, not `token_id:N` \
                     (return_tokens_as_token_ids)"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let entry = |i: usize, named: &[u32], k: usize| {
        lp.token_logprobs
            .get(i)
            .copied()
            .flatten()
            .map(|v| TokenLogprobs {
                logprob: v as f32,
                top: alternatives(
                    lp.top_logprobs.get(i).and_then(|m| m.as_ref()),
                    ids[i],
                    k,
                    named,
                ),
            })
    };
    let start = if echo {
        let p = request.prompt.len();
        if n < p {
            return Err(EngineError::Upstream(format!(
                "the echo has {n} tokens for a prompt of {p}"
            )));
        }
        let pk = request.prompt_logprobs.unwrap_or(0);
        let prompt: Vec<_> = (0..p)
            .map(|i| if i == 0 { None } else { entry(i, &[], pk) })
            .collect();
        if events
            .send(Ok(GenerateEvent::Prompt(prompt)))
            .await
            .is_err()
        {
            return Ok(());
        }
        p
    } else {
        0
    };
    for (i, &id) in ids.iter().enumerate().skip(start) {
        if request.stop_token_ids.contains(&id) {
            let _ = events
                .send(Ok(GenerateEvent::Finished(FinishReason::Stop)))
                .await;
            return Ok(());
        }
        let logprobs = request
            .logprobs
            .and_then(|k| entry(i, &request.logprob_token_ids, k));
        if events
            .send(Ok(GenerateEvent::Token { id, logprobs }))
            .await
            .is_err()
        {
            return Ok(());
        }
    }
    let reason = match choice.finish_reason.as_deref() {
        Some("length") => FinishReason::Length,
        _ if n - start >= request.max_tokens => FinishReason::Length,
        _ => FinishReason::Stop,
    };
    let _ = events.send(Ok(GenerateEvent::Finished(reason))).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/v1/completions` answer in the shape of vLLM's
    /// `CompletionResponse` with `logprob_token_ids` and
    /// `return_tokens_as_token_ids`: the sampled token and the named ids at
    /// the one generated position, and vLLM's usage details.
    const VLLM_ANSWER: &str = r#"{
        "id": "cmpl-0", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": " A", "finish_reason": "length", "stop_reason": null,
            "logprobs": {"text_offset": [0], "token_logprobs": [-0.25],
                "tokens": ["token_id:330"],
                "top_logprobs": [{"token_id:330": -0.25, "token_id:32": -1.5,
                    "token_id:33": -2.0, "token_id:34": -3.25}]},
            "prompt_logprobs": null, "prompt_token_ids": null}],
        "usage": {"prompt_tokens": 48, "total_tokens": 49, "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 32}},
        "kv_transfer_params": null
    }"#;

    #[test]
    fn reads_letters_from_a_vllm_answer() {
        let r: CompletionResponse = serde_json::from_str(VLLM_ANSWER).unwrap();
        let found = first_position(&r).unwrap();
        assert_eq!(found.get(&32), Some(&-1.5));
        assert_eq!(found.get(&34), Some(&-3.25));
        assert_eq!(found.get(&35), None);
        assert_eq!(
            r.usage
                .unwrap()
                .prompt_tokens_details
                .unwrap()
                .cached_tokens,
            Some(32)
        );
        let top = r.choices[0].logprobs.as_ref().unwrap().top_logprobs[0].clone();
        // The top k without the token itself when it came on top of them
        // (k + 1 entries), all of them when it was among them (k entries).
        assert_eq!(
            alternatives(top.as_ref(), 34, 3, &[]),
            vec![(330, -0.25), (32, -1.5), (33, -2.0)]
        );
        assert_eq!(alternatives(top.as_ref(), 330, 4, &[]).len(), 4);
        assert_eq!(
            alternatives(top.as_ref(), 330, 2, &[34, 32]),
            vec![(34, -3.25), (32, -1.5)]
        );
    }

    #[test]
    fn packed_answers_are_found_after_their_markers() {
        // Markers `1:` = [10, 11], `2:` = [20, 11], `3:` = [30, 11], the
        // separator `\n` = [12]; letters 1..4.
        let markers = vec![vec![10, 11], vec![20, 11], vec![30, 11]];
        let sep = [12];
        let letters: &[u32] = &[1, 2, 3, 4];
        let reads = [letters, letters, letters];
        let sheet = [10, 11, 2, 12, 20, 11, 4, 12, 30, 11, 1, 0];
        assert_eq!(
            locate_answers(&sheet, &markers, &sep, &reads),
            vec![Ok(2), Ok(6), Ok(10)]
        );
        // The second line breaks the format: it and the third are read
        // after the first answer followed by their own lines.
        let sheet = [10, 11, 2, 12, 99, 11, 4, 12, 30, 11, 1];
        assert_eq!(
            locate_answers(&sheet, &markers, &sep, &reads),
            vec![
                Ok(2),
                Err(vec![10, 11, 2, 12, 20, 11]),
                Err(vec![10, 11, 2, 12, 30, 11])
            ]
        );
        // A non-letter answer is read where it stands and ends the
        // well-formed part (here empty); a sheet cut short falls back.
        let sheet = [10, 11, 77, 12, 20, 11, 4];
        assert_eq!(
            locate_answers(&sheet, &markers, &sep, &reads),
            vec![Ok(2), Err(vec![12, 20, 11]), Err(vec![12, 30, 11])]
        );
        assert_eq!(
            locate_answers(&[10, 11], &markers[..1], &sep, &reads[..1]),
            vec![Err(vec![10, 11])]
        );
        // The first marker at the end of the prompt: the first answer is
        // the first generated token.
        let prompted = vec![vec![], vec![20, 11]];
        assert_eq!(
            locate_answers(&[3, 12, 20, 11, 1], &prompted, &sep, &reads[..2]),
            vec![Ok(0), Ok(4)]
        );
    }

    #[test]
    fn a_completion_without_logprobs_is_an_error() {
        let r: CompletionResponse =
            serde_json::from_str(r#"{"choices": [{"text": "x", "logprobs": null}]}"#).unwrap();
        assert!(first_position(&r).is_err());
    }
}
