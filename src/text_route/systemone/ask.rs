//! A System One question as the route asks it, as the reference's served
//! defaults ask it (`to_engine_question` and `noul_as_letters` of
//! `decisio/serve/systemone.py`): its text, options and keys, its task
//! identity, the option sets an abstention task matches, and TypeSafe's
//! confidences of its answer.

use serde_json::{json, Value};

use super::question::{Criteria, Kind, WireQuestion};
use super::{NoulRendering, WireAsk};
use crate::prompt::python::{json_dumps, py_str, JsonOptions};

/// Instructions used when a question sends none (or only whitespace): the
/// prompt needs a question line (`DEFAULT_INSTRUCTIONS` of the reference).
fn default_instructions(kind: Kind) -> &'static str {
    match kind {
        Kind::Noul => "Is this true?",
        Kind::Choice => "Which option applies?",
        Kind::Score => "Which level applies?",
    }
}

/// A JSON value as the prompt shows it (`render_text`): a string as it is,
/// anything else as compact JSON with non-ASCII kept.
pub fn render_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => {
            // `json.dumps(x, ensure_ascii=False, separators=(",", ":"))`
            let compact = JsonOptions {
                ensure_ascii: false,
                indent: None,
                separators: Some((",".into(), ":".into())),
                sort_keys: false,
            };
            json_dumps(&minijinja::Value::from_serialize(other), &compact)
                .unwrap_or_else(|_| other.to_string())
        }
    }
}

/// A state as the prompt shows it (`fmt_state`): a string as it is, an
/// object as `key: value` lines (keys starting with `_` are metadata, not
/// shown; values as Python's `str()`), an array as Python's `str()`.
pub fn state_text(state: &Value) -> String {
    match state {
        Value::String(s) => s.clone(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !k.starts_with('_'))
            .map(|(k, v)| format!("{k}: {}", py_str(&minijinja::Value::from_serialize(v))))
            .collect::<Vec<_>>()
            .join("\n"),
        other => py_str(&minijinja::Value::from_serialize(other)),
    }
}

/// A wire question as the route asks it.
#[derive(Clone, Debug, PartialEq)]
pub struct Asked {
    pub ask: WireAsk,
    pub instructions: String,
    /// The options as shown, in the order asked.
    pub options: Vec<String>,
    /// The answer's keys, in the order asked.
    pub keys: Vec<String>,
}

fn described(d: &Option<Value>) -> Option<String> {
    d.as_ref().map(render_text).filter(|t| !t.is_empty())
}

/// A key that is an index and nothing else (`option_3`, `7`).
fn index_key(key: &str) -> Option<(String, u64)> {
    let digits = key.len() - key.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let (stem, number) = key.split_at(key.len() - digits);
    let word = stem.strip_suffix(['_', '-', ' ']).unwrap_or(stem);
    let letters = word.chars().all(|c| c.is_ascii_alphabetic());
    if !letters || (word.is_empty() && !stem.is_empty()) {
        return None;
    }
    Some((stem.to_lowercase(), number.parse().ok()?))
}

/// Whether a choice's keys are a pure enumeration (one stem, numbers
/// `0..n-1` or `1..n`) with every option described: the keys then carry no
/// meaning, and only the descriptions are shown (`index_keys`).
fn index_keys(options: &[(String, Option<Value>)]) -> bool {
    if options.len() < 2 {
        return false;
    }
    let Some(parsed) = options
        .iter()
        .map(|(k, _)| index_key(k))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    if parsed.iter().any(|(stem, _)| *stem != parsed[0].0) {
        return false;
    }
    let mut numbers: Vec<u64> = parsed.iter().map(|(_, n)| *n).collect();
    numbers.sort_unstable();
    let n = numbers.len() as u64;
    let from0 = numbers.iter().copied().eq(0..n);
    let from1 = numbers.iter().copied().eq(1..=n);
    (from0 || from1)
        && options.iter().all(|(_, d)| {
            d.as_ref()
                .is_some_and(|d| !render_text(d).trim().is_empty())
        })
}

/// Lowercase words joined by underscores, at least two (`card_arrival`).
fn snake_label(label: &str) -> bool {
    label.contains('_')
        && label
            .split('_')
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()))
}

fn desnake(label: &str) -> String {
    if snake_label(label) {
        label.replace('_', " ")
    } else {
        label.to_string()
    }
}

