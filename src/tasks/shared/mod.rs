//! The task store replicas share (`--task-store URL`): what every replica
//! behind a load balancer reads its tasks from, so that a task registered
//! on one answers on all. `docs/design/task-store.md` states the layout and
//! every guarantee; in short, under the store's prefix:
//!
//! ```text
//! MANIFEST.json          which object is each task's current version
//! objects/<sha256>.json  immutable task versions and example sets, named
//!                        by the digest of their bytes
//! claims/<task id>.json  which replica fits a registration, until when
//! ```
//!
//! - A write puts its objects first (create-only: the same bytes are the
//!   same object), then rewrites the manifest by compare-and-swap: created
//!   only when absent, else replaced only over the version it read. A
//!   write that lost the race reads again and retries; one that finds the
//!   task changed by another writer since the version it names is refused
//!   (409), as is a name another task holds.
//! - A removal is a tombstone entry, dropped from the manifest after the
//!   tombstone time; the objects no entry names any more are removed with
//!   the write that stopped naming them.
//! - Replicas follow the manifest with a conditional read every poll (an
//!   unchanged manifest comes back empty) and fetch the objects of the
//!   entries newer than the versions they apply, each checked against its
//!   digest.
//! - A registration is fitted once across the fleet: its replica holds a
//!   claim, renewed while it fits; a claim not renewed within the lease is
//!   taken over by another replica, which fits the registration from its
//!   examples in the store.
//!
//! This module is the store's protocol; `src/tasks/sync.rs` applies what it
//! reads to a server's tasks.

mod abstention;
mod claims;
mod follow;
pub mod objects;

pub use self::follow::Report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use self::abstention::StoredAbstention;
use self::objects::{Fault, Got, Objects, Tag, Write};
use super::abstention::AbstentionTask;
use super::{Example, Status, TaskRecord, FORMAT_VERSION};
use crate::settings::TaskStore as Settings;
use crate::stats::head::Head;

/// The manifest's name under the store's prefix.
pub const MANIFEST: &str = "MANIFEST.json";

/// The manifest's format: a store of another format is refused, not
/// overwritten.
pub const MANIFEST_FORMAT: &str = "decisio-task-manifest/rs-1";

/// How often one write retries after losing the manifest to another
/// writer (each retry reads the manifest again).
const MAX_RACES: usize = 64;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The sha256 of `bytes`, in hex: an object's name.
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What an entry holds: a task (`/v1/tasks`), or an abstention task
/// (`/v1/abstention/tasks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    #[default]
    Task,
    Abstention,
}

impl EntryKind {
    fn as_str(self) -> &'static str {
        match self {
            EntryKind::Task => "task",
            EntryKind::Abstention => "abstention",
        }
    }
}

/// One task's line in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(default)]
    pub kind: EntryKind,
    pub id: String,
    /// The task's name (a name is one task's across the fleet).
    pub name: String,
    /// Counts the writes of this task, from 1.
    pub version: u64,
    /// The status of the version the object holds.
    pub status: Option<Status>,
    /// The digest of the task version's object; `None` for a tombstone.
    pub object: Option<String>,
    /// The digest of the examples' object.
    pub examples: Option<String>,
    pub deleted: bool,
    /// Unix milliseconds of the write.
    pub updated_ms: u64,
    /// The replica that wrote it.
    pub writer: String,
}

impl Entry {
    fn objects(&self) -> impl Iterator<Item = &String> {
        self.object.iter().chain(self.examples.iter())
    }
}

/// The manifest: the current version of every task, and the tombstones of
/// removed ones.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    /// Counts the manifest's writes.
    pub version: u64,
    /// Unix milliseconds of the last write.
    pub updated_ms: u64,
    /// By key `task/<id>`.
    pub entries: BTreeMap<String, Entry>,
}

impl Default for Manifest {
    fn default() -> Self {
        Manifest {
            format: MANIFEST_FORMAT.into(),
            version: 0,
            updated_ms: 0,
            entries: BTreeMap::new(),
        }
    }
}

impl Manifest {
    /// The live task named `name`, other than `id`.
    pub fn named(&self, name: &str, id: &str) -> Option<&Entry> {
        self.entries
            .values()
            .find(|e| e.kind == EntryKind::Task && !e.deleted && e.name == name && e.id != id)
    }

