//! Every limit and default of the server, in one place.
//!
//! The command line fills [`Limits`] (each field has a flag); the defaults
//! here are what the docs state (`docs/limits.md`).

/// What the server accepts; anything beyond is refused with a clear error.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Jobs that may wait for the engine (503 beyond).
    pub max_queue: usize,
    /// Largest `top_logprobs` (chat) or `logprobs` (completions).
    pub max_logprobs: usize,
    /// Most ids in a completion's `logprob_token_ids`: vLLM's own limit
    /// (`MAX_LOGPROB_TOKEN_IDS` of `vllm/sampling_params.py`, 0.33.0), on
    /// both backends, so that the gateway refuses what an upstream would.
    pub max_logprob_token_ids: usize,
    /// Most prompts in one `POST /v1/completions` (a list of prompts, each
    /// answered as if sent alone).
    pub max_completion_prompts: usize,
    /// Most stop sequences in one request.
    pub max_stop: usize,
    /// Longest stop sequence, in bytes.
    pub max_stop_bytes: usize,
    /// Prompt tokens per forward pass while reading a prompt.
    pub prefill_chunk: usize,
    /// Question tokens per pass on a state (MLX): a state's questions are
    /// read together, as the rows of one batch, as many as fit this budget
    /// counted as rows times the longest row (`--pass-tokens`).
    pub pass_tokens: usize,
    /// Budget of the prefix cache in MiB (`--prefix-cache-mb`; 0: off).
    pub prefix_cache_mib: u64,
    /// The letter temperature when neither the request nor a task sets one.
    pub letter_temperature: f64,
    /// Answers remembered with each cached state, so that a question asked
    /// again on it is answered without running its suffix (same bits).
    pub answers_per_state: usize,
    /// Largest body of `POST /v1/tasks`, in bytes (413 beyond).
    pub max_task_body_bytes: usize,
    /// Most tasks a server holds, in any status (400 beyond).
    pub max_tasks: usize,
    /// Most examples in one registration.
    pub max_task_examples: usize,
    /// Most labels of an intent task (a choice task has 2 to 26 options).
    pub max_task_labels: usize,
    /// Longest task name, in bytes.
    pub max_task_name_bytes: usize,
    /// Most `draws` of an intent registration.
    pub max_task_draws: usize,
    /// Longest label of an intent task, in bytes.
    pub max_task_label_bytes: usize,
    /// Most inputs of one `POST /v1/embeddings`.
    pub max_embedding_inputs: usize,
    /// Most tokens of all inputs of one `POST /v1/embeddings` together
    /// (each input is also at most the context length).
    pub max_embedding_tokens: usize,
    /// Most questions of one `multi_question: "packed"` request (all of
    /// them share one prompt and one generation).
    pub max_packed_questions: usize,
    /// The context the server offers, when below the model's
    /// (`--max-model-len`, as vLLM names it): prompt plus generation.
    pub max_model_len: Option<usize>,
    /// What a System One request whose state is over the prompt ceiling
    /// gets when it does not say (`--over-limit`): refused, or its state
    /// cut to its start.
    pub over_limit: OverLimit,
    /// The prompt ceiling a state is cut to, in tokens, where it is not the
    /// context less one (`--over-limit-tokens`).
    pub over_limit_tokens: Option<usize>,
    /// Think when unsure on System One (`--think` and its flags).
    pub think: Think,
    /// How many of a System One request's questions the header layout
    /// lists where listing them all would put a row over the prompt
    /// ceiling (`--header-limit`).
    pub header_limit: HeaderLimit,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 8 << 20,
            max_queue: 64,
            max_logprobs: 20,
            max_logprob_token_ids: 128,
            max_completion_prompts: 1024,
            max_stop: 4,
            max_stop_bytes: 256,
            prefill_chunk: 512,
            pass_tokens: 1024,
            prefix_cache_mib: 2048,
            letter_temperature: 1.0,
            answers_per_state: 256,
            max_task_body_bytes: 64 << 20,
            max_tasks: 256,
            max_task_examples: 100_000,
            max_task_labels: 1_000,
            max_task_name_bytes: 64,
            max_task_draws: 100,
            max_task_label_bytes: 256,
            max_embedding_inputs: 256,
            max_embedding_tokens: 65_536,
            max_packed_questions: 64,
            max_model_len: None,
            over_limit: OverLimit::Refuse,
            over_limit_tokens: None,
            think: Think::default(),
            header_limit: HeaderLimit::Auto(None),
        }
    }
}

