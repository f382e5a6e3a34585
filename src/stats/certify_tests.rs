//! Tests of the certificate: by hand on small cases, and against the
//! reference decisio's figures in `tests/fixtures/certify/cases.json`
//! (written by `scripts/reference/certify_cases.py`).

use serde_json::Value;

use super::*;

const CASES: &str = include_str!("../../tests/fixtures/certify/cases.json");

fn fixture() -> Value {
    serde_json::from_str(CASES).expect("cases.json parses")
}

/// A case's confidences (fixed-width integer codes over 10^decimals) and
/// correctness.
fn examples(case: &Value) -> (Vec<f64>, Vec<bool>) {
    let decimals = case["decimals"].as_u64().unwrap() as usize;
    let scale = 10f64.powi(decimals as i32);
    let digits = case["conf"].as_str().unwrap().as_bytes();
    let conf = digits
        .chunks(decimals)
        .map(|code| std::str::from_utf8(code).unwrap().parse::<u64>().unwrap() as f64 / scale)
        .collect();
    let correct = case["correct"]
        .as_str()
        .unwrap()
        .bytes()
        .map(|b| b == b'1')
        .collect();
    (conf, correct)
}

/// A threshold as the fixture writes it: null for none.
fn threshold_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::INFINITY)
}

#[test]
fn every_case_gets_the_reference_threshold_and_figures() {
    let data = fixture();
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() >= 1000);
    let (mut certified, mut max_bound_gap) = (0, 0.0_f64);
    for (i, case) in cases.iter().enumerate() {
        let (conf, correct) = examples(case);
        let n = case["n"].as_u64().unwrap() as usize;
        assert_eq!(conf.len(), n, "case {i}");
        let (alpha, delta) = (
            case["alpha"].as_f64().unwrap(),
            case["delta"].as_f64().unwrap(),
        );
        let got = certify(&conf, &correct, alpha, delta);
        let want = threshold_of(&case["threshold"]);
        assert_eq!(got.threshold, want, "case {i}: threshold");
        assert_eq!(threshold(&conf, &correct, alpha, delta), want, "case {i}");
        assert_eq!(
            got.fixed_sequence,
            threshold_of(&case["fixed_sequence"]),
            "case {i}: fixed sequence"
        );
        assert_eq!(
            got.bonferroni,
            threshold_of(&case["bonferroni"]),
            "case {i}: Bonferroni"
        );
        let start = case["tolerant_start"].as_u64().unwrap() as usize;
        assert_eq!(
            tolerant_start(alpha, delta / 2.0, n),
            start,
            "case {i}: tolerant start"
        );
        assert_eq!(
            got.served as u64,
            case["certified_n"].as_u64().unwrap(),
            "case {i}: served"
        );
        let empirical = case["empirical_share_at_alpha"].as_f64().unwrap();
        assert_eq!(got.empirical_share, empirical, "case {i}: empirical share");
        match case["upper_bound_at_threshold"].as_f64() {
            Some(bound) => {
                certified += 1;
                let errors = case["errors_at_threshold"].as_u64().unwrap();
                assert_eq!(got.errors as u64, errors, "case {i}: errors");
                let gap = (got.bound.unwrap() - bound).abs();
                assert!(gap <= 1e-10, "case {i}: bound {:?} vs {bound}", got.bound);
                max_bound_gap = max_bound_gap.max(gap);
                assert!(got.arm.is_some());
            }
            None => assert_eq!(
                (got.arm, got.bound, got.served),
                (None, None, 0),
                "case {i}"
            ),
        }
    }
    assert!(
        certified > 100,
        "the fixture certifies too few cases to test much"
    );
    eprintln!(
        "{} cases match ({certified} certified), largest bound gap {max_bound_gap:e}",
        cases.len()
    );
}

#[test]
fn upper_bounds_match_scipy() {
    let data = fixture();
    let bounds = data["upper_bounds"].as_array().unwrap();
    assert!(bounds.len() >= 300);
    let (mut max_abs, mut max_rel) = (0.0_f64, 0.0_f64);
    for b in bounds {
        let (errors, n) = (
            b["errors"].as_u64().unwrap() as usize,
            b["n"].as_u64().unwrap() as usize,
        );
        let (delta, want) = (b["delta"].as_f64().unwrap(), b["bound"].as_f64().unwrap());
        let got = upper_bound(errors, n, delta);
        let gap = (got - want).abs();
        assert!(gap <= 1e-10, "{errors} of {n} at {delta}: {got} vs {want}");
        max_abs = max_abs.max(gap);
        max_rel = max_rel.max(gap / want);
    }
    eprintln!(
        "{} bounds: largest gap {max_abs:e} absolute, {max_rel:e} relative",
        bounds.len()
    );
    assert!(max_rel <= 1e-11, "relative gap {max_rel:e}");
}