    fn referenced(&self) -> HashSet<String> {
        self.entries
            .values()
            .flat_map(|e| e.objects().cloned())
            .collect()
    }
}

/// The key of task `id` in the manifest.
pub fn key(id: &str) -> String {
    key_of(EntryKind::Task, id)
}

/// The key of an entry of `kind` and `id`: `task/<id>`, `abstention/<id>`.
pub fn key_of(kind: EntryKind, id: &str) -> String {
    format!("{}/{id}", kind.as_str())
}

/// One version of a task as its object holds it: the record (spec,
/// status, report, certificate) and an intent task's head.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stored {
    pub format_version: u32,
    pub record: TaskRecord,
    #[serde(default)]
    pub head: Option<Head>,
}

/// The examples' object.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredExamples {
    format_version: u32,
    examples: Vec<Example>,
}

/// A replica's claim on a registration: it fits it until `expires_ms`,
/// and renews the claim while it does.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Claim {
    task: String,
    owner: String,
    expires_ms: u64,
}

/// What a manifest line names, for a write.
pub(super) struct Line<'a> {
    pub(super) kind: EntryKind,
    pub(super) id: &'a str,
    pub(super) name: &'a str,
    pub(super) status: Option<Status>,
}

/// Why a store operation failed.
#[derive(Debug)]
pub enum StoreError {
    /// The store could not be reached or written: the change was not made
    /// (503, with `Retry-After`).
    Unavailable(String),
    /// The store holds another version than the write names, or another
    /// task holds the name (409).
    Conflict { param: String, message: String },
    /// An object is not what its name says: refused, with the reason.
    Refused {
        reason: &'static str,
        message: String,
    },
}

impl StoreError {
    fn of(label: &str, what: &str, fault: Fault) -> StoreError {
        match fault {
            Fault::Unavailable(e) => {
                StoreError::Unavailable(format!("the task store {label} cannot {what}: {e}"))
            }
            Fault::Exists | Fault::Stale => StoreError::Unavailable(format!(
                "the task store {label} cannot {what}: it changed meanwhile"
            )),
        }
    }
}

/// What a replica follows of the manifest.
#[derive(Debug, Default)]
struct Followed {
    /// The tag of the manifest last read, for the next conditional read.
    tag: Option<Tag>,
    /// By entry key: the version applied (or written) here.
    applied: HashMap<String, u64>,
    /// The manifest version applied.
    manifest_version: u64,
    /// When a read last succeeded.
    synced: Option<Instant>,
    last_error: Option<String>,
    /// Seconds from the write of the last change applied to its applying.
    lag_seconds: Option<f64>,
    /// The registrations the manifest last read says are to be fitted.
    pending: Vec<Entry>,
}

/// A changed entry a poll found, with its object when it is live.
pub enum Change {
    Apply {
        entry: Entry,
        stored: Box<Stored>,
    },
    Remove {
        id: String,
    },
    ApplyAbstention {
        entry: Entry,
        task: Box<AbstentionTask>,
    },
    RemoveAbstention {
        id: String,
    },
    /// The entry's object could not be used; the others are applied.
    Refused {
        id: String,
        reason: &'static str,
        message: String,
    },
}

/// The shared store of one replica.
pub struct Shared {
    objects: Objects,
    /// The store's URL without credentials.
    pub label: String,
    /// This replica's name in claims and entries: random, per process.
    pub replica: String,
    pub settings: Settings,
    followed: Mutex<Followed>,
    /// The tags of the claims this replica holds, by task id.
    claims: Mutex<HashMap<String, Tag>>,
    /// One manifest write at a time from this replica.
    writes: Mutex<()>,
    /// One claim renewal at a time from this replica.
    renewing: Mutex<()>,
}

impl Shared {
    /// Opens the store of `settings.url` and checks that it refuses a
    /// create-only write over an object and an update over a stale
    /// version (a store that ignored them would let two writes overwrite
    /// each other unseen). A store that cannot be reached is opened all
    /// the same (the replica serves what its state folder holds and
    /// follows the store once it answers).
    pub fn open(settings: Settings, url: &str) -> Result<Self, String> {
        let objects = Objects::open(url)?;
        let replica = format!(
            "{:016x}",
            crate::rng::SplitMix::from_entropy().next_u64() ^ u64::from(std::process::id())
        );
        let shared = Shared {
            objects,
            label: objects::sanitized(url),
            replica,
            settings,
            followed: Mutex::new(Followed::default()),
            claims: Mutex::new(HashMap::new()),
            writes: Mutex::new(()),
            renewing: Mutex::new(()),
        };
        shared.probe()?;
        Ok(shared)
    }

