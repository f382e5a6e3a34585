//! A task's certificate: which of its answers carry a promise, and why an
//! answer does not.
//!
//! A task registered with `certify` is split by [`hash_split`] into fit and
//! held-out examples; on the held-out side, at the served temperature, the
//! threshold on the top probability is chosen by Learn-then-Test
//! ([`crate::stats::certify`]): with probability at least `1 − delta`, at
//! most `alpha` of the answers at or above it are wrong, for traffic like
//! the examples and on the serving [`Stack`] it was made on. Each answer of
//! the task then gets a [`Verdict`]; a [`Monitor`](crate::stats::monitor)
//! of the traffic suspends certification when the answers' confidences
//! move away from the examples'.
//!
//! The settings, their defaults and the split follow the reference
//! decisio (`decisio/serve/systemone.py`, `certify_settings`,
//! `certification_split`; `decisio/serve/tasks.py`, `split_holdout`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::TaskSpec;
use crate::stats::certify;
use crate::stats::monitor::{self, Baseline};
use crate::stats::Readout;

/// The defaults of a `certify` block.
pub const DEFAULT_ALPHA: f64 = 0.05;
pub const DEFAULT_DELTA: f64 = 0.1;
/// The share of the examples held out to certify on, when a certified
/// registration names none.
pub const DEFAULT_HOLDOUT: f64 = 0.5;

/// The procedure's name, as certificates state it.
pub const PROCEDURE: &str = "learn-then-test: fixed-sequence and Bonferroni arms at delta/2 each, \
     one-sided Clopper-Pearson upper bounds";

/// How the examples were split, in words.
pub const HOLDOUT_RULE: &str = "examples with the same input go to the same side; groups are \
     ordered by the sha256 of the task name and the input and the first ones, up to the held-out \
     share, certify; the fit sees the rest";

/// How certification examples were chosen when supplied apart from the
/// fit's.
pub const SUPPLIED_RULE: &str = "the certification examples were supplied separately and share \
     no input with the fit examples";

/// How certification examples were chosen when sent to certify a ready
/// task again.
pub const RECERTIFIED_RULE: &str = "certified again on new examples that share no input with the \
     fit examples";

/// Where a certificate's examples came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The registration's held-out side ([`hash_split`]).
    Holdout,
    /// Examples sent with the registration apart from the fit's
    /// (`certify.examples`).
    Supplied,
    /// Examples sent to `POST /v1/tasks/{id}/certify` once the task was
    /// ready.
    Recertified,
}

/// A registration's `certify` block, validated.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CertifySpec {
    pub alpha: f64,
    pub delta: f64,
    /// The fewest held-out examples the registration takes: the larger of
    /// the client's `min_examples` and [`certify::minimum_examples`].
    pub min_examples: usize,
    /// Certification stops while the confidence signal alerts.
    pub suspend_on_alert: bool,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The fit and held-out indices of examples whose inputs are `inputs`:
/// equal inputs go to the same side; groups of equal inputs are ordered by
/// the sha256 of `task` and the input's digest, and the first groups, until
/// `round(share · n)` examples, are held out. The split depends on neither
/// the examples' order nor their labels.
pub fn hash_split(task: &str, inputs: &[String], share: f64) -> (Vec<usize>, Vec<usize>) {
    let mut groups: std::collections::HashMap<String, Vec<usize>> = Default::default();
    for (i, input) in inputs.iter().enumerate() {
        groups
            .entry(sha256_hex(input.as_bytes()))
            .or_default()
            .push(i);
    }
    let mut order: Vec<(String, Vec<usize>)> = groups
        .into_iter()
        .map(|(d, idx)| (sha256_hex(format!("{task}{d}").as_bytes()), idx))
        .collect();
    order.sort();
    let target = (share * inputs.len() as f64).round() as usize;
    let mut held = Vec::new();
    for (_, idx) in order {
        if held.len() >= target {
            break;
        }
        held.extend(idx);
    }
    held.sort_unstable();
    let mut is_held = vec![false; inputs.len()];
    for &i in &held {
        is_held[i] = true;
    }
    let fit = (0..inputs.len()).filter(|&i| !is_held[i]).collect();
    (fit, held)
}

