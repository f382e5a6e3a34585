//! A fault the unit tests inject into the engine thread's work, to show
//! that a job whose work panics fails alone (`engine.rs`). Compiled into
//! the unit tests only: elsewhere [`hook`] does nothing.

/// Set by a unit test: the next job step or generation panics.
#[cfg(test)]
pub static FAULT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Panics once when a unit test has set [`FAULT`].
#[inline]
pub fn hook() {
    #[cfg(test)]
    if FAULT.swap(false, std::sync::atomic::Ordering::SeqCst) {
        panic!("the fault hook of the unit tests");
    }
}
