//! The decision service: one way down and one way up for a decision on
//! every route.
//!
//! A handler maps its wire onto typed questions (`/v1/decide`'s and a chat
//! completion's `decisio` object as [`Ask`]s; `/v1/systemone`'s validated
//! [`WireRequest`]) and hands them here. The service finds each question's
//! task, reads the answers on the text route, and adds by one rule each
//! what a task adds ([`TaskRegistry::outcome`]: the prediction set and the
//! certificate's verdict; on System One also the verdict of a task fitted
//! on another model, and an abstention task's decision). The handler maps
//! the result onto its response; it does not come back down.
//!
//! ```text
//! handler ── Ask / WireRequest ──> TaskRegistry::{decide, systemone}
//!                                     │ plan: task identity, task question
//!                                     │ TextRoute: count, read, answer
//!                                     │ outcome, stale verdict, abstention
//! handler <── Decided / SystemOneDecided ┘
//! ```

use std::time::Instant;

use super::certificate::Reason;
use super::{TaskOutcome, TaskRegistry, Thinking};
use crate::stats::abstain;
use crate::text_route::header_limit::HeaderLimited;
use crate::text_route::over_limit::{Cut, OverLimit};
use crate::text_route::systemone::{
    option_keys, option_set, state_text, task_identity, to_asked, Asked, Kind, WireQuestion,
    WireRequest,
};
use crate::text_route::{
    Answer, Decision, EngineError, MultiQuestion, Question, RouteError, State,
};

/// A question to decide, with the task a request named for it.
#[derive(Clone, Debug)]
pub struct Ask {
    pub question: Question,
    /// The registered task's name, where the request named one (the
    /// question is then the task's, from [`TaskRegistry::question`]).
    pub task: Option<String>,
    /// The request set the temperature: the answer is then not what a
    /// certificate promises.
    pub own_temperature: bool,
}

/// A decision with what each question's task adds, in the questions' order
/// (an empty outcome for a question of no task).
#[derive(Debug)]
pub struct Decided {
    pub decision: Decision,
    pub outcomes: Vec<TaskOutcome>,
}

/// A System One request's questions as the route asks them, in the
/// request's order.
pub struct Planned {
    /// Each question's keys and layout.
    pub asked: Vec<Asked>,
    /// Each question's task identity.
    pub identities: Vec<String>,
    /// The registered task that answers a question, with its name.
    pub tasks: Vec<Option<(Question, String)>>,
    /// The route's questions.
    pub questions: Vec<Question>,
}

/// An abstention task's decision on a choice answer: the option served
/// (an index into the asked keys) and whether it is the declared one.
#[derive(Clone, Debug, PartialEq)]
pub struct Abstained {
    pub task: String,
    pub chosen: usize,
    pub abstained: bool,
}

/// One System One question, decided: how it was asked, the task that
/// answered it, and what tasks add to its answer.
#[derive(Debug)]
pub struct SystemOneAnswered {
    pub asked: Asked,
    /// The registered task's name, where one answered the question.
    pub task: Option<String>,
    /// The task's question abstains below a probability.
    pub abstains: bool,
    /// The task's prediction set and verdict; or, where no task answered,
    /// the verdict of a certified task of the question's identity fitted on
    /// another model.
    pub outcome: TaskOutcome,
    pub abstention: Option<Abstained>,
}

/// A System One request, decided.
#[derive(Debug)]
pub struct SystemOneDecided {
    pub decision: Decision,
    /// In the request's order, beside `decision.answers`.
    pub questions: Vec<SystemOneAnswered>,
    /// The state's and the questions' tokens as rendered
    /// (`usage.input_tokens`).
    pub input_tokens: usize,
    /// The seconds the route took to answer.
    pub seconds: f64,
    /// Where the state was cut to the prompt ceiling (`over_limit`), what
    /// was kept; `None` where the whole state was read.
    pub truncated: Option<Cut>,
    /// What the header limit did, where the header lists fewer of the
    /// request's questions (`--header-limit`).
    pub header: Option<HeaderLimited>,
    /// What thinking did, where it was on for the request (`think`).
    pub thinking: Option<Thinking>,
}

