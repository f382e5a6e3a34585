//! A registration validated into a task spec and its examples, every
//! fault a 400 naming its field (`POST /v1/tasks`).

use super::certify_block::{certified, certify, supplied};
use super::input::{labelled, unit};
use super::{Result, TaskRequest};
use crate::http::error::ApiError;
use crate::http::fields::task_name;
use crate::http::systemone::parse_one;
use crate::settings::Limits;
use crate::tasks::certificate::DEFAULT_HOLDOUT;
use crate::tasks::conformal::Score;
use crate::tasks::{
    minimum_holdout, Abstention, Coverage, DrawSpec, Example, Kind, TaskSpec, WireTask,
    DEFAULT_ROTATIONS,
};
use crate::text_route::decide::{check_question, is_blank};
use crate::text_route::systemone::{task_identity, to_asked, Asked, Kind as WireKind};
use crate::text_route::systemone::{NoulRendering, WireAsk};
use crate::text_route::Question;

/// A registration: a task spec and its examples, each label an option's
/// index, or a 400 naming the field.
/// `layers` is the backend's tappable blocks (`None`: it returns no hidden
/// states, so intent tasks are refused), `backend` its name and `hint`
/// what would make it return them.
pub(super) fn validate(
    req: &TaskRequest,
    limits: &Limits,
    layers: Option<usize>,
    backend: &str,
    hint: &str,
    noul: NoulRendering,
) -> Result<(TaskSpec, Vec<Example>)> {
    // Taken as sent (untrimmed), as decisions name it and as the
    // description's pattern has it.
    let name = req.name.as_str();
    task_name(name, "name", "a task name", limits)?;
    let kind = kind_of(req)?;
    let wire =
        match &req.systemone {
            Some(v) => Some(wire_task(req, v, kind, noul)?),
            None if req.question.is_none() => return Err(ApiError::invalid(
                "question",
                "a task needs `question` (with `options` or `labels`), or a `systemone` question",
            )),
            None => None,
        };
    let (labels, field, head_layer, draws) = match kind {
        Kind::Choice => {
            choice_only(req)?;
            let options = match &wire {
                Some((_, asked)) => asked.options.clone(),
                None => choice_options(req)?,
            };
            (options, "options", None, None)
        }
        Kind::Intent => {
            let Some(layers) = layers else {
                return Err(ApiError::invalid(
                    "kind",
                    format!(
                        "`intent` tasks read hidden states, which the {backend} backend does \
                         not return{hint}; register a `choice` task (up to 26 options)"
                    ),
                ));
            };
            let labels = match &wire {
                Some((_, asked)) => asked.options.clone(),
                None => intent_labels(req, limits)?,
            };
            (
                labels,
                "labels",
                head_layer(req, layers)?,
                draws(req, limits)?,
            )
        }
    };
    // A System One task's examples are labelled by answer key.
    let (keys, field) = match &wire {
        Some((_, asked)) => (&asked.keys, "answer keys"),
        None => (&labels, field),
    };
    let n = req.examples.len();
    if n < 2 || n > limits.max_task_examples {
        return Err(ApiError::invalid(
            "examples",
            format!(
                "a registration takes 2 to {} examples; got {n}",
                limits.max_task_examples
            ),
        ));
    }
    let mut examples = labelled(&req.examples, "examples", keys, field, wire.is_some())?;
    // The certification examples are checked before the labels' counts,
    // so that a fault in them is named first.
    let supplied = supplied(req, &examples, keys, field, wire.is_some(), limits)?;
    every_label_has_an_example(&examples, keys, field, wire.is_some())?;
    let holdout = holdout(req)?;
    let seed = seed(req)?;
    let abstention = abstention(req)?;
    let certify = certify(req)?;
    let mut spec = TaskSpec {
        name: name.to_string(),
        kind,
        question: match &wire {
            Some((_, asked)) => asked.instructions.clone(),
            None => req
                .question
                .as_deref()
                .unwrap_or_default()
                .trim()
                .to_string(),
        },
        labels,
        holdout,
        seed,
        abstention,
        head_layer,
        draws,
        wire: wire.map(|(task, _)| task),
        coverage: None,
        certify,
        rotations: 1,
        certify_examples: 0,
    };
    spec.rotations = rotations(req, &spec)?;
    certified(req, &mut spec, &mut examples, supplied)?;
    let held = spec.split(&examples).1.len();
    spec.coverage = coverage(req, held, examples.len(), spec.holdout)?;
    Ok((spec, examples))
}