/// Translates a wire question into how the route asks it, as the
/// reference's served defaults do (`to_engine_question`, `noul_as_letters`).
pub fn to_asked(q: &WireQuestion, noul: NoulRendering) -> Asked {
    let instructions = q
        .instructions
        .as_ref()
        .map(|v| render_text(v).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default_instructions(q.kind).to_string());
    match &q.criteria {
        Criteria::Noul { yes, no } => {
            if noul != NoulRendering::Words {
                let side = |d: &Option<Value>, word: &str| match d
                    .as_ref()
                    .map(|v| render_text(v).trim().to_string())
                {
                    Some(t) if !t.is_empty() => {
                        if noul == NoulRendering::LettersKeys {
                            format!("{word}: {t}")
                        } else {
                            t
                        }
                    }
                    _ => word.to_string(),
                };
                let options = vec![side(no, "No"), side(yes, "Yes")];
                if options[0] != options[1] {
                    return Asked {
                        ask: WireAsk::Letters,
                        instructions,
                        options,
                        keys: vec!["no".into(), "yes".into()],
                    };
                }
            }
            let mut lines = vec![instructions];
            if let Some(t) = yes {
                lines.push(format!("Yes means: {}", render_text(t)));
            }
            if let Some(t) = no {
                lines.push(format!("No means: {}", render_text(t)));
            }
            Asked {
                ask: WireAsk::YesNoWords,
                instructions: lines.join("\n"),
                options: Vec::new(),
                keys: vec!["yes".into(), "no".into()],
            }
        }
        Criteria::Choice(options) => {
            let keys: Vec<String> = options.iter().map(|(k, _)| k.clone()).collect();
            let asked = |shown: Vec<String>| Asked {
                ask: WireAsk::Letters,
                instructions: instructions.clone(),
                options: shown,
                keys: keys.clone(),
            };
            let bare: Option<Vec<String>> = if index_keys(options) {
                Some(
                    options
                        .iter()
                        .map(|(_, d)| described(d).unwrap_or_default())
                        .collect(),
                )
            } else if options.iter().all(|(_, d)| described(d).is_none()) {
                Some(keys.clone())
            } else {
                None
            };
            if let Some(bare) = bare {
                return asked(bare.iter().map(|l| desnake(l)).collect());
            }
            // Each option as its description, a key alone where there is
            // none; unless two would then read alike.
            let shown: Vec<String> = options
                .iter()
                .map(|(k, d)| described(d).unwrap_or_else(|| desnake(k)))
                .collect();
            let distinct: std::collections::HashSet<&String> = shown.iter().collect();
            if distinct.len() == shown.len() {
                return asked(shown);
            }
            asked(
                options
                    .iter()
                    .map(|(k, d)| match described(d) {
                        Some(t) => format!("{k}: {t}"),
                        None => k.clone(),
                    })
                    .collect(),
            )
        }
        Criteria::Score(levels) => Asked {
            ask: WireAsk::Letters,
            instructions,
            options: levels.iter().map(render_text).collect(),
            keys: (0..levels.len()).map(|i| i.to_string()).collect(),
        },
    }
}

/// A question's task identity, as the reference decisio keys its tasks
/// (`task_key` of `decisio/serve/tasks.py`): the sha256 of the JSON of its
/// type and options in order (a choice: each key with its description), with
/// the instructions for yes/no and score questions, and the yes/no
/// rendering when one is asked as letters; keys sorted, non-ASCII kept. A
/// registered task applies to exactly the questions of its identity.
pub fn task_identity(q: &WireQuestion, asked: &Asked, noul: NoulRendering) -> String {
    let instructions = json!(q.instructions.as_ref().map(render_text).unwrap_or_default());
    let mut spec = match &q.criteria {
        Criteria::Choice(options) => json!({
            "type": "choice",
            "options": options
                .iter()
                .map(|(k, d)| json!([k, d.as_ref().map(render_text).unwrap_or_default()]))
                .collect::<Vec<_>>(),
        }),
        Criteria::Score(levels) => json!({
            "type": "score",
            "options": levels.iter().map(render_text).collect::<Vec<_>>(),
            "instructions": instructions,
        }),
        Criteria::Noul { yes, no } => {
            let side = |d: &Option<Value>| d.as_ref().map(render_text).unwrap_or_default();
            let criteria = (yes.is_some() || no.is_some()).then(|| json!([side(yes), side(no)]));
            json!({"type": "noul", "criteria": criteria, "instructions": instructions})
        }
    };
    if q.kind == Kind::Noul && asked.ask == WireAsk::Letters {
        let rendering = match noul {
            NoulRendering::LettersKeys => "letters-keys",
            _ => "letters",
        };
        spec["rendering"] = json!(rendering);
    }
    canonical_digest(&spec)
}

