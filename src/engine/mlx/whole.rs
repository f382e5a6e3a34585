//! Jobs the engine thread runs whole when their turn comes: completions
//! (with their prompts' log-probabilities) and embeddings, each continuing
//! a kept prompt as a decision's question continues its state.

use std::sync::Arc;

use mlx_rs::{ops, Array};
use tokio::sync::mpsc;

use super::cache::ModelCache;
use super::error::{MlxError, MlxResult};
use super::fault;
use super::kept::{prompt_key, Kept, Snapshot};
use super::model::MlxModel;
use super::options::MlxOptions;
use super::sample::{self, Rng};
use crate::engine::{EngineError, FinishReason, GenerateEvent, GenerateRequest, TokenLogprobs};

/// The hidden states of an embedding job's inputs, in order.
pub(super) fn embed_all(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    inputs: &[Vec<u32>],
) -> Result<Vec<Vec<f32>>, EngineError> {
    inputs
        .iter()
        .map(|ids| {
            let kept = Kept {
                cache: kept.cache,
                index: &mut *kept.index,
            };
            embed_one(model, options, kept, ids)
                .map_err(|e| EngineError::computation(e.to_string()))
        })
        .collect()
}

/// The final norm's output at the last position of `ids`, as float32: the
/// prompt is continued from the longest kept prompt it extends (as a
/// decision's question continues its state) or prefilled from position 0
/// and kept (as a decision prefills its state), so that the embedding of a
/// state and then of the state and a question gives the bits of the
/// decision's hidden state.
fn embed_one(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    ids: &[u32],
) -> MlxResult<Vec<f32>> {
    let (last, _) = prefill_prompt(model, options, kept, ids)?;
    let v = ops::reshape(last.as_type::<f32>()?, &[-1])?;
    v.eval()?;
    Ok(v.as_slice::<f32>().to_vec())
}

/// Copies a `[.., V]` float32 array with one row out to the host.
fn host_row(a: &Array) -> MlxResult<Vec<f32>> {
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

/// The last hidden state of `prompt` and the caches after it: the same
/// prompt kept before (as vLLM's prefix cache answers a prompt sent again:
/// a vLLM-backend gateway reads more letter ids than one request carries
/// in several requests on one prompt), else continued from the longest kept
/// prompt it extends (its rest run as a decision runs a question's suffix),
/// else prefilled from position 0 as a decision prefills a state; then kept
/// for later prompts.
fn prefill_prompt(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    prompt: &[u32],
) -> MlxResult<(Array, ModelCache)> {
    let key = prompt_key(prompt);
    if let Some(snapshot) = kept.cache.peek(&key) {
        if let Some(last) = &snapshot.last {
            tracing::debug!("completion of {} tokens: a kept prompt", prompt.len());
            return Ok((last.clone(), snapshot.cache.clone()));
        }
    }
    let continued = kept
        .index
        .prefixes_of(prompt)
        .into_iter()
        .find_map(|(len, key)| {
            let snapshot = kept.cache.peek(&key)?;
            Some((len, snapshot.cache.clone()))
        });
    let (last, cache) = match continued {
        Some((len, cache)) => {
            tracing::debug!(
                "completion of {} tokens continues a kept prompt of {len}",
                prompt.len()
            );
            // As a decision reads a question on its state.
            model.continue_state(&cache, &prompt[len..], options.prefill_chunk)?
        }
        None => {
            tracing::debug!("completion of {} tokens: no kept prompt", prompt.len());
            let mut cache = model.new_cache();
            let last = model.prefill(prompt, &mut cache, options.prefill_chunk)?;
            (last, cache)
        }
    };
    cache.eval()?;
    if kept.cache.enabled() {
        last.eval()?;
        if kept.cache.insert(
            key,
            Arc::new(Snapshot::of_prompt(cache.clone(), last.clone())),
        ) {
            kept.index.record(prompt, key);
        }
    }
    Ok((last, cache))
}

pub(super) fn generate(
    model: &MlxModel,
    options: &MlxOptions,
    kept: Kept<'_>,
    request: &GenerateRequest,
    events: &mpsc::Sender<Result<GenerateEvent, EngineError>>,
) -> MlxResult<()> {
    fault::hook();
    // An event no client takes: the generation stops, its client gone.
    let send = |e: GenerateEvent| {
        let taken = events.blocking_send(Ok(e)).is_ok();
        if !taken {
            options.metrics.abandoned_jobs.inc();
        }
        taken
    };
    let (mut hidden, mut cache) = if let Some(k) = request.prompt_logprobs {
        let mut cache = model.new_cache();
        let (last, lps) = prompt_logprobs(model, &request.prompt, &mut cache, k, options)?;
        if !send(GenerateEvent::Prompt(lps)) {
            return Ok(());
        }
        (last, cache)
    } else {
        prefill_prompt(model, options, kept, &request.prompt)?
    };
    let mut rng = request
        .sampling
        .seed
        .map_or_else(Rng::from_entropy, Rng::new);
    for step in 0..request.max_tokens {
        if events.is_closed() {
            options.metrics.abandoned_jobs.inc();
            return Ok(());
        }
        let row = host_row(&model.log_softmax(&hidden)?)?;
        let token = sample::pick(&row, &request.sampling, &mut rng);
        let logprobs = request.logprobs.map(|k| {
            if request.logprob_token_ids.is_empty() {
                sample::token_logprobs(&row, token, k)
            } else {
                sample::named_logprobs(&row, token, &request.logprob_token_ids)
            }
        });
        if request.stop_token_ids.contains(&token) {
            // A generated token like any other, as vLLM counts and lists
            // it; the route adds no text for it.
            if send(GenerateEvent::StopToken {
                id: token,
                logprobs,
            }) {
                send(GenerateEvent::Finished(FinishReason::Stop));
            }
            return Ok(());
        }
        if !send(GenerateEvent::Token {
            id: token,
            logprobs,
        }) {
            return Ok(());
        }
        if step + 1 < request.max_tokens {
            hidden = model.last_hidden(&[token], &mut cache)?;
        }
    }
    send(GenerateEvent::Finished(FinishReason::Length));
    Ok(())
}

/// Reads the prompt in chunks, recording each token's log-probability given
/// the tokens before it, and returns the last hidden state.
fn prompt_logprobs(
    model: &MlxModel,
    prompt: &[u32],
    cache: &mut ModelCache,
    k: usize,
    options: &MlxOptions,
) -> MlxResult<(Array, Vec<Option<TokenLogprobs>>)> {
    let mut out: Vec<Option<TokenLogprobs>> = vec![None];
    let mut last = None;
    let chunk = options.prefill_chunk.clamp(1, 256);
    for (c, part) in prompt.chunks(chunk).enumerate() {
        let h = model.hidden(part, cache)?;
        let lp = model.log_softmax(&h)?;
        lp.eval()?;
        let v = lp.shape()[2] as usize;
        let rows = lp.as_slice::<f32>();
        for (i, row) in rows.chunks(v).enumerate() {
            let next = c * chunk + i + 1;
            if let Some(&token) = prompt.get(next) {
                out.push(Some(sample::token_logprobs(row, token, k)));
            }
        }
        let n = h.shape()[1];
        last = Some(ops::indexing::take_axis(
            &h,
            Array::from_slice(&[n - 1], &[1]),
            1,
        )?);
        cache.eval()?;
    }
    let last = last.ok_or_else(|| MlxError::Config("an empty prompt has no next token".into()))?;
    Ok((last, out))
}
