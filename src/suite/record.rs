//! A run record (`record.json`): who answered, every answer's float32
//! values, and the figures computed from them.
//!
//! Probabilities and log-probabilities are the server's float32 values,
//! written as JSON numbers that convert back to the same float32 bits.
//! Figures use the options' raw letter log-probabilities as logits:
//! accuracy, NLL and ECE (15 equal bins of the top probability, with the
//! reliability table) at temperature 1 and at the set's own fitted
//! temperature (fitted on the set itself, so "after" is in-sample).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stats::calibrate::{self, Figures};
use crate::stats::head::Draw;

/// The record format this build writes and reads.
pub const RECORD_FORMAT: &str = "decisio-record/1";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub format: String,
    pub suite: SuiteId,
    /// The `decisio` object of the server's `/v1/models` card.
    pub server: Value,
    /// The served model's name.
    pub model: String,
    /// The client's version.
    pub client_version: String,
    /// Every setting of the suite's requests that changes an answer.
    pub request_settings: Value,
    pub choice_sets: Vec<ChoiceRecord>,
    /// All choice sets' answers together.
    pub pooled: Option<SetFigures>,
    pub intent_sets: Vec<IntentRecord>,
    pub conformance: Vec<Conformance>,
    /// Milliseconds per question, client-side.
    #[serde(default)]
    pub latency: Option<Latency>,
    /// The server's memory figures from `/metrics` (name to value).
    #[serde(default)]
    pub memory: Option<Value>,
    /// Wall seconds of the run, over its resumptions.
    pub seconds: f64,
    /// Times the run was resumed.
    pub resumed: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuiteId {
    pub name: String,
    pub version: u32,
    /// SHA-256 of the suite file.
    pub digest: String,
    pub seed: u64,
}

/// One answer as the server gave it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AnswerRecord {
    pub id: String,
    /// The right option's index.
    pub gold: usize,
    /// The served answer's index (null when abstained).
    pub index: Option<usize>,
    /// Each option's probability at temperature 1, float32.
    pub probabilities: Vec<f32>,
    /// Each option's letter log-probability over the vocabulary, float32.
    pub letter_logprobs: Vec<f32>,
}

/// Accuracy, NLL, ECE before and after a fitted temperature.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SetFigures {
    pub questions: usize,
    /// Temperature 1.
    pub before: Figures,
    /// The temperature fitted on these answers.
    pub after: Figures,
}

impl SetFigures {
    pub fn of(answers: &[&AnswerRecord]) -> Option<SetFigures> {
        if answers.is_empty() {
            return None;
        }
        let logits: Vec<Vec<f32>> = answers.iter().map(|a| a.letter_logprobs.clone()).collect();
        let labels: Vec<usize> = answers.iter().map(|a| a.gold).collect();
        let t = calibrate::fit_temperature(&logits, &labels);
        Some(SetFigures {
            questions: answers.len(),
            before: calibrate::figures(&logits, &labels, 1.0),
            after: calibrate::figures(&logits, &labels, t),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChoiceRecord {
    pub name: String,
    pub figures: Option<SetFigures>,
    pub answers: Vec<AnswerRecord>,
}

/// An intent set's registration and its heads over draws.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IntentRecord {
    pub name: String,
    pub labels: usize,
    pub examples: usize,
    pub draws: usize,
    pub shots: usize,
    pub per_draw: Vec<Draw>,
    pub accuracy_mean: f64,
    pub accuracy_sd: f64,
    pub ece_mean: f64,
    pub ece_sd: f64,
    /// The served head's holdout figures at its fitted temperature.
    pub after: Figures,
    /// The registration's holdout asked again as served decisions.
    pub served: ServedHoldout,
    /// The task's whole result, as `GET /v1/tasks/{id}` gave it.
    pub result: Value,
}

/// An intent task's held-out examples asked again through `POST
/// /v1/decide` (`{"task": name}`), against what the registration reported
/// for them at the fitted temperature.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServedHoldout {
    pub questions: usize,
    pub accuracy: f64,
    pub nll: f64,
    pub registration_accuracy: f64,
    pub registration_nll: f64,
    /// The same accuracy, and the same NLL within 1e-6 (the registration
    /// reports figures, not each example's values).
    pub equal: bool,
}

/// The file `scripts/sdk_conformance.py` writes beside a record: its chat
/// questions asked again through the OpenAI Python SDK.
pub const SDK_FILE: &str = "sdk-conformance.json";

/// What the OpenAI SDK was given for a record's chat questions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SdkCheck {
    /// The client, e.g. `openai-python 1.x`.
    pub client: String,
    pub items: Vec<SdkAnswer>,
}

/// One chat question asked again through the SDK: the reply's `decisio`
/// answer values, and what its OpenAI fields said.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SdkAnswer {
    pub set: String,
    pub id: String,
    /// `decisio.answer.probabilities`, by option, float32.
    pub probabilities: Vec<f32>,
    /// `decisio.answer.letter_logprobs`, by option, float32.
    pub letter_logprobs: Vec<f32>,
    /// `choices[0].message.content`.
    pub content: String,
    /// The tokens of `choices[0].logprobs.content[0].top_logprobs`.
    pub top_logprobs: Vec<String>,
}