#[test]
fn minimum_examples_match_the_reference() {
    let data = fixture();
    for m in data["minimum_examples"].as_array().unwrap() {
        let (alpha, delta) = (m["alpha"].as_f64().unwrap(), m["delta"].as_f64().unwrap());
        let want = m["minimum"].as_u64().unwrap() as usize;
        assert_eq!(
            minimum_examples(alpha, delta),
            want,
            "alpha {alpha}, delta {delta}"
        );
    }
    // The default settings: fewer than 59 held-out examples certify nothing.
    assert_eq!(minimum_examples(0.05, 0.1), 59);
    let (conf, correct) = (vec![0.9; 59], vec![true; 59]);
    assert_eq!(threshold(&conf, &correct, 0.05, 0.1), 0.9);
    assert_eq!(
        threshold(&conf[..58], &correct[..58], 0.05, 0.1),
        f64::INFINITY
    );
}

#[test]
fn bounds_by_hand() {
    // No errors: the bound is 1 − delta^(1/n).
    for &(n, delta) in &[
        (1usize, 0.1),
        (59, 0.05),
        (1000, 0.025),
        (100_000, 0.1 / 24.0),
    ] {
        let want = -(f64::ln(delta) / n as f64).exp_m1();
        let got = upper_bound(0, n, delta);
        assert!((got - want).abs() <= 1e-13 * want, "{n}: {got} vs {want}");
    }
    // n − 1 errors in n: the bound is (1 − delta)^(1/n).
    let got = upper_bound(9, 10, 0.1);
    assert!((got - 0.9_f64.powf(0.1)).abs() < 1e-14);
    assert_eq!(upper_bound(5, 5, 0.1), 1.0);
    assert_eq!(upper_bound(0, 0, 0.1), 1.0);
}

#[test]
fn starting_counts_of_the_fixed_sequence() {
    // Values of the reference's rule (its tolerant start, then the largest
    // of the four terms, capped at n).
    assert_eq!(tolerant_start(0.05, 0.05, 2000), 153);
    assert_eq!(fixed_sequence_start(0.05, 0.05, 2000), 153);
    assert_eq!(tolerant_start(0.1, 0.025, 500), 114);
    assert_eq!(fixed_sequence_start(0.1, 0.025, 500), 114);
    // ceil(ln 0.025 / ln 0.95) = 72 > n: capped.
    assert_eq!(fixed_sequence_start(0.05, 0.025, 10), 10);
    // 5% of 4000 is the largest term.
    assert_eq!(fixed_sequence_start(0.05, 0.05, 4000), 200);
    assert_eq!(grid(10, 10), vec![10]);
    let g = grid(59, 100);
    assert_eq!((g[0], *g.last().unwrap()), (59, 100));
    assert!(g.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn ties_are_served_together() {
    // 150 examples at 0.99, all right, then 100 at 0.5 with 30 wrong: the
    // fixed sequence starts inside the 0.5 group and fails at once; the
    // Bonferroni arm's count 150 ends the strict group and holds, 175 is
    // served as 250 and fails.
    let mut conf = vec![0.99; 150];
    conf.extend(vec![0.5; 100]);
    let correct: Vec<bool> = (0..250).map(|i| i < 150 || i % 10 >= 3).collect();
    let c = certify(&conf, &correct, 0.05, 0.1);
    assert_eq!((c.threshold, c.served, c.errors), (0.99, 150, 0));
    assert_eq!(
        (c.fixed_sequence, c.arm),
        (f64::INFINITY, Some(Arm::Bonferroni))
    );
    assert_eq!(c.share, 0.6);
    assert_eq!(bonferroni_counts(200)[0], 10);
    assert_eq!(bonferroni_counts(10), vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    // round half to even: 0.05 × 10 = 0.5 → 0, then at least 1.
    assert_eq!(bonferroni_counts(30)[..3], [2, 3, 4]);
}
