//! Turning the engine's token events into text: incremental detokenization,
//! stop strings, and token texts for log-probabilities.

use std::sync::Arc;

use crate::engine::{FinishReason, GenerateEvent, GenerateStream, TokenLogprobs};
use crate::prompt::{IncrementalDecoder, PromptError};

use super::{RouteError, TextRoute};

/// One alternative at a position.
#[derive(Clone, Debug)]
pub struct TokenChoice {
    pub id: u32,
    /// The token's text (lossy when the token is part of a UTF-8 sequence).
    pub text: String,
    /// The token's raw bytes.
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A token of the output (or of the prompt, with `echo`).
#[derive(Clone, Debug)]
pub struct TokenOutput {
    pub choice: TokenChoice,
    /// `false` for the first prompt token, which has no log-probability.
    pub has_logprob: bool,
    pub top: Vec<TokenChoice>,
}

/// What a generation yields, in order.
#[derive(Clone, Debug)]
pub enum Output {
    /// The prompt's tokens with their log-probabilities (only when asked).
    Prompt(Vec<TokenOutput>),
    /// New text, and the tokens it came from when log-probabilities were
    /// asked for.
    Delta {
        text: String,
        tokens: Vec<TokenOutput>,
    },
    /// The end.
    Done {
        finish_reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
}

/// The output of one generation; dropping it cancels the job.
pub struct GenerationStream {
    route: Arc<TextRoute>,
    events: GenerateStream,
    prompt: Vec<u32>,
    stop: Vec<String>,
    ids: Vec<u32>,
    decoder: IncrementalDecoder,
    /// Text decoded so far, and how much of it was released.
    text: String,
    released: usize,
    held_tokens: Vec<TokenOutput>,
    pending_done: Option<FinishReason>,
    done: bool,
}

impl GenerationStream {
    pub(super) fn new(
        route: Arc<TextRoute>,
        events: GenerateStream,
        prompt: Vec<u32>,
        stop: Vec<String>,
    ) -> Self {
        let decoder = route.tokenizer.incremental(true);
        GenerationStream {
            decoder,
            route,
            events,
            prompt,
            stop,
            ids: Vec::new(),
            text: String::new(),
            released: 0,
            held_tokens: Vec::new(),
            pending_done: None,
            done: false,
        }
    }

    fn choice(&self, id: u32, logprob: f32) -> TokenChoice {
        let bytes = self.route.tokenizer.token_bytes(id).unwrap_or_default();
        TokenChoice {
            id,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob,
        }
    }

    fn token_output(&self, id: u32, lp: Option<&TokenLogprobs>) -> TokenOutput {
        TokenOutput {
            choice: self.choice(id, lp.map_or(0.0, |l| l.logprob)),
            has_logprob: lp.is_some(),
            top: lp
                .map(|l| l.top.iter().map(|&(t, p)| self.choice(t, p)).collect())
                .unwrap_or_default(),
        }
    }

    /// Appends what the incremental decoder produced; a decoding failure
    /// ends the stream.
    fn append(&mut self, decoded: Result<Option<String>, PromptError>) -> Result<(), RouteError> {
        match decoded {
            Ok(piece) => {
                self.text.push_str(piece.as_deref().unwrap_or_default());
                Ok(())
            }
            Err(e) => {
                self.done = true;
                Err(decode_error(e))
            }
        }
    }

    /// Releases text up to a stop string, or all but what could still
    /// become one. Returns the released text and whether a stop was hit.
    fn release(&mut self) -> (String, bool) {
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.released.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stop
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        let end = match hit {
            Some(at) => at.max(self.released),
            None => {
                let keep = self
                    .stop
                    .iter()
                    .map(|s| partial_suffix(&self.text, s))
                    .max()
                    .unwrap_or(0);
                let mut end = self.text.len() - keep;
                while !self.text.is_char_boundary(end) {
                    end -= 1;
                }
                end.max(self.released)
            }
        };
        let out = self.text[self.released..end].to_string();
        self.released = end;
        (out, hit.is_some())
    }

