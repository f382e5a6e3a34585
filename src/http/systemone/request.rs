//! The System One request: read from JSON and validated field by field,
//! every fault named with its place (`loc`), as pydantic names them.

use serde_json::Value;

use super::error::{detail, Detail};
use crate::text_route::decide::{checked_orders, MAX_ORDERS};
use crate::text_route::over_limit::OverLimit;
use crate::text_route::systemone::{
    Criteria, Kind, WireQuestion, WireRequest, CHOICE_OPTIONS, SCORE_LEVELS,
};

/// Reads a body into a validated request; every fault is named.
pub fn parse_request(body: &[u8]) -> Result<WireRequest, Vec<Detail>> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        vec![detail(
            &[],
            format!("the body is not valid JSON ({e}); send a JSON object"),
            "json_invalid",
        )]
    })?;
    parse_value(value)
}

/// A request already read as JSON (a task example's `request`) into a
/// validated request, as [`parse_request`] validates a body.
pub fn parse_value(value: Value) -> Result<WireRequest, Vec<Detail>> {
    let Value::Object(mut top) = value else {
        return Err(vec![detail(
            &[],
            "the body must be a JSON object with `state` and `questions`",
            "model_attributes_type",
        )]);
    };
    let mut faults = Vec::new();
    let model = match top.remove("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => {
            faults.push(detail(
                &["model"],
                "`model` must be a string",
                "string_type",
            ));
            None
        }
    };
    let state = match top.remove("state") {
        None => {
            faults.push(detail(&["state"], "Field required", "missing"));
            Value::Null
        }
        Some(v @ (Value::String(_) | Value::Object(_) | Value::Array(_))) => v,
        Some(_) => {
            faults.push(detail(
                &["state"],
                "`state` must be a string, an object or an array",
                "value_error",
            ));
            Value::Null
        }
    };
    let orders = top.remove("x_orders").and_then(|v| orders(v, &mut faults));
    let over_limit = top
        .remove("over_limit")
        .and_then(|v| over_limit(v, &mut faults));
    let think = top.remove("think").and_then(|v| think(v, &mut faults));
    let mut questions = Vec::new();
    match top.remove("questions") {
        None => faults.push(detail(&["questions"], "Field required", "missing")),
        Some(Value::Object(map)) => {
            let most = crate::text_route::decide::MAX_QUESTIONS;
            if map.is_empty() {
                faults.push(detail(
                    &["questions"],
                    "`questions` needs at least 1 question",
                    "too_short",
                ));
            } else if map.len() > most {
                faults.push(detail(
                    &["questions"],
                    format!(
                        "a request takes at most {most} questions; got {}",
                        map.len()
                    ),
                    "too_long",
                ));
            }
            for (id, q) in map {
                if id.is_empty() {
                    faults.push(detail(
                        &["questions", ""],
                        "a question id must be a non-empty string",
                        "value_error",
                    ));
                    continue;
                }
                match parse_question(&id, q) {
                    Ok(q) => questions.push((id, q)),
                    Err(d) => faults.extend(d),
                }
            }
        }
        Some(_) => faults.push(detail(
            &["questions"],
            "`questions` must be an object of question id to question",
            "dict_type",
        )),
    }
    if faults.is_empty() {
        Ok(WireRequest {
            model,
            state,
            questions,
            orders,
            over_limit,
            think,
        })
    } else {
        Err(faults)
    }
}

/// `x_orders`: `null`, or an integer (or a float with an integral value,
/// 91.0, as JSON Schema's `integer` reads it) from 1 to [`MAX_ORDERS`];
/// anything else is a fault.
fn orders(v: Value, faults: &mut Vec<Detail>) -> Option<usize> {
    if v.is_null() {
        return None;
    }
    let k = v
        .as_f64()
        .filter(|k| k.fract() == 0.0 && k.abs() < 1e15)
        .map_or(0, |k| k as i64);
    let k = checked_orders(k).ok();
    if k.is_none() {
        faults.push(detail(
            &["x_orders"],
            format!("`x_orders` must be an integer from 1 to {MAX_ORDERS}; got {v}"),
            "value_error",
        ));
    }
    k
}

