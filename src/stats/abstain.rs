//! Abstention on a declared "can't tell" option: a threshold on that
//! option's probability, fitted from labelled examples, above which the
//! answer is that option and below which it is the best of the others.
//!
//! The rule is the reference decisio's (`decisio/serve/abstention.py`):
//! candidate thresholds sit between consecutive distinct probabilities of
//! the option (at the midpoint in log-odds), one below the smallest
//! (abstain on every example) and 1 (never abstain); the best candidate
//! gets the most examples right (abstaining is right on an unanswerable
//! example, an answer when the best other option is the gold one), ties to
//! the largest. It is *applied* only when there are at least
//! [`MIN_EXAMPLES`] examples with [`MIN_EACH`] unanswerable and answerable
//! ones, and, leave-one-out, the threshold gets at least one more example
//! right than the plain argmax and makes no more false abstentions.
//! Otherwise the plain argmax is kept (`applied: false`).

use serde::{Deserialize, Serialize};

/// Fewer examples: no threshold.
pub const MIN_EXAMPLES: usize = 10;
/// At least this many unanswerable and this many answerable examples.
pub const MIN_EACH: usize = 2;
const EPS: f64 = 1e-9;

/// One labelled example, scored: the abstain option's probability,
/// whether the example is unanswerable, whether the best other option is
/// its gold one, and the plain argmax's outcome (right, a false
/// abstention).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    pub p_abstain: f64,
    pub unanswerable: bool,
    pub answer_ok: bool,
    pub plain_right: bool,
    pub plain_false: bool,
}

impl Scored {
    /// An example's scoring from the abstain option's probability, whether
    /// it is unanswerable, whether the best other option is its gold one,
    /// and whether the plain argmax abstains.
    pub fn new(p_abstain: f64, unanswerable: bool, answer_ok: bool, plain_abstains: bool) -> Self {
        Scored {
            p_abstain,
            unanswerable,
            answer_ok,
            plain_right: if unanswerable {
                plain_abstains
            } else {
                !plain_abstains && answer_ok
            },
            plain_false: !unanswerable && plain_abstains,
        }
    }
}

/// A task's fitted abstention.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbstentionFit {
    pub n: usize,
    pub n_unanswerable: usize,
    /// Whether the threshold is served.
    pub applied: bool,
    /// The served threshold (when applied).
    pub threshold: Option<f64>,
    /// The threshold fitted on every example, served or not.
    pub fitted_threshold: Option<f64>,
    pub reason: String,
    /// Leave-one-out: examples the threshold gets right, and its false
    /// abstentions; the plain argmax's on every example.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loo_right_threshold: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loo_false_threshold: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub right_plain: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub false_plain: Option<usize>,
}

