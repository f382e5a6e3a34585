//! The softmax family over a question's options, in f64: logits divided by
//! a temperature, shifted by their maximum so that no term overflows; and
//! the argmax a decision serves.

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
