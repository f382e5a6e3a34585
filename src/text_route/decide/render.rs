//! The prompts of a decision: a question's block (or a packed prompt's)
//! after the state, through the chat template, split where the state ends
//! so that the state's tokens are a prefix the cache can share. A System
//! One question is written in the wire's layout (`text_route::systemone`).

use serde_json::{Map, Value};

use super::{invalid, Lettering, Question, State, LETTERS};
use crate::prompt::ChatTemplate;
use crate::text_route::systemone::{self, AnswerSlot, PromptFormat, WireAsk};
use crate::text_route::{RouteError, TextRoute};

/// The line after the options that asks for the answer.
pub const ANSWER_CUE: &str = "Answer with the letter of the correct option.";

/// A question's prompt split at the end of the state.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub prefix: String,
    pub suffix: String,
}

/// The question block: the question, its options lettered by `codes`, the
/// cue. An intent task's question is its text alone (its labels, up to a
/// thousand, are not listed: the head reads them off the hidden state).
pub fn question_block(q: &Question, codes: &[String]) -> String {
    if q.head.is_some() {
        return q.text.trim().to_string();
    }
    let mut text = q.text.trim().to_string();
    for (letter, option) in codes.iter().zip(&q.options) {
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

/// Template arguments for decisions: thinking off where the template has
/// the switch, so the first generated token is the answer.
fn decision_kwargs(template: &ChatTemplate) -> Map<String, Value> {
    let mut kwargs = Map::new();
    if template.supports_enable_thinking() {
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    }
    kwargs
}

/// Renders a question on a state through the chat template, its options
/// lettered by `codes`, and splits the text right after the state (after its
/// last non-blank character).
pub fn render(
    template: &ChatTemplate,
    state: &State,
    q: &Question,
    codes: &[String],
) -> Result<Rendered, RouteError> {
    render_block(
        template,
        state,
        question_block(q, codes),
        Split::AfterState,
        None,
    )
}

/// Renders a System One question on a state in the wire's layout
/// ([`crate::text_route::systemone`]) under a base's prompt `format`: the system turn
/// where the format has one, the question's own text after the state's
/// blank line, and `Answer:` after the generation prompt under the prefill
/// slot (nothing under the template's); the text splits where the
/// question's own text begins. `codes` letter its options. Under the header
/// layout `state` already starts with the header ([`systemone::layout_header`]).
pub fn render_wire(
    template: &ChatTemplate,
    state: &State,
    q: &Question,
    ask: &WireAsk,
    codes: &[String],
    format: &PromptFormat,
) -> Result<Rendered, RouteError> {
    let (text, content) = wire_turn(template, state, q, ask, codes, format)?;
    split_at_state(text, &content, state, Split::AfterBlankLine)
}

/// A System One question's whole prompt on a state, unsplit, as
/// [`render_wire`] renders it: the reference's `user_turn`, which it
/// measures a row by (a template that trims the turn's content may render
/// a state too short to split, such as an empty one).
pub fn render_wire_text(
    template: &ChatTemplate,
    state: &State,
    q: &Question,
    ask: &WireAsk,
    codes: &[String],
    format: &PromptFormat,
) -> Result<String, RouteError> {
    wire_turn(template, state, q, ask, codes, format).map(|(text, _)| text)
}

/// One user turn of `content` as the wire renders a question's (the
/// system turn where the format has one, `Answer:` under the prefill
/// slot): the reference's `user_turn(tok, content, fmt)`, which the header
/// limit measures the template by with an empty content.
pub fn render_wire_user_turn(
    template: &ChatTemplate,
    content: &str,
    format: &PromptFormat,
) -> Result<String, RouteError> {
    let system = format.system_turn.then_some(systemone::SYSTEM_PROMPT);
    let turn = State::Messages(Vec::new());
    let (mut text, _) = render_turn(template, &turn, content.to_string(), system)?;
    if format.slot == AnswerSlot::Prefill {
        text.push_str(systemone::ANSWER_PREFILL);
    }
    Ok(text)
}

/// [`render_wire`]'s text, unsplit, with its last turn's content.
fn wire_turn(
    template: &ChatTemplate,
    state: &State,
    q: &Question,
    ask: &WireAsk,
    codes: &[String],
    format: &PromptFormat,
) -> Result<(String, String), RouteError> {
    let block = systemone::question_text(ask, q.text.trim(), &q.options, codes);
    let system = format.system_turn.then_some(systemone::SYSTEM_PROMPT);
    let (mut text, content) = render_turn(template, state, block, system)?;
    if format.slot == AnswerSlot::Prefill {
        text.push_str(systemone::ANSWER_PREFILL);
    }
    Ok((text, content))
}

/// Where a question's prompt splits into the state's prefix and its own
/// suffix.
#[derive(Clone, Copy)]
enum Split {
    /// Right after the state's last non-blank character (decisio's own
    /// layout).
    AfterState,
    /// After the blank line that follows the state, where the question's
    /// own text begins (the System One wire's, as the reference splits).
    AfterBlankLine,
}

/// Renders all questions on a state as one packed prompt
/// ([`packed_block`]) and splits the text where the state ends.
pub fn render_packed(
    template: &ChatTemplate,
    state: &State,
    questions: &[Question],
) -> Result<Rendered, RouteError> {
    render_block(
        template,
        state,
        packed_block(questions),
        Split::AfterState,
        None,
    )
}

/// Renders a question block (one question's, or a packed prompt's) after a
/// state, behind a system turn when `system` is given, and splits the text
/// where the state ends.
fn render_block(
    template: &ChatTemplate,
    state: &State,
    block: String,
    split: Split,
    system: Option<&str>,
) -> Result<Rendered, RouteError> {
    let (text, content) = render_turn(template, state, block, system)?;
    split_at_state(text, &content, state, split)
}

/// Splits a rendered prompt where `state` ends in its last turn's
/// `content`.
fn split_at_state(
    text: String,
    content: &str,
    state: &State,
    split: Split,
) -> Result<Rendered, RouteError> {
    let keep = match (state, split) {
        (State::Text(text), Split::AfterState) => text.trim_end().len(),
        (State::Text(text), Split::AfterBlankLine) => text.len() + 2,
        (State::Messages(_), _) => 0,
    };
    // The question's message content appears verbatim in the rendering;
    // the prefix ends right after the state's last non-blank character.
    let start = text.rfind(content).ok_or_else(|| {
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

/// The chat template's rendering of a question block after a state (a
/// text: one user turn, the state, a blank line and the block; messages:
/// the block as a last user turn), behind a system turn when `system` is
/// given, with the generation prompt; and the last turn's content.
fn render_turn(
    template: &ChatTemplate,
    state: &State,
    block: String,
    system: Option<&str>,
) -> Result<(String, String), RouteError> {
    let kwargs = decision_kwargs(template);
    let (mut messages, content) = match state {
        State::Text(text) => {
            let content = format!("{text}\n\n{block}");
            let user = serde_json::json!({"role": "user", "content": content});
            (vec![user], content)
        }
        State::Messages(msgs) => {
            let mut m = msgs.clone();
            m.push(serde_json::json!({"role": "user", "content": block}));
            (m, block)
        }
    };
    if let Some(system) = system {
        messages.insert(0, serde_json::json!({"role": "system", "content": system}));
    }
    let text = template
        .render(&messages, true, &kwargs)
        .map_err(|e| invalid("messages", e.to_string()))?;
    Ok((text, content))
}

impl TextRoute {
    /// Renders a question on a state and splits it where the state ends.
    pub fn render_decision(&self, state: &State, q: &Question) -> Result<Rendered, RouteError> {
        let codes = self.code_names(q)?;
        match &q.wire {
            None => render(&self.template, state, q, &codes),
            Some(ask) => render_wire(&self.template, state, q, ask, &codes, &self.wire.format),
        }
    }

    /// A question's whole prompt on `state`, unsplit: [`render_wire_text`]
    /// for a System One question.
    pub fn render_whole(&self, state: &State, q: &Question) -> Result<String, RouteError> {
        let codes = self.code_names(q)?;
        match &q.wire {
            None => render(&self.template, state, q, &codes).map(|r| r.prefix + &r.suffix),
            Some(ask) => render_wire_text(&self.template, state, q, ask, &codes, &self.wire.format),
        }
    }

    /// The one lettering of a question's options, with each code's token
    /// id: decisio's letters in its own layout, the wire's letter codes on
    /// the System One wire, none for a yes/no question asked in words (read
    /// from `yes` and `no`). Refused when the tokenizer has too few.
    pub fn codes(&self, q: &Question) -> Result<&[(String, u32)], RouteError> {
        match q.lettering() {
            Lettering::Letters => self.decide_codes(q.options.len()),
            Lettering::Codes => self.wire_codes(q.options.len()),
            Lettering::YesNoWords => Ok(&[]),
        }
    }

    /// [`Self::codes`]' names.
    fn code_names(&self, q: &Question) -> Result<Vec<String>, RouteError> {
        Ok(self.codes(q)?.iter().map(|(c, _)| c.clone()).collect())
    }

    /// The first `n` letter codes of decisio's own layout, with their token
    /// ids; refused when the tokenizer has fewer (an intent question reads
    /// one).
    pub fn decide_codes(&self, n: usize) -> Result<&[(String, u32)], RouteError> {
        self.letter_codes.get(..n).ok_or_else(|| {
            invalid(
                "options",
                format!(
                    "{n} options, but this tokenizer writes only {} letter codes (A to Z, AA, \
                     ...) as one token each; send at most that many options",
                    self.letter_codes.len()
                ),
            )
        })
    }

    /// The first `n` letter codes of the System One wire, with the token
    /// id of the form a single-form read takes; refused when the tokenizer
    /// has fewer. The codes whose spaced form is one token (` A`), or, where
    /// the base's format reads the bare form alone, those whose bare form is
    /// ([`crate::text_route::systemone::PromptFormat::bare_codes`]).
    pub fn wire_codes(&self, n: usize) -> Result<&[(String, u32)], RouteError> {
        let codes = if self.wire.format.bare_codes() {
            &self.letter_codes
        } else {
            &self.wire_codes
        };
        codes.get(..n).ok_or_else(|| {
            invalid(
                "options",
                format!(
                    "{n} options, but this tokenizer writes only {} letter codes as one token \
                     each; send at most that many options",
                    codes.len()
                ),
            )
        })
    }

    /// A System One question's own text, as its prompt shows it after the
    /// state (what `usage.input_tokens` counts of it).
    pub fn wire_question_text(&self, q: &Question) -> Result<String, RouteError> {
        let ask = q.wire.clone().unwrap_or(WireAsk::Letters);
        let codes = match ask {
            WireAsk::Letters => self.wire_codes(q.options.len())?,
            WireAsk::YesNoWords => &[],
        };
        let codes: Vec<String> = codes.iter().map(|(c, _)| c.clone()).collect();
        Ok(systemone::question_text(
            &ask,
            q.text.trim(),
            &q.options,
            &codes,
        ))
    }
}
