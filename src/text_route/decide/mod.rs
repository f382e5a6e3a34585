//! Decisions: a state and lettered questions become prompts sharing the
//! state's prefix; the answer distribution is read from the option letters'
//! next-token logits. `docs/design/text-route.md` states every rule here.
//!
//! This file holds the request's types, the checks of a question's meaning
//! and the scoring job; `render.rs` writes the prompts, `prepare.rs` turns
//! them into token ids, `answer.rs` reads the answers off the logits (or
//! an intent head).

mod answer;
mod orders;
mod prepare;
mod render;
mod think;

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

pub use self::answer::{calibrate, calibrated_logprobs, intent_answer};
pub use self::orders::{checked as checked_orders, rotation, MAX_ORDERS};
pub use self::render::{
    packed_block, packed_marker, question_block, render, render_packed, render_wire,
    render_wire_text, render_wire_user_turn, Rendered, ANSWER_CUE, PACKED_CUE, PACKED_SEPARATOR,
};
pub use self::think::{mix, Thought, THINK_MAX_OPTIONS, THINK_PREFIX, THINK_SUFFIX};

use super::{RouteError, TextRoute};
use crate::engine::{
    MultiQuestion, PackedPrompt, QuestionScore, QuestionTokens, ScoreRequest, StateHash,
};
use crate::stats::head::Head;
use crate::text_route::systemone::WireAsk;

/// A decision's prompts: the state's tokens, each question's suffix and,
/// for the packed mode, the one packed prompt.
type Prepared = Result<(Vec<u32>, Vec<QuestionTokens>, Option<PackedPrompt>), RouteError>;

/// The first 26 letter codes, one letter each (a packed prompt's options
/// take these alone).
pub const LETTERS: [&str; 26] = [
    "A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S",
    "T", "U", "V", "W", "X", "Y", "Z",
];

/// The letters' temperatures a question may ask for. Beyond them the
/// probabilities are 0 and 1, or uniform, to f32's precision for any
/// logits a model gives, and the temperature itself would not survive
/// the f32 of the answer (1e-45 is 0).
pub const TEMPERATURE_RANGE: (f64, f64) = (1e-3, 1e3);

/// Most options of a question: `A` to `Z`, then two-letter codes `AA`,
/// `AB`, ... (those the tokenizer writes as one token), as the System One
/// wire letters them.
pub const MAX_OPTIONS: usize = crate::text_route::systemone::MAX_LABELS;

/// Most questions in one request.
pub const MAX_QUESTIONS: usize = 256;

/// A text is blank when it is empty or whitespace only, whitespace as
/// `str::trim` counts it (`char::is_whitespace`: Unicode's White_Space,
/// U+00A0 included). Every field refused when blank is checked with it;
/// the description's non-blank `pattern` is the class of the characters it
/// skips (held to it by tests/openapi.rs).
pub fn is_blank(text: &str) -> bool {
    text.trim().is_empty()
}

/// The text of the filler token that pads a state to a block boundary
/// (`--pad-policy block`): a newline, the reference decisio's filler
/// (`PAD_TOKEN`, its Qwen tokenizer's `\n`), one token in every supported
/// tokenizer (checked at start).
pub const PAD_TEXT: &str = "\n";

/// How a state's prefix is padded before any backend reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadPolicy {
    /// The prefix is the state's tokens, as rendered.
    None,
    /// The prefix is front-padded (before the chat template's first token)
    /// with the [`PAD_TEXT`] token to a multiple of this many tokens, so a
    /// block-granular prefix cache (vLLM's) holds the whole state; both
    /// backends read the same padded prompt.
    Block(usize),
}

impl PadPolicy {
    /// The policy's name in the state hash and the served identity.
    pub fn label(self) -> String {
        match self {
            PadPolicy::None => "none".into(),
            PadPolicy::Block(n) => format!("front{n}"),
        }
    }
}

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
    /// Asked in the System One wire's layout (`text_route::systemone`): the text is
    /// the instructions, and the options are lettered with letter codes
    /// (up to 255); `None` for decisio's own layout.
    pub wire: Option<WireAsk>,
    /// A task's letter bias, subtracted from the letters' logits of a
    /// single read before the temperature ([`crate::stats::debias`]); an
    /// answer averaged over rotations has none to remove.
    pub bias: Option<Arc<[f64]>>,
    /// Listed in the header layout's list of the request's questions
    /// (`--header-limit` leaves the last out where the list would put a
    /// row over the prompt ceiling); no header at all when none is.
    pub listed: bool,
}

