//! A state longer than the prompt ceiling: refused (the default), or cut
//! to its start, as the reference decisio 0.35.0 cuts it
//! (`decisio/serve/over_limit.py`, `fit_state`).
//!
//! A request's questions share one state prefix (the prefix cache depends
//! on it), so the state is cut once a request, to what its longest row
//! leaves: the ceiling less the tokens that row takes without a state (the
//! template, the header where the layout has one, the question), less
//! [`MARGIN`] and the padding block. The cut lands at a token, moved back to
//! whitespace within [`BACK_UP`] tokens so that the state does not end
//! mid-word; no marker is inserted (a tuned model has not seen one, and the
//! response reports the cut). A cut state is a prefix of the whole one, so
//! the same state cut at two ceilings nests.

use serde::Serialize;

use super::{PadPolicy, Question, RouteError, State, TextRoute};
use crate::settings::HeaderLimit;

pub use crate::settings::OverLimit;

/// The only part of a state kept: its start.
pub const PART: &str = "start";

/// How far, in tokens, the cut may move back to land on whitespace.
pub const BACK_UP: usize = 64;

/// Tokens kept free below the ceiling (the reference's margin for the
/// padding and re-tokenizing at the cut).
pub const MARGIN: usize = 32;

/// A cut state, as the response reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// The kept text's own tokens.
    pub kept_tokens: usize,
    /// The whole state's tokens.
    pub of_tokens: usize,
    /// [`PART`].
    pub part: &'static str,
    /// The prompt ceiling cut to, in tokens.
    pub limit: usize,
}

impl Cut {
    /// The whole state's tokens less the kept text's.
    pub fn dropped(&self) -> usize {
        self.of_tokens.saturating_sub(self.kept_tokens)
    }
}

