//! A registration's certify block (`x_certify` in decisio's form,
//! `certify` in the reference's), validated: its settings, its separate
//! certification list, and a held-out side large enough for the promise.
//! Every fault is a 400 naming the block's field.

use super::input::{labelled, unit};
use super::{CertifyIn, Result, TaskRequest};
use crate::http::error::ApiError;
use crate::settings::Limits;
use crate::stats::certify::minimum_examples;
use crate::tasks::certificate::{CertifySpec, DEFAULT_ALPHA, DEFAULT_DELTA};
use crate::tasks::{Example, TaskSpec};

/// The certification examples sent apart from the fit's
/// (`certify.examples`), labelled as `examples` are: refused beside a
/// `holdout`, beyond the examples' limit together with `examples`, or
/// when one shares its input with a fit example.
pub(super) fn supplied(
    req: &TaskRequest,
    fit: &[Example],
    keys: &[String],
    field: &str,
    wire: bool,
    limits: &Limits,
) -> Result<Option<Vec<Example>>> {
    let Some(list) = req.x_certify.as_ref().and_then(|c| c.examples.as_ref()) else {
        return Ok(None);
    };
    let param = format!("{}.examples", req.certify_param());
    if req.holdout.is_some() || req.x_certify.as_ref().is_some_and(|c| c.holdout.is_some()) {
        return Err(ApiError::invalid(
            &param,
            format!(
                "`{param}` is the held-out side, so no share of `examples` is held out: give \
                 `{param}` or a `holdout`, not both"
            ),
        ));
    }
    if list.is_empty() {
        return Err(ApiError::invalid(
            &param,
            format!("`{param}` is empty: give the certification examples, or omit it"),
        ));
    }
    if fit.len() + list.len() > limits.max_task_examples {
        return Err(ApiError::invalid(
            &param,
            format!(
                "a registration takes at most {} examples, `examples` and `{param}` together; \
                 got {} and {}",
                limits.max_task_examples,
                fit.len(),
                list.len()
            ),
        ));
    }
    let held = labelled(list, &param, keys, field, wire)?;
    let inputs: std::collections::HashSet<&str> = fit.iter().map(|e| e.state.as_str()).collect();
    let seen = held
        .iter()
        .filter(|e| inputs.contains(e.state.as_str()))
        .count();
    if seen > 0 {
        return Err(ApiError::invalid(
            &param,
            format!(
                "{seen} of the {} certification examples share their input with an example of \
                 `examples`; certification runs on examples the fit has not seen",
                held.len()
            ),
        ));
    }
    Ok(Some(held))
}

/// A registration's `certify` block (`x_certify` in decisio's form): alpha
/// and delta in (0, 1) (defaults 0.05 and 0.1), `min_examples` never below
/// what the procedure needs, `suspend_on_alert` (default true).
pub(super) fn certify(req: &TaskRequest) -> Result<Option<CertifySpec>> {
    match &req.x_certify {
        None => Ok(None),
        Some(c) => certify_spec(c, req.certify_param(), "").map(Some),
    }
}

/// A certify block's settings, each fault a 400 naming
/// `<param>.<field>` (`prefix` before a field read at the top level, as
/// `POST /v1/tasks/{id}/certify` reads them).
pub(super) fn certify_spec(c: &CertifyIn, param: &str, prefix: &str) -> Result<CertifySpec> {
    let field = |f: &str| {
        if prefix.is_empty() && !param.is_empty() {
            format!("{param}.{f}")
        } else {
            format!("{prefix}{f}")
        }
    };
    let alpha = unit(c.alpha.unwrap_or(DEFAULT_ALPHA), true, &field("alpha"))?;
    let delta = unit(c.delta.unwrap_or(DEFAULT_DELTA), true, &field("delta"))?;
    let asked = match c.min_examples {
        None => 0,
        Some(m) if m >= 0 => m as usize,
        Some(m) => {
            let f = field("min_examples");
            return Err(ApiError::invalid(
                &f,
                format!("`{f}` must be 0 or more; got {m}"),
            ));
        }
    };
    Ok(CertifySpec {
        alpha,
        delta,
        min_examples: asked.max(minimum_examples(alpha, delta)),
        suspend_on_alert: c.suspend_on_alert.unwrap_or(true),
    })
}

/// A certified registration's two sides checked: the separate list, when
/// sent, appended to `examples` as the held-out side (the fit sees every
/// example sent in `examples`); a score question refused; a held-out side
/// smaller than `min_examples` refused, saying how many the promise needs.
pub(super) fn certified(
    req: &TaskRequest,
    spec: &mut TaskSpec,
    examples: &mut Vec<Example>,
    supplied: Option<Vec<Example>>,
) -> Result<()> {
    let n = examples.len();
    let list = supplied.is_some();
    if let Some(held) = supplied {
        spec.certify_examples = held.len();
        spec.holdout = held.len() as f64 / (n + held.len()) as f64;
        examples.extend(held);
    }
    let Some(c) = &spec.certify else {
        return Ok(());
    };
    if spec
        .wire
        .as_ref()
        .is_some_and(|w| w.question["type"] == "score")
    {
        return Err(ApiError::invalid(
            req.certify_param(),
            "score questions are not certified (an ordinal answer has no single wrong answer); \
             register the task without a certify block",
        ));
    }
    let held = spec.certified_split(examples).map_or(0, |s| s.1.len());
    if held >= c.min_examples {
        return Ok(());
    }
    let why = if c.min_examples > minimum_examples(c.alpha, c.delta) {
        format!("you asked for at least {}", c.min_examples)
    } else {
        format!(
            "with alpha {} and delta {} even a task answered right every time needs {}",
            c.alpha, c.delta, c.min_examples
        )
    };
    let (param, from, more) = if list {
        (
            format!("{}.examples", req.certify_param()),
            format!("in `{}.examples`", req.certify_param()),
            "Send more certification examples",
        )
    } else {
        (
            req.certify_param().to_string(),
            format!("holdout {} of {n}", spec.holdout),
            "Send more examples or a larger holdout",
        )
    };
    Err(ApiError::invalid(
        &param,
        format!(
            "{held} held-out labelled examples ({from}), and at least {} are needed to certify: \
             {why}. {more}",
            c.min_examples
        ),
    ))
}
