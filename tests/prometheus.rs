//! `GET /metrics` read by a real Prometheus: decisio serves decisions, a
//! Prometheus process (the Debian package `prometheus`, installed by
//! `make setup`) scrapes it every second on loopback, and the figures are
//! read back through Prometheus's HTTP API. Also: every metric has its
//! HELP and TYPE lines, and unknown paths share one route label.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{http_get, Server};
use serde_json::{json, Value};

/// Every metric the server exposes, with its Prometheus type.
const METRICS: &[(&str, &str)] = &[
    ("decisio_question_seconds", "histogram"),
    ("decisio_new_state_seconds", "histogram"),
    ("decisio_systemone_questions_total", "counter"),
    ("decisio_systemone_question_seconds", "histogram"),
    ("decisio_prefix_cache_hits_total", "counter"),
    ("decisio_prefix_cache_misses_total", "counter"),
    ("decisio_prefix_cache_evictions_total", "counter"),
    ("decisio_prefix_cache_bytes", "gauge"),
    ("decisio_prefix_cache_entries", "gauge"),
    ("decisio_prefix_cache_capacity_bytes", "gauge"),
    ("decisio_abstentions_total", "counter"),
    ("decisio_queue_depth", "gauge"),
    ("decisio_http_requests_total", "counter"),
    ("decisio_http_request_seconds", "histogram"),
    ("decisio_task_registration_examples_total", "counter"),
    ("decisio_task_registration_finished_total", "counter"),
    ("decisio_task_registration_tasks", "gauge"),
    ("decisio_task_registration_examples_per_second", "gauge"),
    ("decisio_packed_answers_total", "counter"),
    ("decisio_mlx_memory_bytes", "gauge"),
];

/// How long Prometheus may take to start and to have scraped the figures.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(60);

const UNKNOWN_PATHS: usize = 50;

/// The port of Prometheus's `msg="Listening on" address=127.0.0.1:PORT`
/// log line (it binds port 0 and logs the port it got).
fn listening_port(log: &str) -> Option<u16> {
    log.lines()
        .filter(|l| l.contains("msg=\"Listening on\""))
        .find_map(|l| l.split("address=").nth(1))
        .and_then(|a| a.split_whitespace().next())
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
}

/// The `prometheus` binary on PATH (what `which prometheus` finds).
fn prometheus_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("prometheus"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the `prometheus` binary is not on PATH; run `make setup`, which installs the \
                 Debian package `prometheus`"
            )
        })
}

/// Percent-encodes a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus process scraping one decisio server, in its own temporary
/// folder; killed and cleaned up on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(binary: &std::path::Path, target_port: u16) -> Prometheus {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("decisio-prometheus-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: decisio\n    metrics_path: /metrics\n    \
                 static_configs:\n      - targets: [\"127.0.0.1:{target_port}\"]\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut prometheus = Prometheus {
            child,
            port: 0,
            dir,
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", prometheus.log());
            }
            if prometheus.port == 0 {
                let log = std::fs::read_to_string(prometheus.dir.join("prometheus.log"));
                prometheus.port = log.ok().and_then(|l| listening_port(&l)).unwrap_or(0);
            }
            if prometheus.port != 0
                && http_get(prometheus.port, "/-/ready").is_ok_and(|r| r.status == 200)
            {
                break;
            }
            assert!(
                started.elapsed() < PROMETHEUS_WAIT,
                "prometheus was not ready within {PROMETHEUS_WAIT:?}:\n{}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    /// The end of Prometheus's log, for failure messages.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// An instant query: the result vector as (labels, value).
    fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let r = match http_get(self.port, &path) {
            Ok(r) => r,
            Err(_) => return Vec::new(),
        };
        assert_eq!(r.status, 200, "query `{promql}`: {}", r.text());
        let body = r.json();
        assert_eq!(body["status"], "success", "query `{promql}`: {body}");
        body["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                let value = s["value"][1].as_str().and_then(|v| v.parse().ok());
                (s["metric"].clone(), value.unwrap_or(f64::NAN))
            })
            .collect()
    }

    /// Polls `promql` until `accept` takes its result, within `deadline`.
    fn wait_for(
        &self,
        promql: &str,
        deadline: Instant,
        accept: impl Fn(&[(Value, f64)]) -> bool,
    ) -> Vec<(Value, f64)> {
        loop {
            let result = self.query(promql);
            if accept(&result) {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus never answered `{promql}` as expected; last result: {result:?}\n\
                 log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The single value of `promql`, once it has one that `accept` takes.
    fn value(&self, promql: &str, deadline: Instant, accept: impl Fn(f64) -> bool) -> f64 {
        self.wait_for(promql, deadline, |r| r.len() == 1 && accept(r[0].1))[0].1
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two questions on one state.
fn decide_body() -> Value {
    json!({
        "state": "Ada keeps three cats and one dog. The dog is called Rex; the cats are \
                  called Tom, Kit and Sox.",
        "questions": [
            {"id": "q1", "text": "How many cats does Ada keep?", "options": ["one", "two", "three", "four"]},
            {"id": "q2", "text": "What is the dog called?", "options": ["Tom", "Rex", "Sox"]}
        ],
        "multi_question": "sequential"
    })
}

/// Series of a metric family in the text exposition, as (labels, value).
fn samples<'a>(text: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, value) = r.split_once('}')?;
                    (labels, value)
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// The value of one label in a label set such as `a="x",b="y"`.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split("\",").find_map(|kv| {
        let (k, v) = kv.split_once("=\"")?;
        (k.trim_start_matches(',') == key).then(|| v.trim_end_matches('"'))
    })
}

