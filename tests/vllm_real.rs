//! The vLLM backend in front of a real vLLM: vLLM 0.32.0's CPU build serving
//! the fixture's float32 copy (`tests/common/vllm.rs`), on 127.0.0.1. The
//! contract the replay tests (`tests/vllm_contract.rs`) check against
//! recorded shapes, here against the server itself: the start-up probe and
//! the letters read by `logprob_token_ids`, the prefix cache's blocks (32
//! and the CPU default 128) in `state.cached` and the cached-token counts,
//! a decision's questions on one state as one list request (timed against
//! one completion per question),
//! images refused by a text-only model, errors as OpenAI errors, and the
//! model found from `/v1/models` alone; parity with the MLX backend on
//! the same prompts (two engines and two kernels: close, not bit for bit);
//! and tasks registered through it: a certified System One task with
//! prediction sets and its letter rotations, exported and imported again,
//! and an abstention task.
//!
//! The tests of this binary run one at a time ([`one_at_a_time`]): a real
//! vLLM takes about 5 GB and both cores while it starts.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::fleet;
use common::vllm::{self, RealVllm};
use common::Server;
use serde_json::{json, Value};

/// Holds the binary's tests to one at a time.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A gateway in front of `upstream`, building prompts with the fixture's
/// tokenizer and template.
fn gateway(upstream: &RealVllm, extra: &[&str]) -> Server {
    let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    gateway_with(upstream, &extra, &[])
}

/// [`gateway`] with extra environment variables.
fn gateway_with(upstream: &RealVllm, extra: &[String], env: &[(&'static str, String)]) -> Server {
    let url = upstream.url();
    let mut args = vec!["--backend", "vllm", "--upstream", url.as_str()];
    args.extend(extra.iter().map(String::as_str));
    if !extra.iter().any(|a| a == "--upstream-timeout") {
        args.extend(["--upstream-timeout", common::UPSTREAM_TIMEOUT]);
    }
    Server::start_env(&args, env)
}

fn ok(r: common::Response) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// A state of about `n` tokens of the fixture's tokenizer.
fn state_of(n: usize) -> String {
    let sentence = "The parcel left the depot on Monday and reached the customer on Friday. ";
    sentence.repeat(n / 15 + 1)
}

fn decide_body(state: &str) -> Value {
    json!({"state": state, "questions": [
        {"text": "When did the parcel arrive?", "options": ["Monday", "Friday", "Sunday"]}]})
}

fn assert_openai_error(r: &common::Response, status: u16, needle: &str) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json()["error"].clone();
    assert!(e["message"].is_string() && e["type"].is_string(), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains(needle),
        "{needle:?} not in {e}"
    );
    e
}

#[test]
fn the_probe_reads_letters_by_logprob_token_ids_and_the_cache_in_blocks_of_32() {
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    // The probe must find `logprob_token_ids` (the start fails otherwise).
    let gw = gateway(v, &["--letter-method", "token-ids", "--pad-block", "32"]);
    let state = state_of(300);
    let first = ok(gw.post_json("/v1/decide", &decide_body(&state)));
    let second = ok(gw.post_json("/v1/decide", &decide_body(&state)));
    // Padded to vLLM's block (`--pad-block 32`): the state's tokens are
    // whole blocks, so the second request reads them all from the cache.
    let tokens = first["state"]["tokens"].as_u64().unwrap();
    assert_eq!(tokens % 32, 0, "{first}");
    assert_eq!(first["state"]["cached"], false, "{first}");
    assert_eq!(second["state"]["cached"], true, "{second}");
    let cached = second["usage"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(cached % 32, 0, "{second}");
    assert!(
        cached >= tokens,
        "{cached} cached of a {tokens}-token state"
    );
    assert_eq!(first["answers"], second["answers"]);
    let p: f64 = first["answers"][0]["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((p - 1.0).abs() < 1e-5, "{first}");
}

#[test]
fn the_cpu_default_block_of_128_is_read_from_its_metrics() {
    let _one = one_at_a_time();
    let v = RealVllm::start(None);
    let metrics = common::http_get(v.port, "/metrics").unwrap().text();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("vllm:cache_config_info") && l.contains("block_size=\"128\"")),
        "no block size 128 on vLLM's /metrics"
    );
    // vLLM's own count: a repeated prompt's hits are whole blocks of 128,
    // at most the prompt less its last token.
    let prompt: Vec<u32> = (0..300).map(|i| 1000 + i).collect();
    let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 1});
    ok(common::post_json(v.port, "/v1/completions", &body));
    let again = ok(common::post_json(v.port, "/v1/completions", &body));
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"], 256,
        "{again}"
    );
    // A model outside the bases is not padded, whatever the upstream's
    // block: a state is found cached when vLLM's whole-block count reaches
    // the most it can report of it (318 tokens: 256).
    let gw = gateway(&v, &[]);
    let state = state_of(300);
    let first = ok(gw.post_json("/v1/decide", &decide_body(&state)));
    let tokens = first["state"]["tokens"].as_u64().unwrap();
    assert!(!tokens.is_multiple_of(128), "{first}");
    assert_eq!(first["state"]["cached"], false, "{first}");
    let other = json!({"state": state, "questions": [
        {"text": "Where did the parcel leave from?", "options": ["the depot", "a shop"]}]});
    let second = ok(gw.post_json("/v1/decide", &other));
    assert_eq!(second["state"]["cached"], true, "{second}");
    assert_eq!(second["state"]["tokens"], tokens, "{second}");
    // decisio counts a found state's tokens as cached, all of them.
    assert_eq!(second["usage"]["cached_tokens"], tokens, "{second}");
}