/// The sha256 (hex) of `spec` dumped as the reference dumps a task's
/// identity: `json.dumps(spec, ensure_ascii=False, sort_keys=True)`.
pub fn canonical_digest(spec: &Value) -> String {
    use sha2::{Digest, Sha256};
    let canonical = JsonOptions {
        ensure_ascii: false,
        indent: None,
        separators: None,
        sort_keys: true,
    };
    let text = json_dumps(&minijinja::Value::from_serialize(spec), &canonical)
        .unwrap_or_else(|_| spec.to_string());
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// TypeSafe's confidence of a choice: `(max p − 1/n) / (1 − 1/n)`.
pub fn choice_confidence(p: &[f64]) -> f64 {
    let top = p.iter().copied().fold(f64::MIN, f64::max);
    confidence_of(top, p.len())
}

/// TypeSafe's confidence of a choice answered with an option of
/// probability `p` among `n`: `(p − 1/n) / (1 − 1/n)` within 0 to 1 (1 for
/// a single option). [`choice_confidence`] with the top option; an
/// abstention task's answer with the option it serves.
pub fn confidence_of(p: f64, n: usize) -> f64 {
    if n <= 1 {
        return 1.0;
    }
    let n = n as f64;
    ((p - 1.0 / n) / (1.0 - 1.0 / n)).clamp(0.0, 1.0)
}

/// TypeSafe's confidence of a score: one less the mean distance from the
/// mode (the chosen level), over that of a uniform distribution, floored
/// at 0.
pub fn score_confidence(p: &[f64], mode: usize) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let spread: f64 = p
        .iter()
        .enumerate()
        .map(|(i, pi)| pi * (i as f64 - mode as f64).abs())
        .sum();
    let centre = (n as f64 - 1.0) / 2.0;
    let uniform: f64 = (0..n).map(|i| (i as f64 - centre).abs()).sum::<f64>() / n as f64;
    (1.0 - spread / uniform).clamp(0.0, 1.0)
}

/// A choice question's option set: its keys with their descriptions, in
/// any order.
pub fn option_set(q: &WireQuestion) -> Option<String> {
    let Criteria::Choice(options) = &q.criteria else {
        return None;
    };
    let mut pairs: Vec<(String, String)> = options
        .iter()
        .map(|(k, d)| (k.clone(), d.as_ref().map(render_text).unwrap_or_default()))
        .collect();
    pairs.sort();
    Some(canonical_digest(
        &json!({"type": "choice", "criteria": pairs}),
    ))
}

