//! Trust records: certified answers and prediction sets measured over
//! repeated draws of answers a server gave to examples never used to fit
//! its tasks (`scripts/bench/trust.py` asks them, `examples/trust_draws.rs`
//! draws them), and the gates `decisio gate` puts on them.
//!
//! Each draw splits a task's pool into a calibration half and a test half
//! (seeded), certifies on the first with decisio's own Learn-then-Test
//! ([`crate::stats::certify`]) and calibrates split-conformal sets
//! ([`crate::stats::conformal`]), and measures the second: the share
//! certified, the error among certified answers (the promise *held* on a
//! draw when it was at most `alpha`, or nothing was certified), and each
//! set level's coverage and size.
//!
//! The gates, on a candidate's `trust.json` beside its run record:
//! - *coverage*, per task and score: every level's mean coverage at least
//!   the level less `spread` binomial standard deviations of one test half;
//! - *promise*, per task: at every alpha, the share of draws where the
//!   promise held at least `1 − delta` less `spread` binomial standard
//!   deviations over the draws;
//! - *certified share*, per task, against the reference's `trust.json`:
//!   at every alpha, the candidate's mean share at least the reference's
//!   less `certified_share`.

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::outcome::Outcome;
use crate::rng::SplitMix;
use crate::stats::conformal::{self, Score};
use crate::stats::{certify, mean_sd, top_option};

/// The trust record's file, beside a run record.
pub const TRUST_FILE: &str = "trust.json";

/// A task's answered pool: each example's probabilities as served, and its
/// gold option.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Pool {
    pub name: String,
    pub probabilities: Vec<Vec<f64>>,
    pub labels: Vec<usize>,
}

/// What to draw.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DrawSpec {
    pub alphas: Vec<f64>,
    pub delta: f64,
    pub coverages: Vec<f64>,
    pub draws: usize,
    pub seed: u64,
}

/// Certified answers at one alpha, over the draws.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Certified {
    pub alpha: f64,
    pub certified_share_mean: f64,
    /// Over the draws that certified something.
    pub error_among_certified_mean: Option<f64>,
    pub error_among_certified_max: Option<f64>,
    pub promise_held: f64,
    pub nothing_certified: f64,
}

/// Prediction sets at one level and score, over the draws.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Covered {
    pub score: Score,
    pub level: f64,
    /// Draws whose calibration half could calibrate this level.
    pub draws: usize,
    pub coverage_mean: f64,
    pub coverage_sd: f64,
    pub size_mean: f64,
}

/// One task's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskDraws {
    pub name: String,
    pub examples: usize,
    pub calibration: usize,
    pub test: usize,
    /// The pool's accuracy as served.
    pub accuracy: f64,
    pub certified: Vec<Certified>,
    pub coverage: Vec<Covered>,
}

/// A trust record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrustRecord {
    pub draws: usize,
    pub delta: f64,
    pub tasks: Vec<TaskDraws>,
}

