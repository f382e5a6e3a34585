//! A gateway with the vLLM backend started before its upstreams, as compose
//! and Kubernetes start them: it listens at once, answers 503 saying what
//! it waits for, probes again with back-off, and serves the moment an
//! upstream passes; `--upstream-wait` bounds the wait.
//!
//! The upstreams are decisio gateways with the MLX backend (they speak the
//! vLLM subset the backend uses). [`started_before_its_upstream`] takes how
//! the upstream is started, so the same steps run in front of a real vLLM
//! server.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Response, Server};
use serde_json::{json, Value};

/// How long a test waits for anything: an upstream to load and pass its
/// probe (a real vLLM takes about 50 s on two idle cores, several times that
/// beside other tests), a process to exit.
const BOUND: Duration = Duration::from_secs(600);

/// A loopback port nothing listens on now: one the system gives a listener
/// that is closed at once. A server of a test running beside this one
/// could be given the same port before the upstream takes it; the
/// upstream's start then fails, saying so.
fn unused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn decision() -> Value {
    json!({
        "state": "The ticket: my card was charged twice for the same order.",
        "questions": [{"text": "Which team should handle it?",
                       "options": ["Billing", "Shipping", "Technical support"]}],
    })
}

fn systemone() -> Value {
    json!({
        "state": "I was charged twice for March and I want my money back.",
        "questions": {"team": {"type": "choice", "instructions": "Which team?",
                               "criteria": {"Billing": null, "Technical": null}}},
    })
}

/// A 503 with `Retry-After`, in OpenAI's error shape, naming `url`.
fn assert_waiting(r: &Response, url: &str) {
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    assert_eq!(r.header("retry-after-ms"), Some("1000"), "{:?}", r.headers);
    let e = r.json();
    assert_eq!(e["error"]["code"], "upstream_unavailable", "{e}");
    assert_eq!(e["error"]["type"], "service_unavailable_error", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("start-up probe") && message.contains(url),
        "{e}"
    );
}

/// What one start looked like, in seconds from the gateway's start.
#[derive(Debug)]
struct Timeline {
    /// The gateway listened.
    listening: f64,
    /// Its `/health` and the model's routes answered 503.
    refused: f64,
    /// The upstream's process was started.
    upstream_started: f64,
    /// The gateway's `/health` first answered 200.
    healthy: f64,
}

/// Starts a gateway with the vLLM backend in front of `--upstream` on a
/// port where nothing listens, checks its 503s, then starts the upstream
/// there with `start_upstream(port)` (which returns once it was started;
/// the handle stops it when dropped) and waits for the gateway's
/// `/health` to answer 200. `extra`: more gateway flags.
fn started_before_its_upstream<U>(
    start_upstream: impl FnOnce(u16) -> U,
    extra: &[&str],
) -> (Server, U, Timeline) {
    let port = unused_port();
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let mut args = vec!["--backend", "vllm", "--upstream", &url];
    args.extend_from_slice(extra);
    let gateway = Server::spawn(&args);
    let listening = started.elapsed().as_secs_f64();

    // /health says what it waits for: the URL, since when, the last error.
    let health = loop {
        let r = gateway.request("GET", "/health", &[], None).unwrap();
        assert_waiting(&r, &url);
        let body = r.json();
        if body["waiting"]["upstreams"][0]["probes"].as_u64() >= Some(2) {
            break body;
        }
        assert!(started.elapsed() < BOUND, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let waiting = &health["waiting"];
    assert_eq!(waiting["upstreams"][0]["url"], url.as_str(), "{health}");
    assert_eq!(waiting["upstreams"][0]["role"], "upstream", "{health}");
    assert_eq!(waiting["upstreams"][0]["admitted"], false, "{health}");
    let last = waiting["upstreams"][0]["last_error"].as_str().unwrap();
    assert!(last.contains("cannot connect"), "{health}");
    assert!(
        waiting["since"].as_u64().unwrap() > 1_700_000_000,
        "{health}"
    );
    assert!(waiting["waited_s"].as_f64().unwrap() > 0.0, "{health}");

    // The model's routes: 503 with Retry-After, each in its own shape.
    assert_waiting(&gateway.post_json("/v1/decide", &decision()), &url);
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2});
    assert_waiting(&gateway.post_json("/v1/chat/completions", &chat), &url);
    let completion = json!({"prompt": "Hello", "max_tokens": 2});
    assert_waiting(&gateway.post_json("/v1/completions", &completion), &url);
    let r = gateway.post_json("/v1/systemone", &systemone());
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("retry-after-ms"), Some("1000"));
    let detail = &r.json()["detail"];
    assert_eq!(detail["error_type"], "overloaded_error", "{detail}");
    assert!(
        detail["message"].as_str().unwrap().contains(&url),
        "{detail}"
    );
    let refused = started.elapsed().as_secs_f64();

    let upstream = start_upstream(port);
    let upstream_started = started.elapsed().as_secs_f64();
    let healthy = loop {
        let r = gateway.request("GET", "/health", &[], None).unwrap();
        if r.status == 200 {
            assert_eq!(r.json(), json!({"status": "ok"}), "{}", r.text());
            break started.elapsed().as_secs_f64();
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(started.elapsed() < BOUND, "never admitted: {}", r.text());
        std::thread::sleep(Duration::from_millis(50));
    };
    let timeline = Timeline {
        listening,
        refused,
        upstream_started,
        healthy,
    };
    eprintln!("timeline of the start, seconds from the gateway's start: {timeline:?}");
    (gateway, upstream, timeline)
}