/// `kind`: `choice` (the default) or `intent`.
fn kind_of(req: &TaskRequest) -> Result<Kind> {
    Ok(match req.kind.as_deref() {
        None | Some("choice") => Kind::Choice,
        Some("intent") => Kind::Intent,
        Some(other) => {
            return Err(ApiError::invalid(
                "kind",
                format!("`kind` must be `choice` or `intent`; got `{other}`"),
            ))
        }
    })
}

/// Every label (option, intent label or answer key) has an example.
fn every_label_has_an_example(
    examples: &[Example],
    keys: &[String],
    field: &str,
    wire: bool,
) -> Result<()> {
    let mut counts = vec![0usize; keys.len()];
    for e in examples {
        counts[e.label] += 1;
    }
    if let Some(j) = counts.iter().position(|&c| c == 0) {
        let param = if wire {
            "examples".to_string()
        } else {
            format!("{field}[{j}]")
        };
        return Err(ApiError::invalid(
            &param,
            format!(
                "the {} `{}` has no example",
                &field[..field.len() - 1],
                keys[j]
            ),
        ));
    }
    Ok(())
}

/// The share of examples held out: `holdout` or `x_certify.holdout` (the
/// same where both are given); half of them for a certified task by
/// default, as the reference holds out, else a fifth.
fn holdout(req: &TaskRequest) -> Result<f64> {
    // A certified task holds out half its examples by default, as the
    // reference does.
    let default_holdout = if req.x_certify.is_some() {
        DEFAULT_HOLDOUT
    } else {
        0.2
    };
    Ok(
        match (req.holdout, req.x_certify.as_ref().and_then(|c| c.holdout)) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::invalid(
                    "holdout",
                    format!(
                        "`holdout` ({a}) and `{}.holdout` ({b}) differ; give one",
                        req.certify_param()
                    ),
                ))
            }
            (a, b) => unit(a.or(b).unwrap_or(default_holdout), true, "holdout")?,
        },
    )
}

/// `seed`: 0 or more, 0 by default.
fn seed(req: &TaskRequest) -> Result<u64> {
    Ok(match req.seed {
        None => 0,
        Some(s) if s >= 0 => s as u64,
        Some(s) => {
            return Err(ApiError::invalid(
                "seed",
                format!("`seed` must be 0 or more; got {s}"),
            ))
        }
    })
}

/// `abstention`: exactly one of `target_accuracy` and `abstain_below`.
fn abstention(req: &TaskRequest) -> Result<Option<Abstention>> {
    Ok(match &req.abstention {
        None => None,
        Some(a) => match (a.target_accuracy, a.abstain_below) {
            (Some(t), None) => Some(Abstention::TargetAccuracy(unit(
                t,
                false,
                "abstention.target_accuracy",
            )?)),
            (None, Some(b)) => Some(Abstention::AbstainBelow(unit(
                b,
                false,
                "abstention.abstain_below",
            )?)),
            _ => {
                return Err(ApiError::invalid(
                    "abstention",
                    "`abstention` takes exactly one of `target_accuracy` and `abstain_below`",
                ))
            }
        },
    })
}

/// The rotations a choice task's examples are read in: `x_rotations`, 1
/// to the number of options, or [`DEFAULT_ROTATIONS`] at most by default;
/// 1 where the options have no letters to rotate (an intent task, a yes/no
/// question asked in words).
fn rotations(req: &TaskRequest, spec: &TaskSpec) -> Result<usize> {
    let lettered = spec.kind == Kind::Choice && spec.asked_on_wire() != Some(WireAsk::YesNoWords);
    let n = spec.labels.len();
    match req.x_rotations {
        None if lettered => Ok(n.min(DEFAULT_ROTATIONS)),
        None => Ok(1),
        Some(1) => Ok(1),
        Some(k) if !lettered => Err(ApiError::invalid(
            "x_rotations",
            format!(
                "this task's options have no letters to rotate (an intent task, or a yes/no \
                 question asked in words); omit `x_rotations` or give 1, not {k}"
            ),
        )),
        Some(k) if k >= 1 && k as usize <= n => Ok(k as usize),
        Some(k) => Err(ApiError::invalid(
            "x_rotations",
            format!("`x_rotations` must be 1 to the task's {n} options; got {k}"),
        )),
    }
}