/// The certificate of a task registered with `certify`, on its held-out
/// rows (letter logits, or an intent head's) and labels at the served
/// temperature `t` (the held-out side, or examples supplied to certify
/// again: `method`); `None` for a task that did not ask for one.
pub fn of_holdout(
    spec: &TaskSpec,
    held_logits: &[Vec<f32>],
    held_labels: &[usize],
    t: f64,
    fit_examples: usize,
    stack: Stack,
    method: Method,
) -> Option<CertificateReport> {
    let c = spec.certify?;
    let (mut conf, mut chosen, mut correct) = (vec![], vec![], vec![]);
    for (l, &y) in held_logits.iter().zip(held_labels) {
        let read = Readout::of(l, t);
        conf.push(read.confidence());
        chosen.push(read.top);
        correct.push(read.top == y);
    }
    let (name, rule) = match method {
        Method::Holdout => ("holdout", HOLDOUT_RULE),
        Method::Supplied => ("supplied", SUPPLIED_RULE),
        Method::Recertified => ("supplied", RECERTIFIED_RULE),
    };
    let split = SplitFacts {
        method: name.into(),
        holdout: (method == Method::Holdout).then_some(spec.holdout),
        fit_examples,
        certify_examples: held_labels.len(),
        disjoint: true,
        rule: rule.into(),
    };
    Some(CertificateReport::make(
        &spec.name,
        c,
        &conf,
        &chosen,
        &correct,
        spec.labels.len(),
        split,
        stack,
    ))
}

/// What an answer's probabilities depend on beyond the task: a certificate
/// holds on the stack it was made on only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stack {
    /// The weights' identity.
    pub model: String,
    pub tokenizer: String,
    /// `MLX` or `vLLM`.
    pub backend: String,
    /// A digest of the prompt layout: the chat template and how System One
    /// questions are put.
    pub layout: String,
}

impl Stack {
    pub fn sha256(&self) -> String {
        sha256_hex(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    /// The parts that differ from `other`'s.
    pub fn differences(&self, other: &Stack) -> Vec<&'static str> {
        [
            ("model", self.model != other.model),
            ("tokenizer", self.tokenizer != other.tokenizer),
            ("backend", self.backend != other.backend),
            ("layout", self.layout != other.layout),
        ]
        .into_iter()
        .filter(|(_, d)| *d)
        .map(|(n, _)| n)
        .collect()
    }

    /// A layout digest of a chat template's source and the wire's settings.
    pub fn layout_of(template: &str, wire: &str) -> String {
        sha256_hex(format!("{template}\u{0}{wire}").as_bytes())[..16].to_string()
    }
}

/// How the held-out side was chosen.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitFacts {
    pub method: String,
    /// The held-out share (`None` for examples supplied apart).
    pub holdout: Option<f64>,
    pub fit_examples: usize,
    pub certify_examples: usize,
    pub disjoint: bool,
    pub rule: String,
}

/// A task's certificate, as its report and the task listings show it (the
/// reference's field names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CertificateReport {
    /// `<task name>#<12 hex digits>`: the task and what it was made on.
    pub id: String,
    pub procedure: String,
    pub alpha: f64,
    pub delta: f64,
    /// Held-out examples certified on.
    pub n: usize,
    pub accuracy: Option<f64>,
    /// Answers whose top probability is at least this are certified;
    /// `None` when nothing is.
    pub threshold: Option<f64>,
    pub certified: bool,
    pub certified_share: f64,
    pub certified_n: usize,
    pub errors_at_threshold: Option<usize>,
    pub error_rate_at_threshold: Option<f64>,
    /// The Clopper–Pearson bound at `delta / 2` on the certified answers'
    /// error rate.
    pub upper_bound_at_threshold: Option<f64>,
    /// The share a threshold without a promise would have served.
    pub empirical_share_at_alpha: f64,
    /// `fixed_sequence`, `bonferroni` or `both`: the arm that decided.
    pub arm: Option<String>,
    pub min_examples: usize,
    pub suspend_on_alert: bool,
    pub split: SplitFacts,
    pub stack: Stack,
    pub stack_sha256: String,
    /// The traffic monitor's baseline.
    pub monitor: Baseline,
    /// The certificate in words.
    pub summary: String,
}

