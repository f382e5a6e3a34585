//! Decisions: a state and lettered questions become prompts sharing the
//! state's prefix; the answer distribution is read from the option letters'
//! next-token logits. `docs/design/text-route.md` states every rule here.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};

use super::{RouteError, TextRoute};
use crate::engine::{
    MultiQuestion, PackedPrompt, PadPolicy, QuestionScore, QuestionTokens, ScoreRequest, StateHash,
};
use crate::prompt::ChatTemplate;
use crate::stats::head::Head;
use crate::stats::{self, top_option};

/// The letters of options, in order; at most 26 options per question.
pub const LETTERS: [&str; 26] = [
    "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S",
    "T", "U", "V", "W", "X", "Y", "Z",
];

/// The letters' temperatures a question may ask for. Beyond them the
/// probabilities are 0 and 1, or uniform, to f32's precision for any
/// logits a model gives, and the temperature itself would not survive
/// the f32 of the answer (1e-45 is 0).
pub const TEMPERATURE_RANGE: (f64, f64) = (1e-3, 1e3);

/// Most questions in one request.
pub const MAX_QUESTIONS: usize = 256;

/// The line after the options that asks for the answer.
pub const ANSWER_CUE: &str = "Answer with the letter of the correct option.";

/// The text of the filler token that pads a state to a block boundary
/// (`--pad-policy block`): a space, one token in every supported tokenizer
/// (checked at start).
pub const PAD_TEXT: &str = " ";

/// A state: a text (`/v1/decide`) or the messages before the question (the
/// chat surface).
#[derive(Clone, Debug)]
pub enum State {
    Text(String),
    Messages(Vec<Value>),
}

/// One question, validated by the caller's layer for shape; checked here
/// for meaning.
#[derive(Clone, Debug)]
pub struct Question {
    pub id: Option<String>,
    pub text: String,
    pub options: Vec<String>,
    pub abstain_below: Option<f64>,
    pub temperature: Option<f64>,
    /// An intent task's head: the options are its labels, and the answer
    /// comes from the head on the answer position's hidden state instead
    /// of the letters.
    pub head: Option<Arc<Head>>,
}

/// A decision's answer to one question.
#[derive(Clone, Debug)]
pub struct Answer {
    pub id: Option<String>,
    /// The chosen option's letter; `None` when abstained or answered by
    /// an intent head.
    pub letter: Option<&'static str>,
    /// The chosen option's (or label's) index and text; `None` when abstained.
    pub index: Option<usize>,
    pub option: Option<String>,
    /// Answered by an intent head: the keys below are the labels.
    pub intent: bool,
    /// Each option's letter (an intent task's: each label) with its
    /// calibrated probability.
    pub probabilities: Vec<(String, f32)>,
    /// Each option's letter (or label) with its calibrated log-probability
    /// (finite even where the probability rounds to 0).
    pub calibrated_logprobs: Vec<(String, f32)>,
    /// Each option's letter with its raw log-probability over the
    /// vocabulary (none for an intent head).
    pub logprobs: Vec<(String, f32)>,
    pub temperature: f32,
    pub abstained: bool,
    pub abstain_reason: Option<String>,
    /// The top probability was shared, and the earliest option won.
    pub tie: bool,
    /// The top option (chosen, or best when abstained).
    pub top: usize,
}

/// The state as a decision saw it.
#[derive(Clone, Debug)]
pub struct StateInfo {
    pub hash: StateHash,
    pub tokens: usize,
    pub cached: bool,
    /// Set when the state is longer than the base is documented for.
    pub warning: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Decision {
    pub state: StateInfo,
    pub answers: Vec<Answer>,
    /// Prompt tokens over all questions (the prefix counted once).
    pub prompt_tokens: usize,
    /// Prompt tokens read from the prefix cache.
    pub cached_tokens: usize,
}

/// A question's prompt split at the end of the state.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub prefix: String,
    pub suffix: String,
}

fn invalid(param: &str, message: impl Into<String>) -> RouteError {
    RouteError::invalid(param, message)
}

