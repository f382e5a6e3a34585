"""Reference prediction sets, for the Rust tests of src/stats/conformal.rs:
seeded calibration and test examples run through crepes (PyPI `crepes`,
Boström's conformal classifiers), an implementation of split conformal
prediction written apart from decisio's.

Usage: python scripts/reference/conformal_cases.py [OUT]
(default OUT: tests/fixtures/conformal/cases.json; needs `pip install
crepes==0.9.1 scikit-learn`)

Each case: n calibration examples (10 to 400) and 30 test examples of k
options (2 to 8), probabilities from a Dirichlet, each example's true
option drawn from them, then rounded to 1 to 3 decimals (so scores tie); a level alpha; a score, LAC (crepes' own `hinge`, 1 - p)
or APS (the mass of the options at least as probable as the option, ties
counted in full, computed here). crepes gives each test option its
p-value from the calibration scores, unsmoothed, and the set holds the
options whose p-value is at least alpha.

crepes' rule (p >= alpha) and the split-conformal threshold decisio uses
(the ceil((n + 1)(1 - alpha))-th smallest score, a p-value above alpha)
differ only where (n + 1) alpha is an integer: there crepes' set takes
one more rank of scores. The cases keep (n + 1) alpha off the integers,
and the file records that it did.
"""

import json
import sys
from pathlib import Path

import numpy as np
from crepes import ConformalClassifier
from crepes.extras import hinge

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261205
CASES = 100
TEST = 30


def aps(p, option):
    """The mass of the options at least as probable as `option`."""
    return float(p[p >= p[option]].sum())


def case(rng):
    k = int(rng.integers(2, 9))
    while True:
        n = int(rng.integers(10, 401))
        alpha = float(rng.choice([0.05, 0.1, 0.2, 0.25, 0.3, 0.5]))
        x = (n + 1) * alpha
        if abs(x - round(x)) > 1e-6 and np.ceil((n + 1) * (1 - alpha)) <= n:
            break
    decimals = int(rng.integers(1, 4))
    concentration = float(rng.choice([0.3, 1.0, 3.0]))

    def draw(m):
        p = rng.dirichlet([concentration] * k, size=m)
        y = np.array([rng.choice(k, p=row) for row in p])
        # Rounded (not renormalised: the scores do not need a sum of 1),
        # so the file holds short decimals and scores tie.
        return np.round(p, decimals), y

    (cal, cal_y), (test, _) = draw(n), draw(TEST)
    score = str(rng.choice(["lac", "aps"]))
    if score == "lac":
        cal_scores = hinge(cal, np.arange(k), cal_y)
        test_scores = hinge(test)
    else:
        cal_scores = np.array([aps(p, y) for p, y in zip(cal, cal_y)])
        test_scores = np.array([[aps(p, j) for j in range(k)] for p in test])
    cc = ConformalClassifier()
    cc.fit(cal_scores)
    sets = cc.predict_set(test_scores, confidence=1 - alpha, smoothing=False)
    return {
        "score": score, "alpha": alpha, "options": k,
        "calibration": cal.tolist(), "truth": cal_y.tolist(),
        "test": test.tolist(),
        "sets": [[j for j in range(k) if s[j]] for s in sets],
    }


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/fixtures/conformal/cases.json"
    rng = np.random.default_rng(SEED)
    cases = [case(rng) for _ in range(CASES)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "made_by": "scripts/reference/conformal_cases.py with crepes 0.9.1",
        "seed": SEED,
        "rule": "an option is in the set when its unsmoothed p-value is at least alpha; "
                "(n + 1) alpha is never an integer in these cases",
        "cases": cases,
    }) + "\n")
    sizes = [len(s) for c in cases for s in c["sets"]]
    print(f"{len(cases)} cases, {len(sizes)} sets, mean size {np.mean(sizes):.2f}, "
          f"{sum(s == 0 for s in sizes)} empty -> {out}")


if __name__ == "__main__":
    main()