    fn probe(&self) -> Result<(), String> {
        let name = format!("probe/{}.json", self.replica);
        let fail = |what: &str| {
            format!(
                "--task-store {}: the store {what}; decisio needs create-only and \
                 compare-and-swap writes to keep two registrations from overwriting each other",
                self.label
            )
        };
        let o = &self.objects;
        let check = || -> Result<(), Fault> {
            let first = o.put(&name, b"1", Write::Create)?;
            match o.put(&name, b"2", Write::Create) {
                Err(Fault::Exists) => {}
                Err(e) => return Err(e),
                Ok(_) => return Err(Fault::Exists),
            }
            o.put(&name, b"3", Write::Update(first.clone()))?;
            match o.put(&name, b"4", Write::Update(first)) {
                Err(Fault::Stale) => Ok(()),
                Err(e) => Err(e),
                Ok(_) => Err(Fault::Stale),
            }
        };
        // A store that answers reads but fails the writes twice (an answer
        // without the version's tag, a 501) is refused; one that answers
        // nothing is only out of reach.
        let answers_reads = || o.get(MANIFEST, None).is_ok();
        let mut checked = check();
        if matches!(checked, Err(Fault::Unavailable(_))) && answers_reads() {
            let _ = o.delete(&name);
            checked = check();
            if let Err(Fault::Unavailable(e)) = &checked {
                if answers_reads() {
                    let _ = o.delete(&name);
                    return Err(fail(&format!(
                        "answers reads but not a create-only or compare-and-swap write ({e})"
                    )));
                }
            }
        }
        let _ = o.delete(&name);
        match checked {
            Ok(()) => Ok(()),
            Err(Fault::Exists) => Err(fail("accepts a create-only write over an existing object")),
            Err(Fault::Stale) => Err(fail("accepts a write against a stale version")),
            Err(Fault::Unavailable(e)) => {
                tracing::warn!(
                    "task store {}: cannot be reached at start ({e}); serving the tasks of the \
                     state folder and following the store once it answers",
                    self.label
                );
                self.followed().last_error = Some(e);
                Ok(())
            }
        }
    }

