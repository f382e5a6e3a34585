//! Statistics: the pure mathematics the text route, task registration and
//! the suite's figures share, with no knowledge of engines, HTTP or tasks.
//!
//! - [`softmax`], [`log_softmax`], [`log_sum_exp`]: the one softmax family,
//!   in f64, of logits divided by a temperature.
//! - [`top_option`]: the argmax as a decision serves it (the earliest
//!   option among exact equals wins); [`Readout`]: the one readout rule
//!   (softmax, f32, that argmax) answers, certificates and reports share.
//! - [`mean_sd`]: a sample's mean and standard deviation.
//! - [`calibrate`]: the calibration figures of a set of answers (accuracy,
//!   NLL, ECE over [`calibrate::ECE_BINS`] equal-width bins, the
//!   reliability table), the temperature fit, the fit/holdout split and the
//!   abstention thresholds.
//! - [`head`]: the intent head, an L2-regularised multinomial logistic
//!   regression on hidden states: its fit (cross-validated strength, a
//!   temperature on a calibration part), its application to a hidden state
//!   and its draws.
//!
//! - [`abstain`]: abstention on a declared "can't tell" option, a
//!   threshold on its probability kept only where leave-one-out shows it
//!   beats the plain argmax.
//! - [`beta`]: the regularized incomplete beta function and the Beta
//!   quantile, in f64.
//! - [`certify`]: certified answers, a confidence threshold with a bound
//!   on the error rate above it (Learn-then-Test with Clopper–Pearson
//!   bounds, as the reference decisio's `readout/certify.py` computes it),
//!   and the fewest held-out examples that can certify anything.
//! - [`conformal`]: split-conformal prediction sets for multiple choice
//!   (LAC and APS scores).
//! - [`debias`]: letter-bias removal for a choice task (PriDe's prior
//!   from cyclic rotations, a fitted per-letter bias) and the
//!   cross-validated rule that keeps one or neither.
//! - [`monitor`]: the traffic monitor of a certified task (the answer mix
//!   against its examples', and a CUSUM on low confidences).
//!
//! Every function is deterministic: given its inputs (and a seed, where it
//! draws), it computes the same bits on every run.

pub mod abstain;
pub mod beta;
pub mod calibrate;
pub mod certify;
pub mod conformal;
pub mod debias;
pub mod head;
pub mod monitor;
mod softmax;

pub use self::softmax::{log_softmax, log_sum_exp, rotation, softmax, top_option, Readout};

/// The mean of `v` and its sample standard deviation (with `n − 1`);
/// 0 and 0 for an empty sample, a standard deviation of 0 for one value.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    } else {
        0.0
    };
    (mean, sd)
}