/// `over_limit`: `null`, `"refuse"` or `"truncate"`; anything else is a
/// fault.
fn over_limit(v: Value, faults: &mut Vec<Detail>) -> Option<OverLimit> {
    if v.is_null() {
        return None;
    }
    let mode = v.as_str().and_then(OverLimit::from_name);
    if mode.is_none() {
        faults.push(detail(
            &["over_limit"],
            format!(
                "`over_limit` must be one of {:?}, or null; got {v}",
                OverLimit::NAMES
            ),
            "value_error",
        ));
    }
    mode
}

/// `think`: `null`, `true` or `false`; anything else is a fault.
fn think(v: Value, faults: &mut Vec<Detail>) -> Option<bool> {
    match v {
        Value::Null => None,
        Value::Bool(b) => Some(b),
        v => {
            faults.push(detail(
                &["think"],
                format!("`think` must be true, false or null; got {v}"),
                "bool_type",
            ));
            None
        }
    }
}

/// A task example's `request` (a registration's, or a certification's),
/// validated as [`parse_value`] validates a body; `over_limit` and `think`
/// are refused: a registration never cuts a state and never thinks, so a
/// task is fitted on whole inputs read once.
pub fn parse_example(value: Value) -> Result<WireRequest, Vec<Detail>> {
    let request = parse_value(value)?;
    let (field, what) = match (request.over_limit, request.think) {
        (None, None) => return Ok(request),
        (Some(_), _) => ("over_limit", "never cuts a state"),
        (None, Some(_)) => ("think", "reads each example once, without reasoning"),
    };
    Err(vec![detail(
        &[field],
        format!(
            "`{field}` is not accepted in a task's example: a registration {what}; send the \
             example without it"
        ),
        "value_error",
    )])
}

/// One System One question outside a request (a task's registration):
/// the question, or the first fault as `(param, message)` with `param` the
/// field's path under `field` (`systemone.criteria`).
pub fn parse_one(field: &str, q: Value) -> Result<WireQuestion, (String, String)> {
    parse_question("", q).map_err(|faults| {
        let d = &faults[0];
        // `body.questions.<id>[.<type>].<field>`: the part after the id.
        let rest: Vec<String> = d
            .loc
            .iter()
            .skip(3)
            .filter_map(|v| v.as_str())
            .filter(|s| !["noul", "choice", "score"].contains(s))
            .map(str::to_string)
            .collect();
        let param = std::iter::once(field.to_string())
            .chain(rest)
            .collect::<Vec<_>>();
        (param.join("."), d.msg.clone())
    })
}

pub(super) fn parse_question(id: &str, q: Value) -> Result<WireQuestion, Vec<Detail>> {
    let Value::Object(mut q) = q else {
        return Err(vec![detail(
            &["questions", id],
            "a question must be an object with a `type`",
            "dict_type",
        )]);
    };
    let kind = match q.get("type") {
        None => {
            return Err(vec![detail(
                &["questions", id],
                "a question needs a `type`: `noul`, `choice` or `score`",
                "union_tag_not_found",
            )])
        }
        Some(Value::String(t)) if t == "noul" => Kind::Noul,
        Some(Value::String(t)) if t == "choice" => Kind::Choice,
        Some(Value::String(t)) if t == "score" => Kind::Score,
        Some(other) => {
            return Err(vec![detail(
                &["questions", id, "type"],
                format!("`type` must be `noul`, `choice` or `score`, not {other}"),
                "union_tag_invalid",
            )])
        }
    };
    let at = |field: &'static str| ["questions", id, kind.as_str(), field];
    let instructions = q.remove("instructions").filter(|v| !v.is_null());
    let criteria = parse_criteria(kind, q.remove("criteria"), &at("criteria"))?;
    Ok(WireQuestion {
        kind,
        instructions,
        criteria,
    })
}

