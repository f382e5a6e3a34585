//! One upstream request per state: the vLLM backend sends a decision's
//! questions on one state as one completions request whose `prompt` is the
//! list of their token-id prompts (`docs/design/vllm.md`, "One request per
//! state"), in front of a decisio gateway with the MLX backend, whose own
//! `POST /v1/completions` answers a list of prompts as vLLM does. Counted
//! with the gateway's own metrics; split by `--upstream-batch-prompts` and
//! `--upstream-batch-tokens` with the same bits; letters beyond the 128 one
//! request may name; and the list form of `/v1/completions` itself, each
//! prompt's choice bit for bit its answer alone, bad lists refused in
//! OpenAI's shape.

mod common;

use common::{reference_decisions as reference, reference_questions as questions, Server};
use serde_json::{json, Value};
use std::time::Duration;

fn ok(r: common::Response) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// A gateway with the vLLM backend in front of `upstream`, without health
/// checks, so that its count of upstream requests is the requests' own.
fn gateway(upstream: &Server, extra: &[&str]) -> Server {
    let url = upstream.url();
    let mut args = vec![
        "--backend",
        "vllm",
        "--upstream",
        url.as_str(),
        "--pad-policy",
        "none",
        "--health-interval",
        "3600",
        "--upstream-timeout",
        "600",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// The gateway's count of upstream requests answered.
fn sent(s: &Server) -> f64 {
    let text = s.request("GET", "/metrics", &[], None).unwrap().text();
    text.lines()
        .filter(|l| {
            l.starts_with("decisio_upstream_requests_total") && l.contains("outcome=\"ok\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A decision through `s`, and the upstream requests it took.
fn decide_counted(s: &Server, body: &Value) -> (Value, f64) {
    let before = sent(s);
    let d = decide(s, body);
    (d, sent(s) - before)
}

/// A decision, waited for as long as a loaded machine may take to read
/// 255 long options (a test's default read timeout is 2 minutes).
fn decide(s: &Server, body: &Value) -> Value {
    ok(s.post_json_waiting("/v1/decide", body, Duration::from_secs(600)))
}

/// Every answer's probabilities and letter log-probabilities as f32 bits.
fn bits(d: &Value) -> Vec<Vec<u32>> {
    d["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            ["probabilities", "letter_logprobs"]
                .iter()
                .flat_map(|k| a[*k].as_object().unwrap().values())
                .map(|v| (v.as_f64().unwrap() as f32).to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn a_state_s_questions_are_one_request_or_split_by_the_bounds_with_the_same_bits() {
    let mlx = Server::start(&[]);
    let one = gateway(&mlx, &[]);
    let by_prompts = gateway(&mlx, &["--upstream-batch-prompts", "3"]);
    let by_tokens = gateway(&mlx, &["--upstream-batch-tokens", "1"]);
    let reference = reference();
    let st = &reference["states"][3];
    let body = json!({"state": st["state"], "questions": questions(st, 10)});
    let n = body["questions"].as_array().unwrap().len();
    assert_eq!(n, 10);
    let direct = ok(mlx.post_json("/v1/decide", &body));
    // Ten questions, one list request; the MLX backend's bits.
    let (d, requests) = decide_counted(&one, &body);
    assert_eq!(requests, 1.0, "{d}");
    assert_eq!(bits(&d), bits(&direct));
    // At most 3 prompts a request: 4 requests, the same bits.
    let (d, requests) = decide_counted(&by_prompts, &body);
    assert_eq!(requests, 4.0, "{d}");
    assert_eq!(bits(&d), bits(&direct));
    // A bound below one prompt's tokens: each question alone.
    let (d, requests) = decide_counted(&by_tokens, &body);
    assert_eq!(requests, n as f64, "{d}");
    assert_eq!(bits(&d), bits(&direct));
    // Sequential mode still sends one completion per question.
    let mut seq = body.clone();
    seq["multi_question"] = json!("sequential");
    let (d, requests) = decide_counted(&one, &seq);
    assert_eq!(requests, n as f64, "{d}");
    assert_eq!(bits(&d), bits(&direct));
}

#[test]
fn a_question_of_255_options_is_read_past_the_128_ids_of_one_request() {
    let mlx = Server::start(&[]);
    // A fair budget that does not cut the two questions apart (a fresh
    // gateway's is `--fair-tokens` until it measured its upstream).
    let gw = gateway(&mlx, &["--fair-tokens", "65536"]);
    let options: Vec<String> = (0..255).map(|i| format!("a crate of {i} apples")).collect();
    let body = json!({"state": "The sky on a clear day is blue.", "questions": [
        {"text": "Which crate holds 200 apples?", "options": options},
        {"text": "What colour is the sky?", "options": ["red", "blue", "green"]}]});
    let direct = decide(&mlx, &body);
    // The letters in two list requests of both prompts (128 and 127 ids),
    // sent at once.
    let (d, requests) = decide_counted(&gw, &body);
    assert_eq!(requests, 2.0, "{d}");
    assert_eq!(
        d["answers"][0]["probabilities"].as_object().unwrap().len(),
        255
    );
    assert_eq!(d["answers"][0]["letter"], direct["answers"][0]["letter"]);
    assert_eq!(bits(&d), bits(&direct));
}

#[test]
fn completions_answer_a_list_of_prompts_each_as_if_sent_alone() {
    let s = Server::start(&[]);
    let prompts = [
        "The capital of France is",
        "Two plus two is",
        "The first month of the year is",
    ];
    let ask = |prompt: Value| {
        json!({"model": "smollm2", "prompt": prompt, "max_tokens": 3, "temperature": 0,
               "logprobs": 2, "logprob_token_ids": [32, 33, 34]})
    };
    // Token ids, as the vLLM backend sends them.
    let ids: Vec<Value> = prompts
        .iter()
        .map(|p| ok(s.post_json("/tokenize", &json!({"prompt": p})))["tokens"].clone())
        .collect();
    let alone: Vec<Value> = ids
        .iter()
        .map(|p| ok(s.post_json("/v1/completions", &ask(p.clone()))))
        .collect();
    let list = ok(s.post_json("/v1/completions", &ask(json!(ids))));
    let choices = list["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{list}");
    for (i, (c, a)) in choices.iter().zip(&alone).enumerate() {
        assert_eq!(c["index"], i, "{list}");
        let a = &a["choices"][0];
        assert_eq!(c["text"], a["text"]);
        let lp = |c: &Value| {
            c["logprobs"]["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|t| t.as_object().unwrap().values())
                .chain(c["logprobs"]["token_logprobs"].as_array().unwrap())
                .map(|v| (v.as_f64().unwrap() as f32).to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(lp(c), lp(a), "prompt {i}: {c} vs {a}");
        assert_eq!(c["logprobs"]["tokens"], a["logprobs"]["tokens"]);
    }
    // The usage summed over the prompts.
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        let sum: u64 = alone.iter().map(|a| a["usage"][k].as_u64().unwrap()).sum();
        assert_eq!(list["usage"][k], sum, "{k}: {list}");
    }
    // A list of texts, with echo, alike.
    let texts = ok(s.post_json(
        "/v1/completions",
        &json!({"prompt": prompts, "max_tokens": 2, "temperature": 0, "echo": true}),
    ));
    for (i, c) in texts["choices"].as_array().unwrap().iter().enumerate() {
        let text = c["text"].as_str().unwrap();
        assert!(text.starts_with(prompts[i]), "{texts}");
    }
    // Bad lists: OpenAI's error shape, naming the field.
    let refused = |body: Value, param: &str, needle: &str| {
        let r = s.post_json("/v1/completions", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json()["error"].clone();
        assert_eq!(e["param"], param, "{e}");
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{e}");
    };
    refused(
        json!({"prompt": [[1, 2], []], "max_tokens": 1}),
        "prompt",
        "prompt 1 of the list is empty",
    );
    refused(
        json!({"prompt": [[1, 2], [-3]], "max_tokens": 1}),
        "prompt",
        "non-negative",
    );
    refused(
        json!({"prompt": [[1, 2], [3]], "max_tokens": 1, "stream": true}),
        "stream",
        "not streamed",
    );
    refused(
        json!({"prompt": [[1, 2], [3]], "max_tokens": 1, "n": 2}),
        "n",
        "n = 1",
    );
    let many: Vec<Vec<u32>> = (0..1025).map(|_| vec![1]).collect();
    refused(
        json!({"prompt": many, "max_tokens": 1}),
        "prompt",
        "at most 1024 prompts",
    );
    refused(
        json!({"prompt": [[1, 2], [99999999]], "max_tokens": 1}),
        "prompt",
        "",
    );
    // Nothing was generated for a refused list: a list of one is a prompt.
    let single = ok(s.post_json("/v1/completions", &ask(json!([ids[0].clone()]))));
    assert_eq!(single["choices"][0]["text"], alone[0]["choices"][0]["text"]);
}