/// The limits of the vLLM backend's calls to its upstream servers; each
/// has a flag of `decisio serve --backend vllm`.
#[derive(Clone, Debug)]
pub struct UpstreamLimits {
    /// Most `--upstream` servers.
    pub max_upstreams: usize,
    /// Seconds to open a connection to an upstream.
    pub connect_timeout_s: f64,
    /// Seconds for one scoring call (one token) to answer, whole.
    pub request_timeout_s: f64,
    /// Seconds for one generation call to answer, whole.
    pub generate_timeout_s: f64,
    /// Seconds for each start-up probe call and each `/health` check.
    pub probe_timeout_s: f64,
    /// Seconds to wait at start for an upstream (and the head upstream)
    /// to pass its start-up probe before the gateway exits; `None` waits
    /// indefinitely; 0 probes each once and exits at once when none passes
    /// (`--upstream-wait`).
    pub wait_s: Option<f64>,
    /// Seconds before an upstream that failed its start-up probe is probed
    /// again; the delay doubles after each failure.
    pub wait_first_backoff_s: f64,
    /// The longest delay between two start-up probes of an upstream.
    pub wait_max_backoff_s: f64,
    /// Seconds between two health checks of each upstream.
    pub health_interval_s: f64,
    /// Failures with no success between that eject an upstream from
    /// routing: each failed health check counts, and each distinct request
    /// that failed for the upstream's own reason (one request failing again
    /// counts once; a request's own fault counts not at all).
    pub eject_after: u32,
    /// Passed health checks in a row that admit an ejected upstream again.
    pub readmit_after: u32,
    /// Further attempts of a call that is safe to repeat, each on the next
    /// upstream in the routing order.
    pub retries: u32,
    /// Milliseconds of the first backoff; it doubles on each retry.
    pub backoff_ms: u64,
    /// Longest backoff, in milliseconds.
    pub max_backoff_ms: u64,
    /// Upstream calls of one request in flight at once: a decision's list
    /// requests (`warm`), a packed decision's teacher-forced reads, an
    /// embeddings request's inputs.
    pub fan_out: usize,
    /// The most prompt tokens (state and question, counted for every
    /// prompt) one list request of a decision's questions carries; a
    /// state's questions over it are split into several list requests,
    /// sent at once. A question over it alone is sent alone.
    pub batch_tokens: usize,
    /// The most prompts (questions) one list request carries.
    pub batch_prompts: usize,
    /// Seconds of the upstreams' measured throughput kept in flight at
    /// once, shared fairly between requests (`docs/limits.md`, "Fair
    /// scheduling"); 0: every call sent at once.
    pub fair_seconds: f64,
    /// The least budget of prompt tokens in flight, per upstream.
    pub fair_tokens: usize,
    /// States the gateway remembers having sent to its upstreams, most
    /// recent first: a list request's cached-token count covers the state
    /// whenever its earlier prompts put the state in the prefix cache, so a
    /// state is taken as found cached only when it was sent before
    /// (`docs/design/vllm.md`, "One request per state").
    pub remembered_states: usize,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        UpstreamLimits {
            max_upstreams: 64,
            connect_timeout_s: 2.0,
            request_timeout_s: 60.0,
            generate_timeout_s: 600.0,
            probe_timeout_s: 10.0,
            wait_s: None,
            wait_first_backoff_s: 0.5,
            wait_max_backoff_s: 10.0,
            health_interval_s: 2.0,
            eject_after: 2,
            readmit_after: 2,
            retries: 2,
            backoff_ms: 50,
            max_backoff_ms: 1000,
            fan_out: 32,
            batch_tokens: 32768,
            batch_prompts: 64,
            fair_seconds: 1.0,
            fair_tokens: 2048,
            remembered_states: 65536,
        }
    }
}

/// What a request whose state is over the ceiling gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverLimit {
    /// Refused with the error of a prompt over the context, naming its
    /// tokens.
    #[default]
    Refuse,
    /// The state cut to its start (`crate::text_route::over_limit::fit_state`).
    Truncate,
}

impl OverLimit {
    pub const NAMES: [&'static str; 2] = ["refuse", "truncate"];

    /// The mode a request names (`"refuse"` or `"truncate"`).
    pub fn from_name(name: &str) -> Option<OverLimit> {
        match name {
            "refuse" => Some(OverLimit::Refuse),
            "truncate" => Some(OverLimit::Truncate),
            _ => None,
        }
    }
}

/// The System One question types a setting names, in the order the
/// settings list them.
pub const WIRE_TYPES: [&str; 3] = ["choice", "noul", "score"];

/// Think when unsure (`docs/running.md`, "Think when unsure"): a System One
/// question whose served confidence is below its type's threshold times
/// [`Think::factor`] is read again after the model writes its reasoning.
/// Per-type values are in the order of [`WIRE_TYPES`].
#[derive(Clone, Debug, PartialEq)]
pub struct Think {
    /// A request that does not say thinks (`--think`); off by default.
    pub on: bool,
    /// The factor on the thresholds (`--think-factor`): above 0, at most
    /// [`Think::MAX_FACTOR`].
    pub factor: f64,
    /// The most tokens of reasoning one question writes (`--think-budget`):
    /// [`Think::MIN_BUDGET`] to [`Think::MAX_BUDGET`].
    pub budget: usize,
    /// The types that may think (`--think-types`).
    pub types: [bool; 3],
    /// The temperature an answer that thought is served at, per type
    /// (`--think-temperature-<type>`); none: the type's own.
    pub temperatures: [Option<f64>; 3],
    /// The questions of one request whose reasoning is written at once.
    pub at_once: usize,
}

impl Think {
    /// The threshold of each type before the factor: choice 0.75, yes/no
    /// 0.92, score 0.70 (the reference's `TAU`).
    pub const THRESHOLDS: [f64; 3] = [0.75, 0.92, 0.70];
    pub const MAX_FACTOR: f64 = 1.5;
    pub const MIN_BUDGET: usize = 16;
    pub const MAX_BUDGET: usize = 4096;

