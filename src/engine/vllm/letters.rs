//! Decisions on the vLLM backend whose questions are separate completions
//! (`multi_question` `sequential` or `warm`): each question one completion
//! of one token whose option letters are read by the probed method
//! ([`super::reading`]), the state first prefilled alone in warm mode, and
//! whether the state was found in the upstream's prefix cache.

use std::time::Instant;

use futures::StreamExt;

use super::head;
use super::probe::Probed;
use super::protocol::{cached_tokens, state_found, CompletionRequest, CompletionResponse};
use super::reading::read_letters;
use super::{score_timeout, Inner};
use crate::engine::{
    EngineError, MultiQuestion, QuestionScore, QuestionTokens, ScoreRequest, ScoreResult,
};

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
        probed.hit_unit(),
    ))
}

/// A decision's questions on one state, each its own completion: one after
/// another (`sequential`), or, in warm mode, the state prefilled alone
/// first and then every question at once.
pub async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
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