#[test]
fn bad_requests_get_openai_errors_and_a_text_model_refuses_images() {
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let gw = gateway(v, &[]);
    // An image to a text-only model: refused before anything is sent, naming
    // the model, as vLLM itself answers.
    let image = json!({"model": "smollm2", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    let r = gw.post_json("/v1/chat/completions", &image);
    assert_openai_error(&r, 400, "not a multimodal model");
    let direct = common::post_json(v.port, "/v1/chat/completions", &image);
    assert_openai_error(&direct, 400, "not a multimodal model");
    // More log-probabilities than vLLM allows (its default cap, 20).
    let r = gw.post_json(
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 1, "logprobs": 21}),
    );
    assert!(r.status == 400, "{}", r.text());
    // A prompt longer than the upstream's context (4096 tokens).
    let r = gw.post_json(
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": state_of(5000), "max_tokens": 1}),
    );
    assert_openai_error(&r, 400, "");
    // None of these ejected the upstream: it still answers.
    ok(gw.post_json("/v1/decide", &decide_body("A short state.")));
    let top = ok(gw.post_json(
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4,
                "temperature": 0, "logprobs": 2}),
    ));
    let lp = &top["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4, "{top}");
    assert!(
        lp["top_logprobs"][0].as_object().unwrap().len() >= 2,
        "{top}"
    );
    // Greedy text through the gateway is vLLM's own greedy text.
    let own = ok(common::post_json(
        v.port,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4,
                "temperature": 0}),
    ));
    assert_eq!(top["choices"][0]["text"], own["choices"][0]["text"]);
}

#[test]
fn a_gateway_given_only_its_upstream_loads_the_folder_vllm_serves() {
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let url = v.url();
    let gw = Server::spawn_with(0, None, &[], &["--backend", "vllm", "--upstream", &url]);
    gw.wait_ready(Duration::from_secs(120));
    let models = ok(gw.request("GET", "/v1/models", &[], None).unwrap());
    assert_eq!(
        models["data"][0]["root"],
        vllm::hf_model().display().to_string(),
        "{models}"
    );
    ok(gw.post_json("/v1/decide", &decide_body("A short state.")));
}

/// KL(p || q) of two distributions given as the same keys' values.
fn kl(p: &serde_json::Map<String, Value>, q: &serde_json::Map<String, Value>) -> f64 {
    p.iter()
        .map(|(k, pv)| {
            let (a, b) = (pv.as_f64().unwrap(), q[k].as_f64().unwrap());
            if a > 0.0 {
                a * (a / b.max(1e-300)).ln()
            } else {
                0.0
            }
        })
        .sum()
}

/// Two decisions' answers: the same letters, the probabilities within a KL
/// divergence of 1e-4 (`what` names the two).
fn assert_close(a: &Value, b: &Value, what: &str) {
    for (x, y) in a["answers"]
        .as_array()
        .unwrap()
        .iter()
        .zip(b["answers"].as_array().unwrap())
    {
        assert_eq!(x["letter"], y["letter"]);
        let d = kl(
            x["probabilities"].as_object().unwrap(),
            y["probabilities"].as_object().unwrap(),
        );
        assert!(d <= 1e-4, "KL {d} between {what}");
    }
}

