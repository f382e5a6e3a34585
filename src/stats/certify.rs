//! Certified answers: a confidence threshold with a bound on the rate of
//! wrong answers above it, from held-out labelled examples.
//!
//! The promise: among the answers at or above the threshold, at most
//! `alpha` are wrong, with probability at least `1 − delta` over the draw
//! of the held-out examples (for traffic like them). The procedure is
//! Learn-then-Test (Angelopoulos, Bates, Candès, Jordan and Lei, 2021,
//! "Learn then Test: Calibrating Predictive Algorithms to Achieve Risk
//! Control"), with a one-sided Clopper–Pearson upper bound on the error
//! rate of the answers served at each candidate threshold, and two arms,
//! each given half of `delta`:
//!
//! - *fixed sequence*: candidates from the strictest to the most lenient,
//!   [`GRID`] served counts evenly spaced from a starting count `k0` (see
//!   [`fixed_sequence_start`]) to `n`; each is tested at `delta / 2` and the
//!   sequence stops at its first failure, keeping the last threshold that
//!   held;
//! - *Bonferroni*: the served shares of [`LEVELS`] (5% to 100% of the
//!   examples), each tested at `delta / 2 / (number of distinct counts)`,
//!   keeping the most lenient that holds.
//!
//! The certified threshold is the stricter (higher) of the two; `+inf`
//! when neither arm certifies anything. A threshold never separates equal
//! confidences: every example tied with the k-th most confident is served
//! with it.
//!
//! This is the procedure of the reference decisio's
//! `decisio/readout/certify.py`, step for step, so that a task certified
//! there and here gets the same threshold; the tests compare against
//! figures that file computed (`scripts/reference/certify_cases.py`).

use super::beta::beta_quantile;

/// The Bonferroni arm's served shares.
pub const LEVELS: [f64; 12] = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Candidate served counts of the fixed sequence.
pub const GRID: usize = 50;

/// Most held-out examples [`minimum_examples`] looks at.
pub const MINIMUM_SEARCH_LIMIT: usize = 100_000;

/// The one-sided Clopper–Pearson upper bound, at level `1 − delta`, on an
/// error rate seen as `errors` in `n`: the `1 − delta` quantile of
/// Beta(errors + 1, n − errors), and 1 when `n` is 0 or every answer is
/// wrong.
pub fn upper_bound(errors: usize, n: usize, delta: f64) -> f64 {
    if n == 0 || errors >= n {
        return 1.0;
    }
    beta_quantile(1.0 - delta, (errors + 1) as f64, (n - errors) as f64)
}

/// The smallest served count `k ≤ n` at which a run with `alpha / 2` of its
/// answers wrong (rounded down) could still pass at `delta`; `n` when none.
pub fn tolerant_start(alpha: f64, delta: f64, n: usize) -> usize {
    (1..=n)
        .find(|&k| upper_bound((alpha * k as f64 / 2.0) as usize, k, delta) <= alpha)
        .unwrap_or(n)
}

/// The fixed sequence's starting count `k0` for `n` examples, tested at
/// `delta` (the arm's share): the largest of `ceil(ln delta / ln(1 −
/// alpha))` (fewer answers, all right, could not pass), 5% of `n` (rounded
/// up), `min(50, n)` and [`tolerant_start`], capped at `n`.
pub fn fixed_sequence_start(alpha: f64, delta: f64, n: usize) -> usize {
    let all_right = (delta.ln() / (1.0 - alpha).ln()).ceil() as usize;
    let share = (0.05 * n as f64).ceil() as usize;
    all_right
        .max(share)
        .max(n.min(50))
        .max(tolerant_start(alpha, delta, n))
        .min(n)
}

/// The examples, most confident first, with the running count of wrong
/// answers: `errors[k − 1]` is the number wrong among the first `k`.
struct Ranked {
    conf: Vec<f64>,
    errors: Vec<usize>,
}