/// The largest difference between two answers' probabilities; the letters
/// must be equal.
fn compare(a: &Value, b: &Value) -> f64 {
    assert_eq!(a["letter"], b["letter"], "{a} vs {b}");
    let (pa, pb) = (
        a["probabilities"].as_object().unwrap(),
        b["probabilities"].as_object().unwrap(),
    );
    assert_eq!(pa.keys().collect::<Vec<_>>(), pb.keys().collect::<Vec<_>>());
    pa.values()
        .zip(pb.values())
        .map(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs())
        .fold(0.0, f64::max)
}

#[test]
fn a_gateway_started_before_its_upstream_serves_once_the_upstream_passes() {
    let (gateway, upstream, timeline) = started_before_its_upstream(
        |port| Server::spawn_on(port, &[]),
        &["--pad-policy", "none"],
    );
    assert!(timeline.listening < timeline.refused);
    assert!(timeline.refused < timeline.upstream_started);
    assert!(timeline.upstream_started < timeline.healthy);
    // The decision is the upstream's own (the same prompt, read the same way).
    let through = gateway.post_json("/v1/decide", &decision());
    assert_eq!(through.status, 200, "{}", through.text());
    let direct = upstream.post_json("/v1/decide", &decision());
    assert_eq!(direct.status, 200, "{}", direct.text());
    let worst = compare(&through.json()["answers"][0], &direct.json()["answers"][0]);
    assert!(worst < 2e-5, "{worst}");
    // What the probe tells is settled: the upstream's context and model.
    let models = gateway
        .request("GET", "/v1/models", &[], None)
        .unwrap()
        .json();
    let direct = upstream
        .request("GET", "/v1/models", &[], None)
        .unwrap()
        .json();
    assert_eq!(
        models["data"][0]["max_model_len"], direct["data"][0]["max_model_len"],
        "{models}"
    );
    assert_eq!(
        models["data"][0]["decisio"]["model_identity"],
        format!("vllm:{}", direct["data"][0]["id"].as_str().unwrap()),
        "{models}"
    );
    let r = gateway.post_json("/v1/systemone", &systemone());
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_gateway_started_before_a_real_vllm_serves_once_it_loaded() {
    // vLLM's CPU build serving the fixture's float32 copy, started after
    // the gateway, as compose starts the two.
    let (gateway, upstream, timeline) =
        started_before_its_upstream(|port| common::vllm::RealVllm::spawn(port, Some(32)), &[]);
    assert!(timeline.refused < timeline.upstream_started);
    assert!(timeline.upstream_started < timeline.healthy);
    let through = gateway.post_json("/v1/decide", &decision());
    assert_eq!(through.status, 200, "{}", through.text());
    let r = gateway.post_json("/v1/systemone", &systemone());
    assert_eq!(r.status, 200, "{}", r.text());
    // vLLM's own /health passed before the gateway admitted it.
    assert_eq!(
        common::http_get(upstream.port, "/health").unwrap().status,
        200
    );
}

#[test]
fn a_gateway_waits_for_its_head_upstream_too() {
    let upstream = Server::start(&[]);
    let port = unused_port();
    let head_url = format!("http://127.0.0.1:{port}");
    let gateway = Server::spawn(&[
        "--backend",
        "vllm",
        "--upstream",
        &upstream.url(),
        "--head-upstream",
        &head_url,
    ]);
    // The completions upstream is admitted; the head upstream is waited for.
    let started = Instant::now();
    let body = loop {
        let r = gateway.request("GET", "/health", &[], None).unwrap();
        assert_waiting(&r, &head_url);
        let body = r.json();
        if body["waiting"]["upstreams"][0]["admitted"] == true {
            break body;
        }
        assert!(started.elapsed() < BOUND, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let head = &body["waiting"]["upstreams"][1];
    assert_eq!(head["role"], "head upstream", "{body}");
    assert_eq!(head["url"], head_url.as_str(), "{body}");
    assert_eq!(head["admitted"], false, "{body}");
    assert_waiting(&gateway.post_json("/v1/decide", &decision()), &head_url);

    let _head = Server::spawn_on(port, &[]);
    gateway.wait_ready(BOUND);
    let r = gateway.post_json("/v1/decide", &decision());
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A `decisio serve` whose exit the test waits for (killed past `BOUND`);
/// its standard error is kept.
fn run_until_exit(args: &[&str]) -> (std::process::ExitStatus, String, Duration) {
    let started = Instant::now();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--model"])
        .arg(common::model_dir())
        .args(["--port", "0", "--state-dir"])
        .arg(common::fresh_dir("state"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gateway did not exit within {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = started.elapsed();
    (status, log.join().unwrap(), elapsed)
}

#[test]
fn upstream_wait_bounds_the_wait_and_exits_with_the_start_up_message() {
    let url = format!("http://127.0.0.1:{}", common::CLOSED_PORT);
    let (status, log, elapsed) = run_until_exit(&[
        "--backend",
        "vllm",
        "--upstream",
        &url,
        "--upstream-wait",
        "3",
    ]);
    assert!(!status.success(), "{status}");
    assert!(
        log.contains("error: no upstream answered the start-up probe within 3 s (--upstream-wait)"),
        "{log}"
    );
    assert!(
        log.contains(&format!("cannot connect to upstream {url}")),
        "{log}"
    );
    // It listened meanwhile, and gave up after the bound, not before.
    assert!(log.contains("listening on http://"), "{log}");
    assert!(elapsed >= Duration::from_secs(3), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");

    // 0: one probe, and the start fails at once, before listening.
    let (status, log, elapsed) = run_until_exit(&[
        "--backend",
        "vllm",
        "--upstream",
        &url,
        "--upstream-wait",
        "0",
    ]);
    assert!(!status.success(), "{status}");
    assert!(
        log.contains("no upstream answered the start-up probe: "),
        "{log}"
    );
    assert!(!log.contains("listening on http://"), "{log}");
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
}
