//! What each completions upstream serves and how to ask it, learned at
//! start and again whenever an ejected upstream answers its health check:
//! the model (`GET /v1/models`), the letter-reading method (one trial
//! completion per method, in order of preference), whether it takes images
//! (one small chat completion with an image), and its prefix cache's block
//! (`GET /metrics`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::pool::{Fault, Upstream, UpstreamError};
use super::protocol::{
    self, cache_info, first_position, letter_request, CacheInfo, CompletionRequest,
    CompletionResponse, ModelList, NeutralSampling,
};
use super::{secs, Inner, LetterMethod, MethodChoice};
use crate::stats::log_sum_exp;

/// What the probe learned about one completions upstream.
#[derive(Clone, Debug)]
pub struct Probed {
    /// The model name it serves (sent as `model`).
    pub model: String,
    pub max_model_len: Option<usize>,
    /// How option letters are read.
    pub method: LetterMethod,
    /// Its prefix cache, where its `/metrics` says (`vllm:cache_config_info`).
    pub cache: Option<CacheInfo>,
    /// Why chat completions with images are refused (its own answer to the
    /// probe's image), or `None` where they are served.
    pub image_refusal: Option<String>,
}

impl Probed {
    /// The unit of its cache hits: its cache configuration's, else a token
    /// (an upstream that states none, such as a decisio gateway, counts
    /// hits exactly).
    pub fn hit_unit(&self) -> usize {
        self.cache.as_ref().map_or(1, |c| c.hit_unit)
    }

    /// What a completions upstream's probe found, for the log.
    pub fn describe(&self) -> String {
        format!(
            "serves `{}`, max_model_len {}, letters read by {}, {}, {}",
            self.model,
            self.max_model_len
                .map_or("unknown".into(), |n| n.to_string()),
            self.method,
            match &self.image_refusal {
                None => "takes images".to_string(),
                Some(why) => format!("takes no images ({why})"),
            },
            match &self.cache {
                Some(c) => format!(
                    "prefix caching {}, blocks of {} tokens, hits in units of {}{}",
                    if c.prefix_caching { "on" } else { "off" },
                    c.block_size,
                    c.hit_unit,
                    c.mamba_cache_mode
                        .as_ref()
                        .map_or(String::new(), |m| format!(", mamba cache mode {m}"))
                ),
                None => "no cache configuration on /metrics".to_string(),
            }
        )
    }
}

/// A 64×64 grey PNG: the probe's image, as a data URL.
const PROBE_IMAGE: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAEAAAABACAAAAACPAi4CAAAAKUlEQVR42u3MQREAAAwCIKMb3RD77SAA6VEEAoFAIBAIBAKBQCAQfA8G320AeXC6efoAAAAASUVORK5CYII=";

/// Asks an upstream what it serves and how it reads letters.
pub async fn probe(inner: &Inner, u: Arc<Upstream<Probed>>) -> Result<Probed, UpstreamError> {
    let pool = &inner.pool;
    let o = &inner.options;
    let timeout = secs(o.limits.probe_timeout_s);
    let models: ModelList = pool.call(&u, "/v1/models", None::<&()>, timeout).await?;
    let card = models
        .card(o.model.as_deref(), true)
        .map_err(|message| UpstreamError::Invalid {
            url: u.url.clone(),
            message,
        })?;
    let model = card.id.clone();
    let letters = &o.letter_ids;
    let base = CompletionRequest::greedy(&model, vec![letters[0], letters[1]], 1);
    let candidates: &[LetterMethod] = match o.method {
        MethodChoice::Auto => &[
            LetterMethod::TokenIds,
            LetterMethod::AllowedTokens,
            LetterMethod::TopK { k: 0 },
        ],
        MethodChoice::TokenIds => &[LetterMethod::TokenIds],
        MethodChoice::AllowedTokens => &[LetterMethod::AllowedTokens],
        MethodChoice::TopK => &[LetterMethod::TopK { k: 0 }],
    };
    let mut notes = Vec::new();
    let mut method = None;
    for &candidate in candidates {
        match try_method(inner, &u, &base, candidate, timeout).await? {
            Ok(m) => {
                method = Some(m);
                break;
            }
            Err(note) => notes.push(note),
        }
    }
    let Some(method) = method else {
        return Err(UpstreamError::Invalid {
            url: u.url.clone(),
            message: format!(
                "it does not honour the chosen letter method: {}",
                notes.join("; ")
            ),
        });
    };
    if !notes.is_empty() {
        tracing::info!("upstream {}: {}", u.url, notes.join("; "));
    }
    let image_refusal = images(inner, &u, &model, timeout).await?;
    let cache = match pool.get_text(&u, "/metrics", timeout).await {
        Ok(text) => cache_info(&text),
        Err(e) if e.fault() == Fault::Request => None,
        Err(e) => return Err(e),
    };
    Ok(Probed {
        model,
        max_model_len: card.max_model_len,
        method,
        cache,
        image_refusal,
    })
}

