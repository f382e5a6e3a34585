//! The Prometheus metrics of the server, in one registry.
//!
//! Label sets are bounded: `route` is the route pattern (never the raw
//! path), `method` and `status` come from small fixed sets, `model` is the
//! one served model, `state` is `cached` or `new`, `upstream` is one of the
//! `--upstream` URLs (at most `max_upstreams` of them, fixed at start) and
//! `outcome` one of `ok`, `http_4xx`, `http_5xx`, `timeout`, `connect`,
//! `invalid`, `cancelled`; `retry` one of `1`, `2`, `3`, `4+`, `invalid`;
//! task registration metrics are labelled by status or outcome
//! (a fixed set), never by task; System One questions by `type` (`noul`,
//! `choice`, `score`). Certified tasks' metrics are labelled by `task`, the
//! task's name: at most the 256 tasks a server holds, and a deleted task's series
//! are removed.

use prometheus::{
    exponential_buckets, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The outcomes of `decisio_think_questions_total`: a question thought, or
/// why it did not (`tasks::NotThought::label`).
pub const THINK_OUTCOMES: [&str; 8] = [
    "thought",
    "sure",
    "too_many_options",
    "not_thinking_type",
    "registered_task",
    "not_combined",
    "state_truncated",
    "no_room",
];

/// Histogram buckets from 1 ms to about 10 minutes, 2^(1/2) apart (40 buckets).
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.001, std::f64::consts::SQRT_2, 40).expect("valid buckets")
}

pub struct Metrics {
    registry: Registry,
    /// Seconds to answer one question, by whether its state was cached.
    pub question_seconds: HistogramVec,
    /// Seconds to prefill a state that was not in the cache.
    pub new_state_seconds: Histogram,
    /// Question passes on a state (MLX: each reads up to `--pass-tokens`
    /// of question rows at once).
    pub question_passes: IntCounter,
    /// Scoring jobs whose questions were read in the passes of an earlier
    /// job on the same state (MLX: requests merged across clients).
    pub merged_jobs: IntCounter,
    /// Engine jobs (scoring, generation, embedding) stopped before their
    /// end because every client waiting on them had left.
    pub abandoned_jobs: IntCounter,
    /// State tokens not read again: a request's state read on from the
    /// part kept when an earlier request on it was left (MLX backend).
    pub resumed_state_tokens: IntCounter,
    /// System One questions answered, by type.
    pub wire_questions: IntCounterVec,
    /// Seconds a System One request took per question, by type.
    pub wire_question_seconds: HistogramVec,
    /// System One requests whose state was cut to the prompt ceiling.
    pub states_truncated: IntCounter,
    /// State tokens those cuts left out (each state's tokens less those
    /// kept).
    pub state_tokens_dropped: IntCounter,
    /// System One requests whose header listed fewer of their questions
    /// (`--header-limit`).
    pub headers_limited: IntCounter,
    /// Instruction lines those headers left out.
    pub header_lines_dropped: IntCounter,
    /// System One questions of requests that had thinking on, by outcome
    /// ([`THINK_OUTCOMES`]).
    pub think_questions: IntCounterVec,
    /// Tokens of reasoning written.
    pub think_tokens: IntCounter,
    /// Seconds a request's reasoning and second reads took, for requests
    /// where a question thought.
    pub think_seconds: Histogram,
    pub prefix_cache_hits: IntCounter,
    pub prefix_cache_misses: IntCounter,
    pub prefix_cache_evictions: IntCounter,
    pub prefix_cache_bytes: IntGauge,
    pub prefix_cache_entries: IntGauge,
    pub prefix_cache_capacity: IntGauge,
    pub abstentions: IntCounter,
    pub queue_depth: IntGauge,
    pub http_requests: IntCounterVec,
    pub http_request_seconds: HistogramVec,
    /// Requests a client marked as a retry (`X-TypeSafe-Retry-Count`, as
    /// typesafe-sdk sends it), by route pattern and retry number (`1`,
    /// `2`, `3`, `4+`, or `invalid` for a value that is not a whole
    /// number from 1).
    pub client_retries: IntCounterVec,
    /// Requests sent to each upstream server, by outcome.
    pub upstream_requests: IntCounterVec,
    /// Seconds each upstream took to answer (any outcome).
    pub upstream_seconds: HistogramVec,
    /// Requests in flight to each upstream.
    pub upstream_in_flight: IntGaugeVec,
    /// 1 while an upstream is ejected from routing, else 0.
    pub upstream_ejected: IntGaugeVec,
    /// Requests sent again to another upstream after a failure.
    pub upstream_retries: IntCounter,
    /// Answers of packed questions, by where their letters were read
    /// (`generated`: at their position in the answer sheet; `fallback`:
    /// from a teacher-forced prompt, the sheet having broken its format).
    pub packed_answers: IntCounterVec,
    /// The shared task store's follower (`--task-store`).
    pub task_store: TaskStoreMetrics,
    /// Examples scored by task registrations.
    pub task_registration_examples: IntCounter,
    /// Registrations finished, by outcome (`ready`, `failed`, `cancelled`).
    pub task_registrations: IntCounterVec,
    /// Tasks by status.
    pub task_registration_tasks: IntGaugeVec,
    /// Examples per second of the running registration (0 when none runs).
    pub task_registration_rate: Gauge,
    /// Answers of certified tasks by task and verdict (`certified`,
    /// `below_threshold`, `nothing_certified`, `serving_stack_changed`,
    /// `traffic_changed`); tasks are bounded by the limit of 256.
    pub certified_task_answers: IntCounterVec,
    /// The traffic monitor of each certified task: the answer mix's last
    /// distance from the examples', and its alert line.
    pub certified_task_mix_distance: GaugeVec,
    pub certified_task_mix_line: GaugeVec,
    /// The confidence CUSUM of each certified task, and its limit.
    pub certified_task_confidence_statistic: GaugeVec,
    pub certified_task_confidence_limit: GaugeVec,
    /// 1 while a signal (`answer_mix`, `confidence`) alerts, else 0.
    pub certified_task_alert: IntGaugeVec,
    /// MLX's memory by kind (`active`: held by arrays; `peak`: the most
    /// held at once since start; `cache`: freed buffers MLX keeps for
    /// reuse); the MLX backend's only.
    pub mlx_memory_bytes: IntGaugeVec,
}

