//! Replicas that share one task store (`--task-store`), and the checks a
//! fleet must pass on every backend: a task registered on one replica
//! answers on the others with the same bits; registrations sent at once
//! across the replicas are each fitted once; a removal reaches the others
//! within the poll; the store out of reach answers writes 503 and loses
//! nothing; a replica killed while it fits leaves the registration to
//! another.
//!
//! The stores are real: moto's S3 API (PyPI, in the test venv, served
//! one request at a time: [`Emulator::moto`]) and Azurite (Azure's Blob Storage emulator, from npm) on
//! 127.0.0.1, each reached through a proxy the test can cut, and a local
//! folder.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{cache_dir, fresh_dir, Server};

/// The poll and the lease the fleets run with: short, so that the checks
/// are quick.
pub const POLL_SECONDS: f64 = 0.25;
pub const LEASE_SECONDS: f64 = 3.0;

/// A TCP proxy to a store that a test can cut: while cut, every
/// connection is closed as soon as it opens, and those open are shut.
pub struct Proxy {
    pub port: u16,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (up2, open2) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let mut open = open2.lock().unwrap();
                open.retain(|s| s.peer_addr().is_ok());
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                drop(open);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, up, open }
    }

    /// The store out of reach.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The store back.
    pub fn mend(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// A store's emulator on 127.0.0.1, with the bucket (or container)
/// `decisio`; stopped on drop.
pub struct Emulator {
    child: Child,
    pub port: u16,
}

/// The well-known account of Azure's storage emulators.
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The Azure SDK for Python's connection string for Azurite on `port`.
fn azurite_connection(port: u16) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};\
         BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )
}

/// Runs `script` with the test venv's Python and `args`: its output, or
/// `None` when it exits 3 (the object is not there).
fn python(script: &str, args: &[String]) -> Option<Vec<u8>> {
    let out = Command::new(cache_dir().join("venv/bin/python"))
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => Some(out.stdout),
        Some(3) => None,
        _ => panic!("{}", String::from_utf8_lossy(&out.stderr)),
    }
}

