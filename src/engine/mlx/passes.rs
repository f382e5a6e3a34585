//! Scoring jobs as work the engine thread interleaves: a state found in the
//! prefix cache or read chunk by chunk, then its questions read together as
//! the rows of as few passes as `--pass-tokens` allows; jobs of several
//! clients on one state join one [`Scoring`] and share its passes. Each
//! [`Scoring::step`] is one chunk of the state or one column chunk of a
//! pass (a whole pass of short questions; a question longer than a chunk
//! over several steps), so the engine thread can take turns between
//! clients (`engine.rs`).
//! `docs/design/mlx-backend.md`, "One pass for a state's questions".

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::cache::ModelCache;
use super::error::{MlxError, MlxResult};
use super::kept::{answer_key, PromptIndex, Snapshot};
use super::model::{MlxModel, RowPass};
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
    /// The jobs not answered yet, in the order they joined.
    jobs: Vec<Client>,
    stage: Stage,
}

/// One job in a scoring.
struct Client {
    /// Its questions among the merged ones.
    questions: std::ops::Range<usize>,
    reply: Reply,
    /// Whether it joined: its state then read for the job it joined (to
    /// it, a state found, as a look-up of the prefix cache finds one).
    joined: bool,
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
    /// The passes still to read, as indices of merged questions: each
    /// job's own, the jobs taking them in turn (a job that joined a long
    /// one waits for one of its passes, not all of them).
    passes: VecDeque<VecDeque<Vec<usize>>>,
    /// The pass being read, a column chunk a step, and the seconds its
    /// steps took so far.
    reading: Option<(Vec<usize>, RowPass, f64)>,
}

