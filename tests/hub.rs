//! Models from the Hugging Face Hub: resolution through a cache folder
//! written in the hub's layout (`models--org--name/refs`, `snapshots/<commit>`
//! holding relative links into `blobs/`), as `huggingface_hub` writes it.
//! No hub is reachable here: the network paths are exercised against a
//! closed port and a loopback listener that answers like a hub refusing
//! access.

mod common;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{fresh_dir, model_dir, Server, CLOSED_PORT};
use decisio::hub::{resolve_with, HubError, HubSettings, Wanted};
use sha2::{Digest, Sha256};

const COMMIT_A: &str = "0123456789abcdef0123456789abcdef01234567";
const COMMIT_B: &str = "89abcdef0123456789abcdef0123456789abcdef";
const REPO: &str = "test-org/smollm2-mlx";

/// A cache folder (`HF_HUB_CACHE`) being filled in the hub's layout.
struct HubCache {
    root: PathBuf,
}

impl HubCache {
    fn new(name: &str) -> HubCache {
        let home = fresh_dir(name);
        let root = home.join("hub");
        std::fs::create_dir_all(&root).unwrap();
        HubCache { root }
    }

    /// `HF_HOME` for this cache.
    fn home(&self) -> &Path {
        self.root.parent().unwrap()
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// Stores `source`'s bytes as a blob named by its SHA-256 (a hard link
    /// when the file system allows) and links `snapshots/<commit>/<name>`
    /// to it by a relative path, as `huggingface_hub` does.
    fn put(&self, repo: &str, commit: &str, name: &str, source: &Path) {
        let bytes = std::fs::read(source).unwrap();
        let digest: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let dir = self.repo_dir(repo);
        let blob = dir.join("blobs").join(&digest);
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        if !blob.exists() && std::fs::hard_link(source, &blob).is_err() {
            std::fs::write(&blob, &bytes).unwrap();
        }
        let link = dir.join("snapshots").join(commit).join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let depth = Path::new(name).components().count() + 1;
        let target = PathBuf::from("../".repeat(depth))
            .join("blobs")
            .join(&digest);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).unwrap();
    }

    /// `put` with the bytes given.
    fn put_bytes(&self, repo: &str, commit: &str, name: &str, bytes: &[u8]) {
        let tmp = self.root.join(".incoming");
        std::fs::write(&tmp, bytes).unwrap();
        self.put(repo, commit, name, &tmp);
        std::fs::remove_file(&tmp).unwrap();
    }

    fn set_ref(&self, repo: &str, branch: &str, commit: &str) {
        let path = self.repo_dir(repo).join("refs").join(branch);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, commit).unwrap();
    }

    /// The fixture model's files under `commit`, `refs/main` naming it.
    fn fill(&self, repo: &str, commit: &str) {
        let model = model_dir();
        for entry in std::fs::read_dir(&model).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                let name = path.file_name().unwrap().to_str().unwrap().to_string();
                self.put(repo, commit, &name, &path);
            }
        }
        self.set_ref(repo, "main", commit);
    }

    fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    fn settings(&self, offline: bool, endpoint: &str) -> HubSettings {
        HubSettings {
            cache: self.root.clone(),
            endpoint: endpoint.to_string(),
            offline,
            token: None,
            progress: false,
        }
    }
}

impl Drop for HubCache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.home());
    }
}

fn closed_endpoint() -> String {
    format!("http://127.0.0.1:{CLOSED_PORT}")
}

/// `decisio serve --model <spec>` expected to fail at start-up: its exit
/// status and standard error.
fn serve_fails(spec: &str, env: &[(&str, &OsStr)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_decisio"));
    cmd.args(["serve", "--model", spec, "--port", "0"])
        .arg("--state-dir")
        .arg(common::fresh_dir("state"))
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .envs(env.iter().copied());
    let out = cmd.output().expect("run decisio serve");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "serve started: {stderr}");
    stderr
}