impl CertificateReport {
    /// Certifies held-out answers: each one's top probability `conf`,
    /// chosen option `chosen` (of `k`) and whether it was right.
    #[allow(clippy::too_many_arguments)]
    pub fn make(
        task: &str,
        spec: CertifySpec,
        conf: &[f64],
        chosen: &[usize],
        correct: &[bool],
        k: usize,
        split: SplitFacts,
        stack: Stack,
    ) -> Self {
        let c = certify::certify(conf, correct, spec.alpha, spec.delta);
        let n = conf.len();
        let threshold = c.threshold.is_finite().then_some(c.threshold);
        let stack_sha256 = stack.sha256();
        let ident = sha256_hex(
            serde_json::json!([task, threshold, n, stack_sha256, split.method])
                .to_string()
                .as_bytes(),
        );
        let seed = u64::from_str_radix(&ident[..16], 16).unwrap_or(0);
        let mut report = CertificateReport {
            id: format!("{task}#{}", &ident[..12]),
            procedure: PROCEDURE.into(),
            alpha: spec.alpha,
            delta: spec.delta,
            n,
            accuracy: (n > 0).then(|| correct.iter().filter(|&&r| r).count() as f64 / n as f64),
            threshold,
            certified: threshold.is_some(),
            certified_share: c.share,
            certified_n: c.served,
            errors_at_threshold: threshold.map(|_| c.errors),
            error_rate_at_threshold: threshold.map(|_| c.errors as f64 / c.served as f64),
            upper_bound_at_threshold: c.bound,
            empirical_share_at_alpha: c.empirical_share,
            arm: c.arm.map(|a| {
                match a {
                    certify::Arm::FixedSequence => "fixed_sequence",
                    certify::Arm::Bonferroni => "bonferroni",
                    certify::Arm::Both => "both",
                }
                .to_string()
            }),
            min_examples: spec.min_examples,
            suspend_on_alert: spec.suspend_on_alert,
            split,
            stack,
            stack_sha256,
            monitor: monitor::baseline(chosen, k, conf, seed),
            summary: String::new(),
        };
        report.summary = report.words();
        report
    }

    fn words(&self) -> String {
        let pct = |x: f64| format!("{:.0}%", 100.0 * x);
        match self.threshold {
            None => format!(
                "Nothing is certified: on the {} held-out examples no confidence threshold keeps \
                 the wrong answers above it at {} or fewer with probability {}. The task works \
                 as before, and every answer carries certified: false. (Without the bound, {} of \
                 the examples would have met {} on these examples themselves; that is not a \
                 promise.)",
                self.n,
                pct(self.alpha),
                pct(1.0 - self.delta),
                pct(self.empirical_share_at_alpha),
                pct(self.alpha)
            ),
            Some(t) => format!(
                "Answers whose top probability is at least {t:.4} are certified: on the {} \
                 held-out examples that is {} of the answers, {} of {} wrong. With probability at \
                 least {} over the draw of such examples, at most {} of the certified answers are \
                 wrong, for traffic like them and on this serving stack.",
                self.n,
                pct(self.certified_share),
                self.errors_at_threshold.unwrap_or(0),
                self.certified_n,
                pct(1.0 - self.delta),
                pct(self.alpha)
            ),
        }
    }

    /// The verdict on an answer of top probability `conf`, served on
    /// `stack`; `as_certified` is false when the request changed what is
    /// served (its own temperature, `x_orders`), `traffic` whether the
    /// monitor's confidence signal is alerting.
    pub fn verdict(&self, stack: &Stack, conf: f64, as_certified: bool, traffic: bool) -> Verdict {
        let reason = if *stack != self.stack || !as_certified {
            Some(Reason::ServingStackChanged)
        } else {
            match self.threshold {
                None => Some(Reason::NothingCertified),
                Some(t) if conf < t => Some(Reason::BelowThreshold),
                Some(_) if traffic && self.suspend_on_alert => Some(Reason::TrafficChanged),
                Some(_) => None,
            }
        };
        Verdict {
            certified: reason.is_none(),
            certificate: self.id.clone(),
            reason,
        }
    }
}

/// Why an answer of a certified task is not certified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    BelowThreshold,
    NothingCertified,
    ServingStackChanged,
    TrafficChanged,
    /// The answer was read from a state cut to the prompt ceiling.
    StateTruncated,
    /// The header listed fewer of the request's questions than the
    /// examples' (`--header-limit`).
    HeaderLimited,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::BelowThreshold,
        Reason::NothingCertified,
        Reason::ServingStackChanged,
        Reason::TrafficChanged,
        Reason::StateTruncated,
        Reason::HeaderLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BelowThreshold => "below_threshold",
            Reason::NothingCertified => "nothing_certified",
            Reason::ServingStackChanged => "serving_stack_changed",
            Reason::TrafficChanged => "traffic_changed",
            Reason::StateTruncated => "state_truncated",
            Reason::HeaderLimited => "header_limited",
        }
    }
}

