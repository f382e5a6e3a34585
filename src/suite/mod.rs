//! Suites, run records and gates: the instrument with which a conversion or
//! a backend proves that it answers like a reference (docs/gates.md).
//!
//! - A *suite* file ([`Suite`], YAML or JSON) names the work: choice sets
//!   (questions with states, options and gold answers) and intent sets
//!   (labelled texts registered as intent tasks, with heads over draws).
//! - `decisio suite run` ([`run`]) asks a server the suite through its public
//!   API and writes a *run record* ([`record::Record`]) with every answer's
//!   float32 values and the figures computed from them.
//! - `decisio gate` ([`gate`]) compares a candidate record with a reference
//!   record and prints one line per gate.
//!
//! Nothing here knows MLX or vLLM: a suite measures any decisio server.

pub mod data;
pub mod gate;
pub mod outcome;
pub mod plot;
pub mod record;
pub mod run;
pub mod trust;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The suite file format this build reads (`version:` of a suite).
pub const SUITE_VERSION: u32 = 1;

/// A suite file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// The suite format's version: 1.
    pub version: u32,
    /// The suite's name; records of different suites are not compared.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Seeds every draw: options offered, holdouts, heads' draws.
    pub seed: u64,
    #[serde(default)]
    pub choice_sets: Vec<ChoiceSet>,
    #[serde(default)]
    pub intent_sets: Vec<IntentSet>,
    /// Questions of each choice set asked again, alone, for the conformance
    /// gate (0: none).
    #[serde(default = "default_conformance")]
    pub conformance: usize,
    /// Figures recorded beyond accuracy, NLL, ECE and the answers:
    /// `latency`, `memory`.
    #[serde(default)]
    pub record: Vec<Extra>,
}

fn default_conformance() -> usize {
    8
}

/// An optional figure of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Extra {
    /// Per question, for new and cached states (client-side, milliseconds).
    Latency,
    /// The server's memory figures from `/metrics`.
    Memory,
}

/// How a choice set's file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChoiceFormat {
    /// MMLU rows (`question`, `answer_a`..`answer_d`, `correct_answer`,
    /// `topic`): per subject, a state of `shots` solved questions and the
    /// next `per_subject` questions asked on it.
    Mmlu,
    /// MMLU rows, asked which subject each question is from: the state is
    /// the question with its answers, the options `options` subjects.
    MmluSubject,
    /// JSON lines `{"id", "state", "question", "options", "answer"}`.
    Jsonl,
}

/// A set of multiple-choice questions.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChoiceSet {
    pub name: String,
    pub format: ChoiceFormat,
    /// The data file: absolute, or found beside the suite file or in a
    /// `--data` folder.
    pub file: PathBuf,
    /// MMLU formats: only these subjects (`topic`), all when empty.
    #[serde(default)]
    pub subjects: Vec<String>,
    /// MMLU formats: questions per subject.
    #[serde(default = "default_per_subject")]
    pub per_subject: usize,
    /// `mmlu`: solved questions in each subject's state.
    #[serde(default = "default_shots")]
    pub shots: usize,
    /// `mmlu-subject`: subjects offered (the right one among them).
    #[serde(default = "default_options")]
    pub options: usize,
    /// At most this many questions, the first ones (MMLU formats: in
    /// subjects' alphabetical order).
    #[serde(default)]
    pub limit: Option<usize>,
}

fn default_per_subject() -> usize {
    10
}
fn default_shots() -> usize {
    2
}
fn default_options() -> usize {
    4
}

/// How an intent set's file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntentFormat {
    /// MMLU rows: the question's text, labelled with its subject.
    MmluSubjects,
    /// `text,label` CSV with a header (BANKING77).
    Csv,
    /// clinc_oos JSON (`train`, `val`, `test` lists of `[text, label]`).
    Clinc,
}

/// A set of labelled texts, registered as an intent task.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntentSet {
    pub name: String,
    pub format: IntentFormat,
    pub file: PathBuf,
    /// The question each text is asked with.
    pub question: String,
    /// clinc: the parts read, comma-separated.
    #[serde(default)]
    pub split: Option<String>,
    /// At most this many examples of each label (the first ones).
    #[serde(default)]
    pub per_label: Option<usize>,
    /// Only the first this many labels (in order of first appearance).
    #[serde(default)]
    pub labels: Option<usize>,
    /// Heads fitted on `draws` draws of `shots` examples per label.
    pub draws: usize,
    pub shots: usize,
    /// Share of the examples held out (the registration's default when
    /// absent).
    #[serde(default)]
    pub holdout: Option<f64>,
    /// The head's layer (the registration's default when absent).
    #[serde(default)]
    pub layer: Option<i64>,
}

