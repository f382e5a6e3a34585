//! `decisio serve --backend vllm`: the upstreams' flags, and the model an
//! upstream serves when `--model` is not given.

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::{MethodArg, ModeArg};
use crate::engine::vllm::protocol::ModelList;
use crate::settings::UpstreamLimits;

/// Settings of `--backend vllm`.
#[derive(Args)]
pub(super) struct UpstreamArgs {
    /// Base URL of a vLLM server (`http://host:port`); repeat for several.
    #[arg(long = "upstream")]
    pub(super) upstreams: Vec<String>,
    /// Bearer key sent to every upstream.
    #[arg(long, env = "DECISIO_UPSTREAM_API_KEY", hide_env_values = true)]
    pub(super) upstream_api_key: Option<String>,
    /// The model name sent upstream (default: the one each upstream serves).
    #[arg(long)]
    pub(super) upstream_model: Option<String>,
    /// How the option letters' log-probabilities are read.
    #[arg(long, value_enum, default_value = "auto")]
    pub(super) letter_method: MethodArg,
    /// The default multi-question mode of the vLLM backend.
    #[arg(long, value_enum, default_value = "warm")]
    pub(super) multi_question: ModeArg,
    /// Seconds for one scoring call to an upstream.
    #[arg(long, default_value_t = UpstreamLimits::default().request_timeout_s)]
    pub(super) upstream_timeout: f64,
    /// Seconds for one generation call to an upstream.
    #[arg(long, default_value_t = UpstreamLimits::default().generate_timeout_s)]
    pub(super) upstream_generate_timeout: f64,
    /// Seconds to connect to an upstream.
    #[arg(long, default_value_t = UpstreamLimits::default().connect_timeout_s)]
    pub(super) upstream_connect_timeout: f64,
    /// Seconds for each probe call and health check.
    #[arg(long, default_value_t = UpstreamLimits::default().probe_timeout_s)]
    pub(super) upstream_probe_timeout: f64,
    /// Seconds to wait at start for an upstream (and the --head-upstream)
    /// to pass its start-up probe; meanwhile the server listens, GET
    /// /health answers 503 saying what it waits for, and the model's routes
    /// 503 with Retry-After. Each is probed again after 0.5 s, doubling to
    /// 10 s, and admitted the moment it passes. Past this the process exits
    /// with each upstream's error; 0 probes once and exits at once.
    /// Without --model, the upstream's model is asked for likewise, before
    /// the server listens. Default: wait indefinitely.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub(super) upstream_wait: Option<f64>,
    /// Seconds between health checks of each upstream.
    #[arg(long, default_value_t = UpstreamLimits::default().health_interval_s)]
    pub(super) health_interval: f64,
    /// Failures in a row that eject an upstream.
    #[arg(long, default_value_t = UpstreamLimits::default().eject_after, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) eject_after: u32,
    /// Passed health checks in a row that admit an ejected upstream again.
    #[arg(long, default_value_t = UpstreamLimits::default().readmit_after, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) readmit_after: u32,
    /// Further attempts, on the next upstream, of a call that failed with a
    /// connection error, a timeout or a 5xx.
    #[arg(long, default_value_t = UpstreamLimits::default().retries, value_parser = clap::value_parser!(u32).range(0..=16))]
    pub(super) upstream_retries: u32,
    /// First backoff before a retry, in milliseconds (doubles each time).
    #[arg(long, default_value_t = UpstreamLimits::default().backoff_ms)]
    pub(super) upstream_backoff_ms: u64,
    /// A second engine in pooling mode whose hidden states feed the heads
    /// of intent tasks (the second-engine head of the vLLM backend): its
    /// `POST /v1/embeddings` of token ids must answer the last position's
    /// final hidden state, not normalised (a vLLM pooling server with
    /// last-token pooling and normalisation off, or a decisio gateway with
    /// the MLX backend).
    #[arg(long)]
    pub(super) head_upstream: Option<String>,
    /// Upstream calls of one request in flight at once: a decision's list
    /// requests in `warm` mode (see --upstream-batch-tokens), a packed
    /// decision's re-reads, an embeddings request's inputs.
    #[arg(long, default_value_t = UpstreamLimits::default().fan_out, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub(super) fan_out: usize,
    /// The most prompt tokens one upstream request of a decision's
    /// questions carries (`warm` mode sends a state's questions as one list
    /// of prompts; the state's tokens count once per question). Over it,
    /// the questions are split into several list requests sent at once.
    #[arg(long, default_value_t = UpstreamLimits::default().batch_tokens, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(super) upstream_batch_tokens: usize,
    /// The most prompts (questions) one upstream list request carries.
    #[arg(long, default_value_t = UpstreamLimits::default().batch_prompts, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub(super) upstream_batch_prompts: usize,
    /// Seconds of work kept in flight to the upstreams, shared fairly
    /// between requests: the prompt tokens the upstreams were measured to
    /// read in that time. A call that does not fit waits, and room freed
    /// goes to the request holding the fewest tokens in flight, so a new
    /// request waits about this long behind another's many questions
    /// (docs/limits.md, "Fair scheduling"). 0 sends every call at once.
    #[arg(long, default_value_t = UpstreamLimits::default().fair_seconds, value_parser = seconds)]
    pub(super) fair_seconds: f64,
    /// The least budget of prompt tokens in flight per upstream (see
    /// --fair-seconds), and the budget before any throughput is measured.
    #[arg(long, default_value_t = UpstreamLimits::default().fair_tokens, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(super) fair_tokens: usize,
}