    /// The slot of a type named as [`WIRE_TYPES`] names it.
    pub fn slot(name: &str) -> Option<usize> {
        WIRE_TYPES.iter().position(|t| *t == name)
    }

    /// The types from `--think-types`' list (`choice,noul,score`, any
    /// order, each at most once, at least one).
    pub fn parse_types(list: &str) -> Result<[bool; 3], String> {
        let mut types = [false; 3];
        for name in list.split(',').map(str::trim) {
            match Think::slot(name) {
                Some(i) if !types[i] => types[i] = true,
                Some(_) => return Err(format!("`{name}` is named twice")),
                None => {
                    return Err(format!(
                        "`{name}` is not a question type; name some of {}",
                        WIRE_TYPES.join(", ")
                    ))
                }
            }
        }
        Ok(types)
    }

    /// The types that think, by name, in order.
    pub fn type_names(&self) -> Vec<&'static str> {
        WIRE_TYPES
            .iter()
            .zip(self.types)
            .filter(|(_, on)| *on)
            .map(|(t, _)| *t)
            .collect()
    }
}

impl Default for Think {
    fn default() -> Self {
        Think {
            on: false,
            factor: 1.0,
            budget: 512,
            types: [true; 3],
            temperatures: [None; 3],
            at_once: 8,
        }
    }
}

/// `--header-limit`: under the header layout, a request whose rows would be
/// over the prompt ceiling with every question listed lists only as many
/// of its questions' instructions as fit (`docs/design/systemone.md`, "A
/// header over the context").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderLimit {
    /// As many lines as fit beside the state and the longest question; with
    /// a number, also at most that many tokens of header.
    Auto(Option<usize>),
    /// Every line listed: a row over the ceiling is refused.
    Off,
}

impl HeaderLimit {
    /// `auto`, `off`, or a number of tokens of at least 1.
    pub fn parse(value: &str) -> Result<HeaderLimit, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(HeaderLimit::Auto(None)),
            "off" => Ok(HeaderLimit::Off),
            other => match other.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(HeaderLimit::Auto(Some(n))),
                _ => Err(format!(
                    "`{value}`: auto, off, or a number of tokens of at least 1"
                )),
            },
        }
    }

    /// The setting as the command line writes it.
    pub fn describe(self) -> String {
        match self {
            HeaderLimit::Auto(None) => "auto".into(),
            HeaderLimit::Auto(Some(n)) => n.to_string(),
            HeaderLimit::Off => "off".into(),
        }
    }
}

/// How a replica follows the task store it shares with others
/// (`--task-store`; `docs/design/task-store.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskStore {
    /// How often the manifest is read (`--task-store-poll`); a change made
    /// on one replica is applied on the others within about this long.
    pub poll: std::time::Duration,
    /// How long a claim on a registration holds without renewal
    /// (`--task-store-lease`): a replica that dies while fitting leaves
    /// the registration to another after this long. Claims are renewed
    /// four times a lease.
    pub lease: std::time::Duration,
    /// How long a removed task's tombstone stays in the manifest
    /// (`--task-store-tombstone-hours`), so that replicas which have not
    /// read it yet learn of the removal.
    pub tombstone: std::time::Duration,
}

impl TaskStore {
    /// The bounds of the flags: a poll of 0.05 s to an hour, a lease of
    /// 1 s to an hour.
    pub const POLL_SECONDS: (f64, f64) = (0.05, 3600.0);
    pub const LEASE_SECONDS: (f64, f64) = (1.0, 3600.0);
}

impl Default for TaskStore {
    fn default() -> Self {
        TaskStore {
            poll: std::time::Duration::from_secs(5),
            lease: std::time::Duration::from_secs(30),
            tombstone: std::time::Duration::from_secs(7 * 24 * 3600),
        }
    }
}