/// The prediction sets a registration asks for: a coverage in (0, 1), a
/// score, and a holdout large enough to calibrate them (the split is the
/// one the task will be fitted with).
fn coverage(req: &TaskRequest, held: usize, n: usize, holdout: f64) -> Result<Option<Coverage>> {
    let Some(level) = req.x_coverage else {
        if req.x_conformal_score.is_some() {
            return Err(ApiError::invalid(
                "x_conformal_score",
                "`x_conformal_score` scores prediction sets; give `x_coverage` with it",
            ));
        }
        return Ok(None);
    };
    let level = unit(level, true, "x_coverage")?;
    let score = match req.x_conformal_score.as_deref() {
        None | Some("lac") => Score::Lac,
        Some("aps") => Score::Aps,
        Some(other) => {
            return Err(ApiError::invalid(
                "x_conformal_score",
                format!("`x_conformal_score` must be `lac` or `aps`; got `{other}`"),
            ))
        }
    };
    let needed = minimum_holdout(level);
    if held < needed {
        return Err(ApiError::invalid(
            "x_coverage",
            format!(
                "prediction sets of coverage {level} are calibrated on at least {needed} \
                 held-out examples; this registration holds out {} (`holdout` {holdout} of {} \
                 examples): send more examples, a larger `holdout` or a lower `x_coverage`",
                held, n
            ),
        ));
    }
    Ok(Some(Coverage { level, score }))
}

/// Fields of intent tasks, refused on a choice task.
fn choice_only(req: &TaskRequest) -> Result<()> {
    for (set, field) in [
        (req.labels.is_some(), "labels"),
        (req.head.is_some(), "head"),
        (req.draws.is_some(), "draws"),
        (req.shots.is_some(), "shots"),
    ] {
        if set {
            return Err(ApiError::invalid(
                field,
                format!(
                    "`{field}` applies to `intent` tasks only (a `choice` task takes `options`)"
                ),
            ));
        }
    }
    Ok(())
}

/// A choice task's options, checked as a decision's question is.
fn choice_options(req: &TaskRequest) -> Result<Vec<String>> {
    let options = req
        .options
        .clone()
        .ok_or_else(|| ApiError::invalid("options", "a `choice` task needs `options`"))?;
    let probe = Question::new(req.question.clone().unwrap_or_default(), options);
    // The same rules as a decision's question, with the registration's names.
    check_question(&probe, "task").map_err(|e| match ApiError::from(e) {
        ApiError::BadRequest { message, param } => ApiError::BadRequest {
            message,
            param: param.map(|p| {
                p.trim_start_matches("task.")
                    .replacen("text", "question", 1)
            }),
        },
        other => other,
    })?;
    Ok(probe.options.iter().map(|o| o.trim().to_string()).collect())
}