/// A suite as read: the file, its digest and where its data lives.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub suite: Suite,
    /// SHA-256 of the suite file's bytes.
    pub digest: String,
    pub path: PathBuf,
    /// Where relative data paths are looked for, in order.
    pub roots: Vec<PathBuf>,
}

impl Loaded {
    /// Reads and checks a suite file. Errors name the field and line.
    pub fn read(path: &Path, data: &[PathBuf]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the suite file {}", path.display()))?;
        let suite =
            parse(&text).with_context(|| format!("{} is not a valid suite", path.display()))?;
        let mut roots = vec![path.parent().unwrap_or(Path::new(".")).to_path_buf()];
        roots.extend(data.iter().cloned());
        Ok(Loaded {
            suite,
            digest: format!("{:x}", Sha256::digest(text.as_bytes())),
            path: path.to_path_buf(),
            roots,
        })
    }

    /// A data file of the suite, found beside it or in a `--data` folder.
    pub fn data_file(&self, file: &Path) -> Result<PathBuf> {
        if file.is_absolute() {
            return Ok(file.to_path_buf());
        }
        for root in &self.roots {
            let p = root.join(file);
            if p.is_file() {
                return Ok(p);
            }
        }
        let looked: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        bail!(
            "the data file `{}` is in none of {}; pass the folder that holds it with --data",
            file.display(),
            looked.join(", ")
        )
    }
}

/// A suite from its text (YAML, of which JSON is a part), checked.
pub fn parse(text: &str) -> Result<Suite> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let suite: Suite = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        anyhow::anyhow!("field `{path}`: {}", e.into_inner())
    })?;
    check(&suite)?;
    Ok(suite)
}

fn check(s: &Suite) -> Result<()> {
    if s.version != SUITE_VERSION {
        bail!(
            "field `version`: this decisio reads suite version {SUITE_VERSION}; got {}",
            s.version
        );
    }
    if s.choice_sets.is_empty() && s.intent_sets.is_empty() {
        bail!("field `choice_sets`: a suite needs at least one choice set or intent set");
    }
    let mut names: Vec<&str> = Vec::new();
    let sets = s
        .choice_sets
        .iter()
        .map(|c| ("choice_sets", &c.name))
        .chain(s.intent_sets.iter().map(|i| ("intent_sets", &i.name)));
    for (i, (field, name)) in sets.enumerate() {
        let ok = !name.is_empty()
            && name.len() <= 48
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
        if !ok {
            bail!("field `{field}[].name`: a set's name is 1 to 48 characters of A-Z, a-z, 0-9, `-` and `_`; got `{name}`");
        }
        if names.contains(&name.as_str()) {
            bail!("field `{field}[].name`: the name `{name}` is used twice (set {i})");
        }
        names.push(name);
    }
    for (i, c) in s.choice_sets.iter().enumerate() {
        if c.per_subject == 0 {
            bail!("field `choice_sets[{i}].per_subject`: must be at least 1");
        }
        if !(2..=26).contains(&c.options) {
            bail!(
                "field `choice_sets[{i}].options`: 2 to 26 subjects; got {}",
                c.options
            );
        }
    }
    for (i, t) in s.intent_sets.iter().enumerate() {
        if t.draws == 0 || t.shots == 0 {
            bail!("field `intent_sets[{i}].draws`: draws and shots must both be at least 1");
        }
        if t.question.trim().is_empty() {
            bail!("field `intent_sets[{i}].question`: must not be blank");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "version: 1\nname: t\nseed: 7\nchoice_sets:\n  - name: a\n    format: mmlu\n    file: mmlu.jsonl\n";

    #[test]
    fn a_minimal_suite_reads_with_defaults() {
        let s = parse(SMALL).unwrap();
        assert_eq!(s.choice_sets[0].per_subject, 10);
        assert_eq!(s.conformance, 8);
    }

    #[test]
    fn errors_name_the_field_and_line() {
        let bad = SMALL.replace("format: mmlu", "format: mmlu-answers");
        let e = format!("{:#}", parse(&bad).unwrap_err());
        assert!(e.contains("choice_sets[0].format"), "{e}");
        assert!(e.contains("line 6"), "{e}");
        let bad = SMALL.replace("seed: 7", "seed: 7\nseeds: 8");
        let e = format!("{:#}", parse(&bad).unwrap_err());
        assert!(e.contains("seeds") && e.contains("line 4"), "{e}");
        let bad = SMALL.replace("version: 1", "version: 2");
        assert!(format!("{:#}", parse(&bad).unwrap_err()).contains("version"));
    }

    #[test]
    fn set_names_are_unique() {
        let two = format!("{SMALL}  - name: a\n    format: jsonl\n    file: x.jsonl\n");
        let e = format!("{:#}", parse(&two).unwrap_err());
        assert!(e.contains("used twice"), "{e}");
    }
}