/// One letter method tried on the probe's prompt: `Ok(Ok(method))` when
/// the upstream honours it (the top-k method with the cap its refusal of
/// too many states), `Ok(Err(why not))` when it does not.
async fn try_method(
    inner: &Inner,
    u: &Upstream<Probed>,
    base: &CompletionRequest,
    method: LetterMethod,
    timeout: Duration,
) -> Result<Result<LetterMethod, String>, UpstreamError> {
    let o = &inner.options;
    let letters = &o.letter_ids;
    let body = match method {
        // Ask for more than any cap: the refusal states the cap.
        LetterMethod::TopK { .. } => CompletionRequest {
            logprobs: Some(o.vocab_size + 1),
            ..base.clone()
        },
        m => letter_request(m, base.clone(), letters),
    };
    let answer = inner
        .pool
        .call::<_, CompletionResponse>(u, "/v1/completions", Some(&body), timeout)
        .await;
    let refused = |e: &UpstreamError| {
        matches!(
            e,
            UpstreamError::Status {
                status: 400..=499,
                ..
            }
        )
    };
    Ok(match (method, answer) {
        (LetterMethod::TopK { .. }, Ok(_)) => Ok(LetterMethod::TopK { k: o.vocab_size }),
        (
            LetterMethod::TopK { .. },
            Err(UpstreamError::Status {
                status: 400,
                message,
                ..
            }),
        ) => {
            let cap = protocol::logprobs_cap(&message).ok_or_else(|| UpstreamError::Invalid {
                url: u.url.clone(),
                message: format!("its refusal of many logprobs states no cap: {message}"),
            })?;
            Ok(LetterMethod::TopK {
                k: cap.min(o.vocab_size),
            })
        }
        (m, Ok(r)) if every_letter(&r, letters, m == LetterMethod::AllowedTokens) => Ok(m),
        (LetterMethod::TokenIds, Ok(_)) => Err("logprob_token_ids is ignored".to_string()),
        (LetterMethod::AllowedTokens, Ok(_)) => Err(
            "allowed_token_ids does not give processed log-probabilities (start vLLM with \
             --logprobs-mode processed_logprobs for it)"
                .to_string(),
        ),
        (m, Err(e)) if refused(&e) && !matches!(m, LetterMethod::TopK { .. }) => {
            Err(format!("{} is refused ({e})", method_field(m)))
        }
        (_, Err(e)) => return Err(e),
    })
}

/// The request field a method relies on, for the probe's notes.
fn method_field(m: LetterMethod) -> &'static str {
    match m {
        LetterMethod::TokenIds => "logprob_token_ids",
        LetterMethod::AllowedTokens => "allowed_token_ids",
        LetterMethod::TopK { .. } => "logprobs",
    }
}

/// Whether the answer's first position holds every letter (and, for
/// processed log-probabilities over the letters alone, sums to one).
fn every_letter(r: &CompletionResponse, letters: &[u32], normalised: bool) -> bool {
    let Ok(found) = first_position(r) else {
        return false;
    };
    let got: Vec<f64> = letters
        .iter()
        .filter_map(|l| found.get(l).copied())
        .collect();
    got.len() == letters.len() && (!normalised || log_sum_exp(&got).abs() < 1e-3)
}

/// Whether the upstream takes images in chat completions: `None` when it
/// answers the probe's image, else its refusal (a text-only vLLM answers
/// "<model> is not a multimodal model", vllm/multimodal/registry.py).
async fn images(
    inner: &Inner,
    u: &Upstream<Probed>,
    model: &str,
    timeout: Duration,
) -> Result<Option<String>, UpstreamError> {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": PROBE_IMAGE}},
            {"type": "text", "text": "?"},
        ]}],
        "max_tokens": 1,
        "temperature": 0.0,
    });
    neutral_sampling(&mut body);
    match inner
        .pool
        .call::<_, serde_json::Value>(u, "/v1/chat/completions", Some(&body), timeout)
        .await
    {
        Ok(_) => Ok(None),
        Err(e) if e.fault() == Fault::Request => Ok(Some(match e {
            UpstreamError::Status {
                status, message, ..
            } => format!("{status}: {message}"),
            other => other.to_string(),
        })),
        Err(e) => Err(e),
    }
}

/// Sets every sampling field of [`NeutralSampling`] a chat body lacks.
pub fn neutral_sampling(body: &mut serde_json::Value) {
    let Ok(serde_json::Value::Object(neutral)) = serde_json::to_value(NeutralSampling::VALUES)
    else {
        return;
    };
    if let Some(o) = body.as_object_mut() {
        for (k, v) in neutral {
            o.entry(k).or_insert(v);
        }
    }
}