/// An intent task's labels: 2 to `max_task_labels`, none empty, none
/// twice, none longer than `max_task_label_bytes`.
fn intent_labels(req: &TaskRequest, limits: &Limits) -> Result<Vec<String>> {
    if req.options.is_some() {
        return Err(ApiError::invalid(
            "options",
            "an `intent` task takes `labels`; `options` are for `choice` tasks",
        ));
    }
    if is_blank(req.question.as_deref().unwrap_or_default()) {
        return Err(ApiError::invalid("question", "the question is empty"));
    }
    let labels = req
        .labels
        .as_ref()
        .ok_or_else(|| ApiError::invalid("labels", "an `intent` task needs `labels`"))?;
    let max = limits.max_task_labels;
    if labels.len() < 2 || labels.len() > max {
        return Err(ApiError::invalid(
            "labels",
            format!(
                "an intent task takes 2 to {max} labels; got {}",
                labels.len()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(labels.len());
    for (i, l) in labels.iter().enumerate() {
        if is_blank(l) {
            return Err(ApiError::invalid(
                &format!("labels[{i}]"),
                "a label is empty",
            ));
        }
        let l = l.trim();
        if l.len() > limits.max_task_label_bytes {
            return Err(ApiError::invalid(
                &format!("labels[{i}]"),
                format!(
                    "a label is at most {} bytes; this one is {}",
                    limits.max_task_label_bytes,
                    l.len()
                ),
            ));
        }
        if !seen.insert(l) {
            return Err(ApiError::invalid(
                &format!("labels[{i}]"),
                format!("the label `{l}` appears twice"),
            ));
        }
        out.push(l.to_string());
    }
    Ok(out)
}

/// `head.layer`: -1 or absent for the final norm's output, else a block
/// index below `layers`.
fn head_layer(req: &TaskRequest, layers: usize) -> Result<Option<usize>> {
    match req.head.as_ref().and_then(|h| h.layer) {
        None | Some(-1) => Ok(None),
        Some(k) if layers == 0 => Err(ApiError::invalid(
            "head.layer",
            format!(
                "this backend returns the final norm's output only (its head upstream's \
                 embeddings), so `head.layer` must be -1 or left out; got {k}"
            ),
        )),
        Some(k) if k >= 0 && (k as u64) < layers as u64 => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::invalid(
            "head.layer",
            format!(
                "`head.layer` is -1 (the final norm's output) or a block of this model, 0 to {}; \
                 got {k}",
                layers.saturating_sub(1)
            ),
        )),
    }
}

/// `draws` and `shots`: both or neither, draws 1 to `max_task_draws`,
/// shots 1 to `max_task_examples`.
fn draws(req: &TaskRequest, limits: &Limits) -> Result<Option<DrawSpec>> {
    match (req.draws, req.shots) {
        (None, None) => Ok(None),
        (Some(d), Some(s)) => {
            if d < 1 || d as u64 > limits.max_task_draws as u64 {
                return Err(ApiError::invalid(
                    "draws",
                    format!("`draws` is 1 to {}; got {d}", limits.max_task_draws),
                ));
            }
            if s < 1 || s as u64 > limits.max_task_examples as u64 {
                return Err(ApiError::invalid(
                    "shots",
                    format!(
                        "`shots` (examples per label in each draw) is 1 to {}; got {s}",
                        limits.max_task_examples
                    ),
                ));
            }
            Ok(Some(DrawSpec {
                draws: d as usize,
                shots: s as usize,
            }))
        }
        (Some(_), None) => Err(ApiError::invalid(
            "shots",
            "`draws` needs `shots`: the examples per label in each draw",
        )),
        (None, Some(_)) => Err(ApiError::invalid(
            "draws",
            "`shots` needs `draws`: how many heads to fit",
        )),
    }
}

/// The smallest choice an intent task takes from a System One question
/// (`MIN_OPTIONS_FOR_HEAD` of the reference's `decisio/serve/tasks.py`):
/// fewer options are a choice task's.
pub const MIN_INTENT_OPTIONS: usize = 10;

/// A System One task's question: its wire form and how the wire asks it,
/// or a 400 naming the field. `question`, `options` and `labels` are the
/// wire question's own, so they are refused beside it.
fn wire_task(
    req: &TaskRequest,
    v: &serde_json::Value,
    kind: Kind,
    noul: NoulRendering,
) -> Result<(WireTask, Asked)> {
    for (set, field) in [
        (req.question.is_some(), "question"),
        (req.options.is_some(), "options"),
        (req.labels.is_some(), "labels"),
    ] {
        if set {
            return Err(ApiError::invalid(
                field,
                format!(
                    "a task registered from a `systemone` question takes its instructions and \
                     options from it; leave `{field}` out"
                ),
            ));
        }
    }
    let q = parse_one("systemone", v.clone()).map_err(|(p, m)| ApiError::invalid(&p, m))?;
    let asked = to_asked(&q, noul);
    if asked.ask == WireAsk::YesNoWords {
        return Err(ApiError::invalid(
            "systemone.criteria",
            "this yes/no question is asked in words (its two sides read alike, or the server \
             asks yes/no in words), which a task does not take; describe its sides differently",
        ));
    }
    if kind == Kind::Intent
        && (q.kind != WireKind::Choice || asked.options.len() < MIN_INTENT_OPTIONS)
    {
        return Err(ApiError::invalid(
            "kind",
            format!(
                "an `intent` task takes a `choice` of {MIN_INTENT_OPTIONS} or more options; \
                 register this question as a `choice` task"
            ),
        ));
    }
    let task = WireTask {
        ask: asked.ask.clone(),
        keys: asked.keys.clone(),
        identity: task_identity(&q, &asked, noul),
        question: v.clone(),
    };
    Ok((task, asked))
}
