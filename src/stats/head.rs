//! Intent heads: an L2-regularised multinomial logistic regression on the
//! hidden state at the answer position, and a temperature on top.
//!
//! The fit split is itself split, per label and seeded, into a head part
//! (all but [`CALIBRATION_SHARE`] of it) and a calibration part (at least
//! one example of every label that has two or more). Features are
//! standardised with the head part's means and standard deviations; the
//! regularisation is chosen by stratified k-fold cross-validation on the
//! head part over [`C_GRID`] (least out-of-fold NLL); the served head is
//! fitted on the whole head part; its temperature is fitted on that very
//! head's logits of the calibration part, which it was not fitted on. The
//! optimiser is `linfa-logistic` (argmin's L-BFGS on ndarray).
//! Everything is deterministic: the parts, folds and draws come from the
//! seed, the optimiser has no randomness and runs a fixed iteration cap.
//! `docs/design/tasks.md` states every rule.

use linfa::prelude::*;
use linfa_logistic::MultiLogisticRegression;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use super::calibrate::{self, Figures};
use super::mean_sd;
use crate::rng::SplitMix;

/// The inverse regularisation strengths tried (`alpha = 1 / C` on the
/// summed log-loss, as scikit-learn's `C`).
pub const C_GRID: [f64; 5] = [1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// Folds of the cross-validation.
pub const FOLDS: usize = 3;

/// Share of each label's fit examples kept out of the head's fit to fit
/// its temperature on.
pub const CALIBRATION_SHARE: f64 = 0.2;

/// A split seed's offset from the task's, so the calibration part is not
/// the holdout's twin.
const CALIBRATION_SEED: u64 = 0x6a09_e667_f3bc_c908;

/// L-BFGS iterations per fit, at most.
pub const MAX_ITERATIONS: u64 = 100;

/// A label absent from a fold's training part scores this far below the
/// lowest present label in that fold's held-out logits.
const ABSENT_GAP: f32 = 30.0;

/// A fitted intent head, as served and as the state folder keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Head {
    /// The block whose output is the feature; `None`: the final norm's.
    pub layer: Option<usize>,
    /// Feature width (the model's hidden size).
    pub dim: usize,
    /// Number of labels.
    pub labels: usize,
    /// Standardisation: `x' = (x - mean) / scale`.
    pub mean: Vec<f64>,
    pub scale: Vec<f64>,
    /// Weights, feature-major: `weights[f * labels + j]`.
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    /// The temperature the logits are divided by.
    pub temperature: f64,
    /// The chosen inverse regularisation strength.
    pub c: f64,
}

impl Head {
    /// The head's raw logits (before the temperature) for one feature vector.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let mut z = self.bias.clone();
        for (f, &v) in x.iter().enumerate().take(self.dim) {
            let s = (f64::from(v) - self.mean[f]) / self.scale[f];
            if s == 0.0 {
                continue;
            }
            let row = &self.weights[f * self.labels..(f + 1) * self.labels];
            for (zj, w) in z.iter_mut().zip(row) {
                *zj += s * w;
            }
        }
        z.into_iter().map(|v| v as f32).collect()
    }
}

/// One point of the cross-validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CvPoint {
    pub c: f64,
    /// Mean out-of-fold NLL at temperature 1.
    pub nll: f64,
}

/// How the served head was fitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadReport {
    /// `-1` for the final norm's output, else the block's index.
    pub layer: i64,
    pub dim: usize,
    pub c: f64,
    pub folds: usize,
    pub cross_validation: Vec<CvPoint>,
    /// Examples the head was fitted on (its cross-validation included).
    #[serde(default)]
    pub head_examples: usize,
    /// The examples its temperature was fitted on, ascending: indices of
    /// the task's examples (of the rows passed to [`fit`] until the task
    /// maps them).
    #[serde(default)]
    pub calibration_indices: Vec<usize>,
    /// Seconds of fitting (cross-validation, final fit, temperature).
    pub fit_seconds: f64,
}

/// One draw of `shots` examples per label.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Draw {
    pub seed: u64,
    pub fit_examples: usize,
    /// Of those, the examples the draw's temperature was fitted on.
    #[serde(default)]
    pub calibration_examples: usize,
    pub c: f64,
    pub temperature: f64,
    /// Holdout accuracy and ECE at the draw's fitted temperature.
    pub accuracy: f64,
    pub ece: f64,
}

/// Heads fitted on draws of few examples, evaluated on the one holdout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrawsReport {
    pub draws: usize,
    pub shots: usize,
    pub accuracy_mean: f64,
    /// Sample standard deviation (n - 1) over draws; 0 for one draw.
    pub accuracy_sd: f64,
    pub ece_mean: f64,
    pub ece_sd: f64,
    pub per_draw: Vec<Draw>,
}

