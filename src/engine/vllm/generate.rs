//! Generation on the vLLM backend: a completion forwarded as one token-id
//! completion (its events sent once the upstream answers), and chat
//! completions with images forwarded to the upstream's chat route.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::probe::{neutral_sampling, Probed};
use super::protocol::{token_id, CompletionRequest, CompletionResponse};
use super::{secs, Inner};
use crate::engine::{EngineError, FinishReason, GenerateEvent, GenerateRequest, TokenLogprobs};

/// A chat completion with image parts, sent to an upstream's
/// `/v1/chat/completions` with the upstream's model name and the sampling
/// fields it would otherwise take from the model's generation_config.json
/// set to their neutral values; routed by a SHA-256 of the body among the
/// upstreams that took the probe's image, so the same request reaches the
/// same replica.
pub async fn chat_passthrough(
    inner: &Inner,
    body: serde_json::Value,
) -> Result<serde_json::Value, EngineError> {
    let key: [u8; 32] = Sha256::digest(body.to_string().as_bytes()).into();
    let timeout = secs(inner.options.limits.generate_timeout_s);
    let (_, answer): (Probed, serde_json::Value) = inner
        .pool
        .call_routed_where(
            &key,
            "/v1/chat/completions",
            timeout,
            // Rendered upstream: its tokens are not known here.
            1,
            |p| p.image_refusal.is_none(),
            |p| {
                let mut b = body.clone();
                b["model"] = serde_json::Value::String(p.model.clone());
                neutral_sampling(&mut b);
                b
            },
        )
        .await?;
    Ok(answer)
}

/// Alternatives at one position: the named ids in order, or the top `k`
/// without the token itself when it came on top of them.
fn alternatives(
    map: Option<&HashMap<String, f64>>,
    token: u32,
    k: usize,
    named: &[u32],
) -> Vec<(u32, f32)> {
    let Some(map) = map else { return Vec::new() };
    let by_id: HashMap<u32, f32> = map
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
pub async fn generate(
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
    let weight = request.prompt.len() + request.max_tokens;
    let (_, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(&key, "/v1/completions", timeout, weight, |p| {
            CompletionRequest {
                temperature: Some(request.sampling.temperature),
                top_p: Some(request.sampling.top_p),
                // The request's signed seed, carried as its bits (src/http/sampling.rs).
                seed: request.sampling.seed.map(|s| s as i64),
                // Always asked: the token names carry the generated ids.
                logprobs: Some(k.max(request.prompt_logprobs.unwrap_or(0))),
                echo,
                logprob_token_ids: (!request.logprob_token_ids.is_empty())
                    .then(|| request.logprob_token_ids.clone()),
                ignore_eos: request.stop_token_ids.is_empty(),
                ..CompletionRequest::new(&p.model, request.prompt.clone(), request.max_tokens)
            }
        })
        .await?;
    let choice = response
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| EngineError::Upstream("the completion has no choices".into()))?;
    let lp = choice.logprobs.unwrap_or_default();
    let n = lp.tokens.len();
    let ids = lp.token_ids().map_err(EngineError::Upstream)?;
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
        let logprobs = request
            .logprobs
            .and_then(|k| entry(i, &request.logprob_token_ids, k));
        // vLLM lists the stop token that ended its generation among the
        // generated tokens (and counts it), without its text: passed on so.
        if request.stop_token_ids.contains(&id) {
            if events
                .send(Ok(GenerateEvent::StopToken { id, logprobs }))
                .await
                .is_ok()
            {
                let _ = events
                    .send(Ok(GenerateEvent::Finished(FinishReason::Stop)))
                    .await;
            }
            return Ok(());
        }
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
    use crate::engine::vllm::protocol::first_position;

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
    fn a_completion_without_logprobs_is_an_error() {
        let r: CompletionResponse =
            serde_json::from_str(r#"{"choices": [{"text": "x", "logprobs": null}]}"#).unwrap();
        assert!(first_position(&r).is_err());
    }
}
