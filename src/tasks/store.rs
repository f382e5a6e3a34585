//! The state folder: one JSON file per task, its examples, a checkpoint of
//! the letter logits (or, for an intent task, hidden states) scored so
//! far, an intent task's head, and one file of the abstention tasks, each
//! written atomically (a temporary file in the same folder, fsync, rename,
//! fsync of the folder), so a crash leaves either the old file or the new
//! one, never half of one.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::abstention::AbstentionTask;
use super::{Example, TaskRecord, FORMAT_VERSION};
use crate::stats::head::Head;

/// An intent task's fitted head.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadFile {
    pub format_version: u32,
    pub id: String,
    pub head: Head,
}

/// Rows of one sealed checkpoint segment.
pub const SEGMENT_ROWS: usize = 32;

/// The checkpoint of a registration: the letter logits (an intent task:
/// the hidden states) of its first `sealed * SEGMENT_ROWS + logits.len()`
/// examples, in example order. The first `sealed` runs of
/// [`SEGMENT_ROWS`] rows are in segment files of their own, each written
/// once; `logits` holds the rows after them. A save writes the segments
/// sealed since the last one and this file, so its cost does not grow with
/// the rows already kept.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    pub format_version: u32,
    pub id: String,
    #[serde(default)]
    pub sealed: usize,
    pub logits: Vec<Vec<f32>>,
}

/// One sealed run of [`SEGMENT_ROWS`] checkpoint rows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Segment {
    pub format_version: u32,
    pub id: String,
    /// The segment's place: rows `index * SEGMENT_ROWS ..`.
    pub index: usize,
    pub logits: Vec<Vec<f32>>,
}

/// A task's labelled examples, written once at registration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Examples {
    pub format_version: u32,
    pub id: String,
    pub examples: Vec<Example>,
}

/// The file of the abstention tasks, beside the task records.
pub const ABSTENTION_FILE: &str = "abstention-tasks.json";

#[derive(Serialize, Deserialize)]
struct AbstentionFile {
    format_version: u32,
    tasks: Vec<AbstentionTask>,
}

/// The task files under `<state-dir>/tasks/`, and the lock that keeps the
/// folder to one server (released when the process ends, however it ends).
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    _lock: File,
}

/// The default state folder: `$XDG_STATE_HOME/decisio`, else
/// `~/.local/state/decisio`.
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("decisio");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".local/state/decisio")
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

pub(super) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{} is not a task file: {e}", path.display()))
}

/// Refuses a file written in another format, naming both versions.
fn check_version(path: &Path, dir: &Path) -> Result<(), String> {
    let value: serde_json::Value = read_json(path)?;
    let version = value.get("format_version").and_then(|v| v.as_u64());
    match version {
        Some(v) if v == u64::from(FORMAT_VERSION) => Ok(()),
        other => Err(format!(
            "the state folder {} holds {} in task format {}; this decisio reads format \
             {FORMAT_VERSION} only. Register the tasks again with a fresh --state-dir (or move \
             the folder aside).",
            dir.display(),
            path.file_name().unwrap_or_default().to_string_lossy(),
            other.map_or("(none)".to_string(), |v| v.to_string())
        )),
    }
}

