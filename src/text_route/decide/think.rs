//! Think when unsure: a question read again after the served model has
//! written its own reasoning, as the reference decisio 0.35.0 does it
//! (`decisio/serve/think.py`, `vllm_engine.think`).
//!
//! Each question's row (the state's prefix and the question's own tokens,
//! as the first read had them) is continued with [`THINK_PREFIX`] inside
//! the reply; the model writes up to the budget greedily, through the
//! backend's own generation path, until an end of sequence or of its turn;
//! then [`THINK_SUFFIX`] follows and the options are read from the next
//! token, as a single read reads them. The two reads are mixed in log
//! space: the mean of their log-probabilities over the options,
//! normalised, served through the question's temperature. Which questions
//! think is the caller's rule (the decision service's); this file only
//! reads again.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

use super::{Answer, MultiQuestion, Question, RouteError, State, TextRoute};
use crate::engine::{
    EngineError, GenerateEvent, GenerateRequest, QuestionScore, QuestionTokens, Sampling,
    ScoreRequest,
};
use crate::stats;

/// What the reply starts with before the model reasons.
pub const THINK_PREFIX: &str = "Let me check the deciding facts first.\n";

/// What follows the reasoning, before the options are read again.
pub const THINK_SUFFIX: &str = "\n\nFinal answer:";

/// Most options of a question that thinks.
pub const THINK_MAX_OPTIONS: usize = 16;

/// Token names that end a model's turn in the bases' templates, read as
/// stops beside the end-of-sequence tokens.
const END_OF_TURN: [&str; 2] = ["<turn|>", "<end_of_turn>"];

/// One question's second read.
#[derive(Debug)]
pub struct Thought {
    /// The answer from the two reads mixed, at the question's temperature;
    /// `None` where the row left no room to reason in the context.
    pub answer: Option<Answer>,
    /// The tokens of reasoning written (the stop token counted, as vLLM
    /// counts it).
    pub tokens: usize,
}

/// The mixed read of two: per option, the mean of the two reads'
/// log-probabilities over the options (the first from its raw
/// log-probabilities, the second from its logits), as logits the
/// question's temperature then divides.
pub fn mix(first: &[f32], second: &[f32]) -> Vec<f32> {
    let a = stats::log_softmax(first, 1.0);
    let b = stats::log_softmax(second, 1.0);
    a.iter()
        .zip(&b)
        .map(|(x, y)| ((x + y) / 2.0) as f32)
        .collect()
}