/// How a question's options are named and read: the one lettering every
/// step (rendering, the codes, the labels, the tokens read, the orders)
/// asks a question for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lettering {
    /// decisio's own layout: letters `A`..`Z`, `AA`, ... (an intent task's
    /// question reads one letter; its head answers).
    Letters,
    /// The System One wire's layout, its options lettered with letter
    /// codes.
    Codes,
    /// The System One wire's layout, a yes/no question asked in words and
    /// read from `yes` and `no`.
    YesNoWords,
}

impl Question {
    /// How the question's options are named and read.
    pub fn lettering(&self) -> Lettering {
        match self.wire {
            None => Lettering::Letters,
            Some(WireAsk::Letters) => Lettering::Codes,
            Some(WireAsk::YesNoWords) => Lettering::YesNoWords,
        }
    }

    /// A question of `text` over `options` in decisio's own layout: no id,
    /// no abstention, the route's temperature, no head, no letter bias. The
    /// `with_*` methods set the rest; every layer builds its questions
    /// here.
    pub fn new(text: impl Into<String>, options: Vec<String>) -> Self {
        Self {
            id: None,
            text: text.into(),
            options,
            abstain_below: None,
            temperature: None,
            head: None,
            wire: None,
            bias: None,
            listed: true,
        }
    }

    /// The id its answer carries.
    pub fn with_id(self, id: Option<String>) -> Self {
        Self { id, ..self }
    }

    /// Abstains when the top probability is below `abstain_below`.
    pub fn with_abstention(self, abstain_below: Option<f64>) -> Self {
        Self {
            abstain_below,
            ..self
        }
    }

    /// Answered at `temperature` (else the route's default, or a head's).
    pub fn with_temperature(self, temperature: Option<f64>) -> Self {
        Self {
            temperature,
            ..self
        }
    }

    /// Asked in the System One wire's layout, lettered by `wire`.
    pub fn with_wire(self, wire: Option<WireAsk>) -> Self {
        Self { wire, ..self }
    }

    /// Answered by an intent task's `head` on the hidden state.
    pub fn with_head(self, head: Option<Arc<Head>>) -> Self {
        Self { head, ..self }
    }

    /// A task's letter bias, removed from a single read's logits.
    pub fn with_bias(self, bias: Option<Arc<[f64]>>) -> Self {
        Self { bias, ..self }
    }
}

/// A decision's answer to one question.
#[derive(Clone, Debug)]
pub struct Answer {
    pub id: Option<String>,
    /// The chosen option's letter (a letter code on the System One wire, or
    /// `yes`/`no`); `None` when abstained or answered by an intent head.
    pub letter: Option<String>,
    /// The chosen option's (or label's) index and text; `None` when abstained.
    pub index: Option<usize>,
    pub option: Option<String>,
    /// Answered by an intent head: the keys below are the labels.
    pub intent: bool,
    /// Each option's letter (an intent task's: each label) with its
    /// calibrated probability.
    pub probabilities: Vec<(String, f32)>,
    /// The same calibrated probabilities in f64, as computed (the System
    /// One wire answers with them).
    pub exact: Vec<f64>,
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
    /// The cyclic orders of the options it was read in and averaged over
    /// (`x_orders`, `orders.rs`); 1 for one read.
    pub orders: usize,
}

impl Answer {
    /// The top option's probability in f64, as the readout rule computed
    /// it ([`crate::stats::Readout::confidence`]): what a certificate's
    /// threshold is compared with.
    pub fn confidence(&self) -> f64 {
        self.exact.get(self.top).copied().unwrap_or(0.0)
    }
}

/// Whether a decision is a client's (served: the prefix cache and the
/// serving metrics see it) or the server's own, unobserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    Served,
    Unobserved,
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

fn invalid(param: &str, message: impl Into<String>) -> RouteError {
    RouteError::invalid(param, message)
}