/// The question block: the question, its lettered options, the cue. An
/// intent task's question is its text alone (its labels, up to a
/// thousand, are not listed: the head reads them off the hidden state).
pub fn question_block(q: &Question) -> String {
    if q.head.is_some() {
        return q.text.trim().to_string();
    }
    let mut text = q.text.trim().to_string();
    for (letter, option) in LETTERS.iter().zip(&q.options) {
        text.push_str(&format!("\n{letter}. {}", option.trim()));
    }
    text.push('\n');
    text.push_str(ANSWER_CUE);
    text
}

/// The instruction after the questions of a packed prompt.
pub const PACKED_CUE: &str = "Answer every question above, in order, one line per question: \
     the question's number, a colon, a space and the letter of the correct option (for \
     example `1: A`). Write nothing else.";

/// The questions of a packed prompt: each numbered, with its lettered
/// options, then [`PACKED_CUE`].
pub fn packed_block(questions: &[Question]) -> String {
    let mut text = String::new();
    for (i, q) in questions.iter().enumerate() {
        text.push_str(&format!("Question {}: {}", i + 1, q.text.trim()));
        for (letter, option) in LETTERS.iter().zip(&q.options) {
            text.push_str(&format!("\n{letter}. {}", option.trim()));
        }
        text.push_str("\n\n");
    }
    text.push_str(PACKED_CUE);
    text
}

/// The text that introduces the answer of question `i` (from 0) in a
/// packed answer sheet, `N:`; the letter follows with a space (` A`).
pub fn packed_marker(i: usize) -> String {
    format!("{}:", i + 1)
}

/// What separates the lines of a packed answer sheet.
pub const PACKED_SEPARATOR: &str = "\n";

/// Checks a question's meaning; `param` prefixes the field names.
pub fn check_question(q: &Question, param: &str) -> Result<(), RouteError> {
    if q.text.trim().is_empty() {
        return Err(invalid(&format!("{param}.text"), "the question is empty"));
    }
    let n = q.options.len();
    if q.head.is_some() {
        // An intent task's labels were checked at registration.
    } else if n < 2 || n > LETTERS.len() {
        return Err(invalid(
            &format!("{param}.options"),
            format!("a question needs 2 to 26 options (lettered A to Z); got {n}"),
        ));
    }
    // An intent task's labels were checked at registration.
    let options = if q.head.is_some() {
        &[][..]
    } else {
        &q.options[..]
    };
    for (i, option) in options.iter().enumerate() {
        if option.trim().is_empty() {
            return Err(invalid(
                &format!("{param}.options[{i}]"),
                "an option is empty",
            ));
        }
        if q.options[..i].iter().any(|o| o.trim() == option.trim()) {
            return Err(invalid(
                &format!("{param}.options[{i}]"),
                format!("the option `{}` appears twice", option.trim()),
            ));
        }
    }
    if let Some(a) = q.abstain_below {
        if !(a > 0.0 && a <= 1.0) {
            return Err(invalid(
                &format!("{param}.abstain_below"),
                format!("abstain_below must be in (0, 1]; got {a}"),
            ));
        }
    }
    if let Some(t) = q.temperature {
        let (lo, hi) = TEMPERATURE_RANGE;
        if !(lo..=hi).contains(&t) {
            return Err(invalid(
                &format!("{param}.temperature"),
                format!("temperature must be between {lo} and {hi}; got {t}"),
            ));
        }
    }
    Ok(())
}

/// Calibrated probabilities: softmax over the option letters' logits divided
/// by `temperature`, in f64, stored as f32.
pub fn calibrate(logits: &[f32], temperature: f64) -> Vec<f32> {
    f32s(stats::softmax(logits, temperature))
}

/// Calibrated log-probabilities: `log_softmax(logit / T)` over the option
/// letters, in f64, stored as f32.
pub fn calibrated_logprobs(logits: &[f32], temperature: f64) -> Vec<f32> {
    f32s(stats::log_softmax(logits, temperature))
}

/// f64 values stored as f32, as answers serve them.
fn f32s(v: Vec<f64>) -> Vec<f32> {
    v.into_iter().map(|x| x as f32).collect()
}

