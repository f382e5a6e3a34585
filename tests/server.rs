//! The HTTP surface against a real server on 127.0.0.1 with the fixture
//! model: answers, and a clear OpenAI-shaped error for each kind of bad input.

mod common;

use std::time::Duration;

use common::{wait_until, Response, Server};
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
    // What answers, for run records: no folder of this machine in it.
    let id = &models["data"][0]["decisio"];
    assert_eq!(id["backend"], "MLX");
    assert_eq!(id["architecture"], "llama");
    assert_eq!(id["default_temperature"], 1.0);
    assert_eq!(id["padding"], "none");
    assert_eq!(id["model_identity"].as_str().unwrap().len(), 64);
    assert_eq!(id["tokenizer_identity"].as_str().unwrap().len(), 64);

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
        ("top_k", json!(40)),
        ("min_p", json!(0.05)),
        ("repetition_penalty", json!(1.1)),
    ] {
        let mut bad = chat("hi");
        bad[field] = value.clone();
        let e = error_of(&s.post_json("/v1/chat/completions", &bad), 400);
        assert_eq!(e["param"], field, "{field}={value}: {e}");
    }
    // vLLM's sampling fields at their neutral values are taken (the vLLM
    // backend sends them so to its upstreams): every backend samples with
    // temperature and top_p alone.
    let mut neutral = chat("hi");
    for (field, value) in [
        ("top_k", json!(0)),
        ("min_p", json!(0.0)),
        ("repetition_penalty", json!(1.0)),
        ("presence_penalty", json!(0.0)),
        ("frequency_penalty", json!(0.0)),
    ] {
        neutral[field] = value;
    }
    neutral["max_tokens"] = json!(1);
    let r = s.post_json("/v1/chat/completions", &neutral);
    assert_eq!(r.status, 200, "{}", r.text());
    neutral["top_k"] = json!(-1);
    assert_eq!(s.post_json("/v1/chat/completions", &neutral).status, 200);
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
    // RFC 9110: a 405 lists the methods the path takes; HEAD answers as
    // GET without the body; OPTIONS lists the methods.
    let r = s.request("GET", "/v1/chat/completions", &[], None).unwrap();
    error_of(&r, 405);
    assert_eq!(r.header("allow"), Some("POST, OPTIONS"));
    let r = s.request("DELETE", "/v1/models", &[], None).unwrap();
    assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    let r = s.request("OPTIONS", "/v1/tasks/x", &[], None).unwrap();
    assert_eq!(
        (r.status, r.header("allow")),
        (204, Some("GET, HEAD, DELETE, OPTIONS"))
    );
    let get = s.request("GET", "/v1/models", &[], None).unwrap();
    let head = s.request("HEAD", "/v1/models", &[], None).unwrap();
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(
        head.header("content-length").map(str::to_string),
        Some(get.body.len().to_string())
    );
    // Without --api-key the served description asks for no key.
    let doc = s.request("GET", "/openapi.json", &[], None).unwrap().json();
    assert_eq!(doc["security"], json!([]));

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

    // Completions: token ids outside the vocabulary, alone or in a list of
    // prompts (refused before any is run), an empty prompt in a list, a
    // list streamed.
    let e = error_of(
        &s.post_json("/v1/completions", &json!({"prompt": [1, 2, 999999]})),
        400,
    );
    assert_eq!(e["param"], "prompt");
    let e = error_of(
        &s.post_json("/v1/completions", &json!({"prompt": [[1, 2], [999999]]})),
        400,
    );
    assert_eq!(e["param"], "prompt");
    let e = error_of(
        &s.post_json("/v1/completions", &json!({"prompt": ["a", ""]})),
        400,
    );
    assert_eq!(e["param"], "prompt");
    let e = error_of(
        &s.post_json(
            "/v1/completions",
            &json!({"prompt": ["a", "b"], "stream": true}),
        ),
        400,
    );
    assert_eq!(e["param"], "stream");

    // The limits a vLLM upstream imposes hold on this backend too
    // (docs/limits.md): one contract for both. Just beyond each, a 400
    // naming the field; just inside, an answer.
    let completion = |extra: Value| {
        let mut body = json!({"prompt": "Hello", "max_tokens": 2, "temperature": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        s.post_json("/v1/completions", &body)
    };
    let ids = |n: u32| (1000..1000 + n).collect::<Vec<u32>>();
    for (extra, param) in [
        (
            json!({"logprobs": 1, "logprob_token_ids": ids(129)}),
            "logprob_token_ids",
        ),
        (
            json!({"logprobs": 1, "logprob_token_ids": ids(2), "echo": true, "max_tokens": 0}),
            "logprob_token_ids",
        ),
        (json!({"seed": -1}), "seed"),
        (json!({"seed": 9223372036854775808u64}), "seed"),
    ] {
        let e = error_of(&completion(extra.clone()), 400);
        assert_eq!(e["param"], param, "{extra}: {e}");
    }
    let below = br#"{"prompt": "Hello", "seed": -9223372036854775809}"#;
    let r = s
        .request("POST", "/v1/completions", &[], Some(below))
        .unwrap();
    assert_eq!(error_of(&r, 400)["param"], "seed");
    let mut bad = chat("hi");
    bad["seed"] = json!(-1);
    assert_eq!(
        error_of(&s.post_json("/v1/chat/completions", &bad), 400)["param"],
        "seed"
    );
    for extra in [
        json!({"logprobs": 1, "logprob_token_ids": ids(128)}),
        json!({"logprobs": 1, "logprob_token_ids": ids(2), "echo": true, "max_tokens": 1}),
        json!({"logprobs": 1, "echo": true, "max_tokens": 0}),
        json!({"seed": i64::MIN}),
        json!({"seed": i64::MAX}),
    ] {
        let r = completion(extra.clone());
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
    }
    let top = completion(json!({"logprobs": 1, "logprob_token_ids": ids(128),
                                "return_tokens_as_token_ids": true}))
    .json();
    let top = &top["choices"][0]["logprobs"]["top_logprobs"][0];
    assert!(top.as_object().unwrap().len() >= 128, "{top}");
    // A negative seed repeats its draw, as any other.
    let draw =
        || completion(json!({"seed": -2, "max_tokens": 6})).json()["choices"][0]["text"].clone();
    assert_eq!(draw(), draw());

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
    let r = s.request("GET", "/v1/models", &wrong, None).unwrap();
    error_of(&r, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let right = [("Authorization", "Bearer sesame")];
    // The served description says the key is required, except where it is not.
    let doc = s
        .request("GET", "/openapi.json", &right, None)
        .unwrap()
        .json();
    assert_eq!(doc["security"], json!([{"bearerAuth": []}]));
    assert_eq!(doc["paths"]["/metrics"]["get"]["security"], json!([]));
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

/// `decisio_queue_depth` (engine jobs waiting or running) from /metrics.
fn queue_depth(s: &Server) -> i64 {
    let text = s.request("GET", "/metrics", &[], None).unwrap().text();
    text.lines()
        .find_map(|l| l.strip_prefix("decisio_queue_depth "))
        .and_then(|v| v.trim().parse().ok())
        .expect("decisio_queue_depth in /metrics")
}

#[test]
fn a_full_queue_answers_503_and_nothing_is_dropped() {
    use std::io::{BufRead, BufReader, Write};
    let s = Server::start(&["--max-queue", "1"]);
    // A streamed generation runs: its first event has arrived, so the engine
    // took it off the queue. It is far from its end (ignore_eos, 1,500
    // tokens) until the test hangs up.
    let mut running = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Tell me a long story."}],
                      "max_tokens": 1500, "temperature": 0, "ignore_eos": true,
                      "stream": true})
    .to_string();
    write!(
        running,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut stream = BufReader::new(running.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("data:") {
        line.clear();
        assert!(stream.read_line(&mut line).unwrap() > 0, "the stream ended");
    }
    assert!(line.contains("chat.completion.chunk"), "{line}");
    std::thread::scope(|scope| {
        // A second one waits in the queue (depth 2: one running, one waiting).
        let waiting = scope.spawn(|| s.post_json("/v1/chat/completions", &chat("Hello")));
        wait_until("a job waits in the queue", Duration::from_secs(120), || {
            queue_depth(&s) == 2
        });
        // The queue (1) is full: the next ones are refused at once.
        for _ in 0..2 {
            let r = s.post_json("/v1/chat/completions", &chat("Hi"));
            assert_eq!(error_of(&r, 503)["code"], "queue_full");
            assert_eq!(r.header("retry-after"), Some("1"));
            assert_eq!(r.header("retry-after-ms"), Some("1000"));
        }
        assert_eq!(queue_depth(&s), 2);
        // Hanging up stops the running generation; the waiting one is
        // answered.
        drop(stream);
        running.shutdown(std::net::Shutdown::Both).unwrap();
        let r = waiting.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    });
    wait_until("the queue drains", Duration::from_secs(120), || {
        queue_depth(&s) == 0
    });
}

#[test]
fn requests_during_loading_get_503() {
    // A copy of the fixture whose weight index is a named pipe: the model
    // loads only once the test writes the index into it, so the server is
    // loading for as long as the test needs, whatever the machine's speed.
    let dir = common::fresh_dir("loading-model");
    for entry in std::fs::read_dir(common::model_dir()).unwrap() {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let index = dir.join("model.safetensors.index.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&index)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
    let s = Server::spawn_model(0, dir.as_os_str(), &[], &[]);
    for _ in 0..3 {
        let r = s.request("GET", "/health", &[], None).unwrap();
        assert_eq!(error_of(&r, 503)["code"], "model_not_loaded");
        let r = s.post_json("/v1/chat/completions", &chat("hi"));
        assert_eq!(error_of(&r, 503)["code"], "model_not_loaded");
    }
    // Opening the pipe for writing waits for the loader to open it.
    std::fs::write(
        &index,
        json!({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}).to_string(),
    )
    .unwrap();
    s.wait_ready(Duration::from_secs(120));
    assert_eq!(s.post_json("/v1/chat/completions", &chat("hi")).status, 200);
}

/// A client that leaves mid-request frees the engine within one chunk of
/// its state: its job stops (`decisio_abandoned_jobs_total`, the request
/// counted 499), and the state read so far is kept, so that the client's
/// retry reads on from it; what it answers is, bit for bit, what a second
/// server reading the state from its start answers.
#[test]
fn a_client_that_leaves_stops_its_work_and_its_retry_reads_on() {
    let flags = ["--prefill-chunk", "128"];
    let s = Server::start(&flags);
    // About 1,800 tokens: 14 chunks of 128.
    let state =
        "The parcel left the depot on Monday and reached the customer on Friday. ".repeat(120);
    let body = json!({"state": state, "questions": [
        {"text": "When did the parcel arrive?", "options": ["Monday", "Friday", "Sunday"]}]});
    s.post_and_leave("/v1/decide", &body, || {
        std::thread::sleep(Duration::from_millis(1500))
    });
    let left = std::time::Instant::now();
    wait_until("the job stops", Duration::from_secs(120), || {
        s.metric("decisio_abandoned_jobs_total", "") == 1.0
    });
    let stopped = left.elapsed();
    assert!(
        stopped < Duration::from_secs(10),
        "stopped {stopped:?} after the client left"
    );
    wait_until("the queue drains", Duration::from_secs(120), || {
        queue_depth(&s) == 0
    });
    assert_eq!(
        s.metric("decisio_http_requests_total", "status=\"499\""),
        1.0
    );
    // The retry reads on from the chunks read before the client left.
    let retried = s.post_json("/v1/decide", &body);
    assert_eq!(retried.status, 200, "{}", retried.text());
    let kept = s.metric("decisio_resumed_state_tokens_total", "");
    assert!(
        kept > 0.0 && kept % 128.0 == 0.0,
        "{kept} tokens read on from"
    );
    let fresh = Server::start(&flags).post_json("/v1/decide", &body);
    assert_eq!(fresh.status, 200, "{}", fresh.text());
    assert_eq!(
        retried.json()["answers"][0]["probabilities"],
        fresh.json()["answers"][0]["probabilities"]
    );
    eprintln!("stopped {stopped:?} after the client left; {kept} state tokens kept");
}