/// A question's `criteria`, by its kind; `at` is the field's location.
fn parse_criteria(
    kind: Kind,
    criteria: Option<Value>,
    at: &[&str],
) -> Result<Criteria, Vec<Detail>> {
    Ok(match kind {
        Kind::Noul => match criteria {
            None | Some(Value::Null) => Criteria::Noul {
                yes: None,
                no: None,
            },
            Some(Value::Object(mut c)) => Criteria::Noul {
                yes: c.remove("true").filter(|v| !v.is_null()),
                no: c.remove("false").filter(|v| !v.is_null()),
            },
            Some(_) => {
                return Err(vec![detail(
                    at,
                    "noul criteria must be an object with `true` and/or `false`, or null",
                    "dict_type",
                )])
            }
        },
        Kind::Choice => match criteria {
            None => return Err(vec![detail(at, "Field required", "missing")]),
            Some(Value::Object(c)) => {
                let (lo, hi) = CHOICE_OPTIONS;
                if c.len() < lo || c.len() > hi {
                    return Err(vec![detail(
                        at,
                        format!("a choice takes {lo} to {hi} options; got {}", c.len()),
                        if c.len() < lo {
                            "too_short"
                        } else {
                            "too_long"
                        },
                    )]);
                }
                Criteria::Choice(
                    c.into_iter()
                        .map(|(k, v)| (k, (!v.is_null()).then_some(v)))
                        .collect(),
                )
            }
            Some(_) => {
                return Err(vec![detail(
                    at,
                    "choice criteria must be an object of option name to description",
                    "dict_type",
                )])
            }
        },
        Kind::Score => match criteria {
            None => return Err(vec![detail(at, "Field required", "missing")]),
            Some(Value::Array(levels)) => {
                let (lo, hi) = SCORE_LEVELS;
                if levels.len() < lo || levels.len() > hi {
                    return Err(vec![detail(
                        at,
                        format!("a score takes {lo} to {hi} levels; got {}", levels.len()),
                        if levels.len() < lo {
                            "too_short"
                        } else {
                            "too_long"
                        },
                    )]);
                }
                if let Some(i) = levels.iter().position(Value::is_null) {
                    return Err(vec![detail(
                        at,
                        format!("score level {i} is null; describe every level"),
                        "value_error",
                    )]);
                }
                Criteria::Score(levels)
            }
            Some(Value::Object(_)) => {
                return Err(vec![detail(
                    at,
                    "score criteria must be an array of levels, lowest first, not an object",
                    "list_type",
                )])
            }
            Some(_) => {
                return Err(vec![detail(
                    at,
                    "score criteria must be an array of levels, lowest first",
                    "list_type",
                )])
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validation_names_each_fault_in_the_wire_shape() {
        let d = parse_request(br#"{"questions": {}}"#).unwrap_err();
        assert_eq!(d[0].loc, vec![json!("body"), json!("state")]);
        assert_eq!(d[0].kind, "missing");
        assert_eq!(d[1].kind, "too_short");
        let d = parse_request(
            br#"{"state": "x", "questions": {"a": {"type": "score", "criteria": {"0": "calm"}}}}"#,
        )
        .unwrap_err();
        assert_eq!(d[0].kind, "list_type");
        let d = parse_request(br#"{"state": "x", "questions": {"a": {"type": "boolean"}}}"#)
            .unwrap_err();
        assert_eq!(d[0].kind, "union_tag_invalid");
        assert_eq!(parse_request(b"{").unwrap_err()[0].kind, "json_invalid");
        let ok = parse_request(
            r#"{"state": ["a"], "seed": 7, "questions": {"🎯": {"type": "noul", "criteria": null}}}"#.as_bytes(),
        )
        .unwrap();
        assert_eq!(ok.questions[0].0, "🎯");
    }
}
