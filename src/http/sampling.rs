//! What chat and completions share on the way in: the sampling fields, the
//! stop sequences and `stream_options`, read from either request as one
//! [`SamplingFields`] and checked by one set of rules.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::fields::{int_in, present_bool};
use crate::settings::Limits;
use crate::text_route::GenerationParams;
use crate::text_route::Sampling;

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// `Some` when the field was sent (`null` reads as `false`).
    #[serde(default, deserialize_with = "present_bool")]
    pub include_usage: Option<bool>,
}

impl StreamOptions {
    /// Whether the object has a field: vLLM 0.33 refuses `stream_options`
    /// without `stream` only then (`if data.get("stream_options")`, an
    /// empty object being false; entrypoints/openai/*/protocol.py).
    pub fn is_set(&self) -> bool {
        self.include_usage.is_some()
    }
}

/// The sampling fields of a chat completion and a completion, which both
/// requests name alike; [`sampling_fields!`] reads them from either.
///
/// The requests declare these fields themselves rather than as one
/// `#[serde(flatten)]` struct: serde reads a struct with a flattened field
/// as a map, so `deny_unknown_fields` would no longer refuse a field the
/// server does not read, and the field list the derive gives (which an
/// unknown field's error quotes, and which the OpenAPI description is
/// checked against) would be gone. Each request is read as declared, then
/// converted to this once.
pub struct SamplingFields<'a> {
    pub n: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: &'a Option<StopSpec>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: &'a Option<Map<String, Value>>,
    /// vLLM's sampling extensions, taken at their neutral values only
    /// (`top_k` 0 or -1, `min_p` 0, `repetition_penalty` 1).
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub stream: bool,
    pub stream_options: Option<&'a StreamOptions>,
    pub ignore_eos: bool,
}

/// The [`SamplingFields`] of a request that has them (a chat completion or
/// a completion), borrowed.
macro_rules! sampling_fields {
    ($req:expr) => {
        $crate::http::sampling::SamplingFields {
            n: $req.n,
            temperature: $req.temperature,
            top_p: $req.top_p,
            seed: $req.seed,
            stop: &$req.stop,
            presence_penalty: $req.presence_penalty,
            frequency_penalty: $req.frequency_penalty,
            logit_bias: &$req.logit_bias,
            top_k: $req.top_k,
            min_p: $req.min_p,
            repetition_penalty: $req.repetition_penalty,
            stream: $req.stream,
            stream_options: $req.stream_options.as_ref(),
            ignore_eos: $req.ignore_eos,
        }
    };
}
pub(super) use sampling_fields;

