//! Calibration figures of a set of answers, as pure functions of their
//! logits (a choice task's letters, an intent head's labels) and the
//! labels: the fit/holdout split, the temperature fit, accuracy, negative
//! log-likelihood, expected calibration error, the reliability table and
//! the abstention threshold.
//! `docs/design/tasks.md` states each definition.

use serde::{Deserialize, Serialize};

use super::{log_softmax, top_option};
use crate::rng::SplitMix;

/// Bins of the expected calibration error and the reliability table.
pub const ECE_BINS: usize = 15;

/// The temperature search range: `T` in [`T_MIN`, `T_MAX`].
pub const T_MIN: f64 = 0.01;
pub const T_MAX: f64 = 100.0;

/// Points of the coarse grid over `ln T` before the golden-section refinement.
pub const GRID: usize = 201;

/// Example indices split into (fit, holdout): a seeded shuffle, the first
/// `round(holdout * n)` (at least 1) indices held out, each list sorted.
pub fn split(n: usize, holdout: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut idx: Vec<usize> = (0..n).collect();
    SplitMix::new(seed).shuffle(&mut idx);
    let k = ((holdout * n as f64).round() as usize).clamp(1, n.saturating_sub(1).max(1));
    let mut held = idx[..k].to_vec();
    let mut fit = idx[k..].to_vec();
    held.sort_unstable();
    fit.sort_unstable();
    (fit, held)
}

/// Mean negative log-likelihood of the labels at temperature `t`.
pub fn nll(logits: &[Vec<f32>], labels: &[usize], t: f64) -> f64 {
    if logits.is_empty() {
        return 0.0;
    }
    let total: f64 = logits
        .iter()
        .zip(labels)
        .map(|(l, &y)| -log_softmax(l, t)[y])
        .sum();
    total / logits.len() as f64
}

/// The temperature of least NLL on (`logits`, `labels`): a grid of
/// [`GRID`] points evenly spaced in `ln T` over [`T_MIN`, `T_MAX`], then a
/// golden-section search on the bracket around the best grid point. The NLL
/// is smooth in `ln T`; the grid makes the search robust to flat regions and
/// to a minimum at the range's ends. Deterministic: no randomness, a fixed
/// number of steps.
pub fn fit_temperature(logits: &[Vec<f32>], labels: &[usize]) -> f64 {
    let (lo, hi) = (T_MIN.ln(), T_MAX.ln());
    let f = |u: f64| nll(logits, labels, u.exp());
    let step = (hi - lo) / (GRID - 1) as f64;
    let mut best = (0usize, f64::INFINITY);
    for i in 0..GRID {
        let v = f(lo + step * i as f64);
        if v < best.1 {
            best = (i, v);
        }
    }
    let mut a = lo + step * best.0.saturating_sub(1) as f64;
    let mut b = (lo + step * (best.0 + 1) as f64).min(hi);
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - phi * (b - a);
    let mut d = a + phi * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..60 {
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - phi * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + phi * (b - a);
            fd = f(d);
        }
    }
    let u = (a + b) / 2.0;
    // The grid point wins if the refinement did not improve on it.
    let t = if f(u) <= best.1 {
        u.exp()
    } else {
        (lo + step * best.0 as f64).exp()
    };
    // exp(ln T_MAX) may round above T_MAX.
    t.clamp(T_MIN, T_MAX)
}

/// One bin of the reliability table: confidences in (`lo`, `hi`] (the first
/// bin also takes 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    pub lo: f64,
    pub hi: f64,
    pub count: usize,
    /// Mean top probability of the bin's answers (null when empty).
    pub confidence: Option<f64>,
    /// Share of the bin's answers that were right (null when empty).
    pub accuracy: Option<f64>,
}

/// Accuracy, NLL and ECE of a set of answers at one temperature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    pub temperature: f64,
    pub examples: usize,
    pub accuracy: f64,
    pub nll: f64,
    pub ece: f64,
    pub reliability: Vec<Bin>,
}

/// The top option (earliest among exact equals, as served) and its
/// probability, from log-probabilities.
pub fn top(logp: &[f64]) -> (usize, f64) {
    let p: Vec<f32> = logp.iter().map(|v| v.exp() as f32).collect();
    let (i, _) = top_option(&p);
    (i, logp[i].exp())
}