/// Template arguments for decisions: thinking off where the template has
/// the switch, so the first generated token is the answer.
fn decision_kwargs(template: &ChatTemplate) -> Map<String, Value> {
    let mut kwargs = Map::new();
    if template.supports_enable_thinking() {
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    }
    kwargs
}

/// Renders a question on a state through the chat template and splits the
/// text right after the state (after its last non-blank character).
pub fn render(
    template: &ChatTemplate,
    state: &State,
    q: &Question,
) -> Result<Rendered, RouteError> {
    render_block(template, state, question_block(q))
}

/// Renders all questions on a state as one packed prompt
/// ([`packed_block`]) and splits the text where the state ends.
pub fn render_packed(
    template: &ChatTemplate,
    state: &State,
    questions: &[Question],
) -> Result<Rendered, RouteError> {
    render_block(template, state, packed_block(questions))
}

/// Renders a question block (one question's, or a packed prompt's) after a
/// state and splits the text where the state ends.
fn render_block(
    template: &ChatTemplate,
    state: &State,
    block: String,
) -> Result<Rendered, RouteError> {
    let kwargs = decision_kwargs(template);
    let (messages, content, keep) = match state {
        State::Text(text) => {
            let content = format!("{text}\n\n{block}");
            let keep = text.trim_end().len();
            (
                vec![serde_json::json!({"role": "user", "content": content})],
                content,
                keep,
            )
        }
        State::Messages(msgs) => {
            let mut m = msgs.clone();
            m.push(serde_json::json!({"role": "user", "content": block}));
            (m, block.clone(), 0)
        }
    };
    let text = template
        .render(&messages, true, &kwargs)
        .map_err(|e| invalid("messages", e.to_string()))?;
    // The question's message content appears verbatim in the rendering;
    // the prefix ends right after the state's last non-blank character.
    let start = text.rfind(content.as_str()).ok_or_else(|| {
        invalid(
            "state",
            "the chat template changes the message content, so the state cannot be \
                 split from the question",
        )
    })?;
    let end = start + keep;
    Ok(Rendered {
        prefix: text[..end].to_string(),
        suffix: text[end..].to_string(),
    })
}

impl TextRoute {
    /// Token ids of the letters A..Z, each a single token (checked at start).
    pub fn letter_ids(tokenizer: &crate::prompt::TextTokenizer) -> Result<Vec<u32>, String> {
        LETTERS
            .iter()
            .map(|l| match tokenizer.encode(l, false) {
                Ok(ids) if ids.len() == 1 => Ok(ids[0]),
                Ok(ids) => Err(format!(
                    "the option letter `{l}` is {} tokens in this tokenizer ({ids:?}); the \
                     letters readout needs each of A to Z to be one token",
                    ids.len()
                )),
                Err(e) => Err(format!("cannot tokenize the letter `{l}`: {e}")),
            })
            .collect()
    }

    /// Renders a question on a state and splits it where the state ends.
    pub fn render_decision(&self, state: &State, q: &Question) -> Result<Rendered, RouteError> {
        render(&self.template, state, q)
    }

