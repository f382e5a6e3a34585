//! Letter-bias removal for a choice task: what the model prefers about a
//! letter whatever the option behind it, estimated at registration and
//! subtracted from the letters' logits before the softmax.
//!
//! Two estimates of the per-letter bias `b` (one value per position,
//! centred), both from the fit side of a task's examples, each example
//! read in `k` cyclic rotations of its options (`text_route::decide::rotation`;
//! rotation 0 is the order served):
//!
//! - **PriDe** (Zheng et al. 2024): without labels. Averaged over the
//!   rotations, every option visits every position (exactly when `k`
//!   equals the number of options), so the mean of a position's
//!   log-probabilities over an example's rotations is that position's
//!   prior up to a constant. The prior is that, softmax-normalised per
//!   example and averaged over examples; the bias is its log, centred
//!   (the reference decisio's `pride_prior`, `decisio/readout/debias.py`).
//!   It needs `k ≥ 2`.
//! - **Fitted**: by penalised maximum likelihood, the mean NLL of
//!   `softmax(L − b)` at the gold position plus `LAMBDA·|b|²`, on every
//!   rotation of every fit example (the labels then visit every position
//!   alike, so `b` learns the letters, not how often each answer is
//!   right). The penalty is the reference's fixed 0.1
//!   (`decisio/readout/calibration.py`). The problem is strictly convex;
//!   it is solved by Newton's method from `b = 0`.
//!
//! **Which is kept** ([`choose`]): each candidate is cross-validated on
//! the fit side (5 folds of examples, seeded): fitted on four folds with a
//! temperature on top, and scored on the fifth's served order against the
//! plain readout with its own fitted temperature. A candidate is kept only
//! where the mean cross-validated log loss falls by at least [`MIN_GAIN`]
//! nats, the fall clears a one-sided 95% test on the per-example
//! differences (`t ≤ −1.645`), and the cross-validated accuracy does not
//! fall: the reference's acceptance rule. Of the kept candidates, the one
//! with the lowest log loss is served; when none is kept the bias is zero
//! and the task is served as without it. At least [`MIN_EXAMPLES`] fit
//! examples with two different labels are needed to try.

use serde::{Deserialize, Serialize};

use super::calibrate::fit_temperature;
use super::log_softmax;
use crate::rng::SplitMix;

/// The L2 penalty on a fitted bias (the reference's `LAMBDA`).
pub const LAMBDA: f64 = 0.1;
/// Fewer fit examples than this: no bias is tried (the reference's
/// `MIN_EXAMPLES`).
pub const MIN_EXAMPLES: usize = 10;
/// The nats of cross-validated log loss per example a bias must save.
pub const MIN_GAIN: f64 = 0.005;
/// The one-sided 95% line on the per-example differences' t statistic.
pub const T_ACCEPT: f64 = 1.645;
/// Cross-validation folds (fewer when there are fewer examples).
pub const FOLDS: usize = 5;

/// How a candidate bias was estimated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// PriDe's label-free prior from the rotations.
    Pride,
    /// Penalised maximum likelihood on the labelled rotations.
    Fitted,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Pride => "pride",
            Method::Fitted => "fitted",
        }
    }
}

/// One candidate's cross-validated figures against the plain readout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub method: Method,
    /// Mean cross-validated log loss with the bias (and its temperature).
    pub cv_logloss: f64,
    /// Cross-validated accuracy with the bias.
    pub cv_accuracy: f64,
    /// The t statistic of the per-example log-loss differences (negative:
    /// the bias helps); `None` where every difference is zero or there is
    /// one example.
    pub cv_t: Option<f64>,
    /// Whether it passed the acceptance rule.
    pub accepted: bool,
    /// The bias fitted on every fit example (centred, one per position).
    pub bias: Vec<f64>,
}

/// What a registration concluded about the letters' bias.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Debias {
    /// Cyclic rotations each example was read in.
    pub rotations: usize,
    /// The bias served (zeros when none was kept), subtracted from the
    /// letters' logits before the temperature.
    pub bias: Vec<f64>,
    /// The candidate served, if any.
    pub kept: Option<Method>,
    /// Why: which candidate won, or why none did.
    pub reason: String,
    /// PriDe's prior (probabilities per position) on the fit side, when
    /// read in at least two rotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior: Option<Vec<f64>>,
    /// The plain readout's cross-validated log loss and accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cv_logloss_plain: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cv_accuracy_plain: Option<f64>,
    /// Each candidate tried.
    #[serde(default)]
    pub trials: Vec<Trial>,
}