impl SamplingFields<'_> {
    /// The sampling features both generation routes refuse: n > 1,
    /// penalties, logit biases, and vLLM's `top_k`, `min_p` and
    /// `repetition_penalty` at other than their neutral values (0 or -1, 0,
    /// 1): every backend samples with temperature and top_p alone. Checked
    /// first, before the route's own fields.
    pub fn refuse_unsupported(&self) -> Result<(), ApiError> {
        single_choice(self.n)?;
        zero_penalty(self.presence_penalty, "presence_penalty")?;
        zero_penalty(self.frequency_penalty, "frequency_penalty")?;
        if let Some(k) = self.top_k.filter(|k| *k != 0 && *k != -1) {
            return Err(ApiError::invalid(
                "top_k",
                format!("`top_k` is not supported (only 0 or -1, every token); got {k}"),
            ));
        }
        zero_penalty(self.min_p, "min_p")?;
        if let Some(p) = self.repetition_penalty.filter(|p| *p != 1.0) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("`repetition_penalty` is not supported (only 1); got {p}"),
            ));
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid(
                "logit_bias",
                "`logit_bias` is not supported",
            ));
        }
        Ok(())
    }

    /// `stream_options` with a field needs `stream: true`; an empty object
    /// is taken without it, as vLLM 0.33 does.
    pub fn check_stream_options(&self) -> Result<(), ApiError> {
        if self.stream_options.is_some_and(StreamOptions::is_set) && !self.stream {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` needs `stream: true`",
            ));
        }
        Ok(())
    }

    /// Whether a stream ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .is_some_and(|o| o.include_usage == Some(true))
    }

    /// The generation's sampling, stop sequences and `ignore_eos`, checked
    /// last; the route sets the rest of the parameters (`max_tokens`,
    /// log-probabilities), which are none here. `prompt_field` is the
    /// field that carries the prompt, named in errors.
    pub fn params(
        &self,
        limits: &Limits,
        prompt_field: &'static str,
    ) -> Result<GenerationParams, ApiError> {
        Ok(GenerationParams {
            max_tokens: None,
            sampling: sampling(self.temperature, self.top_p, self.seed)?,
            stop: stops(self.stop, limits)?,
            logprobs: None,
            prompt_logprobs: None,
            ignore_eos: self.ignore_eos,
            logprob_token_ids: Vec::new(),
            prompt_field,
        })
    }
}

fn float_in(value: f64, lo: f64, hi: f64, param: &str) -> Result<f32, ApiError> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be a number between {lo} and {hi}; got {value}"),
        ));
    }
    Ok(value as f32)
}

fn zero_penalty(value: Option<f64>, param: &str) -> Result<(), ApiError> {
    match value {
        None => Ok(()),
        Some(0.0) => Ok(()),
        Some(v) => Err(ApiError::invalid(
            param,
            format!("`{param}` is not supported (only 0); got {v}"),
        )),
    }
}

fn sampling(
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<i64>,
) -> Result<Sampling, ApiError> {
    Ok(Sampling {
        temperature: temperature.map_or(Ok(1.0), |t| float_in(t, 0.0, 2.0, "temperature"))?,
        top_p: match top_p {
            None => 1.0,
            Some(p) if p > 0.0 => float_in(p, 0.0, 1.0, "top_p")?,
            Some(p) => {
                return Err(ApiError::invalid(
                    "top_p",
                    format!("`top_p` must be greater than 0 and at most 1; got {p}"),
                ))
            }
        },
        seed: seed.map(seed_bits).transpose()?,
    })
}

/// A request's `seed`: any signed 64-bit integer but -1, which vLLM reads
/// as no seed (`vllm/sampling_params.py`), so the draw would not repeat.
/// Refused on both backends, so that a request means the same on each.
/// Carried as its bits; the vLLM backend sends the signed value back.
fn seed_bits(seed: i64) -> Result<u64, ApiError> {
    if seed == -1 {
        return Err(ApiError::invalid(
            "seed",
            "`seed` -1 is refused: vLLM reads it as no seed, so the draw would not repeat; \
             send another integer, or leave `seed` out to draw from the clock",
        ));
    }
    Ok(seed as u64)
}

fn stops(stop: &Option<StopSpec>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s.clone()],
        Some(StopSpec::Many(v)) => v.clone(),
    };
    if list.len() > limits.max_stop {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "at most {} stop sequences are allowed; got {}",
                limits.max_stop,
                list.len()
            ),
        ));
    }
    for s in &list {
        if s.is_empty() {
            return Err(ApiError::invalid(
                "stop",
                "stop sequences must not be empty",
            ));
        }
        if s.len() > limits.max_stop_bytes {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "a stop sequence may be at most {} bytes long",
                    limits.max_stop_bytes
                ),
            ));
        }
    }
    Ok(list)
}

/// `max_tokens` (or `max_completion_tokens`), when sent: 1 to 2^32 - 1.
pub fn max_tokens(value: Option<i64>, param: &str) -> Result<Option<usize>, ApiError> {
    value
        .map(|n| int_in(n, 1, i64::from(u32::MAX), param).map(|n| n as usize))
        .transpose()
}

/// `n`: one choice per request.
pub fn single_choice(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(v) => Err(ApiError::invalid(
            "n",
            format!("only n = 1 is supported; got {v}. Send several requests instead."),
        )),
    }
}