impl Metrics {
    /// Every metric, declared and registered. Long by design: one
    /// declaration a metric (name, help, labels), read as a table, with
    /// nothing to split by job; a metric is added by one entry here and one
    /// field above.
    pub fn new() -> Self {
        let registry = Registry::new();
        let gauge_vec = |name: &str, help: &str| {
            GaugeVec::new(Opts::new(name, help), &["task"]).expect("metric")
        };
        let histogram =
            |name: &str, help: &str| HistogramOpts::new(name, help).buckets(latency_buckets());
        let question_seconds = HistogramVec::new(
            histogram(
                "decisio_question_seconds",
                "Seconds to answer one question.",
            ),
            &["model", "state"],
        )
        .expect("metric");
        let new_state_seconds = Histogram::with_opts(histogram(
            "decisio_new_state_seconds",
            "Seconds to prefill a state that was not in the prefix cache.",
        ))
        .expect("metric");
        let wire_question_seconds = HistogramVec::new(
            histogram(
                "decisio_systemone_question_seconds",
                "Seconds a POST /v1/systemone request took, per question, by question type.",
            ),
            &["type"],
        )
        .expect("metric");
        let think_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "decisio_think_seconds",
                "Seconds a POST /v1/systemone request's reasoning and second reads took, for \
             requests where a question thought.",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0,
            ]),
        )
        .expect("metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("metric");
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("metric");
        let m = Metrics {
            question_seconds,
            new_state_seconds,
            question_passes: counter(
                "decisio_question_passes_total",
                "Passes that read a state's questions together (MLX backend).",
            ),
            merged_jobs: counter(
                "decisio_merged_jobs_total",
                "Scoring requests read in the same passes as an earlier request on the same \
                 state (MLX backend).",
            ),
            abandoned_jobs: counter(
                "decisio_abandoned_jobs_total",
                "Engine jobs stopped before their end because every client waiting on them \
                 had left (MLX: within one chunk or pass; vLLM backend: its upstream requests \
                 cancelled).",
            ),
            resumed_state_tokens: counter(
                "decisio_resumed_state_tokens_total",
                "State tokens a request did not read again: its state read on from the part kept \
                 when every client of an earlier request on it left (MLX backend).",
            ),
            wire_questions: IntCounterVec::new(
                Opts::new(
                    "decisio_systemone_questions_total",
                    "Questions answered on POST /v1/systemone, by question type.",
                ),
                &["type"],
            )
            .expect("metric"),
            wire_question_seconds,
            states_truncated: counter(
                "decisio_states_truncated_total",
                "POST /v1/systemone requests whose state was cut to its start to fit the prompt \
                 ceiling (over_limit truncate).",
            ),
            state_tokens_dropped: counter(
                "decisio_state_tokens_dropped_total",
                "State tokens left out by those cuts: each state's tokens less those kept.",
            ),
            headers_limited: counter(
                "decisio_headers_limited_total",
                "POST /v1/systemone requests whose header (the header layout's list of the \
                 request's questions) listed fewer of them to fit the prompt ceiling \
                 (--header-limit).",
            ),
            header_lines_dropped: counter(
                "decisio_header_lines_dropped_total",
                "Instruction lines those headers left out.",
            ),
            think_questions: IntCounterVec::new(
                Opts::new(
                    "decisio_think_questions_total",
                    "Questions of POST /v1/systemone requests that had thinking on, by outcome: \
                     thought, or why not.",
                ),
                &["outcome"],
            )
            .expect("metric"),
            think_tokens: counter(
                "decisio_think_tokens_total",
                "Tokens of reasoning written by questions that thought.",
            ),
            think_seconds,
            prefix_cache_hits: counter(
                "decisio_prefix_cache_hits_total",
                "State look-ups (one per request) that found the state in the prefix cache.",
            ),
            prefix_cache_misses: counter(
                "decisio_prefix_cache_misses_total",
                "State look-ups (one per request) that did not find the state in the prefix cache.",
            ),
            prefix_cache_evictions: counter(
                "decisio_prefix_cache_evictions_total",
                "States evicted from the prefix cache for room.",
            ),
            prefix_cache_bytes: gauge(
                "decisio_prefix_cache_bytes",
                "Bytes of state held by the prefix cache.",
            ),
            prefix_cache_entries: gauge(
                "decisio_prefix_cache_entries",
                "States held by the prefix cache.",
            ),
            prefix_cache_capacity: gauge(
                "decisio_prefix_cache_capacity_bytes",
                "Budget of the prefix cache in bytes (--prefix-cache-mb; 0: off).",
            ),
            abstentions: counter(
                "decisio_abstentions_total",
                "Answers abstained for a top probability below the threshold.",
            ),
            queue_depth: gauge("decisio_queue_depth", "Engine jobs waiting or running."),
            http_requests: IntCounterVec::new(
                Opts::new(
                    "decisio_http_requests_total",
                    "HTTP requests by route pattern, method and status.",
                ),
                &["route", "method", "status"],
            )
            .expect("metric"),
            http_request_seconds: HistogramVec::new(
                histogram(
                    "decisio_http_request_seconds",
                    "Seconds to answer an HTTP request (to the first byte of a stream).",
                ),
                &["route", "method"],
            )
            .expect("metric"),
            client_retries: IntCounterVec::new(
                Opts::new(
                    "decisio_client_retries_total",
                    "Requests a client marked as a retry (X-TypeSafe-Retry-Count), by route \
                     pattern and retry number (1, 2, 3, 4+, invalid).",
                ),
                &["route", "retry"],
            )
            .expect("metric"),
            upstream_requests: IntCounterVec::new(
                Opts::new(
                    "decisio_upstream_requests_total",
                    "Requests sent to each upstream server, by outcome.",
                ),
                &["upstream", "outcome"],
            )
            .expect("metric"),
            upstream_seconds: HistogramVec::new(
                histogram(
                    "decisio_upstream_request_seconds",
                    "Seconds an upstream server took to answer a request.",
                ),
                &["upstream"],
            )
            .expect("metric"),
            upstream_in_flight: IntGaugeVec::new(
                Opts::new(
                    "decisio_upstream_in_flight",
                    "Requests in flight to each upstream server.",
                ),
                &["upstream"],
            )
            .expect("metric"),
            upstream_ejected: IntGaugeVec::new(
                Opts::new(
                    "decisio_upstream_ejected",
                    "1 while an upstream server is ejected from routing.",
                ),
                &["upstream"],
            )
            .expect("metric"),
            upstream_retries: counter(
                "decisio_upstream_retries_total",
                "Requests sent again to another upstream server after a failure.",
            ),
            packed_answers: IntCounterVec::new(
                Opts::new(
                    "decisio_packed_answers_total",
                    "Answers of packed questions, by where their letters were read \
                     (generated, fallback).",
                ),
                &["read"],
            )
            .expect("metric"),
            task_registration_examples: counter(
                "decisio_task_registration_examples_total",
                "Examples scored by task registrations.",
            ),
            task_registrations: IntCounterVec::new(
                Opts::new(
                    "decisio_task_registration_finished_total",
                    "Task registrations finished, by outcome (ready, failed, cancelled).",
                ),
                &["outcome"],
            )
            .expect("metric"),
            task_registration_tasks: IntGaugeVec::new(
                Opts::new(
                    "decisio_task_registration_tasks",
                    "Tasks by status (queued, running, ready, failed, cancelled).",
                ),
                &["status"],
            )
            .expect("metric"),
            task_registration_rate: Gauge::new(
                "decisio_task_registration_examples_per_second",
                "Examples per second of the running task registration (0 when none runs).",
            )
            .expect("metric"),
            certified_task_answers: IntCounterVec::new(
                Opts::new(
                    "decisio_certified_task_answers_total",
                    "Answers of certified tasks, by task and verdict.",
                ),
                &["task", "verdict"],
            )
            .expect("metric"),
            certified_task_mix_distance: gauge_vec(
                "decisio_certified_task_mix_distance",
                "Total variation distance of a certified task's last window of chosen options from its examples'.",
            ),
            certified_task_mix_line: gauge_vec(
                "decisio_certified_task_mix_line",
                "The answer-mix distance above which a certified task's traffic alert is on.",
            ),
            certified_task_confidence_statistic: gauge_vec(
                "decisio_certified_task_confidence_cusum",
                "The CUSUM of a certified task's answers below its examples' 5th-percentile confidence.",
            ),
            certified_task_confidence_limit: gauge_vec(
                "decisio_certified_task_confidence_limit",
                "The CUSUM above which a certified task stops certifying (traffic_changed).",
            ),
            certified_task_alert: IntGaugeVec::new(
                Opts::new(
                    "decisio_certified_task_traffic_alert",
                    "1 while a certified task's traffic signal (answer_mix, confidence) alerts.",
                ),
                &["task", "signal"],
            )
            .expect("metric"),
            mlx_memory_bytes: IntGaugeVec::new(
                Opts::new(
                    "decisio_mlx_memory_bytes",
                    "MLX's memory by kind: active (held by arrays), peak (the most held at once since the model was loaded), cache (freed buffers kept for reuse). MLX backend only.",
                ),
                &["kind"],
            )
            .expect("metric"),
            task_store: TaskStoreMetrics::new(),
            registry,
        };
        // Every outcome is exported from the start, at 0.
        for outcome in ["ready", "failed", "cancelled"] {
            m.task_registrations.with_label_values(&[outcome]);
        }
        for read in ["generated", "fallback"] {
            m.packed_answers.with_label_values(&[read]);
        }
        for outcome in THINK_OUTCOMES {
            m.think_questions.with_label_values(&[outcome]);
        }
        for kind in ["noul", "choice", "score"] {
            m.wire_questions.with_label_values(&[kind]);
            m.wire_question_seconds.with_label_values(&[kind]);
        }
        m.register();
        m
    }

    fn register(&self) {
        let r = &self.registry;
        let all: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.question_seconds.clone()),
            Box::new(self.new_state_seconds.clone()),
            Box::new(self.question_passes.clone()),
            Box::new(self.merged_jobs.clone()),
            Box::new(self.abandoned_jobs.clone()),
            Box::new(self.resumed_state_tokens.clone()),
            Box::new(self.wire_questions.clone()),
            Box::new(self.wire_question_seconds.clone()),
            Box::new(self.states_truncated.clone()),
            Box::new(self.state_tokens_dropped.clone()),
            Box::new(self.headers_limited.clone()),
            Box::new(self.header_lines_dropped.clone()),
            Box::new(self.think_questions.clone()),
            Box::new(self.think_tokens.clone()),
            Box::new(self.think_seconds.clone()),
            Box::new(self.prefix_cache_hits.clone()),
            Box::new(self.prefix_cache_misses.clone()),
            Box::new(self.prefix_cache_evictions.clone()),
            Box::new(self.prefix_cache_bytes.clone()),
            Box::new(self.prefix_cache_entries.clone()),
            Box::new(self.prefix_cache_capacity.clone()),
            Box::new(self.abstentions.clone()),
            Box::new(self.queue_depth.clone()),
            Box::new(self.http_requests.clone()),
            Box::new(self.http_request_seconds.clone()),
            Box::new(self.client_retries.clone()),
            Box::new(self.upstream_requests.clone()),
            Box::new(self.upstream_seconds.clone()),
            Box::new(self.upstream_in_flight.clone()),
            Box::new(self.upstream_ejected.clone()),
            Box::new(self.upstream_retries.clone()),
            Box::new(self.packed_answers.clone()),
            Box::new(self.task_registration_examples.clone()),
            Box::new(self.task_registrations.clone()),
            Box::new(self.task_registration_tasks.clone()),
            Box::new(self.task_registration_rate.clone()),
            Box::new(self.certified_task_answers.clone()),
            Box::new(self.certified_task_mix_distance.clone()),
            Box::new(self.certified_task_mix_line.clone()),
            Box::new(self.certified_task_confidence_statistic.clone()),
            Box::new(self.certified_task_confidence_limit.clone()),
            Box::new(self.certified_task_alert.clone()),
            Box::new(self.mlx_memory_bytes.clone()),
        ];
        for c in all.into_iter().chain(self.task_store.collectors()) {
            r.register(c).expect("unique metric names");
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The metrics of the shared task store (`--task-store`), labelled by
/// fixed sets: a write's `outcome` (`written`, `conflict`, `unavailable`),
/// a poll's `result` (`changed`, `unchanged`, `failed`), a change's
/// `change` (`applied`, `removed`, `refused`).
#[derive(Clone)]
pub struct TaskStoreMetrics {
    /// Whether the last read of the store succeeded.
    pub ok: IntGauge,
    /// The manifest version this replica applies.
    pub manifest_version: IntGauge,
    /// Seconds since the last successful read of the store.
    pub last_sync_age: Gauge,
    /// Seconds from another replica's write of the last change applied
    /// here to its applying.
    pub lag: Gauge,
    pub writes: IntCounterVec,
    pub polls: IntCounterVec,
    pub changes: IntCounterVec,
    /// Registrations taken over from a replica whose claim lapsed.
    pub takeovers: IntCounter,
}

impl TaskStoreMetrics {
    fn new() -> Self {
        let counters = |name: &str, help: &str, label: &str, values: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("metric");
            for v in values {
                c.with_label_values(&[*v]);
            }
            c
        };
        TaskStoreMetrics {
            ok: IntGauge::new(
                "decisio_task_store_ok",
                "1 when the last read of the shared task store succeeded.",
            )
            .expect("metric"),
            manifest_version: IntGauge::new(
                "decisio_task_store_manifest_version",
                "The version of the task store's manifest this replica applies.",
            )
            .expect("metric"),
            last_sync_age: Gauge::new(
                "decisio_task_store_last_sync_age_seconds",
                "Seconds since the last successful read of the task store (-1: none yet).",
            )
            .expect("metric"),
            lag: Gauge::new(
                "decisio_task_store_lag_seconds",
                "Seconds from the write of the last change another replica made to its applying here.",
            )
            .expect("metric"),
            writes: counters(
                "decisio_task_store_writes_total",
                "Writes to the task store, by outcome (written, conflict, unavailable).",
                "outcome",
                &["written", "conflict", "unavailable"],
            ),
            polls: counters(
                "decisio_task_store_polls_total",
                "Reads of the task store's manifest, by result (changed, unchanged, failed).",
                "result",
                &["changed", "unchanged", "failed"],
            ),
            changes: counters(
                "decisio_task_store_changes_total",
                "Task changes read from the store, by what was done (applied, removed, refused).",
                "change",
                &["applied", "removed", "refused"],
            ),
            takeovers: IntCounter::new(
                "decisio_task_store_takeovers_total",
                "Registrations this replica took over after their replica's claim lapsed.",
            )
            .expect("metric"),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.ok.clone()),
            Box::new(self.manifest_version.clone()),
            Box::new(self.last_sync_age.clone()),
            Box::new(self.lag.clone()),
            Box::new(self.writes.clone()),
            Box::new(self.polls.clone()),
            Box::new(self.changes.clone()),
            Box::new(self.takeovers.clone()),
        ]
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