impl Emulator {
    /// Starts `program` (with `args`, its port last) and waits until
    /// `ready` says it made the bucket.
    fn start(what: &str, program: PathBuf, args: &[&str], ready: impl Fn(u16) -> bool) -> Self {
        let port = super::vllm::free_port();
        let child = Command::new(&program)
            .args(args)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "start {what} ({}): {e}; make test installs it",
                    program.display()
                )
            });
        let emulator = Emulator { child, port };
        let start = Instant::now();
        while !ready(port) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what} did not answer on :{port}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        emulator
    }

    /// moto's S3 API (PyPI, in the test venv), as `moto_server` serves
    /// it but one request at a time: moto checks a write's `If-Match` or
    /// `If-None-Match` and then writes, without a lock, so two conditional
    /// writes racing on `moto_server`'s threads can both pass (one CI run
    /// lost a registration so); S3 decides them atomically.
    pub fn moto() -> Self {
        let script = "import sys, threading\n\
            from werkzeug.serving import run_simple\n\
            from moto.server import DomainDispatcherApplication, create_backend_app\n\
            app = DomainDispatcherApplication(create_backend_app)\n\
            lock = threading.Lock()\n\
            def serial(environ, start_response):\n    \
            with lock:\n        return list(app(environ, start_response))\n\
            run_simple('127.0.0.1', int(sys.argv[1]), serial, threaded=True)\n";
        Self::start(
            "moto's S3 API",
            cache_dir().join("venv/bin/python"),
            &["-c", script],
            |port| {
                super::request(port, "PUT", "/decisio", &[], Some(b""))
                    .is_ok_and(|r| r.status == 200)
            },
        )
    }

    /// Azurite, Azure's Blob Storage emulator from npm, in memory.
    pub fn azurite() -> Self {
        let script = "import sys\n\
            from azure.storage.blob import BlobServiceClient\n\
            try:\n    BlobServiceClient.from_connection_string(sys.argv[1]).create_container('decisio')\n\
            except Exception:\n    sys.exit(3)\n";
        Self::start(
            "Azurite",
            cache_dir().join("azurite/node_modules/.bin/azurite-blob"),
            &[
                "--inMemoryPersistence",
                "--silent",
                "--skipApiVersionCheck",
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
            ],
            |port| python(script, &[azurite_connection(port)]).is_some(),
        )
    }

    /// `gcp-storage-emulator`, a Cloud Storage API from PyPI, in the test
    /// venv, in memory.
    pub fn gcs() -> Self {
        Self::start(
            "gcp-storage-emulator",
            cache_dir().join("venv/bin/gcp-storage-emulator"),
            &[
                "start",
                "-q",
                "-M",
                "--default-bucket",
                "decisio",
                "-H",
                "127.0.0.1",
                "--port",
            ],
            |port| super::request(port, "GET", "/", &[], None).is_ok_and(|r| r.status == 200),
        )
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cloud whose API an emulator serves.
#[derive(Clone, Copy, PartialEq)]
pub enum Cloud {
    S3,
    Azure,
}

/// A store the replicas of one fleet share.
pub enum Store {
    /// A cloud's API on its emulator, reached through a proxy the test
    /// can cut.
    Cloud {
        cloud: Cloud,
        emulator: Emulator,
        proxy: Proxy,
        prefix: String,
    },
    Folder(PathBuf),
}

impl Store {
    /// An S3 store on `moto_server`, under a prefix of its own.
    pub fn s3(prefix: &str) -> Store {
        Self::cloud(Cloud::S3, Emulator::moto(), prefix)
    }

    /// An Azure Blob Storage store on Azurite, under a prefix of its own.
    pub fn azure(prefix: &str) -> Store {
        Self::cloud(Cloud::Azure, Emulator::azurite(), prefix)
    }

    fn cloud(cloud: Cloud, emulator: Emulator, prefix: &str) -> Store {
        let proxy = Proxy::start(emulator.port);
        Store::Cloud {
            cloud,
            emulator,
            proxy,
            prefix: prefix.into(),
        }
    }

    pub fn folder() -> Store {
        Store::Folder(fresh_dir("task-store"))
    }

    pub fn url(&self) -> String {
        match self {
            Store::Cloud {
                cloud: Cloud::S3,
                prefix,
                ..
            } => format!("s3://decisio/{prefix}"),
            Store::Cloud {
                cloud: Cloud::Azure,
                prefix,
                ..
            } => format!("az://decisio/{prefix}"),
            Store::Folder(dir) => format!("file://{}", dir.display()),
        }
    }

    /// The environment a replica reads the store's endpoint and
    /// credentials from.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::Cloud {
                cloud: Cloud::S3,
                proxy,
                ..
            } => vec![
                ("AWS_ACCESS_KEY_ID", "decisio-test".into()),
                ("AWS_SECRET_ACCESS_KEY", "decisio-test".into()),
                ("AWS_REGION", "us-east-1".into()),
                (
                    "AWS_ENDPOINT_URL",
                    format!("http://127.0.0.1:{}", proxy.port),
                ),
                ("AWS_ALLOW_HTTP", "true".into()),
            ],
            Store::Cloud {
                cloud: Cloud::Azure,
                proxy,
                ..
            } => vec![
                ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
                (
                    "AZURITE_BLOB_STORAGE_URL",
                    format!("http://127.0.0.1:{}", proxy.port),
                ),
            ],
            Store::Folder(_) => Vec::new(),
        }
    }

    /// The replica flags for this store.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--task-store".into(),
            self.url(),
            "--task-store-poll".into(),
            POLL_SECONDS.to_string(),
            "--task-store-lease".into(),
            LEASE_SECONDS.to_string(),
        ]
    }

    /// The object `name` as the store holds it, read past the replicas
    /// (by the cloud's SDK for Python: boto3, azure-storage-blob); `None`
    /// when there is none.
    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        match self {
            Store::Cloud {
                cloud,
                emulator,
                prefix,
                ..
            } => {
                let script = match cloud {
                    Cloud::S3 => {
                        "import sys, boto3\n\
                        s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                        aws_access_key_id='decisio-test', aws_secret_access_key='decisio-test')\n\
                        try:\n    body = s3.get_object(Bucket='decisio', Key=sys.argv[2])['Body'].read()\n\
                        except s3.exceptions.NoSuchKey:\n    sys.exit(3)\n\
                        sys.stdout.buffer.write(body)\n"
                    }
                    Cloud::Azure => {
                        "import sys\n\
                        from azure.core.exceptions import ResourceNotFoundError\n\
                        from azure.storage.blob import BlobServiceClient\n\
                        service = BlobServiceClient.from_connection_string(sys.argv[1])\n\
                        blob = service.get_blob_client('decisio', sys.argv[2])\n\
                        try:\n    body = blob.download_blob().readall()\n\
                        except ResourceNotFoundError:\n    sys.exit(3)\n\
                        sys.stdout.buffer.write(body)\n"
                    }
                };
                let endpoint = match cloud {
                    Cloud::S3 => format!("http://127.0.0.1:{}", emulator.port),
                    Cloud::Azure => azurite_connection(emulator.port),
                };
                python(script, &[endpoint, format!("{prefix}/{name}")])
            }
            Store::Folder(dir) => std::fs::read(dir.join(name)).ok(),
        }
    }

    /// The manifest as the store holds it (none: an empty one).
    pub fn manifest(&self) -> Value {
        match self.read("MANIFEST.json") {
            Some(bytes) => serde_json::from_slice(&bytes).unwrap(),
            None => json!({"version": 0, "entries": {}}),
        }
    }

    fn proxy(&self) -> Option<&Proxy> {
        match self {
            Store::Cloud { proxy, .. } => Some(proxy),
            Store::Folder(_) => None,
        }
    }
}