/// Checks a question's meaning; `param` prefixes the field names.
pub fn check_question(q: &Question, param: &str) -> Result<(), RouteError> {
    if is_blank(&q.text) {
        return Err(invalid(&format!("{param}.text"), "the question is empty"));
    }
    let n = q.options.len();
    if q.lettering() != Lettering::Letters || q.head.is_some() {
        // The wire's layer checked a wire question's options (2 to 255; two
        // may read alike, as the reference asks them); an intent task's
        // labels were checked at registration.
    } else if !(2..=MAX_OPTIONS).contains(&n) {
        return Err(invalid(
            &format!("{param}.options"),
            format!(
                "a question needs 2 to {MAX_OPTIONS} options (lettered A to Z, then AA, AB, \
                 ...); got {n}"
            ),
        ));
    }
    let options = if q.head.is_some() || q.lettering() != Lettering::Letters {
        &[][..]
    } else {
        &q.options[..]
    };
    for (i, option) in options.iter().enumerate() {
        if is_blank(option) {
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

impl TextRoute {
    /// Answers `questions` on `state`: one scoring job, each question its
    /// own continuation of the shared prefix, run as `mode` says (default:
    /// the backend's).
    pub async fn decide(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        mode: Option<MultiQuestion>,
    ) -> Result<Decision, RouteError> {
        self.decide_in_orders(state, questions, mode, 1).await
    }

    /// Like [`Self::decide`], each question with lettered options asked in
    /// `orders` cyclic orders of them (at most one per option) on the one
    /// state read, and answered from their average (`orders.rs`).
    pub async fn decide_in_orders(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        mode: Option<MultiQuestion>,
        orders: usize,
    ) -> Result<Decision, RouteError> {
        self.decide_with(state, questions, mode, orders, Served::Served)
            .await
    }

    /// [`Self::decide_in_orders`] as no client asked it: the same answers, bit for
    /// bit, read without the prefix cache (no served state is evicted for
    /// it) and without the serving metrics. An abstention task's
    /// registration reads its examples with it.
    pub async fn decide_unobserved(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        orders: usize,
    ) -> Result<Decision, RouteError> {
        self.decide_with(state, questions, None, orders, Served::Unobserved)
            .await
    }

    /// The multi-question mode a decision runs in: the one asked, when the
    /// backend serves it, else the backend's first.
    fn mode(&self, mode: Option<MultiQuestion>) -> Result<MultiQuestion, RouteError> {
        let caps = self.engine().capabilities();
        match mode {
            None => Ok(caps
                .modes
                .first()
                .copied()
                .unwrap_or(MultiQuestion::Sequential)),
            Some(m) if caps.modes.contains(&m) => Ok(m),
            Some(m) => {
                let served: Vec<_> = caps
                    .modes
                    .iter()
                    .map(|m| format!("`{}`", m.as_str()))
                    .collect();
                Err(invalid(
                    "multi_question",
                    format!(
                        "`{}` is not served by the {} backend; it runs {} (the vLLM backend \
                     runs `warm`, `sequential` and `packed`)",
                        m.as_str(),
                        caps.name,
                        served.join(" and ")
                    ),
                ))
            }
        }
    }

    /// The decision's prompts, rendered and tokenized on the blocking pool,
    /// off the caller's thread (an HTTP worker serves other requests
    /// meanwhile); the questions come back with them.
    async fn prepared(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        asked: Vec<Question>,
        mode: MultiQuestion,
    ) -> Result<(Vec<Question>, Vec<Question>, Prepared), RouteError> {
        let route = self.clone();
        tokio::task::spawn_blocking(move || {
            let prepared = if mode == MultiQuestion::Packed {
                route
                    .prepare_packed(&state, &asked)
                    .map(|(prefix, tokens, packed)| (prefix, tokens, Some(packed)))
            } else {
                route
                    .prepare(&state, &questions, &asked)
                    .map(|(prefix, tokens)| (prefix, tokens, None))
            };
            (questions, asked, prepared)
        })
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(panic) => RouteError::Engine(crate::engine::panicked(&*panic)),
            Err(e) => RouteError::Engine(crate::engine::EngineError::Model(e.to_string())),
        })
    }

    async fn decide_with(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        mode: Option<MultiQuestion>,
        orders: usize,
        served: Served,
    ) -> Result<Decision, RouteError> {
        let observed = served == Served::Served;
        let mode = self.mode(mode)?;
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
        let plan = orders::Plan::new(&questions, orders)?;
        let asked = plan.asked(&questions);
        let (questions, asked, prepared) = self.prepared(state, questions, asked, mode).await?;
        let (prefix, tokens, packed) = prepared?;
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
            cache: observed,
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
        let mut scores = result.questions.into_iter();
        let mut asked = asked.into_iter();
        for (q, &k) in questions.into_iter().zip(&plan.orders) {
            if observed {
                self.metrics
                    .question_seconds
                    .with_label_values(&[&self.model_name, label])
                    .observe(per_question);
            }
            let read: Vec<(Question, QuestionScore)> =
                asked.by_ref().zip(scores.by_ref()).take(k).collect();
            let answer = match (q.head.clone(), &read[..]) {
                (Some(head), [(_, score)]) => {
                    let hidden = score.hidden.as_deref().ok_or_else(|| {
                        RouteError::Engine(crate::engine::EngineError::Model(
                            "the backend returned no hidden state for an intent task".into(),
                        ))
                    })?;
                    intent_answer(q, &head, hidden)
                }
                (_, [(_, score)]) => self.answer_read(q, &score.logits, &score.logprobs)?,
                _ => self.answer_in_orders(q, &read)?,
            };
            if answer.abstained && observed {
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

    /// The raw letter logits of one question on a state, as a decision
    /// reads them (one a label: a label read from several forms has their
    /// log-sum-exp), without the prefix cache and without serving metrics
    /// (task registration scores its examples with it).
    pub async fn readout(&self, state: State, question: Question) -> Result<Vec<f32>, RouteError> {
        let mut read = self.readout_rotations(state, question, 1).await?;
        read.pop()
            .ok_or(RouteError::Engine(crate::engine::EngineError::Stopped))
    }

    /// [`Self::readout`] of `question` in `k` cyclic rotations of its
    /// options (`orders.rs`), each its own continuation of one read
    /// of the state: the letter logits per rotation, in position order
    /// (rotation 0, the order given, first).
    pub async fn readout_rotations(
        &self,
        state: State,
        question: Question,
        k: usize,
    ) -> Result<Vec<Vec<f32>>, RouteError> {
        let questions = [question];
        let asked = orders::Plan::new(&questions, k)?.asked(&questions);
        let scores = self.score_alone(state, &asked, false, None).await?;
        asked
            .iter()
            .zip(scores)
            .map(|(q, score)| self.label_values(q, &score.logits))
            .collect()
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
        self.score_alone(state, &[question], true, layer)
            .await?
            .pop()
            .and_then(|s| s.hidden)
            .ok_or(RouteError::Engine(crate::engine::EngineError::Model(
                "the backend returned no hidden state".into(),
            )))
    }

    /// Questions on one read of a state, scored outside the prefix cache,
    /// as the backend reads a decision's questions by default (its first
    /// mode; `sequential` where that is `packed`, whose one prompt is not
    /// the questions' own): the vLLM backend's `warm` list continues the
    /// state as MLX's question pass does, so a task learnt on either
    /// backend reads the same numbers.
    async fn score_alone(
        &self,
        state: State,
        questions: &[Question],
        hidden: bool,
        hidden_layer: Option<usize>,
    ) -> Result<Vec<QuestionScore>, RouteError> {
        let (prefix, tokens) = self.prepare(&state, &questions[..1], questions)?;
        let hash = self.state_hash(&prefix);
        let mode = match self.engine().capabilities().modes.first() {
            Some(MultiQuestion::Packed) | None => MultiQuestion::Sequential,
            Some(&m) => m,
        };
        let receiver = self.engine().score(ScoreRequest {
            state: hash,
            prefix,
            questions: tokens,
            hidden,
            hidden_layer,
            mode,
            cache: false,
            packed: None,
        })?;
        let result = receiver
            .await
            .map_err(|_| RouteError::Engine(crate::engine::EngineError::Stopped))??;
        if result.questions.len() != questions.len() {
            return Err(RouteError::Engine(crate::engine::EngineError::Stopped));
        }
        Ok(result.questions)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str, options: &[&str]) -> Question {
        Question::new(text, options.iter().map(|s| s.to_string()).collect())
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
        let many: Vec<String> = (0..=MAX_OPTIONS).map(|i| format!("o{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        bad(q("Is it?", &many), "q.options");
        assert!(check_question(&q("Is it?", &many[..MAX_OPTIONS]), "q").is_ok());
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
        let codes = ["A".to_string(), "B".to_string()];
        let block = question_block(&q("Which?", &["red", "green"]), &codes);
        assert_eq!(block, format!("Which?\nA. red\nB. green\n{ANSWER_CUE}"));
    }
}