impl SdkCheck {
    /// The SDK's file beside a record (a record folder or its
    /// record.json), when there is one.
    pub fn beside(record: &std::path::Path) -> anyhow::Result<Option<SdkCheck>> {
        read_beside(record, SDK_FILE, "an SDK conformance file")
    }
}

/// The JSON file `name` beside a record (in a record folder, or beside
/// its record.json), when there is one; `what` names it in errors.
pub fn read_beside<T: serde::de::DeserializeOwned>(
    record: &std::path::Path,
    name: &str,
    what: &str,
) -> anyhow::Result<Option<T>> {
    use anyhow::Context;
    let dir = if record.is_dir() {
        record
    } else {
        record.parent().unwrap_or(std::path::Path::new("."))
    };
    let file = dir.join(name);
    if !file.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    serde_json::from_str(&text)
        .map(Some)
        .with_context(|| format!("{} is not {what}", file.display()))
}

/// The surfaces' names in a record's conformance, as people read them.
const SURFACES: [(&str, &str); 2] = [
    ("decide", "POST /v1/decide"),
    ("chat", "POST /v1/chat/completions"),
];

impl Record {
    /// Per surface asked again: (its name as people read it, questions
    /// equal bit for bit, questions).
    pub fn conformance_by_surface(&self) -> Vec<(String, usize, usize)> {
        let mut out = Vec::new();
        for (key, shown) in SURFACES {
            let of: Vec<&Conformance> = self
                .conformance
                .iter()
                .filter(|c| c.surface == key)
                .collect();
            if !of.is_empty() {
                let equal = of.iter().filter(|c| c.equal).count();
                out.push((shown.to_string(), equal, of.len()));
            }
        }
        let other = self
            .conformance
            .iter()
            .filter(|c| !SURFACES.iter().any(|(k, _)| *k == c.surface));
        for c in other {
            out.push((c.surface.clone(), usize::from(c.equal), 1));
        }
        out
    }
}

/// A question asked again through a served surface.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Conformance {
    pub set: String,
    pub id: String,
    /// `decide` (alone in a `POST /v1/decide`) or `chat` (a chat
    /// question, again through `POST /v1/chat/completions`).
    pub surface: String,
    /// A chat question's request, as sent: what a client such as the
    /// OpenAI SDK sends to ask it again (`scripts/sdk_conformance.py`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Value>,
    pub probabilities: Vec<f32>,
    pub letter_logprobs: Vec<f32>,
    /// Bit for bit the suite's answer.
    pub equal: bool,
}

/// Client-side milliseconds per question.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Latency {
    /// Questions on a state the server had not seen (a request's time over
    /// its questions).
    pub new_state: Quantiles,
    /// One question alone on a state the server had cached.
    pub cached_state: Quantiles,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Quantiles {
    pub n: usize,
    pub median: Option<f64>,
    pub p90: Option<f64>,
}

impl Quantiles {
    pub fn of(mut v: Vec<f64>) -> Quantiles {
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * p).round() as usize]);
        Quantiles {
            n: v.len(),
            median: q(0.5),
            p90: q(0.9),
        }
    }
}

impl Record {
    pub fn read(path: &std::path::Path) -> anyhow::Result<Record> {
        use anyhow::Context;
        let file = if path.is_dir() {
            path.join("record.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read the record {}", file.display()))?;
        let r: Record = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a run record", file.display()))?;
        if r.format != RECORD_FORMAT {
            anyhow::bail!(
                "{} is a `{}` record; this decisio reads `{RECORD_FORMAT}`",
                file.display(),
                r.format
            );
        }
        Ok(r)
    }