impl Debias {
    /// The served bias, when one was kept.
    pub fn applied(&self) -> Option<&[f64]> {
        self.kept.map(|_| self.bias.as_slice())
    }
}

/// Logits with a per-position bias subtracted.
pub fn corrected(logits: &[f32], bias: &[f64]) -> Vec<f32> {
    logits
        .iter()
        .zip(bias)
        .map(|(&l, &b)| (f64::from(l) - b) as f32)
        .collect()
}

/// The mean NLL of `softmax(L − b)` at `y` plus `lambda·|b|²`, its gradient
/// and Hessian.
fn objective(rows: &[&[f32]], y: &[usize], b: &[f64], lambda: f64) -> (f64, Vec<f64>, Vec<f64>) {
    let k = b.len();
    let n = rows.len() as f64;
    let mut value = lambda * b.iter().map(|v| v * v).sum::<f64>();
    let mut grad: Vec<f64> = b.iter().map(|v| 2.0 * lambda * v).collect();
    let mut hess = vec![0.0; k * k];
    for i in 0..k {
        hess[i * k + i] = 2.0 * lambda;
    }
    for (row, &label) in rows.iter().zip(y) {
        let z: Vec<f64> = row.iter().zip(b).map(|(&l, &v)| f64::from(l) - v).collect();
        let top = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let norm = top + z.iter().map(|v| (v - top).exp()).sum::<f64>().ln();
        let lp: Vec<f64> = z.iter().map(|v| v - norm).collect();
        let p: Vec<f64> = lp.iter().map(|v| v.exp()).collect();
        value -= lp[label] / n;
        for a in 0..k {
            // d(−log p_y)/db_a = 1[a = y] − p_a, as z = L − b.
            grad[a] += (f64::from(u8::from(a == label)) - p[a]) / n;
            for c in 0..k {
                let d = if a == c { p[a] } else { 0.0 };
                hess[a * k + c] += (d - p[a] * p[c]) / n;
            }
        }
    }
    (value, grad, hess)
}

/// Solves `H x = g` for a symmetric positive definite `H` (Cholesky).
fn solve(h: &[f64], g: &[f64]) -> Vec<f64> {
    let k = g.len();
    let mut l = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..=i {
            let s: f64 = (0..j).map(|m| l[i * k + m] * l[j * k + m]).sum();
            if i == j {
                l[i * k + i] = (h[i * k + i] - s).max(1e-300).sqrt();
            } else {
                l[i * k + j] = (h[i * k + j] - s) / l[j * k + j];
            }
        }
    }
    let mut z = vec![0.0; k];
    for i in 0..k {
        let s: f64 = (0..i).map(|m| l[i * k + m] * z[m]).sum();
        z[i] = (g[i] - s) / l[i * k + i];
    }
    let mut x = vec![0.0; k];
    for i in (0..k).rev() {
        let s: f64 = (i + 1..k).map(|m| l[m * k + i] * x[m]).sum();
        x[i] = (z[i] - s) / l[i * k + i];
    }
    x
}

/// The penalised maximum-likelihood bias of `rows` (position-space
/// logits) at their gold positions `y`, centred. Newton's method with
/// step halving, at most 100 steps.
pub fn fit_bias(rows: &[&[f32]], y: &[usize], k: usize, lambda: f64) -> Vec<f64> {
    let mut b = vec![0.0; k];
    let (mut value, mut grad, mut hess) = objective(rows, y, &b, lambda);
    for _ in 0..100 {
        let step = solve(&hess, &grad);
        let mut scale = 1.0;
        loop {
            let next: Vec<f64> = b.iter().zip(&step).map(|(v, s)| v - scale * s).collect();
            let (v, g, h) = objective(rows, y, &next, lambda);
            if v <= value || scale < 1e-6 {
                b = next;
                (value, grad, hess) = (v, g, h);
                break;
            }
            scale /= 2.0;
        }
        if step.iter().map(|s| (s * scale).abs()).fold(0.0, f64::max) < 1e-10 {
            break;
        }
    }
    centred(b)
}