#[test]
fn decisions_and_the_wire_agree_with_the_mlx_backend() {
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    // Unpadded on both, so both read the same prompts.
    let gw = gateway(v, &["--pad-policy", "none", "--over-limit-tokens", "512"]);
    let mlx = Server::start(&[]);
    let options: Vec<String> = (0..200).map(|i| format!("queue {i}")).collect();
    let decide = json!({"state": state_of(200), "questions": [
        {"text": "When did the parcel arrive?", "options": ["Monday", "Friday", "Sunday"]},
        {"text": "Which queue should take this parcel?", "options": options}]});
    let wire = json!({"state": state_of(100), "questions": {
        "late": {"type": "noul", "instructions": "Was the parcel late?"},
        "day": {"type": "choice", "instructions": "Which day did it arrive?",
                "criteria": {"Monday": null, "Friday": null, "Sunday": null}},
        "care": {"type": "score", "instructions": "How careful was the courier?",
                 "criteria": ["Careless", "Average", "Careful"]}}});
    let (a, b) = (
        ok(mlx.post_json("/v1/decide", &decide)),
        ok(gw.post_json("/v1/decide", &decide)),
    );
    assert_close(&a, &b, "MLX and a real vLLM");
    let (a, b) = (
        ok(mlx.post_json("/v1/systemone", &wire)),
        ok(gw.post_json("/v1/systemone", &wire)),
    );
    // Each type's answer by its own fields: a yes/no's probability, a
    // choice's key and probabilities, a score's value and probabilities.
    let near = |id: &str, field: &str, x: &Value, y: &Value| {
        let (p, q) = (x[field].as_f64(), y[field].as_f64());
        let (Some(p), Some(q)) = (p, q) else {
            panic!("{id}: {field} missing in {x} or {y}");
        };
        // A score is an expectation over levels 0 to 2.
        let tolerance = if field == "score" { 2e-3 } else { 1e-3 };
        assert!((p - q).abs() < tolerance, "{id}: {field} {p} and {q}");
    };
    let close = |id: &str, x: &Value, y: &Value| {
        let (p, q) = (
            x["probabilities"].as_object(),
            y["probabilities"].as_object(),
        );
        let (Some(p), Some(q)) = (p, q) else {
            panic!("{id}: probabilities missing in {x} or {y}");
        };
        assert_eq!(p.len(), q.len(), "{id}");
        let d = kl(p, q);
        assert!(d <= 1e-4, "{id}: KL {d}");
    };
    for (id, kind) in [("late", "noul"), ("day", "choice"), ("care", "score")] {
        let (x, y) = (&a["answers"][id], &b["answers"][id]);
        assert_eq!(
            (&x["type"], &y["type"]),
            (&json!(kind), &json!(kind)),
            "{id}"
        );
        match kind {
            "noul" => near(id, "noul", x, y),
            "choice" => {
                assert!(x["choice"].is_string(), "{id}: {x}");
                assert_eq!(x["choice"], y["choice"], "{id}");
                near(id, "confidence", x, y);
                close(id, x, y);
            }
            _ => {
                near(id, "score", x, y);
                near(id, "confidence", x, y);
                close(id, x, y);
            }
        }
    }
    // A state over the ceiling, cut on the real vLLM as the reference
    // decisio cuts it (`over_limit/served-512`, unpadded): the same report,
    // and the answers of the reference's kept text asked whole.
    let file = common::reference_file("over_limit/served-512/fixture.json");
    let entries: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    for entry in entries.iter().filter(|e| e.get("report").is_some()).take(3) {
        let mut body = entry["request"].clone();
        body["over_limit"] = json!("truncate");
        let cut = ok(gw.post_json("/v1/systemone", &body));
        for field in ["kept_tokens", "of_tokens", "limit"] {
            assert_eq!(cut["x_truncated"][field], entry["report"][field], "{cut}");
        }
        let whole = json!({"state": entry["state"], "questions": entry["request"]["questions"]});
        let whole = ok(gw.post_json("/v1/systemone", &whole));
        assert_eq!(cut["usage"], whole["usage"]);
        for (id, x) in cut["answers"].as_object().unwrap() {
            let y = &whole["answers"][id];
            assert_eq!(x["choice"], y["choice"], "{id}");
            for field in ["noul", "score", "confidence"] {
                if x.get(field).is_some() {
                    near(id, field, x, y);
                }
            }
        }
    }
}

