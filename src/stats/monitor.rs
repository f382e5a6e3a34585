//! The traffic monitor of a certified task: does the traffic still look
//! like the examples the certificate was made on?
//!
//! A certificate's promise holds for traffic like its held-out examples.
//! Two signals watch the answers a task serves, never their texts:
//!
//! - *answer mix*: the options chosen by the last [`WINDOW`] answers,
//!   compared every [`STEP`] answers (once the window is full) with the
//!   examples' chosen options by total variation distance. The alert line
//!   is the [`LINE_QUANTILE`] quantile of the same distance between two
//!   resamples of the examples' choices, one of the examples' size and one
//!   of a window's ([`DRAWS`] seeded draws): a window of the same traffic
//!   is a sample too and does not match exactly.
//! - *confidence*: a CUSUM on how often an answer's top probability falls
//!   below the examples' [`TAIL_QUANTILE`] quantile. With `p0` the
//!   examples' share below it, a share of [`OK_FACTOR`]` × p0` is normal and
//!   [`BAD_FACTOR`]` × p0` an alarm; the statistic adds the log-likelihood
//!   ratio of the two after every answer, floored at 0 and held at
//!   [`CAP`] times the limit. The limit is the smallest at which a normal
//!   stream alarms within [`HORIZON`] answers with probability at most
//!   [`FALSE_ALARM`] ([`RUNS`] seeded streams); an alarm clears when the
//!   statistic falls under half the limit. Shifts the answer mix cannot
//!   see (messages of no option, spread over many) show here as lower
//!   confidences.
//!
//! The constants are the reference decisio's (`decisio/serve/monitor.py`),
//! so that a task certified there alarms here on the same traffic.

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix;

pub const WINDOW: usize = 500;
pub const STEP: usize = 100;
pub const LINE_QUANTILE: f64 = 0.999;
pub const DRAWS: usize = 2000;
pub const TAIL_QUANTILE: f64 = 0.05;
pub const OK_FACTOR: f64 = 1.3;
pub const BAD_FACTOR: f64 = 2.5;
pub const HORIZON: usize = 5000;
pub const FALSE_ALARM: f64 = 0.01;
pub const RUNS: usize = 4000;
pub const CAP: f64 = 1.5;

/// Fewest examples the confidence signal is set from.
pub const MIN_CONFIDENCES: usize = 20;

/// What the monitor compares traffic with, fixed when the certificate is
/// made and kept with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub window: usize,
    pub step: usize,
    /// How many of the examples chose each option.
    pub option_counts: Vec<usize>,
    /// The answer mix's alert line (a total variation distance).
    pub line: f64,
    /// The confidence signal, when the examples support one.
    pub confidence: Option<ConfidenceBaseline>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfidenceBaseline {
    /// An answer whose top probability is below this is in the tail.
    pub tail_threshold: f64,
    /// The examples' share in the tail.
    pub tail_share: f64,
    pub p_ok: f64,
    pub p_bad: f64,
    /// The CUSUM's alarm limit.
    pub limit: f64,
}

/// Linear-interpolated quantile of `values` (sorted here), as numpy's
/// default.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let pos = q * (values.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    values[lo] + (values[hi] - values[lo]) * (pos - lo as f64)
}

/// Total variation distance between two count vectors' mixes.
pub fn distance(a: &[usize], b: &[usize]) -> f64 {
    let (sa, sb) = (
        a.iter().sum::<usize>() as f64,
        b.iter().sum::<usize>() as f64,
    );
    if sa == 0.0 || sb == 0.0 {
        return 0.0;
    }
    0.5 * a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 / sa - y as f64 / sb).abs())
        .sum::<f64>()
}

fn resample_counts(codes: &[usize], k: usize, size: usize, rng: &mut SplitMix) -> Vec<usize> {
    let mut counts = vec![0; k];
    for _ in 0..size {
        counts[codes[rng.below(codes.len() as u64) as usize]] += 1;
    }
    counts
}