/// Draws one task's pool.
fn draw_task(pool: &Pool, spec: &DrawSpec) -> TaskDraws {
    let n = pool.labels.len();
    let answers: Vec<(usize, f64)> = pool
        .probabilities
        .iter()
        .map(|p| {
            let f: Vec<f32> = p.iter().map(|&v| v as f32).collect();
            let top = top_option(&f).0;
            (top, p[top])
        })
        .collect();
    let right = |i: usize| answers[i].0 == pool.labels[i];
    let mut cert = vec![(vec![], vec![], 0usize, 0usize); spec.alphas.len()];
    let scores = [Score::Lac, Score::Aps];
    let mut sets = vec![vec![(vec![], vec![]); spec.coverages.len()]; scores.len()];
    for d in 0..spec.draws {
        let mut order: Vec<usize> = (0..n).collect();
        SplitMix::new(spec.seed.wrapping_add(d as u64)).shuffle(&mut order);
        let (cal, test) = order.split_at(n / 2);
        let conf: Vec<f64> = cal.iter().map(|&i| answers[i].1).collect();
        let correct: Vec<bool> = cal.iter().map(|&i| right(i)).collect();
        for (c, &alpha) in cert.iter_mut().zip(&spec.alphas) {
            let t = certify::threshold(&conf, &correct, alpha, spec.delta);
            let served: Vec<usize> = test
                .iter()
                .copied()
                .filter(|&i| answers[i].1 >= t)
                .collect();
            c.0.push(served.len() as f64 / test.len().max(1) as f64);
            if served.is_empty() {
                c.2 += 1;
                c.3 += 1;
            } else {
                let err =
                    served.iter().filter(|&&i| !right(i)).count() as f64 / served.len() as f64;
                c.1.push(err);
                c.2 += usize::from(err <= alpha + 1e-12);
            }
        }
        let cal_p: Vec<Vec<f64>> = cal.iter().map(|&i| pool.probabilities[i].clone()).collect();
        let cal_y: Vec<usize> = cal.iter().map(|&i| pool.labels[i]).collect();
        for (per, &score) in sets.iter_mut().zip(&scores) {
            for (s, &level) in per.iter_mut().zip(&spec.coverages) {
                let Ok(thr) = conformal::calibrate(score, &cal_p, &cal_y, 1.0 - level) else {
                    continue;
                };
                let (mut hit, mut size) = (0usize, 0usize);
                for &i in test {
                    let set = conformal::prediction_set(score, &pool.probabilities[i], thr);
                    hit += usize::from(set.contains(&pool.labels[i]));
                    size += set.len();
                }
                s.0.push(hit as f64 / test.len() as f64);
                s.1.push(size as f64 / test.len() as f64);
            }
        }
    }
    let draws = spec.draws.max(1) as f64;
    TaskDraws {
        name: pool.name.clone(),
        examples: n,
        calibration: n / 2,
        test: n - n / 2,
        accuracy: (0..n).filter(|&i| right(i)).count() as f64 / n.max(1) as f64,
        certified: spec
            .alphas
            .iter()
            .zip(&cert)
            .map(|(&alpha, (share, err, held, none))| Certified {
                alpha,
                certified_share_mean: mean_sd(share).0,
                error_among_certified_mean: (!err.is_empty()).then(|| mean_sd(err).0),
                error_among_certified_max: err.iter().copied().reduce(f64::max),
                promise_held: *held as f64 / draws,
                nothing_certified: *none as f64 / draws,
            })
            .collect(),
        coverage: scores
            .iter()
            .zip(&sets)
            .flat_map(|(&score, per)| {
                spec.coverages
                    .iter()
                    .zip(per)
                    .map(move |(&level, (cov, size))| {
                        let (coverage_mean, coverage_sd) = mean_sd(cov);
                        Covered {
                            score,
                            level,
                            draws: cov.len(),
                            coverage_mean,
                            coverage_sd,
                            size_mean: mean_sd(size).0,
                        }
                    })
            })
            .collect(),
    }
}

/// The trust record of answered pools.
pub fn draw(pools: &[Pool], spec: &DrawSpec) -> TrustRecord {
    TrustRecord {
        draws: spec.draws,
        delta: spec.delta,
        tasks: pools.iter().map(|p| draw_task(p, spec)).collect(),
    }
}

impl TrustRecord {
    /// The trust record beside a run record (its folder, or the folder of
    /// its record.json); `None` when there is none.
    pub fn beside(record: &Path) -> Result<Option<TrustRecord>> {
        super::record::read_beside(record, TRUST_FILE, "a trust record")
    }
}

/// The trust gates' settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrustGate {
    /// How far the candidate's mean certified share may fall below the
    /// reference's, at any alpha.
    pub certified_share: f64,
    /// Binomial standard deviations a coverage or a promise may fall
    /// short by.
    pub spread: f64,
}

impl Default for TrustGate {
    fn default() -> Self {
        TrustGate {
            certified_share: 0.05,
            spread: 2.0,
        }
    }
}