/// An answer's certification.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub certified: bool,
    pub certificate: String,
    pub reason: Option<Reason>,
}

impl Verdict {
    /// The answer's fields: `x_certified`, `x_certificate` and, when not
    /// certified, `x_certified_reason`; without the `x_` prefix when
    /// `reference_names` (the reference decisio's own names).
    pub fn fields(&self, reference_names: bool) -> serde_json::Map<String, serde_json::Value> {
        let p = if reference_names { "" } else { "x_" };
        let mut out = serde_json::Map::new();
        out.insert(format!("{p}certified"), self.certified.into());
        out.insert(format!("{p}certificate"), self.certificate.clone().into());
        if let Some(r) = self.reason {
            out.insert(format!("{p}certified_reason"), r.as_str().into());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_inputs_share_a_side_and_the_split_ignores_order() {
        let inputs: Vec<String> = (0..200).map(|i| format!("input {}", i % 150)).collect();
        let (fit, held) = hash_split("t", &inputs, 0.5);
        assert_eq!(fit.len() + held.len(), 200);
        assert!((held.len() as i64 - 100).abs() <= 2, "{}", held.len());
        for &h in &held {
            assert!(fit.iter().all(|&f| inputs[f] != inputs[h]));
        }
        let mut reversed = inputs.clone();
        reversed.reverse();
        let (_, held_r) = hash_split("t", &reversed, 0.5);
        let a: std::collections::BTreeSet<&String> = held.iter().map(|&i| &inputs[i]).collect();
        let b: std::collections::BTreeSet<&String> = held_r.iter().map(|&i| &reversed[i]).collect();
        assert_eq!(a, b);
        let (_, other) = hash_split("u", &inputs, 0.5);
        assert_ne!(held, other, "another task name, another split");
    }

    fn stack() -> Stack {
        Stack {
            model: "m".into(),
            tokenizer: "t".into(),
            backend: "MLX".into(),
            layout: "l".into(),
        }
    }

    #[test]
    fn verdicts_name_their_reason() {
        let spec = CertifySpec {
            alpha: 0.05,
            delta: 0.1,
            min_examples: 59,
            suspend_on_alert: true,
        };
        let conf: Vec<f64> = (0..200).map(|i| 0.5 + i as f64 / 400.0).collect();
        let correct: Vec<bool> = (0..200).map(|i| i > 20).collect();
        let chosen = vec![0; 200];
        let split = SplitFacts {
            method: "holdout".into(),
            holdout: Some(0.5),
            fit_examples: 200,
            certify_examples: 200,
            disjoint: true,
            rule: HOLDOUT_RULE.into(),
        };
        let c = CertificateReport::make(
            "t",
            spec,
            &conf,
            &chosen,
            &correct,
            2,
            split.clone(),
            stack(),
        );
        let t = c.threshold.expect("179 of 200 right at the top certifies");
        assert!(c.id.starts_with("t#") && c.id.len() == 14);
        assert!(c.summary.contains("are certified"));
        assert_eq!(c.verdict(&stack(), t, true, false).reason, None);
        assert_eq!(
            c.verdict(&stack(), t - 1e-9, true, false).reason,
            Some(Reason::BelowThreshold)
        );
        assert_eq!(
            c.verdict(&stack(), t, true, true).reason,
            Some(Reason::TrafficChanged)
        );
        assert_eq!(
            c.verdict(&stack(), t, false, false).reason,
            Some(Reason::ServingStackChanged)
        );
        let other = Stack {
            backend: "vLLM".into(),
            ..stack()
        };
        assert_eq!(other.differences(&stack()), vec!["backend"]);
        assert_eq!(
            c.verdict(&other, 1.0, true, false).reason,
            Some(Reason::ServingStackChanged)
        );
        let v = c.verdict(&stack(), 0.0, true, false);
        assert_eq!(v.fields(false)["x_certified_reason"], "below_threshold");
        assert_eq!(v.fields(true)["certified"], false);
        let none =
            CertificateReport::make("t", spec, &conf, &chosen, &[false; 200], 2, split, stack());
        assert_eq!(none.threshold, None);
        assert!(none.summary.starts_with("Nothing is certified"));
        assert_eq!(
            none.verdict(&stack(), 1.0, true, false).reason,
            Some(Reason::NothingCertified)
        );
    }
}
