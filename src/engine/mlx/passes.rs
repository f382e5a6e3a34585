//! A state's questions read in passes: the state found in the prefix
//! cache or prefilled, then its questions read together as the rows of as
//! few passes as `--pass-tokens` allows ([`score`]); and scoring jobs of
//! several clients on one state read in the same passes ([`score_group`]).
//! `docs/design/mlx-backend.md`, "One pass for a state's questions".

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::error::{MlxError, MlxResult};
use super::kept::{answer_key, PromptIndex, Snapshot};
use super::model::MlxModel;
use super::options::MlxOptions;
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::{EngineError, QuestionScore, ScoreRequest, ScoreResult};

/// Whether a scoring job can be read in the same passes as `first`: the
/// same state, read and kept alike.
pub(super) fn joins(first: &ScoreRequest, other: &ScoreRequest) -> bool {
    first.state == other.state
        && first.prefix == other.prefix
        && first.hidden == other.hidden
        && first.hidden_layer == other.hidden_layer
        && first.cache == other.cache
}

/// Scoring jobs on one state, from one client or several: their questions
/// read as one request's ([`score`]: the state once, the questions in
/// shared passes), each job answered with its own.
pub(super) fn score_group(
    model: &MlxModel,
    options: &MlxOptions,
    prefix_cache: &PrefixCache<Snapshot>,
    prompts: &mut PromptIndex,
    group: Vec<(
        ScoreRequest,
        oneshot::Sender<Result<ScoreResult, EngineError>>,
    )>,
) {
    let mut merged = group[0].0.clone();
    merged.questions = group
        .iter()
        .flat_map(|(r, _)| r.questions.iter().cloned())
        .collect();
    if group.len() > 1 {
        options.metrics.merged_jobs.inc_by(group.len() as u64 - 1);
    }
    let result = score(model, options, prefix_cache, &merged);
    if merged.cache && result.is_ok() && prefix_cache.peek(&merged.state).is_some() {
        prompts.record(&merged.prefix, merged.state);
    }
    match result {
        Ok(mut all) => {
            let mut questions = all.questions.drain(..);
            for (request, reply) in group {
                let _ = reply.send(Ok(ScoreResult {
                    cached: all.cached,
                    new_state_seconds: all.new_state_seconds,
                    questions: questions.by_ref().take(request.questions.len()).collect(),
                }));
            }
        }
        Err(e) => {
            for (_, reply) in group {
                let _ = reply.send(Err(EngineError::Model(e.to_string())));
            }
        }
    }
}

/// The state after `request.prefix`, from the prefix cache or computed (and
/// offered to the cache), then every question read on it in passes
/// ([`read_passes`]).
fn score(
    model: &MlxModel,
    options: &MlxOptions,
    prefix_cache: &PrefixCache<Snapshot>,
    request: &ScoreRequest,
) -> MlxResult<ScoreResult> {
    let found = if request.cache {
        prefix_cache.get(&request.state)
    } else {
        None
    };
    let (snapshot, cached, new_state_seconds) = match found {
        Some(snapshot) => (snapshot, true, None),
        None => {
            let started = Instant::now();
            let mut cache = model.new_cache();
            model.prefill(&request.prefix, &mut cache, options.prefill_chunk)?;
            cache.eval()?;
            // The prefill's scratch buffers go back to the system, not to
            // MLX's cache (src/engine/mlx/memory.rs).
            let _ = mlx_rs::memory::clear_cache();
            let seconds = started.elapsed().as_secs_f64();
            let room = options.answers_per_state * answer_bytes(model, request);
            let snapshot = Arc::new(Snapshot::new(cache, room));
            if request.cache {
                options.metrics.new_state_seconds.observe(seconds);
                prefix_cache.insert(request.state, snapshot.clone());
            }
            (snapshot, false, Some(seconds))
        }
    };
    let questions = read_passes(model, options, &snapshot, request)?;
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions,
    })
}

