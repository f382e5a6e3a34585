//! The vLLM backend: the [`Engine`] seam over HTTP to one or more vLLM
//! servers (or anything that speaks the same subset of its OpenAI server,
//! such as a decisio gateway with the MLX backend).
//!
//! The gateway renders and tokenizes every prompt itself, so the upstream
//! only sees token ids on `POST /v1/completions`. A decision question is one
//! completion of one token (a state's questions: one request of a list of
//! prompts) whose log-probabilities of the option letters are read by the
//! method the start-up probe found (`docs/design/vllm.md`):
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
//!
//! The files, by job: `probe` (what each upstream serves and how to ask
//! it), `batch` (a state's questions as one list request, the default),
//! `letters` (decisions whose questions are separate completions),
//! `packed` (packed questions), `reading` (a question's letters read from
//! a completion, for both), `generate` (completions, and chat completions
//! with images), `head` (the head upstream), `wait` (the start-up wait:
//! each upstream probed with back-off until it passes), `fair` (the
//! upstreams' work in flight shared fairly between requests), [`pool`]
//! (routing, retries, faults, health checks: every call has a timeout) and
//! [`protocol`] (the wire types and what is read from them). This file
//! starts the backend, settles what the first probes tell (context length,
//! identity; how the route's padding meets the upstream's cache), chooses how a decision's questions are asked, and
//! puts it behind the [`Engine`] seam.
//!
//! Intent tasks read hidden states, which a completions server does not
//! return: with `--head-upstream` they come from a second engine, a
//! pooling server (last-token pooling, not normalised) asked for the
//! embedding of the same token ids the completions upstream is sent for the
//! answer position, state first and then state and question (the second
//! continues the first in the upstream's prefix cache, as a decision's
//! question continues its state).

mod batch;
mod fair;
mod generate;
mod head;
mod job;
mod letters;
mod packed;
pub mod pool;
mod probe;
pub mod protocol;
mod reading;
mod wait;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use self::head::{HeadProbed, NO_HEAD_HINT};
use self::job::unless_left;
use self::pool::Pool;
use self::probe::Probed;
use self::wait::WaitState;
use super::{
    Capabilities, ChatReceiver, EmbedReceiver, Engine, EngineError, EngineStatus, GenerateRequest,
    GenerateStream, ModelInfo, MultiQuestion, ScoreReceiver, ScoreRequest, ScoreResult,
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
    /// The block the route pads states to (`None`: not padded), checked at
    /// start against the upstreams' prefix-cache unit.
    pub pad_block: Option<usize>,
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
    pool: Pool<Probed>,
    /// The head upstream, when one is configured.
    head: Option<Pool<HeadProbed>>,
    options: VllmOptions,
    depth: AtomicUsize,
    /// What the first upstreams to pass their probe settled; empty while
    /// the gateway waits for them.
    settled: OnceLock<Settled>,
    /// Held while settling, so that it is done once.
    settling: Mutex<()>,
    wait: WaitState,
    sent_states: batch::SentStates,
}

/// What depends on the probes, settled when the first completions upstream
/// (and the head upstream, when there is one) passed.
struct Settled {
    info: ModelInfo,
}

impl Inner {
    /// Why chat completions with images are refused: every upstream was
    /// probed and refused the probe's image (its answer is quoted). `None`
    /// while one takes images, or one is not probed yet (it may: until it
    /// is, image requests find no upstream that takes them and get a 503
    /// to retry); image requests are routed among those that take images.
    fn image_refusal(&self) -> Option<String> {
        let probed: Vec<Option<Probed>> = self.pool.upstreams.iter().map(|u| u.probed()).collect();
        if probed
            .iter()
            .any(|p| p.as_ref().is_none_or(|p| p.image_refusal.is_none()))
        {
            return None;
        }
        let probed: Vec<Probed> = probed.into_iter().flatten().collect();
        let first = probed.first()?;
        Some(format!(
            "the upstream's model `{}` takes no images (it answered the gateway's image probe \
             with {}); serve a vision model upstream for the image route",
            first.model,
            first.image_refusal.clone().unwrap_or_default()
        ))
    }
}

