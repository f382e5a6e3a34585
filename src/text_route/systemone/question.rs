//! System One's questions and requests, typed: what a request asks once its
//! body has validated (the HTTP layer parses and validates it,
//! `crate::http::systemone`), and the wire's limits on them.

use serde::Serialize;
use serde_json::Value;

use super::MAX_LABELS;

/// Levels a score question takes.
pub const SCORE_LEVELS: (usize, usize) = (2, 10);

/// Options a choice question takes.
pub const CHOICE_OPTIONS: (usize, usize) = (2, MAX_LABELS);

/// A question's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Noul,
    Choice,
    Score,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Noul => "noul",
            Kind::Choice => "choice",
            Kind::Score => "score",
        }
    }
}

/// One wire question, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct WireQuestion {
    pub kind: Kind,
    pub instructions: Option<Value>,
    pub criteria: Criteria,
}

/// A question's criteria, by type.
#[derive(Clone, Debug, PartialEq)]
pub enum Criteria {
    /// What a yes and a no mean (either may be absent).
    Noul {
        yes: Option<Value>,
        no: Option<Value>,
    },
    /// The options, keys in the order sent, with their descriptions.
    Choice(Vec<(String, Option<Value>)>),
    /// The levels, lowest first.
    Score(Vec<Value>),
}

/// A validated request.
#[derive(Clone, Debug)]
pub struct WireRequest {
    pub model: Option<String>,
    pub state: Value,
    pub questions: Vec<(String, WireQuestion)>,
    /// `x_orders`: each question read in this many cyclic orders of its
    /// options and answered from their average (`text_route::decide::orders`).
    pub orders: Option<usize>,
    /// `over_limit`: what this request's state gets where it is over the
    /// prompt ceiling (the server's `--over-limit` when absent).
    pub over_limit: Option<crate::settings::OverLimit>,
    /// `think`: whether this request's unsure questions think (the
    /// server's `--think` when absent).
    pub think: Option<bool>,
}
