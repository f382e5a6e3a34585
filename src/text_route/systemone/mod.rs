//! TypeSafe's System One below HTTP: its questions and requests, typed
//! (`question`), how the reference asks them and keys their tasks
//! (`ask`), and the prompt layout, as the reference decisio 0.35.0
//! serves it (`decisio/readout/letters.py`, `question_body` and
//! `chat_turn`; `decisio/families.py`, each base's settings).
//!
//! A wire question is put to the model as its instructions, a blank line,
//! its options lettered with *letter codes* (`A` to `Z`, then `AA`, `AB`,
//! ..., each kept only where ` CODE` is one token of the served tokenizer,
//! up to 255), a blank line and [`ANSWER_LINE`]; a yes/no question asked in
//! words ends with [`YES_NO_LINE`] and reads `yes` and `no`. The user turn
//! is the state, a blank line, the question. The rest is the base's
//! [`PromptFormat`] (`WireSettings::format` in `crate::bases`):
//!
//! - The Qwen base's, which a model of no base (the fixture) also takes: no
//!   system turn; after the chat template's generation prompt (thinking off)
//!   the assistant turn is prefilled with [`ANSWER_PREFILL`], and the answer
//!   is read at the next position from one token a label (` A`, ` B`, ...).
//! - The Gemma bases': a system turn ([`SYSTEM_PROMPT`]) first; the answer
//!   read at the template's own first assistant position, right after its
//!   generation prompt; every single-token form of a label read
//!   ([`label_forms`]: ` A`, `A`, a byte-fallback token) and their
//!   probabilities summed per label; and the header layout, the request's
//!   questions listed before the state ([`layout_header`]).
//!
//! The state's prefix (with the system turn and the header, where the format
//! has them) ends after the blank line that follows the state, where the
//! question's own text begins (the reference splits there, so every
//! question about one state shares those tokens exactly).

mod ask;
mod question;

pub use self::ask::{
    canonical_digest, choice_confidence, confidence_of, option_keys, option_set, render_text,
    score_confidence, state_text, task_identity, to_asked, Asked,
};
pub use self::question::{Criteria, Kind, WireQuestion, WireRequest, CHOICE_OPTIONS, SCORE_LEVELS};
pub use crate::bases::{
    AnswerSlot, LabelVariants, Layout, NoulRendering, PromptFormat, WireSettings,
};
use crate::prompt::TextTokenizer;

/// The most options a wire question may have: the wire's cap (an 8-bit
/// option index), and the most letter codes the route keeps.
pub const MAX_LABELS: usize = 255;

/// The closing line of a lettered question (`decisio/readout/spaced.py`).
pub const ANSWER_LINE: &str = "Answer with the letter of exactly one option, and nothing else:";

/// The closing line of a yes/no question asked in words.
pub const YES_NO_LINE: &str = "Answer with yes or no, and nothing else:";

/// What the assistant turn is prefilled with before the answer is read.
pub const ANSWER_PREFILL: &str = "Answer:";

/// The labels of a yes/no question asked in words, in answer order.
pub const YES_NO_LABELS: [&str; 2] = [" yes", " no"];

/// The system turn of the Gemma bases' prompt: four sentences from the
/// reference decisio (`decisio/readout/system_prompt.py`, which marks the
/// text MIT-licensed, Copyright (c) 2026 Nood Co and contributors),
/// reproduced as data under that licence.
pub const SYSTEM_PROMPT: &str = "You are a calibration engine. You never answer in prose. You are \
     given a state, a question and a numbered set of options, and you choose exactly one option. \
     You reply with that option's LETTER and nothing else \u{2014} a single character, no words, \
     no punctuation, no explanation.";

/// The heading of the header layout's list of the request's questions.
pub const QUESTIONS_HEAD: &str = "Questions that will be asked about the context:\n";

/// The header layout's lines before the state: [`QUESTIONS_HEAD`], one
/// `- <instructions>` line a question, in the request's order, and a blank
/// line.
pub fn layout_header<'a>(instructions: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = QUESTIONS_HEAD.to_string();
    for text in instructions {
        out.push_str(&format!("- {text}\n"));
    }
    out.push('\n');
    out
}

