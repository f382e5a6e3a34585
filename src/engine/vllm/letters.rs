//! Decisions on the vLLM backend whose questions are separate completions
//! (`multi_question` `sequential`): each question one completion of one
//! token whose option letters are read by the probed method
//! ([`super::reading`]), one after another, the first carrying the state;
//! and whether the state was found in the upstream's prefix cache.

use std::time::Instant;

use super::head;
use super::reading::read_letters;
use super::Inner;
use crate::engine::{EngineError, QuestionScore, ScoreRequest, ScoreResult};

/// A decision's questions on one state, each its own completion, one after
/// another.
pub async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    let key = request.state.0;
    let state = request.prefix.len();
    // The head upstream embeds the state alone first, so that each
    // question's embedding continues it (its prefix cache), as a decision's
    // question continues its state.
    if request.hidden && !request.prefix.is_empty() {
        head::hidden(inner, &key, &request.prefix).await?;
    }
    let mut results = Vec::with_capacity(request.questions.len());
    for q in &request.questions {
        let mut prompt = request.prefix.clone();
        prompt.extend_from_slice(&q.suffix);
        let started = Instant::now();
        let hidden = async {
            if request.hidden {
                head::hidden(inner, &key, &prompt).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let ((lps, found), hidden) =
            futures::future::try_join(read_letters(inner, &key, &prompt, &q.read, state), hidden)
                .await?;
        results.push((
            QuestionScore {
                logits: lps.clone(),
                logprobs: lps,
                hidden,
                seconds: started.elapsed().as_secs_f64(),
                memoised: false,
            },
            found,
        ));
    }
    // The first question carries the state.
    let cached = results.first().is_some_and(|(_, found)| *found);
    // Recorded only where the state was read: a state found cached was not.
    let new_state_seconds = (!cached).then(|| results.first().map_or(0.0, |(q, _)| q.seconds));
    if let Some(s) = new_state_seconds {
        inner.options.metrics.new_state_seconds.observe(s);
    }
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions: results.into_iter().map(|(q, _)| q).collect(),
    })
}
