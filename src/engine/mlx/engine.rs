//! The engine thread: [`MlxEngine`] queues jobs through a bounded channel
//! to the one thread that loads the model and runs every job in turn
//! (decisions, completions, embeddings), keeping prefilled states in the
//! prefix cache.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::error::{MlxError, MlxResult};
use super::kept::{Kept, PromptIndex, Snapshot};
use super::model::MlxModel;
use super::options::{Device, MlxOptions};
use super::passes::{self, Scoring};
use super::whole::{embed_all, generate};
use super::{loader, memory};
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::{
    Capabilities, EmbedReceiver, Engine, EngineError, EngineStatus, GenerateEvent, GenerateRequest,
    GenerateStream, ModelInfo, ScoreReceiver, ScoreRequest, ScoreResult,
};
use crate::model_config;

enum Job {
    Generate {
        request: GenerateRequest,
        events: mpsc::Sender<Result<GenerateEvent, EngineError>>,
    },
    Score {
        request: ScoreRequest,
        reply: oneshot::Sender<Result<ScoreResult, EngineError>>,
    },
    Embed {
        inputs: Vec<Vec<u32>>,
        reply: oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>,
    },
}

/// The MLX backend behind the [`Engine`] seam.
pub struct MlxEngine {
    info: ModelInfo,
    /// Decoder blocks (`num_hidden_layers` of config.json).
    layers: Option<usize>,
    jobs: mpsc::Sender<Job>,
    depth: Arc<AtomicUsize>,
    status: Arc<Mutex<EngineStatus>>,
    max_queue: usize,
}

impl MlxEngine {
    /// Starts the engine thread, which loads the model and then serves jobs.
    /// Returns at once; [`Engine::status`] says when the model is ready.
    pub fn start(dir: PathBuf, options: MlxOptions) -> MlxResult<Self> {
        let info = MlxModel::describe(&dir)?;
        let layers = model_config::get_usize(&loader::read_config(&dir)?, "num_hidden_layers");
        let max_queue = options.max_queue.max(1);
        let (jobs, rx) = mpsc::channel(max_queue);
        let depth = Arc::new(AtomicUsize::new(0));
        let status = Arc::new(Mutex::new(EngineStatus::Loading));
        let (thread_depth, thread_status) = (depth.clone(), status.clone());
        std::thread::Builder::new()
            .name("mlx-engine".into())
            .spawn(move || engine_thread(dir, options, rx, thread_depth, thread_status))
            .map_err(|e| MlxError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(MlxEngine {
            info,
            layers,
            jobs,
            depth,
            status,
            max_queue,
        })
    }
}

impl MlxEngine {
    fn submit(&self, job: Job) -> Result<(), EngineError> {
        match self.status() {
            EngineStatus::Ready => {}
            EngineStatus::Loading => return Err(EngineError::Loading),
            EngineStatus::Failed(e) => return Err(EngineError::LoadFailed(e)),
            EngineStatus::Unavailable(e) => return Err(EngineError::UpstreamUnavailable(e)),
            EngineStatus::Waiting(w) => return Err(EngineError::Waiting(w.message)),
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        self.jobs.try_send(job).map_err(|e| {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => EngineError::QueueFull(self.max_queue),
                mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
            }
        })
    }
}

impl Engine for MlxEngine {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn status(&self) -> EngineStatus {
        self.status
            .lock()
            .map(|s| s.clone())
            .unwrap_or(EngineStatus::Loading)
    }

    fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    fn generate(&self, request: GenerateRequest) -> Result<GenerateStream, EngineError> {
        let (events, rx) = mpsc::channel(64);
        self.submit(Job::Generate { request, events })?;
        Ok(rx)
    }

    fn score(&self, request: ScoreRequest) -> Result<ScoreReceiver, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Score { request, reply })?;
        Ok(rx)
    }

    fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<EmbedReceiver, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Embed { inputs, reply })?;
        Ok(rx)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn hidden_layers(&self) -> Option<usize> {
        self.layers
    }
}

