//! Decisions on the vLLM backend: each question one completion of one
//! token whose option letters' log-probabilities are read by the probed
//! method, the state first prefilled alone in warm mode, and whether the
//! state was found in the upstream's prefix cache.

use std::collections::HashMap;
use std::time::Instant;

use futures::StreamExt;

use super::head;
use super::probe::{first_position, Probed};
use super::protocol::{token_id, CompletionRequest, CompletionResponse, Usage};
use super::{score_timeout, Inner, LetterMethod};
use crate::engine::{
    EngineError, MultiQuestion, QuestionScore, QuestionTokens, ScoreRequest, ScoreResult,
};

/// `base` asking for the log-probabilities of `letters` at its first
/// generated position, by `method` (the top-k method asks for its `k`).
pub fn letter_request(
    method: LetterMethod,
    base: CompletionRequest,
    letters: &[u32],
) -> CompletionRequest {
    match method {
        LetterMethod::TokenIds => CompletionRequest {
            logprobs: Some(1),
            logprob_token_ids: Some(letters.to_vec()),
            ..base
        },
        LetterMethod::AllowedTokens => CompletionRequest {
            logprobs: Some(letters.len()),
            allowed_token_ids: Some(letters.to_vec()),
            ..base
        },
        LetterMethod::TopK { k } => CompletionRequest {
            logprobs: Some(k),
            ..base
        },
    }
}

/// The upstream's count of cached prompt tokens, where it reports one
/// (vLLM with `--enable-prompt-tokens-details`).
pub fn cached_tokens(usage: Option<&Usage>) -> Option<usize> {
    usage
        .and_then(|u| u.prompt_tokens_details.as_ref())
        .and_then(|d| d.cached_tokens)
}

/// Whether a state of `state` tokens, the start of a prompt of `prompt`
/// tokens, was found in the upstream's prefix cache, from `cached`, the
/// upstream's count of cached prompt tokens. vLLM never counts the whole
/// prompt: a hit is at most the prompt less its last token, in whole units
/// of `unit` tokens (`max_cache_hit_length = request.num_tokens - 1` in
/// vllm/v1/core/kv_cache_manager.py; whole blocks in
/// single_type_kv_cache_manager.py). So the state was found when the count
/// reaches the most vLLM can report of it; a state shorter than that
/// reports nothing either way and counts as read.
pub fn state_found(cached: Option<usize>, state: usize, prompt: usize, unit: usize) -> bool {
    let unit = unit.max(1);
    let most = state.min(prompt.saturating_sub(1)) / unit * unit;
    most > 0 && cached.is_some_and(|c| c >= most)
}

/// The unit of an upstream's cache hits: its cache configuration's, else a
/// token (an upstream that states none, such as a decisio gateway, counts
/// hits exactly).
pub fn hit_unit(probed: &Probed) -> usize {
    probed.cache.as_ref().map_or(1, |c| c.hit_unit)
}