/// The vLLM backend behind the [`Engine`] seam.
pub struct VllmEngine {
    inner: Arc<Inner>,
    /// What [`Engine::info`] says until the probes settled it: the model
    /// folder's context length.
    provisional: ModelInfo,
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

/// A decision's questions on one state, by the request's multi-question
/// mode: packed into one completion ([`packed`]), each its own one after
/// another ([`letters`]), or as list requests ([`batch`]).
async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    if request.hidden {
        head::head_pool(inner, "hidden states")?;
        if let Some(layer) = request.hidden_layer {
            return Err(EngineError::Unsupported(format!(
                "the vLLM backend's head upstream returns the final norm's output only, not \
                 block {layer}'s"
            )));
        }
    }
    match request.mode {
        MultiQuestion::Packed => packed::score(inner, request).await,
        MultiQuestion::Sequential => letters::score(inner, request).await,
        MultiQuestion::Warm => batch::score(inner, request).await,
    }
}

/// The deadline of one scoring call.
fn score_timeout(inner: &Inner) -> Duration {
    secs(inner.options.limits.request_timeout_s)
}

impl VllmEngine {
    /// Starts the backend: probes every upstream (and the head upstream),
    /// admitting each the moment it passes, and starts the health checks.
    /// With `limits.wait_s` 0 the first probes are made here and the start
    /// fails when no upstream (or the head upstream) passes; otherwise the
    /// backend waits for them ([`EngineStatus::Waiting`]), for at most
    /// `wait_s` seconds when set.
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
        let limit = options.limits.wait_s;
        let provisional = ModelInfo {
            context_length: options.context_length,
            vocab_size: options.vocab_size,
            hidden_size: options.hidden_size,
            architecture: options.architecture.clone(),
            identity: format!("vllm:{}", options.model.as_deref().unwrap_or("")),
        };
        let options_states = options.limits.remembered_states;
        let inner = Arc::new(Inner {
            wait: WaitState::new(&options.upstreams, options.head_upstream.as_ref(), limit),
            pool,
            head,
            options,
            depth: AtomicUsize::new(0),
            settled: OnceLock::new(),
            settling: Mutex::new(()),
            sent_states: batch::SentStates::new(options_states),
        });
        if limit.is_some_and(|l| l <= 0.0) {
            runtime.block_on(first_probes(&inner))?;
        }
        let backoff = (
            secs(inner.options.limits.wait_first_backoff_s),
            secs(inner.options.limits.wait_max_backoff_s),
        );
        for (slot, u) in inner.pool.upstreams.iter().enumerate() {
            let (inner, u) = (inner.clone(), u.clone());
            runtime.spawn(async move {
                let i = &*inner;
                let probe = || probe::probe(i, u.clone());
                wait::keep_probing(&i.wait, &i.pool, &u, slot, probe, Probed::describe, backoff)
                    .await;
                settle(i);
            });
        }
        if let Some(h) = &inner.head {
            let (slot, u) = (inner.pool.upstreams.len(), h.upstreams[0].clone());
            let inner = inner.clone();
            runtime.spawn(async move {
                let i = &*inner;
                let Some(h) = &i.head else { return };
                let probe = || head::probe(i, h, u.clone());
                wait::keep_probing(&i.wait, h, &u, slot, probe, HeadProbed::describe, backoff)
                    .await;
                settle(i);
            });
        }
        if let Some(l) = limit.filter(|l| *l > 0.0) {
            let inner = inner.clone();
            runtime.spawn(async move {
                wait::give_up_after(&inner.wait, l, || inner.settled.get().is_some()).await
            });
        }
        runtime.spawn(health_loop(inner.clone()));
        Ok(VllmEngine {
            inner,
            provisional,
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> Result<&tokio::runtime::Runtime, EngineError> {
        self.runtime.as_ref().ok_or(EngineError::Stopped)
    }

    /// Counts a job in; refuses it while the gateway waits for its
    /// upstreams, and when `max_queue` are in flight.
    fn admit(&self) -> Result<DepthGuard, EngineError> {
        if self.inner.settled.get().is_none() {
            return Err(EngineError::Waiting(self.inner.wait.report().message));
        }
        let max = self.inner.options.max_queue.max(1);
        let n = self.inner.depth.fetch_add(1, Ordering::Relaxed);
        let guard = DepthGuard(self.inner.clone());
        if n >= max {
            return Err(EngineError::QueueFull(max));
        }
        Ok(guard)
    }

    /// Admits a job and runs `work` on the backend's runtime as one
    /// request of the upstreams' fair shares (`fair.rs`), counted in the
    /// queue depth until it ends.
    fn run_job(
        &self,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), EngineError> {
        let guard = self.admit()?;
        self.handle()?
            .spawn(fair::JOB.scope(fair::new_job(), async move {
                let _guard = guard;
                work.await;
            }));
        Ok(())
    }
}

/// The first probe of every upstream, at once, then of the head upstream
/// (`--upstream-wait 0`): fails when no upstream passes, or the head
/// upstream does not.
async fn first_probes(inner: &Inner) -> Result<(), String> {
    let all = inner.pool.upstreams.iter().enumerate().map(|(slot, u)| {
        let probe = probe::probe(inner, u.clone());
        async move {
            let r = wait::attempt(&inner.wait, &inner.pool, u, slot, probe, Probed::describe).await;
            if let Err(e) = &r {
                tracing::warn!("upstream {} failed its probe: {e}", u.url);
            }
            r
        }
    });
    let results = futures::future::join_all(all).await;
    if results.iter().all(|r| r.is_err()) {
        let errors: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        return Err(format!(
            "no upstream answered the start-up probe: {}",
            errors.join("; ")
        ));
    }
    if let Some(h) = &inner.head {
        let (slot, u) = (inner.pool.upstreams.len(), &h.upstreams[0]);
        let probe = head::probe(inner, h, u.clone());
        wait::attempt(&inner.wait, h, u, slot, probe, HeadProbed::describe)
            .await
            .map_err(|e| format!("the head upstream failed its probe: {e}"))?;
    }
    settle(inner);
    Ok(())
}

/// Once the first completions upstream (and the head upstream, when there
/// is one) passed its probe: chooses the padding, and the context length
/// (the smallest `max_model_len` the upstreams probed so far state) and
/// identity that [`Engine::info`] reports from then on. Nothing before.
fn settle(inner: &Inner) {
    let Ok(_once) = inner.settling.lock() else {
        return;
    };
    if inner.settled.get().is_some() {
        return;
    }
    let probed: Vec<Probed> = inner
        .pool
        .upstreams
        .iter()
        .filter_map(|u| u.probed())
        .collect();
    let Some(first) = probed.first() else { return };
    let head = match &inner.head {
        Some(h) => match h.upstreams[0].probed() {
            Some(p) => Some(p),
            None => return,
        },
        None => None,
    };
    let o = &inner.options;
    check_padding(o.pad_block, &probed);
    let context_length = probed
        .iter()
        .filter_map(|p| p.max_model_len)
        .chain(head.and_then(|h| h.max_model_len))
        .min()
        .unwrap_or(o.context_length);
    let info = ModelInfo {
        context_length,
        vocab_size: o.vocab_size,
        hidden_size: o.hidden_size,
        architecture: o.architecture.clone(),
        identity: format!("vllm:{}", first.model),
    };
    tracing::info!(
        "ready after {:.1} s: serving `{}` from {} of {} upstreams, context of {context_length} \
         tokens",
        inner.wait.waited_s(),
        first.model,
        probed.len(),
        inner.pool.upstreams.len()
    );
    let _ = inner.settled.set(Settled { info });
}

/// Says in the log how the route's padding meets the upstreams' prefix
/// caches (`docs/design/vllm.md`, "Padding"): the route pads (or not) as
/// the base and the flags say, the same on both backends, whatever the
/// upstream; a block that is no multiple of the upstream's hit unit, or a
/// cache that is off, costs time, never answers.
fn check_padding(pad_block: Option<usize>, probed: &[Probed]) {
    let caches: Vec<_> = probed.iter().filter_map(|p| p.cache.as_ref()).collect();
    let Some(first) = caches.first() else { return };
    if caches.iter().any(|c| c != first) {
        tracing::warn!(
            "the upstreams' cache configurations differ; the first's is {:?}",
            first
        );
    }
    if !first.prefix_caching {
        tracing::warn!(
            "prefix caching is off upstream: every question reads its state again (start \
             vLLM with --enable-prefix-caching)"
        );
        return;
    }
    match pad_block {
        Some(n) if n % first.hit_unit != 0 => tracing::warn!(
            "states are padded to {n} tokens, but the upstream's prefix cache hits land on \
             multiples of {} tokens: the part of each state past its last full unit is read \
             again with every question (--pad-block {} would fit)",
            first.hit_unit,
            first.hit_unit
        ),
        Some(n) => tracing::info!(
            "states are padded to {n} tokens, a multiple of the upstream's prefix-cache unit \
             ({} tokens)",
            first.hit_unit
        ),
        None if first.hit_unit > 1 => tracing::info!(
            "states are not padded: each question reads again the part of its state past its \
             last full unit of the upstream's prefix cache (under {} tokens; --pad-block {} \
             pads, changing the prompt on both backends)",
            first.hit_unit,
            first.hit_unit
        ),
        None => {}
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
        self.inner
            .settled
            .get()
            .map_or(&self.provisional, |s| &s.info)
    }

    fn status(&self) -> EngineStatus {
        if let Some(why) = self.inner.wait.gave_up() {
            return EngineStatus::Failed(why);
        }
        if self.inner.settled.get().is_none() {
            return EngineStatus::Waiting(self.inner.wait.report());
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
        let (events, rx) = mpsc::channel(64);
        let inner = self.inner.clone();
        self.run_job(async move {
            let work = generate::generate(&inner, &request, &events);
            if let Some(Err(e)) = unless_left(&inner.options.metrics, work, events.closed()).await {
                let _ = events.send(Err(e)).await;
            }
        })?;
        Ok(rx)
    }

    fn score(&self, request: ScoreRequest) -> Result<ScoreReceiver, EngineError> {
        let (mut reply, rx) = oneshot::channel();
        let inner = self.inner.clone();
        self.run_job(async move {
            let work = score(&inner, &request);
            let scored = unless_left(&inner.options.metrics, work, reply.closed()).await;
            if let Some(scored) = scored {
                let _ = reply.send(scored);
            }
        })?;
        Ok(rx)
    }

    fn hidden_layers(&self) -> Option<usize> {
        // The final norm's output only: a pooling server taps no block.
        self.inner.head.as_ref().map(|_| 0)
    }

    fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedReceiver, EngineError> {
        head::head_pool(&self.inner, "embeddings")?;
        let (mut reply, rx) = oneshot::channel();
        let inner = self.inner.clone();
        self.run_job(async move {
            let fan_out = inner.options.limits.fan_out.max(1);
            let all = inputs.into_iter().map(|ids| {
                let inner = inner.clone();
                async move {
                    let mut h = Sha256::new();
                    for id in &ids {
                        h.update(id.to_le_bytes());
                    }
                    let key: [u8; 32] = h.finalize().into();
                    head::hidden(&inner, &key, &ids).await
                }
            });
            let work = futures::stream::iter(all)
                .buffered(fan_out)
                .collect::<Vec<_>>()
                .map(|all| all.into_iter().collect());
            if let Some(all) = unless_left(&inner.options.metrics, work, reply.closed()).await {
                let _ = reply.send(all);
            }
        })?;
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
            name: "vLLM",
            image_refusal: self.inner.image_refusal(),
            embeddings: self.inner.head.is_some(),
            hidden_hint: if self.inner.head.is_some() {
                ""
            } else {
                NO_HEAD_HINT
            },
        }
    }

    fn chat_passthrough(&self, body: serde_json::Value) -> Result<ChatReceiver, EngineError> {
        let (mut reply, rx) = oneshot::channel();
        let inner = self.inner.clone();
        self.run_job(async move {
            let work = generate::chat_passthrough(&inner, body);
            if let Some(answer) = unless_left(&inner.options.metrics, work, reply.closed()).await {
                let _ = reply.send(answer);
            }
        })?;
        Ok(rx)
    }
}

/// Health checks every `--health-interval`, of the completions upstreams
/// and the head upstream alike ([`Pool::check_health`]), each re-probed by
/// its own probe when ejected.
async fn health_loop(inner: Arc<Inner>) {
    let interval = secs(inner.options.limits.health_interval_s);
    loop {
        tokio::time::sleep(interval).await;
        let completions = inner.pool.check_health(|u| probe::probe(&inner, u));
        let head = async {
            if let Some(h) = &inner.head {
                h.check_health(|u| head::probe(&inner, h, u)).await;
            }
        };
        futures::future::join(completions, head).await;
    }
}