    /// Answers `questions` on `state`: one scoring job, each question its
    /// own continuation of the shared prefix, run as `mode` says (default:
    /// the backend's).
    pub async fn decide(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        mode: Option<MultiQuestion>,
    ) -> Result<Decision, RouteError> {
        let caps = self.engine().capabilities();
        let mode = match mode {
            None => caps
                .modes
                .first()
                .copied()
                .unwrap_or(MultiQuestion::Sequential),
            Some(m) if caps.modes.contains(&m) => m,
            Some(m) => {
                let served: Vec<_> = caps
                    .modes
                    .iter()
                    .map(|m| format!("`{}`", m.as_str()))
                    .collect();
                return Err(invalid(
                    "multi_question",
                    format!(
                        "`{}` is not served by the {} backend; it runs {} (the vLLM backend \
                         runs `warm`, `sequential` and `packed`)",
                        m.as_str(),
                        caps.name,
                        served.join(" and ")
                    ),
                ));
            }
        };
        if questions.is_empty() || questions.len() > MAX_QUESTIONS {
            return Err(invalid(
                "questions",
                format!(
                    "a request takes 1 to {MAX_QUESTIONS} questions; got {}",
                    questions.len()
                ),
            ));
        }
        let started = Instant::now();
        let layer = head_layer(&questions)?;
        let (prefix, tokens, packed) = if mode == MultiQuestion::Packed {
            let (prefix, tokens, packed) = self.prepare_packed(&state, &questions)?;
            (prefix, tokens, Some(packed))
        } else {
            let (prefix, tokens) = self.prepare(&state, &questions)?;
            (prefix, tokens, None)
        };
        let hash = self.state_hash(&prefix);
        let suffix_lengths: Vec<usize> = tokens.iter().map(|t| t.suffix.len()).collect();
        let prompt_tokens = match &packed {
            Some(p) => p.prompt.len(),
            None => prefix.len() + suffix_lengths.iter().sum::<usize>(),
        };
        let receiver = self.engine().score(ScoreRequest {
            state: hash,
            prefix: prefix.clone(),
            questions: tokens,
            hidden: layer.is_some(),
            hidden_layer: layer.flatten(),
            mode,
            cache: true,
            packed,
        })?;
        let result = receiver
            .await
            .map_err(|_| RouteError::Engine(crate::engine::EngineError::Stopped))??;
        let label = if result.cached { "cached" } else { "new" };
        let memoised_tokens: usize = result
            .questions
            .iter()
            .zip(&suffix_lengths)
            .filter(|(score, _)| score.memoised)
            .map(|(_, &n)| n)
            .sum();
        let per_question = started.elapsed().as_secs_f64() / questions.len() as f64;
        let mut answers = Vec::with_capacity(questions.len());
        for (q, score) in questions.into_iter().zip(result.questions) {
            self.metrics
                .question_seconds
                .with_label_values(&[&self.model_name, label])
                .observe(per_question);
            let answer = match q.head.clone() {
                Some(head) => {
                    let hidden = score.hidden.as_deref().ok_or_else(|| {
                        RouteError::Engine(crate::engine::EngineError::Model(
                            "the backend returned no hidden state for an intent task".into(),
                        ))
                    })?;
                    intent_answer(q, &head, hidden)
                }
                None => self.answer(q, &score.logits, &score.logprobs),
            };
            if answer.abstained {
                self.metrics.abstentions.inc();
            }
            answers.push(answer);
        }
        Ok(Decision {
            state: StateInfo {
                hash,
                tokens: prefix.len(),
                cached: result.cached,
                warning: self.long_state_warning(prefix.len()),
            },
            answers,
            prompt_tokens,
            cached_tokens: if result.cached { prefix.len() } else { 0 } + memoised_tokens,
        })
    }

    /// The state hash of a prefix on this model, tokenizer and padding.
    fn state_hash(&self, prefix: &[u32]) -> StateHash {
        StateHash::new(
            &self.engine().info().identity,
            &self.tokenizer_identity,
            &self.engine().capabilities().padding.label(),
            prefix,
        )
    }

    /// The token ids of a state's prefix text, padded as the backend's
    /// padding policy says.
    fn prefix_ids(&self, prefix_text: &str) -> Result<Vec<u32>, RouteError> {
        let mut prefix = self.tokenize(prefix_text, false)?;
        if let PadPolicy::Block(block) = self.engine().capabilities().padding {
            let short = (block - prefix.len() % block) % block;
            let filler = self.pad_id.ok_or_else(|| {
                invalid(
                    "state",
                    "the tokenizer has no single-token filler, so states cannot be padded; \
                     serve with --pad-policy none",
                )
            })?;
            prefix.extend(std::iter::repeat_n(filler, short));
        }
        Ok(prefix)
    }

