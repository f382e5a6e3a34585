//! Contract tests of the vLLM backend: a real `decisio serve --backend vllm`
//! in front of a small HTTP server on 127.0.0.1 that replays answers in the
//! exact shapes of vLLM's OpenAI server (`tests/fixtures/vllm_contract/`:
//! `/v1/models` with `max_model_len`, `/health`, `/tokenize`, completions
//! with `return_tokens_as_token_ids` and `logprob_token_ids`, and its error
//! bodies, the current `{"error": {…}}` and the older flat one; requests
//! at vLLM's limits; a pooling server whose embeddings are normalised). The
//! replay server records what the gateway sent, so the tests check both
//! directions: the requests' fields and the gateway's answers and errors.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use serde_json::{json, Value};

/// A request the replay server received.
#[derive(Clone, Debug)]
struct Received {
    method: String,
    path: String,
    body: Value,
}

/// Serves recorded exchanges: the first whose method and path are the
/// request's and whose `match` fields all equal the request body's (a
/// `null` there: the field is absent or null) gives the answer. A request
/// no exchange matches is answered 500, naming it.
struct Replay {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
}

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm_contract")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn matches(exchange: &Value, r: &Received) -> bool {
    let want = &exchange["request"];
    if want["method"] != r.method.as_str() || want["path"] != r.path.as_str() {
        return false;
    }
    let Some(fields) = want["match"].as_object() else {
        return true;
    };
    fields.iter().all(|(k, v)| match (v, r.body.get(k)) {
        (Value::Null, None) => true,
        (v, Some(got)) => v == got,
        _ => false,
    })
}

impl Replay {
    fn start(name: &str) -> Replay {
        let exchanges = fixture(name)["exchanges"].as_array().unwrap().clone();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let exchanges = Arc::new(exchanges);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (exchanges, log) = (exchanges.clone(), log.clone());
                std::thread::spawn(move || serve(stream, &exchanges, &log));
            }
        });
        Replay { port, received }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The completions received, in order.
    fn completions(&self) -> Vec<Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == "/v1/completions")
            .map(|r| r.body.clone())
            .collect()
    }
}

/// One keep-alive connection: requests with Content-Length bodies.
fn serve(stream: TcpStream, exchanges: &[Value], log: &Mutex<Vec<Received>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let r = Received {
            method,
            path,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        };
        log.lock().unwrap().push(r.clone());
        let (status, body) = match exchanges.iter().find(|e| matches(e, &r)) {
            Some(e) => (
                e["response"]["status"].as_u64().unwrap() as u16,
                match &e["response"]["body"] {
                    Value::Null => String::new(),
                    b => b.to_string(),
                },
            ),
            None => (500, format!("no recorded exchange for {r:?}")),
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(body.as_bytes()).is_err()
        {
            return;
        }
    }
}

