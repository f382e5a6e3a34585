//! The prompts of a decision: a question's block (or a packed prompt's)
//! after the state, through the chat template, split where the state ends
//! so that the state's tokens are a prefix the cache can share.

use serde_json::{Map, Value};

use super::{invalid, Question, State, LETTERS};
use crate::prompt::ChatTemplate;
use crate::route::{RouteError, TextRoute};

/// The line after the options that asks for the answer.
pub const ANSWER_CUE: &str = "Answer with the letter of the correct option.";

/// A question's prompt split at the end of the state.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub prefix: String,
    pub suffix: String,
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
    /// Renders a question on a state and splits it where the state ends.
    pub fn render_decision(&self, state: &State, q: &Question) -> Result<Rendered, RouteError> {
        render(&self.template, state, q)
    }
}
