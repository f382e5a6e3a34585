//! Think when unsure on System One: which questions of a decided request
//! are read again after reasoning, and what the request says of it. The
//! rule is the reference decisio 0.35.0's (`decisio/serve/think.py`): a
//! question thinks when its served confidence is below its type's
//! threshold times the factor, it has at most 16 options, and no
//! registered task or abstention task answers it; a request read in
//! several orders, or whose state was cut, does not think. Whether a
//! question thinks depends on that question and the settings alone. The
//! second read itself is the route's ([`TextRoute::think`]).
//!
//! [`TextRoute::think`]: crate::text_route::TextRoute::think

use super::TaskRegistry;
use crate::settings::Think;
use crate::text_route::decide::THINK_MAX_OPTIONS;
use crate::text_route::systemone::{Asked, WireRequest};
use crate::text_route::{Decision, Question, RouteError, State};

/// A request's questions as planned: how each is asked, the route's
/// question, and the registered task that answers it.
type AsPlanned<'a> = (
    &'a [Asked],
    &'a [Question],
    &'a [Option<(Question, String)>],
);

/// Why a question did not think.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotThought {
    /// Its served confidence is at or above its threshold.
    Sure,
    TooManyOptions,
    NotThinkingType,
    RegisteredTask,
    /// Read in several orders, or answered by an abstention task.
    NotCombined,
    /// The state was cut to the prompt ceiling (`over_limit`).
    StateTruncated,
    /// The row left no room in the context to reason.
    NoRoom,
}

impl NotThought {
    pub const ALL: [NotThought; 7] = [
        NotThought::Sure,
        NotThought::TooManyOptions,
        NotThought::NotThinkingType,
        NotThought::RegisteredTask,
        NotThought::NotCombined,
        NotThought::StateTruncated,
        NotThought::NoRoom,
    ];

    /// The reason as the response says it (the reference's words where it
    /// has the case).
    pub fn why(self) -> &'static str {
        match self {
            NotThought::Sure => "sure",
            NotThought::TooManyOptions => "more than 16 options",
            NotThought::NotThinkingType => "its type is not one this server thinks on",
            NotThought::RegisteredTask => "a registered task answers this question",
            NotThought::NotCombined => {
                "not combined with two-order averaging, abstention or the image route"
            }
            NotThought::StateTruncated => "the state was cut to the prompt ceiling",
            NotThought::NoRoom => "the question's row leaves no room in the context to reason",
        }
    }

    /// The label of `decisio_think_questions_total`.
    pub fn label(self) -> &'static str {
        match self {
            NotThought::Sure => "sure",
            NotThought::TooManyOptions => "too_many_options",
            NotThought::NotThinkingType => "not_thinking_type",
            NotThought::RegisteredTask => "registered_task",
            NotThought::NotCombined => "not_combined",
            NotThought::StateTruncated => "state_truncated",
            NotThought::NoRoom => "no_room",
        }
    }
}

/// What thinking did for a request that had it on.
#[derive(Clone, Debug)]
pub struct Thinking {
    /// Per question, in the request's order: the tokens of reasoning it
    /// wrote, or why it did not think.
    pub per_question: Vec<Result<usize, NotThought>>,
    /// The seconds the reasoning and the second reads took.
    pub seconds: f64,
    /// The settings it ran under.
    pub settings: Think,
}

impl Thinking {
    /// The questions that thought.
    pub fn questions(&self) -> usize {
        self.per_question.iter().filter(|q| q.is_ok()).count()
    }

    /// The tokens of reasoning written, over all questions.
    pub fn tokens(&self) -> usize {
        self.per_question.iter().filter_map(|q| q.ok()).sum()
    }
}

impl TaskRegistry {
    /// Reads the unsure questions of `decision` (a request's first read:
    /// each question as `asked`, the route's `questions` and the registered
    /// task that answered it, as planned) again after reasoning, and puts
    /// their mixed answers in its place; `cut`: the state was cut to the
    /// prompt ceiling.
    pub(super) async fn think(
        &self,
        state: State,
        request: &WireRequest,
        (asked, questions, tasks): AsPlanned<'_>,
        decision: &mut Decision,
        cut: bool,
    ) -> Result<Thinking, RouteError> {
        let settings = self.route.limits.think.clone();
        let several_orders = request.orders.unwrap_or(1) > 1;
        let mut per_question = Vec::with_capacity(request.questions.len());
        let mut questions = questions.to_vec();
        let mut which = Vec::new();
        for (i, ((_, q), answer)) in request.questions.iter().zip(&decision.answers).enumerate() {
            let slot = Think::slot(q.kind.as_str()).unwrap_or(0);
            let why = if cut {
                Some(NotThought::StateTruncated)
            } else if several_orders || self.abstention(q, &asked[i], &answer.exact).is_some() {
                Some(NotThought::NotCombined)
            } else if tasks[i].is_some() {
                Some(NotThought::RegisteredTask)
            } else if !settings.types[slot] {
                Some(NotThought::NotThinkingType)
            } else if answer.exact.len() > THINK_MAX_OPTIONS {
                Some(NotThought::TooManyOptions)
            } else if answer.confidence() >= Think::THRESHOLDS[slot] * settings.factor {
                Some(NotThought::Sure)
            } else {
                None
            };
            per_question.push(why.map_or(Ok(0), Err));
            if why.is_none() {
                if let Some(t) = settings.temperatures[slot] {
                    questions[i].temperature = Some(t);
                }
                which.push(i);
            }
        }
        let mut seconds = 0.0;
        if !which.is_empty() {
            let first: Vec<_> = which.iter().map(|&i| decision.answers[i].clone()).collect();
            let (thoughts, took) = self
                .route
                .think(
                    state,
                    questions,
                    &which,
                    &first,
                    settings.budget,
                    settings.at_once,
                )
                .await?;
            seconds = took;
            for (&i, thought) in which.iter().zip(thoughts) {
                per_question[i] = match thought.answer {
                    Some(answer) => {
                        decision.answers[i] = answer;
                        Ok(thought.tokens)
                    }
                    None => Err(NotThought::NoRoom),
                };
            }
        }
        Ok(Thinking {
            per_question,
            seconds,
            settings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::THINK_OUTCOMES;

    #[test]
    fn every_outcome_is_a_label_the_metric_exports_from_the_start() {
        let mut labels: Vec<&str> = NotThought::ALL.iter().map(|w| w.label()).collect();
        labels.insert(0, "thought");
        assert_eq!(labels, THINK_OUTCOMES);
        // The reference's words where it has the case.
        assert_eq!(NotThought::Sure.why(), "sure");
        assert_eq!(NotThought::TooManyOptions.why(), "more than 16 options");
    }
}