/// A split with at least one fit example of every label: per label, a
/// seeded shuffle of its examples, `round(holdout * n_label)` of them held
/// out (at most `n_label - 1`). Each list sorted.
pub fn stratified_split(
    labels: &[usize],
    n_labels: usize,
    holdout: f64,
    seed: u64,
) -> (Vec<usize>, Vec<usize>) {
    let mut rng = SplitMix::new(seed);
    let (mut fit, mut held) = (Vec::new(), Vec::new());
    for l in 0..n_labels {
        let mut idx: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] == l).collect();
        rng.shuffle(&mut idx);
        let k = ((holdout * idx.len() as f64).round() as usize).min(idx.len().saturating_sub(1));
        held.extend_from_slice(&idx[..k]);
        fit.extend_from_slice(&idx[k..]);
    }
    fit.sort_unstable();
    held.sort_unstable();
    (fit, held)
}

/// Standardisation of `x`'s columns: (means, scales); a constant column
/// gets scale 1.
fn standardisation(x: &[&[f32]], dim: usize) -> (Vec<f64>, Vec<f64>) {
    let n = x.len().max(1) as f64;
    let mut mean = vec![0f64; dim];
    for row in x {
        for (m, &v) in mean.iter_mut().zip(row.iter()) {
            *m += f64::from(v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= n);
    let mut var = vec![0f64; dim];
    for row in x {
        for ((s, &v), m) in var.iter_mut().zip(row.iter()).zip(&mean) {
            *s += (f64::from(v) - m).powi(2);
        }
    }
    let scale = var
        .into_iter()
        .map(|s| {
            let sd = (s / n).sqrt();
            if sd > 1e-12 {
                sd
            } else {
                1.0
            }
        })
        .collect();
    (mean, scale)
}

fn matrix(x: &[&[f32]], mean: &[f64], scale: &[f64]) -> Array2<f64> {
    let dim = mean.len();
    Array2::from_shape_fn((x.len(), dim), |(i, f)| {
        (f64::from(x[i][f]) - mean[f]) / scale[f]
    })
}

/// Fits weights and bias (over all `n_labels`; a label absent from `y`
/// gets zero weights and a bias [`ABSENT_GAP`] below the lowest) at
/// inverse strength `c`.
fn fit_weights(
    x: &Array2<f64>,
    y: &[usize],
    n_labels: usize,
    c: f64,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let dim = x.ncols();
    let present: std::collections::BTreeSet<usize> = y.iter().copied().collect();
    let mut weights = vec![0f64; dim * n_labels];
    let mut bias = vec![0f64; n_labels];
    if present.len() < 2 {
        // One label only: it wins everywhere.
        for (j, b) in bias.iter_mut().enumerate() {
            *b = if present.contains(&j) {
                0.0
            } else {
                -f64::from(ABSENT_GAP)
            };
        }
        return Ok((weights, bias));
    }
    let dataset = Dataset::new(x.clone(), Array1::from(y.to_vec()));
    let model = MultiLogisticRegression::default()
        .alpha(1.0 / c)
        .max_iterations(MAX_ITERATIONS)
        .fit(&dataset)
        .map_err(|e| format!("the intent head did not fit: {e}"))?;
    let (params, intercept) = (model.params(), model.intercept());
    let classes = model.classes();
    let low = intercept.iter().copied().fold(f64::INFINITY, f64::min);
    bias.fill(low - f64::from(ABSENT_GAP));
    for (col, &j) in classes.iter().enumerate() {
        bias[j] = intercept[col];
        for f in 0..dim {
            weights[f * n_labels + j] = params[[f, col]];
        }
    }
    Ok((weights, bias))
}

fn logits_of(x: &Array2<f64>, weights: &[f64], bias: &[f64]) -> Vec<Vec<f32>> {
    let n_labels = bias.len();
    let w = ndarray::ArrayView2::from_shape((x.ncols(), n_labels), weights).expect("shape");
    let z = x.dot(&w);
    z.outer_iter()
        .map(|row| row.iter().zip(bias).map(|(v, b)| (v + b) as f32).collect())
        .collect()
}

/// Stratified folds of the examples `y`: per label, a seeded shuffle dealt
/// round-robin, each label starting where the previous one stopped.
fn folds(y: &[usize], n_labels: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix::new(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut fold = vec![0usize; y.len()];
    let mut next = 0usize;
    for l in 0..n_labels {
        let mut idx: Vec<usize> = (0..y.len()).filter(|&i| y[i] == l).collect();
        rng.shuffle(&mut idx);
        for i in idx {
            fold[i] = next % k;
            next += 1;
        }
    }
    fold
}

/// What [`fit`] returns: the head and how it was chosen.
pub struct Fitted {
    pub head: Head,
    pub report: HeadReport,
}

/// The calibration part of the rows labelled `y`: per label, a seeded
/// shuffle, `round(CALIBRATION_SHARE * n_label)` of them (at least 1, and
/// at most `n_label - 1`, so a label with one example keeps it for the
/// head). Sorted positions in `y`.
pub fn calibration_part(y: &[usize], n_labels: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix::new(seed ^ CALIBRATION_SEED);
    let mut out = Vec::new();
    for l in 0..n_labels {
        let mut idx: Vec<usize> = (0..y.len()).filter(|&i| y[i] == l).collect();
        if idx.len() < 2 {
            continue;
        }
        rng.shuffle(&mut idx);
        let k = ((CALIBRATION_SHARE * idx.len() as f64).round() as usize).clamp(1, idx.len() - 1);
        out.extend_from_slice(&idx[..k]);
    }
    out.sort_unstable();
    out
}

/// Fits a head on feature rows `x` with labels `y` (every label in
/// `0..n_labels` should have an example): the head on the head part, its
/// temperature on the calibration part ([`calibration_part`]).
pub fn fit(
    x: &[&[f32]],
    y: &[usize],
    n_labels: usize,
    layer: Option<usize>,
    seed: u64,
) -> Result<Fitted, String> {
    fit_over(x, y, n_labels, layer, seed, &C_GRID)
}

/// [`fit`] with the strengths `grid` to choose from.
fn fit_over(
    x: &[&[f32]],
    y: &[usize],
    n_labels: usize,
    layer: Option<usize>,
    seed: u64,
    grid: &[f64],
) -> Result<Fitted, String> {
    let started = std::time::Instant::now();
    let dim = x.first().map_or(0, |r| r.len());
    if dim == 0 || x.iter().any(|r| r.len() != dim) {
        return Err("the examples' hidden states are empty or of different widths".into());
    }
    let calibration = calibration_part(y, n_labels, seed);
    let head_part: Vec<usize> = (0..y.len())
        .filter(|i| calibration.binary_search(i).is_err())
        .collect();
    let hx: Vec<&[f32]> = head_part.iter().map(|&i| x[i]).collect();
    let hy: Vec<usize> = head_part.iter().map(|&i| y[i]).collect();
    let (mean, scale) = standardisation(&hx, dim);
    let xs = matrix(&hx, &mean, &scale);
    let k = FOLDS.min(hy.len()).max(2);
    let fold = folds(&hy, n_labels, k, seed);
    let mut cv = Vec::with_capacity(grid.len());
    let mut best: Option<(f64, f64)> = None;
    for &c in grid {
        let mut oof = vec![Vec::new(); hy.len()];
        for f in 0..k {
            let train: Vec<usize> = (0..hy.len()).filter(|&i| fold[i] != f).collect();
            let test: Vec<usize> = (0..hy.len()).filter(|&i| fold[i] == f).collect();
            if test.is_empty() || train.is_empty() {
                continue;
            }
            let xt = xs.select(ndarray::Axis(0), &train);
            let yt: Vec<usize> = train.iter().map(|&i| hy[i]).collect();
            let (w, b) = fit_weights(&xt, &yt, n_labels, c)?;
            let xh = xs.select(ndarray::Axis(0), &test);
            for (i, z) in test.iter().zip(logits_of(&xh, &w, &b)) {
                oof[*i] = z;
            }
        }
        let nll = calibrate::nll(&oof, &hy, 1.0);
        cv.push(CvPoint { c, nll });
        // Strictly better only: among equals the stronger regularisation.
        if best.is_none_or(|b| nll < b.1) {
            best = Some((c, nll));
        }
    }
    let (c, _) = best.ok_or("no regularisation strength to try")?;
    let (weights, bias) = fit_weights(&xs, &hy, n_labels, c)?;
    let mut head = Head {
        layer,
        dim,
        labels: n_labels,
        mean,
        scale,
        weights,
        bias,
        temperature: 1.0,
        c,
    };
    // The served head's own logits on rows it was not fitted on; no
    // calibration part (every label with one example): T = 1.
    if !calibration.is_empty() {
        let cx: Vec<&[f32]> = calibration.iter().map(|&i| x[i]).collect();
        let cy: Vec<usize> = calibration.iter().map(|&i| y[i]).collect();
        head.temperature = calibrate::fit_temperature(&logits(&head, &cx), &cy);
    }
    Ok(Fitted {
        head,
        report: HeadReport {
            layer: layer.map_or(-1, |l| l as i64),
            dim,
            c,
            folds: k,
            cross_validation: cv,
            head_examples: head_part.len(),
            calibration_indices: calibration,
            fit_seconds: started.elapsed().as_secs_f64(),
        },
    })
}

/// The head's raw logits for many rows.
pub fn logits(head: &Head, x: &[&[f32]]) -> Vec<Vec<f32>> {
    x.iter().map(|r| head.logits(r)).collect()
}

/// Holdout figures of `head` at temperature 1 (before) and at its fitted
/// temperature (after).
pub fn figures(head: &Head, x: &[&[f32]], y: &[usize]) -> (Figures, Figures) {
    let z = logits(head, x);
    (
        calibrate::figures(&z, y, 1.0),
        calibrate::figures(&z, y, head.temperature),
    )
}

/// The seed of draw `d` of a registration seeded `seed`.
pub fn draw_seed(seed: u64, d: usize) -> u64 {
    SplitMix::new(seed.wrapping_add(d as u64 + 1)).next_u64()
}

/// Fits a head per draw on `shots` examples per label sampled (seeded)
/// from the fit split `fit_idx` (all of a label's when it has fewer), and
/// evaluates each on the holdout `held_idx`.
#[allow(clippy::too_many_arguments)]
pub fn draws(
    x: &[&[f32]],
    y: &[usize],
    n_labels: usize,
    fit_idx: &[usize],
    held_idx: &[usize],
    draws: usize,
    shots: usize,
    layer: Option<usize>,
    seed: u64,
) -> Result<DrawsReport, String> {
    let hx: Vec<&[f32]> = held_idx.iter().map(|&i| x[i]).collect();
    let hy: Vec<usize> = held_idx.iter().map(|&i| y[i]).collect();
    let mut per_draw = Vec::with_capacity(draws);
    for d in 0..draws {
        let s = draw_seed(seed, d);
        let mut rng = SplitMix::new(s);
        let mut picked = Vec::new();
        for l in 0..n_labels {
            let mut idx: Vec<usize> = fit_idx.iter().copied().filter(|&i| y[i] == l).collect();
            rng.shuffle(&mut idx);
            idx.truncate(shots);
            picked.extend(idx);
        }
        picked.sort_unstable();
        let fx: Vec<&[f32]> = picked.iter().map(|&i| x[i]).collect();
        let fy: Vec<usize> = picked.iter().map(|&i| y[i]).collect();
        let fitted = fit(&fx, &fy, n_labels, layer, s)?;
        let (_, after) = figures(&fitted.head, &hx, &hy);
        per_draw.push(Draw {
            seed: s,
            fit_examples: picked.len(),
            calibration_examples: fitted.report.calibration_indices.len(),
            c: fitted.head.c,
            temperature: fitted.head.temperature,
            accuracy: after.accuracy,
            ece: after.ece,
        });
    }
    let acc: Vec<f64> = per_draw.iter().map(|d| d.accuracy).collect();
    let ece: Vec<f64> = per_draw.iter().map(|d| d.ece).collect();
    let (accuracy_mean, accuracy_sd) = mean_sd(&acc);
    let (ece_mean, ece_sd) = mean_sd(&ece);
    Ok(DrawsReport {
        draws,
        shots,
        accuracy_mean,
        accuracy_sd,
        ece_mean,
        ece_sd,
        per_draw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gaussian-ish clusters: label `l`'s rows centred on a one-hot-ish mean.
    fn clusters(
        n_per: usize,
        n_labels: usize,
        dim: usize,
        seed: u64,
    ) -> (Vec<Vec<f32>>, Vec<usize>) {
        let mut rng = SplitMix::new(seed);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for l in 0..n_labels {
            for _ in 0..n_per {
                let row: Vec<f32> = (0..dim)
                    .map(|f| {
                        let centre = if f % n_labels == l { 2.0 } else { 0.0 };
                        centre + (rng.next_f64() as f32 - 0.5) * 3.0
                    })
                    .collect();
                x.push(row);
                y.push(l);
            }
        }
        (x, y)
    }

    #[test]
    fn a_head_learns_separable_clusters_deterministically() {
        let (x, y) = clusters(30, 4, 16, 1);
        let rows: Vec<&[f32]> = x.iter().map(|r| r.as_slice()).collect();
        let (fit_idx, held_idx) = stratified_split(&y, 4, 0.25, 0);
        assert!((0..4).all(|l| fit_idx.iter().any(|&i| y[i] == l)));
        let fx: Vec<&[f32]> = fit_idx.iter().map(|&i| rows[i]).collect();
        let fy: Vec<usize> = fit_idx.iter().map(|&i| y[i]).collect();
        let a = fit(&fx, &fy, 4, None, 0).unwrap();
        let b = fit(&fx, &fy, 4, None, 0).unwrap();
        assert_eq!(a.head, b.head, "deterministic");
        assert_eq!(a.report.cross_validation.len(), C_GRID.len());
        let hx: Vec<&[f32]> = held_idx.iter().map(|&i| rows[i]).collect();
        let hy: Vec<usize> = held_idx.iter().map(|&i| y[i]).collect();
        let (_, after) = figures(&a.head, &hx, &hy);
        assert!(after.accuracy > 0.8, "{}", after.accuracy);
        let d = draws(&rows, &y, 4, &fit_idx, &held_idx, 3, 5, None, 0).unwrap();
        assert_eq!(d.per_draw.len(), 3);
        assert!(d.per_draw.iter().all(|p| p.fit_examples == 20));
        // One of each label's 5 shots calibrates the draw's temperature.
        assert!(d.per_draw.iter().all(|p| p.calibration_examples == 4));
        assert!(d.accuracy_mean > 0.5, "{}", d.accuracy_mean);
        assert_ne!(d.per_draw[0].seed, d.per_draw[1].seed);
    }

    #[test]
    fn the_calibration_part_is_stratified_seeded_and_leaves_the_head_every_label() {
        // Labels with 10, 5, 2 and 1 examples.
        let y: Vec<usize> = [0; 10]
            .into_iter()
            .chain([1; 5])
            .chain([2; 2])
            .chain([3])
            .collect();
        let cal = calibration_part(&y, 4, 3);
        let count = |l: usize| cal.iter().filter(|&&i| y[i] == l).count();
        assert_eq!((count(0), count(1), count(2), count(3)), (2, 1, 1, 0));
        assert!(cal.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(cal, calibration_part(&y, 4, 3));
        assert!((0..6).any(|s| calibration_part(&y, 4, s) != cal));
    }

    #[test]
    fn the_temperature_of_an_overconfident_head_is_above_one_and_calibrates() {
        // Noisy labels (a third of them drawn at random) on clusters in 64
        // dimensions, 16 examples per label: weakly regularised, the head
        // fits the noise and is far too sure of new rows.
        let (n_labels, dim) = (4, 64);
        let (x, mut y) = clusters(40, n_labels, dim, 5);
        let mut rng = SplitMix::new(9);
        for l in y.iter_mut() {
            if rng.below(3) == 0 {
                *l = rng.below(n_labels as u64) as usize;
            }
        }
        let rows: Vec<&[f32]> = x.iter().map(|r| r.as_slice()).collect();
        let (fit_idx, held_idx) = stratified_split(&y, n_labels, 0.5, 1);
        let fx: Vec<&[f32]> = fit_idx.iter().map(|&i| rows[i]).collect();
        let fy: Vec<usize> = fit_idx.iter().map(|&i| y[i]).collect();
        let a = fit_over(&fx, &fy, n_labels, None, 2, &[100.0]).unwrap();
        let report = &a.report;
        assert_eq!(
            report.head_examples + report.calibration_indices.len(),
            fit_idx.len()
        );
        assert!(report.calibration_indices.len() >= n_labels);
        let t = a.head.temperature;
        assert!(t > 1.0, "an overconfident head needs T above 1; got {t}");
        let hx: Vec<&[f32]> = held_idx.iter().map(|&i| rows[i]).collect();
        let hy: Vec<usize> = held_idx.iter().map(|&i| y[i]).collect();
        let (before, after) = figures(&a.head, &hx, &hy);
        assert!(after.ece <= before.ece, "{} vs {}", after.ece, before.ece);
        assert!(after.nll < before.nll, "{} vs {}", after.nll, before.nll);
        // Deterministic.
        let b = fit_over(&fx, &fy, n_labels, None, 2, &[100.0]).unwrap();
        assert_eq!(a.head, b.head);
    }

    #[test]
    fn labels_absent_from_training_never_win() {
        let x =
            Array2::from_shape_vec((4, 2), vec![1.0, 0.0, 1.1, 0.1, 0.0, 1.0, 0.1, 1.2]).unwrap();
        let (w, b) = fit_weights(&x, &[0, 0, 2, 2], 3, 1.0).unwrap();
        let z = logits_of(&x, &w, &b);
        assert!(z.iter().all(|r| r[1] < r[0] && r[1] < r[2]));
    }
}