/// Whitespace as Python's `str.isspace` knows it (the reference's test of
/// a cut): Unicode's White_Space and the four information separators
/// U+001C to U+001F.
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `n` with its thousands grouped by commas (`2,048`), as the reference
/// writes its counts.
pub(crate) fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// The state text to ask about and, where it was cut, the [`Cut`].
/// `body` is the state's text; `overhead` the tokens of the request's
/// longest row without a state; `limit` the longest prompt the engine
/// answers; `reserve` more tokens kept free (the padding block). `encode`
/// and `decode` are the served tokenizer's, without special tokens added.
/// An error (a sentence) where no part of the state fits.
pub fn fit_state<E, D>(
    encode: E,
    decode: D,
    body: &str,
    overhead: usize,
    limit: usize,
    reserve: usize,
) -> Result<(String, Option<Cut>), String>
where
    E: Fn(&str) -> Result<Vec<u32>, String>,
    D: Fn(&[u32]) -> Result<String, String>,
{
    let room = limit as i64 - overhead as i64 - MARGIN as i64 - reserve as i64;
    // A token is at least one byte: a state of at most `room` bytes fits
    // untokenized.
    if body.len() as i64 <= room {
        return Ok((body.to_string(), None));
    }
    let ids = encode(body)?;
    if ids.len() as i64 <= room {
        return Ok((body.to_string(), None));
    }
    if room < 1 {
        return Err(format!(
            "the questions alone are over the prompt limit of {} tokens (the longest row takes \
             {} without a state); shorten the question or its options",
            grouped(limit),
            grouped(overhead)
        ));
    }
    let room = room as usize;
    let first = |s: String| s.chars().next().is_some_and(is_space);
    let last = |s: String| s.chars().next_back().is_some_and(is_space);
    let mut cut = room;
    for j in (room.saturating_sub(BACK_UP) + 1..=room).rev() {
        if first(decode(&ids[j..j + 1])?) || last(decode(&ids[j - 1..j])?) {
            cut = j;
            break;
        }
    }
    let decoded = decode(&ids[..cut])?;
    let mut text: Vec<char> = decoded
        .trim_end_matches(is_space)
        .trim_end_matches('\u{fffd}')
        .trim_end_matches(is_space)
        .chars()
        .collect();
    let tokens = |t: &[char]| encode(&t.iter().collect::<String>()).map(|ids| ids.len());
    // Re-tokenizing the text can differ at its end: shortened until it fits.
    while !text.is_empty() && tokens(&text)? > room {
        let n = text.len();
        text.truncate(n - (n / 200).max(1));
        while text.last().is_some_and(|&c| is_space(c)) {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(format!(
            "no part of the state fits the prompt limit of {} tokens beside the question",
            grouped(limit)
        ));
    }
    let kept_tokens = tokens(&text)?;
    Ok((
        text.into_iter().collect(),
        Some(Cut {
            kept_tokens,
            of_tokens: ids.len(),
            part: PART,
            limit,
        }),
    ))
}

impl TextRoute {
    /// The longest prompt the engine answers, in tokens: `--over-limit-tokens`
    /// where set, else the context less the one token read.
    pub fn prompt_limit(&self) -> usize {
        self.limits
            .over_limit_tokens
            .unwrap_or_else(|| self.context_length().saturating_sub(1))
    }

    /// The tokens of the longest row of `questions` (a System One request's,
    /// as planned) without a state: the whole prompt, header included where
    /// the layout has one, rendered on an empty state.
    pub fn longest_row_without_state(&self, questions: &[Question]) -> Result<usize, RouteError> {
        let empty = self.wire_state(&State::Text(String::new()), questions);
        let mut longest = 0;
        for q in questions {
            longest = longest.max(self.count_tokens(&self.render_whole(&empty, q)?)?);
        }
        Ok(longest)
    }

    /// A System One state's text cut to what `questions` leave below
    /// [`TextRoute::prompt_limit`] ([`fit_state`]), and the cut; the text
    /// itself where it fits. A 413-class error where nothing fits.
    pub fn fit_wire_state(
        &self,
        text: &str,
        questions: &[Question],
    ) -> Result<(String, Option<Cut>), RouteError> {
        // Under a header limit the header gives way before the state: the
        // state is cut for the plain row.
        let unlisted: Vec<Question>;
        let questions = match self.limits.header_limit {
            HeaderLimit::Off => questions,
            HeaderLimit::Auto(_) => {
                unlisted = questions
                    .iter()
                    .map(|q| Question {
                        listed: false,
                        ..q.clone()
                    })
                    .collect();
                &unlisted
            }
        };
        let overhead = self.longest_row_without_state(questions)?;
        let reserve = match self.padding {
            PadPolicy::Block(block) => block,
            PadPolicy::None => 0,
        };
        let encode = |t: &str| self.tokenizer.encode(t, false).map_err(|e| e.to_string());
        let decode = |ids: &[u32]| self.tokenizer.decode(ids, false).map_err(|e| e.to_string());
        let fitted = fit_state(encode, decode, text, overhead, self.prompt_limit(), reserve);
        fitted.map_err(|message| RouteError::ContextLength {
            message,
            param: "state",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer of one token a character, whose ids are the code points.
    fn chars(s: &str) -> Result<Vec<u32>, String> {
        Ok(s.chars().map(|c| c as u32).collect())
    }

    fn unchars(ids: &[u32]) -> Result<String, String> {
        Ok(ids.iter().map(|&i| char::from_u32(i).unwrap()).collect())
    }

    #[test]
    fn a_state_that_fits_is_kept_whole() {
        let (text, cut) = fit_state(chars, unchars, "one two", 10, 50, 0).unwrap();
        assert_eq!((text.as_str(), cut), ("one two", None));
    }

    #[test]
    fn a_cut_backs_up_to_whitespace_and_nests() {
        let body = "alpha beta gamma delta epsilon zeta eta theta";
        // room = 52 - 10 - 32 = 10: "alpha beta" then back to the space.
        let (text, cut) = fit_state(chars, unchars, body, 10, 52, 0).unwrap();
        assert_eq!(text, "alpha beta");
        assert_eq!(cut.unwrap().kept_tokens, 10);
        // room 13 lands mid-word ("alpha beta ga"): backed up to the space.
        let (text, cut) = fit_state(chars, unchars, body, 10, 55, 0).unwrap();
        assert_eq!(text, "alpha beta");
        assert_eq!(cut.unwrap().of_tokens, body.chars().count());
        let (wider, _) = fit_state(chars, unchars, body, 10, 70, 0).unwrap();
        assert!(wider.starts_with(&text) && wider.len() > text.len());
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        let got: Vec<String> = [0, 999, 1000, 4773, 1234567].map(grouped).to_vec();
        assert_eq!(got, ["0", "999", "1,000", "4,773", "1,234,567"]);
    }

    #[test]
    fn questions_alone_over_the_ceiling_are_refused() {
        let e = fit_state(chars, unchars, &"x ".repeat(100), 60, 80, 0).unwrap_err();
        assert!(e.contains("questions alone"), "{e}");
    }
}
