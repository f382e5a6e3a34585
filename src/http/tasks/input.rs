//! Pieces of a registration read alike wherever they come (`POST
//! /v1/tasks`, its certify block, `POST /v1/tasks/{id}/certify`): a share
//! in (0, 1), labelled examples and their states.

use super::{Result, TaskExampleIn};
use crate::http::error::ApiError;
use crate::tasks::Example;
use crate::text_route::decide::is_blank;
use crate::text_route::systemone::state_text;

/// Bounds of a share or probability in (0, 1] (or (0, 1) when `open`).
pub(super) fn unit(value: f64, open: bool, param: &str) -> Result<f64> {
    let ok = value.is_finite() && value > 0.0 && (value < 1.0 || (!open && value == 1.0));
    if !ok {
        let range = if open { "(0, 1)" } else { "(0, 1]" };
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be in {range}; got {value}"),
        ));
    }
    Ok(value)
}

/// Examples as the task's states and label indices; `param` names the
/// list in errors.
pub(super) fn labelled(
    list: &[TaskExampleIn],
    param: &str,
    keys: &[String],
    field: &str,
    wire: bool,
) -> Result<Vec<Example>> {
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            let state = example_state(&e.state, wire, &format!("{param}[{i}]"))?;
            let label = keys
                .iter()
                .position(|l| l == e.label.trim())
                .ok_or_else(|| {
                    ApiError::invalid(
                        &format!("{param}[{i}].label"),
                        format!("the label `{}` is not one of the task's {field}", e.label),
                    )
                })?;
            Ok(Example { state, label })
        })
        .collect()
}

/// An example's state as the task reads it: a string, or (a System One
/// task's) an object or an array shown as the wire shows them; `example`
/// names the example in errors (`examples[3]`).
pub(super) fn example_state(
    state: &serde_json::Value,
    wire: bool,
    example: &str,
) -> Result<String> {
    let param = format!("{example}.state");
    let text = match state {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(_) | serde_json::Value::Array(_) if wire => state_text(state),
        _ => {
            let what = if wire {
                "a string, an object or an array"
            } else {
                "a string"
            };
            return Err(ApiError::invalid(&param, format!("a state is {what}")));
        }
    };
    if is_blank(&text) {
        return Err(ApiError::invalid(&param, "the state is empty"));
    }
    Ok(text)
}
