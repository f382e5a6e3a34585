//! The run's journal, `OUT/journal.jsonl`: one JSON line per answer,
//! conformance check or intent set, written whole and flushed as it
//! arrives, so an interrupted run resumes from it.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::suite::record::{AnswerRecord, Conformance, IntentRecord};

/// One line of the journal.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum Line {
    Start {
        suite: String,
        server: Value,
        model: String,
    },
    Answer {
        set: String,
        answer: AnswerRecord,
        /// Milliseconds of the request over its questions.
        ms: f64,
        cached: bool,
        /// Seconds since this session started.
        t: f64,
    },
    Conformance {
        record: Conformance,
        ms: f64,
        cached: bool,
        t: f64,
    },
    Intent {
        record: IntentRecord,
        t: f64,
    },
}

pub(super) struct Journal {
    pub(super) file: File,
    pub(super) started: Instant,
}

impl Journal {
    pub(super) fn write(&mut self, line: &Line) -> Result<()> {
        let mut text = serde_json::to_string(line)?;
        text.push('\n');
        self.file.write_all(text.as_bytes())?;
        self.file.flush()?;
        Ok(())
    }

    pub(super) fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// The lines of a journal; a torn last line is dropped and the file
/// rewritten without it.
pub(super) fn read_journal(path: &Path) -> Result<Vec<Line>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let reader = BufReader::new(File::open(path)?);
    let mut lines = Vec::new();
    let mut keep = String::new();
    let mut torn = false;
    for raw in reader.split(b'\n') {
        let raw = raw?;
        match serde_json::from_slice::<Line>(&raw) {
            Ok(l) => {
                keep.push_str(std::str::from_utf8(&raw)?);
                keep.push('\n');
                lines.push(l);
            }
            Err(_) if raw.iter().all(u8::is_ascii_whitespace) => {}
            Err(_) => torn = true,
        }
    }
    if torn {
        let tmp = path.with_extension("jsonl.tmp");
        std::fs::write(&tmp, keep)?;
        std::fs::rename(&tmp, path)?;
    }
    Ok(lines)
}