/// A choice question's set of keys, whatever their descriptions.
pub fn option_keys(q: &WireQuestion) -> Option<String> {
    let Criteria::Choice(options) = &q.criteria else {
        return None;
    };
    let mut keys: Vec<&String> = options.iter().map(|(k, _)| k).collect();
    keys.sort();
    Some(canonical_digest(&json!({"type": "choice", "keys": keys})))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A question as a validated body holds it (`crate::http::systemone`
    /// validates; these bodies are valid).
    fn question(v: Value) -> WireQuestion {
        let text = |v: &Value| (!v.is_null()).then(|| v.clone());
        let kind = match v["type"].as_str() {
            Some("noul") => Kind::Noul,
            Some("choice") => Kind::Choice,
            _ => Kind::Score,
        };
        let c = &v["criteria"];
        let criteria = match kind {
            Kind::Noul => Criteria::Noul {
                yes: text(&c["true"]),
                no: text(&c["false"]),
            },
            Kind::Choice => Criteria::Choice(
                c.as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, d)| (k.clone(), text(d)))
                    .collect(),
            ),
            Kind::Score => Criteria::Score(c.as_array().unwrap().clone()),
        };
        WireQuestion {
            kind,
            instructions: text(&v["instructions"]),
            criteria,
        }
    }

    #[test]
    fn choices_are_shown_as_the_reference_shows_them() {
        let q = question(
            json!({"type": "choice", "criteria": {"option_0": "card arrival", "option_1": "lost_card"}}),
        );
        let a = to_asked(&q, NoulRendering::LettersKeys);
        assert_eq!(a.instructions, "Which option applies?");
        assert_eq!(a.options, vec!["card arrival", "lost card"]);
        assert_eq!(a.keys, vec!["option_0", "option_1"]);
        let q = question(
            json!({"type": "choice", "instructions": "Team?", "criteria": {"Billing": "money", "Sales": null}}),
        );
        assert_eq!(
            to_asked(&q, NoulRendering::LettersKeys).options,
            vec!["money", "Sales"]
        );
        let q = question(json!({"type": "choice", "criteria": {"a": "same", "b": "same"}}));
        assert_eq!(
            to_asked(&q, NoulRendering::LettersKeys).options,
            vec!["a: same", "b: same"]
        );
        let q = question(json!({"type": "choice", "criteria": {"sku_12": "x", "sku_13": "y"}}));
        assert_eq!(
            to_asked(&q, NoulRendering::LettersKeys).options,
            vec!["x", "y"]
        );
    }

    #[test]
    fn yes_no_is_a_named_two_option_choice_or_words() {
        let q = question(
            json!({"type": "noul", "instructions": "Refund?", "criteria": {"true": "wants money"}}),
        );
        let a = to_asked(&q, NoulRendering::LettersKeys);
        assert_eq!(a.options, vec!["No", "Yes: wants money"]);
        assert_eq!(a.keys, vec!["no", "yes"]);
        let same = question(json!({"type": "noul", "criteria": {"true": "x", "false": "x"}}));
        let a = to_asked(&same, NoulRendering::Letters);
        assert_eq!(a.ask, WireAsk::YesNoWords);
        assert_eq!(a.instructions, "Is this true?\nYes means: x\nNo means: x");
    }

    #[test]
    fn states_and_structured_text_render_as_python_does() {
        assert_eq!(render_text(&json!({"a": [1, "é"]})), r#"{"a":[1,"é"]}"#);
        assert_eq!(
            state_text(&json!({"subject": "x", "_id": 3, "customer": {"plan": "pro", "n": 3}})),
            "subject: x\ncustomer: {'plan': 'pro', 'n': 3}"
        );
        assert_eq!(state_text(&json!(["a", "b"])), "['a', 'b']");
    }

    /// The identities the reference decisio 0.35.0 gives the same
    /// questions (`task_key` of `decisio/serve/tasks.py` with its
    /// `render_text`, yes/no asked as `letters-keys`), computed in its venv.
    #[test]
    fn task_identities_are_the_reference_task_keys() {
        let cases = [
            (
                json!({"type": "choice", "instructions": "Which team?",
                       "criteria": {"billing": "Money matters, é", "shipping": null, "tech": {"a": [1, 2]}}}),
                "299db3e2add2d7ae8adc46188618979522e0bf585ed0e321290591353648a698",
            ),
            (
                json!({"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", {"x": 1}]}),
                "b526f7486d9b8cff8e4af901a0876a8ea7c6450523d66ab2b7610d2978c50585",
            ),
            (
                json!({"type": "noul", "instructions": "Refund?", "criteria": {"true": "wants money back"}}),
                "5c020678354e6c2adba6a0a44f9aca8c599b9fe4f26a92ca6f0291457b399799",
            ),
            (
                json!({"type": "noul", "criteria": null}),
                "544dfe5248b50433a0217368755b07f4fe1577365ebe82a97ee5cc3b685a40fd",
            ),
        ];
        for (q, want) in cases {
            let q = question(q);
            let a = to_asked(&q, NoulRendering::LettersKeys);
            assert_eq!(task_identity(&q, &a, NoulRendering::LettersKeys), want);
        }
        // Instructions are no part of a choice's identity; descriptions are.
        let a = question(
            json!({"type": "choice", "instructions": "One?", "criteria": {"x": "1", "y": "2"}}),
        );
        let b = question(
            json!({"type": "choice", "instructions": "Two?", "criteria": {"x": "1", "y": "2"}}),
        );
        let c = question(json!({"type": "choice", "criteria": {"x": "1", "y": "3"}}));
        let id = |q: &WireQuestion| {
            task_identity(
                q,
                &to_asked(q, NoulRendering::Letters),
                NoulRendering::Letters,
            )
        };
        assert_eq!(id(&a), id(&b));
        assert_ne!(id(&a), id(&c));
    }

    #[test]
    fn confidences_follow_typesafe() {
        assert!((choice_confidence(&[0.5, 0.25, 0.25]) - 0.25).abs() < 1e-12);
        assert_eq!(score_confidence(&[1.0, 0.0, 0.0], 0), 1.0);
        // A uniform distribution has no confidence.
        assert!(score_confidence(&[1.0 / 3.0; 3], 0).abs() < 1e-12);
        // Half on each end of five levels: as spread as uniform or more.
        assert_eq!(score_confidence(&[0.5, 0.0, 0.0, 0.0, 0.5], 0), 0.0);
    }
}
