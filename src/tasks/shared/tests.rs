//! The manifest's protocol on a folder store shared by two replicas.

use super::*;

fn record(id: &str, name: &str) -> TaskRecord {
    serde_json::from_value(serde_json::json!({
        "format_version": FORMAT_VERSION, "id": id, "created": 1, "model": "m",
        "spec": {"name": name, "kind": "choice", "question": "q", "labels": ["a", "b"],
                 "holdout": 0.25, "seed": 1, "abstention": null},
        "status": "queued", "error": null, "progress": {"done": 0, "total": 4, "rate": null, "eta_seconds": null,
                     "resumed_from": 0, "restarts": 0},
        "report": null
    }))
    .unwrap()
}

fn stored(id: &str, name: &str) -> Stored {
    Stored {
        format_version: FORMAT_VERSION,
        record: record(id, name),
        head: None,
    }
}

/// Two replicas on one fresh folder store.
fn pair(name: &str, lease: Duration) -> (Shared, Shared, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("decisio-shared-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("file://{}", dir.display());
    let settings = Settings {
        lease,
        ..Settings::default()
    };
    let a = Shared::open(settings.clone(), &url).unwrap();
    let b = Shared::open(settings, &url).unwrap();
    (a, b, dir)
}

fn conflict(e: StoreError) -> (String, String) {
    match e {
        StoreError::Conflict { param, message } => (param, message),
        other => panic!("not a conflict: {other:?}"),
    }
}

#[test]
fn a_write_over_another_version_or_name_is_refused_naming_both() {
    let (a, b, dir) = pair("conflicts", Duration::from_secs(30));
    assert_eq!(a.publish(&stored("t1", "x"), None).unwrap(), 1);
    // Another task, the same name: refused, naming both tasks.
    let (param, message) = conflict(b.publish(&stored("t2", "x"), None).unwrap_err());
    assert_eq!(param, "name");
    assert!(
        message.contains("task t1, version 1") && message.contains("task t2"),
        "{message}"
    );
    // The same task written by a replica that has not read version 1.
    let (param, message) = conflict(b.publish(&stored("t1", "x"), None).unwrap_err());
    assert_eq!(param, "id");
    assert!(
        message.contains("holds version 1, not version 0"),
        "{message}"
    );
    // Once it has read it, it writes version 2, and the first replica's
    // next write (over version 1) is refused.
    b.poll().unwrap();
    assert_eq!(b.publish(&stored("t1", "x"), None).unwrap(), 2);
    let (_, message) = conflict(a.publish(&stored("t1", "x"), None).unwrap_err());
    assert!(
        message.contains("holds version 2, not version 1"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_removal_reaches_the_others_and_its_objects_go() {
    let (a, b, dir) = pair("removal", Duration::from_secs(30));
    let examples = a
        .put_examples(&[Example {
            state: "s".into(),
            label: 0,
        }])
        .unwrap();
    a.publish(&stored("t1", "x"), Some(examples.clone()))
        .unwrap();
    let (_, changes) = b.poll().unwrap().unwrap();
    assert!(matches!(&changes[..], [Change::Apply { entry, .. }] if entry.id == "t1"));
    assert!(
        b.poll().unwrap().is_none(),
        "an unchanged manifest reads as unchanged"
    );
    a.remove("t1").unwrap();
    let (manifest, changes) = b.poll().unwrap().unwrap();
    assert!(matches!(&changes[..], [Change::Remove { id }] if id == "t1"));
    let entry = &manifest.entries[&key("t1")];
    assert!(entry.deleted && entry.version == 2);
    assert!(!dir.join(format!("objects/{examples}.json")).exists());
    // A removed task is not written again over its tombstone.
    let (_, message) = conflict(b.publish(&stored("t1", "x"), None).unwrap_err());
    assert!(message.contains("(deleted)"), "{message}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_corrupt_object_is_refused_and_the_others_applied() {
    let (a, b, dir) = pair("corrupt", Duration::from_secs(30));
    a.publish(&stored("t1", "x"), None).unwrap();
    a.publish(&stored("t2", "y"), None).unwrap();
    let manifest: Manifest =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
    let d = manifest.entries[&key("t1")].object.clone().unwrap();
    std::fs::write(dir.join(format!("objects/{d}.json")), b"{\"not\": \"it\"}").unwrap();
    let (_, changes) = b.poll().unwrap().unwrap();
    let mut refused = 0;
    for c in &changes {
        match c {
            Change::Refused { id, reason, .. } => {
                assert_eq!((id.as_str(), *reason), ("t1", "digest"));
                refused += 1;
            }
            Change::Apply { entry, .. } => assert_eq!(entry.id, "t2"),
            _ => panic!("only t2 is applied"),
        }
    }
    assert_eq!((refused, changes.len()), (1, 2));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_lapsed_claim_is_taken_over_and_its_holder_knows() {
    let (a, b, dir) = pair("claims", Duration::from_millis(300));
    assert!(a.claim("t1").unwrap());
    assert!(!b.claim("t1").unwrap(), "a live claim is not taken");
    assert!(a.confirm("t1"));
    std::thread::sleep(Duration::from_millis(400));
    assert!(b.claim("t1").unwrap(), "a lapsed claim is taken over");
    assert!(!a.confirm("t1"), "its old holder learns it lost it");
    assert!(!a.holds("t1") && b.holds("t1"));
    b.release("t1");
    assert!(a.claim("t1").unwrap(), "a released claim is free");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tombstone_past_its_time_is_dropped_and_its_task_still_goes() {
    let (a, b, dir) = pair("tombstone", Duration::from_secs(30));
    let a = Shared {
        settings: Settings {
            tombstone: Duration::from_millis(50),
            ..a.settings.clone()
        },
        ..a
    };
    a.publish(&stored("t1", "x"), None).unwrap();
    b.poll().unwrap();
    a.remove("t1").unwrap();
    let manifest: Manifest =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
    assert!(manifest.entries[&key("t1")].deleted, "kept while young");
    std::thread::sleep(Duration::from_millis(80));
    // The next write drops it; a replica that never read the tombstone
    // still removes the task, which is gone from the manifest.
    a.publish(&stored("t2", "y"), None).unwrap();
    let (manifest, changes) = b.poll().unwrap().unwrap();
    assert!(!manifest.entries.contains_key(&key("t1")));
    assert!(changes
        .iter()
        .any(|c| matches!(c, Change::Remove { id } if id == "t1")));
    let _ = std::fs::remove_dir_all(dir);
}
