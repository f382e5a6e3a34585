//! The progress the client commands show: an `indicatif` bar (position,
//! rate, ETA) on a terminal; elsewhere (a log, CI) a plain line every ten
//! seconds and at the end.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: ProgressBar,
    tty: bool,
    last: Mutex<Instant>,
}

impl Progress {
    pub fn new(len: u64, what: &str) -> Progress {
        let bar = ProgressBar::new(len);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}")
                .expect("a valid template")
                .progress_chars("#>."),
        );
        bar.set_message(what.to_string());
        Progress {
            bar,
            tty: std::io::stderr().is_terminal(),
            last: Mutex::new(Instant::now()),
        }
    }

    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    /// Sets where it stands (`done` of `len`).
    pub fn set(&self, done: u64, len: u64) {
        self.bar.set_length(len);
        self.bar.set_position(done);
        self.line(false);
    }

    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.line(false);
    }

    pub fn finish(&self) {
        self.bar.finish();
        self.line(true);
    }

    fn line(&self, last: bool) {
        if self.tty {
            return;
        }
        let mut at = self.last.lock().expect("progress");
        if last || at.elapsed() >= Duration::from_secs(10) {
            *at = Instant::now();
            let eta = if last {
                String::new()
            } else {
                format!(", ETA {:.0} s", self.bar.eta().as_secs_f64())
            };
            eprintln!(
                "{} {}/{}{eta}",
                self.bar.message(),
                self.bar.position(),
                self.bar.length().unwrap_or(0)
            );
        }
    }
}
