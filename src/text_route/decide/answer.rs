//! A decision's answers: the calibrated distribution over the options
//! (the letters' logits, or an intent head's on the hidden state, divided
//! by the temperature), the tie-break and abstention.

use super::{orders, Answer, Lettering, Question};
use crate::engine::QuestionScore;
use crate::stats::head::Head;
use crate::stats::{self, Readout};
use crate::text_route::{RouteError, TextRoute};

/// Calibrated probabilities: softmax over the option letters' logits divided
/// by `temperature`, in f64, stored as f32.
pub fn calibrate(logits: &[f32], temperature: f64) -> Vec<f32> {
    f32s(stats::softmax(logits, temperature))
}

/// Calibrated log-probabilities: `log_softmax(logit / T)` over the option
/// letters, in f64, stored as f32.
pub fn calibrated_logprobs(logits: &[f32], temperature: f64) -> Vec<f32> {
    f32s(stats::log_softmax(logits, temperature))
}

/// Per-label values from per-form ones, `sizes` the number of forms each
/// label is read from, in order: the log of each label's summed
/// probability, the log-sum-exp of its forms' logits or log-probabilities,
/// in f64 (a label read from one form keeps its value).
pub fn sum_forms(values: &[f32], sizes: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for &n in sizes {
        let forms: Vec<f64> = values[at..at + n].iter().map(|&v| f64::from(v)).collect();
        at += n;
        let top = forms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum = if top == f64::NEG_INFINITY {
            top
        } else {
            top + forms.iter().map(|v| (v - top).exp()).sum::<f64>().ln()
        };
        out.push(sum as f32);
    }
    out
}

/// f64 values stored as f32, as answers serve them.
fn f32s(v: Vec<f64>) -> Vec<f32> {
    v.into_iter().map(|x| x as f32).collect()
}

impl TextRoute {
    /// The labels a question's answer names its options by: the letters,
    /// the System One wire's letter codes, or `yes` and `no`.
    fn labels(&self, q: &Question) -> Vec<String> {
        match q.lettering() {
            Lettering::YesNoWords => vec!["yes".into(), "no".into()],
            _ => self
                .codes(q)
                .unwrap_or_default()
                .iter()
                .map(|(code, _)| code.clone())
                .collect(),
        }
    }

    /// Per-label values from the values of the tokens [`Self::label_reads`]
    /// reads for `q`, in that order: each label's summed over its forms
    /// ([`sum_forms`]) where a label is read from more than one; as they are
    /// otherwise, and for a packed prompt's, which reads one letter a label
    /// whatever the format.
    pub(super) fn label_values(
        &self,
        q: &Question,
        values: &[f32],
    ) -> Result<Vec<f32>, RouteError> {
        let sizes: Vec<usize> = self.label_reads(q)?.iter().map(Vec::len).collect();
        if sizes.iter().all(|&n| n == 1) || values.len() != sizes.iter().sum::<usize>() {
            return Ok(values.to_vec());
        }
        Ok(sum_forms(values, &sizes))
    }

    /// The answer from the logits and log-probabilities of the tokens
    /// [`Self::label_reads`] reads, in that order ([`Self::label_values`]).
    pub(super) fn answer_read(
        &self,
        q: Question,
        logits: &[f32],
        logprobs: &[f32],
    ) -> Result<Answer, RouteError> {
        let mut logits = self.label_values(&q, logits)?;
        if let Some(bias) = &q.bias {
            logits = stats::debias::corrected(&logits, bias);
        }
        let logprobs = self.label_values(&q, logprobs)?;
        Ok(self.answer(q, &logits, &logprobs))
    }

    /// The answer to `q` from its reads in several orders (`read`: each
    /// rotation as asked, with its score): each rotation's label values
    /// mapped back to the options and averaged ([`orders::averaged`]),
    /// then answered as one read is.
    pub(super) fn answer_in_orders(
        &self,
        q: Question,
        read: &[(Question, QuestionScore)],
    ) -> Result<Answer, RouteError> {
        let mut logits = Vec::with_capacity(read.len());
        let mut logprobs = Vec::with_capacity(read.len());
        for (asked, score) in read {
            logits.push(self.label_values(asked, &score.logits)?);
            logprobs.push(self.label_values(asked, &score.logprobs)?);
        }
        let mut answer = self.answer(q, &orders::averaged(&logits), &orders::averaged(&logprobs));
        answer.orders = read.len();
        Ok(answer)
    }