fn gateway(replay: &Replay, extra: &[&str]) -> Server {
    let url = replay.url();
    let mut args = vec!["--backend", "vllm", "--upstream", url.as_str()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// The route's calibration (temperature 1) of log-probabilities read as
/// f32: softmax in f64, stored as f32.
fn softmax(logprobs: &[f64]) -> Vec<f32> {
    let logprobs: Vec<f64> = logprobs.iter().map(|&v| f64::from(v as f32)).collect();
    let max = logprobs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logprobs.iter().map(|v| (v - max).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|v| (v / total) as f32).collect()
}

fn question() -> Value {
    json!({"state": "Ticket 4411: the customer was charged twice for one order.",
           "questions": [{"text": "Which team should handle this ticket?",
                          "options": ["shipping", "billing", "technical", "legal"]}]})
}

fn probabilities(answer: &Value) -> Vec<f32> {
    answer["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

#[test]
fn letters_are_read_by_logprob_token_ids_from_vllm_shapes() {
    let replay = Replay::start("logprob_token_ids.json");
    let gw = gateway(&replay, &["--pad-policy", "none"]);
    // The probe asked for the 26 letters by id, with logprobs set.
    let probe = &replay.completions()[0];
    assert_eq!(probe["prompt"], json!([49, 50]));
    assert_eq!(probe["logprobs"], 1);
    assert_eq!(probe["logprob_token_ids"].as_array().unwrap().len(), 26);
    assert_eq!(probe["model"], "base");

    let r = gw.post_json("/v1/decide", &question());
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json();
    let a = &d["answers"][0];
    assert_eq!(a["letter"], "B", "{d}");
    assert_eq!(a["option"], "billing");
    assert_eq!(
        probabilities(a),
        softmax(&[-2.3125, -0.4375, -1.75, -3.5]),
        "{d}"
    );
    // cached_tokens (32) is fewer than the state's tokens: not cached.
    assert_eq!(d["state"]["cached"], false, "{d}");
    let sent = replay.completions().last().unwrap().clone();
    assert!(sent["prompt"].as_array().unwrap().iter().all(Value::is_u64));
    assert_eq!(sent["max_tokens"], 1);
    assert_eq!(sent["temperature"], 0.0);
    assert_eq!(sent["return_tokens_as_token_ids"], true);
    assert_eq!(sent["logprob_token_ids"], json!([49, 50, 51, 52]));
    assert_eq!(sent["logprobs"], 1);

    // Two questions in warm mode: the state alone first, then both.
    let mut two = question();
    let q = two["questions"][0].clone();
    two["questions"] = json!([q, q]);
    let before = replay.completions().len();
    let r = gw.post_json("/v1/decide", &two);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = replay.completions()[before..].to_vec();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(sent[0].get("logprobs").is_none());
    let state_tokens = d["state"]["tokens"].as_u64().unwrap() as usize;
    assert_eq!(sent[0]["prompt"].as_array().unwrap().len(), state_tokens);

    // The gateway's /v1/models, /tokenize and /health keep vLLM's shapes.
    let vllm = fixture("logprob_token_ids.json");
    let recorded = |name: &str| -> Value {
        vllm["exchanges"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap()["response"]["body"]
            .clone()
    };
    let models = gw.request("GET", "/v1/models", &[], None).unwrap().json();
    assert_eq!(models["data"][0]["max_model_len"], 2048, "{models}");
    for key in ["id", "object", "created", "owned_by", "max_model_len"] {
        assert!(
            recorded("models")["data"][0].get(key).is_some()
                && models["data"][0].get(key).is_some(),
            "{key}"
        );
    }
    let t = gw
        .post_json("/tokenize", &json!({"prompt": "Hello"}))
        .json();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let mut want = keys(&recorded("tokenize"));
    let mut got = keys(&t);
    want.sort();
    got.sort();
    assert_eq!(got, want, "{t}");
    assert_eq!(t["max_model_len"], 2048);
    let h = gw.request("GET", "/health", &[], None).unwrap();
    assert_eq!(h.status, 200);
}

#[test]
fn an_older_vllm_is_read_by_top_k_from_its_flat_error_body() {
    let replay = Replay::start("top_k.json");
    let gw = gateway(&replay, &["--pad-policy", "none"]);
    let sent = replay.completions();
    // logprob_token_ids ignored, allowed_token_ids not normalised, then
    // the cap read from the flat error body: top-20.
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[2]["logprobs"], 49153);
    let r = gw.post_json("/v1/decide", &question());
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json();
    let sent = replay.completions();
    assert_eq!(sent.last().unwrap()["logprobs"], 20);
    assert!(sent.last().unwrap().get("logprob_token_ids").is_none());
    assert_eq!(d["answers"][0]["letter"], "A", "{d}");
    assert_eq!(
        probabilities(&d["answers"][0]),
        softmax(&[-0.9, -1.2, -2.6, -3.1])
    );
}

fn assert_error(r: &common::Response, status: u16, code: &str, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["code"], code, "{e}");
    assert!(e["error"]["type"].is_string(), "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{e}");
}

#[test]
fn vllm_errors_become_openai_errors_with_its_message() {
    let replay = Replay::start("logprob_token_ids.json");
    let gw = gateway(
        &replay,
        &[
            "--upstream-retries",
            "1",
            "--upstream-backoff-ms",
            "1",
            "--max-logprobs",
            "30",
        ],
    );
    let completion = |max_tokens: u32| {
        let mut body = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": max_tokens});
        if max_tokens == 3 {
            body["logprobs"] = json!(25);
        }
        gw.post_json("/v1/completions", &body)
    };
    assert_error(
        &completion(3),
        502,
        "upstream_error",
        "Requested sample logprobs of 25, which is greater than max allowed: 20",
    );
    assert_error(
        &completion(4),
        502,
        "upstream_error",
        "This model's maximum context length is 2048 tokens",
    );
    assert_error(
        &completion(5),
        502,
        "upstream_error",
        "The model `base` does not exist.",
    );
    // A 4xx is not retried: one call each.
    let sent = replay.completions();
    for max_tokens in [3, 4, 5] {
        assert_eq!(
            sent.iter()
                .filter(|b| b["max_tokens"] == max_tokens)
                .count(),
            1
        );
    }
    // A 503 is retried, then answered 503 with vLLM's message.
    assert_error(
        &completion(6),
        503,
        "upstream_unavailable",
        "not ready to serve requests",
    );
    assert_eq!(
        replay
            .completions()
            .iter()
            .filter(|b| b["max_tokens"] == 6)
            .count(),
        2
    );
}

#[test]
fn image_content_parts_are_passed_through_to_the_upstream_chat_route() {
    let replay = Replay::start("logprob_token_ids.json");
    let gw = gateway(&replay, &[]);
    let image = json!({"type": "image_url",
                       "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="}});
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"}, image]}]);
    let r = gw.post_json(
        "/v1/chat/completions",
        &json!({"model": "smollm2", "messages": messages, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    assert_eq!(a["model"], "smollm2", "{a}");
    assert_eq!(
        a["choices"][0]["message"]["content"],
        "A red square on a white background."
    );
    // What vLLM received: the messages as sent, the image part included,
    // under the upstream's model name, with the sampling fields.
    let sent: Vec<Received> = replay
        .received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .cloned()
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["model"], "base");
    assert_eq!(sent[0].body["messages"], messages);
    assert_eq!(sent[0].body["max_tokens"], 16);
    assert_eq!(sent[0].body["temperature"], 0.0);
    // Streaming is refused for it, and other fields are checked as usual.
    let r = gw.post_json(
        "/v1/chat/completions",
        &json!({"model": "smollm2", "messages": messages, "stream": true}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "stream");
    let r = gw.post_json(
        "/v1/chat/completions",
        &json!({"model": "smollm2", "messages": messages, "n": 2}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "n");
}

/// A 400 in OpenAI's shape naming `param`, its message holding `needle`.
fn assert_refused(r: &common::Response, param: &str, needle: &str) {
    assert_eq!(r.status, 400, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["param"], param, "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{e}");
}

/// What vLLM 0.33.0 refuses is a 400 from the gateway naming the field,
/// before anything is sent upstream (never vLLM's 400 as a 502): more than
/// 128 `logprob_token_ids`, `echo` with `max_tokens: 0` and
/// `logprob_token_ids`, and seed -1 (vLLM's "no seed"). A value just inside
/// each limit is sent as vLLM takes it, seeds as signed 64-bit integers.
#[test]
fn vllm_limits_are_refused_before_anything_is_sent() {
    let replay = Replay::start("limits.json");
    let gw = gateway(&replay, &["--pad-policy", "none"]);
    let completion = |extra: Value| {
        let mut body =
            json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 1, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        gw.post_json("/v1/completions", &body)
    };
    let ids = |n: u32| (1000..1000 + n).collect::<Vec<u32>>();
    let sent_at_start = replay.completions().len();

    assert_refused(
        &completion(json!({"logprobs": 1, "logprob_token_ids": ids(129)})),
        "logprob_token_ids",
        "at most 128 ids",
    );
    assert_refused(
        &completion(json!({"logprobs": 1, "logprob_token_ids": ids(2),
                           "echo": true, "max_tokens": 0})),
        "logprob_token_ids",
        "`max_tokens` to 1 or more",
    );
    for seed in [json!(-1), json!(9223372036854775808u64)] {
        assert_refused(&completion(json!({"seed": seed})), "seed", "seed");
    }
    let mut chat = json!({"model": "smollm2", "max_tokens": 1, "seed": -1,
                          "messages": [{"role": "user", "content": "Hello"}]});
    assert_refused(
        &gw.post_json("/v1/chat/completions", &chat),
        "seed",
        "leave `seed` out",
    );
    assert_eq!(replay.completions().len(), sent_at_start, "sent upstream");

    // Just inside: 128 ids, and signed seeds at both ends of vLLM's range.
    let r = completion(json!({"logprobs": 1, "logprob_token_ids": ids(128)}));
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = replay.completions().last().unwrap().clone();
    assert_eq!(sent["logprob_token_ids"], json!(ids(128)));
    for seed in [json!(-2), json!(i64::MIN), json!(i64::MAX), json!(0)] {
        let r = completion(json!({"seed": seed}));
        assert_eq!(r.status, 200, "seed {seed}: {}", r.text());
        assert_eq!(replay.completions().last().unwrap()["seed"], seed);
    }
    chat["seed"] = json!(-2);
    let r = gw.post_json("/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(replay.completions().last().unwrap()["seed"], -2);
}

/// A head upstream whose pooler normalises is refused at start, and the
/// gateway names the flag that vLLM 0.14 and later take (0.16 and later
/// refuse the older `normalize`).
#[test]
fn a_normalising_head_upstream_is_refused_naming_the_pooler_flag() {
    let replay = Replay::start("limits.json");
    let head = Replay::start("pooler.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--backend", "vllm", "--model"])
        .arg(common::model_dir())
        .args(["--upstream", &replay.url(), "--head-upstream", &head.url()])
        .args(["--port", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("normalised (norm 1)"), "{err}");
    assert!(
        err.contains(r#"--pooler-config '{"pooling_type": "LAST", "use_activation": false}'"#),
        "{err}"
    );
    assert!(!err.contains("normalize"), "{err}");
}
