//! Split-conformal prediction sets for multiple-choice answers: from the
//! option probabilities of held-out (calibration) examples and their true
//! options, a score threshold such that the set of options scoring at or
//! below it contains the true option with probability at least `1 − alpha`
//! (over the draw of the calibration examples and the new one, for
//! exchangeable examples). This is split (inductive) conformal prediction
//! (Vovk, Gammerman and Shafer; Papadopoulos et al. 2002; Lei et al. 2018),
//! with two scores:
//!
//! - [`Score::Lac`], "least ambiguous set-valued classifier" (Sadinle, Lei
//!   and Wasserman 2019): `1 − p(option)`. The smallest sets on average; a
//!   set may be empty when no option is probable enough.
//! - [`Score::Aps`], "adaptive prediction sets" (Romano, Sesia and Candès
//!   2020): the total probability of the options at least as probable as
//!   the one scored, that option included. Its sets grow where the model is
//!   unsure. The published score subtracts a uniform random share of the
//!   option's own mass; this module does not randomise: every option tied
//!   in probability with the one scored counts in full, so a score is a
//!   function of the probabilities alone and the same inputs always give
//!   the same set. The guarantee holds as stated (the sets are, if
//!   anything, larger than the randomised ones).
//!
//! The threshold is the `ceil((n + 1)(1 − alpha))`-th smallest of the `n`
//! calibration scores; with fewer than `1/alpha − 1` examples that rank
//! exceeds `n` and no finite threshold gives the guarantee, which
//! [`quantile`] reports as [`TooFew`] with the minimum.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A nonconformity score of an option given the option probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Score {
    /// `1 − p(option)`.
    Lac,
    /// The mass of the options at least as probable as the option.
    Aps,
}

impl Score {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Score::Lac => "lac",
            Score::Aps => "aps",
        }
    }

    /// The score of `option` under `probabilities`.
    pub fn of(self, probabilities: &[f64], option: usize) -> f64 {
        let p = probabilities[option];
        match self {
            Score::Lac => 1.0 - p,
            Score::Aps => probabilities.iter().filter(|&&q| q >= p).sum(),
        }
    }
}

/// Too few calibration examples for the level asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooFew {
    /// Calibration examples given.
    pub n: usize,
    /// The fewest that give a finite threshold at this level.
    pub minimum: usize,
}

impl fmt::Display for TooFew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} calibration examples, and at least {} are needed at this level",
            self.n, self.minimum
        )
    }
}

impl std::error::Error for TooFew {}

/// Slack on `(n + 1)(1 − alpha)` before rounding up, so that a product
/// which is an integer in exact arithmetic (20 × 0.95) is not pushed to the
/// next one by the rounding of `1 − alpha`.
const RANK_SLACK: f64 = 1e-9;

/// The rank `ceil((n + 1)(1 − alpha))` (1-based) of the calibration score
/// that is the threshold.
pub fn rank(n: usize, alpha: f64) -> usize {
    (((n + 1) as f64 * (1.0 - alpha)) - RANK_SLACK)
        .ceil()
        .max(1.0) as usize
}

/// The fewest calibration examples with [`rank`] at most `n`:
/// `ceil(1/alpha − 1)`, found by counting so it agrees with [`rank`].
pub fn minimum_calibration(alpha: f64) -> usize {
    let mut n = ((1.0 / alpha - 1.0).floor().max(1.0) as usize).saturating_sub(1);
    while rank(n, alpha) > n {
        n += 1;
    }
    n
}

/// The conformal threshold of `scores` (one per calibration example) at
/// level `alpha`: the [`rank`]-th smallest score.
pub fn quantile(scores: &[f64], alpha: f64) -> Result<f64, TooFew> {
    let n = scores.len();
    let k = rank(n, alpha);
    if k > n {
        return Err(TooFew {
            n,
            minimum: minimum_calibration(alpha),
        });
    }
    let mut sorted = scores.to_vec();
    sorted.sort_by(f64::total_cmp);
    Ok(sorted[k - 1])
}

