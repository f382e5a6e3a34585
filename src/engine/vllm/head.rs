//! The head upstream: a pooling server (last-token pooling, not
//! normalised) whose `/v1/embeddings` of token ids are the model's hidden
//! states, for intent tasks and embeddings (`--head-upstream`).

use std::sync::Arc;

use super::pool::{Pool, Upstream, UpstreamError};
use super::protocol::{EmbeddingRequest, EmbeddingResponse, ModelList};
use super::{score_timeout, secs, Inner};
use crate::engine::EngineError;

/// What the probe learned about the head upstream.
#[derive(Clone, Debug)]
pub struct HeadProbed {
    /// The model name it serves (sent as `model`).
    pub model: String,
    pub max_model_len: Option<usize>,
    /// The width of its embeddings.
    pub hidden_size: usize,
}

impl HeadProbed {
    /// What the head upstream's probe found, for the log.
    pub fn describe(&self) -> String {
        format!(
            "serves `{}`, embeddings of {} values (last-token hidden states, not normalised), \
             max_model_len {}",
            self.model,
            self.hidden_size,
            self.max_model_len
                .map_or("unknown".into(), |n| n.to_string()),
        )
    }
}

/// What makes the vLLM backend return hidden states.
pub const NO_HEAD_HINT: &str = " (start the gateway with --head-upstream URL, a pooling server \
     whose /v1/embeddings are the model's last-token hidden states, to serve them)";

/// The head pool, or the refusal of what needs it.
pub fn head_pool<'a>(inner: &'a Inner, what: &str) -> Result<&'a Pool<HeadProbed>, EngineError> {
    inner.head.as_ref().ok_or_else(|| {
        EngineError::Unsupported(format!(
            "{what} are not served by the vLLM backend without a head upstream{NO_HEAD_HINT}"
        ))
    })
}

/// Asks the head upstream what it serves and checks its embeddings: as
/// wide as the prompt side's hidden size, finite, and not normalised (a
/// vector of norm 1 is a pooler that normalises, which no head was fitted
/// on).
pub async fn probe(
    inner: &Inner,
    pool: &Pool<HeadProbed>,
    u: Arc<Upstream<HeadProbed>>,
) -> Result<HeadProbed, UpstreamError> {
    let o = &inner.options;
    let timeout = secs(o.limits.probe_timeout_s);
    let invalid = |message: String| UpstreamError::Invalid {
        url: u.url.clone(),
        message,
    };
    let models: ModelList = pool.call(&u, "/v1/models", None::<&()>, timeout).await?;
    let card = models.card(o.model.as_deref(), false).map_err(invalid)?;
    let body = EmbeddingRequest {
        model: card.id.clone(),
        input: vec![o.letter_ids[0], o.letter_ids[1]],
        encoding_format: "base64",
    };
    let r: EmbeddingResponse = pool
        .call(&u, "/v1/embeddings", Some(&body), timeout)
        .await?;
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
    Ok(HeadProbed {
        model: card.id,
        max_model_len: card.max_model_len,
        hidden_size: v.len(),
    })
}

/// The hidden state at the last of `ids`: the head upstream's embedding of
/// them, exactly as sent (base64 float32).
pub async fn hidden(inner: &Inner, key: &[u8], ids: &[u32]) -> Result<Vec<f32>, EngineError> {
    let head = head_pool(inner, "hidden states")?;
    let (probed, response): (HeadProbed, EmbeddingResponse) = head
        .call_routed(
            key,
            "/v1/embeddings",
            score_timeout(inner),
            ids.len(),
            |p| EmbeddingRequest {
                model: p.model.clone(),
                input: ids.to_vec(),
                encoding_format: "base64",
            },
        )
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
    if probed.hidden_size != v.len() {
        return Err(EngineError::Upstream(format!(
            "head upstream {url} answered an embedding of {} values; it was probed with {}",
            v.len(),
            probed.hidden_size
        )));
    }
    Ok(v)
}