impl TaskRegistry {
    /// Decides `asks` on `state` (in `orders` cyclic orders of their
    /// options; `mode`, how several questions are read), each with its
    /// task's outcome.
    pub async fn decide(
        &self,
        state: State,
        asks: Vec<Ask>,
        mode: Option<MultiQuestion>,
        orders: usize,
    ) -> Result<Decided, RouteError> {
        let (questions, named): (Vec<Question>, Vec<(Option<String>, bool)>) = asks
            .into_iter()
            .map(|a| (a.question, (a.task, a.own_temperature)))
            .unzip();
        let decision = self
            .route
            .decide_in_orders(state, questions, mode, orders)
            .await?;
        let outcomes = decision
            .answers
            .iter()
            .zip(&named)
            .map(|(a, (task, own))| match task {
                Some(name) => self.outcome(name, a, *own),
                None => TaskOutcome::default(),
            })
            .collect();
        Ok(Decided { decision, outcomes })
    }

    /// Plans a validated System One request's questions: a registered task
    /// of the question's identity answers it with its temperature,
    /// threshold or head; the others are asked with the base's temperature
    /// of their type. Serving and an abstention task's registration ask
    /// alike.
    pub fn plan(&self, request: &WireRequest) -> Planned {
        let settings = self.route.wire;
        let asked: Vec<Asked> = request
            .questions
            .iter()
            .map(|(_, q)| to_asked(q, settings.noul))
            .collect();
        let identities: Vec<String> = request
            .questions
            .iter()
            .zip(&asked)
            .map(|((_, q), a)| task_identity(q, a, settings.noul))
            .collect();
        let tasks: Vec<Option<(Question, String)>> = identities
            .iter()
            .map(|identity| self.wire_question(identity))
            .collect();
        let questions: Vec<Question> = request
            .questions
            .iter()
            .zip(&asked)
            .zip(&tasks)
            .map(|(((id, q), a), task)| match task {
                Some((question, _)) => question.clone().with_id(Some(id.clone())),
                None => Question::new(a.instructions.clone(), a.options.clone())
                    .with_id(Some(id.clone()))
                    .with_temperature(Some(settings.temperature_of(q.kind == Kind::Choice)))
                    .with_wire(Some(a.ask.clone())),
            })
            .collect();
        Planned {
            asked,
            identities,
            tasks,
            questions,
        }
    }

    /// Decides a validated System One request as `POST /v1/systemone`
    /// answers it.
    pub async fn systemone(&self, request: &WireRequest) -> Result<SystemOneDecided, RouteError> {
        let mut planned = self.plan(request);
        let mode = request.over_limit.unwrap_or(self.route.limits.over_limit);
        let Counted {
            state: text,
            tokens: input_tokens,
            cut: truncated,
            header,
        } = self
            .counted(request, &mut planned.questions, mode)
            .await
            .map_err(|e| or_truncate(e, mode))?;
        let started = Instant::now();
        // Thinking reads the state and the questions again: kept only then.
        let think = request.think.unwrap_or(self.route.limits.think.on);
        let again = think.then(|| text.clone());
        let questions = match think {
            true => planned.questions.clone(),
            false => std::mem::take(&mut planned.questions),
        };
        let mut decision = self
            .route
            .decide_in_orders(text, questions, None, request.orders.unwrap_or(1))
            .await
            .map_err(|e| or_truncate(e, mode))?;
        let thinking = match again {
            Some(text) => Some(
                self.think(
                    text,
                    request,
                    (&planned.asked, &planned.questions, &planned.tasks),
                    &mut decision,
                    truncated.is_some(),
                )
                .await?,
            ),
            None => None,
        };
        let seconds = started.elapsed().as_secs_f64();
        let Planned {
            asked,
            identities,
            tasks,
            ..
        } = planned;
        let questions = request
            .questions
            .iter()
            .zip(asked)
            .zip(&decision.answers)
            .zip(tasks)
            .zip(&identities)
            .map(|(((((_, q), asked), answer), task), identity)| {
                let outcome = match &task {
                    Some((_, name)) if truncated.is_some() => {
                        self.outcome_unlike_examples(name, answer, Reason::StateTruncated)
                    }
                    Some((_, name)) if header.is_some() => {
                        self.outcome_unlike_examples(name, answer, Reason::HeaderLimited)
                    }
                    // System One sets no temperature of its own.
                    Some((_, name)) => self.outcome(name, answer, false),
                    None => TaskOutcome {
                        prediction_set: None,
                        verdict: self.stale_verdict(identity),
                    },
                };
                let abstention = self.abstention(q, &asked, &answer.exact);
                SystemOneAnswered {
                    abstains: task
                        .as_ref()
                        .is_some_and(|(t, _)| t.abstain_below.is_some()),
                    task: task.map(|(_, name)| name),
                    asked,
                    outcome,
                    abstention,
                }
            })
            .collect();
        Ok(SystemOneDecided {
            decision,
            questions,
            input_tokens,
            seconds,
            truncated,
            header,
            thinking,
        })
    }