/// The threshold from calibration examples: each example's option
/// probabilities and its true option.
pub fn calibrate(
    score: Score,
    probabilities: &[Vec<f64>],
    truth: &[usize],
    alpha: f64,
) -> Result<f64, TooFew> {
    assert_eq!(
        probabilities.len(),
        truth.len(),
        "one true option per example"
    );
    let scores: Vec<f64> = probabilities
        .iter()
        .zip(truth)
        .map(|(p, &y)| score.of(p, y))
        .collect();
    quantile(&scores, alpha)
}

/// The prediction set of a new example: the options (indices, in their
/// given order) whose score is at most `threshold`.
pub fn prediction_set(score: Score, probabilities: &[f64], threshold: f64) -> Vec<usize> {
    (0..probabilities.len())
        .filter(|&j| score.of(probabilities, j) <= threshold)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix;

    fn near(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-15, "{got} vs {want}");
    }

    #[test]
    fn scores_by_hand() {
        let p = [0.5, 0.2, 0.2, 0.1];
        assert_eq!(Score::Lac.of(&p, 0), 0.5);
        assert_eq!(Score::Lac.of(&p, 3), 0.9);
        assert_eq!(Score::Aps.of(&p, 0), 0.5);
        // The two options at 0.2 are tied: each counts the other in full.
        near(Score::Aps.of(&p, 1), 0.9);
        assert_eq!(Score::Aps.of(&p, 1), Score::Aps.of(&p, 2));
        near(Score::Aps.of(&p, 3), 1.0);
    }

    #[test]
    fn ranks_and_minimum_by_hand() {
        // ceil(20 × 0.95) = 19, not 20.
        assert_eq!(rank(19, 0.05), 19);
        assert_eq!(rank(9, 0.1), 9);
        assert_eq!(rank(10, 0.1), 10);
        assert_eq!(rank(100, 0.1), 91);
        assert_eq!(minimum_calibration(0.1), 9);
        assert_eq!(minimum_calibration(0.05), 19);
        assert_eq!(minimum_calibration(0.2), 4);
        assert_eq!(minimum_calibration(0.3), 3); // 1/0.3 − 1 = 2.33…
        assert_eq!(quantile(&[0.1; 8], 0.1), Err(TooFew { n: 8, minimum: 9 }));
        assert!(quantile(&[0.1; 9], 0.1).is_ok());
        assert_eq!(quantile(&[], 0.5), Err(TooFew { n: 0, minimum: 1 }));
    }

    #[test]
    fn quantile_and_sets_by_hand() {
        // Ten scores 0.0, 0.1, …, 0.9 at alpha = 0.2: rank ceil(11 × 0.8) = 9.
        let scores: Vec<f64> = (0..10).rev().map(|i| f64::from(i) / 10.0).collect();
        assert_eq!(quantile(&scores, 0.2), Ok(0.8));
        let p = [0.1, 0.6, 0.25, 0.05];
        // LAC at 0.8: options with p ≥ 0.2, in their order.
        assert_eq!(prediction_set(Score::Lac, &p, 0.8), vec![1, 2]);
        assert_eq!(prediction_set(Score::Lac, &p, 0.3), Vec::<usize>::new());
        // APS scores: 0.95, 0.6, 0.85, 1.0.
        assert_eq!(prediction_set(Score::Aps, &p, 0.9), vec![1, 2]);
        assert_eq!(prediction_set(Score::Aps, &p, 0.96), vec![0, 1, 2]);
        assert_eq!(prediction_set(Score::Aps, &p, 1.0), vec![0, 1, 2, 3]);
    }

    /// A synthetic example: four options, softmax of random logits, and
    /// the true option drawn from the probabilities slightly sharpened (so
    /// the model is a little underconfident, not exactly calibrated).
    fn example(rng: &mut SplitMix) -> (Vec<f64>, usize) {
        let logits: Vec<f64> = (0..4).map(|_| 3.0 * rng.next_f64()).collect();
        let softmax = |t: f64| {
            let e: Vec<f64> = logits.iter().map(|l| (l / t).exp()).collect();
            let total: f64 = e.iter().sum();
            e.into_iter().map(|v| v / total).collect::<Vec<f64>>()
        };
        let (served, truth) = (softmax(1.0), softmax(0.8));
        let u = rng.next_f64();
        let mut acc = 0.0;
        let y = truth
            .iter()
            .position(|&q| {
                acc += q;
                u < acc
            })
            .unwrap_or(3);
        (served, y)
    }

    /// Mean coverage over many calibration/test splits is at least
    /// `1 − alpha` and at most `1 − alpha + 1/(n + 1)`, within three
    /// standard errors of the mean.
    #[test]
    fn coverage_holds_over_many_splits() {
        let (splits, n_cal, n_test) = (300usize, 99usize, 200usize);
        for score in [Score::Lac, Score::Aps] {
            for alpha in [0.1, 0.2] {
                let mut rng = SplitMix::new(0x5EED + (alpha * 100.0) as u64);
                let mut total = 0.0;
                for _ in 0..splits {
                    let (cal_p, cal_y): (Vec<_>, Vec<_>) =
                        (0..n_cal).map(|_| example(&mut rng)).unzip();
                    let q = calibrate(score, &cal_p, &cal_y, alpha).unwrap();
                    let covered = (0..n_test)
                        .filter(|_| {
                            let (p, y) = example(&mut rng);
                            prediction_set(score, &p, q).contains(&y)
                        })
                        .count();
                    total += covered as f64 / n_test as f64;
                }
                let mean = total / splits as f64;
                // Per split: the calibration draw's spread (a Beta of
                // variance about alpha(1 − alpha)/(n + 2)) plus the test
                // draw's binomial spread.
                let var = alpha * (1.0 - alpha) * (1.0 / (n_cal + 2) as f64 + 1.0 / n_test as f64);
                let se = (var / splits as f64).sqrt();
                let (lo, hi) = (
                    1.0 - alpha - 3.0 * se,
                    1.0 - alpha + 1.0 / (n_cal + 1) as f64 + 3.0 * se,
                );
                assert!(
                    lo <= mean && mean <= hi,
                    "{score:?} at alpha {alpha}: mean coverage {mean} outside [{lo}, {hi}]"
                );
            }
        }
    }

    /// Sets of crepes, an implementation written apart from this one
    /// (`scripts/reference/conformal_cases.py`: 100 seeded cases of 10 to
    /// 400 calibration examples, 2 to 8 options, LAC and APS, probabilities
    /// rounded so that scores tie, 30 test examples each): every set is
    /// the same, LAC's ties with the threshold included (`1 − p` is the
    /// same float on both sides). An APS score within 1e-9 of the
    /// threshold is not compared: its sum of rounded probabilities may
    /// round a tie apart differently on the two sides (0.9 as
    /// 0.8999999999999999 and 0.9000000000000001 in one case); the test
    /// counts them.
    #[test]
    fn sets_are_crepes_sets() {
        #[derive(Deserialize)]
        struct Case {
            score: Score,
            alpha: f64,
            calibration: Vec<Vec<f64>>,
            truth: Vec<usize>,
            test: Vec<Vec<f64>>,
            sets: Vec<Vec<usize>>,
        }
        #[derive(Deserialize)]
        struct Cases {
            cases: Vec<Case>,
        }
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/conformal/cases.json"
        );
        let file: Cases = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (mut compared, mut at_the_threshold) = (0, 0);
        assert_eq!(file.cases.len(), 100);
        for (i, c) in file.cases.iter().enumerate() {
            let (score, alpha) = (c.score, c.alpha);
            let threshold = calibrate(score, &c.calibration, &c.truth, alpha).unwrap();
            for (p, want) in c.test.iter().zip(&c.sets) {
                let got = prediction_set(score, p, threshold);
                for j in 0..p.len() {
                    if score == Score::Aps && (score.of(p, j) - threshold).abs() < 1e-9 {
                        at_the_threshold += 1;
                        continue;
                    }
                    compared += 1;
                    let theirs = want.contains(&j);
                    assert_eq!(got.contains(&j), theirs, "case {i}, option {j} of {p:?}");
                }
            }
        }
        assert!(compared > 10_000, "{compared}");
        assert!(
            at_the_threshold * 20 < compared,
            "{at_the_threshold} of {compared}"
        );
    }
}