/// The trust gates of a candidate's record (and the reference's, for the
/// certified share).
pub fn outcomes(c: &TrustRecord, r: Option<&TrustRecord>, g: &TrustGate) -> Vec<Outcome> {
    let mut out = Vec::new();
    for t in &c.tasks {
        for score in [Score::Lac, Score::Aps] {
            let levels: Vec<&Covered> = t
                .coverage
                .iter()
                .filter(|c| c.score == score && c.draws > 0)
                .collect();
            // A level's line: `spread` standard errors of the mean of its
            // draws below the level (the draws' own spread, or one draw's
            // binomial spread if that is larger), and the level furthest
            // below its line.
            let line_of = |c: &Covered| {
                let binomial = (c.level * (1.0 - c.level) / t.test as f64).sqrt();
                c.level - g.spread * c.coverage_sd.max(binomial) / (c.draws as f64).sqrt()
            };
            let worst = levels.iter().min_by(|a, b| {
                let margin = |c: &Covered| c.coverage_mean - line_of(c);
                margin(a).total_cmp(&margin(b))
            });
            if let Some(w) = worst {
                let line = line_of(w);
                out.push(Outcome {
                    gate: format!("coverage {} ({})", t.name, score.as_str()),
                    candidate: format!("{:.4}", w.coverage_mean),
                    reference: format!("{}", w.level),
                    difference: format!(
                        "{:+.4} at level {} (worst of {} levels)",
                        w.coverage_mean - w.level,
                        w.level,
                        levels.len()
                    ),
                    tolerance: format!(
                        ">= {line:.4} ({} standard errors of the mean of {} draws)",
                        g.spread, w.draws
                    ),
                    pass: w.coverage_mean >= line - 1e-12,
                });
            }
        }
        let rt = r.and_then(|r| r.tasks.iter().find(|x| x.name == t.name));
        if !t.certified.is_empty() {
            out.push(promise(c, t, rt, g));
        }
        let Some(rt) = rt else {
            continue;
        };
        let pairs: Vec<(&Certified, &Certified)> = t
            .certified
            .iter()
            .filter_map(|a| Some((a, rt.certified.iter().find(|b| b.alpha == a.alpha)?)))
            .collect();
        if let Some((a, b)) = pairs.iter().min_by(|x, y| {
            (x.0.certified_share_mean - x.1.certified_share_mean)
                .total_cmp(&(y.0.certified_share_mean - y.1.certified_share_mean))
        }) {
            let d = a.certified_share_mean - b.certified_share_mean;
            out.push(Outcome {
                gate: format!("certified share {}", t.name),
                candidate: format!("{:.4}", a.certified_share_mean),
                reference: format!("{:.4}", b.certified_share_mean),
                difference: format!("{d:+.4} at alpha {} (worst of {})", a.alpha, pairs.len()),
                tolerance: format!(">= -{}", g.certified_share),
                pass: d >= -g.certified_share - 1e-12,
            });
        }
    }
    out
}