    /// The answer from the letters' logits: temperature (the request's, else
    /// the base's default), abstention, tie-break.
    pub(super) fn answer(&self, q: Question, logits: &[f32], logprobs: &[f32]) -> Answer {
        let temperature = q.temperature.unwrap_or(self.default_temperature);
        let letters = self.labels(&q);
        let mut answer = served(&q, letters.clone(), logits, temperature, false);
        answer.letter = answer.index.map(|top| letters[top].clone());
        answer.logprobs = letters.into_iter().zip(logprobs.iter().copied()).collect();
        answer
    }
}

/// An intent task's answer: the head's logits on the hidden state, divided
/// by the temperature (the request's, else the head's), then abstention and
/// tie-break as for letters.
pub fn intent_answer(q: Question, head: &Head, hidden: &[f32]) -> Answer {
    let logits = head.logits(hidden);
    let temperature = q.temperature.unwrap_or(head.temperature);
    served(&q, q.options.clone(), &logits, temperature, true)
}

/// An answer as served from `logits` at `temperature`, read by the one
/// readout rule ([`Readout`]), its options named `names` (letters, or an
/// `intent` head's labels): the probabilities, the top option unless it
/// falls below the question's `abstain_below`, the calibrated
/// log-probabilities. No letter and no raw log-probabilities: a letter
/// answer adds them.
fn served(
    q: &Question,
    names: Vec<String>,
    logits: &[f32],
    temperature: f64,
    intent: bool,
) -> Answer {
    let Readout {
        exact,
        probabilities,
        top,
        tie,
    } = Readout::of(logits, temperature);
    let best = probabilities[top];
    let threshold = q.abstain_below;
    let abstained = threshold.is_some_and(|t| f64::from(best) < t);
    Answer {
        id: q.id.clone(),
        letter: None,
        index: (!abstained).then_some(top),
        option: (!abstained).then(|| q.options.get(top).cloned().unwrap_or_default()),
        intent,
        probabilities: names.iter().cloned().zip(probabilities).collect(),
        exact,
        calibrated_logprobs: names
            .iter()
            .cloned()
            .zip(calibrated_logprobs(logits, temperature))
            .collect(),
        logprobs: Vec::new(),
        temperature: temperature as f32,
        abstained,
        abstain_reason: abstained.then(|| {
            let name = match intent {
                true => format!("label `{}`", names[top]),
                false => format!("option {}", names[top]),
            };
            format!(
                "the top probability {best:.4} ({name}) is below abstain_below {}",
                threshold.unwrap_or_default()
            )
        }),
        tie,
        top,
        orders: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_divides_logits_by_the_temperature() {
        let p = calibrate(&[2.0, 1.0, 0.0], 1.0);
        let sum: f32 = p.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert!(p[0] > p[1] && p[1] > p[2]);
        let hot = calibrate(&[2.0, 1.0, 0.0], 10.0);
        assert!(hot[0] < p[0], "a higher temperature flattens");
        let cold = calibrate(&[2.0, 1.0, 0.0], 0.1);
        assert!(cold[0] > 0.99);
        // Log-probabilities stay finite where probabilities round to 0.
        let lp = calibrated_logprobs(&[2.0, 1.0, 0.0], 0.0005);
        assert!(lp.iter().all(|v| v.is_finite()), "{lp:?}");
        assert_eq!(lp[0], 0.0);
    }

    #[test]
    fn summed_forms_add_their_probabilities() {
        // Two forms of 0.2 and 0.1 make a label of 0.3; a single form keeps
        // its value bit for bit.
        let lp = [0.2f32.ln(), 0.1f32.ln(), 0.05f32.ln()];
        let s = sum_forms(&lp, &[2, 1]);
        assert!((f64::from(s[0]).exp() - 0.3).abs() < 1e-6, "{s:?}");
        assert_eq!(s[1], lp[2]);
        // Logits far apart stay finite (log-sum-exp, not the sum of exps).
        let s = sum_forms(&[1000.0, 999.0, -1000.0], &[2, 1]);
        assert!((s[0] - (1000.0 + (1.0 + (-1.0f64).exp()).ln() as f32)).abs() < 1e-3);
        assert_eq!(s[1], -1000.0);
        assert_eq!(
            sum_forms(&[f32::NEG_INFINITY; 2], &[2]),
            [f32::NEG_INFINITY]
        );
    }

    #[test]
    fn ties_go_to_the_earliest_option() {
        use crate::stats::top_option;
        assert_eq!(top_option(&[0.2, 0.4, 0.4]), (1, true));
        assert_eq!(top_option(&[0.5, 0.3, 0.2]), (0, false));
        let even = calibrate(&[1.5, 1.5], 1.0);
        assert_eq!(top_option(&even), (0, true));
    }
}