impl Store {
    /// Opens (creating) `<root>/tasks`, removes temporary files a crash left
    /// behind, and checks every file's format version.
    pub fn open(root: &Path) -> Result<Self, String> {
        let dir = root.join("tasks");
        fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the state folder {}: {e}", dir.display()))?;
        let lock_path = root.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(format!(
                    "the state folder {} is in use by another decisio server; give this one a \
                     folder of its own with --state-dir",
                    root.display()
                ))
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(format!("cannot lock {}: {e}", lock_path.display()))
            }
        }
        let store = Store { dir, _lock: lock };
        for path in store.files()? {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                fs::remove_file(&path)
                    .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                continue;
            }
            if name.ends_with(".json") {
                check_version(&path, root)?;
            }
        }
        Ok(store)
    }

    /// The folder of the task files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn files(&self) -> Result<Vec<PathBuf>, String> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.dir)
            .map_err(|e| format!("cannot list {}: {e}", self.dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        Ok(files)
    }

    /// The folder of abstention registrations in progress
    /// ([`super::abstention_job`]), beside the task records.
    pub(super) fn abstention_jobs_dir(&self) -> PathBuf {
        self.dir.join("abstention")
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn checkpoint_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.scores.json"))
    }

    fn segment_path(&self, id: &str, index: usize) -> PathBuf {
        self.dir.join(format!("{id}.scores.{index:05}.json"))
    }

    fn examples_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.examples.json"))
    }

    fn head_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.head.json"))
    }

    pub fn save_head(&self, id: &str, head: &Head) -> Result<(), String> {
        let h = HeadFile {
            format_version: FORMAT_VERSION,
            id: id.to_string(),
            head: head.clone(),
        };
        let bytes = serde_json::to_vec(&h).map_err(|e| e.to_string())?;
        let path = self.head_path(id);
        write_atomic(&path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    pub fn load_head(&self, id: &str) -> Result<Head, String> {
        let h: HeadFile = read_json(&self.head_path(id))?;
        Ok(h.head)
    }

    pub fn save_examples(&self, id: &str, examples: &[Example]) -> Result<(), String> {
        let e = Examples {
            format_version: FORMAT_VERSION,
            id: id.to_string(),
            examples: examples.to_vec(),
        };
        let bytes = serde_json::to_vec(&e).map_err(|e| e.to_string())?;
        let path = self.examples_path(id);
        write_atomic(&path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    pub fn load_examples(&self, id: &str) -> Result<Vec<Example>, String> {
        let e: Examples = read_json(&self.examples_path(id))?;
        Ok(e.examples)
    }

    /// Every task record.
    pub fn load(&self) -> Result<Vec<TaskRecord>, String> {
        let mut out = Vec::new();
        for path in self.files()? {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let side = name.contains(".scores.")
                || name.ends_with(".examples.json")
                || name.ends_with(".head.json")
                || name == ABSTENTION_FILE;
            if name.ends_with(".json") && !side && !name.starts_with('.') {
                out.push(read_json(&path)?);
            }
        }
        Ok(out)
    }

    /// The abstention tasks ([`super::abstention`]), none when never saved.
    pub fn load_abstention(&self) -> Result<Vec<AbstentionTask>, String> {
        let path = self.dir.join(ABSTENTION_FILE);
        if !path.exists() {
            return Ok(Vec::new());
        }
        let file: AbstentionFile = read_json(&path)?;
        Ok(file.tasks)
    }

    pub fn save_abstention(&self, tasks: Vec<AbstentionTask>) -> Result<(), String> {
        let file = AbstentionFile {
            format_version: FORMAT_VERSION,
            tasks,
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
        let path = self.dir.join(ABSTENTION_FILE);
        write_atomic(&path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    pub fn save(&self, record: &TaskRecord) -> Result<(), String> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
        let path = self.record_path(&record.id);
        write_atomic(&path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Saves the checkpoint of `logits`, the rows scored so far. `sealed`
    /// is the number of segments already on disk for these rows (0 after a
    /// checkpoint was dropped; the count [`Store::load_checkpoint`] returns
    /// on resuming); the segments sealed since are written first, then the
    /// checkpoint naming them, so a crash leaves a checkpoint whose
    /// segments are all whole.
    pub fn save_checkpoint(
        &self,
        id: &str,
        logits: &[Vec<f32>],
        sealed: &mut usize,
    ) -> Result<(), String> {
        let full = logits.len() / SEGMENT_ROWS;
        for index in (*sealed).min(full)..full {
            let s = Segment {
                format_version: FORMAT_VERSION,
                id: id.to_string(),
                index,
                logits: logits[index * SEGMENT_ROWS..(index + 1) * SEGMENT_ROWS].to_vec(),
            };
            let bytes = serde_json::to_vec(&s).map_err(|e| e.to_string())?;
            let path = self.segment_path(id, index);
            write_atomic(&path, &bytes)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        *sealed = full;
        let c = Checkpoint {
            format_version: FORMAT_VERSION,
            id: id.to_string(),
            sealed: full,
            logits: logits[full * SEGMENT_ROWS..].to_vec(),
        };
        let bytes = serde_json::to_vec(&c).map_err(|e| e.to_string())?;
        let path = self.checkpoint_path(id);
        write_atomic(&path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// The logits scored before an interruption and the number of
    /// segments they fill on disk (none when no checkpoint, or when a
    /// segment it names is missing or out of place).
    pub fn load_checkpoint(&self, id: &str) -> Result<(Vec<Vec<f32>>, usize), String> {
        let path = self.checkpoint_path(id);
        if !path.exists() {
            return Ok((Vec::new(), 0));
        }
        let c: Checkpoint = read_json(&path)?;
        let mut rows = Vec::with_capacity(c.sealed * SEGMENT_ROWS + c.logits.len());
        for index in 0..c.sealed {
            let s: Segment = match read_json(&self.segment_path(id, index)) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("task {id}: checkpoint dropped: {e}");
                    return Ok((Vec::new(), 0));
                }
            };
            if s.index != index || s.logits.len() != SEGMENT_ROWS {
                tracing::warn!("task {id}: checkpoint dropped: segment {index} is out of place");
                return Ok((Vec::new(), 0));
            }
            rows.extend(s.logits);
        }
        rows.extend(c.logits);
        Ok((rows, c.sealed))
    }

    /// Removes the checkpoint: its file first (a crash meanwhile leaves
    /// segments no checkpoint names, overwritten by the next run), then
    /// its segments.
    pub fn remove_checkpoint(&self, id: &str) {
        let _ = fs::remove_file(self.checkpoint_path(id));
        let prefix = format!("{id}.scores.");
        if let Ok(files) = self.files() {
            for path in files {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                if name.starts_with(&prefix) && name.ends_with(".json") {
                    let _ = fs::remove_file(&path);
                }
            }
        }
    }

    /// Removes a task's files.
    pub fn remove(&self, id: &str) -> Result<(), String> {
        self.remove_checkpoint(id);
        let _ = fs::remove_file(self.examples_path(id));
        let _ = fs::remove_file(self.head_path(id));
        let path = self.record_path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
        }
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "decisio-store-{name}-{}-{}",
            std::process::id(),
            SEGMENT_ROWS
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn rows(n: usize) -> Vec<Vec<f32>> {
        (0..n).map(|i| vec![i as f32, 0.5, -1.0]).collect()
    }

    #[test]
    fn a_checkpoint_grows_by_segments_and_loads_whole() {
        let root = fresh("segments");
        let store = Store::open(&root).unwrap();
        let id = "task-1";
        let mut sealed = 0;
        // Saved as a registration saves it: after each few rows.
        for n in [3, SEGMENT_ROWS - 1, SEGMENT_ROWS, 2 * SEGMENT_ROWS + 5] {
            store.save_checkpoint(id, &rows(n), &mut sealed).unwrap();
            assert_eq!(sealed, n / SEGMENT_ROWS);
            assert_eq!(store.load_checkpoint(id).unwrap(), (rows(n), sealed));
        }
        // Each sealed segment is its own whole JSON file, never rewritten.
        let segment = store.segment_path(id, 0);
        let before = fs::metadata(&segment).unwrap().modified().unwrap();
        store
            .save_checkpoint(id, &rows(2 * SEGMENT_ROWS + 9), &mut sealed)
            .unwrap();
        assert_eq!(fs::metadata(&segment).unwrap().modified().unwrap(), before);
        // A checkpoint naming a missing segment is dropped whole.
        fs::remove_file(store.segment_path(id, 1)).unwrap();
        assert_eq!(store.load_checkpoint(id).unwrap(), (Vec::new(), 0));
        // After a dropped checkpoint the segments are written again.
        let mut sealed = 0;
        store
            .save_checkpoint(id, &rows(2 * SEGMENT_ROWS), &mut sealed)
            .unwrap();
        assert_eq!(
            store.load_checkpoint(id).unwrap(),
            (rows(2 * SEGMENT_ROWS), 2)
        );
        // The files are task side files, not records.
        assert!(store.load().unwrap().is_empty());
        store.remove_checkpoint(id);
        assert_eq!(store.files().unwrap().len(), 0);
        assert_eq!(store.load_checkpoint(id).unwrap(), (Vec::new(), 0));
        drop(store);
        let _ = fs::remove_dir_all(&root);
    }
}
