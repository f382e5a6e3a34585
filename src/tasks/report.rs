//! What a ready task reports, fitted from its scored examples: the seeded
//! split, the temperature (a choice task's letters) or the intent head,
//! the figures before and after on the holdout, and the abstention
//! threshold.

use serde::{Deserialize, Serialize};

use super::certificate::CertificateReport;
use super::{Abstention, Coverage, TaskSpec};
use crate::stats::calibrate::{self, Figures, Threshold};
use crate::stats::conformal::{self, Score};
use crate::stats::debias::{self, Debias};
use crate::stats::head::{self, DrawsReport, Head, HeadReport};
use crate::stats::Readout;

/// What a ready task was fitted to and how well.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The fitted temperature (of the letters, or of an intent head).
    pub temperature: f64,
    pub fit_examples: usize,
    pub holdout_examples: usize,
    /// The held-out examples' indices, ascending.
    pub holdout_indices: Vec<usize>,
    /// Holdout figures at the base's default temperature.
    pub before: Figures,
    /// Holdout figures at the fitted temperature.
    pub after: Figures,
    /// The abstention threshold and what it costs on the holdout.
    pub abstention: Option<Threshold>,
    /// Seconds of scoring and fitting (over all restarts).
    pub seconds: f64,
    /// An intent task's served head: how it was fitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<HeadReport>,
    /// An intent task's heads over draws, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draws: Option<DrawsReport>,
    /// The prediction sets' threshold, when the task asked for a coverage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction_sets: Option<SetsReport>,
    /// The certificate, when the task was registered with `certify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificateReport>,
    /// A choice task's letter-bias removal: what was tried on the fit
    /// side and what is served ([`crate::stats::debias`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debias: Option<Debias>,
    /// A choice task's share of holdout answers at each letter, before
    /// (the plain readout at the default temperature) and after (as
    /// served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub letter_rates: Option<LetterRates>,
}

/// The share of answers at each letter (position), before and after.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LetterRates {
    /// The share of labels at each position: what the rates would be for
    /// a readout always right.
    pub labels: Vec<f64>,
    pub before: Vec<f64>,
    pub after: Vec<f64>,
}

impl LetterRates {
    fn of(plain: &[Vec<f32>], served: &[Vec<f32>], labels: &[usize], t0: f64, t: f64) -> Self {
        let k = plain.first().map_or(0, Vec::len);
        let rates = |tops: Vec<usize>| {
            let mut r = vec![0.0; k];
            for i in &tops {
                r[*i] += 1.0 / tops.len().max(1) as f64;
            }
            r
        };
        let tops = |rows: &[Vec<f32>], t: f64| -> Vec<usize> {
            rows.iter().map(|l| Readout::of(l, t).top).collect()
        };
        LetterRates {
            labels: rates(labels.to_vec()),
            before: rates(tops(plain, t0)),
            after: rates(tops(served, t)),
        }
    }
}

impl Report {
    /// A choice task's letter logits as served: less the kept letter bias.
    pub fn served_logits(&self, logits: &[f32]) -> Vec<f32> {
        match self.debias.as_ref().and_then(Debias::applied) {
            Some(bias) => debias::corrected(logits, bias),
            None => logits.to_vec(),
        }
    }
}

/// A task's prediction sets: the conformal threshold fitted on the holdout
/// at the served temperature, and the sets it gives there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SetsReport {
    /// The promised coverage, `1 − alpha`.
    pub coverage: f64,
    pub score: Score,
    /// An option is in the set when its score is at most this.
    pub threshold: f64,
    /// The holdout examples the threshold was fitted on.
    pub calibration_examples: usize,
    /// The mean number of options in the holdout's sets.
    pub mean_size: f64,
    /// The share of the holdout's sets holding the true option (at least
    /// `coverage` by construction: the held-out side is the calibration
    /// side; the guarantee is for new questions).
    pub holdout_coverage: f64,
}

impl SetsReport {
    /// Fits the threshold on held-out option probabilities and their true
    /// options; `None` when there are too few for the level (a
    /// registration is refused before that, [`minimum_holdout`]).
    pub fn fit(coverage: Coverage, probabilities: &[Vec<f64>], truth: &[usize]) -> Option<Self> {
        let alpha = 1.0 - coverage.level;
        let threshold = conformal::calibrate(coverage.score, probabilities, truth, alpha).ok()?;
        let sets: Vec<Vec<usize>> = probabilities
            .iter()
            .map(|p| conformal::prediction_set(coverage.score, p, threshold))
            .collect();
        let n = truth.len() as f64;
        Some(SetsReport {
            coverage: coverage.level,
            score: coverage.score,
            threshold,
            calibration_examples: truth.len(),
            mean_size: sets.iter().map(Vec::len).sum::<usize>() as f64 / n,
            holdout_coverage: sets
                .iter()
                .zip(truth)
                .filter(|(s, y)| s.contains(y))
                .count() as f64
                / n,
        })
    }

    /// The options (indices) of the set of an answer's probabilities.
    pub fn set(&self, probabilities: &[f64]) -> Vec<usize> {
        conformal::prediction_set(self.score, probabilities, self.threshold)
    }
}

/// The fewest held-out examples that calibrate sets of `coverage`.
pub fn minimum_holdout(coverage: f64) -> usize {
    conformal::minimum_calibration(1.0 - coverage)
}

