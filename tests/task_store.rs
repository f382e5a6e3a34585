//! Replicas sharing a task store (`--task-store`), served on MLX: three
//! servers on `moto_server`'s S3 API, three on Azurite's Blob Storage
//! API and three on a local folder pass every check of
//! [`common::fleet::check`]; a server killed while it writes leaves the
//! store whole; a Cloud Storage API that ignores preconditions is refused. (The vLLM backend's fleet is in
//! `tests/vllm_real.rs`, in front of a real vLLM.)

mod common;

use std::time::Duration;

use common::fleet::{self, Store};
use common::Server;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// An MLX replica on the fixture model.
fn replica(args: &[String], env: &[(&'static str, String)]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_env(&args, env)
}

/// Every check of a fleet of three MLX replicas on `store`.
fn fleet_on(store: Store, at_once: usize) {
    let m = fleet::check(&store, replica, at_once, true);
    eprintln!("{}: {m:?}", store.url());
}

#[test]
fn mlx_replicas_share_their_tasks_on_an_s3_store() {
    fleet_on(Store::s3("fleet"), 30);
}

#[test]
fn mlx_replicas_share_their_tasks_in_a_folder() {
    fleet_on(Store::folder(), 30);
}

#[test]
fn mlx_replicas_share_their_tasks_on_azure_blob_storage() {
    fleet_on(Store::azure("fleet"), 12);
}

#[test]
fn a_cloud_storage_api_that_ignores_preconditions_is_refused_at_start() {
    // gcp-storage-emulator answers Cloud Storage's reads and writes but
    // ignores `x-goog-if-generation-match` and sends no ETag: a server
    // given it as its store says so and exits, rather than serve a fleet
    // whose registrations could overwrite each other. (No emulator from
    // the registries honours the preconditions; the refusal is what a
    // `gs://` store is tested for here.)
    let gcs = fleet::Emulator::gcs();
    let account = common::fresh_dir("gcs").join("service-account.json");
    std::fs::write(
        &account,
        serde_json::json!({
            "gcs_base_url": format!("http://127.0.0.1:{}", gcs.port),
            "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""
        })
        .to_string(),
    )
    .unwrap();
    let state = common::fresh_dir("gcs-state");
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--port", "0", "--task-store", "gs://decisio/fleet"])
        .arg("--model")
        .arg(common::model_dir())
        .arg("--state-dir")
        .arg(&state)
        .env("GOOGLE_SERVICE_ACCOUNT", &account)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains(
            "--task-store gs://decisio/fleet: the store answers reads but not a create-only or \
             compare-and-swap write"
        ),
        "{log}"
    );
    assert!(!log.contains("listening on"), "{log}");
}

/// The store's object of digest `d`, checked against it.
fn object(store: &Store, d: &str) -> Value {
    let bytes = store
        .read(&format!("objects/{d}.json"))
        .unwrap_or_else(|| panic!("object {d} is missing"));
    let got: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(got, d);
    serde_json::from_slice(&bytes).unwrap()
}

fn killed_mid_write(store: Store) {
    // Registrations sent at once to one server, killed while it writes
    // them: the manifest reads whole, and each task it names is whole.
    let mut s = replica(&store.args(), &store.env());
    let (first, answered) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for i in 0..12 {
            let port = s.port;
            let first = first.clone();
            scope.spawn(move || {
                let r = common::request(
                    port,
                    "POST",
                    "/v1/tasks",
                    &[],
                    Some(
                        fleet::registration(&format!("cut-{i}"), 6)
                            .to_string()
                            .as_bytes(),
                    ),
                );
                if r.is_ok_and(|r| r.status == 202) {
                    let _ = first.send(());
                }
            });
        }
        // Killed once the first registration is in, the others on their way.
        answered.recv_timeout(Duration::from_secs(60)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        s.kill();
    });
    let manifest = store.manifest();
    let entries = manifest["entries"].as_object().unwrap().clone();
    for e in entries.values() {
        let record = object(&store, e["object"].as_str().unwrap());
        assert_eq!(record["record"]["id"], e["id"]);
        let examples = object(&store, e["examples"].as_str().unwrap());
        assert_eq!(examples["examples"].as_array().unwrap().len(), 6);
    }
    // A new server on the store has exactly the manifest's tasks, and
    // fits those left unfinished once their claims lapse.
    let fresh = replica(&store.args(), &store.env());
    let names: Vec<String> = entries
        .values()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    fleet::wait_ready(&fresh, &names, Duration::from_secs(120));
    assert_eq!(fleet::listed(&fresh).len(), names.len());
    eprintln!(
        "{} of 12 registrations were in the store when the server was killed",
        names.len()
    );
}

#[test]
fn a_server_killed_while_it_writes_leaves_the_store_whole() {
    std::thread::scope(|scope| {
        scope.spawn(|| killed_mid_write(Store::folder()));
        scope.spawn(|| killed_mid_write(Store::s3("killed")));
    });
}

#[test]
fn a_state_folder_s_tasks_move_to_the_store_at_its_first_read() {
    // A server without a store fits a task in its state folder; given a
    // store, it writes the task there at start, and a replica of a folder
    // of its own serves it with the same bits.
    let state = common::fresh_dir("migrating");
    let dir = state.to_str().unwrap().to_string();
    let mut alone = Server::start(&["--state-dir", &dir]);
    let r = alone.post_json("/v1/tasks", &fleet::registration("kept", 8));
    assert_eq!(r.status, 202, "{}", r.text());
    fleet::wait_ready(&alone, &["kept".to_string()], Duration::from_secs(120));
    let text = "Ticket 5: it never came and I want my money.";
    let before = fleet::answer(&alone, "kept", text);
    alone.kill();

    let store = Store::folder();
    let mut args = store.args();
    args.extend(["--state-dir".to_string(), dir]);
    let moved = replica(&args, &store.env());
    let manifest = store.manifest();
    let names: Vec<&Value> = manifest["entries"]
        .as_object()
        .unwrap()
        .values()
        .map(|e| &e["name"])
        .collect();
    assert_eq!(names, [&Value::from("kept")], "{manifest}");
    assert!(state.join("tasks/task-store-migrated.json").exists());
    let other = replica(&store.args(), &store.env());
    fleet::wait_ready(&other, &["kept".to_string()], Duration::from_secs(30));
    assert_eq!(fleet::answer(&other, "kept", text), before);
    assert_eq!(fleet::answer(&moved, "kept", text), before);

    // A replica of another prompt layout keeps the task and lists it, but
    // does not apply it.
    let mut args = store.args();
    args.extend(["--layout".to_string(), "header".to_string()]);
    let elsewhere = replica(&args, &store.env());
    let listed = fleet::listed(&elsewhere);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["status"], "ready");
    let r = elsewhere.post_json(
        "/v1/decide",
        &serde_json::json!({"state": text, "questions": [{"task": "kept"}]}),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.text().contains("another serving stack (layout differs)"),
        "{}",
        r.text()
    );
}
