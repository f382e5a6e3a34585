//! Reading a question's option letters from a completions upstream: one
//! completion of one token asking for the letters by the probed method,
//! and, with a top-k upstream, echoes of the letters outside the top k in
//! a bounded number of list requests. Both ways of asking questions
//! (`letters`, `packed`) read their letters here.

use std::collections::HashMap;

use super::probe::Probed;
use super::protocol::{
    by_prompt, cached_tokens, first_position, letter_request, state_found, token_id,
    CompletionRequest, CompletionResponse, Prompt, MAX_LOGPROB_TOKEN_IDS,
};
use super::{score_timeout, Inner, LetterMethod};
use crate::engine::EngineError;

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
    // By token ids, at most vLLM's limit of ids a request
    // (`MAX_LOGPROB_TOKEN_IDS`): the first request asks for the first ones,
    // and the rest (a System One choice of up to 255 options) follow in
    // requests of their own on the same prompt, each id's log-probability
    // being over the whole vocabulary whichever request reads it.
    let ask = |letters: Vec<u32>| {
        inner.pool.call_routed(
            key,
            "/v1/completions",
            score_timeout(inner),
            prompt.len(),
            move |p| {
                let letters = match p.method {
                    LetterMethod::TokenIds => &letters[..letters.len().min(MAX_LOGPROB_TOKEN_IDS)],
                    _ => &letters[..],
                };
                letter_request(
                    p.method,
                    CompletionRequest::greedy(&p.model, prompt.to_vec(), 1),
                    letters,
                )
            },
        )
    };
    let (probed, response): (Probed, CompletionResponse) = ask(read.to_vec()).await?;
    let found_state = state_found(
        cached_tokens(response.usage.as_ref()),
        state,
        prompt.len(),
        probed.hit_unit(),
    );
    let mut found = first_position(&response).map_err(|m| EngineError::Upstream(m.to_string()))?;
    if probed.method == LetterMethod::TokenIds {
        let rest = read
            .iter()
            .skip(MAX_LOGPROB_TOKEN_IDS)
            .copied()
            .collect::<Vec<_>>();
        let more = rest.chunks(MAX_LOGPROB_TOKEN_IDS).map(|c| ask(c.to_vec()));
        for (_, r) in futures::future::try_join_all(more).await? {
            found.extend(first_position(&r).map_err(|m| EngineError::Upstream(m.to_string()))?);
        }
    }
    let out = letters_at(inner, key, &probed, &found, read, || prompt.to_vec(), "").await?;
    Ok((out, found_state))
}

/// The log-probabilities of `letters` after `prompt`, each from an echo of
/// `prompt ++ [letter]` (the letter's prompt log-probability): the echoes go
/// as list requests of at most `--batch-prompts` prompts and
/// `--batch-tokens` prompt tokens each, so a choice of 255 options costs a
/// few requests, not 254. vLLM reads such prompts whole, without its prefix
/// cache (`skip_reading_prefix_cache` is set for prompt log-probabilities,
/// vllm/sampling_params.py).
async fn echo_letters(
    inner: &Inner,
    key: &[u8],
    prompt: &[u32],
    letters: &[u32],
) -> Result<Vec<f32>, EngineError> {
    let limits = &inner.options.limits;
    let at = prompt.len();
    // Echoes read the whole prompt each (no prefix cache): as many a call
    // as fit the list bound and what may run beside other requests' calls.
    let room = inner
        .pool
        .fair_budget()
        .map_or(limits.batch_tokens, |b| b.min(limits.batch_tokens));
    let per_request = (room / (at + 1)).clamp(1, limits.batch_prompts.max(1));
    let echo = |letters: &[u32]| {
        let prompts: Vec<Vec<u32>> = letters
            .iter()
            .map(|&l| prompt.iter().copied().chain([l]).collect())
            .collect();
        let n = prompts.len();
        let weight = n * (at + 1);
        async move {
            let (_, response): (Probed, CompletionResponse) = inner
                .pool
                .call_routed(key, "/v1/completions", score_timeout(inner), weight, |p| {
                    CompletionRequest {
                        logprobs: Some(0),
                        echo: true,
                        ..CompletionRequest::new(&p.model, Prompt::list(prompts.clone()), 0)
                    }
                })
                .await?;
            let order = by_prompt(&response, n).map_err(EngineError::Upstream)?;
            Ok::<_, EngineError>((response, order))
        }
    };
    let mut out = Vec::with_capacity(letters.len());
    for (chunk, answered) in letters
        .chunks(per_request)
        .zip(futures::future::try_join_all(letters.chunks(per_request).map(echo)).await?)
    {
        let (response, order) = answered;
        for (&letter, &c) in chunk.iter().zip(&order) {
            let lp = response.choices[c]
                .logprobs
                .as_ref()
                .filter(|l| l.tokens.get(at).and_then(|t| token_id(t)) == Some(letter))
                .and_then(|l| l.token_logprobs.get(at).copied().flatten());
            out.push(lp.map(|v| v as f32).ok_or_else(|| {
                EngineError::Upstream(format!(
                    "the echo of the prompt did not return the log-probability of letter \
                     token {letter}"
                ))
            })?);
        }
    }
    Ok(out)
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
    let letters: Vec<u32> = missing.iter().map(|&i| read[i]).collect();
    let values = echo_letters(inner, key, &prompt, &letters).await?;
    for (&i, v) in missing.iter().zip(values) {
        out[i] = v;
    }
    Ok(out)
}
