//! Scoring jobs as work the engine thread interleaves: a state found in the
//! prefix cache or read chunk by chunk, then its questions read together as
//! the rows of as few passes as `--pass-tokens` allows; jobs of several
//! clients on one state join one [`Scoring`] and share its passes. Each
//! [`Scoring::step`] is one chunk of the state or one pass, so the engine
//! thread can take turns between clients (`engine.rs`).
//! `docs/design/mlx-backend.md`, "One pass for a state's questions".

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::cache::ModelCache;
use super::error::{MlxError, MlxResult};
use super::kept::{answer_key, PromptIndex, Snapshot};
use super::model::MlxModel;
use super::options::MlxOptions;
use crate::engine::prefix_cache::{PrefixCache, StateHash};
use crate::engine::{EngineError, QuestionScore, ScoreRequest, ScoreResult};

/// Where a scoring job's answer goes.
pub(super) type Reply = oneshot::Sender<Result<ScoreResult, EngineError>>;

/// What a step needs of the engine thread.
pub(super) struct Engine<'a> {
    pub model: &'a MlxModel,
    pub options: &'a MlxOptions,
    pub prefix_cache: &'a PrefixCache<Snapshot>,
    pub prompts: &'a mut PromptIndex,
}

/// Scoring jobs on one state, in progress: their questions are the merged
/// request's, in the order the jobs joined.
pub(super) struct Scoring {
    request: ScoreRequest,
    /// Each job: how many of the merged questions are its own, where its
    /// answer goes, and whether it joined (its state then read for the
    /// job it joined: to it, a state found, as a look-up of the prefix
    /// cache finds one).
    jobs: Vec<(usize, Reply, bool)>,
    stage: Stage,
}

enum Stage {
    /// The state is not read yet: the cache so far, the tokens read, and
    /// when its reading began.
    State {
        cache: Option<ModelCache>,
        read: usize,
        started: Option<Instant>,
    },
    /// The state is read; its questions go in passes.
    Questions(Questions),
}

struct Questions {
    snapshot: Arc<Snapshot>,
    cached: bool,
    new_state_seconds: Option<f64>,
    /// Each merged question's key among the state's remembered answers.
    keys: Vec<[u8; 32]>,
    out: Vec<Option<QuestionScore>>,
    /// The passes still to read, as indices of merged questions.
    passes: VecDeque<Vec<usize>>,
}

impl Scoring {
    pub fn new(request: ScoreRequest, reply: Reply) -> Self {
        let n = request.questions.len();
        Scoring {
            request,
            jobs: vec![(n, reply, false)],
            stage: Stage::State {
                cache: None,
                read: 0,
                started: None,
            },
        }
    }

    /// Whether `other` can be read in this one's passes: the same state,
    /// read and kept alike.
    pub fn joins(&self, other: &ScoreRequest) -> bool {
        let first = &self.request;
        first.state == other.state
            && first.prefix == other.prefix
            && first.hidden == other.hidden
            && first.hidden_layer == other.hidden_layer
            && first.cache == other.cache
    }

    /// Adds a job on the same state ([`Scoring::joins`]); where the state
    /// is read already, its questions are planned into passes at once.
    pub fn join(&mut self, request: ScoreRequest, reply: Reply, options: &MlxOptions) {
        options.metrics.merged_jobs.inc();
        if self.request.cache {
            options.metrics.prefix_cache_hits.inc();
        }
        let from = self.request.questions.len();
        self.jobs.push((request.questions.len(), reply, true));
        self.request.questions.extend(request.questions);
        if let Stage::Questions(q) = &mut self.stage {
            q.plan(&self.request, from, options);
        }
    }

    /// One step: a chunk of the state, or one pass of questions. Returns
    /// the jobs answered when the scoring ended (answered, failed, or
    /// abandoned by every client), `None` while work remains.
    pub fn step(&mut self, e: &mut Engine<'_>) -> Option<usize> {
        if self.jobs.iter().all(|(_, reply, _)| reply.is_closed()) {
            // Every client left: the work stops here, within one chunk
            // or pass; a state read whole stays in the prefix cache, and
            // one read in part is kept for the next request on it.
            e.options
                .metrics
                .abandoned_jobs
                .inc_by(self.jobs.len() as u64);
            self.keep_partial(e);
            return Some(self.jobs.len());
        }
        super::fault::hook();
        match self.advance(e) {
            Ok(false) => None,
            Ok(true) => {
                // The figures a client may read once answered.
                super::memory::export(&e.options.metrics);
                Some(self.answer())
            }
            Err(err) => Some(self.fail(EngineError::computation(err.to_string()))),
        }
    }