/// A number of seconds, 0 or more.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds (0 or more)")),
    }
}

/// The model the first upstream serves, for `--backend vllm` without
/// `--model`: the `root` of its `/v1/models` card (the one named by
/// `--upstream-model`, else the first), which vLLM sets to what its server
/// was started with, a Hugging Face repository (taken from the Hugging
/// Face cache, or downloaded) or a folder (used when this machine has it).
pub(super) fn upstream_model(u: &UpstreamArgs) -> Result<String> {
    let url = u
        .upstreams
        .first()
        .ok_or_else(|| anyhow::anyhow!("the vLLM backend needs at least one --upstream URL"))?;
    let ask = || async {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs_f64(
                u.upstream_connect_timeout,
            ))
            .timeout(std::time::Duration::from_secs_f64(u.upstream_probe_timeout))
            .build()?;
        let mut request = client.get(format!("{}/v1/models", url.trim_end_matches('/')));
        if let Some(key) = &u.upstream_api_key {
            request = request.bearer_auth(key);
        }
        request
            .send()
            .await?
            .error_for_status()?
            .json::<ModelList>()
            .await
    };
    // Asked again as the start-up probe is, while --upstream-wait lasts.
    let waiting = std::time::Instant::now();
    let limits = UpstreamLimits::default();
    let mut delay = limits.wait_first_backoff_s;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let models = loop {
        let e = match runtime.block_on(ask()) {
            Ok(models) => break Ok(models),
            Err(e) => e,
        };
        let waited = waiting.elapsed().as_secs_f64();
        if u.upstream_wait.is_some_and(|l| waited + delay > l) {
            break Err(e);
        }
        tracing::warn!(
            "upstream {url} does not say which model it serves yet ({waited:.1} s waited): {e}; \
             asked again in {delay:.1} s"
        );
        std::thread::sleep(std::time::Duration::from_secs_f64(delay));
        delay = (delay * 2.0).min(limits.wait_max_backoff_s);
    };
    let models = models.with_context(|| {
        format!(
            "asking upstream {url} which model it serves (GET /v1/models); start it first, \
                 or pass --model with the model's repository"
        )
    })?;
    let card = match &u.upstream_model {
        Some(m) => models.data.iter().find(|c| &c.id == m),
        None => models.data.first(),
    }
    .ok_or_else(|| {
        anyhow::anyhow!(
            "upstream {url} lists no model{}",
            u.upstream_model
                .as_ref()
                .map_or(String::new(), |m| format!(" named `{m}`"))
        )
    })?;
    let root = card.root.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "upstream {url}'s model card `{}` has no `root`; pass --model with the model's \
             repository",
            card.id
        )
    })?;
    if root.starts_with('/') && !Path::new(&root).is_dir() {
        bail!(
            "upstream {url} serves `{}` from the folder {root}, which this machine does not \
             have; pass --model with the model's repository or a copy of its config.json and \
             tokenizer",
            card.id
        );
    }
    tracing::info!(upstream = %url, model = %root, "the upstream's model (its /v1/models root)");
    Ok(root)
}