/// The token ids a label (a code such as `A`, or `yes`) is read from under
/// `format`, in a fixed order: one token, the form its slot reads (` A`
/// after `Answer:`, `A` in the template's slot), under single variants;
/// under summed ones every form that is one token and reads back as itself
/// (` A`, `A`; for `yes` and `no` also ` Yes` and `Yes`), then a
/// byte-fallback token for a one-character label where the tokenizer has
/// one (`<0x41>`), each once. `None` when no form is one token (or, under
/// single variants, the slot's form is not).
pub fn label_forms(
    tokenizer: &TextTokenizer,
    label: &str,
    format: &PromptFormat,
) -> Option<Vec<u32>> {
    let one = |text: &str| match tokenizer.encode(text, false) {
        Ok(ids) if ids.len() == 1 => Some(ids[0]),
        _ => None,
    };
    if format.variants == LabelVariants::Single {
        let text = match format.slot {
            AnswerSlot::Prefill => format!(" {label}"),
            AnswerSlot::Template => label.to_string(),
        };
        return one(&text).map(|id| vec![id]);
    }
    let mut texts = vec![format!(" {label}"), label.to_string()];
    if label.chars().all(|c| c.is_ascii_lowercase()) {
        let capital: String = label[..1].to_uppercase() + &label[1..];
        texts.push(format!(" {capital}"));
        texts.push(capital);
    }
    let reads_back = |id: u32, text: &str| {
        tokenizer
            .decode(&[id], false)
            .is_ok_and(|back| back == text)
    };
    let mut out: Vec<u32> = Vec::new();
    let mut keep = |id: u32| {
        if !out.contains(&id) {
            out.push(id);
        }
    };
    for text in &texts {
        if let Some(id) = one(text).filter(|&id| reads_back(id, text)) {
            keep(id);
        }
    }
    if let [byte] = label.as_bytes() {
        let name = format!("<0x{byte:02X}>");
        if let Some(id) = tokenizer
            .token_to_id(&name)
            .filter(|&id| tokenizer.id_to_token(id).as_deref() == Some(name.as_str()))
        {
            keep(id);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// How a wire question is asked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireAsk {
    /// Lettered options (choice and score questions, and yes/no questions
    /// asked as a two-option choice).
    Letters,
    /// A yes/no question in words, read from ` yes` and ` no`.
    YesNoWords,
}

/// The letter codes of a tokenizer: `A`..`Z`, then `AA`..`ZZ`, each kept
/// where ` CODE` is one token that no earlier code has, up to
/// [`MAX_LABELS`]; with each code's token id.
pub fn letter_codes(tokenizer: &TextTokenizer) -> Vec<(String, u32)> {
    one_token_codes(tokenizer, " ")
}

/// The codes `A`..`Z`, then `AA`..`ZZ`, each kept where `lead` and the
/// code are one token that no earlier code has, up to [`MAX_LABELS`]; with
/// each code's token id. The wire reads ` A` (`lead` a space); decisio's own
/// layout reads the bare code after the assistant turn's start.
pub fn one_token_codes(tokenizer: &TextTokenizer, lead: &str) -> Vec<(String, u32)> {
    let singles = ('A'..='Z').map(|c| c.to_string());
    let pairs = ('A'..='Z').flat_map(|a| ('A'..='Z').map(move |b| format!("{a}{b}")));
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(MAX_LABELS);
    for code in singles.chain(pairs) {
        if out.len() == MAX_LABELS {
            break;
        }
        if let Ok(ids) = tokenizer.encode(&format!("{lead}{code}"), false) {
            if ids.len() == 1 && seen.insert(ids[0]) {
                out.push((code, ids[0]));
            }
        }
    }
    out
}

/// A wire question's prompt as token ids, split where the question's own
/// tokens begin, as the reference splits it (`LettersEngine._rows` and
/// `state_prefix`): the whole prompt is tokenized once, and its prefix is
/// what remains when the question's own tokens (the suffix tokenized alone)
/// are taken off its end. Tokenizing the prefix alone would differ where a
/// pre-tokenizer reads the blank line after the state differently at the
/// end of a text. Where the whole prompt does not end with the suffix's
/// tokens, the prefix is what two prompts differing only in the question's
/// first letter share; a question whose first character merges into it is
/// refused.
pub fn split_ids(
    tokenizer: &TextTokenizer,
    prefix: &str,
    suffix: &str,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let encode = |text: &str| tokenizer.encode(text, false).map_err(|e| e.to_string());
    let full = encode(&format!("{prefix}{suffix}"))?;
    let own = encode(suffix)?;
    if full.len() > own.len() && full.ends_with(&own) {
        let n = full.len() - own.len();
        return Ok((full[..n].to_vec(), own));
    }
    let a = encode(&format!("{prefix}A"))?;
    let b = encode(&format!("{prefix}B"))?;
    let n = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if full.get(..n) != a.get(..n) {
        return Err(
            "the question's text merges with the state's last token; questions must \
                    not start with whitespace"
                .into(),
        );
    }
    Ok((full[..n].to_vec(), full[n..].to_vec()))
}

/// The question's own text: what follows the state's blank line in the user
/// turn (`question_body` of the reference's spaced layout).
pub fn question_text(
    ask: &WireAsk,
    instructions: &str,
    options: &[String],
    codes: &[String],
) -> String {
    match ask {
        WireAsk::YesNoWords => format!("{instructions}\n\n{YES_NO_LINE}"),
        WireAsk::Letters => {
            let listing: Vec<String> = codes
                .iter()
                .zip(options)
                .map(|(code, option)| format!("{code}. {option}"))
                .collect();
            format!(
                "{instructions}\n\nOptions:\n{}\n\n{ANSWER_LINE}",
                listing.join("\n")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lettered_question_reads_as_the_reference_writes_it() {
        let codes = vec!["A".to_string(), "B".to_string()];
        let options = vec!["Billing".to_string(), "Sales".to_string()];
        assert_eq!(
            question_text(&WireAsk::Letters, "Which team?", &options, &codes),
            "Which team?\n\nOptions:\nA. Billing\nB. Sales\n\n\
             Answer with the letter of exactly one option, and nothing else:"
        );
        assert_eq!(
            question_text(&WireAsk::YesNoWords, "Refund?", &[], &[]),
            "Refund?\n\nAnswer with yes or no, and nothing else:"
        );
    }
}