#[test]
fn a_cached_repository_serves_offline() {
    let cache = HubCache::new("hub-serve");
    cache.fill(REPO, COMMIT_A);
    let server = Server::spawn_model(
        0,
        OsStr::new(REPO),
        &[
            ("HF_HOME", cache.home().as_os_str()),
            ("HF_HUB_OFFLINE", OsStr::new("1")),
        ],
        &[],
    );
    server.wait_ready(Duration::from_secs(120));
    let models = server
        .request("GET", "/v1/models", &[], None)
        .unwrap()
        .json();
    assert_eq!(models["data"][0]["id"], "smollm2", "{models}");
    let r = server.post_json(
        "/v1/chat/completions",
        &serde_json::json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Say yes."}],
            "max_tokens": 2,
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_commit_in_the_spec_picks_its_snapshot() {
    let cache = HubCache::new("hub-commit");
    cache.fill(REPO, COMMIT_A);
    cache.fill(REPO, COMMIT_B); // refs/main now names B
    let settings = cache.settings(true, &closed_endpoint());
    let main = resolve_with(REPO, None, Wanted::Model, &settings).unwrap();
    assert_eq!(main, cache.snapshot(REPO, COMMIT_B));
    let pinned = resolve_with(
        &format!("{REPO}@{COMMIT_A}"),
        None,
        Wanted::Model,
        &settings,
    );
    assert_eq!(pinned.unwrap(), cache.snapshot(REPO, COMMIT_A));
    // The caller's revision applies when the spec names none; the spec's wins.
    let by_arg = resolve_with(REPO, Some(COMMIT_A), Wanted::Model, &settings).unwrap();
    assert_eq!(by_arg, cache.snapshot(REPO, COMMIT_A));
    let spec_wins = resolve_with(
        &format!("{REPO}@{COMMIT_B}"),
        Some(COMMIT_A),
        Wanted::Model,
        &settings,
    );
    assert_eq!(spec_wins.unwrap(), cache.snapshot(REPO, COMMIT_B));
    // A tag or branch other than main goes through its ref.
    cache.set_ref(REPO, "v1", COMMIT_A);
    let tag = resolve_with(&format!("{REPO}@v1"), None, Wanted::Model, &settings).unwrap();
    assert_eq!(tag, cache.snapshot(REPO, COMMIT_A));
    // The files read through the links are the fixture's.
    assert_eq!(
        std::fs::read(tag.join("config.json")).unwrap(),
        std::fs::read(model_dir().join("config.json")).unwrap()
    );
}

#[test]
fn a_missing_weight_shard_is_named_at_start_up() {
    let cache = HubCache::new("hub-shard");
    let model = model_dir();
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        cache.put(REPO, COMMIT_A, name, &model.join(name));
    }
    cache.put(
        REPO,
        COMMIT_A,
        "model-00001-of-00002.safetensors",
        &model.join("model.safetensors"),
    );
    let index = serde_json::json!({
        "metadata": {},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors",
        }
    });
    cache.put_bytes(
        REPO,
        COMMIT_A,
        "model.safetensors.index.json",
        index.to_string().as_bytes(),
    );
    cache.set_ref(REPO, "main", COMMIT_A);
    let err = serve_fails(
        REPO,
        &[
            ("HF_HOME", cache.home().as_os_str()),
            ("HF_HUB_OFFLINE", OsStr::new("1")),
        ],
    );
    assert!(err.contains("model-00002-of-00002.safetensors"), "{err}");
    assert!(!err.contains("model-00001-of-00002"), "{err}");
    assert!(err.contains(&format!("hf download {REPO}")), "{err}");

    // A link whose blob is gone (an interrupted clean-up) counts as missing.
    let shard = cache
        .snapshot(REPO, COMMIT_A)
        .join("model-00001-of-00002.safetensors");
    let blob = std::fs::canonicalize(&shard).unwrap();
    std::fs::remove_file(blob).unwrap();
    let settings = cache.settings(true, &closed_endpoint());
    match resolve_with(REPO, None, Wanted::Model, &settings) {
        Err(HubError::Offline { missing, .. }) => assert_eq!(
            missing,
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_offline_miss_lists_the_missing_files() {
    let cache = HubCache::new("hub-offline");
    let model = model_dir();
    cache.put(REPO, COMMIT_A, "config.json", &model.join("config.json"));
    cache.put(
        REPO,
        COMMIT_A,
        "tokenizer.json",
        &model.join("tokenizer.json"),
    );
    cache.set_ref(REPO, "main", COMMIT_A);
    let settings = cache.settings(true, &closed_endpoint());
    let err = resolve_with(REPO, None, Wanted::Model, &settings).unwrap_err();
    let text = err.to_string();
    for needle in [
        "test-org/smollm2-mlx@main",
        "model.safetensors (or model.safetensors.index.json and its shards)",
        "tokenizer_config.json",
        "HF_HUB_OFFLINE",
        "hf download test-org/smollm2-mlx --revision main",
        &cache.root.display().to_string(),
    ] {
        assert!(text.contains(needle), "`{needle}` not in: {text}");
    }
    assert!(!text.contains("config.json,"), "{text}");
    // A tokenizer needs only the tokenizer files.
    let tok = resolve_with(REPO, None, Wanted::Tokenizer, &settings).unwrap_err();
    match tok {
        HubError::Offline { missing, .. } => assert_eq!(missing, ["tokenizer_config.json"]),
        other => panic!("{other:?}"),
    }
    // A configuration alone is there.
    let config = resolve_with(REPO, None, Wanted::Config, &settings).unwrap();
    assert_eq!(config, cache.snapshot(REPO, COMMIT_A));
    // Nothing cached at all: every required file is listed.
    let none = resolve_with("test-org/absent", None, Wanted::Model, &settings).unwrap_err();
    match none {
        HubError::Offline { missing, .. } => assert_eq!(missing.len(), 4, "{missing:?}"),
        other => panic!("{other:?}"),
    }
    let none = resolve_with("test-org/absent", None, Wanted::Config, &settings).unwrap_err();
    match none {
        HubError::Offline { missing, .. } => assert_eq!(missing, ["config.json"]),
        other => panic!("{other:?}"),
    }
    // Through the command, with HF_HOME.
    let err = serve_fails(
        REPO,
        &[
            ("HF_HOME", cache.home().as_os_str()),
            ("HF_HUB_OFFLINE", OsStr::new("true")),
        ],
    );
    assert!(err.contains("tokenizer_config.json"), "{err}");
    assert!(
        err.contains(&cache.root.display().to_string()),
        "the cache searched is not named: {err}"
    );
}

#[test]
fn online_a_fully_cached_repository_needs_no_network() {
    let cache = HubCache::new("hub-online");
    cache.fill(REPO, COMMIT_A);
    let endpoint = closed_endpoint();
    let settings = cache.settings(false, &endpoint);
    let dir = resolve_with(REPO, None, Wanted::Model, &settings).unwrap();
    assert_eq!(dir, cache.snapshot(REPO, COMMIT_A));
    let tok = resolve_with(REPO, None, Wanted::Tokenizer, &settings).unwrap();
    assert_eq!(tok, dir);
}

#[test]
fn online_a_partly_cached_repository_names_the_endpoint() {
    let cache = HubCache::new("hub-partial");
    let model = model_dir();
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        cache.put(REPO, COMMIT_A, name, &model.join(name));
    }
    cache.set_ref(REPO, "main", COMMIT_A);
    let endpoint = closed_endpoint();
    // HF_HUB_CACHE names the cache folder itself (HF_HOME points elsewhere).
    let err = serve_fails(
        REPO,
        &[
            ("HF_HUB_CACHE", cache.root.as_os_str()),
            ("HF_HOME", OsStr::new("/nonexistent-hf-home")),
            ("HF_ENDPOINT", OsStr::new(&endpoint)),
        ],
    );
    for needle in [
        endpoint.as_str(),
        "could not be reached",
        "model.safetensors",
        &cache.root.display().to_string(),
    ] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    // Nothing was written into the cache by the failed attempt.
    let refs: Vec<_> = std::fs::read_dir(cache.repo_dir(REPO).join("refs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(refs, ["main"]);
}

/// A loopback listener that answers every request with `status`, the way
/// the hub answers for a private or unknown repository.
fn refusing_hub(status: &'static str) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        listener.set_nonblocking(false).unwrap();
        if let Ok((mut stream, _)) = listener.accept() {
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = stream.write_all(
                format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
        seen
    });
    (format!("http://127.0.0.1:{port}"), handle)
}

#[test]
fn a_refused_repository_says_so() {
    let cache = HubCache::new("hub-refused");
    let (endpoint, hub) = refusing_hub("401 Unauthorized");
    let mut settings = cache.settings(false, &endpoint);
    settings.token = Some("hf_test".into());
    let err = resolve_with("test-org/private@v2", None, Wanted::Model, &settings).unwrap_err();
    let requests = hub.join().unwrap();
    let text = err.to_string();
    assert!(
        matches!(err, HubError::NoAccess { status: 401, .. }),
        "{text}"
    );
    for needle in ["test-org/private@v2", "401", "HF_TOKEN", &endpoint] {
        assert!(text.contains(needle), "`{needle}` not in: {text}");
    }
    // The file list was asked for the revision, with the token.
    let request = &requests[0];
    assert!(
        request.starts_with("GET /api/models/test-org/private/revision/v2 "),
        "{request}"
    );
    assert!(
        request
            .to_ascii_lowercase()
            .contains("authorization: bearer hf_test"),
        "{request}"
    );
}

#[test]
fn a_local_folder_still_works() {
    let model = model_dir();
    let settings = HubSettings {
        cache: PathBuf::from("/nonexistent"),
        endpoint: closed_endpoint(),
        offline: true,
        token: None,
        progress: false,
    };
    let spec = model.to_str().unwrap();
    assert_eq!(
        resolve_with(spec, None, Wanted::Model, &settings).unwrap(),
        model
    );
    let err = resolve_with("no/such/folder", None, Wanted::Model, &settings).unwrap_err();
    assert!(matches!(err, HubError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("org/name@revision"), "{err}");
}

/// A loopback stand-in for the hub that serves `files` at commit `commit`
/// over the hub's HTTP interface as hf-hub uses it: the revision's file list
/// (`/api/models/<repo>/revision/<rev>`) and `/<repo>/resolve/<commit>/<file>`
/// with `etag`, `x-repo-commit` and ranges. Records the paths asked for.
struct StandInHub {
    endpoint: String,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    port: u16,
}

impl StandInHub {
    fn start(repo: &'static str, commit: &'static str, files: Vec<(String, Vec<u8>)>) -> Self {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen, halt) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                seen.lock().unwrap().push(path.clone());
                let range_start = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("range: bytes=")
                            .map(str::to_string)
                    })
                    .map(|r| {
                        let (a, b) = r.split_once('-').unwrap();
                        (a.parse::<usize>().unwrap(), b.parse::<usize>().ok())
                    });
                let info = format!("/api/models/{repo}/revision/");
                let resolve = format!("/{repo}/resolve/{commit}/");
                let (status, headers, body): (&str, String, Vec<u8>) =
                    if let Some(_rev) = path.strip_prefix(&info) {
                        let siblings: Vec<_> = files
                            .iter()
                            .map(|(n, _)| serde_json::json!({"rfilename": n}))
                            .collect();
                        let body = serde_json::json!({"sha": commit, "siblings": siblings});
                        ("200 OK", String::new(), body.to_string().into_bytes())
                    } else if let Some((_, bytes)) = path
                        .strip_prefix(&resolve)
                        .and_then(|f| files.iter().find(|(n, _)| n == f))
                    {
                        let etag: String = Sha256::digest(bytes)
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect();
                        let (a, b) = range_start.unwrap_or((0, None));
                        let b = b.unwrap_or(bytes.len() - 1).min(bytes.len() - 1);
                        (
                            "206 Partial Content",
                            format!(
                                "etag: \"{etag}\"\r\nx-repo-commit: {commit}\r\n\
                                 content-range: bytes {a}-{b}/{}\r\n",
                                bytes.len()
                            ),
                            bytes[a..=b].to_vec(),
                        )
                    } else {
                        ("404 Not Found", String::new(), Vec::new())
                    };
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                    .as_bytes(),
                );
                let _ = stream.write_all(&body);
            }
        });
        StandInHub {
            endpoint: format!("http://127.0.0.1:{port}"),
            requests,
            stop,
            port,
        }
    }

    fn files_fetched(&self) -> Vec<String> {
        let mut files: Vec<String> = self
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter_map(|p| p.split("/resolve/").nth(1))
            .filter_map(|p| p.split_once('/').map(|(_, f)| f.to_string()))
            .collect();
        files.sort();
        files.dedup();
        files
    }
}

