//! Shared by the integration tests: where the fixture model and the
//! reference figures are, and a real server process on 127.0.0.1.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod fleet;
pub mod think;
pub mod vllm;

fn cache_dir() -> PathBuf {
    std::env::var_os("DECISIO_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/decisio"))
}

/// OpenBLAS's kernels as `decisio` chooses them at start
/// (`decisio::engine::mlx::host::choose_blas_core`), for a test that runs
/// MLX in its own process: chosen once, and every such test calls this
/// before its first product, so none is running while OpenBLAS chooses.
pub fn blas_as_served() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = decisio::engine::mlx::host::choose_blas_core();
    });
}

/// Polls `condition` every 10 ms until it holds, for up to `limit`;
/// fails the test naming `what` if it never does.
pub fn wait_until(what: &str, limit: Duration, condition: impl Fn() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < limit, "never within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The converted SmolLM2 fixture (made by `make setup`).
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("DECISIO_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("models/smollm2-135m-instruct"));
    assert!(
        dir.join("config.json").exists(),
        "the fixture model is missing at {}; run `make setup`",
        dir.display()
    );
    dir
}

/// The test assets fetched by `make setup` (scripts/fetch-assets.sh).
/// An MMLU row (`mmlu.jsonl`) as a state: its question and its four
/// answers lettered A to D.
pub fn mmlu_lettered(r: &serde_json::Value) -> String {
    let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
    format!(
        "{}\nA. {}\nB. {}\nC. {}\nD. {}",
        text("question"),
        text("answer_a"),
        text("answer_b"),
        text("answer_c"),
        text("answer_d")
    )
}

pub fn asset(name: &str) -> PathBuf {
    let dir = std::env::var_os("DECISIO_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("assets"));
    let path = dir.join(name);
    assert!(
        path.exists(),
        "the asset {} is missing; run `make setup`",
        path.display()
    );
    path
}

/// A fresh, empty folder under the system's temporary folder, of this
/// call alone (tests of one binary run side by side: two calls with the
/// same name get two folders).
pub fn fresh_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("decisio-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The flags of a vLLM-backend gateway in front of `upstream` (a decisio
/// MLX server, which speaks vLLM's API): the default padding, which both
/// backends apply alike, so that both read the same prompt; and
/// [`UPSTREAM_TIMEOUT`].
pub fn gateway_args(upstream: &str) -> Vec<&str> {
    vec![
        "--backend",
        "vllm",
        "--upstream",
        upstream,
        "--upstream-timeout",
        UPSTREAM_TIMEOUT,
    ]
}

/// The scoring timeout of the tests' gateways, where a test sets none: a
/// call that times out on an upstream that answers other calls is the
/// request's and is not repeated, and an upstream on a machine running
/// three test binaries at once can take over the default 60 s for a large
/// request.
pub const UPSTREAM_TIMEOUT: &str = "600";

/// A tokenizer the reference decisio's System One prompts were built on
/// (`make reference`): the fixture's, Qwen3's and Gemma 3's, each with its
/// chat template and the letter codes a prompt format letters options
/// with.
pub struct ReferenceTokenizer {
    pub name: &'static str,
    pub tokenizer: decisio::prompt::TextTokenizer,
    pub template: decisio::prompt::ChatTemplate,
    pub codes: Vec<(String, u32)>,
}

/// The [`ReferenceTokenizer`]s, their codes as `format` letters options.
pub fn reference_tokenizers(
    format: &decisio::text_route::systemone::PromptFormat,
) -> Vec<ReferenceTokenizer> {
    use decisio::text_route::systemone::{letter_codes, one_token_codes};
    [
        ("fixture", model_dir()),
        ("qwen3", asset("qwen3")),
        ("gemma3", asset("gemma3")),
    ]
    .into_iter()
    .map(|(name, dir)| {
        let tokenizer =
            decisio::prompt::TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let template =
            decisio::prompt::ChatTemplate::from_tokenizer_config(dir.join("tokenizer_config.json"))
                .unwrap();
        let codes = match format.bare_codes() {
            true => one_token_codes(&tokenizer, ""),
            false => letter_codes(&tokenizer),
        };
        ReferenceTokenizer {
            name,
            tokenizer,
            template,
            codes,
        }
    })
    .collect()
}

/// Reference figures written by `make reference`.
pub fn reference_file(name: &str) -> PathBuf {
    let dir = std::env::var_os("DECISIO_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference"));
    let path = dir.join(name);
    assert!(
        path.exists(),
        "reference file {} is missing; run `make reference`",
        path.display()
    );
    path
}

/// States and questions built from MMLU by scripts/reference/decisions.py.
pub fn reference_decisions() -> serde_json::Value {
    let text = std::fs::read_to_string(reference_file("decisions.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The first `n` questions of a reference state, as `/v1/decide` takes them.
pub fn reference_questions(st: &serde_json::Value, n: usize) -> Vec<serde_json::Value> {
    st["questions"]
        .as_array()
        .unwrap()
        .iter()
        .take(n)
        .map(|q| serde_json::json!({"text": q["text"], "options": q["options"]}))
        .collect()
}

/// A `decisio serve` process on a loopback port, stopped on drop.
/// Without `--state-dir` among its arguments it gets a fresh state folder
/// of its own (a state folder serves one server at a time), removed on drop.
///
/// The port is the one the process itself announces (`listening on
/// http://…` on its standard error) after it bound it: a test never talks
/// to a port it merely guessed was free, so two servers started at once
/// can never answer each other's readiness checks.
pub struct Server {
    child: Child,
    pub port: u16,
    own_state: Option<PathBuf>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        let server = Self::spawn(extra);
        server.wait_ready(Duration::from_secs(120));
        server
    }

    /// Like [`Server::start`], with extra environment variables.
    pub fn start_env(extra: &[&str], env: &[(&str, String)]) -> Server {
        let env: Vec<(&str, std::ffi::OsString)> =
            env.iter().map(|(k, v)| (*k, v.into())).collect();
        let env: Vec<(&str, &std::ffi::OsStr)> =
            env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        let server = Self::spawn_model(0, model_dir().as_os_str(), &env, extra);
        server.wait_ready(Duration::from_secs(120));
        server
    }

    /// Starts the process on a port the system chooses (`--port 0`) and
    /// returns once it listens there (the model may still be loading).
    pub fn spawn(extra: &[&str]) -> Server {
        Self::spawn_on(0, extra)
    }

    /// Like [`Server::spawn`], on a given port (to restart a server where
    /// it was; 0: one the system chooses).
    pub fn spawn_on(port: u16, extra: &[&str]) -> Server {
        Self::spawn_model(port, model_dir().as_os_str(), &[], extra)
    }

    /// Like [`Server::spawn_on`], with any `--model` and extra environment
    /// variables.
    pub fn spawn_model(
        port: u16,
        model: &std::ffi::OsStr,
        env: &[(&str, &std::ffi::OsStr)],
        extra: &[&str],
    ) -> Server {
        Self::spawn_with(port, Some(model), env, extra)
    }

    /// Like [`Server::spawn_model`]; without `--model` when `model` is
    /// `None`.
    pub fn spawn_with(
        port: u16,
        model: Option<&std::ffi::OsStr>,
        env: &[(&str, &std::ffi::OsStr)],
        extra: &[&str],
    ) -> Server {
        let model_args: Vec<&std::ffi::OsStr> = match model {
            Some(m) => vec!["--model".as_ref(), m],
            None => Vec::new(),
        };
        let own_state = (!extra.contains(&"--state-dir")).then(|| fresh_dir("state"));
        let state_args: Vec<&std::ffi::OsStr> = match &own_state {
            Some(dir) => vec!["--state-dir".as_ref(), dir.as_os_str()],
            None => Vec::new(),
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_decisio"))
            .arg("serve")
            .args(model_args)
            .args([
                "--served-model-name",
                "smollm2",
                "--port",
                &port.to_string(),
            ])
            .args(extra)
            .args(state_args)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start decisio serve");
        let listening = forward_log(child.stderr.take().expect("piped stderr"));
        let start = Instant::now();
        let port = loop {
            match listening.recv_timeout(Duration::from_millis(50)) {
                Ok(port) => break port,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().expect("wait for decisio serve");
                    panic!("decisio serve exited ({status}) before it listened; its log is above")
                }
            }
            if let Some(status) = child.try_wait().expect("poll decisio serve") {
                panic!("decisio serve exited ({status}) before it listened; its log is above");
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "decisio serve never announced its port"
            );
        };
        Server {
            child,
            port,
            own_state,
        }
    }

    pub fn wait_ready(&self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(r) = self.request("GET", "/health", &[], None) {
                if r.status == 200 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the server did not become healthy within {limit:?}");
    }

    /// One HTTP/1.1 request; `body` is sent as is.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> std::io::Result<Response> {
        request(self.port, method, path, headers, body)
    }

    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Response {
        self.request("POST", path, &[], Some(body.to_string().as_bytes()))
            .expect("request")
    }

    /// The sum of the samples of `/metrics` whose line starts with `name`
    /// and contains `labels` (0 where none does).
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = self.request("GET", "/metrics", &[], None).unwrap().text();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Sends `body` to `path` as a client that gives up: it closes the
    /// connection once `until` returns, reading nothing.
    pub fn post_and_leave(&self, path: &str, body: &serde_json::Value, until: impl FnOnce()) {
        use std::io::Write;
        let body = body.to_string();
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            socket,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        until();
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }

    /// As [`Server::post_json`], waiting up to `wait` for the answer: for
    /// a route that answers once work is done (a registration in the
    /// reference's form, a certification), whose time grows with the
    /// machine's load.
    pub fn post_json_waiting(
        &self,
        path: &str,
        body: &serde_json::Value,
        wait: Duration,
    ) -> Response {
        let body = body.to_string();
        request_waiting(self.port, "POST", path, &[], Some(body.as_bytes()), wait).expect("request")
    }
}

/// One HTTP/1.1 request to a server on 127.0.0.1; `body` is sent as is.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<Response> {
    request_waiting(port, method, path, headers, body, Duration::from_secs(120))
}

/// [`request`], waiting up to `wait` for the answer.
pub fn request_waiting(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    wait: Duration,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(wait))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if let Some(b) = body {
        // A server may answer (413) before reading everything.
        let _ = stream.write_all(b);
    }
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    let mut chunked = false;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
            if k == "transfer-encoding" && v.contains("chunked") {
                chunked = true;
            }
            headers.push((k, v));
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// POSTs JSON to a server on 127.0.0.1.
pub fn post_json(port: u16, path: &str, body: &serde_json::Value) -> Response {
    request(port, "POST", path, &[], Some(body.to_string().as_bytes())).expect("request")
}

/// A loopback port on which nothing listens, ever: port 1 (TCP port
/// service multiplexer) is a privileged port that no test and no service on
/// these machines binds, and every server a test starts takes a port the
/// system chooses from the ephemeral range. (A port found free by binding
/// and dropping a listener may be taken by a server of a test running
/// beside it before it is used.)
pub const CLOSED_PORT: u16 = 1;

/// Copies a server's standard error to the test's, line by line, and sends
/// the port of its first `listening on http://ADDR` line.
fn forward_log(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<u16> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            if let Some(port) = listening_port(&line) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(port);
                }
            }
        }
    });
    rx
}

/// The port of a `listening on http://127.0.0.1:PORT` log line.
pub fn listening_port(line: &str) -> Option<u16> {
    let addr = line.split("listening on http://").nth(1)?;
    let addr: String = addr
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
}

impl Server {
    /// The server's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's process id (for its `/proc` figures).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.own_state {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A plain `GET` to any loopback port (the server, or a helper process
/// such as Prometheus). HTTP/1.0, so the body is never chunked; the read is
/// bounded by a timeout.
pub fn http_get(port: u16, path: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_write_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of the response head"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    })
}