    fn followed(&self) -> MutexGuard<'_, Followed> {
        self.followed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claims(&self) -> MutexGuard<'_, HashMap<String, Tag>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The manifest and its tag (an empty one and no tag when there is
    /// none yet); `None` when it is still the version `unless` names.
    fn read_manifest(
        &self,
        unless: Option<&Tag>,
    ) -> Result<Option<(Manifest, Option<Tag>)>, StoreError> {
        let got = self
            .objects
            .get(MANIFEST, unless)
            .map_err(|f| StoreError::of(&self.label, "be read", f))?;
        let (bytes, tag) = match got {
            Got::Unchanged => return Ok(None),
            Got::Missing => return Ok(Some((Manifest::default(), None))),
            Got::Found { bytes, tag } => (bytes, tag),
        };
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Refused {
                reason: "manifest",
                message: format!(
                    "{MANIFEST} in {} is not a decisio manifest ({e}); nothing is written to it",
                    self.label
                ),
            })?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(StoreError::Refused {
                reason: "manifest",
                message: format!(
                    "{MANIFEST} in {} is of format `{}`, not {MANIFEST_FORMAT}; give this \
                     server a store (or a prefix) of its own",
                    self.label, manifest.format
                ),
            });
        }
        Ok(Some((manifest, Some(tag))))
    }

    /// Puts `bytes` as the object of their digest; the digest.
    fn put_object(&self, bytes: &[u8]) -> Result<String, StoreError> {
        let d = digest(bytes);
        match self
            .objects
            .put(&format!("objects/{d}.json"), bytes, Write::Create)
        {
            Ok(_) | Err(Fault::Exists) => Ok(d),
            Err(f) => Err(StoreError::of(&self.label, "be written", f)),
        }
    }

    /// The object of digest `d`, checked against it.
    pub(super) fn get_object(&self, d: &str) -> Result<Vec<u8>, StoreError> {
        let got = self
            .objects
            .get(&format!("objects/{d}.json"), None)
            .map_err(|f| StoreError::of(&self.label, "be read", f))?;
        let Got::Found { bytes, .. } = got else {
            // Removed by a write this replica has not read yet.
            return Err(StoreError::Unavailable(format!(
                "task object {} is not in the store (yet)",
                &d[..12.min(d.len())]
            )));
        };
        if digest(&bytes) != d {
            return Err(StoreError::Refused {
                reason: "digest",
                message: format!(
                    "task object {}: its bytes do not match its digest; not applied",
                    &d[..12.min(d.len())]
                ),
            });
        }
        Ok(bytes)
    }

    /// A task version's object, parsed and checked.
    pub fn get_task(&self, entry: &Entry) -> Result<Stored, StoreError> {
        let d = entry.object.as_deref().unwrap_or_default();
        let bytes = self.get_object(d)?;
        let short = &d[..12.min(d.len())];
        let stored: Stored = serde_json::from_slice(&bytes).map_err(|e| StoreError::Refused {
            reason: "format",
            message: format!("task object {short} is not a decisio task ({e}); not applied"),
        })?;
        if stored.format_version != FORMAT_VERSION || stored.record.id != entry.id {
            return Err(StoreError::Refused {
                reason: "foreign",
                message: format!(
                    "task object {short} holds task `{}` in format {}, where the manifest names \
                     `{}` in format {FORMAT_VERSION}; not applied",
                    stored.record.id, stored.format_version, entry.id
                ),
            });
        }
        Ok(stored)
    }

    /// Puts a task's examples; their object's digest.
    pub fn put_examples(&self, examples: &[Example]) -> Result<String, StoreError> {
        let bytes = serde_json::to_vec(&StoredExamples {
            format_version: FORMAT_VERSION,
            examples: examples.to_vec(),
        })
        .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        self.put_object(&bytes)
    }

    pub fn get_examples(&self, d: &str) -> Result<Vec<Example>, StoreError> {
        let bytes = self.get_object(d)?;
        let stored: StoredExamples =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Refused {
                reason: "format",
                message: format!("examples object {} is not decisio's ({e})", &d[..12]),
            })?;
        Ok(stored.examples)
    }

    /// Writes a version of task `stored.record` (its object, then its
    /// entry), over the version this replica applied; `examples`: the
    /// examples' object, kept from the entry when `None`. Refused (409)
    /// when the store holds another version of it, or another task holds
    /// its name.
    pub fn publish(&self, stored: &Stored, examples: Option<String>) -> Result<u64, StoreError> {
        let record = &stored.record;
        let line = Line {
            kind: EntryKind::Task,
            id: &record.id,
            name: &record.spec.name,
            status: Some(record.status),
        };
        self.publish_entry(line, stored, examples)
    }

    pub(super) fn publish_entry(
        &self,
        line: Line<'_>,
        object: &impl Serialize,
        examples: Option<String>,
    ) -> Result<u64, StoreError> {
        let bytes =
            serde_json::to_vec(object).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let object = self.put_object(&bytes)?;
        let (id, what) = (line.id, line.kind.as_str());
        let k = key_of(line.kind, id);
        self.write(|manifest, applied| {
            if line.kind == EntryKind::Task {
                if let Some(other) = manifest.named(line.name, id) {
                    return Err(StoreError::Conflict {
                        param: "name".into(),
                        message: format!(
                            "a task named `{}` was registered on another replica meanwhile \
                             (task {}, version {}; this write: task {id}); DELETE it first or \
                             choose another name",
                            line.name, other.id, other.version
                        ),
                    });
                }
            }
            let old = manifest.entries.get(&k);
            let (store_v, deleted) = old.map_or((0, false), |e| (e.version, e.deleted));
            let mine = applied.get(&k).copied().unwrap_or(0);
            if store_v != mine || (deleted && line.kind == EntryKind::Task) {
                return Err(StoreError::Conflict {
                    param: "id".into(),
                    message: format!(
                        "{what} {id}: the shared store holds version {store_v}{}, not version \
                         {mine} that this write replaces; read it again and send the change again",
                        if deleted { " (deleted)" } else { "" },
                    ),
                });
            }
            let entry = Entry {
                kind: line.kind,
                id: id.to_string(),
                name: line.name.to_string(),
                version: store_v + 1,
                status: line.status,
                object: Some(object.clone()),
                examples: examples
                    .clone()
                    .or_else(|| old.and_then(|e| e.examples.clone())),
                deleted: false,
                updated_ms: now_ms(),
                writer: self.replica.clone(),
            };
            manifest.entries.insert(k.clone(), entry);
            Ok(())
        })?;
        Ok(self.followed().applied.get(&k).copied().unwrap_or(0))
    }

    /// Writes task `id`'s tombstone; nothing when the store has no live
    /// version of it.
    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        self.remove_entry(EntryKind::Task, id)?;
        self.release(id);
        Ok(())
    }

    pub(super) fn remove_entry(&self, kind: EntryKind, id: &str) -> Result<(), StoreError> {
        let k = key_of(kind, id);
        self.write(|manifest, _| {
            let Some(entry) = manifest.entries.get_mut(&k).filter(|e| !e.deleted) else {
                return Ok(());
            };
            entry.version += 1;
            entry.deleted = true;
            entry.object = None;
            entry.examples = None;
            entry.status = None;
            entry.updated_ms = now_ms();
            entry.writer = self.replica.clone();
            Ok(())
        })
    }

    /// Reads the manifest, changes it with `change` (given the versions
    /// this replica applied), and writes it over the version read,
    /// retried while other writers win the race. The objects the new
    /// manifest no longer names are removed after it is written.
    fn write(
        &self,
        change: impl Fn(&mut Manifest, &HashMap<String, u64>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let _one = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = 5u64;
        for _ in 0..MAX_RACES {
            let (mut manifest, tag) = self.read_manifest(None)?.unwrap_or_default();
            let before = manifest.clone();
            change(&mut manifest, &self.followed().applied)?;
            if manifest.entries == before.entries {
                return Ok(());
            }
            manifest.version += 1;
            manifest.updated_ms = now_ms();
            let cutoff = manifest
                .updated_ms
                .saturating_sub(self.settings.tombstone.as_millis() as u64);
            manifest
                .entries
                .retain(|_, e| !(e.deleted && e.updated_ms < cutoff));
            let bytes = serde_json::to_vec_pretty(&manifest)
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            let how = match tag {
                Some(t) => Write::Update(t),
                None => Write::Create,
            };
            match self.objects.put(MANIFEST, &bytes, how) {
                Ok(_) => {
                    let mut f = self.followed();
                    for (k, e) in &manifest.entries {
                        if before.entries.get(k) != Some(e) {
                            f.applied.insert(k.clone(), e.version);
                        }
                    }
                    drop(f);
                    let kept = manifest.referenced();
                    for d in before.referenced().difference(&kept) {
                        let _ = self.objects.delete(&format!("objects/{d}.json"));
                    }
                    return Ok(());
                }
                Err(Fault::Exists | Fault::Stale) => {
                    // Another writer won: read again after a jittered wait.
                    let jitter = crate::rng::SplitMix::from_entropy().below(wait + 1);
                    std::thread::sleep(Duration::from_millis(wait + jitter));
                    wait = (wait * 2).min(200);
                }
                Err(f) => return Err(StoreError::of(&self.label, "be written", f)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "the task store {}'s manifest kept changing under this write; try again",
            self.label
        )))
    }

    /// The version of task `id` this replica applies (0: none).
    pub fn applied(&self, id: &str) -> u64 {
        self.followed().applied.get(&key(id)).copied().unwrap_or(0)
    }

    /// Whether task `id` is still to be fitted, as the manifest says now.
    pub fn is_pending(&self, id: &str) -> Result<bool, StoreError> {
        let (manifest, _) = self.read_manifest(None)?.unwrap_or_default();
        Ok(manifest
            .entries
            .get(&key(id))
            .is_some_and(|e| !e.deleted && e.status.is_some_and(Status::pending)))
    }

    /// The registrations to be fitted, as the manifest last read says.
    pub fn pending(&self) -> Vec<Entry> {
        self.followed().pending.clone()
    }
}

#[cfg(test)]
mod tests;
