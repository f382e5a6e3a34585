//! A gate's outcome and what `decisio gate` prints: one line per gate,
//! pass or fail, with both figures, the difference and the tolerance
//! ([`super::gate`] and [`super::trust`] make them).

use serde::Serialize;

/// One gate's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub gate: String,
    pub candidate: String,
    pub reference: String,
    pub difference: String,
    pub tolerance: String,
    pub pass: bool,
}

/// What `decisio gate` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Why the records were compared despite differing (`--force`).
    pub forced: Vec<String>,
    pub outcomes: Vec<Outcome>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.outcomes.iter().all(|o| o.pass)
    }

    /// The lines `decisio gate` prints.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .forced
            .iter()
            .map(|f| format!("compared anyway (--force): {f}"))
            .collect();
        let w = self
            .outcomes
            .iter()
            .map(|o| o.gate.len())
            .max()
            .unwrap_or(4);
        for o in &self.outcomes {
            out.push(format!(
                "{:<4}  {:<w$}  candidate {:>8}  reference {:>8}  difference {}  tolerance {}",
                if o.pass { "pass" } else { "FAIL" },
                o.gate,
                o.candidate,
                o.reference,
                o.difference,
                o.tolerance
            ));
        }
        let failed = self.outcomes.iter().filter(|o| !o.pass).count();
        out.push(format!(
            "{} gates, {} passed, {failed} failed",
            self.outcomes.len(),
            self.outcomes.len() - failed
        ));
        out
    }
}
