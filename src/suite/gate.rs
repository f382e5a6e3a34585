//! `decisio gate --record CANDIDATE --against REFERENCE`: one line per gate,
//! pass or fail, with both figures, the difference and the tolerance.
//!
//! The gates (docs/gates.md has their statistics and defaults):
//! - *accuracy*, per set and over all sets, paired on the same questions:
//!   the 95% paired-bootstrap interval of (candidate - reference) must reach
//!   `-tolerance` (the data do not show a larger drop);
//! - *ECE*, per set and pooled, each side after its own fitted temperature:
//!   candidate at most reference + tolerance;
//! - *intent heads*: mean accuracy over the same draws (paired by seed),
//!   candidate minus reference at least `-tolerance`;
//! - *agreement*, per set: the mean Kullback-Leibler divergence of the
//!   candidate's option probabilities from the reference's, question by
//!   question, at most `tolerance` nats (it bites where accuracy cannot: a
//!   model at chance on a set still has answers to agree with);
//! - *conformance*: every question the candidate's run asked again through
//!   the served surface gave the record's float32 values bit for bit;
//! - *bit for bit* (`--bitwise`, for two runs of one configuration on fresh
//!   servers): every answer's float32 values identical;
//! - *trust* (coverage, the certified promise, the certified share), when
//!   a `trust.json` is beside the candidate's record ([`super::trust`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use super::outcome::{Outcome, Report};
use super::record::{AnswerRecord, IntentRecord, Record, SdkCheck, SDK_FILE};
use super::trust::TrustRecord;
use crate::rng::SplitMix;
use crate::stats;

/// The arguments of `decisio gate`.
#[derive(clap::Args)]
pub struct GateArgs {
    /// The candidate record (a record folder or its record.json).
    #[arg(long)]
    pub record: PathBuf,
    /// The reference record.
    #[arg(long)]
    pub against: PathBuf,
    /// The tolerances (YAML or JSON); the built-in defaults otherwise
    /// (suites/gates.yaml holds them).
    #[arg(long)]
    pub gates: Option<PathBuf>,
    /// Compare records of different bases, tokenizers or suites anyway.
    #[arg(long)]
    pub force: bool,
    /// Require every answer bit for bit (two runs of one configuration).
    #[arg(long)]
    pub bitwise: bool,
    /// Write accuracy per set beside the reference as a PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// The plot's TrueType font.
    #[arg(long)]
    pub font: Option<PathBuf>,
}

/// The tolerances of the gates.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Gates {
    pub accuracy: AccuracyGate,
    pub ece: Tolerance,
    pub intent: Tolerance,
    /// Mean KL divergence (nats) of the candidate's options from the
    /// reference's, per set.
    pub agreement: Tolerance,
    /// The candidate's conformance questions must all be equal.
    pub conformance: bool,
    /// A candidate with chat questions must have them asked again through
    /// the OpenAI Python SDK (`scripts/sdk_conformance.py`), equal bit for
    /// bit; `false` skips this gate (no Python at hand).
    pub openai_sdk: bool,
    /// Every answer bit for bit.
    pub bitwise: bool,
    /// The agreement gates also require the same top option on every
    /// question (two engines on one model's weights: the candidate may
    /// differ in the last digits, never in an answer).
    pub same_answers: bool,
    /// The gates on a trust record beside the candidate's run record
    /// ([`super::trust`]): coverage, the certified promise, and the
    /// certified share against the reference's.
    pub trust: super::trust::TrustGate,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccuracyGate {
    pub tolerance: f64,
    /// The paired bootstrap interval's coverage.
    pub confidence: f64,
    pub resamples: usize,
    pub seed: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    pub tolerance: f64,
}

impl Default for AccuracyGate {
    fn default() -> Self {
        AccuracyGate {
            tolerance: 0.02,
            confidence: 0.95,
            resamples: 2000,
            seed: 1,
        }
    }
}

impl Default for Gates {
    fn default() -> Self {
        Gates {
            accuracy: AccuracyGate::default(),
            ece: Tolerance { tolerance: 0.03 },
            intent: Tolerance { tolerance: 0.03 },
            agreement: Tolerance { tolerance: 0.01 },
            conformance: true,
            openai_sdk: true,
            bitwise: false,
            same_answers: false,
            trust: super::trust::TrustGate::default(),
        }
    }
}