/// One question's letters, read from the upstream that holds its state.
/// Returns the letters' log-probabilities (in `read` order) and whether the
/// first `state` tokens of the prompt were found cached.
pub async fn read_letters(
    inner: &Inner,
    key: &[u8],
    prompt: &[u32],
    read: &[u32],
    state: usize,
) -> Result<(Vec<f32>, bool), EngineError> {
    let (probed, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(key, "/v1/completions", score_timeout(inner), |p| {
            letter_request(
                p.method,
                CompletionRequest::greedy(&p.model, prompt.to_vec(), 1),
                read,
            )
        })
        .await?;
    let found_state = state_found(
        cached_tokens(response.usage.as_ref()),
        state,
        prompt.len(),
        hit_unit(&probed),
    );
    let found = first_position(&response).map_err(|m| EngineError::Upstream(m.to_string()))?;
    let out = letters_at(inner, key, &probed, &found, read, || prompt.to_vec(), "").await?;
    Ok((out, found_state))
}

/// The log-probability of `letter` after `prompt`, from an echo of
/// `prompt ++ [letter]` (the letter's prompt log-probability). vLLM reads
/// such a prompt whole, without its prefix cache (`skip_reading_prefix_cache`
/// is set for prompt log-probabilities, vllm/sampling_params.py).
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
                logprobs: Some(0),
                echo: true,
                ..CompletionRequest::new(&p.model, ids.clone(), 0)
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
/// (or a decisio upstream's kept prompts) holds the state. Returns whether
/// the state was found there already.
async fn prefill_state(inner: &Inner, key: &[u8], prefix: &[u32]) -> Result<bool, EngineError> {
    let (probed, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(key, "/v1/completions", score_timeout(inner), |p| {
            CompletionRequest::greedy(&p.model, prefix.to_vec(), 1)
        })
        .await?;
    Ok(state_found(
        cached_tokens(response.usage.as_ref()),
        prefix.len(),
        prefix.len(),
        hit_unit(&probed),
    ))
}

/// A decision's questions on one state, by the request's multi-question
/// mode (packed questions in [`super::packed`]).
pub async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    if request.hidden {
        head::head_pool(inner, "hidden states")?;
        if let Some(layer) = request.hidden_layer {
            return Err(EngineError::Model(format!(
                "the vLLM backend's head upstream returns the final norm's output only, not \
                 block {layer}'s"
            )));
        }
    }
    if request.mode == MultiQuestion::Packed {
        return super::packed::score(inner, request).await;
    }
    let key = request.state.0;
    let state = request.prefix.len();
    // The head upstream embeds the state alone first, so that each
    // question's embedding continues it (its prefix cache), as a decision's
    // question continues its state.
    let head_warm = async {
        if request.hidden && !request.prefix.is_empty() {
            head::hidden(inner, &key, &request.prefix).await?;
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
                    head::hidden(inner, &key, &prompt).await.map(Some)
                } else {
                    Ok(None)
                }
            };
            let ((lps, found), hidden) =
                futures::future::try_join(read_letters(inner, &key, &prompt, &read, state), hidden)
                    .await?;
            Ok::<_, EngineError>((
                QuestionScore {
                    logits: lps.clone(),
                    logprobs: lps,
                    hidden,
                    seconds: started.elapsed().as_secs_f64(),
                    memoised: false,
                },
                found,
            ))
        }
    };
    let fan_out = inner.options.limits.fan_out.max(1);
    let mut results = Vec::with_capacity(request.questions.len());
    // The state-only request of warm mode: whether it found the state
    // cached, and when it was sent.
    let mut warmed: Option<(bool, Instant)> = None;
    if request.mode == MultiQuestion::Warm && request.questions.len() > 1 && state > 0 {
        // One request prefills the state alone; then every question finds
        // it cached and they all go out at once.
        let started = Instant::now();
        let (found, ()) =
            futures::future::try_join(prefill_state(inner, &key, &request.prefix), head_warm)
                .await?;
        warmed = Some((found, started));
        let all: Vec<_> = futures::stream::iter(request.questions.iter().map(one))
            .buffered(fan_out)
            .collect()
            .await;
        for r in all {
            results.push(r?);
        }
    } else {
        head_warm.await?;
        let mut questions = request.questions.iter();
        // The first question carries the state.
        if let Some(first) = questions.next() {
            results.push(one(first).await?);
        }
        let parallel = if request.mode == MultiQuestion::Warm {
            fan_out
        } else {
            1
        };
        let rest: Vec<_> = futures::stream::iter(questions.map(one))
            .buffered(parallel)
            .collect()
            .await;
        for r in rest {
            results.push(r?);
        }
    }
    let cached = match warmed {
        Some((found, _)) => found,
        None => results.first().is_some_and(|(_, found)| *found),
    };
    // Recorded only where the state was read: a state found cached was not.
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

/// The log-probabilities of the letters `read` among `found`, the
/// alternatives one position returned. With a top-k upstream a letter
/// outside the top k is read by an echo of `prompt()`, the prompt that
/// position saw; with any other method a missing letter is an error (never
/// a zero), naming the position (`at`).
pub async fn letters_at(
    inner: &Inner,
    key: &[u8],
    probed: &Probed,
    found: &HashMap<u32, f64>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_found_when_the_count_reaches_what_vllm_can_report() {
        // A 32-token state alone, blocks of 16: vLLM reports at most 16.
        assert!(state_found(Some(16), 32, 32, 16));
        assert!(!state_found(Some(0), 32, 32, 16));
        // The same state under a question: up to 32 of it.
        assert!(state_found(Some(32), 32, 40, 16));
        assert!(!state_found(Some(16), 32, 40, 16));
        // A state of 40 tokens reports its two full blocks.
        assert!(state_found(Some(32), 40, 48, 16));
        // A hybrid model's 1,056-token unit: a 3,000-token state, found.
        assert!(state_found(Some(2112), 3000, 3000, 1056));
        // Shorter than one unit: nothing is ever reported; read.
        assert!(!state_found(Some(0), 10, 10, 16));
        // No count reported.
        assert!(!state_found(None, 32, 40, 16));
        // An exact counter (a decisio gateway), unit 1.
        assert!(state_found(Some(39), 40, 40, 1));
    }
}
