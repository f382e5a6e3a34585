//! The softmax family over a question's options, in f64: logits divided by
//! a temperature, shifted by their maximum so that no term overflows; and
//! the readout rule a decision serves ([`Readout`]).

/// `logits / t`, each in f64.
fn scaled(logits: &[f32], t: f64) -> Vec<f64> {
    logits.iter().map(|&l| f64::from(l) / t).collect()
}

/// The largest of `v` (`-inf` when empty).
fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// `ln(sum(exp(v)))`.
pub fn log_sum_exp(v: &[f64]) -> f64 {
    let max = max(v);
    max + v.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// `softmax(logits / t)`.
pub fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let z = scaled(logits, t);
    let max = max(&z);
    let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|v| v / total).collect()
}

/// `log_softmax(logits / t)`: finite even where the probability is 0 in
/// f64.
pub fn log_softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let z = scaled(logits, t);
    let norm = log_sum_exp(&z);
    z.iter().map(|v| v - norm).collect()
}

/// The top option (earliest among exact equals) and whether it was a tie.
pub fn top_option(probabilities: &[f32]) -> (usize, bool) {
    let best = probabilities
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let first = probabilities.iter().position(|&p| p == best).unwrap_or(0);
    let count = probabilities.iter().filter(|&&p| p == best).count();
    (first, count > 1)
}

/// The one readout rule: what a decision serves from its options' logits
/// at temperature `t`. Answers (letters or an intent head's), certificates,
/// prediction sets and task reports all read an answer through it, so a
/// certificate's confidence is the confidence served.
#[derive(Clone, Debug, PartialEq)]
pub struct Readout {
    /// `softmax(logits / t)`, in f64, as computed.
    pub exact: Vec<f64>,
    /// The same probabilities stored as f32, as answers serve them.
    pub probabilities: Vec<f32>,
    /// The served option: the argmax of the f32 probabilities, the earliest
    /// among exact equals.
    pub top: usize,
    /// The top probability was shared.
    pub tie: bool,
}

impl Readout {
    /// Reads `logits` at temperature `t`.
    pub fn of(logits: &[f32], t: f64) -> Self {
        let exact = softmax(logits, t);
        let probabilities: Vec<f32> = exact.iter().map(|&p| p as f32).collect();
        let (top, tie) = top_option(&probabilities);
        Self {
            exact,
            probabilities,
            top,
            tie,
        }
    }

    /// The served option's probability, in f64.
    pub fn confidence(&self) -> f64 {
        self.exact.get(self.top).copied().unwrap_or(0.0)
    }
}

/// `order[p]`: the option at position `p` in rotation `r` of `k` of `n`
/// options (rotation 0 is the order given; offsets `⌊r·n/k⌋`, as the
/// reference decisio's `cyclic_order` spaces them).
pub fn rotation(n: usize, r: usize, k: usize) -> Vec<usize> {
    let offset = r * n / k;
    (0..n).map(|p| (p + offset) % n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readout_serves_the_argmax_of_its_f32_probabilities() {
        // Two logits whose f64 probabilities differ below f32's precision
        // round to the same f32: the earliest is served, as a tie.
        let r = Readout::of(&[0.0, 1e-9, -3.0], 1.0);
        assert_eq!(r.probabilities[0], r.probabilities[1]);
        assert!(r.exact[1] > r.exact[0]);
        assert_eq!((r.top, r.tie), (0, true));
        assert_eq!(r.confidence(), r.exact[0]);
        let r = Readout::of(&[0.0, 2.0, 1.0], 0.5);
        assert_eq!((r.top, r.tie), (1, false));
        assert_eq!(r.exact, softmax(&[0.0, 2.0, 1.0], 0.5));
    }

    #[test]
    fn softmax_and_log_softmax_agree_and_do_not_overflow() {
        let logits = [1000.0f32, 999.0, -5.0];
        let p = softmax(&logits, 1.0);
        let lp = log_softmax(&logits, 1.0);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        for (p, lp) in p.iter().zip(&lp) {
            assert!(lp.is_finite());
            assert!((p - lp.exp()).abs() < 1e-12, "{p} vs {}", lp.exp());
        }
        let z = [1000.0, 1000.0];
        assert!((log_sum_exp(&z) - (1000.0 + 2f64.ln())).abs() < 1e-12);
        // The temperature divides the logits.
        assert_eq!(softmax(&[2.0, 0.0], 2.0), softmax(&[1.0, 0.0], 1.0));
    }
}