#[test]
fn a_replica_killed_mid_run_loses_no_request_and_is_admitted_again() {
    let _one = one_at_a_time();
    let steady = vllm::shared(32);
    let port = vllm::free_port();
    let mut doomed = RealVllm::spawn(port, Some(32));
    doomed.wait_healthy(vllm::START_LIMIT);
    let gw = gateway(
        steady,
        &["--upstream", &doomed.url(), "--health-interval", "1"],
    );
    let doomed_label = format!("upstream=\"{}\"", doomed.url());
    // The gateway serves once one upstream passed its probe; the other
    // joins when its own passes.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while gw.metric("decisio_upstream_ejected", "") != 0.0 {
        assert!(std::time::Instant::now() < deadline, "both never admitted");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A client's bad requests eject nothing.
    let image = json!({"model": "smollm2", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    for _ in 0..3 {
        assert_eq!(gw.post_json("/v1/chat/completions", &image).status, 400);
        let long = json!({"model": "smollm2", "prompt": state_of(5000), "max_tokens": 1});
        assert_eq!(gw.post_json("/v1/completions", &long).status, 400);
        let ids: Vec<u32> = (0..200).collect();
        let many = json!({"model": "smollm2", "prompt": "Hi", "max_tokens": 1, "logprobs": 1,
                          "logprob_token_ids": ids});
        assert_eq!(gw.post_json("/v1/completions", &many).status, 400);
    }
    assert_eq!(gw.metric("decisio_upstream_ejected", ""), 0.0);

    // Decisions on many states (spread over both replicas by their hash),
    // from two clients; one replica is killed in the middle.
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    let per_client = 30;
    std::thread::scope(|scope| {
        for client in 0..2 {
            let (gw, sent, failed) = (&gw, &sent, &failed);
            scope.spawn(move || {
                for i in 0..per_client {
                    let body = decide_body(&format!("Parcel {client}-{i}: {}", state_of(40)));
                    let r = gw.post_json("/v1/decide", &body);
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if r.status != 200 {
                        failed.lock().unwrap().push(r.text());
                    }
                }
            });
        }
        while sent.load(std::sync::atomic::Ordering::SeqCst) < per_client / 2 {
            std::thread::sleep(Duration::from_millis(50));
        }
        doomed.kill();
    });
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "lost {} requests: {failed:?}",
        failed.len()
    );
    // The killed replica is ejected by its failed health checks...
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while gw.metric("decisio_upstream_ejected", &doomed_label) != 1.0 {
        assert!(std::time::Instant::now() < deadline, "never ejected");
        std::thread::sleep(Duration::from_millis(200));
    }
    // ...and admitted again once it serves on its port again.
    let back = RealVllm::spawn(port, Some(32));
    back.wait_healthy(vllm::START_LIMIT);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while gw.metric("decisio_upstream_ejected", &doomed_label) != 0.0 {
        assert!(std::time::Instant::now() < deadline, "never admitted again");
        std::thread::sleep(Duration::from_millis(200));
    }
    let served = gw.metric("decisio_upstream_requests_total", &doomed_label);
    for i in 0..20 {
        ok(gw.post_json(
            "/v1/decide",
            &decide_body(&format!("Again {i}: {}", state_of(40))),
        ));
    }
    assert!(
        gw.metric("decisio_upstream_requests_total", &doomed_label) > served,
        "the replica admitted again took no request"
    );
    eprintln!(
        "replicas: {} decisions sent, {} lost",
        2 * per_client,
        failed.len()
    );
}

#[test]
fn a_certified_task_with_sets_and_an_abstention_task_register_through_a_real_vllm() {
    // A System One task (certified, with prediction sets, read in its 3
    // rotations) and an abstention task, registered through a real vLLM
    // and through the MLX backend: the same split, letter prior and fit
    // within two engines' differences; the real vLLM's export imported
    // again answers alike.
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let gw = gateway(v, &["--pad-policy", "none"]);
    let mlx = Server::start(&[]);
    let day = json!({"type": "choice", "instructions": "Which day did it arrive?",
                     "criteria": {"Monday": null, "Friday": null, "Sunday": "no delivery day named"}});
    let cases = [
        ("The parcel arrived on Monday morning.", "Monday"),
        ("It came Monday, as promised.", "Monday"),
        ("Delivered on a Monday.", "Monday"),
        ("Monday was the day it reached me.", "Monday"),
        ("The parcel arrived on Friday evening.", "Friday"),
        ("It came Friday, a day late.", "Friday"),
        ("Delivered on a Friday.", "Friday"),
        ("Friday was the day it reached me.", "Friday"),
        ("I never got a delivery note.", "Sunday"),
        ("The courier was rude to me.", "Sunday"),
        ("My invoice has the wrong address.", "Sunday"),
        ("Please call me back.", "Sunday"),
    ];
    let register = |s: &Server| {
        let r = s.post_json(
            "/v1/tasks",
            &json!({
                "name": "day", "systemone": day,
                "examples": cases.iter().map(|(m, l)| json!({"state": m, "label": l})).collect::<Vec<_>>(),
                "x_certify": {"alpha": 0.6, "delta": 0.2}, "x_coverage": 0.75
            }),
        );
        assert_eq!(r.status, 202, "{}", r.text());
        let t = r.json();
        let id = t["id"].as_str().unwrap().to_string();
        let started = std::time::Instant::now();
        loop {
            let t = ok(s
                .request("GET", &format!("/v1/tasks/{id}"), &[], None)
                .unwrap());
            if t["status"] != "queued" && t["status"] != "running" {
                assert_eq!(t["status"], "ready", "{t}");
                return t;
            }
            assert!(started.elapsed() < Duration::from_secs(300), "{t}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let (a, b) = (register(&mlx), register(&gw));
    let (ra, rb) = (&a["result"], &b["result"]);
    assert_eq!(ra["holdout_indices"], rb["holdout_indices"]);
    assert_eq!(rb["debias"]["rotations"], 3, "{rb}");
    for (p, q) in ra["debias"]["prior"]
        .as_array()
        .unwrap()
        .iter()
        .zip(rb["debias"]["prior"].as_array().unwrap())
    {
        let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
        assert!((p - q).abs() < 1e-2, "priors {ra} vs {rb}");
    }
    assert_eq!(rb["certificate"]["stack"]["backend"], "vLLM", "{rb}");
    assert_eq!(rb["certificate"]["n"], ra["certificate"]["n"]);
    let asked = json!({"state": "It came on Friday.", "questions": {"day": day}});
    let answer = |s: &Server| ok(s.post_json("/v1/systemone", &asked))["answers"]["day"].clone();
    let y = answer(&gw);
    assert_eq!(y["x_task"], "day", "{y}");
    assert_eq!(y["x_certificate"], rb["certificate"]["id"], "{y}");
    // The set: the options whose LAC score (1 − p) passes the threshold
    // fitted on the held-out examples, recomputed from the answer.
    let set = y["x_prediction_set"].as_array().expect("a prediction set");
    let sets = &rb["prediction_sets"];
    assert_eq!(sets["score"], "lac", "{rb}");
    let threshold = sets["threshold"].as_f64().expect("a threshold");
    let probabilities = y["probabilities"].as_object().expect("probabilities");
    assert_eq!(probabilities.len(), 3, "{y}");
    for (option, p) in probabilities {
        let p = p.as_f64().unwrap();
        if (1.0 - p - threshold).abs() > 1e-6 {
            assert_eq!(
                set.contains(&json!(option)),
                1.0 - p < threshold,
                "{option}: {y}"
            );
        }
    }
    let export = ok(gw.request("GET", "/v1/tasks?full=1", &[], None).unwrap());
    let id = b["id"].as_str().unwrap();
    ok(gw
        .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
        .unwrap());
    ok(gw.post_json("/v1/tasks/import", &export));
    let again = answer(&gw);
    assert_eq!(again["choice"], y["choice"], "{again} vs {y}");
    let d = kl(
        again["probabilities"].as_object().unwrap(),
        y["probabilities"].as_object().unwrap(),
    );
    assert!(d <= 1e-6, "imported: KL {d}");
    // The abstention task: `Sunday` declared, its examples unanswerable.
    let abstention = json!({
        "id": "day-unsure", "option": {"key": "Sunday"},
        "examples": cases.iter().map(|(m, l)| json!({
            "request": {"state": m, "questions": {"day": day}},
            "answer": if *l == "Sunday" { Value::Null } else { json!(l) }
        })).collect::<Vec<_>>()
    });
    let (fa, fb) = (
        ok(mlx.post_json("/v1/abstention/tasks", &abstention)),
        ok(gw.post_json("/v1/abstention/tasks", &abstention)),
    );
    assert_eq!(fb["config"]["n_unanswerable"], 4, "{fb}");
    assert_eq!(
        fa["config"]["applied"], fb["config"]["applied"],
        "{fa} vs {fb}"
    );
    let z = answer(&gw);
    assert_eq!(z["x_abstention_task"], "day-unsure", "{z}");
    let on_mlx = answer(&mlx);
    assert!(z["x_abstained"].is_boolean(), "{z}");
    assert_eq!(z["x_abstained"], on_mlx["x_abstained"], "{z} vs {on_mlx}");
    // Registered again in the reference's form, certified on a separate
    // list: the fit sees the twelve cases, the list is the held-out side.
    let reference = |(m, l): &(&str, &str)| json!({"request": {"state": m, "questions": {"day": day}}, "answer": l});
    let listed = [
        ("It turned up on Monday.", "Monday"),
        ("Friday, finally, it was at my door.", "Friday"),
        ("Nobody told me when it would come.", "Sunday"),
    ];
    let t = ok(gw.post_json(
        "/v1/tasks",
        &json!({"id": "day", "examples": cases.iter().map(reference).collect::<Vec<_>>(),
                "certify": {"alpha": 0.6, "delta": 0.2,
                            "examples": listed.iter().map(reference).collect::<Vec<_>>()}}),
    ));
    let cert = &t["certificate"];
    assert_eq!(t["n_examples"], 12, "{t}");
    assert_eq!(cert["stack"]["backend"], "vLLM", "{cert}");
    assert_eq!(cert["split"]["method"], "supplied", "{cert}");
    assert_eq!(
        (&cert["split"]["fit_examples"], &cert["n"]),
        (&json!(12), &json!(3))
    );
    assert_eq!(
        t["x_task"]["result"]["holdout_indices"],
        json!([12, 13, 14]),
        "{t}"
    );
    assert_eq!(answer(&gw)["x_certificate"], cert["id"]);
}

/// The gateway's count of upstream requests answered.
fn upstream_requests(s: &Server) -> f64 {
    s.metric("decisio_upstream_requests_total", "outcome=\"ok\"")
}

#[test]
fn a_decision_s_questions_are_one_list_request_to_a_real_vllm() {
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    // No health checks: the count of upstream requests is the decisions'.
    let gw = gateway(v, &["--health-interval", "3600"]);
    let texts = [
        (
            "When did the parcel arrive?",
            ["Monday", "Friday", "Sunday"],
        ),
        ("When did the parcel leave?", ["Monday", "Friday", "Sunday"]),
        (
            "Where did the parcel leave from?",
            ["the depot", "a shop", "a van"],
        ),
        (
            "Who received the parcel?",
            ["the customer", "the courier", "nobody"],
        ),
        ("Was the parcel late?", ["yes", "no", "unknown"]),
    ];
    let questions: Vec<Value> = texts
        .iter()
        .cycle()
        .take(10)
        .enumerate()
        .map(|(i, (t, o))| json!({"text": format!("{t} ({i})"), "options": o}))
        .collect();
    let state = state_of(400);
    let warm = json!({"state": state, "questions": questions});
    let mut sequential = warm.clone();
    sequential["multi_question"] = json!("sequential");
    let timed = |body: &Value| {
        let (before, started) = (upstream_requests(&gw), std::time::Instant::now());
        let d = ok(gw.post_json("/v1/decide", body));
        let seconds = started.elapsed().as_secs_f64();
        (d, upstream_requests(&gw) - before, seconds)
    };
    // A new state: one list request, the state read (not found cached).
    let (first, requests, list_s) = timed(&warm);
    assert_eq!(requests, 1.0, "{first}");
    assert_eq!(first["state"]["cached"], false, "{first}");
    // Again: the state is found in vLLM's prefix cache.
    let (again, requests, again_s) = timed(&warm);
    assert_eq!(requests, 1.0, "{again}");
    assert_eq!(again["state"]["cached"], true, "{again}");
    // One completion per question, one after another: the same letters, the
    // same probabilities to a batch's float32 rounding.
    let (one_by_one, requests, sequential_s) = timed(&sequential);
    assert_eq!(requests, 10.0, "{one_by_one}");
    assert_close(&first, &one_by_one, "a list request and one by one");
    eprintln!(
        "10 questions through a real vLLM: one list request {list_s:.2} s on a new state, \
         {again_s:.2} s on a cached one; one completion after another {sequential_s:.2} s"
    );
}

/// The sum of the samples of the real vLLM's `/metrics` whose line starts
/// with `name` and contains `labels`.
fn upstream_metric(v: &RealVllm, name: &str, labels: &str) -> f64 {
    let text = common::http_get(v.port, "/metrics").unwrap().text();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_client_that_leaves_cancels_its_upstream_requests() {
    // A decision of 64 new questions on a new state of about 1,500 tokens,
    // whose client leaves once the gateway's calls are in flight: the gateway drops its job
    // (counted; the request 499), its calls end `cancelled`, and vLLM
    // aborts them: it goes idle (once its step in progress ends) having
    // finished fewer requests than the decision sends (a state-only
    // request, then one per question).
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let gw = gateway(v, &["--health-interval", "3600"]);
    let finished = || upstream_metric(v, "vllm:request_success_total", "");
    let busy = || {
        upstream_metric(v, "vllm:num_requests_running", "")
            + upstream_metric(v, "vllm:num_requests_waiting", "")
    };
    let before = finished();
    let questions: Vec<Value> = (0..64)
        .map(|i| {
            json!({"text": format!("When did parcel {i} arrive?"),
                        "options": ["Monday", "Friday", "Sunday"]})
        })
        .collect();
    let body = json!({"state": format!("Leaving. {}", state_of(1500)), "questions": questions});
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    gw.post_and_leave("/v1/decide", &body, || {
        while gw.metric("decisio_upstream_in_flight", "") == 0.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "vLLM never got the decision"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let left = std::time::Instant::now();
    while gw.metric("decisio_abandoned_jobs_total", "") != 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never stopped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let stopped = left.elapsed();
    while busy() != 0.0 {
        assert!(std::time::Instant::now() < deadline, "vLLM still runs them");
        std::thread::sleep(Duration::from_millis(50));
    }
    let idle = left.elapsed();
    let done = finished() - before;
    let cancelled = gw.metric("decisio_upstream_requests_total", "outcome=\"cancelled\"");
    eprintln!(
        "left: the job stopped after {stopped:?}, vLLM idle after {idle:?}; {cancelled} calls \
         cancelled; vLLM finished {done} of the decision's 65 requests"
    );
    assert_eq!(
        gw.metric("decisio_http_requests_total", "status=\"499\""),
        1.0
    );
    assert!(cancelled >= 1.0, "{cancelled} calls cancelled");
    assert_eq!(gw.metric("decisio_upstream_in_flight", ""), 0.0);
    assert!(
        done < 65.0,
        "vLLM finished {done} requests: none was aborted"
    );

    // A generation of 1,500 tokens whose client leaves half a second
    // after its call went to vLLM stops there at once, far from its end.
    let generated = || upstream_metric(v, "vllm:generation_tokens_total", "");
    let before = generated();
    let body = json!({"model": "smollm2", "prompt": "Tell me a long story.", "max_tokens": 1500,
                      "temperature": 0, "ignore_eos": true});
    gw.post_and_leave("/v1/completions", &body, || {
        while gw.metric("decisio_upstream_in_flight", "") == 0.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "vLLM never got the generation"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(500));
    });
    let left = std::time::Instant::now();
    while busy() != 0.0 {
        assert!(std::time::Instant::now() < deadline, "vLLM still generates");
        std::thread::sleep(Duration::from_millis(50));
    }
    let idle = left.elapsed();
    // Still idle a second later: aborted, not between two of its steps.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(busy(), 0.0, "vLLM generates again");
    let tokens = generated() - before;
    eprintln!("left a generation: vLLM idle after {idle:?}, {tokens} of 1,500 tokens generated");
    assert!(tokens < 1500.0, "the generation ran to its end");
    assert_eq!(gw.metric("decisio_abandoned_jobs_total", ""), 2.0);
    // The gateway serves on.
    ok(gw.post_json("/v1/decide", &decide_body("A short state.")));
}

#[test]
fn requests_that_time_out_by_their_own_size_eject_no_healthy_upstream() {
    // Two decisions too large for a 1-second timeout, each of 32 new
    // questions on its own new state of about 1,500 tokens: each client
    // gets 504, and the upstream, which answered its health checks
    // meanwhile, is neither charged nor ejected (two failures of distinct
    // requests would eject it, `--eject-after 2`); the next request still
    // goes to it.
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let gw = gateway(
        v,
        &[
            "--upstream-timeout",
            "1",
            "--health-interval",
            "0.2",
            "--eject-after",
            "2",
            "--upstream-retries",
            "0",
            // An ejection would last the test.
            "--readmit-after",
            "1000",
        ],
    );
    std::thread::scope(|scope| {
        let heavy: Vec<_> = (0..2)
            .map(|n| {
                let gw = &gw;
                scope.spawn(move || {
                    let questions: Vec<Value> = (0..32)
                        .map(|i| {
                            json!({"text": format!("When did parcel {i} arrive?"),
                                        "options": ["Monday", "Friday", "Sunday"]})
                        })
                        .collect();
                    let state = format!("Heavy {n}. {}", state_of(1500));
                    gw.post_json(
                        "/v1/decide",
                        &json!({"state": state, "questions": questions}),
                    )
                })
            })
            .collect();
        for r in heavy {
            let r = r.join().unwrap();
            assert_openai_error(&r, 504, "did not answer within 1 s");
        }
    });
    assert_eq!(gw.metric("decisio_upstream_ejected", ""), 0.0);
    assert!(gw.metric("decisio_upstream_requests_total", "outcome=\"timeout\"") >= 2.0);
    // The upstream is still routed to: the next request reaches it
    // (answered, or over the second as the heavy ones were, on a machine
    // running other tests), never refused for want of an admitted upstream
    // (503).
    let r = gw.post_json("/v1/decide", &decide_body("After."));
    assert!(matches!(r.status, 200 | 504), "{}", r.text());
    assert_eq!(gw.metric("decisio_upstream_ejected", ""), 0.0);
}

#[test]
fn a_small_request_is_answered_beside_a_heavy_one() {
    // A decision of 128 new questions of 26 options on a new state of
    // about 1,000 tokens sends far more than the fair budget; a decision
    // of one question sent once the first's calls are in flight is
    // answered while the first is still being read, within a fraction of
    // its time (`docs/limits.md`, "Waiting behind other clients (vLLM
    // backend)"). With every call sent at once (`--fair-seconds 0`) the
    // small one waits behind the large one's lists in vLLM's queue.
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let gw = gateway(v, &["--health-interval", "3600"]);
    let letters: Vec<String> = ('A'..='Z').map(|c| format!("Queue {c}")).collect();
    let questions: Vec<Value> = (0..128)
        .map(|i| json!({"text": format!("Which queue takes parcel {i}?"), "options": letters}))
        .collect();
    let heavy = json!({"state": format!("Heavy. {}", state_of(1000)), "questions": questions});
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    std::thread::scope(|scope| {
        let started = std::time::Instant::now();
        let (gw, heavy) = (&gw, &heavy);
        let large = scope.spawn(move || {
            // Minutes on a CPU upstream shared with other tests: longer
            // than a plain request waits.
            let r = ok(gw.post_json_waiting("/v1/decide", heavy, Duration::from_secs(600)));
            (r, started.elapsed())
        });
        while gw.metric("decisio_upstream_in_flight", "") == 0.0 {
            assert!(std::time::Instant::now() < deadline, "vLLM never got it");
            std::thread::sleep(Duration::from_millis(10));
        }
        let sent = std::time::Instant::now();
        let small = ok(gw.post_json("/v1/decide", &decide_body("Small. A short state.")));
        let small_s = sent.elapsed();
        assert_eq!(small["answers"].as_array().unwrap().len(), 1);
        let large_done = large.is_finished();
        let (large, large_s) = large.join().unwrap();
        assert_eq!(large["answers"].as_array().unwrap().len(), 128);
        eprintln!("beside a decision of 128 questions ({large_s:?}): one question in {small_s:?}");
        assert!(!large_done, "the large decision ended before the small one");
        assert!(
            small_s * 4 < large_s,
            "one question took {small_s:?} beside a decision of {large_s:?}"
        );
    });
}

#[test]
fn unsure_questions_think_through_a_real_vllm_as_the_reference_mixes_them() {
    // Every question unsure (factor 1.5): each is read again after the
    // real vLLM has written its reasoning, and each answer equals the mix
    // recomputed from that vLLM's own completions.
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let budget = common::think::BUDGET.to_string();
    let gw = gateway(
        v,
        &[
            "--pad-policy",
            "none",
            "--think-factor",
            "1.5",
            "--think-budget",
            &budget,
        ],
    );
    let entries = common::think::requests(3);
    // Asked again, within 1e-5: vLLM's float32 sums depend on what it
    // batches together (a question's reasoning beside the others').
    let thought = common::think::check_thinking(&gw, v.port, &entries, 1e-5);
    assert!(thought >= 6, "{thought} questions thought");
}

#[test]
fn vllm_backend_replicas_share_their_tasks_on_s3_and_in_a_folder() {
    // Three vLLM-backend gateways in front of the real vLLM, on each kind
    // of store: every check of `common::fleet::check` (the outage where
    // the store can be cut, a replica killed mid-registration on S3).
    let _one = one_at_a_time();
    let v = vllm::shared(32);
    let start = |args: &[String], env: &[(&'static str, String)]| gateway_with(v, args, env);
    let s3 = fleet::check(&fleet::Store::s3("vllm"), start, 6, true);
    eprintln!("s3: {s3:?}");
    let folder = fleet::check(&fleet::Store::folder(), start, 3, false);
    eprintln!("folder: {folder:?}");
}