/// The answer mix's alert line for examples whose chosen options are
/// `codes` (each below `k`).
pub fn alert_line(codes: &[usize], k: usize, seed: u64) -> f64 {
    let mut rng = SplitMix::new(seed);
    let mut d: Vec<f64> = (0..DRAWS)
        .map(|_| {
            let w = resample_counts(codes, k, WINDOW, &mut rng);
            let c = resample_counts(codes, k, codes.len(), &mut rng);
            distance(&w, &c)
        })
        .collect();
    quantile(&mut d, LINE_QUANTILE)
}

/// The CUSUM limit for a normal tail share `p_ok` against `p_bad`.
pub fn cusum_limit(p_ok: f64, p_bad: f64, seed: u64) -> f64 {
    let (up, down) = ((p_bad / p_ok).ln(), ((1.0 - p_bad) / (1.0 - p_ok)).ln());
    let mut rng = SplitMix::new(seed ^ 0xC05C_0C05_C0C0_5C05);
    // Before its first alarm a stream is never capped (the cap is above
    // the limit), so its highest statistic tells whether it alarmed.
    let mut tops: Vec<f64> = (0..RUNS)
        .map(|_| {
            let (mut s, mut top) = (0.0f64, 0.0f64);
            for _ in 0..HORIZON {
                s = (s + if rng.next_f64() < p_ok { up } else { down }).max(0.0);
                top = top.max(s);
            }
            top
        })
        .collect();
    quantile(&mut tops, 1.0 - FALSE_ALARM)
}

/// The monitor's baseline for examples that chose `codes` (of `k`
/// options) with top probabilities `conf`.
pub fn baseline(codes: &[usize], k: usize, conf: &[f64], seed: u64) -> Baseline {
    let mut option_counts = vec![0; k];
    for &c in codes {
        option_counts[c] += 1;
    }
    let confidence = (conf.len() >= MIN_CONFIDENCES)
        .then(|| {
            let tail_threshold = quantile(&mut conf.to_vec(), TAIL_QUANTILE);
            let below = conf.iter().filter(|&&c| c < tail_threshold).count();
            let p0 = (below as f64 / conf.len() as f64).max(1.0 / conf.len() as f64);
            let (p_ok, p_bad) = (OK_FACTOR * p0, BAD_FACTOR * p0);
            (p_bad <= 0.5).then(|| ConfidenceBaseline {
                tail_threshold,
                tail_share: p0,
                p_ok,
                p_bad,
                limit: cusum_limit(p_ok, p_bad, seed),
            })
        })
        .flatten();
    Baseline {
        window: WINDOW,
        step: STEP,
        line: if codes.is_empty() {
            1.0
        } else {
            alert_line(codes, k, seed)
        },
        option_counts,
        confidence,
    }
}

/// What the monitor has seen of a task's traffic (since the server
/// started: the counts live in memory).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Facts {
    /// `ok` or `traffic_changed`.
    pub state: &'static str,
    /// The signals alerting: `answer_mix`, `confidence`.
    pub signals: Vec<&'static str>,
    pub answers: u64,
    pub certified_answers: u64,
    pub window_answers: usize,
    /// The last full window's distance, and the line it is held to.
    pub distance: Option<f64>,
    pub line: f64,
    pub alerts: u64,
    /// The confidence CUSUM and its limit, when the signal runs.
    pub statistic: Option<f64>,
    pub limit: Option<f64>,
    pub confidence_alerts: u64,
}

/// One task's window and statistic.
#[derive(Clone, Debug)]
pub struct Monitor {
    base: Baseline,
    ring: std::collections::VecDeque<usize>,
    counts: Vec<usize>,
    answers: u64,
    certified: u64,
    checked_at: u64,
    distance: Option<f64>,
    mix_alerting: bool,
    alerts: u64,
    statistic: f64,
    conf_alerting: bool,
    conf_alerts: u64,
}

impl Monitor {
    pub fn new(base: Baseline) -> Self {
        let k = base.option_counts.len();
        Monitor {
            ring: std::collections::VecDeque::with_capacity(base.window),
            counts: vec![0; k],
            base,
            answers: 0,
            certified: 0,
            checked_at: 0,
            distance: None,
            mix_alerting: false,
            alerts: 0,
            statistic: 0.0,
            conf_alerting: false,
            conf_alerts: 0,
        }
    }

