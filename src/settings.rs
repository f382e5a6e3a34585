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
    /// Most stop sequences in one request.
    pub max_stop: usize,
    /// Longest stop sequence, in bytes.
    pub max_stop_bytes: usize,
    /// Prompt tokens per forward pass while reading a prompt.
    pub prefill_chunk: usize,
    /// Budget of the prefix cache in MiB (`--prefix-cache-mb`; 0: off).
    pub prefix_cache_mib: u64,
    /// The letter temperature when neither the request nor a task sets one.
    pub letter_temperature: f64,
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 8 << 20,
            max_queue: 64,
            max_logprobs: 20,
            max_stop: 4,
            max_stop_bytes: 256,
            prefill_chunk: 256,
            prefix_cache_mib: 2048,
            letter_temperature: 1.0,
            max_task_body_bytes: 64 << 20,
            max_tasks: 256,
            max_task_examples: 100_000,
            max_task_labels: 1_000,
            max_task_name_bytes: 64,
        }
    }
}