impl Scoring {
    pub fn new(request: ScoreRequest, reply: Reply) -> Self {
        let n = request.questions.len();
        Scoring {
            request,
            jobs: vec![Client {
                questions: 0..n,
                reply,
                joined: false,
            }],
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
        self.jobs.push(Client {
            questions: from..from + request.questions.len(),
            reply,
            joined: true,
        });
        self.request.questions.extend(request.questions);
        if let Stage::Questions(q) = &mut self.stage {
            q.plan(&self.request, from, options);
        }
    }

    /// One step: a chunk of the state, or a column chunk of a pass of
    /// questions. Returns the jobs it ended (answered, failed, or
    /// abandoned by every client) and whether the scoring ended: a job
    /// whose questions are read is answered at once, before the jobs it
    /// joined.
    pub fn step(&mut self, e: &mut Engine<'_>) -> (usize, bool) {
        if self.jobs.iter().all(|job| job.reply.is_closed()) {
            // Every client left: the work stops here, within one chunk
            // or pass; a state read whole stays in the prefix cache, and
            // one read in part is kept for the next request on it.
            e.options
                .metrics
                .abandoned_jobs
                .inc_by(self.jobs.len() as u64);
            self.keep_partial(e);
            return (std::mem::take(&mut self.jobs).len(), true);
        }
        super::fault::hook();
        match self.advance(e) {
            Ok(ended) => {
                let answered = self.answer(ended, &e.options.metrics);
                (answered, ended)
            }
            Err(err) => (self.fail(EngineError::computation(err.to_string())), true),
        }
    }

    /// Answers every job not answered yet `error` (a step failed, or
    /// panicked); returns how many there were.
    pub fn fail(&mut self, error: EngineError) -> usize {
        let n = self.jobs.len();
        for job in self.jobs.drain(..) {
            let _ = job.reply.send(Err(error.clone()));
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
                        // A look-up is no step of its own: the turn goes
                        // on to the first pass, so a request on a state in
                        // cache waits for one turn, not two.
                        return match self.done() {
                            true => Ok(true),
                            false => self.advance(e),
                        };
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
                q.read_step(e.model, e.options, request)?;
                Ok(q.is_read())
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
        matches!(&self.stage, Stage::Questions(q) if q.is_read())
    }

    /// Answers each job whose questions are all read (every job once
    /// `ended`: a question still unread is then an error); returns how
    /// many it answered.
    fn answer(&mut self, ended: bool, metrics: &crate::metrics::Metrics) -> usize {
        let Stage::Questions(q) = &self.stage else {
            return 0;
        };
        let (ready, waiting): (Vec<Client>, Vec<Client>) = std::mem::take(&mut self.jobs)
            .into_iter()
            .partition(|job| ended || job.questions.clone().all(|i| q.has_read(i)));
        self.jobs = waiting;
        if !ready.is_empty() {
            // The figures a client may read once answered are exported
            // before it is.
            super::memory::export(metrics);
        }
        let cache = self.request.cache;
        let answered = ready.len();
        for job in ready {
            let scores: Option<Vec<QuestionScore>> =
                job.questions.clone().map(|i| q.score_of(i)).collect();
            let result = match scores {
                Some(questions) => Ok(ScoreResult {
                    cached: q.cached || (job.joined && cache),
                    new_state_seconds: q.new_state_seconds.filter(|_| !job.joined),
                    questions,
                }),
                None => Err(EngineError::Model("a question was not read".into())),
            };
            let _ = job.reply.send(result);
        }
        answered
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
            reading: None,
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
            .chain(self.reading.iter().map(|(pass, _, _)| pass))
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
        let passes: VecDeque<Vec<usize>> = plan_passes(&todo, len, options.pass_tokens).into();
        if !passes.is_empty() {
            self.passes.push_back(passes);
        }
    }

    /// Whether every planned pass is read.
    fn is_read(&self) -> bool {
        self.passes.is_empty() && self.reading.is_none()
    }

    /// Reads the next column chunk of the pass in hand, or of the next
    /// pass; a pass read whole answers its questions. A question's
    /// `seconds` is its share of its pass's steps.
    fn read_step(
        &mut self,
        model: &MlxModel,
        options: &MlxOptions,
        request: &ScoreRequest,
    ) -> MlxResult<()> {
        let started = Instant::now();
        let asked = |i: &usize| &request.questions[*i];
        let (pass, mut rows, seconds) = match self.reading.take() {
            Some(reading) => reading,
            None => {
                let Some(mut theirs) = self.passes.pop_front() else {
                    return Ok(());
                };
                let Some(pass) = theirs.pop_front() else {
                    return Ok(());
                };
                if !theirs.is_empty() {
                    self.passes.push_back(theirs);
                }
                let suffixes: Vec<&[u32]> = pass.iter().map(|i| &asked(i).suffix[..]).collect();
                let tap = request.hidden_layer.filter(|_| request.hidden);
                let rows = model.begin_rows(&self.snapshot.cache, &suffixes, tap)?;
                (pass, rows, 0.0)
            }
        };
        let suffixes: Vec<&[u32]> = pass.iter().map(|i| &asked(i).suffix[..]).collect();
        let read = model.read_chunk(&mut rows, &suffixes, options.prefill_chunk)?;
        if !read {
            self.reading = Some((pass, rows, seconds + started.elapsed().as_secs_f64()));
            return Ok(());
        }
        let (last, _) = rows.finish()?;
        let reads: Vec<&[u32]> = pass.iter().map(|i| &asked(i).read[..]).collect();
        let readings = model.readings(&last, &reads, request.hidden)?;
        options.metrics.question_passes.inc();
        let seconds = (seconds + started.elapsed().as_secs_f64()) / pass.len() as f64;
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

    /// Whether question `i`, or the same question asked in another place,
    /// is read.
    fn has_read(&self, i: usize) -> bool {
        self.out[i].is_some()
            || (0..self.out.len()).any(|j| self.keys[j] == self.keys[i] && self.out[j].is_some())
    }

    /// Merged question `i`'s scores once read: its own, or those of the
    /// same question asked in another place (then memoised).
    fn score_of(&self, i: usize) -> Option<QuestionScore> {
        if let Some(score) = &self.out[i] {
            return Some(score.clone());
        }
        let same =
            (0..self.out.len()).find(|&j| self.keys[j] == self.keys[i] && self.out[j].is_some())?;
        self.out[same].clone().map(|known| QuestionScore {
            seconds: 0.0,
            memoised: true,
            ..known
        })
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
