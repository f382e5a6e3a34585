//! The HTTP surface against a real server on 127.0.0.1 with the fixture
//! model: answers, and a clear OpenAI-shaped error for each kind of bad input.

mod common;

use std::time::Duration;

use common::{Response, Server};
use serde_json::{json, Value};

fn chat(content: &str) -> Value {
    json!({"model": "smollm2", "messages": [{"role": "user", "content": content}],
           "max_tokens": 8, "temperature": 0})
}

/// The error body, checked for OpenAI's shape.
fn error_of(r: &Response, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let body = r.json();
    let e = body["error"].clone();
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(
        e.get("param").is_some() && e.get("code").is_some(),
        "{body}"
    );
    e
}

#[test]
fn answers_and_refuses_bad_input() {
    let s = Server::start(&[]);

    // A chat completion and a completion.
    let r = s.post_json(
        "/v1/chat/completions",
        &chat("What is the capital of France?"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert!(body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("Paris"));
    assert_eq!(body["object"], "chat.completion");

    let models = s.request("GET", "/v1/models", &[], None).unwrap().json();
    assert_eq!(models["data"][0]["id"], "smollm2");
    assert_eq!(models["data"][0]["max_model_len"], 8192);

    // Malformed JSON.
    let r = s
        .request(
            "POST",
            "/v1/chat/completions",
            &[],
            Some(b"{\"messages\": ["),
        )
        .unwrap();
    let e = error_of(&r, 400);
    assert!(
        e["message"].as_str().unwrap().contains("not valid JSON"),
        "{e}"
    );
    let r = s
        .request("POST", "/v1/chat/completions", &[], Some(b""))
        .unwrap();
    error_of(&r, 400);

    // Wrong types and out-of-range values name the field.
    let mut bad = chat("hi");
    bad["temperature"] = json!("hot");
    assert_eq!(
        error_of(&s.post_json("/v1/chat/completions", &bad), 400)["param"],
        "temperature"
    );
    for (field, value) in [
        ("temperature", json!(2.5)),
        ("temperature", json!(-1)),
        ("top_p", json!(0)),
        ("max_tokens", json!(0)),
        ("n", json!(2)),
        ("presence_penalty", json!(0.5)),
        ("top_logprobs", json!(3)),
    ] {
        let mut bad = chat("hi");
        bad[field] = value.clone();
        let e = error_of(&s.post_json("/v1/chat/completions", &bad), 400);
        assert_eq!(e["param"], field, "{field}={value}: {e}");
    }
    let mut bad = chat("hi");
    bad["logprobs"] = json!(true);
    bad["top_logprobs"] = json!(21);
    assert_eq!(
        error_of(&s.post_json("/v1/chat/completions", &bad), 400)["param"],
        "top_logprobs"
    );
    let mut bad = chat("hi");
    bad["frobnicate"] = json!(1);
    let e = error_of(&s.post_json("/v1/chat/completions", &bad), 400);
    assert!(e["message"].as_str().unwrap().contains("frobnicate"), "{e}");
    let bad = json!({"messages": [{"role": "wizard", "content": "hi"}]});
    assert_eq!(
        error_of(&s.post_json("/v1/chat/completions", &bad), 400)["param"],
        "messages[0].role"
    );
    let bad = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]});
    let e = error_of(&s.post_json("/v1/chat/completions", &bad), 400);
    assert!(e["message"].as_str().unwrap().contains("image"), "{e}");
    let bad = json!({"messages": []});
    assert_eq!(
        error_of(&s.post_json("/v1/chat/completions", &bad), 400)["param"],
        "messages"
    );

    // Unknown model, route and method.
    let mut bad = chat("hi");
    bad["model"] = json!("gpt-9");
    let e = error_of(&s.post_json("/v1/chat/completions", &bad), 404);
    assert_eq!(e["code"], "model_not_found");
    error_of(&s.request("GET", "/v1/nothing", &[], None).unwrap(), 404);
    error_of(
        &s.request("GET", "/v1/chat/completions", &[], None).unwrap(),
        405,
    );

    // Context length: the prompt alone, and prompt plus max_tokens.
    let long = "hello ".repeat(9000);
    let e = error_of(&s.post_json("/v1/chat/completions", &chat(&long)), 400);
    assert_eq!(e["code"], "context_length_exceeded");
    let mut bad = chat("hi");
    bad["max_tokens"] = json!(8190);
    let e = error_of(&s.post_json("/v1/chat/completions", &bad), 400);
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("context_length_exceeded"), Some("max_tokens"))
    );
    let e = error_of(
        &s.post_json("/v1/completions", &json!({"prompt": long, "max_tokens": 1})),
        400,
    );
    assert_eq!(e["code"], "context_length_exceeded");
    assert_eq!(e["param"], "prompt");

    // Completions: token ids outside the vocabulary, batches.
    let e = error_of(
        &s.post_json("/v1/completions", &json!({"prompt": [1, 2, 999999]})),
        400,
    );
    assert_eq!(e["param"], "prompt");
    let e = error_of(
        &s.post_json("/v1/completions", &json!({"prompt": ["a", "b"]})),
        400,
    );
    assert_eq!(e["param"], "prompt");

    // /tokenize and /detokenize in vLLM's shapes.
    let t = s
        .post_json("/tokenize", &json!({"prompt": "Hello, world!"}))
        .json();
    assert_eq!(
        t["count"].as_u64().unwrap() as usize,
        t["tokens"].as_array().unwrap().len()
    );
    assert_eq!(t["max_model_len"], 8192);
    let d = s
        .post_json("/detokenize", &json!({"tokens": t["tokens"]}))
        .json();
    assert_eq!(d["prompt"], "Hello, world!");
    let chat_ids = s
        .post_json(
            "/tokenize",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .json();
    assert_eq!(
        chat_ids["tokens"][0], 1,
        "the chat prompt starts with <|im_start|>"
    );
    error_of(&s.post_json("/detokenize", &json!({"tokens": [-1]})), 400);

    // Streaming: role first, content, finish reason, [DONE].
    let mut req = chat("Say hello.");
    req["stream"] = json!(true);
    let r = s.post_json("/v1/chat/completions", &req);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events: Vec<&str> = r
        .text()
        .leak()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let first: Value = serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last: Value =
        serde_json::from_str(events[events.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
    assert!(last["choices"][0]["finish_reason"].is_string(), "{last}");
}

#[test]
fn bodies_over_the_limit_get_413() {
    let s = Server::start(&["--max-body-mb", "1"]);
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(1_500_000)}]});
    let e = error_of(&s.post_json("/v1/chat/completions", &big), 413);
    assert_eq!(e["code"], "request_too_large");
    // The server still serves afterwards.
    assert_eq!(s.post_json("/v1/chat/completions", &chat("hi")).status, 200);
}