fn centred(b: Vec<f64>) -> Vec<f64> {
    let mean = b.iter().sum::<f64>() / b.len().max(1) as f64;
    b.into_iter().map(|v| v - mean).collect()
}

/// PriDe's prior (probabilities per position) from examples each read in
/// several rotations (`reads[e][r]`: example `e`'s position-space logits
/// in rotation `r`).
pub fn pride_prior(reads: &[&[Vec<f32>]]) -> Vec<f64> {
    let k = reads[0][0].len();
    let mut prior = vec![0.0; k];
    for rotations in reads {
        let mut mean = vec![0.0f64; k];
        for row in rotations.iter() {
            for (m, v) in mean.iter_mut().zip(log_softmax(row, 1.0)) {
                *m += v / rotations.len() as f64;
            }
        }
        let mean: Vec<f32> = mean.iter().map(|&v| v as f32).collect();
        for (p, v) in prior.iter_mut().zip(log_softmax(&mean, 1.0)) {
            *p += v.exp() / reads.len() as f64;
        }
    }
    prior
}

/// The bias of a prior: its log, centred.
pub fn prior_bias(prior: &[f64]) -> Vec<f64> {
    centred(prior.iter().map(|p| p.max(1e-300).ln()).collect())
}

/// A candidate estimated on some examples: `reads[e]` are example `e`'s
/// rotations (rotation 0 first), `y[e]` its gold option; the gold
/// position in rotation `r` is where `order` puts it.
fn estimate(method: Method, reads: &[&[Vec<f32>]], y: &[usize], k: usize) -> Vec<f64> {
    match method {
        Method::Pride => prior_bias(&pride_prior(reads)),
        Method::Fitted => {
            let mut rows = Vec::new();
            let mut gold = Vec::new();
            for (rotations, &label) in reads.iter().zip(y) {
                let n = rotations.len();
                for (r, row) in rotations.iter().enumerate() {
                    let order = super::rotation(k, r, n);
                    rows.push(row.as_slice());
                    gold.push(order.iter().position(|&o| o == label).unwrap_or(label));
                }
            }
            fit_bias(&rows, &gold, k, LAMBDA)
        }
    }
}

/// Per-example (log loss, correct) of `rows` at `y` after `bias` and a
/// temperature `t`.
fn scored(rows: &[&[f32]], y: &[usize], bias: &[f64], t: f64) -> Vec<(f64, bool)> {
    rows.iter()
        .zip(y)
        .map(|(row, &label)| {
            let lp = log_softmax(&corrected(row, bias), t);
            let p: Vec<f32> = lp.iter().map(|v| v.exp() as f32).collect();
            (-lp[label], super::top_option(&p).0 == label)
        })
        .collect()
}