    /// The confidence signal is alerting: certification is suspended.
    pub fn confidence_alerting(&self) -> bool {
        self.conf_alerting
    }

    /// Counts one answer: its chosen option, whether it was certified and
    /// its top probability.
    pub fn observe(&mut self, chosen: usize, certified: bool, confidence: f64) {
        if chosen >= self.counts.len() {
            return;
        }
        if self.ring.len() == self.base.window {
            if let Some(old) = self.ring.pop_front() {
                self.counts[old] -= 1;
            }
        }
        self.ring.push_back(chosen);
        self.counts[chosen] += 1;
        self.answers += 1;
        self.certified += certified as u64;
        if self.ring.len() == self.base.window
            && self.answers - self.checked_at >= self.base.step as u64
        {
            self.checked_at = self.answers;
            let d = distance(&self.counts, &self.base.option_counts);
            self.distance = Some(d);
            self.mix_alerting = d > self.base.line;
            self.alerts += self.mix_alerting as u64;
        }
        if let Some(c) = &self.base.confidence {
            let step = if confidence < c.tail_threshold {
                (c.p_bad / c.p_ok).ln()
            } else {
                ((1.0 - c.p_bad) / (1.0 - c.p_ok)).ln()
            };
            self.statistic = (self.statistic + step).max(0.0).min(CAP * c.limit);
            if self.statistic > c.limit {
                self.conf_alerts += !self.conf_alerting as u64;
                self.conf_alerting = true;
            } else if self.statistic < c.limit / 2.0 {
                self.conf_alerting = false;
            }
        }
    }

    pub fn facts(&self) -> Facts {
        let signals: Vec<&'static str> = [
            ("answer_mix", self.mix_alerting),
            ("confidence", self.conf_alerting),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect();
        Facts {
            state: if signals.is_empty() {
                "ok"
            } else {
                "traffic_changed"
            },
            signals,
            answers: self.answers,
            certified_answers: self.certified,
            window_answers: self.ring.len(),
            distance: self.distance,
            line: self.base.line,
            alerts: self.alerts,
            statistic: self.base.confidence.as_ref().map(|_| self.statistic),
            limit: self.base.confidence.as_ref().map(|c| c.limit),
            confidence_alerts: self.conf_alerts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(counts: &[usize]) -> Vec<usize> {
        counts
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| std::iter::repeat_n(i, n))
            .collect()
    }

    #[test]
    fn traffic_like_the_examples_stays_quiet_and_a_shift_alerts() {
        let examples = codes(&[60, 30, 10]);
        let conf: Vec<f64> = (0..100).map(|i| 0.5 + 0.005 * i as f64).collect();
        let base = baseline(&examples, 3, &conf, 7);
        assert!(base.line > 0.0 && base.line < 0.2, "line {}", base.line);
        let c = base
            .confidence
            .clone()
            .expect("100 confidences set the signal");
        assert!(c.limit > 0.0);
        // The examples' own mix, again and again: no alert.
        let mut m = Monitor::new(base.clone());
        let mut rng = SplitMix::new(3);
        for _ in 0..3000 {
            let i = rng.below(100) as usize;
            m.observe(examples[i], true, conf[i]);
        }
        assert_eq!(m.facts().state, "ok", "{:?}", m.facts());
        // Every answer the rarest option, less sure: both signals.
        for _ in 0..600 {
            m.observe(2, false, 0.4);
        }
        let f = m.facts();
        assert_eq!(f.signals, vec!["answer_mix", "confidence"], "{f:?}");
        assert!(m.confidence_alerting());
        // Back to normal: the confidence alarm clears.
        for _ in 0..2000 {
            let i = rng.below(100) as usize;
            m.observe(examples[i], true, conf[i]);
        }
        assert!(!m.confidence_alerting(), "{:?}", m.facts());
    }

    #[test]
    fn distance_is_total_variation() {
        assert_eq!(distance(&[1, 1], &[2, 2]), 0.0);
        assert!((distance(&[1, 0], &[0, 1]) - 1.0).abs() < 1e-12);
        assert!((distance(&[3, 1], &[1, 1]) - 0.25).abs() < 1e-12);
    }
}