impl TextRoute {
    /// The stop tokens of reasoning: the route's end-of-sequence tokens and
    /// the tokenizer's end-of-turn tokens.
    fn think_stops(&self) -> Vec<u32> {
        let mut ids = self.stop_token_ids.clone();
        ids.extend(
            END_OF_TURN
                .iter()
                .filter_map(|t| self.tokenizer.token_to_id(t)),
        );
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Reads the questions at `which` of `questions` (a request's, as its
    /// first read asked them, so that each row is the first read's own)
    /// again after reasoning on `state`, beside their first reads (`first`,
    /// one answer each, in the order of `which`): up to `budget` tokens
    /// each, `at_once` questions' reasoning written at a time. A question
    /// is answered at its own temperature; the caller sets a think
    /// temperature on it first. In the order of `which`, with the seconds
    /// taken.
    pub async fn think(
        self: &Arc<Self>,
        state: State,
        questions: Vec<Question>,
        which: &[usize],
        first: &[Answer],
        budget: usize,
        at_once: usize,
    ) -> Result<(Vec<Thought>, f64), RouteError> {
        let started = Instant::now();
        let (questions, _, prepared) = self
            .prepared(
                state,
                questions.clone(),
                questions,
                MultiQuestion::Sequential,
            )
            .await?;
        let (prefix, mut rows, _) = prepared?;
        let mut questions: Vec<Option<Question>> = questions.into_iter().map(Some).collect();
        let questions: Vec<Question> = which.iter().filter_map(|&i| questions[i].take()).collect();
        let rows: Vec<QuestionTokens> = which
            .iter()
            .map(|&i| {
                std::mem::replace(
                    &mut rows[i],
                    QuestionTokens {
                        suffix: Vec::new(),
                        read: Vec::new(),
                    },
                )
            })
            .collect();
        let pre = self.tokenize(THINK_PREFIX, false)?;
        let suf = self.tokenize(THINK_SUFFIX, false)?;
        let reasoning = self
            .write_reasoning(&prefix, &rows, &pre, &suf, budget, at_once)
            .await?;
        let again: Vec<QuestionTokens> = rows
            .iter()
            .zip(&reasoning)
            .filter_map(|(row, r)| {
                r.as_ref().map(|r| QuestionTokens {
                    suffix: [&row.suffix[..], &pre, r, &suf].concat(),
                    read: row.read.clone(),
                })
            })
            .collect();
        let mut scores = self.read_again(prefix, again).await?.into_iter();
        let mut thoughts = Vec::with_capacity(questions.len());
        for ((q, r), first) in questions.into_iter().zip(reasoning).zip(first) {
            let Some(r) = r else {
                thoughts.push(Thought {
                    answer: None,
                    tokens: 0,
                });
                continue;
            };
            let score = scores
                .next()
                .ok_or_else(|| EngineError::Model("the backend lost a second read".into()))?;
            let second = self.label_values(&q, &score.logits)?;
            let raw: Vec<f32> = first.logprobs.iter().map(|(_, v)| *v).collect();
            let mixed = mix(&raw, &second);
            let logprobs: Vec<f32> = stats::log_softmax(&mixed, 1.0)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            thoughts.push(Thought {
                answer: Some(self.answer(q, &mixed, &logprobs)),
                tokens: r.len(),
            });
        }
        Ok((thoughts, started.elapsed().as_secs_f64()))
    }

    /// Each row's reasoning after `pre`, written greedily up to `budget`
    /// tokens (fewer where the context ends first, leaving room for `suf`
    /// and the token read), `at_once` rows at a time; `None` for a row that
    /// leaves no room.
    async fn write_reasoning(
        &self,
        prefix: &[u32],
        rows: &[QuestionTokens],
        pre: &[u32],
        suf: &[u32],
        budget: usize,
        at_once: usize,
    ) -> Result<Vec<Option<Vec<u32>>>, RouteError> {
        let stops = self.think_stops();
        let context = self.context_length();
        let written: Vec<Result<Option<Vec<u32>>, RouteError>> =
            futures::stream::iter(rows.iter().map(|row| {
                let prompt: Vec<u32> = [prefix, &row.suffix, pre].concat();
                let room = context.saturating_sub(prompt.len() + suf.len() + 1);
                let request = GenerateRequest {
                    prompt,
                    max_tokens: budget.min(room),
                    sampling: Sampling {
                        temperature: 0.0,
                        ..Sampling::default()
                    },
                    logprobs: None,
                    prompt_logprobs: None,
                    stop_token_ids: stops.clone(),
                    logprob_token_ids: Vec::new(),
                };
                async move {
                    match request.max_tokens {
                        0 => Ok(None),
                        _ => self.reason(request).await.map(Some),
                    }
                }
            }))
            .buffered(at_once.max(1))
            .collect()
            .await;
        written.into_iter().collect()
    }

    /// The second reads: each row continued after its reasoning, read on
    /// the state's prefix as a decision reads (the backend's mode; packed
    /// questions one by one).
    async fn read_again(
        &self,
        prefix: Vec<u32>,
        rows: Vec<QuestionTokens>,
    ) -> Result<Vec<QuestionScore>, RouteError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mode = match self.mode(None)? {
            MultiQuestion::Packed => MultiQuestion::Sequential,
            m => m,
        };
        let receiver = self.engine().score(ScoreRequest {
            state: self.state_hash(&prefix),
            prefix,
            questions: rows,
            hidden: false,
            hidden_layer: None,
            mode,
            cache: true,
            packed: None,
        })?;
        Ok(receiver
            .await
            .map_err(|_| RouteError::Engine(EngineError::Stopped))??
            .questions)
    }

    /// The tokens one greedy generation writes, its stop token included.
    async fn reason(&self, request: GenerateRequest) -> Result<Vec<u32>, RouteError> {
        let mut events = self.engine().generate(request)?;
        let mut ids = Vec::new();
        while let Some(event) = events.recv().await {
            match event? {
                GenerateEvent::Token { id, .. } | GenerateEvent::StopToken { id, .. } => {
                    ids.push(id)
                }
                GenerateEvent::Finished(_) => return Ok(ids),
                GenerateEvent::Prompt(_) => {}
            }
        }
        Err(RouteError::Engine(EngineError::Stopped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_the_normalised_geometric_mean_of_the_two_reads() {
        // P1 = (0.6, 0.3, 0.1) from raw log-probabilities over the whole
        // vocabulary (their sum below 1); P2 from logits.
        let first = [0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        let second = [1.0f32, 2.0, 0.0];
        let p2 = stats::softmax(&second, 1.0);
        let p1 = [0.6, 0.3, 0.1];
        let g: Vec<f64> = p1.iter().zip(&p2).map(|(a, b)| (a * b).sqrt()).collect();
        let sum: f64 = g.iter().sum();
        let served = stats::softmax(&mix(&first, &second), 1.0);
        for (s, g) in served.iter().zip(&g) {
            assert!((s - g / sum).abs() < 1e-6, "{served:?} against {g:?}");
        }
        // Through a temperature T: the mix's probabilities to the power 1/T.
        let hot = stats::softmax(&mix(&first, &second), 2.0);
        let powered: Vec<f64> = g.iter().map(|x| (x / sum).powf(0.5)).collect();
        let total: f64 = powered.iter().sum();
        for (h, p) in hot.iter().zip(&powered) {
            assert!((h - p / total).abs() < 1e-6);
        }
    }
}
