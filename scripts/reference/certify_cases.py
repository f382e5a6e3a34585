"""Reference figures of certified answers, for the Rust tests of
src/stats/certify.rs: random held-out sets run through the reference
decisio's own functions (decisio.readout.certify), and one-sided
Clopper-Pearson bounds from scipy's Beta quantile.

Usage: python scripts/reference/certify_cases.py [OUT]
(default OUT: tests/fixtures/certify/cases.json)

Each case is a held-out set of n examples (n from 10 to 2,000, log-uniform),
an accuracy, a way confidences relate to correctness, a rounding of the
confidences (1 to 4 decimals, so coarse roundings make many ties), and
alpha in {0.05, 0.1, 0.2}, delta in {0.05, 0.1}. Confidences are stored as
fixed-width decimal digit strings: the confidence of an example is its
integer code divided by 10^decimals, and the reference is run on exactly
those values. Correctness is a string of 0 and 1.
"""

import json
import math
import sys
from pathlib import Path

import numpy as np

from decisio.readout import certify

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261014
CASES = 1000
BOUNDS = 320
ALPHAS = (0.05, 0.1, 0.2)
DELTAS = (0.05, 0.1)


def finite_or_none(v):
    return float(v) if math.isfinite(v) else None


def draw_case(rng):
    n = int(round(math.exp(rng.uniform(math.log(10), math.log(2000)))))
    decimals = int(rng.integers(1, 5))
    accuracy = float(rng.choice([rng.uniform(0.5, 1.0), rng.uniform(0.9, 1.0), 1.0], p=[0.4, 0.5, 0.1]))
    shape = str(rng.choice(["informative", "flat", "overconfident"]))
    if shape == "informative":
        # confidence tracks the chance of being right
        conf = rng.beta(1 + 8 * accuracy, 1 + 8 * (1 - accuracy), n)
        correct = rng.random(n) < np.clip(conf + (accuracy - conf.mean()), 0, 1)
    elif shape == "flat":
        # confidence says nothing about correctness
        conf = rng.uniform(0.25, 1.0, n)
        correct = rng.random(n) < accuracy
    else:
        # right or wrong first; the wrong answers are nearly as sure
        correct = rng.random(n) < accuracy
        conf = np.where(correct, rng.beta(9, 1, n), rng.beta(6, 2, n))
    scale = 10**decimals
    codes = np.clip(np.floor(conf * scale), 0, scale - 1).astype(int)
    return n, decimals, codes, correct, shape


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/fixtures/certify/cases.json"
    rng = np.random.default_rng(SEED)
    cases = []
    for _ in range(CASES):
        n, decimals, codes, correct, shape = draw_case(rng)
        alpha = float(rng.choice(ALPHAS))
        delta = float(rng.choice(DELTAS))
        conf = np.array([int(c) / 10**decimals for c in codes])
        cert = certify.certificate(conf, correct, alpha, delta)
        order = np.argsort(-conf)
        c_sorted, errs = conf[order], np.cumsum(~correct[order])
        cases.append(
            {
                "n": n,
                "alpha": alpha,
                "delta": delta,
                "shape": shape,
                "decimals": decimals,
                "conf": "".join(f"{int(c):0{decimals}d}" for c in codes),
                "correct": "".join("1" if c else "0" for c in correct),
                "threshold": cert["threshold"],
                "fixed_sequence": finite_or_none(certify._fixed_sequence(c_sorted, errs, alpha, delta / 2)),
                "bonferroni": finite_or_none(certify._bonferroni(c_sorted, errs, alpha, delta / 2)),
                "tolerant_start": certify._tolerant_start(alpha, delta / 2, n),
                "certified_n": cert["certified_n"],
                "errors_at_threshold": cert["errors_at_threshold"],
                "upper_bound_at_threshold": cert["upper_bound_at_threshold"],
                "empirical_share_at_alpha": cert["empirical_share_at_alpha"],
            }
        )
    bounds = []
    for i in range(BOUNDS):
        n = int(round(math.exp(rng.uniform(0, math.log(100_000)))))
        errors = int(rng.integers(0, n + 1)) if i % 2 else int(rng.binomial(n, rng.uniform(0, 0.3)))
        delta = float(rng.choice([0.1, 0.05, 0.05 / 12, 0.1 / 2 / 12, 0.025, 0.01, 1e-4]))
        bounds.append({"errors": errors, "n": n, "delta": delta, "bound": certify.upper_bound(errors, n, delta)})
    minimum = [
        {"alpha": a, "delta": d, "minimum": certify.minimum_examples(a, d)}
        for a in (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
        for d in (0.01, 0.05, 0.1, 0.2)
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    data = {"seed": SEED, "cases": cases, "upper_bounds": bounds, "minimum_examples": minimum}
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    certified = sum(c["threshold"] is not None for c in cases)
    print(f"{len(cases)} cases ({certified} certified), {len(bounds)} bounds, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