impl Ranked {
    fn new(conf: &[f64], correct: &[bool]) -> Self {
        assert_eq!(conf.len(), correct.len(), "one correctness per confidence");
        let mut order: Vec<usize> = (0..conf.len()).collect();
        order.sort_by(|&i, &j| conf[j].total_cmp(&conf[i]));
        let mut wrong = 0;
        let errors = order
            .iter()
            .map(|&i| {
                wrong += usize::from(!correct[i]);
                wrong
            })
            .collect();
        Ranked {
            conf: order.iter().map(|&i| conf[i]).collect(),
            errors,
        }
    }

    fn len(&self) -> usize {
        self.conf.len()
    }

    /// The count served with the k-th most confident example: every
    /// example tied with it is served too.
    fn served(&self, k: usize) -> usize {
        let v = self.conf[k - 1];
        k + self.conf[k..].partition_point(|&c| c >= v)
    }
}

/// The served counts the fixed sequence tests: [`GRID`] points evenly
/// spaced from `start` to `n`, each rounded down, without repeats.
fn grid(start: usize, n: usize) -> Vec<usize> {
    let (lo, hi) = (start as f64, n as f64);
    let step = (hi - lo) / (GRID - 1) as f64;
    let mut ks: Vec<usize> = (0..GRID)
        .map(|i| {
            if i == GRID - 1 {
                n
            } else {
                (i as f64 * step + lo) as usize
            }
        })
        .collect();
    ks.dedup();
    ks
}

/// The fixed-sequence arm's threshold, tested at `delta` (its share).
fn fixed_sequence(ranked: &Ranked, alpha: f64, delta: f64) -> f64 {
    let n = ranked.len();
    if n == 0 {
        return f64::INFINITY;
    }
    let mut threshold = f64::INFINITY;
    for k in grid(fixed_sequence_start(alpha, delta, n), n) {
        let k = ranked.served(k);
        if upper_bound(ranked.errors[k - 1], k, delta) > alpha {
            break;
        }
        threshold = ranked.conf[k - 1];
    }
    threshold
}

/// The served counts of the Bonferroni arm: each share of [`LEVELS`] of
/// `n`, rounded half to even, at least 1, without repeats.
fn bonferroni_counts(n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let mut ks: Vec<usize> = LEVELS
        .iter()
        .map(|&level| ((level * n as f64).round_ties_even() as usize).max(1))
        .collect();
    ks.sort_unstable();
    ks.dedup();
    ks
}

/// The Bonferroni arm's threshold, tested at `delta` (its share).
fn bonferroni(ranked: &Ranked, alpha: f64, delta: f64) -> f64 {
    let ks = bonferroni_counts(ranked.len());
    let each = delta / ks.len() as f64;
    let mut threshold = f64::INFINITY;
    for k in ks {
        let k = ranked.served(k);
        if upper_bound(ranked.errors[k - 1], k, each) <= alpha {
            threshold = threshold.min(ranked.conf[k - 1]);
        }
    }
    threshold
}

/// The arm whose threshold was kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    FixedSequence,
    Bonferroni,
    /// Both arms reached the same threshold.
    Both,
}

/// A certification of held-out examples.
#[derive(Clone, Debug, PartialEq)]
pub struct Certificate {
    pub alpha: f64,
    pub delta: f64,
    /// Held-out examples.
    pub n: usize,
    /// The certified threshold: answers with confidence at or above it are
    /// certified; `+inf` when nothing could be certified.
    pub threshold: f64,
    /// Each arm's threshold (`+inf` when the arm certified nothing).
    pub fixed_sequence: f64,
    pub bonferroni: f64,
    /// The arm that decided; `None` when nothing was certified.
    pub arm: Option<Arm>,
    /// Held-out examples at or above the threshold, and the wrong answers
    /// among them (0 and 0 when nothing was certified).
    pub served: usize,
    pub errors: usize,
    /// `served / n` (0 when `n` is 0).
    pub share: f64,
    /// The Clopper–Pearson upper bound at `delta / 2` on the error rate of
    /// the served examples; `None` when nothing was certified.
    pub bound: Option<f64>,
    /// The share of examples at or above [`empirical_threshold`]: what a
    /// threshold without a promise would serve (0 when there is none).
    pub empirical_share: f64,
}

