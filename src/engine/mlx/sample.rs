//! Choosing the next token from log-probabilities, and reading the top
//! alternatives, on the host (the vocabulary row is copied out once per step).

use crate::engine::{Sampling, TokenLogprobs};

/// The sampling generator: one per job, so a seed fixes the draw regardless
/// of what else the engine serves.
pub type Rng = crate::rng::SplitMix;

/// The index of the largest value (the lowest index among equals).
pub fn argmax(logprobs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logprobs.iter().enumerate() {
        if v > logprobs[best] {
            best = i;
        }
    }
    best as u32
}

/// Draws a token: greedy at temperature 0, else from the tempered
/// distribution restricted to the top-p nucleus.
pub fn pick(logprobs: &[f32], sampling: &Sampling, rng: &mut Rng) -> u32 {
    if sampling.temperature <= 0.0 {
        return argmax(logprobs);
    }
    let inv_t = 1.0 / f64::from(sampling.temperature);
    let max = logprobs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut weights: Vec<(u32, f64)> = logprobs
        .iter()
        .enumerate()
        .map(|(i, &lp)| (i as u32, ((lp as f64 - max) * inv_t).exp()))
        .filter(|&(_, w)| w > 0.0)
        .collect();
    let total: f64 = weights.iter().map(|w| w.1).sum();
    if sampling.top_p < 1.0 {
        weights.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut kept = 0.0;
        let mut n = 0;
        for w in &weights {
            kept += w.1;
            n += 1;
            if kept >= f64::from(sampling.top_p) * total {
                break;
            }
        }
        weights.truncate(n.max(1));
    }
    let total: f64 = weights.iter().map(|w| w.1).sum();
    let mut target = rng.next_f64() * total;
    for &(id, w) in &weights {
        if target < w {
            return id;
        }
        target -= w;
    }
    weights.last().map_or(0, |w| w.0)
}

/// The token's log-probability and the `k` most likely tokens.
pub fn token_logprobs(logprobs: &[f32], token: u32, k: usize) -> TokenLogprobs {
    TokenLogprobs {
        logprob: logprobs[token as usize],
        top: top_k(logprobs, k),
    }
}

/// The token's log-probability and those of the named ids, in their order
/// (an id outside the vocabulary is left out; the server checks ids first).
pub fn named_logprobs(logprobs: &[f32], token: u32, ids: &[u32]) -> TokenLogprobs {
    TokenLogprobs {
        logprob: logprobs[token as usize],
        top: ids
            .iter()
            .filter_map(|&id| logprobs.get(id as usize).map(|&v| (id, v)))
            .collect(),
    }
}

/// The `k` largest entries, descending, ties by lower id.
pub fn top_k(values: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut all: Vec<(u32, f32)> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    all.select_nth_unstable_by(k - 1, order);
    all.truncate(k);
    all.sort_by(order);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_breaks_ties_by_id() {
        let v = [0.1, 0.5, 0.5, -1.0, 0.9];
        assert_eq!(top_k(&v, 3), vec![(4, 0.9), (1, 0.5), (2, 0.5)]);
        assert_eq!(top_k(&v, 0), vec![]);
        assert_eq!(top_k(&v, 10).len(), 5);
    }

    #[test]
    fn greedy_and_seeded_sampling() {
        let lp = [-3.0f32, -0.1, -2.5, -4.0];
        let greedy = Sampling {
            temperature: 0.0,
            ..Sampling::default()
        };
        assert_eq!(pick(&lp, &greedy, &mut Rng::new(1)), 1);
        let s = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            seed: Some(7),
        };
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..50).map(|_| pick(&lp, &s, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // A nucleus of 0.5 keeps only the most likely token here.
        let nucleus = Sampling { top_p: 0.5, ..s };
        let mut rng = Rng::new(3);
        assert!((0..100).all(|_| pick(&lp, &nucleus, &mut rng) == 1));
    }
}