#[test]
fn api_key_is_required_and_checked() {
    let s = Server::start(&["--api-key", "sesame"]);
    let body = chat("hi").to_string();
    let r = s
        .request("POST", "/v1/chat/completions", &[], Some(body.as_bytes()))
        .unwrap();
    assert_eq!(error_of(&r, 401)["code"], "invalid_api_key");
    let wrong = [("Authorization", "Bearer open")];
    error_of(
        &s.request(
            "POST",
            "/v1/chat/completions",
            &wrong,
            Some(body.as_bytes()),
        )
        .unwrap(),
        401,
    );
    error_of(&s.request("GET", "/v1/models", &wrong, None).unwrap(), 401);
    let right = [("Authorization", "Bearer sesame")];
    let r = s
        .request(
            "POST",
            "/v1/chat/completions",
            &right,
            Some(body.as_bytes()),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Health needs no key.
    assert_eq!(s.request("GET", "/health", &[], None).unwrap().status, 200);
}

#[test]
fn a_full_queue_answers_503_and_nothing_is_dropped() {
    let s = Server::start(&["--max-queue", "1"]);
    // Long generations: one runs, one waits, the others find the queue full.
    let long = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
                      "max_tokens": 400, "temperature": 0, "ignore_eos": true});
    let results: Vec<Response> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (s, long) = (&s, &long);
                scope.spawn(move || {
                    std::thread::sleep(Duration::from_millis(50 * i));
                    s.post_json("/v1/chat/completions", long)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.status == 200).count();
    let full: Vec<_> = results.iter().filter(|r| r.status == 503).collect();
    assert_eq!(ok + full.len(), 4, "every request answered 200 or 503");
    assert!(ok >= 1 && !full.is_empty(), "{ok} ok, {} full", full.len());
    for r in full {
        assert_eq!(error_of(r, 503)["code"], "queue_full");
        assert_eq!(r.header("retry-after"), Some("1"));
    }
}

#[test]
fn requests_during_loading_get_503() {
    let s = Server::spawn(&[]);
    let r = s.request("GET", "/health", &[], None).unwrap();
    let e = error_of(&r, 503);
    assert_eq!(e["code"], "model_not_loaded");
    let r = s.post_json("/v1/chat/completions", &chat("hi"));
    // Loading takes well over the time of two requests on loopback.
    assert_eq!(error_of(&r, 503)["code"], "model_not_loaded");
    s.wait_ready(Duration::from_secs(120));
    assert_eq!(s.post_json("/v1/chat/completions", &chat("hi")).status, 200);
}