/// The certified threshold for `conf` (each answer's confidence, its top
/// probability) and `correct` (whether it was right); `+inf` when nothing
/// can be certified.
pub fn threshold(conf: &[f64], correct: &[bool], alpha: f64, delta: f64) -> f64 {
    let ranked = Ranked::new(conf, correct);
    fixed_sequence(&ranked, alpha, delta / 2.0).min(bonferroni(&ranked, alpha, delta / 2.0))
}

/// The most lenient threshold at which the error among the examples
/// themselves is at most `alpha` (thresholds that end a group of equal
/// confidences only): no bound, so no promise; `+inf` when there is none.
pub fn empirical_threshold(conf: &[f64], correct: &[bool], alpha: f64) -> f64 {
    let ranked = Ranked::new(conf, correct);
    let n = ranked.len();
    (1..=n)
        .rev()
        .find(|&k| {
            let ends_group = k == n || ranked.conf[k - 1] != ranked.conf[k];
            ends_group && ranked.errors[k - 1] as f64 / k as f64 <= alpha + 1e-12
        })
        .map_or(f64::INFINITY, |k| ranked.conf[k - 1])
}

/// The fewest held-out examples at which anything could be certified:
/// with fewer, even a task answered right every time gets no threshold.
///
/// The reference finds it by certifying `n` equal confidences, all right,
/// for `n = 1, 2, …`. With every confidence tied, each arm serves all `n`,
/// and the fixed sequence (tested at `delta / 2`) is the more lenient arm;
/// so the answer is the first `n` with `upper_bound(0, n, delta / 2) ≤
/// alpha`, about `ln(delta / 2) / ln(1 − alpha)`: 59 at `alpha = 0.05`,
/// `delta = 0.1`. [`MINIMUM_SEARCH_LIMIT`] when none is found below it.
pub fn minimum_examples(alpha: f64, delta: f64) -> usize {
    (1..MINIMUM_SEARCH_LIMIT)
        .find(|&n| upper_bound(0, n, delta / 2.0) <= alpha)
        .unwrap_or(MINIMUM_SEARCH_LIMIT)
}

/// The certification of `conf` and `correct` (the held-out examples'
/// served confidences and correctness) at `alpha` and `delta`.
pub fn certify(conf: &[f64], correct: &[bool], alpha: f64, delta: f64) -> Certificate {
    let ranked = Ranked::new(conf, correct);
    let n = ranked.len();
    let fixed = fixed_sequence(&ranked, alpha, delta / 2.0);
    let bonf = bonferroni(&ranked, alpha, delta / 2.0);
    let threshold = fixed.min(bonf);
    let share_of = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    let empirical = empirical_threshold(conf, correct, alpha);
    let empirical_share = if empirical.is_finite() {
        share_of(conf.iter().filter(|&&c| c >= empirical).count())
    } else {
        0.0
    };
    let (arm, served, errors, bound) = if threshold.is_finite() {
        let served = ranked.conf.partition_point(|&c| c >= threshold);
        let errors = ranked.errors[served - 1];
        let arm = match (fixed == threshold, bonf == threshold) {
            (true, true) => Arm::Both,
            (true, false) => Arm::FixedSequence,
            _ => Arm::Bonferroni,
        };
        let bound = upper_bound(errors, served, delta / 2.0);
        (Some(arm), served, errors, Some(bound))
    } else {
        (None, 0, 0, None)
    };
    Certificate {
        alpha,
        delta,
        n,
        threshold,
        fixed_sequence: fixed,
        bonferroni: bonf,
        arm,
        served,
        errors,
        share: share_of(served),
        bound,
        empirical_share,
    }
}

#[cfg(test)]
#[path = "certify_tests.rs"]
mod tests;