/// Decides which bias a choice task serves from its fit examples:
/// `reads[e]` holds example `e`'s letters' logits in each rotation
/// (rotation 0, the served order, first), `y[e]` its option; `seed` draws
/// the folds.
pub fn choose(reads: &[Vec<Vec<f32>>], y: &[usize], k: usize, seed: u64) -> Debias {
    let rotations = reads.first().map_or(1, Vec::len);
    let views: Vec<&[Vec<f32>]> = reads.iter().map(Vec::as_slice).collect();
    let prior = (rotations >= 2 && !reads.is_empty()).then(|| pride_prior(&views));
    let mut out = Debias {
        rotations,
        bias: vec![0.0; k],
        kept: None,
        reason: String::new(),
        prior,
        cv_logloss_plain: None,
        cv_accuracy_plain: None,
        trials: Vec::new(),
    };
    let n = reads.len();
    let distinct = y.iter().collect::<std::collections::BTreeSet<_>>().len();
    if n < MIN_EXAMPLES {
        out.reason = format!("{n} fit examples; a letter bias is tried on {MIN_EXAMPLES} or more");
        return out;
    }
    if distinct < 2 {
        out.reason = "every fit example has the same answer; a letter bias cannot be told \
                      from the task"
            .into();
        return out;
    }
    let methods: Vec<Method> = if rotations >= 2 {
        vec![Method::Pride, Method::Fitted]
    } else {
        vec![Method::Fitted]
    };
    // Folds of examples, seeded.
    let mut order: Vec<usize> = (0..n).collect();
    SplitMix::new(seed ^ 0xB1A5).shuffle(&mut order);
    let folds = FOLDS.min(n);
    let mut fold_of = vec![0; n];
    for (i, &e) in order.iter().enumerate() {
        fold_of[e] = i * folds / n;
    }
    let served: Vec<&[f32]> = reads.iter().map(|r| r[0].as_slice()).collect();
    let zero = vec![0.0; k];
    let mut plain = vec![(0.0, false); n];
    let mut cand = vec![vec![(0.0, false); n]; methods.len()];
    for f in 0..folds {
        let train: Vec<usize> = (0..n).filter(|&e| fold_of[e] != f).collect();
        let test: Vec<usize> = (0..n).filter(|&e| fold_of[e] == f).collect();
        let pick = |idx: &[usize]| -> (Vec<&[f32]>, Vec<usize>) {
            (
                idx.iter().map(|&e| served[e]).collect(),
                idx.iter().map(|&e| y[e]).collect(),
            )
        };
        let (train_rows, train_y) = pick(&train);
        let (test_rows, test_y) = pick(&test);
        let owned = |rows: &[&[f32]], bias: &[f64]| -> Vec<Vec<f32>> {
            rows.iter().map(|r| corrected(r, bias)).collect()
        };
        let t0 = fit_temperature(&owned(&train_rows, &zero), &train_y);
        for (e, s) in test.iter().zip(scored(&test_rows, &test_y, &zero, t0)) {
            plain[*e] = s;
        }
        let train_reads: Vec<&[Vec<f32>]> = train.iter().map(|&e| views[e]).collect();
        for (m, &method) in methods.iter().enumerate() {
            let b = estimate(method, &train_reads, &train_y, k);
            let t = fit_temperature(&owned(&train_rows, &b), &train_y);
            for (e, s) in test.iter().zip(scored(&test_rows, &test_y, &b, t)) {
                cand[m][*e] = s;
            }
        }
    }
    let mean = |v: &[(f64, bool)]| v.iter().map(|s| s.0).sum::<f64>() / n as f64;
    let accuracy = |v: &[(f64, bool)]| v.iter().filter(|s| s.1).count() as f64 / n as f64;
    out.cv_logloss_plain = Some(mean(&plain));
    out.cv_accuracy_plain = Some(accuracy(&plain));
    for (m, &method) in methods.iter().enumerate() {
        let d: Vec<f64> = cand[m].iter().zip(&plain).map(|(c, p)| c.0 - p.0).collect();
        let (dm, sd) = super::mean_sd(&d);
        let se = sd / (n as f64).sqrt();
        let t = (se > 0.0).then(|| dm / se);
        let accepted = dm <= -MIN_GAIN
            && t.is_some_and(|t| t <= -T_ACCEPT)
            && accuracy(&cand[m]) >= accuracy(&plain);
        out.trials.push(Trial {
            method,
            cv_logloss: mean(&cand[m]),
            cv_accuracy: accuracy(&cand[m]),
            cv_t: t,
            accepted,
            bias: estimate(method, &views, y, k),
        });
    }
    let best = out
        .trials
        .iter()
        .filter(|t| t.accepted)
        .min_by(|a, b| a.cv_logloss.total_cmp(&b.cv_logloss));
    match best {
        Some(t) => {
            out.kept = Some(t.method);
            out.bias = t.bias.clone();
            out.reason = format!(
                "{}: cross-validated log loss {:.4} against {:.4} plain, accuracy {:.4} against {:.4}",
                t.method.as_str(),
                t.cv_logloss,
                out.cv_logloss_plain.unwrap_or_default(),
                t.cv_accuracy,
                out.cv_accuracy_plain.unwrap_or_default()
            );
        }
        None => {
            out.reason = format!(
                "no candidate cleared the rule (log loss down by {MIN_GAIN} nats or more, \
                 t ≤ −{T_ACCEPT}, accuracy not down): served without a letter bias"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::rotation;

    /// Examples whose content favours their label, read with a letter
    /// prior added at each position, in `k` rotations.
    fn draws(n: usize, k: usize, prior: &[f64], seed: u64) -> (Vec<Vec<Vec<f32>>>, Vec<usize>) {
        let mut rng = SplitMix::new(seed);
        let opts = prior.len();
        let mut reads = Vec::new();
        let mut y = Vec::new();
        for _ in 0..n {
            let label = rng.below(opts as u64) as usize;
            let content: Vec<f64> = (0..opts)
                .map(|o| 2.0 * rng.next_f64() + if o == label { 1.0 } else { 0.0 })
                .collect();
            let rows = (0..k)
                .map(|r| {
                    rotation(opts, r, k)
                        .iter()
                        .enumerate()
                        .map(|(p, &o)| (content[o] + prior[p]) as f32)
                        .collect()
                })
                .collect();
            reads.push(rows);
            y.push(label);
        }
        (reads, y)
    }

    #[test]
    fn the_gradient_is_the_objectives() {
        let (reads, y) = draws(30, 1, &[1.0, 0.0, -0.5, 0.2], 3);
        let rows: Vec<&[f32]> = reads.iter().map(|r| r[0].as_slice()).collect();
        let b = [0.3, -0.2, 0.1, 0.05];
        let (_, grad, _) = objective(&rows, &y, &b, LAMBDA);
        for a in 0..4 {
            let mut up = b;
            let mut down = b;
            up[a] += 1e-6;
            down[a] -= 1e-6;
            let num = (objective(&rows, &y, &up, LAMBDA).0 - objective(&rows, &y, &down, LAMBDA).0)
                / 2e-6;
            assert!((num - grad[a]).abs() < 1e-6, "{a}: {num} vs {}", grad[a]);
        }
        // At the fit, the gradient of the centred bias vanishes.
        let fitted = fit_bias(&rows, &y, 4, LAMBDA);
        let (_, g, _) = objective(&rows, &y, &fitted, LAMBDA);
        assert!(g.iter().all(|v| v.abs() < 1e-8), "{g:?}");
    }

    #[test]
    fn a_letter_prior_is_found_and_kept() {
        let prior = [1.5, 0.0, -0.5, -1.0];
        let (reads, y) = draws(200, 4, &prior, 7);
        let want = centred(prior.to_vec());
        // PriDe recovers the prior from the rotations without labels.
        let views: Vec<&[Vec<f32>]> = reads.iter().map(Vec::as_slice).collect();
        let pride = prior_bias(&pride_prior(&views));
        for (a, b) in pride.iter().zip(&want) {
            assert!((a - b).abs() < 0.25, "{pride:?} vs {want:?}");
        }
        let d = choose(&reads, &y, 4, 1);
        assert!(d.kept.is_some(), "{d:?}");
        for (a, b) in d.bias.iter().zip(&want) {
            assert!((a - b).abs() < 0.35, "{:?} vs {want:?}", d.bias);
        }
        assert!(d
            .trials
            .iter()
            .all(|t| t.cv_logloss < d.cv_logloss_plain.unwrap()));
        // Deterministic: the same bits again.
        assert_eq!(choose(&reads, &y, 4, 1), d);
    }

    #[test]
    fn no_prior_keeps_nothing_and_few_examples_try_nothing() {
        let (reads, y) = draws(200, 4, &[0.0; 4], 11);
        let d = choose(&reads, &y, 4, 1);
        assert_eq!(d.kept, None, "{d:?}");
        assert_eq!(d.bias, vec![0.0; 4]);
        assert!(d.reason.contains("no candidate"), "{}", d.reason);
        let (few, fy) = draws(9, 4, &[2.0, 0.0, 0.0, 0.0], 1);
        let d = choose(&few, &fy, 4, 1);
        assert!(d.trials.is_empty() && d.kept.is_none(), "{d:?}");
        // One rotation: only the fitted candidate is tried.
        let (one, oy) = draws(100, 1, &[1.5, 0.0, -0.5, -1.0], 5);
        let d = choose(&one, &oy, 4, 1);
        assert_eq!(d.trials.len(), 1);
        assert_eq!(d.trials[0].method, Method::Fitted);
        assert!(d.prior.is_none());
    }
}