    /// The temperature fitted on all choice sets together: the base's
    /// served default a record can set.
    pub fn pooled_temperature(&self) -> Option<f64> {
        self.pooled.as_ref().map(|p| p.after.temperature)
    }

    /// The tables a person reads.
    pub fn summary(&self) -> String {
        let s = &self.server;
        let mut md = format!(
            "# Run record: suite `{}` on `{}`\n\n\
             - server: decisio {} ({} backend), architecture `{}`, base {}\n\
             - model identity `{}`, tokenizer identity `{}`\n\
             - padding `{}`, default temperature {}; suite digest `{}`, seed {}\n\
             - {:.0} s{}\n\n",
            self.suite.name,
            self.model,
            s["version"].as_str().unwrap_or("?"),
            s["backend"].as_str().unwrap_or("?"),
            s["architecture"].as_str().unwrap_or("?"),
            s["base"]
                .as_str()
                .map_or("none".into(), |b| format!("`{b}`")),
            s["model_identity"].as_str().unwrap_or("?"),
            s["tokenizer_identity"].as_str().unwrap_or("?"),
            s["padding"].as_str().unwrap_or("?"),
            s["default_temperature"],
            &self.suite.digest[..12.min(self.suite.digest.len())],
            self.suite.seed,
            self.seconds,
            if self.resumed > 0 {
                format!(", resumed {} times", self.resumed)
            } else {
                String::new()
            },
        );
        md.push_str("## Choice sets\n\n| set | questions | accuracy | NLL | ECE | fitted T | NLL after | ECE after |\n|---|---|---|---|---|---|---|---|\n");
        let rows = self
            .choice_sets
            .iter()
            .filter_map(|c| c.figures.as_ref().map(|f| (c.name.as_str(), f)))
            .chain(self.pooled.as_ref().map(|p| ("**pooled**", p)));
        for (name, f) in rows {
            md.push_str(&format!(
                "| {name} | {} | {:.4} | {:.4} | {:.4} | {:.3} | {:.4} | {:.4} |\n",
                f.questions,
                f.before.accuracy,
                f.before.nll,
                f.before.ece,
                f.after.temperature,
                f.after.nll,
                f.after.ece
            ));
        }
        if !self.intent_sets.is_empty() {
            md.push_str("\n## Intent sets (heads over draws, on the registration's holdout)\n\n| set | labels | examples | draws x shots | accuracy mean | sd | ECE mean | sd | served head accuracy |\n|---|---|---|---|---|---|---|---|---|\n");
            for i in &self.intent_sets {
                md.push_str(&format!(
                    "| {} | {} | {} | {} x {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} |\n",
                    i.name,
                    i.labels,
                    i.examples,
                    i.draws,
                    i.shots,
                    i.accuracy_mean,
                    i.accuracy_sd,
                    i.ece_mean,
                    i.ece_sd,
                    i.after.accuracy
                ));
            }
        }
        if !self.conformance.is_empty() {
            md.push_str("\n## Conformance\n\n");
            for (surface, equal, n) in self.conformance_by_surface() {
                md.push_str(&format!(
                    "- {equal} of {n} questions asked again alone through `{surface}` gave the suite's float32 values bit for bit.\n"
                ));
            }
        }
        for i in &self.intent_sets {
            let s = &i.served;
            md.push_str(&format!(
                "\nIntent set `{}`: its {} held-out examples asked again as served decisions: accuracy {:.4} and NLL {:.6} (the registration: {:.4} and {:.6}){}.\n",
                i.name,
                s.questions,
                s.accuracy,
                s.nll,
                s.registration_accuracy,
                s.registration_nll,
                if s.equal { ", the same" } else { ": they DIFFER" }
            ));
        }
        if let Some(l) = &self.latency {
            let f = |q: &Quantiles| {
                format!(
                    "{} (p90 {}, n = {})",
                    q.median.map_or("-".into(), |m| format!("{m:.1} ms")),
                    q.p90.map_or("-".into(), |m| format!("{m:.1} ms")),
                    q.n
                )
            };
            md.push_str(&format!(
                "\n## Latency (client-side, per question)\n\n- new state: median {}\n- cached state, one question alone: median {}\n",
                f(&l.new_state),
                f(&l.cached_state)
            ));
        }
        if let Some(m) = self.memory.as_ref().and_then(Value::as_object) {
            md.push_str("\n## Server memory (`/metrics`)\n\n");
            for (k, v) in m {
                md.push_str(&format!("- `{k}`: {v}\n"));
            }
        }
        md
    }
}