/// A small deterministic generator for the unknown paths.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn prometheus_scrapes_the_decision_metrics() {
    let binary = prometheus_binary();
    let server = Server::start(&[]);

    // Two questions on one state, then the same again: a miss, then a hit.
    let first = server.post_json("/v1/decide", &decide_body());
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["state"]["cached"], false, "{first}");
    assert_eq!(
        first["answers"].as_array().map(Vec::len),
        Some(2),
        "{first}"
    );
    let second = server.post_json("/v1/decide", &decide_body());
    assert_eq!(second.status, 200, "{}", second.text());
    let second = second.json();
    assert_eq!(second["state"]["cached"], true, "{second}");
    assert_eq!(second["state"]["hash"], first["state"]["hash"]);

    // Unknown paths, some under real routes: all share `unmatched`.
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = XorShift(seed);
    let bases = [
        "",
        "/v1",
        "/v1/decide",
        "/metrics",
        "/v2/chat",
        "/tokenize",
        "/health",
    ];
    let mut unknown = Vec::with_capacity(UNKNOWN_PATHS);
    for i in 0..UNKNOWN_PATHS {
        let path = format!(
            "{}/{:016x}",
            bases[rng.next() as usize % bases.len()],
            rng.next()
        );
        let method = if i % 2 == 0 { "GET" } else { "POST" };
        let body = (method == "POST").then_some(&b"{}"[..]);
        let r = server.request(method, &path, &[], body).unwrap();
        assert_eq!(r.status, 404, "{method} {path}: {}", r.text());
        unknown.push(path);
    }

    // The text exposition, read directly.
    let metrics = http_get(server.port, "/metrics").unwrap();
    assert_eq!(metrics.status, 200);
    let content_type = metrics.header("content-type").unwrap_or_default();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = metrics.text();
    for (name, kind) in METRICS {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} "))),
            "no HELP line for {name} in /metrics:\n{text}"
        );
        assert!(
            text.lines().any(|l| l == format!("# TYPE {name} {kind}")),
            "no `# TYPE {name} {kind}` line in /metrics:\n{text}"
        );
        let series = if *kind == "histogram" {
            format!("{name}_count")
        } else {
            name.to_string()
        };
        assert!(
            !samples(&text, &series).is_empty(),
            "no sample of {series} in /metrics:\n{text}"
        );
    }
    // MLX's memory: the weights are held (read at start), the peak at
    // least what is held now.
    let memory: std::collections::HashMap<&str, f64> = samples(&text, "decisio_mlx_memory_bytes")
        .into_iter()
        .collect();
    let active = memory[r#"kind="active""#];
    assert!(active > 1e6, "{memory:?}");
    assert!(memory[r#"kind="peak""#] >= active, "{memory:?}");
    // MLX's buffer cache within its limit (src/engine/mlx/memory.rs), the
    // prefix cache within its budget.
    assert!(
        memory[r#"kind="cache""#] <= decisio::engine::mlx::memory::CACHE_CAP as f64,
        "{memory:?}"
    );
    let held = samples(&text, "decisio_prefix_cache_bytes")[0].1;
    let budget = samples(&text, "decisio_prefix_cache_capacity_bytes")[0].1;
    assert!(held > 0.0 && held <= budget, "{held} of {budget}");
    let known: BTreeSet<&str> = decisio::http::ROUTES
        .iter()
        .map(|e| e.path)
        .chain(["unmatched"])
        .collect();
    let http = samples(&text, "decisio_http_requests_total");
    let mut routes = BTreeSet::new();
    let mut unmatched = 0.0;
    for (labels, value) in &http {
        let route = label(labels, "route").unwrap_or_else(|| panic!("no route label: {labels}"));
        assert!(
            known.contains(route),
            "route label `{route}` is not a route pattern"
        );
        routes.insert(route.to_string());
        if route == "unmatched" {
            unmatched += value;
        }
    }
    assert!(
        unmatched >= UNKNOWN_PATHS as f64,
        "{unmatched} requests counted as unmatched, after {UNKNOWN_PATHS} to unknown paths"
    );
    for path in &unknown {
        let tail = path.rsplit('/').next().unwrap();
        assert!(
            !text.contains(tail),
            "the raw path {path} leaked into /metrics"
        );
    }
    // However many distinct paths were sent, unknown ones make one series
    // per method and status.
    let unmatched_series: BTreeSet<String> = http
        .iter()
        .filter(|(labels, _)| label(labels, "route") == Some("unmatched"))
        .map(|(labels, _)| {
            format!(
                "{} {}",
                label(labels, "method").unwrap_or_default(),
                label(labels, "status").unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        unmatched_series,
        BTreeSet::from(["GET 404".to_string(), "POST 404".to_string()]),
        "the unmatched series"
    );

    // The same figures, read back through a real Prometheus.
    let prometheus = Prometheus::start(&binary, server.port);
    let deadline = Instant::now() + PROMETHEUS_WAIT;
    prometheus.value("up{job=\"decisio\"}", deadline, |v| v == 1.0);
    let decided = prometheus.value(
        "sum(decisio_http_requests_total{route=\"/v1/decide\",status=\"200\"})",
        deadline,
        |v| v >= 2.0,
    );
    let hits = prometheus.value("decisio_prefix_cache_hits_total", deadline, |v| v >= 1.0);
    let misses = prometheus.value("decisio_prefix_cache_misses_total", deadline, |v| v >= 1.0);
    let entries = prometheus.value("decisio_prefix_cache_entries", deadline, |v| v >= 1.0);
    let bytes = prometheus.value("decisio_prefix_cache_bytes", deadline, |v| v > 0.0);
    let cached = prometheus.value(
        "sum(decisio_question_seconds_count{state=\"cached\"})",
        deadline,
        |v| v >= 2.0,
    );
    let new = prometheus.value(
        "sum(decisio_question_seconds_count{state=\"new\"})",
        deadline,
        |v| v >= 2.0,
    );
    prometheus.value("decisio_new_state_seconds_count", deadline, |v| v >= 1.0);
    let unmatched_prom = prometheus.value(
        "sum(decisio_http_requests_total{route=\"unmatched\"})",
        deadline,
        |v| v >= UNKNOWN_PATHS as f64,
    );
    // Prometheus's own view of the route label set.
    let by_route = prometheus.wait_for(
        "count by (route) (decisio_http_requests_total)",
        deadline,
        |r| r.iter().any(|(m, _)| m["route"] == "/metrics"),
    );
    let prom_routes: BTreeSet<String> = by_route
        .iter()
        .map(|(m, _)| m["route"].as_str().unwrap_or_default().to_string())
        .collect();
    for route in &prom_routes {
        assert!(
            known.contains(route.as_str()),
            "Prometheus holds route label `{route}`"
        );
    }
    assert!(prom_routes.contains("unmatched") && prom_routes.contains("/v1/decide"));
    println!(
        "through Prometheus: {decided} decide requests, {hits} hits, {misses} misses, {entries} \
         entries ({bytes} bytes), questions {new} new / {cached} cached, {unmatched_prom} \
         unmatched; routes {prom_routes:?}"
    );
    assert_eq!(decided, 2.0);
    assert_eq!((hits, misses), (1.0, 1.0));
    assert_eq!((new, cached), (2.0, 2.0));
    assert_eq!(unmatched_prom, UNKNOWN_PATHS as f64);
}