impl Gates {
    pub fn read(path: &Path) -> Result<Gates> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the gates file {}", path.display()))?;
        let de = serde_yaml_ng::Deserializer::from_str(&text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            anyhow::anyhow!("{}: field `{field}`: {}", path.display(), e.into_inner())
        })
    }
}

/// Why two records are not of one base, tokenizer and suite.
fn differences(c: &Record, r: &Record) -> Vec<String> {
    let mut why = Vec::new();
    for key in ["architecture", "base", "tokenizer_identity"] {
        if c.server[key] != r.server[key] {
            why.push(format!(
                "the {} differs: candidate {}, reference {}",
                key.replace('_', " "),
                c.server[key],
                r.server[key]
            ));
        }
    }
    if c.suite.name != r.suite.name || c.suite.digest != r.suite.digest {
        why.push(format!(
            "the suite differs: candidate `{}` ({}), reference `{}` ({})",
            c.suite.name,
            &c.suite.digest[..12.min(c.suite.digest.len())],
            r.suite.name,
            &r.suite.digest[..12.min(r.suite.digest.len())]
        ));
    }
    why
}

fn right(a: &AnswerRecord) -> f64 {
    if a.index == Some(a.gold) {
        1.0
    } else {
        0.0
    }
}

/// The mean of `d` and its paired-bootstrap interval.
fn bootstrap(d: &[f64], g: &AccuracyGate) -> (f64, f64, f64) {
    let n = d.len();
    let mean = d.iter().sum::<f64>() / n as f64;
    let mut rng = SplitMix::new(g.seed);
    let mut means: Vec<f64> = (0..g.resamples.max(1))
        .map(|_| (0..n).map(|_| d[rng.below(n as u64) as usize]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(|a, b| a.total_cmp(b));
    let alpha = (1.0 - g.confidence) / 2.0;
    let at = |p: f64| means[((means.len() - 1) as f64 * p).round() as usize];
    (mean, at(alpha), at(1.0 - alpha))
}

fn accuracy_gate(
    name: &str,
    pairs: &[(&AnswerRecord, &AnswerRecord)],
    g: &AccuracyGate,
) -> Outcome {
    let n = pairs.len() as f64;
    let d: Vec<f64> = pairs.iter().map(|(c, r)| right(c) - right(r)).collect();
    let (mean, lo, hi) = bootstrap(&d, g);
    Outcome {
        gate: format!("accuracy {name}"),
        candidate: format!(
            "{:.4}",
            pairs.iter().map(|(c, _)| right(c)).sum::<f64>() / n
        ),
        reference: format!(
            "{:.4}",
            pairs.iter().map(|(_, r)| right(r)).sum::<f64>() / n
        ),
        difference: format!(
            "{mean:+.4} [{:.0}% {lo:+.4}, {hi:+.4}] (n = {})",
            g.confidence * 100.0,
            pairs.len()
        ),
        tolerance: format!("interval reaches -{}", g.tolerance),
        pass: hi >= -g.tolerance - 1e-12,
    }
}

fn bits(a: &AnswerRecord) -> (Vec<u32>, Vec<u32>) {
    value_bits(&a.probabilities, &a.letter_logprobs)
}

/// The float32 bits of probabilities and letter log-probabilities.
fn value_bits(probabilities: &[f32], letter_logprobs: &[f32]) -> (Vec<u32>, Vec<u32>) {
    let of = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect();
    (of(probabilities), of(letter_logprobs))
}

/// The letter of an option's index.
fn letter(i: usize) -> String {
    ((b'A' + i as u8) as char).to_string()
}

/// The candidate's chat questions asked again through the OpenAI SDK: each
/// of its chat conformance questions must be there, with the suite's
/// float32 values, the answer's letter as the content and every option's
/// letter in `top_logprobs`. None when the candidate has no chat question.
fn sdk_gate(c: &Record, sdk: Option<&SdkCheck>) -> Option<Outcome> {
    let chat: Vec<_> = c
        .conformance
        .iter()
        .filter(|x| x.surface == "chat")
        .collect();
    if chat.is_empty() {
        return None;
    }
    let gate = "conformance (chat questions again through the OpenAI SDK)".to_string();
    let Some(sdk) = sdk else {
        return Some(Outcome {
            gate,
            candidate: "not run".into(),
            reference: "-".into(),
            difference: format!(
                "no {SDK_FILE} beside the record: run scripts/sdk_conformance.py --record DIR --server URL while its server is up"
            ),
            tolerance: "bit for bit".into(),
            pass: false,
        });
    };
    let answers: HashMap<(&str, &str), &AnswerRecord> = c
        .choice_sets
        .iter()
        .flat_map(|s| {
            s.answers
                .iter()
                .map(move |a| ((s.name.as_str(), a.id.as_str()), a))
        })
        .collect();
    let mut equal = 0;
    for q in &chat {
        let got = sdk.items.iter().find(|i| i.set == q.set && i.id == q.id);
        let want = answers.get(&(q.set.as_str(), q.id.as_str()));
        let same = match (got, want) {
            (Some(g), Some(w)) => {
                let mut letters: Vec<String> = (0..w.probabilities.len()).map(letter).collect();
                let mut top = g.top_logprobs.clone();
                letters.sort();
                top.sort();
                bits(w) == value_bits(&g.probabilities, &g.letter_logprobs)
                    && g.content == w.index.map(letter).unwrap_or_default()
                    && top == letters
            }
            _ => false,
        };
        equal += usize::from(same);
    }
    Some(Outcome {
        gate,
        candidate: format!("{equal}/{}", chat.len()),
        reference: "-".into(),
        difference: format!(
            "{} differ or were not asked ({})",
            chat.len() - equal,
            sdk.client
        ),
        tolerance: "bit for bit".into(),
        pass: equal == chat.len(),
    })
}

/// Compares a candidate record with a reference record; `sdk` is what the
/// OpenAI SDK was given for the candidate's chat questions.
pub fn compare(
    c: &Record,
    sdk: Option<&SdkCheck>,
    r: &Record,
    gates: &Gates,
    force: bool,
) -> Result<Report> {
    let why = differences(c, r);
    if !why.is_empty() && !force {
        bail!(
            "the records are not of one base, tokenizer and suite: {}; pass --force to compare anyway",
            why.join("; ")
        );
    }
    let mut outcomes = Vec::new();
    let mut all_pairs = Vec::new();
    let mut bit_diff = (0usize, 0usize);
    for cs in &c.choice_sets {
        let Some(rs) = r.choice_sets.iter().find(|s| s.name == cs.name) else {
            outcomes.push(Outcome {
                gate: format!("accuracy {}", cs.name),
                candidate: "-".into(),
                reference: "absent".into(),
                difference: "-".into(),
                tolerance: "-".into(),
                pass: false,
            });
            continue;
        };
        let by_id: HashMap<&str, &AnswerRecord> =
            rs.answers.iter().map(|a| (a.id.as_str(), a)).collect();
        let pairs: Vec<(&AnswerRecord, &AnswerRecord)> = cs
            .answers
            .iter()
            .filter_map(|a| by_id.get(a.id.as_str()).map(|b| (a, *b)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        for (a, b) in &pairs {
            bit_diff.1 += 1;
            if bits(a) != bits(b) {
                bit_diff.0 += 1;
            }
        }
        outcomes.push(accuracy_gate(&cs.name, &pairs, &gates.accuracy));
        outcomes.push(agreement_gate(
            &cs.name,
            &pairs,
            gates.agreement.tolerance,
            gates.same_answers,
        ));
        if let (Some(fc), Some(fr)) = (&cs.figures, &rs.figures) {
            outcomes.push(ece_gate(
                &cs.name,
                fc.after.ece,
                fr.after.ece,
                gates.ece.tolerance,
            ));
        }
        all_pairs.extend(pairs);
    }
    if c.choice_sets.len() > 1 && !all_pairs.is_empty() {
        outcomes.push(accuracy_gate("all sets", &all_pairs, &gates.accuracy));
    }
    if let (Some(pc), Some(pr)) = (&c.pooled, &r.pooled) {
        outcomes.push(ece_gate(
            "pooled",
            pc.after.ece,
            pr.after.ece,
            gates.ece.tolerance,
        ));
    }
    for ci in &c.intent_sets {
        let Some(ri) = r.intent_sets.iter().find(|s| s.name == ci.name) else {
            continue;
        };
        let (outcome, differs) = intent_gate(ci, ri, gates.intent.tolerance);
        outcomes.push(outcome);
        bit_diff.0 += usize::from(differs);
        bit_diff.1 += 1;
    }
    if gates.conformance {
        outcomes.extend(conformance_gates(c, sdk, gates.openai_sdk));
    }
    if gates.bitwise {
        outcomes.push(Outcome {
            gate: "bit for bit".into(),
            candidate: format!("{}/{}", bit_diff.1 - bit_diff.0, bit_diff.1),
            reference: "-".into(),
            difference: format!("{} answers or draws differ", bit_diff.0),
            tolerance: "0".into(),
            pass: bit_diff.0 == 0 && bit_diff.1 > 0,
        });
    }
    Ok(Report {
        forced: why,
        outcomes,
    })
}

/// The gate of one intent set's heads (their accuracy, paired draw by
/// draw with the reference's by seed), and whether any draw's figures
/// differ from the reference's in a bit.
fn intent_gate(ci: &IntentRecord, ri: &IntentRecord, tolerance: f64) -> (Outcome, bool) {
    let by_seed: HashMap<u64, f64> = ri.per_draw.iter().map(|d| (d.seed, d.accuracy)).collect();
    let diffs: Vec<f64> = ci
        .per_draw
        .iter()
        .filter_map(|d| by_seed.get(&d.seed).map(|r| d.accuracy - r))
        .collect();
    let paired = diffs.len() == ci.per_draw.len() && diffs.len() == ri.per_draw.len();
    let mean = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
    let outcome = Outcome {
        gate: format!("intent heads {} ({} draws)", ci.name, ci.per_draw.len()),
        candidate: format!("{:.4}", ci.accuracy_mean),
        reference: format!("{:.4}", ri.accuracy_mean),
        difference: if paired {
            format!("{mean:+.4} (mean over draws paired by seed)")
        } else {
            "the draws' seeds differ".into()
        },
        tolerance: format!(">= -{tolerance}"),
        pass: paired && mean >= -tolerance - 1e-12,
    };
    let differs = ci.per_draw.len() != ri.per_draw.len()
        || ci.per_draw.iter().zip(&ri.per_draw).any(|(a, b)| {
            a.accuracy.to_bits() != b.accuracy.to_bits() || a.ece.to_bits() != b.ece.to_bits()
        });
    (outcome, differs)
}

/// The conformance gates of a candidate: each surface's questions asked
/// again alone, the OpenAI SDK's (when `openai_sdk`), and each intent
/// set's holdout served as decisions.
fn conformance_gates(c: &Record, sdk: Option<&SdkCheck>, openai_sdk: bool) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for (surface, equal, n) in c.conformance_by_surface() {
        outcomes.push(Outcome {
            gate: format!("conformance (asked again alone, {surface})"),
            candidate: format!("{equal}/{n}"),
            reference: "-".into(),
            difference: format!("{} differ", n - equal),
            tolerance: "bit for bit".into(),
            pass: equal == n,
        });
    }
    if openai_sdk {
        if let Some(o) = sdk_gate(c, sdk) {
            outcomes.push(o);
        }
    }
    for i in &c.intent_sets {
        let s = &i.served;
        outcomes.push(Outcome {
            gate: format!("conformance {} (holdout served as decisions)", i.name),
            candidate: format!("{:.4}/{:.6}", s.accuracy, s.nll),
            reference: format!("{:.4}/{:.6}", s.registration_accuracy, s.registration_nll),
            difference: format!("NLL {:+.2e}", s.nll - s.registration_nll),
            tolerance: "same accuracy, NLL within 1e-6".into(),
            pass: s.equal,
        });
    }
    outcomes
}

/// KL(reference || candidate) of one answer's options, in nats, from the
/// letters' log-probabilities renormalised over the options.
fn kl(c: &AnswerRecord, r: &AnswerRecord) -> f64 {
    let lc = stats::log_softmax(&c.letter_logprobs, 1.0);
    let lr = stats::log_softmax(&r.letter_logprobs, 1.0);
    lr.iter()
        .zip(&lc)
        .map(|(r, c)| r.exp() * (r - c))
        .sum::<f64>()
        .max(0.0)
}

fn agreement_gate(
    name: &str,
    pairs: &[(&AnswerRecord, &AnswerRecord)],
    tol: f64,
    same_answers: bool,
) -> Outcome {
    let mean = pairs.iter().map(|(c, r)| kl(c, r)).sum::<f64>() / pairs.len() as f64;
    let same = pairs.iter().filter(|(c, r)| c.index == r.index).count();
    Outcome {
        gate: format!("agreement {name} (mean KL)"),
        candidate: if mean > 0.0 && mean < 1e-3 {
            format!("{mean:.2e}")
        } else {
            format!("{mean:.5}")
        },
        reference: "0".into(),
        difference: format!("same answer on {same} of {}", pairs.len()),
        tolerance: if same_answers {
            format!("<= {tol} nats, the same answer on every question")
        } else {
            format!("<= {tol} nats")
        },
        pass: mean <= tol && (!same_answers || same == pairs.len()),
    }
}

fn ece_gate(name: &str, c: f64, r: f64, tol: f64) -> Outcome {
    Outcome {
        gate: format!("ECE {name} (after fitted T)"),
        candidate: format!("{c:.4}"),
        reference: format!("{r:.4}"),
        difference: format!("{:+.4}", c - r),
        tolerance: format!("<= +{tol}"),
        pass: c <= r + tol + 1e-12,
    }
}

/// Runs `decisio gate`: prints the lines; true when every gate passed.
pub fn run(args: &GateArgs) -> Result<bool> {
    let c = Record::read(&args.record)?;
    let sdk = SdkCheck::beside(&args.record)?;
    let r = Record::read(&args.against)?;
    let mut gates = match &args.gates {
        Some(p) => Gates::read(p)?,
        None => Gates::default(),
    };
    gates.bitwise |= args.bitwise;
    let mut report = compare(&c, sdk.as_ref(), &r, &gates, args.force)?;
    if let Some(trust) = TrustRecord::beside(&args.record)? {
        let reference = TrustRecord::beside(&args.against)?;
        report.outcomes.extend(super::trust::outcomes(
            &trust,
            reference.as_ref(),
            &gates.trust,
        ));
    }
    for line in report.lines() {
        println!("{line}");
    }
    if let Some(path) = &args.plot {
        let rows: Vec<(String, f64, f64)> = c
            .choice_sets
            .iter()
            .filter_map(|cs| {
                let rs = r.choice_sets.iter().find(|s| s.name == cs.name)?;
                Some((
                    cs.name.clone(),
                    rs.figures.as_ref()?.before.accuracy,
                    cs.figures.as_ref()?.before.accuracy,
                ))
            })
            .collect();
        let font = super::plot::font(args.font.as_deref())
            .context("no font for the plot: give one with --font FILE.ttf")?;
        super::plot::accuracy(
            &rows,
            path,
            &font,
            "accuracy per set: reference and candidate",
        )?;
    }
    Ok(report.passed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_answers_give_a_zero_interval() {
        let d = vec![0.0; 50];
        let (m, lo, hi) = bootstrap(&d, &AccuracyGate::default());
        assert_eq!((m, lo, hi), (0.0, 0.0, 0.0));
    }

    #[test]
    fn a_large_drop_puts_the_interval_below_the_tolerance() {
        // 30 of 100 questions lost, none gained.
        let d: Vec<f64> = (0..100).map(|i| if i < 30 { -1.0 } else { 0.0 }).collect();
        let (m, _, hi) = bootstrap(&d, &AccuracyGate::default());
        assert!((m + 0.3).abs() < 1e-12);
        assert!(hi < -0.15, "{hi}");
        // Two lost and two gained: no drop shown.
        let d: Vec<f64> = (0..100)
            .map(|i| match i {
                0 | 1 => -1.0,
                2 | 3 => 1.0,
                _ => 0.0,
            })
            .collect();
        assert!(bootstrap(&d, &AccuracyGate::default()).2 >= 0.0);
    }

    #[test]
    fn gates_files_name_unknown_fields() {
        let dir = std::env::temp_dir().join(format!("decisio-gates-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("gates.yaml");
        std::fs::write(&f, "accuracy:\n  tolerance: 0.05\n").unwrap();
        let g = Gates::read(&f).unwrap();
        assert_eq!(g.accuracy.tolerance, 0.05);
        assert_eq!(g.accuracy.resamples, 2000);
        std::fs::write(&f, "accuracy:\n  tolerence: 0.05\n").unwrap();
        let e = format!("{:#}", Gates::read(&f).unwrap_err());
        assert!(e.contains("accuracy") && e.contains("tolerence"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