    /// Checks and renders `questions` on `state` as one packed prompt: the
    /// prefix's token ids, each question's (empty) suffix with the letters
    /// it reads after `N: `, and the prompt with the answer sheet's markers.
    fn prepare_packed(
        &self,
        state: &State,
        questions: &[Question],
    ) -> Result<(Vec<u32>, Vec<QuestionTokens>, PackedPrompt), RouteError> {
        let most = self.limits.max_packed_questions;
        if questions.len() > most {
            return Err(invalid(
                "questions",
                format!(
                    "multi_question `packed` takes 1 to {most} questions; got {} (send more in \
                     `warm` mode, or in several requests)",
                    questions.len()
                ),
            ));
        }
        let letters = self.packed_letter_ids.as_ref().ok_or_else(|| {
            invalid(
                "multi_question",
                "the tokenizer does not write each of ` A` to ` Z` as one token, so packed \
                 answers cannot be read; use `warm` or `sequential`",
            )
        })?;
        for (i, q) in questions.iter().enumerate() {
            check_question(q, &format!("questions[{i}]"))?;
            if q.head.is_some() {
                return Err(invalid(
                    &format!("questions[{i}].task"),
                    "multi_question `packed` reads option letters; questions on intent tasks \
                     are answered in `warm` or `sequential` mode",
                ));
            }
        }
        let r = render_packed(&self.template, state, questions)?;
        let prefix = self.prefix_ids(&r.prefix)?;
        let mut prompt = prefix.clone();
        prompt.extend(self.tokenize(&r.suffix, false)?);
        // The sheet's first marker ends the prompt: the first generated
        // token is the first answer.
        prompt.extend(self.tokenize(&packed_marker(0), false)?);
        let markers = (0..questions.len())
            .map(|i| match i {
                0 => Ok(Vec::new()),
                _ => self.tokenize(&packed_marker(i), false),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let separator = self.tokenize(PACKED_SEPARATOR, false)?;
        let max_tokens = markers.iter().map(|m| m.len() + 1).sum::<usize>()
            + (markers.len() - 1) * separator.len()
            + 1;
        let context = self.context_length();
        if prompt.len() + max_tokens >= context {
            return Err(RouteError::ContextLength {
                message: format!(
                    "This model's maximum context length is {context} tokens. However, the \
                     packed prompt takes {} tokens and its answers up to {max_tokens}; shorten \
                     the state or send fewer questions.",
                    prompt.len()
                ),
                param: "state",
            });
        }
        let tokens = questions
            .iter()
            .map(|q| QuestionTokens {
                suffix: Vec::new(),
                read: letters[..q.options.len()].to_vec(),
            })
            .collect();
        Ok((
            prefix,
            tokens,
            PackedPrompt {
                prompt,
                markers,
                separator,
                max_tokens,
            },
        ))
    }

    /// Checks and renders `questions` on `state`: the prefix's token ids and
    /// each question's suffix with the letters it reads.
    fn prepare(
        &self,
        state: &State,
        questions: &[Question],
    ) -> Result<(Vec<u32>, Vec<QuestionTokens>), RouteError> {
        let mut prefix_text: Option<String> = None;
        let mut suffixes = Vec::with_capacity(questions.len());
        for (i, q) in questions.iter().enumerate() {
            check_question(q, &format!("questions[{i}]"))?;
            let r = self.render_decision(state, q)?;
            match &prefix_text {
                None => prefix_text = Some(r.prefix),
                Some(p) if *p != r.prefix => {
                    return Err(RouteError::Engine(crate::engine::EngineError::Model(
                        "questions on one state rendered different prefixes".into(),
                    )))
                }
                Some(_) => {}
            }
            suffixes.push(r.suffix);
        }
        let prefix = self.prefix_ids(&prefix_text.unwrap_or_default())?;
        let mut tokens = Vec::with_capacity(questions.len());
        let context = self.context_length();
        for (q, suffix) in questions.iter().zip(&suffixes) {
            let ids = self.tokenize(suffix, false)?;
            if prefix.len() + ids.len() >= context {
                return Err(RouteError::ContextLength {
                    message: format!(
                        "This model's maximum context length is {context} tokens. However, the \
                         state and a question take {} tokens; shorten the state.",
                        prefix.len() + ids.len()
                    ),
                    param: "state",
                });
            }
            // An intent question reads one letter (unused): the head reads
            // the hidden state.
            let read = self.letter_ids[..q.options.len().min(if q.head.is_some() {
                1
            } else {
                LETTERS.len()
            })]
                .to_vec();
            tokens.push(QuestionTokens { suffix: ids, read });
        }
        Ok((prefix, tokens))
    }

    /// The raw letter logits of one question on a state, as a decision
    /// reads them, without the prefix cache and without serving metrics
    /// (task registration scores its examples with it).
    pub async fn readout(&self, state: State, question: Question) -> Result<Vec<f32>, RouteError> {
        Ok(self.score_alone(state, question, false, None).await?.logits)
    }

    /// The hidden state at the answer position of `question` on `state`
    /// (block `layer`'s output, or the final norm's), as a decision naming
    /// an intent task computes it, without the prefix cache (task
    /// registration reads its examples' features with it).
    pub async fn features(
        &self,
        state: State,
        question: Question,
        layer: Option<usize>,
    ) -> Result<Vec<f32>, RouteError> {
        self.score_alone(state, question, true, layer)
            .await?
            .hidden
            .ok_or(RouteError::Engine(crate::engine::EngineError::Model(
                "the backend returned no hidden state".into(),
            )))
    }

    /// One question on a state, scored outside the prefix cache.
    async fn score_alone(
        &self,
        state: State,
        question: Question,
        hidden: bool,
        hidden_layer: Option<usize>,
    ) -> Result<QuestionScore, RouteError> {
        let questions = [question];
        let (prefix, tokens) = self.prepare(&state, &questions)?;
        let hash = self.state_hash(&prefix);
        let receiver = self.engine().score(ScoreRequest {
            state: hash,
            prefix,
            questions: tokens,
            hidden,
            hidden_layer,
            mode: MultiQuestion::Sequential,
            cache: false,
            packed: None,
        })?;
        let mut result = receiver
            .await
            .map_err(|_| RouteError::Engine(crate::engine::EngineError::Stopped))??;
        result
            .questions
            .pop()
            .ok_or(RouteError::Engine(crate::engine::EngineError::Stopped))
    }

    /// The answer from the letters' logits: temperature (the request's, else
    /// the base's default), abstention, tie-break.
    fn answer(&self, q: Question, logits: &[f32], logprobs: &[f32]) -> Answer {
        let temperature = q.temperature.unwrap_or(self.default_temperature);
        let probabilities = calibrate(logits, temperature);
        let (top, tie) = top_option(&probabilities);
        let best = probabilities[top];
        let threshold = q.abstain_below;
        let abstained = threshold.is_some_and(|t| f64::from(best) < t);
        let letters = &LETTERS[..q.options.len()];
        Answer {
            id: q.id,
            letter: (!abstained).then_some(letters[top]),
            index: (!abstained).then_some(top),
            option: (!abstained).then(|| q.options[top].clone()),
            intent: false,
            probabilities: letters
                .iter()
                .map(|l| l.to_string())
                .zip(probabilities.iter().copied())
                .collect(),
            calibrated_logprobs: letters
                .iter()
                .map(|l| l.to_string())
                .zip(calibrated_logprobs(logits, temperature))
                .collect(),
            logprobs: letters
                .iter()
                .map(|l| l.to_string())
                .zip(logprobs.iter().copied())
                .collect(),
            temperature: temperature as f32,
            abstained,
            abstain_reason: abstained.then(|| {
                format!(
                    "the top probability {best:.4} (option {}) is below abstain_below {}",
                    letters[top],
                    threshold.unwrap_or_default()
                )
            }),
            tie,
            top,
        }
    }
}

/// The tapped layer of a request's intent questions: `None` when none
/// names an intent task, `Some(None)` for the final norm's output. The
/// questions of one request share one tap.
fn head_layer(questions: &[Question]) -> Result<Option<Option<usize>>, RouteError> {
    let mut layer: Option<Option<usize>> = None;
    for (i, q) in questions.iter().enumerate() {
        if let Some(h) = &q.head {
            match layer {
                None => layer = Some(h.layer),
                Some(l) if l == h.layer => {}
                Some(_) => {
                    return Err(invalid(
                        &format!("questions[{i}].task"),
                        "the intent tasks of one request must read the same `head.layer`; \
                         send questions on heads of other layers in another request",
                    ))
                }
            }
        }
    }
    Ok(layer)
}

/// An intent task's answer: the head's logits on the hidden state, divided
/// by the temperature (the request's, else the head's), then abstention and
/// tie-break as for letters.
pub fn intent_answer(q: Question, head: &Head, hidden: &[f32]) -> Answer {
    let logits = head.logits(hidden);
    let temperature = q.temperature.unwrap_or(head.temperature);
    let probabilities = calibrate(&logits, temperature);
    let (top, tie) = top_option(&probabilities);
    let best = probabilities[top];
    let threshold = q.abstain_below;
    let abstained = threshold.is_some_and(|t| f64::from(best) < t);
    Answer {
        id: q.id,
        letter: None,
        index: (!abstained).then_some(top),
        option: (!abstained).then(|| q.options[top].clone()),
        intent: true,
        probabilities: q
            .options
            .iter()
            .cloned()
            .zip(probabilities.iter().copied())
            .collect(),
        calibrated_logprobs: q
            .options
            .iter()
            .cloned()
            .zip(calibrated_logprobs(&logits, temperature))
            .collect(),
        logprobs: Vec::new(),
        temperature: temperature as f32,
        abstained,
        abstain_reason: abstained.then(|| {
            format!(
                "the top probability {best:.4} (label `{}`) is below abstain_below {}",
                q.options[top],
                threshold.unwrap_or_default()
            )
        }),
        tie,
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_divides_logits_by_the_temperature() {
        let p = calibrate(&[2.0, 1.0, 0.0], 1.0);
        let sum: f32 = p.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert!(p[0] > p[1] && p[1] > p[2]);
        let hot = calibrate(&[2.0, 1.0, 0.0], 10.0);
        assert!(hot[0] < p[0], "a higher temperature flattens");
        let cold = calibrate(&[2.0, 1.0, 0.0], 0.1);
        assert!(cold[0] > 0.99);
        // Log-probabilities stay finite where probabilities round to 0.
        let lp = calibrated_logprobs(&[2.0, 1.0, 0.0], 0.0005);
        assert!(lp.iter().all(|v| v.is_finite()), "{lp:?}");
        assert_eq!(lp[0], 0.0);
    }

    #[test]
    fn ties_go_to_the_earliest_option() {
        assert_eq!(top_option(&[0.2, 0.4, 0.4]), (1, true));
        assert_eq!(top_option(&[0.5, 0.3, 0.2]), (0, false));
        let even = calibrate(&[1.5, 1.5], 1.0);
        assert_eq!(top_option(&even), (0, true));
    }

    fn q(text: &str, options: &[&str]) -> Question {
        Question {
            id: None,
            text: text.into(),
            options: options.iter().map(|s| s.to_string()).collect(),
            abstain_below: None,
            temperature: None,
            head: None,
        }
    }

    #[test]
    fn questions_are_checked() {
        assert!(check_question(&q("Is it?", &["yes", "no"]), "q").is_ok());
        let bad = |question: Question, field: &str| match check_question(&question, "q") {
            Err(RouteError::Invalid { param, .. }) => assert_eq!(param.as_deref(), Some(field)),
            other => panic!("{other:?}"),
        };
        bad(q("  ", &["yes", "no"]), "q.text");
        bad(q("Is it?", &["yes"]), "q.options");
        bad(q("Is it?", &vec!["x"; 27]), "q.options");
        bad(q("Is it?", &["yes", ""]), "q.options[1]");
        bad(q("Is it?", &["yes", "no", "yes"]), "q.options[2]");
        let mut t = q("Is it?", &["yes", "no"]);
        t.temperature = Some(0.0);
        bad(t.clone(), "q.temperature");
        t.temperature = Some(5e-324);
        bad(t.clone(), "q.temperature");
        t.temperature = Some(1e4);
        bad(t, "q.temperature");
        let mut a = q("Is it?", &["yes", "no"]);
        a.abstain_below = Some(1.5);
        bad(a, "q.abstain_below");
    }

    #[test]
    fn the_block_letters_the_options() {
        let block = question_block(&q("Which?", &["red", "green"]));
        assert_eq!(block, format!("Which?\nA. red\nB. green\n{ANSWER_CUE}"));
    }
}