/// The prediction sets the spec asks for, fitted on held-out logits at
/// temperature `t`.
fn sets(spec: &TaskSpec, logits: &[Vec<f32>], labels: &[usize], t: f64) -> Option<SetsReport> {
    let coverage = spec.coverage?;
    let probabilities: Vec<Vec<f64>> = logits.iter().map(|l| Readout::of(l, t).exact).collect();
    SetsReport::fit(coverage, &probabilities, labels)
}

/// A task's fit and held-out example indices ([`TaskSpec::split`]).
pub type Split = (Vec<usize>, Vec<usize>);

/// Fits a choice task on its scored examples (`reads[i]`: example `i`'s
/// letter logits in each rotation, the served order first) split by
/// `split` ([`TaskSpec::split`]): the letter bias ([`debias::choose`]) and
/// then the temperature on the fit side, the figures and the threshold on
/// the holdout as served.
pub fn fit(
    spec: &TaskSpec,
    reads: &[Vec<Vec<f32>>],
    labels: &[usize],
    default_t: f64,
    (fit_idx, held_idx): Split,
) -> Report {
    let k = spec.labels.len();
    let fit_reads: Vec<Vec<Vec<f32>>> = fit_idx.iter().map(|&i| reads[i].clone()).collect();
    let fy: Vec<usize> = fit_idx.iter().map(|&i| labels[i]).collect();
    let letters = debias::choose(&fit_reads, &fy, k, spec.seed);
    let bias = letters.bias.clone();
    let pick = |idx: &[usize]| -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<usize>) {
        (
            idx.iter().map(|&i| reads[i][0].clone()).collect(),
            idx.iter()
                .map(|&i| debias::corrected(&reads[i][0], &bias))
                .collect(),
            idx.iter().map(|&i| labels[i]).collect(),
        )
    };
    let (_, fl, fy) = pick(&fit_idx);
    let (plain, hl, hy) = pick(&held_idx);
    let t = calibrate::fit_temperature(&fl, &fy);
    let abstention = abstention(spec, &hl, &hy, t);
    let prediction_sets = sets(spec, &hl, &hy, t);
    Report {
        temperature: t,
        fit_examples: fl.len(),
        holdout_examples: hl.len(),
        holdout_indices: held_idx,
        before: calibrate::figures(&plain, &hy, default_t),
        after: calibrate::figures(&hl, &hy, t),
        letter_rates: Some(LetterRates::of(&plain, &hl, &hy, default_t, t)),
        debias: Some(letters),
        abstention,
        seconds: 0.0,
        head: None,
        draws: None,
        prediction_sets,
        certificate: None,
    }
}

/// Fits an intent task on its examples' hidden states split by `split`
/// ([`TaskSpec::split`]): the head on the fit side (cross-validated
/// strength and the head on its head part, the temperature on its
/// calibration part), the figures and the threshold on the holdout, and
/// the draws when asked for.
pub fn fit_intent(
    spec: &TaskSpec,
    features: &[Vec<f32>],
    labels: &[usize],
    (fit_idx, held_idx): Split,
) -> Result<(Report, Head), String> {
    let n_labels = spec.labels.len();
    let rows: Vec<&[f32]> = features.iter().map(|f| f.as_slice()).collect();
    let fx: Vec<&[f32]> = fit_idx.iter().map(|&i| rows[i]).collect();
    let fy: Vec<usize> = fit_idx.iter().map(|&i| labels[i]).collect();
    let hx: Vec<&[f32]> = held_idx.iter().map(|&i| rows[i]).collect();
    let hy: Vec<usize> = held_idx.iter().map(|&i| labels[i]).collect();
    let mut fitted = head::fit(&fx, &fy, n_labels, spec.head_layer, spec.seed)?;
    // The temperature's examples, as indices of the task's examples.
    for i in fitted.report.calibration_indices.iter_mut() {
        *i = fit_idx[*i];
    }
    let (before, after) = head::figures(&fitted.head, &hx, &hy);
    let held_logits = head::logits(&fitted.head, &hx);
    let abstention = abstention(spec, &held_logits, &hy, fitted.head.temperature);
    let prediction_sets = sets(spec, &held_logits, &hy, fitted.head.temperature);
    let draws = match spec.draws {
        Some(d) => Some(head::draws(
            &rows,
            labels,
            n_labels,
            &fit_idx,
            &held_idx,
            d.draws,
            d.shots,
            spec.head_layer,
            spec.seed,
        )?),
        None => None,
    };
    Ok((
        Report {
            temperature: fitted.head.temperature,
            fit_examples: fx.len(),
            holdout_examples: hx.len(),
            holdout_indices: held_idx,
            before,
            after,
            abstention,
            seconds: 0.0,
            head: Some(fitted.report),
            draws,
            prediction_sets,
            certificate: None,
            debias: None,
            letter_rates: None,
        },
        fitted.head,
    ))
}

/// The threshold the task's abstention asks for, and what it costs on the
/// holdout (`logits`, `labels`) at temperature `t`.
fn abstention(spec: &TaskSpec, logits: &[Vec<f32>], labels: &[usize], t: f64) -> Option<Threshold> {
    let pairs = calibrate::confidences(logits, labels, t);
    spec.abstention.map(|a| match a {
        Abstention::TargetAccuracy(target) => calibrate::threshold_for_target(&pairs, target),
        Abstention::AbstainBelow(b) => calibrate::threshold_fixed(&pairs, b),
    })
}