impl Drop for StandInHub {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

#[test]
fn missing_files_are_downloaded_into_the_hubs_layout() {
    let model = model_dir();
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.push(("README.md".into(), b"# not needed\n".to_vec()));
    // A configuration alone takes config.json alone.
    {
        let hub = StandInHub::start(REPO, COMMIT_B, files.clone());
        let cache = HubCache::new("hub-download-config");
        let settings = cache.settings(false, &hub.endpoint);
        let dir = resolve_with(REPO, None, Wanted::Config, &settings).unwrap();
        assert_eq!(dir, cache.snapshot(REPO, COMMIT_B));
        assert_eq!(hub.files_fetched(), ["config.json"]);
    }
    let hub = StandInHub::start(REPO, COMMIT_B, files);
    let cache = HubCache::new("hub-download");
    // config.json is cached already under the commit the hub will name.
    cache.put(REPO, COMMIT_B, "config.json", &model.join("config.json"));
    let settings = cache.settings(false, &hub.endpoint);
    let dir = resolve_with(REPO, None, Wanted::Model, &settings).unwrap();
    assert_eq!(dir, cache.snapshot(REPO, COMMIT_B));
    // Only what was missing and wanted was fetched, from the commit.
    assert_eq!(
        hub.files_fetched(),
        [
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    // The hub's layout: relative links into blobs named by the etag, the
    // branch's ref, no ref named by a commit.
    for name in ["model.safetensors", "tokenizer.json"] {
        let link = dir.join(name);
        let target = std::fs::read_link(&link).unwrap();
        assert!(target.starts_with("../../blobs"), "{}", target.display());
        assert_eq!(
            std::fs::read(&link).unwrap(),
            std::fs::read(model.join(name)).unwrap()
        );
    }
    let refs = cache.repo_dir(REPO).join("refs");
    assert_eq!(
        std::fs::read_to_string(refs.join("main")).unwrap(),
        COMMIT_B
    );
    assert!(!refs.join(COMMIT_B).exists());
    // Once complete, the cache serves without the hub.
    drop(hub);
    let offline = cache.settings(false, &closed_endpoint());
    assert_eq!(
        resolve_with(REPO, None, Wanted::Model, &offline).unwrap(),
        cache.snapshot(REPO, COMMIT_B)
    );
}