/// The certified promise's gate of task `t`: at the alpha where it held
/// least often, over the alphas where some draw certified an answer. A
/// task that certified nothing at any alpha has no promise to check: it
/// passes only where the reference's record certifies nothing for it
/// either (`rt`, the reference's figures of the task), and fails without
/// a reference.
fn promise(c: &TrustRecord, t: &TaskDraws, rt: Option<&TaskDraws>, g: &TrustGate) -> Outcome {
    let line = (1.0 - c.delta) - g.spread * (c.delta * (1.0 - c.delta) / c.draws as f64).sqrt();
    let gate = format!("certified promise {}", t.name);
    let certifying = t.certified.iter().filter(|a| a.certified_share_mean > 0.0);
    match certifying.min_by(|a, b| a.promise_held.total_cmp(&b.promise_held)) {
        Some(w) => Outcome {
            gate,
            candidate: format!("{:.4}", w.promise_held),
            reference: format!("{}", 1.0 - c.delta),
            difference: format!("at alpha {} (worst of {})", w.alpha, t.certified.len()),
            tolerance: format!(
                ">= {line:.4} ({} binomial sd of {} draws)",
                g.spread, c.draws
            ),
            pass: w.promise_held >= line - 1e-12,
        },
        None => {
            let none_there =
                rt.is_some_and(|rt| rt.certified.iter().all(|a| a.certified_share_mean == 0.0));
            Outcome {
                gate,
                candidate: "nothing certified".into(),
                reference: match rt {
                    Some(_) if none_there => "nothing certified".into(),
                    Some(_) => "some certified".into(),
                    None => "none".into(),
                },
                difference: format!("at every alpha of {}", t.certified.len()),
                tolerance: "a promise to check, or none in the reference either".into(),
                pass: none_there,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool whose answers are right with the probability they state.
    fn calibrated(n: usize, seed: u64) -> Pool {
        let mut rng = SplitMix::new(seed);
        let mut probabilities = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..n {
            let top = 0.4 + 0.6 * rng.next_f64();
            let rest = (1.0 - top) / 3.0;
            probabilities.push(vec![top, rest, rest, rest]);
            labels.push(if rng.next_f64() < top {
                0
            } else {
                1 + rng.below(3) as usize
            });
        }
        Pool {
            name: "calibrated".into(),
            probabilities,
            labels,
        }
    }

    fn spec() -> DrawSpec {
        DrawSpec {
            alphas: vec![0.2, 0.3],
            delta: 0.1,
            coverages: vec![0.8, 0.9],
            draws: 200,
            seed: 1,
        }
    }

    #[test]
    fn promises_hold_and_sets_cover_on_a_calibrated_pool() {
        let record = draw(&[calibrated(600, 3)], &spec());
        let t = &record.tasks[0];
        for c in &t.certified {
            assert!(c.promise_held >= 0.85, "{c:?}");
        }
        assert!(
            t.certified[1].certified_share_mean > 0.3,
            "{:?}",
            t.certified
        );
        // LAC near its level; APS at least at it (the three tied options
        // enter its sets together).
        for c in &t.coverage {
            assert!(c.coverage_mean >= c.level - 0.02, "{c:?}");
            if c.score == Score::Lac {
                assert!(c.coverage_mean < c.level + 0.03, "{c:?}");
            }
        }
        let gates = outcomes(&record, Some(&record), &TrustGate::default());
        assert_eq!(gates.len(), 4);
        assert!(gates.iter().all(|o| o.pass), "{gates:?}");
        // The same bits again.
        assert_eq!(draw(&[calibrated(600, 3)], &spec()), record);
    }

    #[test]
    fn a_task_that_certifies_nothing_has_no_promise_to_pass() {
        let reference = draw(&[calibrated(600, 3)], &spec());
        let mut nothing = reference.clone();
        for a in &mut nothing.tasks[0].certified {
            (a.certified_share_mean, a.promise_held, a.nothing_certified) = (0.0, 1.0, 1.0);
        }
        let promise = |c: &TrustRecord, r: Option<&TrustRecord>| {
            let gates = outcomes(c, r, &TrustGate::default());
            let o = gates
                .into_iter()
                .find(|o| o.gate.starts_with("certified promise"));
            o.expect("a promise gate")
        };
        // Alone, or beside a reference that certifies: it fails.
        assert!(!promise(&nothing, None).pass);
        assert!(!promise(&nothing, Some(&reference)).pass);
        // Beside a reference that certifies nothing either: it passes.
        let o = promise(&nothing, Some(&nothing));
        assert!(o.pass, "{o:?}");
        assert_eq!(o.candidate, "nothing certified");
        // An alpha that certified nothing does not hide a broken promise
        // at one that did.
        let mut broken = reference.clone();
        broken.tasks[0].certified[0].certified_share_mean = 0.0;
        broken.tasks[0].certified[1].promise_held = 0.5;
        assert!(!promise(&broken, None).pass);
    }

    #[test]
    fn a_shrunk_share_and_a_short_coverage_fail() {
        let reference = draw(&[calibrated(600, 3)], &spec());
        let mut candidate = reference.clone();
        candidate.tasks[0].certified[1].certified_share_mean -= 0.2;
        candidate.tasks[0].coverage[1].coverage_mean -= 0.1;
        candidate.tasks[0].certified[0].promise_held = 0.5;
        let gates = outcomes(&candidate, Some(&reference), &TrustGate::default());
        let failed: Vec<&str> = gates
            .iter()
            .filter(|o| !o.pass)
            .map(|o| o.gate.as_str())
            .collect();
        assert_eq!(
            failed,
            [
                "coverage calibrated (lac)",
                "certified promise calibrated",
                "certified share calibrated"
            ],
            "{gates:?}"
        );
    }
}