    fn done(&mut self, finish_reason: FinishReason) -> Output {
        self.done = true;
        Output::Done {
            finish_reason,
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.ids.len(),
        }
    }

    /// The next output, or `None` after [`Output::Done`].
    pub async fn next(&mut self) -> Option<Result<Output, RouteError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(reason) = self.pending_done.take() {
                return Some(Ok(self.done(reason)));
            }
            let Some(event) = self.events.recv().await else {
                self.done = true;
                return Some(Err(RouteError::Engine(crate::engine::EngineError::Stopped)));
            };
            let event = match event {
                Ok(e) => e,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e.into()));
                }
            };
            match event {
                GenerateEvent::Prompt(lps) => {
                    let tokens = lps
                        .iter()
                        .zip(&self.prompt)
                        .map(|(lp, &id)| self.token_output(id, lp.as_ref()))
                        .collect();
                    return Some(Ok(Output::Prompt(tokens)));
                }
                GenerateEvent::Token { id, logprobs } => {
                    self.ids.push(id);
                    if logprobs.is_some() {
                        let t = self.token_output(id, logprobs.as_ref());
                        self.held_tokens.push(t);
                    }
                    let decoded = self.decoder.push(id);
                    if let Err(e) = self.append(decoded) {
                        return Some(Err(e));
                    }
                    let (text, stopped) = self.release();
                    if stopped {
                        let tokens = std::mem::take(&mut self.held_tokens);
                        self.events.close();
                        let delta = Output::Delta { text, tokens };
                        self.pending_done = Some(FinishReason::Stop);
                        return Some(Ok(delta));
                    }
                    if !text.is_empty() {
                        let tokens = std::mem::take(&mut self.held_tokens);
                        return Some(Ok(Output::Delta { text, tokens }));
                    }
                }
                GenerateEvent::StopToken { id, logprobs } => {
                    // Counted and listed, never decoded: vLLM keeps the stop
                    // token in a completion's token ids and log-probabilities
                    // but not in its text (`vllm/v1/engine/detokenizer.py`).
                    self.ids.push(id);
                    if logprobs.is_some() {
                        let t = self.token_output(id, logprobs.as_ref());
                        self.held_tokens.push(t);
                    }
                }
                GenerateEvent::Finished(reason) => {
                    // Whatever the decoder or the stop strings held back.
                    let decoded = self.decoder.finish();
                    if let Err(e) = self.append(decoded) {
                        return Some(Err(e));
                    }
                    let rest = self.text[self.released..].to_string();
                    self.released = self.text.len();
                    if !rest.is_empty() || !self.held_tokens.is_empty() {
                        let tokens = std::mem::take(&mut self.held_tokens);
                        self.pending_done = Some(reason);
                        return Some(Ok(Output::Delta { text: rest, tokens }));
                    }
                    return Some(Ok(self.done(reason)));
                }
            }
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `stop`.
fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| stop.is_char_boundary(n) && text.ends_with(&stop[..n]))
        .unwrap_or(0)
}

fn decode_error(e: PromptError) -> RouteError {
    RouteError::Engine(crate::engine::EngineError::Model(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::partial_suffix;

    #[test]
    fn a_partial_stop_is_measured_in_whole_characters() {
        assert_eq!(partial_suffix("the end", "end."), 3);
        assert_eq!(partial_suffix("abc", "xyz"), 0);
        // A stop of multi-byte characters: only prefixes that end on a
        // character boundary count, and none panics.
        assert_eq!(partial_suffix("Mama", "\u{80}"), 0);
        assert_eq!(partial_suffix("caf\u{e9}", "\u{e9}t\u{e9}"), 2);
        assert_eq!(partial_suffix("x\u{1F600}", "\u{1F600}\u{1F600}"), 4);
    }
}