/// A registration of `n` examples: a two-option ticket question.
pub fn registration(name: &str, n: usize) -> Value {
    let examples: Vec<Value> = (0..n)
        .map(|i| {
            let (state, label) = if i % 2 == 0 {
                (
                    format!("Ticket {i}: the parcel arrived broken; I want my money back."),
                    "refund",
                )
            } else {
                (
                    format!("Ticket {i}: the parcel is a week late; where is it?"),
                    "delivery",
                )
            };
            json!({"state": state, "label": label})
        })
        .collect();
    json!({"name": name, "kind": "choice", "question": "What does the customer ask for?",
           "options": ["refund", "delivery"], "examples": examples, "holdout": 0.25, "seed": 1})
}

fn get(s: &Server, path: &str) -> super::Response {
    s.request("GET", path, &[], None).unwrap()
}

/// The tasks a replica lists, by name.
pub fn listed(s: &Server) -> Vec<Value> {
    let r = get(s, "/v1/tasks");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["data"].as_array().unwrap().clone()
}

/// Waits until every named task is ready on `s`.
pub fn wait_ready(s: &Server, names: &[String], limit: Duration) {
    let start = Instant::now();
    loop {
        let tasks = listed(s);
        let ready = names.iter().all(|n| {
            tasks
                .iter()
                .any(|t| t["name"] == n.as_str() && t["status"] == "ready")
        });
        if ready {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "not ready on :{} within {limit:?}: {:?}",
            s.port,
            tasks
                .iter()
                .map(|t| format!("{}={}", t["name"], t["status"]))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A task's answer on a new state, as served.
pub fn answer(s: &Server, task: &str, state: &str) -> Value {
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"task": task}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["answers"][0]["probabilities"].clone()
}

fn register(s: &Server, body: &Value) -> String {
    let r = s.post_json("/v1/tasks", body);
    assert_eq!(r.status, 202, "{}", r.text());
    r.json()["id"].as_str().unwrap().to_string()
}

fn ready_count(s: &Server) -> f64 {
    s.metric(
        "decisio_task_registration_finished_total",
        "outcome=\"ready\"",
    )
}

/// What a fleet's check measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Seconds from a removal on one replica to its absence on each other.
    pub removal_seconds: Vec<f64>,
    /// Registrations sent at once, and the manifest's version after them.
    pub at_once: usize,
    pub manifest_version: u64,
}

/// Every check of a fleet of replicas started by `start` (given the
/// store's flags and environment), with `at_once` registrations sent at
/// once; the outage check where the store can be cut, the kill check when
/// `kill` says.
pub fn check(
    store: &Store,
    start: impl Fn(&[String], &[(&'static str, String)]) -> Server + Sync,
    at_once: usize,
    kill: bool,
) -> Measured {
    let args = store.args();
    let env = store.env();
    let mut fleet: Vec<Server> = std::thread::scope(|scope| {
        let started: Vec<_> = (0..3).map(|_| scope.spawn(|| start(&args, &env))).collect();
        started.into_iter().map(|s| s.join().unwrap()).collect()
    });
    let mut measured = Measured::default();
    let long = Duration::from_secs(300);

    // Registered on A: the same bits on B and C.
    register(&fleet[0], &registration("tickets", 8));
    let names = vec!["tickets".to_string()];
    for s in &fleet {
        wait_ready(s, &names, long);
    }
    for i in 0..3 {
        let state = format!("Ticket {}: nothing came, and I paid twice.", 100 + i);
        let a = answer(&fleet[0], "tickets", &state);
        assert_eq!(answer(&fleet[1], "tickets", &state), a);
        assert_eq!(answer(&fleet[2], "tickets", &state), a);
    }
    let health = get(&fleet[1], "/health").json();
    assert_eq!(health["task_store"]["ok"], true, "{health}");
    abstention(&fleet);

    // Sent at once across the three: each fitted once, all present.
    let names: Vec<String> = (0..at_once).map(|i| format!("at-once-{i}")).collect();
    std::thread::scope(|scope| {
        for (i, name) in names.iter().enumerate() {
            let s = &fleet[i % 3];
            scope.spawn(move || register(s, &registration(name, 4)));
        }
    });
    for s in &fleet {
        wait_ready(s, &names, long);
    }
    let manifest = store.manifest();
    let entries: Vec<&Value> = manifest["entries"]
        .as_object()
        .unwrap()
        .values()
        .filter(|e| e["kind"] == "task")
        .collect();
    assert_eq!(entries.len(), at_once + 1, "{manifest}");
    assert!(entries.iter().all(|e| e["status"] == "ready"));
    // Two writes a registration (queued, then ready), and the abstention
    // task's two (its version, its tombstone).
    measured.manifest_version = manifest["version"].as_u64().unwrap();
    measured.at_once = at_once;
    assert_eq!(measured.manifest_version, 2 * (at_once as u64 + 1) + 2);
    let fitted: f64 = fleet.iter().map(ready_count).sum();
    assert_eq!(
        fitted,
        (at_once + 1) as f64,
        "a registration was fitted twice"
    );
    super::wait_until("every replica applies the last manifest", long, || {
        fleet.iter().all(|s| {
            get(s, "/health").json()["task_store"]["manifest_version"] == measured.manifest_version
        })
    });

    // Removed on C: gone from A and B within the poll.
    let gone = listed(&fleet[2])
        .into_iter()
        .find(|t| t["name"] == "at-once-0")
        .unwrap();
    let id = gone["id"].as_str().unwrap().to_string();
    let r = fleet[2]
        .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let removed = Instant::now();
    let mut left = vec![0usize, 1];
    while !left.is_empty() {
        left.retain(|&i| {
            if get(&fleet[i], &format!("/v1/tasks/{id}")).status == 404 {
                measured
                    .removal_seconds
                    .push(removed.elapsed().as_secs_f64());
                false
            } else {
                true
            }
        });
        assert!(
            removed.elapsed() < Duration::from_secs_f64(POLL_SECONDS * 1.1 + 1.0),
            "still on replicas {left:?} {:?} after the removal",
            removed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    if let Some(proxy) = store.proxy() {
        outage(proxy, &fleet);
    }
    if kill {
        take_over(&mut fleet);
    }
    measured
}

/// An abstention task registered on B: listed alike on A and C, and the
/// same answers there; removed on A, gone from B and C.
fn abstention(fleet: &[Server]) {
    let city = json!({"type": "choice", "instructions": "Which city is the customer writing about?",
                      "criteria": {"paris": "Paris, France", "london": "London, England",
                                   "unsure": "the message names no city"}});
    let cases = [
        ("My hotel in Paris lost my booking.", json!("paris")),
        ("The Louvre tickets never arrived.", json!("paris")),
        ("My London hotel overcharged me.", json!("london")),
        ("The British Museum tickets never arrived.", json!("london")),
        ("I want to change my password.", Value::Null),
        ("Please send me the invoice again.", Value::Null),
    ];
    let ask = |m: &str| json!({"state": {"message": m}, "questions": {"city": city}});
    let examples: Vec<Value> = cases
        .iter()
        .map(|(m, a)| json!({"request": ask(m), "answer": a}))
        .collect();
    let r = fleet[1].post_json(
        "/v1/abstention/tasks",
        &json!({"id": "city-unsure", "option": {"key": "unsure"}, "match": "option_set",
                "examples": examples}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let listed = |s: &Server| get(s, "/v1/abstention/tasks").json()["tasks"].clone();
    let on_b = listed(&fleet[1]);
    assert_eq!(on_b.as_array().unwrap().len(), 1, "{on_b}");
    super::wait_until(
        "the abstention task is listed alike everywhere",
        Duration::from_secs(30),
        || fleet.iter().all(|s| listed(s) == on_b),
    );
    let state = ask("Where do I update my card details?");
    let answered: Vec<Value> = fleet
        .iter()
        .map(|s| {
            let r = s.post_json("/v1/systemone", &state);
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["answers"]["city"].clone()
        })
        .collect();
    assert_eq!(answered[0], answered[1]);
    assert_eq!(answered[2], answered[1]);
    let r = fleet[0]
        .request("DELETE", "/v1/abstention/tasks/city-unsure", &[], None)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    super::wait_until(
        "the abstention task is gone everywhere",
        Duration::from_secs(30),
        || {
            fleet
                .iter()
                .all(|s| listed(s).as_array().unwrap().is_empty())
        },
    );
}

/// The store out of reach: writes answered 503 with `Retry-After` and
/// nothing changed, answers served from what the replicas apply; back,
/// nothing lost and writes go through again.
fn outage(proxy: &Proxy, fleet: &[Server]) {
    let before: Vec<usize> = fleet.iter().map(|s| listed(s).len()).collect();
    let state = "Ticket 7: the box came crushed and I want a refund.";
    let served = answer(&fleet[1], "tickets", state);
    proxy.cut();
    let r = fleet[0].post_json("/v1/tasks", &registration("while-down", 6));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    assert_eq!(
        r.json()["error"]["code"],
        "task_store_unavailable",
        "{}",
        r.text()
    );
    let id = listed(&fleet[1])[0]["id"].as_str().unwrap().to_string();
    let r = fleet[1]
        .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(answer(&fleet[2], "tickets", state), served);
    super::wait_until(
        "a replica reports the store out of reach",
        Duration::from_secs(30),
        || get(&fleet[2], "/health").json()["task_store"]["ok"] == false,
    );
    proxy.mend();
    super::wait_until(
        "the replicas read the store again",
        Duration::from_secs(30),
        || {
            fleet
                .iter()
                .all(|s| get(s, "/health").json()["task_store"]["ok"] == true)
        },
    );
    let after: Vec<usize> = fleet.iter().map(|s| listed(s).len()).collect();
    assert_eq!(
        after, before,
        "a task was lost or added while the store was down"
    );
    register(&fleet[0], &registration("after-down", 6));
    for s in fleet {
        wait_ready(s, &["after-down".to_string()], Duration::from_secs(120));
    }
}

/// A replica killed while it fits: another takes the registration over
/// once the claim lapses, and every live replica serves the result.
fn take_over(fleet: &mut [Server]) {
    let body = registration("orphan", 24);
    let id = register(&fleet[0], &body);
    super::wait_until("the registration runs", Duration::from_secs(120), || {
        let t = get(&fleet[0], &format!("/v1/tasks/{id}")).json();
        t["status"] == "running" && t["progress"]["done"].as_u64().unwrap_or(0) >= 4
    });
    fleet[0].kill();
    let killed = Instant::now();
    let names = vec!["orphan".to_string()];
    for s in &fleet[1..] {
        wait_ready(s, &names, Duration::from_secs(300));
    }
    assert!(killed.elapsed() >= Duration::from_secs_f64(LEASE_SECONDS * 0.5));
    let takeovers: f64 = fleet[1..]
        .iter()
        .map(|s| s.metric("decisio_task_store_takeovers_total", ""))
        .sum();
    assert_eq!(takeovers, 1.0);
    let state = "Ticket 9: the parcel is lost; please send it again.";
    assert_eq!(
        answer(&fleet[1], "orphan", state),
        answer(&fleet[2], "orphan", state)
    );
}