fn logit(p: f64) -> f64 {
    let p = p.clamp(EPS, 1.0 - EPS);
    (p / (1.0 - p)).ln()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The candidate thresholds of these probabilities, ascending.
pub fn candidates(p: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = p.to_vec();
    v.sort_by(f64::total_cmp);
    v.dedup();
    let mut out: Vec<f64> = v
        .windows(2)
        .map(|w| sigmoid((logit(w[0]) + logit(w[1])) / 2.0))
        .collect();
    if let Some(&lo) = v.first() {
        out.push(sigmoid(logit(lo) - 1.0));
    }
    out.push(1.0);
    out.sort_by(f64::total_cmp);
    out
}

/// (right, a false abstention) for one example under threshold `t`.
pub fn outcome(e: &Scored, t: f64) -> (bool, bool) {
    let abstain = e.p_abstain > t;
    if e.unanswerable {
        (abstain, false)
    } else {
        (!abstain && e.answer_ok, abstain)
    }
}

/// The candidate getting the most examples right; ties to the largest.
pub fn best_threshold(examples: &[&Scored]) -> f64 {
    let p: Vec<f64> = examples.iter().map(|e| e.p_abstain).collect();
    let (mut best, mut best_t) = (None, 1.0);
    for t in candidates(&p) {
        let right = examples.iter().filter(|e| outcome(e, t).0).count();
        if best.is_none_or(|b| right > b || (right == b && t > best_t)) {
            best = Some(right);
            best_t = t;
        }
    }
    best_t
}

/// The abstention of a task from its scored examples.
pub fn fit(examples: &[Scored]) -> AbstentionFit {
    let n = examples.len();
    let n_u = examples.iter().filter(|e| e.unanswerable).count();
    let mut out = AbstentionFit {
        n,
        n_unanswerable: n_u,
        applied: false,
        threshold: None,
        fitted_threshold: None,
        reason: String::new(),
        loo_right_threshold: None,
        loo_false_threshold: None,
        right_plain: None,
        false_plain: None,
    };
    if n < MIN_EXAMPLES || n_u < MIN_EACH || n - n_u < MIN_EACH {
        out.reason = format!(
            "needs at least {MIN_EXAMPLES} examples with {MIN_EACH} unanswerable and \
             {MIN_EACH} answerable ones; got {n} with {n_u} unanswerable"
        );
        return out;
    }
    let (mut loo_right, mut loo_false) = (0, 0);
    for i in 0..n {
        let rest: Vec<&Scored> = (0..n).filter(|&j| j != i).map(|j| &examples[j]).collect();
        let (r, f) = outcome(&examples[i], best_threshold(&rest));
        loo_right += usize::from(r);
        loo_false += usize::from(f);
    }
    let plain_right = examples.iter().filter(|e| e.plain_right).count();
    let plain_false = examples.iter().filter(|e| e.plain_false).count();
    let all: Vec<&Scored> = examples.iter().collect();
    let t = best_threshold(&all);
    out.fitted_threshold = Some(t);
    out.loo_right_threshold = Some(loo_right);
    out.loo_false_threshold = Some(loo_false);
    out.right_plain = Some(plain_right);
    out.false_plain = Some(plain_false);
    if loo_right > plain_right && loo_false <= plain_false {
        out.applied = true;
        out.threshold = Some(t);
        out.reason = format!(
            "leave-one-out {loo_right} of {n} right against {plain_right} for the plain argmax"
        );
    } else {
        out.reason = format!(
            "leave-one-out {loo_right} right and {loo_false} false abstentions against the plain \
             argmax's {plain_right} and {plain_false}: kept the plain argmax"
        );
    }
    out
}

/// (abstain, the best other option) for one question's probabilities `p`
/// whose abstain option is at `abstain`: with a served threshold, abstain
/// above it; without, when the argmax is that option. Ties go to the
/// earliest option, as answers are served.
pub fn decide(p: &[f64], abstain: usize, threshold: Option<f64>) -> (bool, usize) {
    let mut best: Option<usize> = None;
    let mut top = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > p[top] {
            top = i;
        }
        if i != abstain && best.is_none_or(|b| v > p[b]) {
            best = Some(i);
        }
    }
    let best = best.unwrap_or(abstain);
    match threshold {
        Some(t) => (p[abstain] > t, best),
        None => (top == abstain, best),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(p: f64, unanswerable: bool, answer_ok: bool) -> Scored {
        // The plain argmax abstains when the option is above one half here.
        Scored::new(p, unanswerable, answer_ok, p > 0.5)
    }

    #[test]
    fn candidates_sit_between_the_probabilities() {
        let c = candidates(&[0.2, 0.8, 0.2]);
        assert_eq!(c.len(), 3);
        assert!((c[1] - 0.5).abs() < 1e-12, "{c:?}");
        assert!(c[0] < 0.2 && c[2] == 1.0, "{c:?}");
    }

    #[test]
    fn a_threshold_below_one_half_is_applied_where_it_helps() {
        // Unanswerable examples put 0.3 to 0.45 on the option: the plain
        // argmax answers them all; a threshold near 0.25 abstains on them.
        let mut examples = Vec::new();
        for i in 0..6 {
            examples.push(ex(0.3 + 0.03 * i as f64, true, false));
            examples.push(ex(0.05 + 0.02 * i as f64, false, true));
        }
        let f = fit(&examples);
        assert!(f.applied, "{f:?}");
        let t = f.threshold.unwrap();
        assert!(t > 0.15 && t < 0.3, "{t}");
        assert_eq!(f.loo_right_threshold, Some(12));
        assert_eq!(f.right_plain, Some(6));
        assert_eq!(decide(&[0.6, 0.35, 0.05], 1, f.threshold), (true, 0));
        assert_eq!(decide(&[0.6, 0.1, 0.3], 1, f.threshold), (false, 0));
        assert_eq!(decide(&[0.6, 0.35, 0.05], 1, None), (false, 0));
    }

    #[test]
    fn too_few_or_no_gain_keeps_the_plain_argmax() {
        let few: Vec<Scored> = (0..9).map(|i| ex(0.1, i % 2 == 0, true)).collect();
        let f = fit(&few);
        assert!(!f.applied && f.reason.contains("at least 10"), "{f:?}");
        // Already separated at one half: the plain argmax is as good.
        let mut examples = Vec::new();
        for _ in 0..6 {
            examples.push(ex(0.9, true, false));
            examples.push(ex(0.1, false, true));
        }
        let f = fit(&examples);
        assert!(!f.applied, "{f:?}");
        assert!(f.fitted_threshold.is_some() && f.threshold.is_none());
    }
}
