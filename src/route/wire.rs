//! The System One wire's prompt layout, as the reference decisio 0.35.0
//! serves it (`decisio/readout/letters.py`, `question_body` and
//! `chat_turn`; `decisio/families.py`, each base's settings).
//!
//! A wire question is put to the model as its instructions, a blank line,
//! its options lettered with *letter codes* (`A` to `Z`, then `AA`, `AB`,
//! ..., each kept only where ` CODE` is one token of the served tokenizer,
//! up to 255), a blank line and [`ANSWER_LINE`]; a yes/no question asked in
//! words ends with [`YES_NO_LINE`] and reads ` yes` and ` no`. The user turn
//! is the state, a blank line, the question; after the chat template's
//! generation prompt (thinking off) the assistant turn is prefilled with
//! [`ANSWER_PREFILL`], and the answer is read at the next position from the
//! labels' tokens (` A`, ` B`, ...).
//!
//! The state's prefix ends after the blank line that follows the state, where
//! the question's own text begins (the reference splits there, so every
//! question about one state shares those tokens exactly).

pub use crate::bases::{NoulRendering, WireSettings};
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
