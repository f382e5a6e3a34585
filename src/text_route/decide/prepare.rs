//! A decision's token ids: the state's prefix (front-padded to a block
//! when the padding policy says), each question's suffix with the letters it reads,
//! or one packed prompt with its answer sheet's markers; checked against
//! the context length.

use super::{
    check_question, invalid, packed_marker, render_packed, Lettering, PadPolicy, Question, State,
    LETTERS, PACKED_SEPARATOR,
};
use crate::engine::{PackedPrompt, QuestionTokens, StateHash};
use crate::text_route::systemone::{self, LabelVariants, Layout};
use crate::text_route::{RouteError, TextRoute};

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

    /// The token ids a question's answer is read from, a list a label: its
    /// options' letters (letter codes on the System One wire, read in the
    /// forms the base's prompt format reads, [`systemone::label_forms`]; `yes`
    /// and `no` for a yes/no question in words); an intent question reads
    /// one letter (unused: the head reads the hidden state).
    pub(super) fn label_reads(&self, q: &Question) -> Result<Vec<Vec<u32>>, RouteError> {
        let summed = self.wire.format.variants == LabelVariants::Summed;
        Ok(match q.lettering() {
            Lettering::YesNoWords => self
                .yes_no_forms
                .clone()
                .ok_or_else(|| {
                    invalid(
                        "questions",
                        "this tokenizer does not write `yes` and `no` in the forms this base \
                         reads them as one token each, so a yes/no question cannot be asked \
                         in words",
                    )
                })?
                .to_vec(),
            Lettering::Codes if summed => {
                let n = self.wire_codes(q.options.len())?.len();
                self.wire_forms[..n].to_vec()
            }
            Lettering::Letters if q.head.is_some() => vec![vec![self.letter_codes[0].1]],
            _ => self.codes(q)?.iter().map(|(_, id)| vec![*id]).collect(),
        })
    }

    /// The token ids a question's answer is read from: every label's
    /// ([`Self::label_reads`]), in label order.
    fn read_ids(&self, q: &Question) -> Result<Vec<u32>, RouteError> {
        Ok(self.label_reads(q)?.concat())
    }

    /// The request's state as its System One questions are asked about it:
    /// under the header layout the questions' instructions listed first
    /// ([`systemone::layout_header`]); the state itself otherwise.
    pub fn wire_state(&self, state: &State, questions: &[Question]) -> State {
        match (state, self.wire_header(questions)) {
            (State::Text(text), Some(header)) => State::Text(format!("{header}{text}")),
            _ => state.clone(),
        }
    }

    /// The header of a System One request under the header layout (counted
    /// in `usage.input_tokens`): the instructions of its questions still
    /// [`Question::listed`]; `None` where there are none.
    pub fn wire_header(&self, questions: &[Question]) -> Option<String> {
        let wire = questions
            .first()
            .is_some_and(|q| q.lettering() != Lettering::Letters);
        let listed: Vec<&str> = questions
            .iter()
            .filter(|q| q.listed)
            .map(|q| q.text.trim())
            .collect();
        (wire && self.wire.format.layout == Layout::Header && !listed.is_empty())
            .then(|| systemone::layout_header(listed))
    }

    /// Refuses, before anything is rendered or tokenized, a state whose
    /// text alone is as long as the context: a text of `n` bytes is at
    /// least `n / (L × S)` tokens, `L` the most bytes one token of this
    /// tokenizer stands for and `S` the most its normalizer shortens a text
    /// (no bound, no check, where that is not known). Reads the texts'
    /// lengths only, so an oversize state costs no tokenizing.
    pub fn check_state_size(&self, state: &State) -> Result<(), RouteError> {
        let bytes: usize = match state {
            State::Text(text) => text.len(),
            State::Messages(messages) => messages.iter().map(text_bytes).sum(),
        };
        let Some(shrink) = self.tokenizer.shrink_bound() else {
            return Ok(());
        };
        let longest = self.tokenizer.longest_token_bytes();
        let at_least = bytes / (longest * shrink);
        let context = self.context_length();
        if at_least < context {
            return Ok(());
        }
        Err(RouteError::ContextLength {
            message: format!(
                "This model's maximum context length is {context} tokens. However, the state \
                 is {bytes} bytes, at least {at_least} tokens (no token of this tokenizer \
                 stands for more than {longest} bytes); shorten the state."
            ),
            param: "state",
        })
    }

    /// The state hash of a prefix on this model, tokenizer and padding.
    pub(super) fn state_hash(&self, prefix: &[u32]) -> StateHash {
        StateHash::new(
            &self.engine().info().identity,
            &self.tokenizer_identity,
            &self.padding.label(),
            prefix,
        )
    }

    /// The token ids of a state's prefix text, padded as the padding
    /// policy says.
    fn prefix_ids(&self, prefix_text: &str) -> Result<Vec<u32>, RouteError> {
        let prefix = self.tokenize(prefix_text, false)?;
        Ok(self.padded(prefix))
    }

    /// A prefix's token ids front-padded to the block, as the padding
    /// policy says: the filler goes before the chat template's first token,
    /// where the reference decisio puts it (`pad_prompt`, `front`), so
    /// nothing between the state and its questions changes.
    fn padded(&self, prefix: Vec<u32>) -> Vec<u32> {
        let (PadPolicy::Block(block), Some(filler)) = (self.padding, self.pad_id) else {
            return prefix;
        };
        let short = (block - prefix.len() % block) % block;
        let mut ids = Vec::with_capacity(prefix.len() + short);
        ids.extend(std::iter::repeat_n(filler, short));
        ids.extend(prefix);
        ids
    }

    /// Checks and renders `questions` on `state` as one packed prompt: the
    /// prefix's token ids, each question's (empty) suffix with the letters
    /// it reads after `N: `, and the prompt with the answer sheet's markers.
    pub(super) fn prepare_packed(
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
        self.check_state_size(state)?;
        let letters = self.packed_letter_ids.as_ref().ok_or_else(|| {
            invalid(
                "multi_question",
                "the tokenizer does not write each of ` A` to ` Z` as one token, so packed \
                 answers cannot be read; use `warm` or `sequential`",
            )
        })?;
        for (i, q) in questions.iter().enumerate() {
            check_question(q, &format!("questions[{i}]"))?;
            if q.options.len() > LETTERS.len() {
                return Err(invalid(
                    &format!("questions[{i}].options"),
                    format!(
                        "multi_question `packed` letters options A to Z, so a question takes \
                         at most {} options there; got {} (ask it in `warm` or `sequential` \
                         mode)",
                        LETTERS.len(),
                        q.options.len()
                    ),
                ));
            }
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
    /// each question's suffix with the letters it reads. `listed` are the
    /// request's questions as sent, which the header layout lists (the same
    /// as `questions` unless some are asked in several orders).
    pub(super) fn prepare(
        &self,
        state: &State,
        listed: &[Question],
        questions: &[Question],
    ) -> Result<(Vec<u32>, Vec<QuestionTokens>), RouteError> {
        self.check_state_size(state)?;
        let mut prefix_text: Option<String> = None;
        let mut suffixes = Vec::with_capacity(questions.len());
        let state = &self.wire_state(state, listed);
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
        let prefix_text = prefix_text.unwrap_or_default();
        // A System One request's prefix is split as the reference splits it
        // (`systemone::split_ids`), from its first question; decisio's own
        // layout tokenizes the state's text alone.
        let (prefix, first) = match questions.first() {
            Some(q) if q.lettering() != Lettering::Letters => {
                let (prefix, own) =
                    systemone::split_ids(&self.tokenizer, &prefix_text, &suffixes[0])
                        .map_err(|m| invalid("questions", m))?;
                (self.padded(prefix), Some(own))
            }
            _ => (self.prefix_ids(&prefix_text)?, None),
        };
        let mut tokens = Vec::with_capacity(questions.len());
        let context = self.context_length();
        for (i, (q, suffix)) in questions.iter().zip(&suffixes).enumerate() {
            let ids = match (i, &first) {
                (0, Some(own)) => own.clone(),
                _ => self.tokenize(suffix, false)?,
            };
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
            let read = self.read_ids(q)?;
            tokens.push(QuestionTokens { suffix: ids, read });
        }
        Ok((prefix, tokens))
    }
}

/// The bytes of text in a chat message: its `content` string, or the
/// `text` of its content parts.
fn text_bytes(message: &serde_json::Value) -> usize {
    match &message["content"] {
        serde_json::Value::String(text) => text.len(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .map(str::len)
            .sum(),
        _ => 0,
    }
}