    /// The request's state (cut to the prompt ceiling where `mode` says
    /// and it does not fit, [`TextRoute::fit_wire_state`]), the header
    /// limit's plan of the (cut) state, where it lists fewer questions
    /// ([`TextRoute::header_plan`]; `questions` marked so), its tokens with
    /// the questions' as rendered, and the cut. Counted before any work:
    /// under `refuse` a state longer than the context is refused from its
    /// length alone; then the texts are tokenized on the blocking pool.
    ///
    /// [`TextRoute::fit_wire_state`]: crate::text_route::TextRoute::fit_wire_state
    /// [`TextRoute::header_plan`]: crate::text_route::TextRoute::header_plan
    async fn counted(
        &self,
        request: &WireRequest,
        questions: &mut Vec<Question>,
        mode: OverLimit,
    ) -> Result<Counted, RouteError> {
        let state_text = state_text(&request.state);
        if mode == OverLimit::Refuse {
            self.route
                .check_state_size(&State::Text(state_text.clone()))?;
        }
        let route = self.route.clone();
        let mut asked = std::mem::take(questions);
        let counted = tokio::task::spawn_blocking(move || {
            let counted = (|| {
                let (state_text, cut) = match mode {
                    OverLimit::Truncate => route.fit_wire_state(&state_text, &asked)?,
                    OverLimit::Refuse => (state_text, None),
                };
                let header = route.header_plan(&state_text, &asked)?;
                if let Some(h) = &header {
                    for q in asked.iter_mut().skip(h.listed) {
                        q.listed = false;
                    }
                }
                let mut n = route.count_state_tokens(&state_text)?;
                if let Some(listed) = route.wire_header(&asked) {
                    n += route.count_tokens(&listed)?;
                }
                for q in &asked {
                    // An intent task's question is its instructions alone.
                    n += match q.head {
                        Some(_) => route.count_tokens(&q.text)?,
                        None => route.count_tokens(&route.wire_question_text(q)?)?,
                    };
                }
                Ok(Counted {
                    state: State::Text(state_text),
                    tokens: n,
                    cut,
                    header,
                })
            })();
            (asked, counted)
        })
        .await
        .map_err(|e| RouteError::from(EngineError::Model(e.to_string())))?;
        *questions = counted.0;
        counted.1
    }

    /// The abstention task of a choice question, if one matches and its
    /// declared key is among the question's options, applied to the
    /// answer's probabilities `p` (in the order of `asked.keys`).
    pub fn abstention(&self, q: &WireQuestion, asked: &Asked, p: &[f64]) -> Option<Abstained> {
        if !self.has_abstention() {
            return None;
        }
        let task = self.abstention_for(&option_set(q)?, &option_keys(q)?)?;
        let at = asked.keys.iter().position(|k| *k == task.option.key)?;
        let threshold = task.config.threshold.filter(|_| task.config.applied);
        let (abstained, best) = abstain::decide(p, at, threshold);
        Some(Abstained {
            task: task.id,
            chosen: if abstained { at } else { best },
            abstained,
        })
    }

    /// The answers of a registration's System One request, asked as
    /// serving asks them but unobserved: no serving metric, prefix-cache
    /// entry or certified task's traffic monitor sees them. With the
    /// request's questions as asked.
    pub async fn systemone_unobserved(
        &self,
        request: &WireRequest,
    ) -> Result<(Vec<Asked>, Vec<Answer>), RouteError> {
        let planned = self.plan(request);
        let text = State::Text(state_text(&request.state));
        let decision = self
            .route
            .decide_unobserved(text, planned.questions, request.orders.unwrap_or(1))
            .await?;
        Ok((planned.asked, decision.answers))
    }
}

/// A request's state as read, its tokens, and what was done to fit it.
struct Counted {
    state: State,
    /// The state's and the questions' tokens as rendered
    /// (`usage.input_tokens`).
    tokens: usize,
    cut: Option<Cut>,
    header: Option<HeaderLimited>,
}

/// A state over the context, refused: the error says how to have it cut
/// instead.
fn or_truncate(e: RouteError, mode: OverLimit) -> RouteError {
    match e {
        // A refusal that names the way out already (the header limit's) is
        // left as it is.
        RouteError::ContextLength { message, param }
            if mode == OverLimit::Refuse && !message.contains("\"over_limit\"") =>
        {
            RouteError::ContextLength {
                message: format!(
                    "{message} Or send \"over_limit\": \"truncate\" to have the state cut to its \
                     start."
                ),
                param,
            }
        }
        e => e,
    }
}