/// The bin of a confidence `c` in [0, 1].
fn bin_of(c: f64) -> usize {
    ((c * ECE_BINS as f64).ceil() as usize).clamp(1, ECE_BINS) - 1
}

/// Figures of `logits` against `labels` at temperature `t`. ECE is
/// top-label: `sum_b (n_b / n) |acc_b - conf_b|` over [`ECE_BINS`]
/// equal-width bins of the top probability.
pub fn figures(logits: &[Vec<f32>], labels: &[usize], t: f64) -> Figures {
    let n = logits.len();
    let mut sums = vec![(0usize, 0f64, 0usize); ECE_BINS];
    let mut right = 0usize;
    for (l, &y) in logits.iter().zip(labels) {
        let (i, c) = top(&log_softmax(l, t));
        let b = &mut sums[bin_of(c)];
        b.0 += 1;
        b.1 += c;
        if i == y {
            b.2 += 1;
            right += 1;
        }
    }
    let mut ece = 0.0;
    let reliability = sums
        .iter()
        .enumerate()
        .map(|(k, &(count, conf, ok))| {
            let (confidence, accuracy) = if count > 0 {
                let (c, a) = (conf / count as f64, ok as f64 / count as f64);
                ece += count as f64 / n as f64 * (a - c).abs();
                (Some(c), Some(a))
            } else {
                (None, None)
            };
            Bin {
                lo: k as f64 / ECE_BINS as f64,
                hi: (k + 1) as f64 / ECE_BINS as f64,
                count,
                confidence,
                accuracy,
            }
        })
        .collect();
    Figures {
        temperature: t,
        examples: n,
        accuracy: if n > 0 { right as f64 / n as f64 } else { 0.0 },
        nll: nll(logits, labels, t),
        ece,
        reliability,
    }
}

/// What an abstention threshold costs on the holdout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    /// The served `abstain_below`; null when a target accuracy could not be
    /// reached on the holdout at any threshold.
    pub abstain_below: Option<f64>,
    /// The target asked for, if any.
    pub target_accuracy: Option<f64>,
    /// Accuracy on the answered holdout questions (null when none is answered).
    pub accuracy: Option<f64>,
    /// Share of holdout questions answered.
    pub coverage: f64,
}

/// Accuracy and coverage on (`confidence`, `correct`) pairs when answers
/// below `threshold` abstain.
fn at(pairs: &[(f64, bool)], threshold: f64) -> (Option<f64>, f64) {
    let answered: Vec<bool> = pairs
        .iter()
        .filter(|(c, _)| *c >= threshold)
        .map(|&(_, ok)| ok)
        .collect();
    let coverage = answered.len() as f64 / pairs.len().max(1) as f64;
    let accuracy = (!answered.is_empty())
        .then(|| answered.iter().filter(|&&ok| ok).count() as f64 / answered.len() as f64);
    (accuracy, coverage)
}

/// (top probability, correct) of each answer at temperature `t`, with the
/// probability rounded to f32 as served.
pub fn confidences(logits: &[Vec<f32>], labels: &[usize], t: f64) -> Vec<(f64, bool)> {
    logits
        .iter()
        .zip(labels)
        .map(|(l, &y)| {
            let (i, c) = top(&log_softmax(l, t));
            (f64::from(c as f32), i == y)
        })
        .collect()
}

/// The smallest threshold, among the holdout's own top probabilities, whose
/// answered accuracy reaches `target`; its coverage.
pub fn threshold_for_target(pairs: &[(f64, bool)], target: f64) -> Threshold {
    let mut candidates: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    for t in candidates {
        let (accuracy, coverage) = at(pairs, t);
        if accuracy.is_some_and(|a| a >= target) {
            return Threshold {
                abstain_below: Some(t),
                target_accuracy: Some(target),
                accuracy,
                coverage,
            };
        }
    }
    Threshold {
        abstain_below: None,
        target_accuracy: Some(target),
        accuracy: None,
        coverage: 0.0,
    }
}

