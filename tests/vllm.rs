//! The vLLM backend against real upstream processes: decisio gateways with
//! the MLX backend serve the vLLM subset the backend uses (token-id
//! completions, `logprobs`, `logprob_token_ids`, `echo`, `/v1/models`,
//! `/health`). Parity with the MLX backend over MMLU, each letter-reading
//! method, padding, multi-question modes, upstream faults and their error
//! shapes, and one of three upstreams killed and restarted mid-run.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{reference_decisions as reference, reference_questions as questions, Server};
use serde_json::{json, Value};

fn decide(s: &Server, body: &Value) -> Value {
    let r = s.post_json("/v1/decide", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// A gateway with the vLLM backend in front of `upstreams`.
fn gateway(upstreams: &[&Server], extra: &[&str]) -> Server {
    let mut args: Vec<String> = vec!["--backend".into(), "vllm".into()];
    for u in upstreams {
        args.push("--upstream".into());
        args.push(u.url());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    if !extra.contains(&"--upstream-timeout") {
        args.extend(["--upstream-timeout".into(), common::UPSTREAM_TIMEOUT.into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
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

/// The tolerance of the tests other than the parity test (padding, top-k
/// echoes, faults): those compare answers computed along different paths
/// (an upstream prompt computed whole, an echo's prompt log-probability),
/// which agree to float32 rounding; a prompt that differed by one token
/// would move probabilities by far more than this.
const PARITY_TOLERANCE: f64 = 2e-5;

/// Each probability and letter log-probability of an answer as f32 bits,
/// in letter order. Answers carry float32 values as JSON numbers written
/// from their exact f64 widening (the shortest digits that name that f64).
/// serde_json's default parser may land one f64 step away from it (it is
/// not correctly rounded without its `float_roundtrip` feature), but that
/// is far inside half a float32 step, so narrowing to f32 gives back the
/// float32 exactly.
fn answer_bits(a: &Value) -> Vec<u32> {
    ["probabilities", "letter_logprobs"]
        .iter()
        .flat_map(|k| a[*k].as_object().unwrap().values())
        .map(|v| (v.as_f64().unwrap() as f32).to_bits())
        .collect()
}

/// Questions of the parity test: `DECISIO_PARITY_QUESTIONS` (200 covers
/// every reference question), else 60 (6 states of 10 questions), so that
/// the default test run stays short.
fn parity_questions() -> usize {
    std::env::var("DECISIO_PARITY_QUESTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// Bit for bit: the MLX upstream keeps each state a decision or a
/// completion prefilled and continues later prompts from it, as vLLM's
/// prefix cache does, so the question's suffix runs on the same state
/// computed the same way as on the MLX backend directly. Half the states go
/// through the gateway first (the upstream keeps the state from the list
/// request's first prompt), half to the MLX gateway first.
#[test]
fn parity_with_the_mlx_backend_over_mmlu_questions() {
    let mlx = Server::start(&[]);
    // The upstream runs one question at a time; on a loaded machine the
    // last of ten fanned-out questions may wait longer than the default
    // 60 s scoring timeout.
    // No health checks: the gateway's count of upstream requests is then
    // the decisions' own.
    let vllm = gateway(
        &[&mlx],
        &[
            "--pad-policy",
            "none",
            "--upstream-timeout",
            "600",
            "--health-interval",
            "3600",
        ],
    );
    let reference = reference();
    let started = Instant::now();
    let want = parity_questions();
    let ok = |s: &Server| s.metric("decisio_upstream_requests_total", "outcome=\"ok\"");
    let before = ok(&vllm);
    let (mut count, mut worst, mut states) = (0, 0.0f64, 0.0);
    for (i, st) in reference["states"].as_array().unwrap().iter().enumerate() {
        if count >= want {
            break;
        }
        let body = json!({"state": st["state"], "questions": questions(st, 10)});
        states += 1.0;
        let (direct, through) = if i % 2 == 0 {
            let through = decide(&vllm, &body);
            (decide(&mlx, &body), through)
        } else {
            let direct = decide(&mlx, &body);
            (direct, decide(&vllm, &body))
        };
        assert_eq!(direct["state"]["tokens"], through["state"]["tokens"]);
        for (a, b) in direct["answers"]
            .as_array()
            .unwrap()
            .iter()
            .zip(through["answers"].as_array().unwrap())
        {
            worst = worst.max(compare(a, b));
            assert_eq!(
                answer_bits(a),
                answer_bits(b),
                "state {i}: {a} vs {b} (not bit for bit)"
            );
            count += 1;
        }
    }
    eprintln!(
        "parity: {count} questions bit for bit (largest difference {worst:.1e}), {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(count >= want.min(200), "only {count} questions");
    // Warm mode sent one list request per state (its 10 questions), all to
    // the one upstream.
    assert_eq!(
        ok(&vllm) - before,
        states,
        "upstream requests for {states} states"
    );
}

#[test]
fn block_padding_and_sequential_mode_give_the_same_answers_on_both_backends() {
    // --pad-block alone turns padding on, on either backend.
    let mlx = Server::start(&["--pad-policy", "block", "--pad-block", "16"]);
    let vllm = gateway(
        &[&mlx],
        &["--pad-block", "16", "--multi-question", "sequential"],
    );
    let unpadded = Server::start(&[]);
    let reference = reference();
    let st = &reference["states"][1];
    let body = json!({"state": st["state"], "questions": questions(st, 3)});
    let direct = decide(&mlx, &body);
    let through = decide(&vllm, &body);
    let plain = decide(&unpadded, &body);
    let padded_tokens = through["state"]["tokens"].as_u64().unwrap();
    assert_eq!(padded_tokens % 16, 0, "{through}");
    assert_eq!(direct["state"]["tokens"], through["state"]["tokens"]);
    let plain_tokens = plain["state"]["tokens"].as_u64().unwrap();
    assert!(padded_tokens >= plain_tokens && padded_tokens < plain_tokens + 16);
    for (a, b) in direct["answers"]
        .as_array()
        .unwrap()
        .iter()
        .zip(through["answers"].as_array().unwrap())
    {
        assert!(compare(a, b) <= PARITY_TOLERANCE);
    }
    // Each mode is served (packed has a test of its own).
    for mode in ["warm", "sequential"] {
        let mut b = body.clone();
        b["multi_question"] = json!(mode);
        let r = decide(&vllm, &b);
        for (a, b) in r["answers"]
            .as_array()
            .unwrap()
            .iter()
            .zip(through["answers"].as_array().unwrap())
        {
            assert!(compare(a, b) <= PARITY_TOLERANCE);
        }
    }
}

/// The packed prompt's token ids as the gateway builds them: the prefix
/// and the rest tokenized apart.
fn packed_prompt(st: &Value, n: usize) -> Vec<u32> {
    use decisio::prompt::{ChatTemplate, TextTokenizer};
    use decisio::text_route::decide::render_packed;
    use decisio::text_route::{Question, State};
    let dir = common::model_dir();
    let template = ChatTemplate::from_tokenizer_config(dir.join("tokenizer_config.json")).unwrap();
    let tokenizer = TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let state = State::Text(st["state"].as_str().unwrap().to_string());
    let qs: Vec<Question> = questions(st, n)
        .iter()
        .map(|q| Question {
            id: None,
            text: q["text"].as_str().unwrap().into(),
            options: q["options"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_str().unwrap().into())
                .collect(),
            abstain_below: None,
            temperature: None,
            head: None,
            wire: None,
            bias: None,
            listed: true,
        })
        .collect();
    let r = render_packed(&template, &state, &qs).unwrap();
    let mut ids = tokenizer.encode(&r.prefix, false).unwrap();
    ids.extend(tokenizer.encode(&r.suffix, false).unwrap());
    ids.extend(tokenizer.encode("1:", false).unwrap());
    ids
}

/// One token id of each text, from the upstream's tokenizer.
fn token_ids(s: &Server, text: &str) -> Vec<u32> {
    let r = s.post_json(
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Packed questions: one prompt, one generation of the answer sheet
/// `N: LETTER`, and each answer's letters read at its own position. Every
/// answer equals the letters' log-probabilities the MLX gateway gives a
/// completion of the prompt followed by the sheet up to that answer: bit
/// for bit at the prompt's last position and for fallbacks, to float32
/// rounding at later positions of the generation. One upstream completion
/// serves a request whose sheet keeps its format; a broken sheet costs one
/// teacher-forced completion per answer it could not place. The MLX
/// backend refuses packed.
#[test]
fn packed_questions_are_read_at_their_positions_of_one_generation() {
    let started = Instant::now();
    let mlx = Server::start(&[]);
    let vllm = gateway(
        &[&mlx],
        &["--pad-policy", "none", "--upstream-timeout", "600"],
    );
    let reference = reference();
    let completions =
        |s: &Server| s.metric("decisio_http_requests_total", "route=\"/v1/completions\"");
    let fallbacks = |s: &Server| s.metric("decisio_packed_answers_total", "read=\"fallback\"");
    let letters: Vec<u32> = ["A", "B", "C", "D"]
        .iter()
        .map(|l| token_ids(&mlx, &format!(" {l}"))[0])
        .collect();
    let separator = token_ids(&mlx, "\n");
    let (mut answers, mut fell_back, mut exact, mut worst) = (0, 0.0, 0, 0.0f64);
    // States 0 and 2 follow the sheet's format on the fixture; state 3
    // breaks it on its first line.
    for (i, n) in [(0usize, 4usize), (2, 2), (3, 3)] {
        let st = &reference["states"][i];
        let body = json!({"state": st["state"], "questions": questions(st, n),
                          "multi_question": "packed"});
        let (before, fell) = (completions(&mlx), fallbacks(&vllm));
        let r = decide(&vllm, &body);
        let fell = fallbacks(&vllm) - fell;
        // One generation, and one teacher-forced completion per answer
        // whose line broke the sheet's format.
        assert_eq!(completions(&mlx) - before, 1.0 + fell, "state {i}");
        if i != 3 {
            assert_eq!(fell, 0.0, "state {i}: the sheet broke its format");
        }
        fell_back += fell;
        let got = r["answers"].as_array().unwrap();
        assert_eq!(got.len(), n);
        // The sheet the gateway read, generated again directly with the
        // same bound.
        let prompt = packed_prompt(st, n);
        assert_eq!(r["usage"]["prompt_tokens"], json!(prompt.len()), "{r}");
        let lines: Vec<Vec<u32>> = (0..n)
            .map(|k| match k {
                0 => Vec::new(),
                _ => [separator.clone(), token_ids(&mlx, &format!("{}:", k + 1))].concat(),
            })
            .collect();
        let max_tokens = lines.iter().map(|l| l.len() + 1).sum::<usize>() + 1;
        let g = mlx.post_json(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "logprobs": 0, "return_tokens_as_token_ids": true}),
        );
        assert_eq!(g.status, 200, "{}", g.text());
        let sheet: Vec<u32> = g.json()["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap()["token_id:".len()..].parse().unwrap())
            .collect();
        let (mut cursor, mut kept, mut expected_fallbacks) = (Some(0usize), 0usize, 0.0);
        for (k, a) in got.iter().enumerate() {
            let options = a["probabilities"].as_object().unwrap().len();
            let line = &lines[k];
            let position = cursor
                .filter(|&c| sheet[c..].starts_with(line) && c + line.len() < sheet.len())
                .map(|c| c + line.len());
            // The prompt the answer's letters were read after.
            let mut forced = prompt.clone();
            match position {
                Some(p) => {
                    forced.extend_from_slice(&sheet[..p]);
                    if letters[..options].contains(&sheet[p]) {
                        (cursor, kept) = (Some(p + 1), p + 1);
                    } else {
                        cursor = None;
                    }
                }
                None => {
                    cursor = None;
                    expected_fallbacks += 1.0;
                    forced.extend_from_slice(&sheet[..kept]);
                    forced.extend_from_slice(line);
                }
            }
            let d = mlx.post_json(
                "/v1/completions",
                &json!({"prompt": forced, "max_tokens": 1, "temperature": 0,
                        "logprobs": 1, "logprob_token_ids": &letters[..options],
                        "return_tokens_as_token_ids": true}),
            );
            assert_eq!(d.status, 200, "{}", d.text());
            let top = d.json()["choices"][0]["logprobs"]["top_logprobs"][0].clone();
            let want: Vec<u32> = letters[..options]
                .iter()
                .map(|id| (top[format!("token_id:{id}")].as_f64().unwrap() as f32).to_bits())
                .collect();
            let have: Vec<u32> = a["letter_logprobs"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| (v.as_f64().unwrap() as f32).to_bits())
                .collect();
            if position.is_some_and(|p| p > 0) {
                // Read from the generation: the upstream ran the sheet's
                // tokens one at a time on its cache, the teacher-forced
                // prompt runs them as one prefill chunk (another summation
                // order), so they agree to float32 rounding.
                for (h, w) in have.iter().zip(&want) {
                    let d = f64::from(f32::from_bits(*h) - f32::from_bits(*w)).abs();
                    worst = worst.max(d);
                    assert!(d <= PARITY_TOLERANCE, "state {i} answer {k}: {d:e} {a}");
                }
            } else {
                // The prompt's own last position, or a teacher-forced
                // fallback (the same request): the same bits.
                assert_eq!(have, want, "state {i} answer {k}: {a}");
                exact += 1;
            }
            let total: f64 = a["probabilities"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_f64().unwrap())
                .sum();
            assert!((total - 1.0).abs() < 1e-5, "{a}");
            answers += 1;
        }
        assert_eq!(fell, expected_fallbacks, "state {i}");
    }
    assert!(fell_back > 0.0, "the broken sheet fell back");
    // The MLX backend refuses packed, naming the vLLM backend.
    let st = &reference["states"][0];
    let r = mlx.post_json(
        "/v1/decide",
        &json!({"state": st["state"], "questions": questions(st, 2), "multi_question": "packed"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "multi_question");
    assert!(r.text().contains("vLLM backend"), "{}", r.text());
    // A packed prompt letters its options A to Z alone.
    let many: Vec<String> = (0..27).map(|i| format!("option {i}")).collect();
    let r = vllm.post_json(
        "/v1/decide",
        &json!({"state": st["state"], "multi_question": "packed",
                "questions": [{"text": "Which?", "options": many}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "questions[0].options");
    eprintln!(
        "packed: {answers} answers ({fell_back} read by fallback), {exact} bit for bit, the \
         others within {worst:.1e}, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn letters_outside_the_top_k_are_read_by_echo() {
    // An upstream that returns at most 2 alternatives: for 4 options at
    // least 2 letters are outside its top k and need echoes.
    let mlx = Server::start(&["--max-logprobs", "2"]);
    let vllm = gateway(
        &[&mlx],
        &[
            "--pad-policy",
            "none",
            "--letter-method",
            "top-k",
            // No health checks among the calls counted.
            "--health-interval",
            "3600",
        ],
    );
    let reference = reference();
    let st = &reference["states"][2];
    let body = json!({"state": st["state"], "questions": questions(st, 1)});
    let direct = decide(&mlx, &body);
    let calls = || vllm.metric("decisio_upstream_requests_total", "outcome=\"ok\"");
    let before = calls();
    let through = decide(&vllm, &body);
    let d = compare(&direct["answers"][0], &through["answers"][0]);
    assert!(d <= PARITY_TOLERANCE, "difference {d}");
    // One top-k completion, and the letters outside it echoed in one list
    // request: two calls, however many letters are missing.
    assert_eq!(calls() - before, 2.0);
}

#[test]
fn generation_is_forwarded_as_token_id_completions() {
    let mlx = Server::start(&[]);
    let vllm = gateway(&[&mlx], &[]);
    for body in [
        json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 6,
               "temperature": 0, "logprobs": 2}),
        json!({"model": "smollm2", "prompt": "One, two, three,", "max_tokens": 4,
               "temperature": 0, "echo": true, "logprobs": 1}),
        // Seeds go upstream signed, as vLLM takes them: the same draw.
        json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 6,
               "temperature": 1, "seed": -2, "logprobs": 0}),
        json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 6,
               "temperature": 1, "seed": i64::MIN, "logprobs": 0}),
        // The fixture's next token is its end-of-sequence token: a generated
        // token, listed and counted, passed on as the upstream lists it.
        json!({"model": "smollm2", "max_tokens": 4, "temperature": 0, "logprobs": 1,
               "prompt": "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK."}),
    ] {
        let a = mlx.post_json("/v1/completions", &body);
        let b = vllm.post_json("/v1/completions", &body);
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(b.status, 200, "{}", b.text());
        let (a, b) = (a.json(), b.json());
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
        assert_eq!(
            a["choices"][0]["logprobs"]["tokens"],
            b["choices"][0]["logprobs"]["tokens"]
        );
        assert_eq!(a["usage"], b["usage"]);
    }
    let eos = vllm.post_json(
        "/v1/completions",
        &json!({"model": "smollm2", "max_tokens": 4,
        "temperature": 0, "logprobs": 1,
        "prompt": "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK."}),
    );
    let eos = eos.json();
    assert_eq!(
        eos["choices"][0]["logprobs"]["tokens"],
        json!(["<|im_end|>"])
    );
    assert_eq!(eos["choices"][0]["text"], "");
    assert_eq!(eos["usage"]["completion_tokens"], 1);
    let chat = json!({"model": "smollm2", "max_tokens": 5, "temperature": 0,
                      "messages": [{"role": "user", "content": "Say hello."}]});
    let a = mlx.post_json("/v1/chat/completions", &chat).json();
    let b = vllm.post_json("/v1/chat/completions", &chat).json();
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
}

fn assert_error(r: &common::Response, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json();
    assert!(e["error"]["message"].is_string(), "{e}");
    assert!(e["error"]["type"].is_string(), "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains(needle),
        "{e}"
    );
}

#[test]
fn upstream_faults_are_openai_errors() {
    let reference = reference();
    let st = &reference["states"][3];
    let body = json!({"state": st["state"], "questions": questions(st, 1)});

    // No upstream answers at start, and no wait: the gateway exits with the
    // reason (tests/vllm_wait.rs: the wait).
    let out = Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--backend", "vllm", "--model"])
        .arg(common::model_dir())
        .args([
            "--upstream",
            &format!("http://127.0.0.1:{}", common::CLOSED_PORT),
            "--port",
            "0",
            "--upstream-wait",
            "0",
        ])
        .arg("--state-dir")
        .arg(common::fresh_dir("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no upstream answered the start-up probe"),
        "{err}"
    );

    // The upstream refuses (more logprobs than its cap): the request's
    // fault, 400 with its text.
    let mut mlx = Server::start(&["--max-logprobs", "2"]);
    let vllm = gateway(
        &[&mlx],
        &["--upstream-retries", "1", "--health-interval", "0.2"],
    );
    let r = vllm.post_json(
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2, "logprobs": 5}),
    );
    assert_error(&r, 400, "`logprobs` must be between 0 and 2");
    assert_eq!(r.json()["error"]["code"], "upstream_refused");

    // Too short a deadline: 504.
    let slow = gateway(
        &[&mlx],
        &["--upstream-timeout", "0.001", "--upstream-retries", "0"],
    );
    let r = slow.post_json("/v1/decide", &body);
    assert_error(&r, 504, "did not answer within");
    assert_eq!(r.json()["error"]["code"], "upstream_timeout");

    // The only upstream dies: 503, at once and after its ejection.
    mlx.kill();
    let r = vllm.post_json("/v1/decide", &body);
    assert_error(&r, 503, "upstream");
    // The health checks (every 0.2 s) eject it; until then answers stay 503.
    let deadline = Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r = vllm.post_json("/v1/decide", &body);
        assert_eq!(r.status, 503, "{}", r.text());
        if r.text().contains("ejected") || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_error(&r, 503, "ejected");
    assert_eq!(
        vllm.metric("decisio_upstream_ejected", &format!("{}\"", mlx.url())),
        1.0
    );
    // Its /health says so, for a load balancer in front of the gateway.
    let r = vllm.request("GET", "/health", &[], None).unwrap();
    assert_error(&r, 503, "ejected");
    assert_eq!(r.json()["error"]["code"], "upstream_unavailable");
}

#[test]
fn killing_one_of_three_upstreams_mid_run_loses_no_request() {
    let a = Server::start(&[]);
    let mut b = Server::start(&[]);
    let c = Server::start(&[]);
    let vllm = gateway(
        &[&a, &b, &c],
        &[
            "--pad-policy",
            "none",
            "--health-interval",
            "0.2",
            "--upstream-retries",
            "2",
        ],
    );
    let reference = reference();
    // Expected answers, straight from one MLX upstream.
    let bodies: Vec<Value> = reference["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| json!({"state": st["state"], "questions": questions(st, 1)}))
        .collect();
    let expected: Vec<Value> = bodies.iter().map(|body| decide(&a, body)).collect();
    let b_url = b.url();
    let b_ok = |s: &Server| {
        s.metric(
            "decisio_upstream_requests_total",
            &format!("outcome=\"ok\",upstream=\"{b_url}\""),
        )
    };
    let (vllm, bodies, expected) = (&vllm, &bodies, &expected);
    let run = |label: &str| {
        let answers: Vec<Value> = std::thread::scope(|scope| {
            let handles: Vec<_> = bodies
                .chunks(5)
                .map(|chunk| {
                    scope.spawn(move || chunk.iter().map(|b| decide(vllm, b)).collect::<Vec<_>>())
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        for (e, g) in expected.iter().zip(&answers) {
            assert!(
                compare(&e["answers"][0], &g["answers"][0]) <= PARITY_TOLERANCE,
                "{label}"
            );
        }
        answers.len()
    };
    let mut answered = run("before");
    let before = b_ok(vllm);
    assert!(before > 0.0, "upstream b took no request before the fault");
    // Kill b while a round is in flight.
    let port = b.port;
    answered += std::thread::scope(|scope| {
        let before_round = b_ok(vllm);
        let h = scope.spawn(|| run("during"));
        // Once b has answered a request of this round, the round is using
        // it: kill it then, whatever the machine's speed.
        while b_ok(vllm) <= before_round && !h.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
        b.kill();
        h.join().unwrap()
    });
    answered += run("without b");
    // Restart b where it was; it is probed and admitted again.
    let b2 = Server::spawn_on(port, &[]);
    b2.wait_ready(Duration::from_secs(120));
    let deadline = Instant::now() + Duration::from_secs(30);
    while vllm.metric("decisio_upstream_ejected", &format!("{b_url}\"")) != 0.0 {
        assert!(Instant::now() < deadline, "b was never admitted again");
        std::thread::sleep(Duration::from_millis(100));
    }
    let after_restart = b_ok(vllm);
    answered += run("after restart");
    assert!(
        b_ok(vllm) > after_restart,
        "routing did not return to the restarted upstream"
    );
    // Every request answered once: the gateway counted exactly what was sent.
    let sent = 4 * bodies.len();
    assert_eq!(answered, sent);
    assert_eq!(
        vllm.metric("decisio_http_requests_total", "route=\"/v1/decide\"") as usize,
        sent
    );
}

/// The first `subjects` MMLU subjects, the first `registered` questions of
/// each labelled with their subject, and the next `unseen` questions of
/// each (never registered).
fn subject_questions(
    subjects: usize,
    registered: usize,
    unseen: usize,
) -> (Vec<String>, Vec<Value>, Vec<Value>) {
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    let mut names: Vec<String> = Vec::new();
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    let (mut fit, mut later) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let topic = r["topic"].as_str().unwrap().to_string();
        if !names.contains(&topic) {
            if names.len() == subjects {
                continue;
            }
            names.push(topic.clone());
        }
        let c = counts.entry(topic.clone()).or_default();
        let example = json!({"state": r["question"], "label": topic});
        if *c < registered {
            fit.push(example);
        } else if *c < registered + unseen {
            later.push(example);
        }
        *c += 1;
    }
    (names, fit, later)
}

/// Registers `body` and waits until it is ready; the task.
fn register_ready(s: &Server, body: &Value) -> Value {
    let r = s.post_json("/v1/tasks", body);
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let started = Instant::now();
    loop {
        let t = s
            .request("GET", &format!("/v1/tasks/{id}"), &[], None)
            .unwrap()
            .json();
        if t["status"] != "queued" && t["status"] != "running" {
            assert_eq!(t["status"], "ready", "{t}");
            return t;
        }
        assert!(started.elapsed() < Duration::from_secs(600), "{t}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An intent answer's probabilities and calibrated log-probabilities as
/// f32 bits, in label order (narrowing gives back the float32 exactly, as
/// in [`answer_bits`]).
fn head_bits(a: &Value) -> Vec<u32> {
    ["probabilities", "calibrated_logprobs"]
        .iter()
        .filter_map(|k| a[*k].as_object())
        .flat_map(|m| m.values())
        .map(|v| (v.as_f64().unwrap() as f32).to_bits())
        .collect()
}

/// The second-engine head: a gateway with the vLLM backend whose hidden
/// states come from a head upstream (a decisio MLX gateway's
/// /v1/embeddings) registers the same intent task as the MLX backend
/// directly, with the same report, and answers held-out and unseen
/// questions with the same probabilities, bit for bit. Then: the refusals
/// without a head upstream or with a block tap, the embeddings passed
/// through, and the head upstream's death as a 503 that leaves choice
/// questions served.
#[test]
fn intent_heads_through_a_head_upstream_match_the_mlx_backend_bit_for_bit() {
    let started = Instant::now();
    let mlx = Server::start(&[]);
    let mut head = Server::start(&[]);
    let vllm = gateway(
        &[&mlx],
        &[
            "--pad-policy",
            "none",
            "--upstream-timeout",
            "600",
            "--head-upstream",
            &head.url(),
        ],
    );
    let plain = gateway(&[&mlx], &["--pad-policy", "none"]);
    let (subjects, fit, unseen) = subject_questions(4, 8, 2);
    let body = json!({
        "name": "subject", "kind": "intent", "question": "Which subject is this question from?",
        "labels": subjects, "examples": fit, "holdout": 0.3, "seed": 7
    });

    // Without a head upstream: refused, saying what to pass.
    let r = plain.post_json("/v1/tasks", &body);
    assert_error(&r, 400, "--head-upstream");
    assert_eq!(r.json()["error"]["param"], "kind");
    assert_error(
        &plain.post_json("/v1/embeddings", &json!({"input": [1, 2]})),
        400,
        "--head-upstream",
    );
    // A head upstream serves the final norm's output only.
    let mut tapped = body.clone();
    tapped["head"] = json!({"layer": 3});
    let r = vllm.post_json("/v1/tasks", &tapped);
    assert_error(&r, 400, "final norm");
    assert_eq!(r.json()["error"]["param"], "head.layer");

    let direct = register_ready(&mlx, &body);
    let through = register_ready(&vllm, &body);
    let (a, b) = (&direct["result"], &through["result"]);
    for key in [
        "temperature",
        "fit_examples",
        "holdout_examples",
        "holdout_indices",
        "before",
        "after",
        "abstention",
    ] {
        assert_eq!(a[key], b[key], "report field {key}");
    }
    assert_eq!(a["head"]["dim"], 576);
    assert_eq!(a["head"]["cross_validation"], b["head"]["cross_validation"]);
    let registered = started.elapsed().as_secs_f64();

    // Held-out and never-registered questions, bit for bit; half asked
    // through the gateway first.
    let held: Vec<Value> = a["holdout_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| fit[i.as_u64().unwrap() as usize].clone())
        .chain(unseen.iter().cloned())
        .collect();
    for (i, e) in held.iter().enumerate() {
        let q = json!({"state": e["state"], "questions": [{"task": "subject"}]});
        let (x, y) = if i % 2 == 0 {
            let y = decide(&vllm, &q);
            (decide(&mlx, &q), y)
        } else {
            let x = decide(&mlx, &q);
            (x, decide(&vllm, &q))
        };
        let (x, y) = (&x["answers"][0], &y["answers"][0]);
        assert_eq!(x["label"], y["label"], "{x} vs {y}");
        assert_eq!(x["probabilities"].as_object().unwrap().len(), 4);
        assert_eq!(head_bits(x), head_bits(y), "question {i}: {x} vs {y}");
    }
    eprintln!(
        "second-engine head: {} examples registered on both in {registered:.1} s, {} \
         questions bit for bit, {:.1} s in all",
        fit.len(),
        held.len(),
        started.elapsed().as_secs_f64()
    );

    // Embeddings through the gateway are the head upstream's.
    let e = json!({"input": [[1, 2, 3], [4, 5]], "encoding_format": "base64"});
    let r = vllm.post_json("/v1/embeddings", &e);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["data"],
        head.post_json("/v1/embeddings", &e).json()["data"]
    );
    assert!(
        vllm.metric(
            "decisio_upstream_requests_total",
            &format!("outcome=\"ok\",upstream=\"{}\"", head.url())
        ) >= (2 * fit.len()) as f64
    );

    // The head upstream dies: intent questions get 503, choice questions
    // are still served.
    head.kill();
    let q = json!({"state": held[0]["state"], "questions": [{"task": "subject"}]});
    let r = vllm.post_json("/v1/decide", &q);
    assert_error(&r, 503, "upstream");
    assert_eq!(r.json()["error"]["code"], "upstream_unavailable");
    let reference = reference();
    let st = &reference["states"][0];
    decide(
        &vllm,
        &json!({"state": st["state"], "questions": questions(st, 1)}),
    );

    // A head upstream that does not answer at start, and no wait: the
    // gateway exits.
    let out = Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--backend", "vllm", "--model"])
        .arg(common::model_dir())
        .args(["--upstream", &mlx.url(), "--head-upstream", &head.url()])
        .args(["--port", "0", "--upstream-wait", "0"])
        .arg("--state-dir")
        .arg(common::fresh_dir("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the head upstream failed its probe"), "{err}");
}

/// A task registered from a System One question, on the MLX backend and on
/// the vLLM backend in front of it: the same fitted temperature, and the
/// wire question of its identity answered alike with the task applied.
#[test]
fn a_systemone_task_is_fitted_and_applied_alike_on_both_backends() {
    let mlx = Server::start(&[]);
    let vllm = gateway(&[&mlx], &["--pad-policy", "none"]);
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    let rows: Vec<Value> = text
        .lines()
        .step_by(41)
        .take(16)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let state = common::mmlu_lettered;
    let question = json!({"type": "choice", "instructions": "Which answer is correct?",
                          "criteria": {"A": null, "B": null, "C": null, "D": null}});
    let examples: Vec<Value> = rows
        .iter()
        .map(|r| json!({"state": state(r), "label": r["correct_answer"]}))
        .collect();
    let body = json!({"name": "exam", "systemone": question, "examples": examples,
                      "holdout": 0.25, "seed": 2, "x_coverage": 0.75,
                      "x_certify": {"alpha": 0.6, "delta": 0.2}});
    let (a, b) = (register_ready(&mlx, &body), register_ready(&vllm, &body));
    let (ta, tb) = (
        a["result"]["temperature"].as_f64().unwrap(),
        b["result"]["temperature"].as_f64().unwrap(),
    );
    assert!((ta - tb).abs() < 1e-4 * ta, "{ta} vs {tb}");
    // The prediction sets' thresholds, fitted on the 4 held-out examples.
    let thresholds = [&a, &b].map(|t| {
        let sets = &t["result"]["prediction_sets"];
        assert_eq!(sets["calibration_examples"], 4, "{t}");
        sets["threshold"].as_f64().unwrap()
    });
    assert!(
        (thresholds[0] - thresholds[1]).abs() < 1e-4,
        "{thresholds:?}"
    );
    // The certificates: made on the same held-out side with the same
    // counts, each naming its own backend.
    let certs = [&a, &b].map(|t| t["result"]["certificate"].clone());
    for (c, backend) in certs.iter().zip(["MLX", "vLLM"]) {
        assert_eq!(c["n"], 4, "{c}");
        assert_eq!(c["stack"]["backend"], backend, "{c}");
    }
    assert_eq!(
        certs[0]["certified_n"], certs[1]["certified_n"],
        "{certs:?}"
    );
    assert_eq!(certs[0]["split"], certs[1]["split"], "{certs:?}");
    // An export of one backend's tasks is refused by the other's server.
    let export = mlx
        .request("GET", "/v1/tasks?full=1", &[], None)
        .unwrap()
        .json();
    let r = vllm.post_json("/v1/tasks/import", &export);
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("backend"), "{}", r.text());
    for r in &rows[..4] {
        let ask = json!({"state": state(r), "questions": {"q": question}});
        let (x, y) = (
            mlx.post_json("/v1/systemone", &ask).json(),
            vllm.post_json("/v1/systemone", &ask).json(),
        );
        let (x, y) = (&x["answers"]["q"], &y["answers"]["q"]);
        assert_eq!(
            (&x["x_task"], &y["x_task"]),
            (&json!("exam"), &json!("exam"))
        );
        assert_eq!(x["choice"], y["choice"], "{x} vs {y}");
        assert_eq!(x["x_certificate"], certs[0]["id"], "{x}");
        assert_eq!(y["x_certificate"], certs[1]["id"], "{y}");
        for k in ["A", "B", "C", "D"] {
            let (p, q) = (
                x["probabilities"][k].as_f64().unwrap(),
                y["probabilities"][k].as_f64().unwrap(),
            );
            assert!((p - q).abs() < 1e-5, "{x} vs {y}");
        }
        // The same set on both, unless an option sits at the threshold.
        let near = ["A", "B", "C", "D"].iter().any(|k| {
            let score = 1.0 - x["probabilities"][k].as_f64().unwrap();
            (score - thresholds[0]).abs() < 1e-4
        });
        assert!(x["x_prediction_set"].is_array(), "{x}");
        if !near {
            assert_eq!(x["x_prediction_set"], y["x_prediction_set"], "{x} vs {y}");
        }
    }
}