fn engine_thread(
    dir: PathBuf,
    options: MlxOptions,
    mut jobs: mpsc::Receiver<Job>,
    depth: Arc<AtomicUsize>,
    status: Arc<Mutex<EngineStatus>>,
) {
    let set = |s: EngineStatus| {
        if let Ok(mut g) = status.lock() {
            *g = s;
        }
    };
    let model = match load(&dir, &options) {
        Ok(m) => m,
        Err(e) => return set(EngineStatus::Failed(e)),
    };
    memory::export(&options.metrics);
    set(EngineStatus::Ready);
    let prefix_cache: PrefixCache<Snapshot> =
        PrefixCache::new(options.prefix_cache_mib, options.metrics.clone());
    // The resident memory of the loaded model, which idle trims return to.
    let loaded = memory::resident_bytes().unwrap_or(0);
    let mut prompts = PromptIndex::default();
    // The work in hand, taken in turns: a scoring job one step at a time
    // (a chunk of its state or one pass of its questions, then it goes to
    // the back), any other job whole.
    let mut work: VecDeque<Work> = VecDeque::new();
    loop {
        if work.is_empty() {
            match jobs.blocking_recv() {
                Some(job) => work.push_back(Work::of(job)),
                None => break,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            admit(&mut work, job, &options);
        }
        let Some(item) = work.pop_front() else {
            continue;
        };
        let mut e = passes::Engine {
            model: &model,
            options: &options,
            prefix_cache: &prefix_cache,
            prompts: &mut prompts,
        };
        let done = turn(item, &mut work, &mut e);
        if done > 0 {
            depth.fetch_sub(done, Ordering::Relaxed);
            if work.is_empty() {
                // Idle: what a large request grew is given back.
                super::host::trim_buffers();
                memory::trim_idle(loaded, prefix_cache.bytes() as usize);
            }
            memory::export(&options.metrics);
        }
    }
}

/// Plans MLX's memory limits for the weights in `dir`, loads the model and
/// runs its first pass; the error (logged) fails the engine.
fn load(dir: &std::path::Path, options: &MlxOptions) -> Result<MlxModel, String> {
    let started = std::time::Instant::now();
    // The weights must fit the device; MLX's limits follow from them.
    let device = Device::current();
    let limits = loader::weight_bytes(dir).and_then(|weights| {
        memory::plan(
            device,
            memory::working_set(device),
            weights,
            (options.prefix_cache_mib as usize) << 20,
        )
        .map_err(MlxError::Config)
    });
    match limits.and_then(|l| memory::apply(&l).map(|()| l).map_err(MlxError::from)) {
        Ok(l) => tracing::info!(
            working_set = l.working_set,
            wired = l.wired,
            cache = l.cache,
            "MLX memory limits"
        ),
        Err(e) => {
            tracing::error!("{} cannot be served: {e}", dir.display());
            return Err(e.to_string());
        }
    }
    let model = MlxModel::load_with(dir, options.load).map_err(|e| {
        tracing::error!("loading {} failed: {e}", dir.display());
        e.to_string()
    })?;
    if let Err(e) = model.warm_up() {
        tracing::error!("the first pass through {} failed: {e}", dir.display());
        return Err(e.to_string());
    }
    let _ = mlx_rs::memory::clear_cache();
    // The peak exported from here on is serving's (the weights held and
    // what requests add), not the loading's transient copies.
    let _ = mlx_rs::memory::reset_peak_memory();
    tracing::info!(
        "loaded {} ({}) in {:.1} s, {:.1} MiB held",
        dir.display(),
        model.info.architecture,
        started.elapsed().as_secs_f64(),
        mlx_rs::memory::active_memory().unwrap_or(0) as f64 / (1u64 << 20) as f64
    );
    Ok(model)
}

/// One turn of the engine thread: a step of a scoring job (put back at
/// the end of `work` when it has more to read), or a whole job. The count
/// of jobs it finished. A panic in a job's work fails that job (a 500,
/// once), is logged, and the thread serves on.
fn turn(item: Work, work: &mut VecDeque<Work>, e: &mut passes::Engine) -> usize {
    match item {
        Work::Scoring(mut scoring) => match catch_unwind(AssertUnwindSafe(|| scoring.step(e))) {
            Ok((n, true)) => n,
            Ok((n, false)) => {
                work.push_back(Work::Scoring(scoring));
                n
            }
            Err(panic) => scoring.fail(crate::engine::panicked(&*panic)),
        },
        Work::Whole(Job::Score { request, reply }) => {
            work.push_back(Work::Scoring(Box::new(Scoring::new(request, reply))));
            0
        }
        Work::Whole(Job::Generate { request, events }) => {
            let kept = Kept {
                cache: e.prefix_cache,
                index: e.prompts,
            };
            let ran = catch_unwind(AssertUnwindSafe(|| {
                generate(e.model, e.options, kept, &request, &events)
            }));
            let failed = match ran {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(EngineError::computation(e.to_string())),
                Err(panic) => Some(crate::engine::panicked(&*panic)),
            };
            if let Some(e) = failed {
                let _ = events.blocking_send(Err(e));
            }
            1
        }
        Work::Whole(Job::Embed { inputs, reply }) => {
            if reply.is_closed() {
                e.options.metrics.abandoned_jobs.inc();
            } else {
                let kept = Kept {
                    cache: e.prefix_cache,
                    index: e.prompts,
                };
                let embedded = catch_unwind(AssertUnwindSafe(|| {
                    embed_all(e.model, e.options, kept, &inputs)
                }));
                let _ = reply
                    .send(embedded.unwrap_or_else(|panic| Err(crate::engine::panicked(&*panic))));
            }
            1
        }
    }
}

/// What the engine thread has in hand: a scoring job, read a step at a
/// time, or a job run whole when its turn comes.
enum Work {
    Scoring(Box<Scoring>),
    Whole(Job),
}

impl Work {
    fn of(job: Job) -> Self {
        match job {
            Job::Score { request, reply } => Work::Scoring(Box::new(Scoring::new(request, reply))),
            other => Work::Whole(other),
        }
    }
}

/// Takes a job in: a scoring job on a state that work in hand is scoring
/// joins it (its questions read in the same passes); anything else waits
/// its turn at the back.
fn admit(work: &mut VecDeque<Work>, job: Job, options: &MlxOptions) {
    if let Job::Score { request, reply } = job {
        let same = work.iter_mut().find_map(|w| match w {
            Work::Scoring(s) if s.joins(&request) => Some(s),
            _ => None,
        });
        match same {
            Some(scoring) => scoring.join(request, reply, options),
            None => work.push_back(Work::Scoring(Box::new(Scoring::new(request, reply)))),
        }
        return;
    }
    work.push_back(Work::of(job));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::mlx::fault;
    use crate::engine::{MultiQuestion, QuestionTokens, StateHash};
    use crate::metrics::Metrics;

    /// The fixture model (`make setup`), where the tests find it.
    fn fixture() -> PathBuf {
        std::env::var_os("DECISIO_MODEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME").expect("HOME");
                PathBuf::from(home).join(".cache/decisio/models/smollm2-135m-instruct")
            })
    }

    /// The engine tests one at a time: the fault hook is the process's.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// An engine on the fixture model, ready, reading `prefill_chunk`
    /// tokens a chunk.
    fn ready_engine(prefill_chunk: usize) -> MlxEngine {
        let dir = fixture();
        assert!(
            dir.join("config.json").exists(),
            "no fixture model at {dir:?}: run make setup"
        );
        let options = MlxOptions {
            load: Default::default(),
            prefix_cache_mib: 64,
            metrics: Arc::new(Metrics::new()),
            max_queue: 4,
            prefill_chunk,
            pass_tokens: 4096,
            answers_per_state: 8,
        };
        let engine = MlxEngine::start(dir, options).unwrap();
        let started = std::time::Instant::now();
        while engine.status() != EngineStatus::Ready {
            assert!(started.elapsed().as_secs() < 120, "{:?}", engine.status());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        engine
    }

    /// A scoring request of `questions` (suffix, ids read) on `prefix`.
    fn scoring(prefix: &[u32], questions: &[(Vec<u32>, Vec<u32>)]) -> ScoreRequest {
        ScoreRequest {
            state: StateHash::new("fixture", "tokenizer", "none", prefix),
            prefix: prefix.to_vec(),
            questions: questions
                .iter()
                .map(|(suffix, read)| QuestionTokens {
                    suffix: suffix.clone(),
                    read: read.clone(),
                })
                .collect(),
            hidden: false,
            hidden_layer: None,
            mode: MultiQuestion::Sequential,
            cache: true,
            packed: None,
        }
    }

    #[test]
    fn a_job_that_panics_fails_alone_and_the_engine_serves_on() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let engine = ready_engine(512);
        let prefix: Vec<u32> = (100..140).collect();
        let request = || scoring(&prefix, &[(vec![200, 201, 202], vec![32, 33])]);
        let score = |r: ScoreRequest| engine.score(r).unwrap().blocking_recv().unwrap();

        fault::FAULT.store(true, Ordering::SeqCst);
        match score(request()) {
            Err(EngineError::Model(m)) => assert!(m.contains("fault hook"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The thread counts a job out just after it answers.
        let drained = || {
            let started = std::time::Instant::now();
            while engine.queue_depth() != 0 {
                assert!(started.elapsed().as_secs() < 10, "a job stays counted");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        drained();
        assert_eq!(engine.status(), EngineStatus::Ready);
        // The same job again is answered; a generation that panics fails
        // alone too, and the next one runs.
        let answered = score(request()).unwrap();
        assert_eq!(answered.questions.len(), 1);
        let generation = |max_tokens| {
            let mut events = engine
                .generate(GenerateRequest {
                    prompt: prefix.clone(),
                    max_tokens,
                    sampling: Default::default(),
                    logprobs: None,
                    prompt_logprobs: None,
                    stop_token_ids: vec![],
                    logprob_token_ids: vec![],
                })
                .unwrap();
            std::iter::from_fn(|| events.blocking_recv()).collect::<Vec<_>>()
        };
        fault::FAULT.store(true, Ordering::SeqCst);
        let failed = generation(2);
        assert!(
            matches!(&failed[..], [Err(EngineError::Model(m))] if m.contains("fault hook")),
            "{failed:?}"
        );
        let ran = generation(2);
        assert!(ran.iter().all(Result::is_ok), "{ran:?}");
        assert!(
            matches!(ran.last(), Some(Ok(GenerateEvent::Finished(_)))),
            "{ran:?}"
        );
        drained();
    }

    /// A question longer than a chunk is read a chunk a step: requests
    /// sent after it, on its state (joining it) and on another state in
    /// cache (in one turn: its look-up and its pass), are answered while
    /// it is still read, and the long question gets the bits of its pass
    /// read in one call.
    #[test]
    fn a_long_question_takes_turns_a_chunk_at_a_time() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let chunk = 32;
        let engine = ready_engine(chunk);
        let prefix: Vec<u32> = (100..140).collect();
        let other: Vec<u32> = (300..340).collect();
        let small = |prefix: &[u32]| scoring(prefix, &[(vec![200, 201, 202], vec![32, 33])]);
        let long_suffix: Vec<u32> = (1000..1000 + 60 * chunk as u32).collect();
        let long = scoring(&prefix, &[(long_suffix.clone(), vec![32, 33, 34])]);
        // Both states in cache first.
        for state in [&prefix, &other] {
            let first = engine.score(small(state)).unwrap().blocking_recv().unwrap();
            assert!(!first.unwrap().cached);
        }

        let mut long_reply = engine.score(long).unwrap();
        for state in [&other, &prefix] {
            let quick = engine.score(small(state)).unwrap().blocking_recv().unwrap();
            assert!(quick.unwrap().cached);
            assert!(
                matches!(
                    long_reply.try_recv(),
                    Err(oneshot::error::TryRecvError::Empty)
                ),
                "the long question was read before a small request's turn"
            );
        }
        let long = long_reply.blocking_recv().unwrap().unwrap();

        // The oracle: the same chunks read in one call on the fixture.
        let model = MlxModel::load(&fixture()).unwrap();
        let mut state = model.new_cache();
        model.prefill(&prefix, &mut state, chunk).unwrap();
        state.eval().unwrap();
        let want = model
            .read_question(&long_suffix, &state, chunk, &[32, 33, 34], false, None)
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&long.questions[0].logits), bits(&want.logits));
        assert_eq!(bits(&long.questions[0].logprobs), bits(&want.logprobs));
    }

    #[test]
    fn allocation_failures_are_told_from_other_faults() {
        for message in [
            "MLX: [malloc] Unable to allocate 68719476736 bytes.",
            "MLX: [malloc_or_wait] Unable to allocate 1024 bytes.",
            "MLX: [metal::malloc] Attempting to allocate 80000000000 bytes which is greater than \
             the maximum allowed buffer size of 77309411328 bytes.",
            "MLX: std::bad_alloc",
        ] {
            assert!(
                matches!(
                    EngineError::computation(message.into()),
                    EngineError::OutOfMemory(_)
                ),
                "{message}"
            );
        }
        assert!(matches!(
            EngineError::computation("MLX: [matmul] Last dimension of first input".into()),
            EngineError::Model(_)
        ));
    }
}