/// What a fixed threshold gives on the holdout.
pub fn threshold_fixed(pairs: &[(f64, bool)], abstain_below: f64) -> Threshold {
    let (accuracy, coverage) = at(pairs, abstain_below);
    Threshold {
        abstain_below: Some(abstain_below),
        target_accuracy: None,
        accuracy,
        coverage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits of a model that is right 70% of the time but far too sure.
    fn overconfident(n: usize) -> (Vec<Vec<f32>>, Vec<usize>) {
        let mut rng = SplitMix::new(7);
        let mut logits = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..n {
            let y = rng.below(4) as usize;
            let right = rng.below(10) < 7;
            let pick = if right { y } else { (y + 1) % 4 };
            let mut l = vec![0f32; 4];
            l[pick] = 8.0;
            logits.push(l);
            labels.push(y);
        }
        (logits, labels)
    }

    #[test]
    fn the_fitted_temperature_lowers_nll_and_ece() {
        let (logits, labels) = overconfident(400);
        let t = fit_temperature(&logits, &labels);
        assert!(t > 1.0, "an overconfident model needs T above 1; got {t}");
        let before = figures(&logits, &labels, 1.0);
        let after = figures(&logits, &labels, t);
        assert!(after.nll < before.nll);
        assert!(
            after.ece < before.ece / 2.0,
            "{} vs {}",
            after.ece,
            before.ece
        );
        // The optimum: p(top) = accuracy, so exp(8/T) / (exp(8/T) + 3) = acc.
        let acc = before.accuracy;
        let want = 8.0 / (3.0 * acc / (1.0 - acc)).ln();
        assert!((t - want).abs() / want < 1e-3, "{t} vs {want}");
        // Deterministic.
        assert_eq!(t.to_bits(), fit_temperature(&logits, &labels).to_bits());
        // Labels the logits say nothing about: the uniform answer, at the
        // top of the range and not past it.
        let noise: Vec<usize> = (0..logits.len()).map(|i| i % 4).collect();
        let flat = vec![vec![1.0f32, 0.0, 0.0, 0.0]; logits.len()];
        let top = fit_temperature(&flat, &noise);
        assert!(top <= T_MAX && top > 0.999 * T_MAX, "{top}");
    }

    #[test]
    fn ece_bins_and_reliability() {
        // Two answers at 0.9 (one right), two near 0.5 (both right).
        let l = |p: f64| vec![(p / (1.0 - p)).ln() as f32, 0.0];
        let logits = vec![l(0.9), l(0.9), l(0.5 + 1e-6), l(0.5 + 1e-6)];
        let labels = vec![0, 1, 0, 0];
        let f = figures(&logits, &labels, 1.0);
        assert_eq!(f.reliability.len(), ECE_BINS);
        assert_eq!(f.reliability.iter().map(|b| b.count).sum::<usize>(), 4);
        // 0.9 falls in (13/15, 14/15]; 0.5 in (7/15, 8/15].
        assert_eq!(f.reliability[13].count, 2);
        assert_eq!(f.reliability[7].count, 2);
        let want = 0.5 * (0.5f64 - 0.9).abs() + 0.5 * (1.0f64 - 0.5).abs();
        assert!((f.ece - want).abs() < 1e-5, "{} vs {want}", f.ece);
        assert_eq!(f.accuracy, 0.75);
    }

    #[test]
    fn thresholds() {
        let pairs = vec![
            (0.3, false),
            (0.5, true),
            (0.6, false),
            (0.9, true),
            (0.95, true),
        ];
        let t = threshold_for_target(&pairs, 0.99);
        assert_eq!(t.abstain_below, Some(0.9));
        assert_eq!(t.coverage, 0.4);
        let t = threshold_for_target(&pairs, 0.6);
        assert_eq!(t.abstain_below, Some(0.3));
        assert_eq!(t.coverage, 1.0);
        let t = threshold_for_target(&[(0.8, false)], 0.5);
        assert_eq!(t.abstain_below, None);
        let f = threshold_fixed(&pairs, 0.55);
        assert_eq!(f.coverage, 0.6);
        assert!((f.accuracy.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn the_split_is_seeded_and_disjoint() {
        let (fit, held) = split(100, 0.2, 0);
        assert_eq!((fit.len(), held.len()), (80, 20));
        assert!(fit.iter().all(|i| !held.contains(i)));
        assert_eq!(split(100, 0.2, 0), (fit.clone(), held.clone()));
        assert_ne!(split(100, 0.2, 1).1, held);
    }
}
