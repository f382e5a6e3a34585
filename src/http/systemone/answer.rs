//! A System One answer in the wire's shape, from the route's answer.

use serde_json::{json, Map, Value};

use crate::tasks::Abstained;
use crate::text_route::systemone::{
    choice_confidence, confidence_of, render_text, score_confidence, Asked, Criteria, WireQuestion,
};
use crate::text_route::Answer;

/// A level as the legend echoes it: text and structure as sent, any other
/// scalar as its text (the SDKs read strings, objects and arrays).
fn legend_value(level: &Value) -> Value {
    match level {
        Value::String(_) | Value::Object(_) | Value::Array(_) => level.clone(),
        other => Value::String(render_text(other)),
    }
}

/// The wire answer of one question from the route's answer (its
/// probabilities over the asked options, in the order asked). A choice
/// answers its top option, or the option an abstention task chose, with
/// TypeSafe's confidence of the option answered.
pub fn wire_answer(
    q: &WireQuestion,
    asked: &Asked,
    answer: &Answer,
    abstention: Option<&Abstained>,
) -> Map<String, Value> {
    let p = &answer.exact;
    let mut out = Map::new();
    out.insert("type".into(), json!(q.kind.as_str()));
    match &q.criteria {
        Criteria::Noul { .. } => {
            let yes = asked.keys.iter().position(|k| k == "yes").unwrap_or(0);
            out.insert("noul".into(), json!(p[yes]));
        }
        Criteria::Choice(_) => {
            let (chosen, confidence) = match abstention {
                Some(a) => (a.chosen, confidence_of(p[a.chosen], p.len())),
                None => (answer.top, choice_confidence(p)),
            };
            out.insert("choice".into(), json!(asked.keys[chosen]));
            out.insert("confidence".into(), json!(confidence));
            let probs: Map<String, Value> = asked
                .keys
                .iter()
                .zip(p)
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            out.insert("probabilities".into(), Value::Object(probs));
        }
        Criteria::Score(levels) => {
            let score: f64 = p.iter().enumerate().map(|(i, pi)| i as f64 * pi).sum();
            out.insert("score".into(), json!(score));
            out.insert("confidence".into(), json!(score_confidence(p, answer.top)));
            let legend: Map<String, Value> = levels
                .iter()
                .enumerate()
                .map(|(i, l)| (i.to_string(), legend_value(l)))
                .collect();
            out.insert("legend".into(), Value::Object(legend));
            let probs: Map<String, Value> = p
                .iter()
                .enumerate()
                .map(|(i, v)| (i.to_string(), json!(v)))
                .collect();
            out.insert("probabilities".into(), Value::Object(probs));
        }
    }
    out
}
