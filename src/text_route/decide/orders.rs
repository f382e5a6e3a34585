//! Cyclic orders (`x_orders: k`): a question asked in `k` cyclic rotations
//! of its options, each its own continuation of the one state read, and
//! its answer read from the rotations' letter values mapped back to the
//! options and averaged.
//!
//! Rotation `r` of `k` puts option `(p + ⌊r·n/k⌋) mod n` at position `p`
//! (rotation 0 is the order sent), the offsets the reference decisio's
//! `cyclic_order` uses (`decisio/readout/debias.py`). The average is of the
//! letters' logits (and of their log-probabilities over the vocabulary),
//! so the answer is the normalised geometric mean of the rotations'
//! distributions, at any temperature: softmax is blind to a constant per
//! rotation. With `k = n` every option sits at every letter exactly once,
//! so a prior the model puts on letters (PriDe's, Zheng et al. 2024)
//! multiplies every option alike and cancels exactly; the reference's
//! `cyclic_average` takes the arithmetic mean of the probabilities, which
//! does not remove it exactly. See `docs/design/text-route.md`.

use super::{Lettering, Question, MAX_QUESTIONS};
pub use crate::stats::rotation;
use crate::text_route::systemone::MAX_LABELS;
use crate::text_route::RouteError;

/// The most orders a request may ask for: one per option of the longest
/// question.
pub const MAX_ORDERS: usize = MAX_LABELS;

/// `x_orders` as a request gives it: 1 to [`MAX_ORDERS`], else an error
/// naming it.
pub fn checked(k: i64) -> Result<usize, RouteError> {
    usize::try_from(k)
        .ok()
        .filter(|k| (1..=MAX_ORDERS).contains(k))
        .ok_or_else(|| {
            RouteError::invalid(
                "x_orders",
                format!("`x_orders` must be an integer from 1 to {MAX_ORDERS}; got {k}"),
            )
        })
}

/// How a request's questions are asked: each in `orders[i]` rotations,
/// asked one after another.
#[derive(Debug)]
pub struct Plan {
    pub orders: Vec<usize>,
}

impl Plan {
    /// Each question in `min(k, options)` rotations; one for a question
    /// whose options are not lettered (an intent task's labels, a yes/no
    /// question asked in words), which have no letter order to rotate.
    pub fn new(questions: &[Question], k: usize) -> Result<Self, RouteError> {
        checked(i64::try_from(k).unwrap_or(i64::MAX))?;
        let orders: Vec<usize> = questions
            .iter()
            .map(|q| {
                let lettered = q.head.is_none() && q.lettering() != Lettering::YesNoWords;
                if lettered {
                    k.min(q.options.len()).max(1)
                } else {
                    1
                }
            })
            .collect();
        let asked: usize = orders.iter().sum();
        if asked > MAX_QUESTIONS {
            return Err(RouteError::invalid(
                "x_orders",
                format!(
                    "x_orders {k} asks {asked} questions in all (each question in as many \
                     orders as it has options, up to {k}); a request asks at most \
                     {MAX_QUESTIONS}: lower x_orders or send fewer questions"
                ),
            ));
        }
        Ok(Plan { orders })
    }

    /// The questions as asked: each question's rotations in turn.
    pub fn asked(&self, questions: &[Question]) -> Vec<Question> {
        let mut out = Vec::with_capacity(self.orders.iter().sum());
        for (q, &k) in questions.iter().zip(&self.orders) {
            if k == 1 {
                out.push(q.clone());
                continue;
            }
            let n = q.options.len();
            for r in 0..k {
                let order = rotation(n, r, k);
                out.push(Question {
                    options: order.iter().map(|&i| q.options[i].clone()).collect(),
                    ..q.clone()
                });
            }
        }
        out
    }
}

/// The mean over rotations of per-position values, each mapped back to
/// the option it belongs to: `values[r][p]` is the value of the option at
/// position `p` in rotation `r` of `values.len()`.
pub fn averaged(values: &[Vec<f32>]) -> Vec<f32> {
    let k = values.len();
    let n = values.first().map_or(0, Vec::len);
    let mut sum = vec![0.0f64; n];
    for (r, row) in values.iter().enumerate() {
        for (p, &i) in rotation(n, r, k).iter().enumerate() {
            sum[i] += f64::from(row[p]);
        }
    }
    sum.into_iter().map(|s| (s / k as f64) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats;
    use crate::text_route::systemone::WireAsk;

    #[test]
    fn rotations_put_every_option_at_every_position_once() {
        assert_eq!(rotation(4, 0, 4), [0, 1, 2, 3]);
        assert_eq!(rotation(4, 1, 4), [1, 2, 3, 0]);
        // Two orders of five: offsets 0 and 2, as the reference spaces them.
        assert_eq!(rotation(5, 1, 2), [2, 3, 4, 0, 1]);
        for n in 2..9 {
            let mut seen = vec![vec![0; n]; n];
            for r in 0..n {
                for (p, &i) in rotation(n, r, n).iter().enumerate() {
                    seen[i][p] += 1;
                }
            }
            assert!(seen.iter().flatten().all(|&c| c == 1), "{n}: {seen:?}");
        }
    }

    #[test]
    fn all_orders_remove_a_letter_prior_exactly() {
        // A model that adds a prior to each letter: the option logits
        // [2, 1, 0] read in every rotation with the prior [3, 0, -1] on
        // the positions give back softmax([2, 1, 0]) once averaged.
        let content = [2.0f32, 1.0, 0.0];
        let prior = [3.0f32, 0.0, -1.0];
        let n = content.len();
        let read: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                rotation(n, r, n)
                    .iter()
                    .enumerate()
                    .map(|(p, &i)| content[i] + prior[p])
                    .collect()
            })
            .collect();
        let p = stats::softmax(&averaged(&read), 1.3);
        let want = stats::softmax(&content, 1.3);
        for (a, b) in p.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{p:?} vs {want:?}");
        }
        // One order keeps the prior: the first letter wins.
        let one = stats::softmax(&read[0], 1.3);
        assert!(one[0] > want[0] + 0.3, "{one:?}");
    }

    #[test]
    fn plans_count_what_is_asked() {
        let q = |n: usize, wire: Option<WireAsk>| {
            Question::new("Which?", (0..n).map(|i| format!("o{i}")).collect()).with_wire(wire)
        };
        let qs = [q(3, None), q(2, Some(WireAsk::YesNoWords)), q(8, None)];
        let plan = Plan::new(&qs, 4).unwrap();
        assert_eq!(plan.orders, [3, 1, 4]);
        let asked = plan.asked(&qs);
        assert_eq!(asked.len(), 8);
        assert_eq!(asked[1].options, ["o1", "o2", "o0"]);
        assert_eq!(asked[3].options, ["o0", "o1"]);
        assert_eq!(asked[5].options[0], "o2");
        assert!(Plan::new(&qs, 0).is_err());
        let many: Vec<Question> = (0..100).map(|_| q(3, None)).collect();
        assert!(Plan::new(&many, 2).is_ok());
        assert!(Plan::new(&many, 3).is_err());
    }
}