    /// The jobs in this scoring.
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Answers every job not answered yet `error` (a step failed, or
    /// panicked); returns how many there were.
    pub fn fail(&mut self, error: EngineError) -> usize {
        let n = self.jobs.len();
        for (_, reply, _) in self.jobs.drain(..) {
            let _ = reply.send(Err(error.clone()));
        }
        n
    }

    /// Runs one step; true when every question is read.
    fn advance(&mut self, e: &mut Engine<'_>) -> MlxResult<bool> {
        let request = &self.request;
        match &mut self.stage {
            Stage::State {
                cache,
                read,
                started,
            } => {
                if cache.is_none() {
                    if let Some(snapshot) = request
                        .cache
                        .then(|| e.prefix_cache.get(&request.state))
                        .flatten()
                    {
                        e.prompts.record(&request.prefix, request.state);
                        self.stage = Stage::Questions(Questions::new(
                            snapshot, true, None, request, e.options,
                        ));
                        return Ok(self.done());
                    }
                    if request.prefix.is_empty() {
                        return Err(MlxError::Config("an empty prompt has no next token".into()));
                    }
                    *started = Some(Instant::now());
                    if let Some((len, kept)) = partial_of(e, request) {
                        e.options.metrics.resumed_state_tokens.inc_by(len as u64);
                        *cache = Some(kept);
                        *read = len;
                    }
                }
                // One chunk, as `MlxModel::prefill` reads it.
                let c = cache.get_or_insert_with(|| e.model.new_cache());
                let chunk = e.options.prefill_chunk.max(1);
                let end = (*read + chunk).min(request.prefix.len());
                e.model.last_hidden(&request.prefix[*read..end], c)?;
                c.eval()?;
                *read = end;
                if end < request.prefix.len() {
                    return Ok(false);
                }
                // The prefill's scratch buffers go back to the system, not
                // to MLX's cache (src/engine/mlx/memory.rs).
                let _ = mlx_rs::memory::clear_cache();
                let seconds = started.map_or(0.0, |s| s.elapsed().as_secs_f64());
                let room = e.options.answers_per_state * answer_bytes(e.model, request);
                let snapshot = Arc::new(Snapshot::new(cache.take().unwrap_or_default(), room));
                if request.cache {
                    e.options.metrics.new_state_seconds.observe(seconds);
                    e.prefix_cache.insert(request.state, snapshot.clone());
                    if e.prefix_cache.peek(&request.state).is_some() {
                        e.prompts.record(&request.prefix, request.state);
                    }
                }
                self.stage = Stage::Questions(Questions::new(
                    snapshot,
                    false,
                    Some(seconds),
                    request,
                    e.options,
                ));
                Ok(self.done())
            }
            Stage::Questions(q) => {
                q.read_pass(e.model, e.options, request)?;
                Ok(q.passes.is_empty())
            }
        }
    }

    /// Keeps a state read in part, its clients gone, in the prefix cache
    /// as the tokens read so far, so that the next request on the state (a
    /// client's retry) reads on from there ([`partial_of`]).
    fn keep_partial(&mut self, e: &mut Engine<'_>) {
        let request = &self.request;
        let Stage::State { cache, read, .. } = &mut self.stage else {
            return;
        };
        let (Some(c), true) = (cache.take(), request.cache && *read > 0) else {
            return;
        };
        let ids = &request.prefix[..*read];
        let key = partial_key(ids);
        if e.prefix_cache.insert(key, Arc::new(Snapshot::new(c, 0))) {
            e.prompts.record(ids, key);
        }
    }

    fn done(&self) -> bool {
        matches!(&self.stage, Stage::Questions(q) if q.passes.is_empty())
    }

    /// Answers every job with its own questions; returns how many.
    fn answer(&mut self) -> usize {
        let Stage::Questions(q) = &mut self.stage else {
            return 0;
        };
        let n = self.jobs.len();
        let mut scores = q.finish().into_iter();
        for (count, reply, joined) in self.jobs.drain(..) {
            let mine: Option<Vec<QuestionScore>> = scores.by_ref().take(count).collect();
            let _ = reply.send(match mine {
                Some(questions) => Ok(ScoreResult {
                    cached: q.cached || (joined && self.request.cache),
                    new_state_seconds: q.new_state_seconds.filter(|_| !joined),
                    questions,
                }),
                None => Err(EngineError::Model("a question was not read".into())),
            });
        }
        n
    }
}

/// The key of a state's first tokens, kept when its clients left while it
/// was read.
fn partial_key(ids: &[u32]) -> StateHash {
    StateHash::new("", "", "partial-state", ids)
}

/// The longest part of `request`'s state kept by [`Scoring::keep_partial`],
/// and a copy of its cache to read on from. Kept parts end on a chunk's
/// end, so the state is read in the same chunks as from its start, and its
/// answers are the same bits.
fn partial_of(e: &Engine<'_>, request: &ScoreRequest) -> Option<(usize, ModelCache)> {
    if !request.cache {
        return None;
    }
    let chunk = e.options.prefill_chunk.max(1);
    e.prompts
        .prefixes_where(&request.prefix, |len| len % chunk == 0)
        .into_iter()
        .filter(|&(len, key)| key == partial_key(&request.prefix[..len]))
        .find_map(|(len, key)| Some((len, e.prefix_cache.peek(&key)?.cache.clone())))
}

impl Questions {
    fn new(
        snapshot: Arc<Snapshot>,
        cached: bool,
        new_state_seconds: Option<f64>,
        request: &ScoreRequest,
        options: &MlxOptions,
    ) -> Self {
        let mut q = Questions {
            snapshot,
            cached,
            new_state_seconds,
            keys: Vec::new(),
            out: Vec::new(),
            passes: VecDeque::new(),
        };
        q.plan(request, 0, options);
        q
    }