/// The questions of `request` on its state: those answered on it before
/// from its remembered answers, each other one read once (a question asked
/// twice in a request is read once), in passes of as many questions as
/// [`MlxOptions::pass_tokens`] allows, counted as rows times the longest
/// row (questions sorted by length, so rows of a pass are alike). A
/// question's `seconds` is its share of its pass.
fn read_passes(
    model: &MlxModel,
    options: &MlxOptions,
    snapshot: &Snapshot,
    request: &ScoreRequest,
) -> MlxResult<Vec<QuestionScore>> {
    let keys: Vec<[u8; 32]> = request
        .questions
        .iter()
        .map(|q| answer_key(q, request.hidden, request.hidden_layer))
        .collect();
    let mut out: Vec<Option<QuestionScore>> = vec![None; keys.len()];
    let mut todo: Vec<usize> = Vec::new();
    {
        let answers = lock(&snapshot.answers);
        for (i, key) in keys.iter().enumerate() {
            if let Some(known) = answers.get(key) {
                out[i] = Some(QuestionScore {
                    seconds: 0.0,
                    memoised: true,
                    ..known.clone()
                });
            } else if !todo.iter().any(|&j| keys[j] == *key) {
                todo.push(i);
            }
        }
    }
    todo.sort_by_key(|&i| request.questions[i].suffix.len());
    let tap = request.hidden_layer.filter(|_| request.hidden);
    for pass in plan_passes(
        &todo,
        |i| request.questions[i].suffix.len(),
        options.pass_tokens,
    ) {
        let started = Instant::now();
        let suffixes: Vec<&[u32]> = pass
            .iter()
            .map(|&i| &request.questions[i].suffix[..])
            .collect();
        let reads: Vec<&[u32]> = pass
            .iter()
            .map(|&i| &request.questions[i].read[..])
            .collect();
        let readings = model.read_questions(
            &snapshot.cache,
            &suffixes,
            &reads,
            options.prefill_chunk,
            request.hidden,
            tap,
        )?;
        options.metrics.question_passes.inc();
        let seconds = started.elapsed().as_secs_f64() / pass.len() as f64;
        let mut answers = lock(&snapshot.answers);
        for (&i, reading) in pass.iter().zip(readings) {
            let score = QuestionScore {
                logits: reading.logits,
                logprobs: reading.logprobs,
                hidden: reading.hidden,
                seconds,
                memoised: false,
            };
            if answers.len() < options.answers_per_state {
                answers.insert(keys[i], score.clone());
            }
            out[i] = Some(score);
        }
    }
    // A question asked again in the same request: the first one's scores.
    for i in 0..out.len() {
        if out[i].is_none() {
            let first = (0..i).find(|&j| keys[j] == keys[i] && out[j].is_some());
            out[i] = first
                .and_then(|j| out[j].clone())
                .map(|known| QuestionScore {
                    seconds: 0.0,
                    memoised: true,
                    ..known
                });
        }
    }
    out.into_iter()
        .map(|q| q.ok_or_else(|| MlxError::Config("a question was not read".into())))
        .collect()
}

/// Splits `items` (in order) into passes: each as many items as keep its
/// rows times its longest row within `budget` tokens (at least one item a
/// pass, so a question longer than the budget is read alone).
fn plan_passes(items: &[usize], len: impl Fn(usize) -> usize, budget: usize) -> Vec<Vec<usize>> {
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut widest = 0;
    for &i in items {
        let wider = widest.max(len(i));
        match passes.last_mut() {
            Some(pass) if (pass.len() + 1) * wider <= budget => {
                pass.push(i);
                widest = wider;
            }
            _ => {
                passes.push(vec![i]);
                widest = len(i);
            }
        }
    }
    passes
}

/// Room one remembered answer takes: the logits and log-probabilities of
/// the ids read (26 letters, or more if a request reads more), a hidden
/// state, the key and the map's own share.
fn answer_bytes(model: &MlxModel, request: &ScoreRequest) -> usize {
    let read = request
        .questions
        .iter()
        .map(|q| q.read.len())
        .max()
        .unwrap_or(0);
    read.max(26) * 8 + model.hidden_size() * 4 + 32 + 128
}

/// The guarded value, also after a panic elsewhere (the data stays valid:
/// every writer inserts whole entries).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