    /// Plans the merged questions from `from` on: those answered on the
    /// state before come from its remembered answers, each other one is
    /// read once (a question asked twice is read once), in passes of as
    /// many questions as [`MlxOptions::pass_tokens`] allows, counted as
    /// rows times the longest row (sorted by length, so the rows of a pass
    /// are alike).
    fn plan(&mut self, request: &ScoreRequest, from: usize, options: &MlxOptions) {
        let added = &request.questions[from..];
        self.keys.extend(
            added
                .iter()
                .map(|q| answer_key(q, request.hidden, request.hidden_layer)),
        );
        self.out.resize(self.keys.len(), None);
        let planned: Vec<[u8; 32]> = self
            .passes
            .iter()
            .flatten()
            .map(|&i| self.keys[i])
            .collect();
        let mut todo: Vec<usize> = Vec::new();
        let answers = lock(&self.snapshot.answers);
        for i in from..self.keys.len() {
            let key = self.keys[i];
            if let Some(known) = answers.get(&key) {
                self.out[i] = Some(QuestionScore {
                    seconds: 0.0,
                    memoised: true,
                    ..known.clone()
                });
            } else if !planned.contains(&key) && !todo.iter().any(|&j| self.keys[j] == key) {
                todo.push(i);
            }
        }
        drop(answers);
        todo.sort_by_key(|&i| request.questions[i].suffix.len());
        let len = |i: usize| request.questions[i].suffix.len();
        self.passes
            .extend(plan_passes(&todo, len, options.pass_tokens));
    }

    /// Reads the next pass. A question's `seconds` is its share of it.
    fn read_pass(
        &mut self,
        model: &MlxModel,
        options: &MlxOptions,
        request: &ScoreRequest,
    ) -> MlxResult<()> {
        let Some(pass) = self.passes.pop_front() else {
            return Ok(());
        };
        let started = Instant::now();
        let asked = |i: &usize| &request.questions[*i];
        let suffixes: Vec<&[u32]> = pass.iter().map(|i| &asked(i).suffix[..]).collect();
        let reads: Vec<&[u32]> = pass.iter().map(|i| &asked(i).read[..]).collect();
        let tap = request.hidden_layer.filter(|_| request.hidden);
        let readings = model.read_questions(
            &self.snapshot.cache,
            &suffixes,
            &reads,
            options.prefill_chunk,
            request.hidden,
            tap,
        )?;
        options.metrics.question_passes.inc();
        let seconds = started.elapsed().as_secs_f64() / pass.len() as f64;
        let mut answers = lock(&self.snapshot.answers);
        for (&i, reading) in pass.iter().zip(readings) {
            let score = QuestionScore {
                logits: reading.logits,
                logprobs: reading.logprobs,
                hidden: reading.hidden,
                seconds,
                memoised: false,
            };
            if answers.len() < options.answers_per_state {
                answers.insert(self.keys[i], score.clone());
            }
            self.out[i] = Some(score);
        }
        Ok(())
    }

    /// Every merged question's scores, in order: a question asked again
    /// gets the first one's.
    fn finish(&mut self) -> Vec<Option<QuestionScore>> {
        for i in 0..self.out.len() {
            if self.out[i].is_none() {
                let first = (0..i).find(|&j| self.keys[j] == self.keys[i] && self.out[j].is_some());
                self.out[i] = first
                    .and_then(|j| self.out[j].clone())
                    .map(|known| QuestionScore {
                        seconds: 0.0,
                        memoised: true,
                        ..known
                    });
            }
        }
        std::mem::take(&mut self.out)
    }
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
