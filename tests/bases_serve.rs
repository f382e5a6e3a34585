//! Each base served end to end on a tiny conversion of its structure
//! (`scripts/reference/tiny_models.py`) with its family's chat template
//! (`scripts/reference/tiny_tokenizers.py`): the decision route answers the
//! same bits on a prefix-cache miss, a hit and with the cache off, with the
//! base's own settings; Gemma 4 31B refuses `warm` and warns on states over
//! the length it is documented for. Each base also runs a suite of text
//! and chat questions (`decisio suite run`) on two fresh servers: its
//! `/v1/models` card names the base, every sampled question asked again
//! through `POST /v1/decide` or the chat completions gives the recorded
//! bits, and the two records gate bit for bit (`decisio gate --bitwise`).
//!
//! The route-feature matrix: for each base, one server on its tiny
//! conversion with the base's settings answers every route feature: a
//! choice decision (an option letter; probabilities over the options that
//! sum to 1, the softmax of the letters' log-probabilities), a chat
//! completion rendered with the base's chat template (its usage counts the
//! template's tokens), a completion with `logprobs` (per generated token
//! its text, log-probability, alternatives and offset; greedy picks the
//! most likely), embeddings (one per input, of the model's hidden size,
//! finite) and an intent task of 3 labels registered, polled until ready
//! and asked (one of the labels; probabilities over the labels that sum to
//! 1; a head as wide as the hidden state). No base refuses any of them.
//!
//! The System One matrix: for each base, its tiny conversion served on MLX
//! and through the vLLM backend in front of that server answers one
//! request of every question type (yes/no, a choice of 3 and one of 255
//! options, a score) on an object state with the same answers on both
//! backends; every one of the 255 letter codes is one token of the tiny
//! tokenizer, as of the family's own, and `/v1/decide` takes 255 options
//! too.

mod common;

use std::path::PathBuf;

use common::Server;
use serde_json::{json, Value};

fn tiny(name: &str) -> PathBuf {
    let base = std::env::var_os("DECISIO_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference"));
    let dir = base.join("tiny").join(name);
    assert!(
        dir.exists(),
        "{} is missing; run `make reference`",
        dir.display()
    );
    dir
}

fn serve(base: &str, model: &str, tokenizer: &str, extra: &[&str]) -> Server {
    serve_dir(base, &tiny(model), tokenizer, extra)
}

fn serve_dir(base: &str, model: &std::path::Path, tokenizer: &str, extra: &[&str]) -> Server {
    let tokenizer = tiny(tokenizer);
    let mut args = vec!["--base", base, "--tokenizer", tokenizer.to_str().unwrap()];
    args.extend_from_slice(extra);
    let s = Server::spawn_model(0, model.as_os_str(), &[], &args);
    s.wait_ready(std::time::Duration::from_secs(120));
    s
}

/// MMLU states and questions (scripts/reference/decisions.py).
fn states(n: usize) -> Vec<(Value, Vec<Value>)> {
    let text = std::fs::read_to_string(common::reference_file("decisions.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["states"]
        .as_array()
        .unwrap()
        .iter()
        .take(n)
        .map(|st| {
            let qs = st["questions"]
                .as_array()
                .unwrap()
                .iter()
                .take(4)
                .map(|q| json!({"text": q["text"], "options": q["options"]}))
                .collect();
            (st["state"].clone(), qs)
        })
        .collect()
}

fn decide(s: &Server, body: &Value) -> Value {
    let r = s.post_json("/v1/decide", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn bits(answer: &Value) -> Vec<u32> {
    answer["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| (v.as_f64().unwrap() as f32).to_bits())
        .collect()
}

/// A miss (half the questions), a hit (all of them) and the cache off give
/// the same bits for every question; so do, with the cache off, each
/// question asked alone, the questions in reverse order, and passes of a
/// few rows (`--pass-tokens 32`): a question's bits do not depend on what
/// else its pass reads.
fn prefix_cache_is_bit_for_bit(base: &str, model: &str, tokenizer: &str) {
    let cached = serve(base, model, tokenizer, &[]);
    let off = serve(base, model, tokenizer, &["--prefix-cache-mb", "0"]);
    let narrow = serve(
        base,
        model,
        tokenizer,
        &["--prefix-cache-mb", "0", "--pass-tokens", "32"],
    );
    let models = cached
        .request("GET", "/v1/models", &[], None)
        .unwrap()
        .json();
    println!("{base} on {model}: {}", models["data"][0]);
    let mut n = 0;
    for (state, qs) in states(3) {
        let half = qs.len() / 2;
        let miss = decide(&cached, &json!({"state": state, "questions": qs[..half]}));
        let body = json!({"state": state, "questions": qs});
        let hit = decide(&cached, &body);
        let cold = decide(&off, &body);
        assert_eq!(miss["state"]["cached"], false);
        assert_eq!(hit["state"]["cached"], true);
        assert!(hit["state"]["tokens"].as_u64().unwrap() > 100);
        let reversed: Vec<Value> = qs.iter().rev().cloned().collect();
        let back = decide(&off, &json!({"state": state, "questions": reversed}));
        let small = decide(&narrow, &body);
        for (i, q) in qs.iter().enumerate() {
            let alone = decide(&off, &json!({"state": state, "questions": [q]}));
            let want = bits(&cold["answers"][i]);
            assert_eq!(bits(&alone["answers"][0]), want, "{base}: {i} alone");
            let back = &back["answers"][qs.len() - 1 - i];
            assert_eq!(bits(back), want, "{base}: {i} reversed");
            assert_eq!(
                bits(&small["answers"][i]),
                want,
                "{base}: {i} in small passes"
            );
        }
        for i in 0..qs.len() {
            assert_eq!(
                bits(&hit["answers"][i]),
                bits(&cold["answers"][i]),
                "{base}: hit and cache off differ"
            );
            if i < half {
                assert_eq!(
                    bits(&miss["answers"][i]),
                    bits(&cold["answers"][i]),
                    "{base}: miss and cache off differ"
                );
            }
            n += 1;
        }
    }
    println!(
        "{base} on {model}: {n} answers equal bit for bit on a miss, a hit and with the cache off"
    );
}

#[test]
fn qwen3_6_35b_a3b_serves_decisions_from_its_prefix_cache() {
    prefix_cache_is_bit_for_bit("qwen3.6-35b-a3b", "qwen3_5_moe-6bit", "tokenizer-qwen3");
}

#[test]
fn gemma_4_12b_serves_decisions_from_its_prefix_cache() {
    prefix_cache_is_bit_for_bit("gemma-4-12b", "gemma4_12b-6bit", "tokenizer-gemma3");
}

#[test]
fn gemma_4_31b_serves_decisions_from_its_prefix_cache() {
    prefix_cache_is_bit_for_bit("gemma-4-31b", "gemma4_31b-6bit", "tokenizer-gemma3");
}

/// A suite of 8 text questions on two states and 4 chat questions on one
/// chat (suites/data/), 4 of each asked again.
fn text_and_chat_suite(dir: &std::path::Path) -> PathBuf {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("suites/data");
    let path = dir.join("suite.yaml");
    std::fs::write(
        &path,
        format!(
            "version: 1\nname: bases\nseed: 3\nconformance: 4\nchoice_sets:\n\
             \x20 - name: everyday\n    format: jsonl\n    file: {0}/everyday.jsonl\n    limit: 8\n\
             \x20 - name: chat\n    format: jsonl\n    file: {0}/everyday-chat.jsonl\n    limit: 4\n",
            data.display()
        ),
    )
    .unwrap();
    path
}

/// The suite on two fresh servers of the base: the card names the base,
/// both surfaces conform, the records are bit for bit the same.
fn suite_gates_bit_for_bit(base: &str, model: &str, tokenizer: &str) {
    let dir = common::fresh_dir(&format!("suite-{base}"));
    let suite = text_and_chat_suite(&dir);
    let decisio = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let out = format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), out)
    };
    for run in ["a", "b"] {
        let s = serve(base, model, tokenizer, &[]);
        let out = dir.join(run);
        let (ok, text) = decisio(&[
            "suite",
            "run",
            "--server",
            &s.url(),
            "--suite",
            suite.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{base}: {text}");
    }
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("a/record.json")).unwrap()).unwrap();
    let server = &record["server"];
    assert_eq!(server["base"], base, "{server}");
    assert_eq!(server["backend"], "MLX", "{server}");
    assert!(
        server["model_identity"].as_str().unwrap().len() == 64
            && server["tokenizer_identity"].as_str().unwrap().len() == 64,
        "{server}"
    );
    let conformance = record["conformance"].as_array().unwrap();
    for surface in ["decide", "chat"] {
        let of: Vec<&Value> = conformance
            .iter()
            .filter(|c| c["surface"] == surface)
            .collect();
        assert_eq!(of.len(), 4, "{base}: {surface}");
        assert!(
            of.iter().all(|c| c["equal"] == true),
            "{base}: {surface} does not conform: {of:?}"
        );
    }
    // The chat questions' SDK check is the e2e tests' (the OpenAI SDK on
    // the fixture); here the two records are compared.
    let gates = dir.join("gates.yaml");
    std::fs::write(&gates, "openai_sdk: false\n").unwrap();
    let (a, b) = (dir.join("a"), dir.join("b"));
    let (ok, text) = decisio(&[
        "gate",
        "--record",
        b.to_str().unwrap(),
        "--against",
        a.to_str().unwrap(),
        "--bitwise",
        "--gates",
        gates.to_str().unwrap(),
    ]);
    assert!(ok, "{base}: {text}");
    assert!(text.contains("pass  bit for bit"), "{text}");
    println!("{base} on {model}: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qwen3_6_35b_a3b_answers_a_suite_bit_for_bit_on_fresh_servers() {
    suite_gates_bit_for_bit("qwen3.6-35b-a3b", "qwen3_5_moe-6bit", "tokenizer-qwen3");
}

#[test]
fn gemma_4_12b_answers_a_suite_bit_for_bit_on_fresh_servers() {
    suite_gates_bit_for_bit("gemma-4-12b", "gemma4_12b-6bit", "tokenizer-gemma3");
}

#[test]
fn gemma_4_31b_answers_a_suite_bit_for_bit_on_fresh_servers() {
    suite_gates_bit_for_bit("gemma-4-31b", "gemma4_31b-6bit", "tokenizer-gemma3");
}

/// A copy of a tiny conversion whose config allows `positions` positions
/// (the tiny configs allow 4,096; the weights do not depend on it).
fn with_positions(model: &str, positions: u64) -> PathBuf {
    let from = tiny(model);
    let dir = common::fresh_dir(&format!("{model}-{positions}"));
    for entry in std::fs::read_dir(&from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(from.join("config.json")).unwrap()).unwrap();
    config["text_config"]["max_position_embeddings"] = positions.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// Gemma 4 31B answers several questions one after another (`warm` is
/// refused with a 400 that says so), and a state over 16,383 tokens runs
/// with a warning in the response.
#[test]
fn gemma_4_31b_refuses_warm_and_warns_on_long_states() {
    let model = with_positions("gemma4_31b-6bit", 32_768);
    let s = serve_dir("gemma-4-31b", &model, "tokenizer-gemma3", &[]);
    let (state, qs) = states(1).remove(0);
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": qs, "multi_question": "warm"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let err = r.json();
    assert!(
        err["error"]["message"].as_str().unwrap().contains("warm"),
        "{err}"
    );
    let short = decide(&s, &json!({"state": state, "questions": qs[..1]}));
    assert!(
        short["state"].get("warning").is_none_or(Value::is_null),
        "{}",
        short["state"]
    );
    // One byte a token with this tokenizer: 17,000 bytes of text.
    let long = "The committee met again and read the minutes. ".repeat(370);
    let r = decide(&s, &json!({"state": long, "questions": qs[..1]}));
    let tokens = r["state"]["tokens"].as_u64().unwrap();
    assert!(tokens > 16_383, "{tokens} tokens");
    let warning = r["state"]["warning"]
        .as_str()
        .expect("a warning for a long state");
    assert!(
        warning.contains("16383") || warning.contains("16,383"),
        "{warning}"
    );
    println!("{tokens} tokens: {warning}");
}

/// The hidden size of a tiny conversion (`text_config.hidden_size`, or the
/// top level's).
fn hidden_size(model: &str) -> u64 {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny(model).join("config.json")).unwrap())
            .unwrap();
    config
        .get("text_config")
        .unwrap_or(&config)
        .get("hidden_size")
        .and_then(Value::as_u64)
        .expect("config.json names the hidden size")
}

fn finite(v: &Value) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"));
    assert!(x.is_finite(), "{x}");
    x
}

/// The token count of a prompt or of chat messages, as `/tokenize` counts it.
fn token_count(s: &Server, body: &Value) -> u64 {
    let r = s.post_json("/tokenize", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json();
    let n = t["count"].as_u64().unwrap();
    assert_eq!(n as usize, t["tokens"].as_array().unwrap().len());
    n
}

/// The answer is the top option of a 2-to-26-option question: its letter,
/// index and option agree, the probabilities are the softmax of the
/// letters' log-probabilities at the answer's temperature and sum to 1.
fn check_choice(base: &str, answer: &Value, options: &[&str]) {
    let letters: Vec<String> = (0..options.len())
        .map(|i| char::from(b'A' + i as u8).to_string())
        .collect();
    let p = answer["probabilities"].as_object().unwrap();
    let lp = answer["letter_logprobs"].as_object().unwrap();
    assert_eq!(
        p.keys().collect::<Vec<_>>(),
        letters.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        lp.keys().collect::<Vec<_>>(),
        letters.iter().collect::<Vec<_>>()
    );
    let probs: Vec<f64> = letters.iter().map(|l| finite(&p[l])).collect();
    let sum: f64 = probs.iter().sum();
    assert!(
        (sum - 1.0).abs() < 1e-4,
        "{base}: probabilities sum to {sum}"
    );
    assert!(probs.iter().all(|&x| (0.0..=1.0).contains(&x)), "{answer}");
    let t = finite(&answer["temperature"]);
    let z: Vec<f64> = letters.iter().map(|l| finite(&lp[l]) / t).collect();
    assert!(z.iter().all(|&x| x <= 0.0), "{answer}");
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|x| (x - m).exp()).collect();
    let total: f64 = e.iter().sum();
    for (i, (q, x)) in probs.iter().zip(&e).enumerate() {
        assert!(
            (q - x / total).abs() < 1e-4,
            "{base}: option {i}: {q} is not the softmax of the letters' log-probabilities ({})",
            x / total
        );
    }
    assert_eq!(answer["abstained"], false, "{answer}");
    let letter = answer["letter"].as_str().expect("a letter");
    let i = letters
        .iter()
        .position(|l| l == letter)
        .unwrap_or_else(|| panic!("{base}: {letter} is none of the option letters"));
    assert_eq!(answer["index"], i, "{answer}");
    assert_eq!(answer["option"], options[i], "{answer}");
    let top = probs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(
        probs[i], top,
        "{base}: {letter} is not the top option: {answer}"
    );
}

/// Polls a task until it leaves `queued` and `running`; fails when it
/// stops moving (neither its status nor its progress changes) for a
/// minute.
fn task_settled(s: &Server, id: &str) -> Value {
    let stall = std::time::Duration::from_secs(60);
    let mut moved = std::time::Instant::now();
    let mut last = (Value::Null, Value::Null);
    loop {
        let r = s
            .request("GET", &format!("/v1/tasks/{id}"), &[], None)
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let t = r.json();
        if t["status"] != "queued" && t["status"] != "running" {
            return t;
        }
        let now = (t["status"].clone(), t["progress"]["done"].clone());
        if now != last {
            last = now;
            moved = std::time::Instant::now();
        }
        assert!(
            moved.elapsed() < stall,
            "the task did not move for {stall:?}: {t}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// One server of the base on its tiny conversion, with the base's settings,
/// through every route feature: a choice decision, a chat completion with
/// the base's chat template, a completion with log-probabilities,
/// embeddings of the model's width, and an intent task registered and
/// asked (last: its registration is the longest step).
fn route_features(base: &str, model: &str, tokenizer: &str) {
    let started = std::time::Instant::now();
    let s = serve(base, model, tokenizer, &[]);
    let card = s.request("GET", "/v1/models", &[], None).unwrap().json();
    let card = &card["data"][0];
    assert_eq!(card["decisio"]["base"], base, "{card}");
    let name = card["id"].as_str().unwrap().to_string();
    let hidden = hidden_size(model);

    // 1. A choice decision: two questions on one state.
    let questions: [(&str, &[&str]); 2] = [
        ("How many cats does Ada keep?", &["one", "two", "three"]),
        ("What is the dog called?", &["Tom", "Rex"]),
    ];
    let d = decide(
        &s,
        &json!({
            "model": name,
            "state": "Ada keeps three cats and one dog. The dog is called Rex.",
            "questions": questions
                .iter()
                .map(|(text, options)| json!({"text": text, "options": options}))
                .collect::<Vec<_>>()
        }),
    );
    assert_eq!(d["object"], "decision", "{d}");
    assert_eq!(d["model"], name.as_str());
    let answers = d["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 2, "{d}");
    for (answer, (_, options)) in answers.iter().zip(&questions) {
        check_choice(base, answer, options);
    }
    let state_tokens = d["state"]["tokens"].as_u64().unwrap();
    let u = &d["usage"];
    assert!(
        state_tokens > 0 && u["prompt_tokens"].as_u64().unwrap() > state_tokens,
        "{d}"
    );
    assert_eq!(u["completion_tokens"], 0);
    assert_eq!(u["total_tokens"], u["prompt_tokens"]);

    // 2. A chat completion of a few tokens, its prompt the base's chat
    // template's rendering of the messages.
    let messages = json!([
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What colour is the sky?"}
    ]);
    let prompt = token_count(&s, &json!({"messages": messages}));
    let ids = s
        .post_json("/tokenize", &json!({"messages": messages}))
        .json()["tokens"]
        .clone();
    let rendered = s.post_json("/detokenize", &json!({"tokens": ids})).json()["prompt"]
        .as_str()
        .unwrap()
        .to_string();
    let generation_prompt = if tokenizer.contains("qwen") {
        "<|im_start|>assistant\n"
    } else {
        "<start_of_turn>model\n"
    };
    assert!(
        rendered.contains("What colour is the sky?") && rendered.contains(generation_prompt),
        "{base}: not its chat template: {rendered:?}"
    );
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"model": name, "messages": messages, "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{base}: {}", r.text());
    let c = r.json();
    assert_eq!(c["object"], "chat.completion", "{c}");
    assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-"), "{c}");
    assert_eq!(c["model"], name.as_str());
    let choices = c["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 1, "{c}");
    let choice = &choices[0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string(), "{c}");
    let u = &c["usage"];
    assert_eq!(u["prompt_tokens"], prompt, "{base}: {c}");
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!((1..=4).contains(&completion), "{c}");
    assert_eq!(u["total_tokens"], prompt + completion);
    match choice["finish_reason"].as_str() {
        Some("length") => assert_eq!(completion, 4, "{c}"),
        Some("stop") => {}
        other => panic!("{base}: finish_reason {other:?}"),
    }

    // 3. A completion of 4 tokens with the 3 most likely alternatives at
    // each, greedy: each token is its position's most likely one.
    let text = "The capital of France is";
    let prompt = token_count(&s, &json!({"prompt": text}));
    let r = s.post_json(
        "/v1/completions",
        &json!({"model": name, "prompt": text, "max_tokens": 4, "temperature": 0,
                "logprobs": 3, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{base}: {}", r.text());
    let c = r.json();
    assert_eq!(c["object"], "text_completion", "{c}");
    let choice = &c["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{c}");
    let u = &c["usage"];
    assert_eq!(u["prompt_tokens"], prompt, "{c}");
    assert_eq!(u["completion_tokens"], 4, "{c}");
    assert_eq!(u["total_tokens"], prompt + 4);
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    let token_logprobs = lp["token_logprobs"].as_array().unwrap();
    let top = lp["top_logprobs"].as_array().unwrap();
    let offsets = lp["text_offset"].as_array().unwrap();
    for list in [token_logprobs, top, offsets] {
        assert_eq!(list.len(), 4, "{base}: {lp}");
    }
    assert_eq!(tokens.len(), 4, "{base}: {lp}");
    let text_len = choice["text"].as_str().unwrap().len() as u64;
    let mut at = 0;
    for i in 0..4 {
        assert!(tokens[i].is_string(), "{lp}");
        let chosen = finite(&token_logprobs[i]);
        assert!(chosen <= 0.0, "{lp}");
        let alternatives = top[i].as_object().unwrap();
        assert!((1..=3).contains(&alternatives.len()), "{base}: {lp}");
        let best = alternatives
            .values()
            .map(finite)
            .inspect(|&x| assert!(x <= 0.0, "{lp}"))
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(
            (chosen - best).abs() < 1e-5,
            "{base}: token {i} ({chosen}) is not the most likely ({best}): {lp}"
        );
        let offset = offsets[i].as_u64().unwrap();
        assert!(offset >= at && offset <= text_len, "{base}: {lp}");
        at = offset;
    }
    assert_eq!(offsets[0], 0, "{lp}");

    // 4. Embeddings: one hidden state per input, of the model's width.
    let inputs = [
        "The dog is called Rex.",
        "Which planet is closest to the sun?",
    ];
    let prompt: u64 = inputs
        .iter()
        .map(|t| token_count(&s, &json!({"prompt": t})))
        .sum();
    let r = s.post_json("/v1/embeddings", &json!({"model": name, "input": inputs}));
    assert_eq!(r.status, 200, "{base}: {}", r.text());
    let e = r.json();
    assert_eq!(e["object"], "list", "{e}");
    assert_eq!(e["model"], name.as_str());
    assert_eq!(e["usage"]["prompt_tokens"], prompt, "{e}");
    assert_eq!(e["usage"]["total_tokens"], prompt, "{e}");
    let data = e["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let vectors: Vec<Vec<f64>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(finite)
                .collect()
        })
        .collect();
    for v in &vectors {
        assert_eq!(v.len() as u64, hidden, "{base}: not the hidden size");
        assert!(v.iter().any(|&x| x != 0.0), "{base}: a zero vector");
    }
    assert_ne!(vectors[0], vectors[1], "{base}: two inputs, one vector");

    // 5. An intent task: 3 labels, 3 examples each (one held out, one for
    // the head, one for its temperature), asked on a new state.
    let labels = ["card_arrival", "exchange_rate", "lost_or_stolen_card"];
    let examples = [
        ("My card still hasn't arrived.", 0),
        ("How long does a new card take to come?", 0),
        ("I ordered a card last month; where is it?", 0),
        ("Which rate do you use to convert euros?", 1),
        ("Is the exchange rate today any good?", 1),
        ("What rate will I get for dollars?", 1),
        ("Someone stole my wallet with my card in it.", 2),
        ("I lost my card on the train.", 2),
        ("Please block my card, it is missing.", 2),
    ];
    let r = s.post_json(
        "/v1/tasks",
        &json!({
            "name": "banking", "kind": "intent",
            "question": "What does the customer want?",
            "labels": labels,
            "examples": examples
                .iter()
                .map(|(state, l)| json!({"state": state, "label": labels[*l]}))
                .collect::<Vec<_>>(),
            "holdout": 0.34, "seed": 0, "x_coverage": 0.75
        }),
    );
    assert_eq!(
        r.status,
        202,
        "{base}: the intent task was not registered: {}",
        r.text()
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    let t = task_settled(&s, &id);
    assert_eq!(t["status"], "ready", "{base}: {t}");
    assert_eq!(t["labels"], json!(labels));
    let result = &t["result"];
    assert_eq!(result["fit_examples"], 6, "{result}");
    assert_eq!(result["holdout_examples"], 3, "{result}");
    assert_eq!(
        result["head"]["dim"], hidden,
        "{base}: the head reads the hidden state"
    );
    assert!(finite(&result["temperature"]) > 0.0, "{result}");
    let accuracy = finite(&result["after"]["accuracy"]);
    assert!((0.0..=1.0).contains(&accuracy), "{result}");
    let d = decide(
        &s,
        &json!({"state": "My new card has not come in the post.",
                "questions": [{"task": "banking"}]}),
    );
    let a = &d["answers"][0];
    assert!(a["letter"].is_null(), "{a}");
    assert!(a["letter_logprobs"].as_object().unwrap().is_empty(), "{a}");
    let p = a["probabilities"].as_object().unwrap();
    assert_eq!(
        p.keys().collect::<Vec<_>>(),
        labels.iter().collect::<Vec<_>>()
    );
    let probs: Vec<f64> = labels.iter().map(|l| finite(&p[*l])).collect();
    let sum: f64 = probs.iter().sum();
    assert!(
        (sum - 1.0).abs() < 1e-4,
        "{base}: label probabilities sum to {sum}"
    );
    assert_eq!(a["abstained"], false, "{a}");
    let label = a["label"].as_str().expect("a label");
    let i = labels
        .iter()
        .position(|l| *l == label)
        .unwrap_or_else(|| panic!("{base}: {label} is none of the labels"));
    assert_eq!(a["option"], label);
    assert_eq!(a["index"], i);
    assert_eq!(
        probs[i],
        probs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    );
    // Its prediction set: the labels whose LAC score (1 − p) passes the
    // threshold fitted on the 3 held-out examples (enough for 0.75).
    let sets = &result["prediction_sets"];
    assert_eq!(sets["calibration_examples"], 3, "{base}: {result}");
    let threshold = finite(&sets["threshold"]);
    let set = a["x_prediction_set"]
        .as_array()
        .unwrap_or_else(|| panic!("{base}: {a}"));
    for (label, p) in labels.iter().zip(&probs) {
        if (1.0 - p - threshold).abs() > 1e-6 {
            assert_eq!(
                set.contains(&json!(label)),
                1.0 - p < threshold,
                "{base}: {a}"
            );
        }
    }

    // 6. A certified choice task (decisio's own form): its certificate on
    // the hash split's held-out side, the verdict on an answer, and its
    // export imported again after a delete, answering the same bits.
    let r = s.post_json(
        "/v1/tasks",
        &json!({
            "name": "banking-cert", "question": "What does the customer want?",
            "options": labels,
            "examples": examples
                .iter()
                .map(|(state, l)| json!({"state": state, "label": labels[*l]}))
                .collect::<Vec<_>>(),
            "x_certify": {"alpha": 0.6, "delta": 0.2}
        }),
    );
    assert_eq!(r.status, 202, "{base}: {}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let t = task_settled(&s, &id);
    assert_eq!(t["status"], "ready", "{base}: {t}");
    let cert = &t["result"]["certificate"];
    assert_eq!(cert["n"], t["result"]["holdout_examples"], "{base}: {cert}");
    assert_eq!(cert["split"]["method"], "holdout", "{base}: {cert}");
    assert_eq!(t["x_certificate_status"]["state"], "ok", "{base}: {t}");
    let ask = json!({"state": "My new card has not come in the post.",
                     "questions": [{"task": "banking-cert"}]});
    let a = decide(&s, &ask)["answers"][0].clone();
    assert_eq!(a["x_certificate"], cert["id"], "{base}: {a}");
    let top = a["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(finite)
        .fold(f64::NEG_INFINITY, f64::max);
    let certified = cert["threshold"].as_f64().is_some_and(|t| top >= t);
    assert_eq!(a["x_certified"], certified, "{base}: {a} {cert}");
    let export = s
        .request("GET", "/v1/tasks?full=1", &[], None)
        .unwrap()
        .json();
    for task in export["tasks"].as_array().unwrap() {
        let id = task["record"]["id"].as_str().unwrap();
        let r = s
            .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
            .unwrap();
        assert_eq!(r.status, 200, "{base}: {}", r.text());
    }
    let r = s.post_json("/v1/tasks/import", &export);
    assert_eq!(r.status, 200, "{base}: {}", r.text());
    assert_eq!(decide(&s, &ask)["answers"][0], a, "{base}: imported");

    println!(
        "{base} on {model}: decision {}, intent `{label}`, chat and completion of 4 tokens, \
         embeddings of {hidden} in {:.1} s",
        answers
            .iter()
            .map(|a| a["letter"].as_str().unwrap())
            .collect::<Vec<_>>()
            .join(","),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn qwen3_6_35b_a3b_serves_every_route_feature() {
    route_features("qwen3.6-35b-a3b", "qwen3_5_moe-6bit", "tokenizer-qwen3");
}

#[test]
fn gemma_4_12b_serves_every_route_feature() {
    route_features("gemma-4-12b", "gemma4_12b-6bit", "tokenizer-gemma3");
}

#[test]
fn gemma_4_31b_serves_every_route_feature() {
    route_features("gemma-4-31b", "gemma4_31b-6bit", "tokenizer-gemma3");
}

/// One System One request on the base's tiny conversion, on MLX and through
/// the vLLM backend in front of it: every type answered, keyed as sent, and
/// the same on both backends (within 1e-5: the gateway's softmax of the
/// upstream's log-probabilities as sent over JSON).
fn systemone_matrix(base: &str, model: &str, tokenizer: &str) {
    // A short reasoning budget and a ceiling a state can pass (neither
    // touches a request that does not think or cut).
    let limits = ["--think-budget", "16", "--over-limit-tokens", "4096"];
    let mlx = serve(base, model, tokenizer, &limits);
    let url = mlx.url();
    let mut args = common::gateway_args(&url);
    args.extend(limits);
    let vllm = serve(base, model, tokenizer, &args);
    // The base's padding, applied alike by both backends: the Qwen base's
    // states front-padded with newlines to its 1,056-token block (the
    // reference decisio's), the Gemma bases' not padded.
    let short = json!({"state": "Ada's parcel never came.",
                       "questions": [{"text": "Does Ada want a refund?", "options": ["yes", "no"]}]});
    let tokens = |s: &Server| decide(s, &short)["state"]["tokens"].as_u64().unwrap();
    let (padded, sent) = (tokens(&mlx), tokens(&vllm));
    assert_eq!(padded, sent, "{base}");
    if base.starts_with("qwen") {
        assert_eq!(padded, 1056, "{base}");
    } else {
        assert!(padded < 100, "{base}: {padded} tokens");
    }
    // Short keys: a tiny tokenizer spends a token per byte of text.
    let many: serde_json::Map<String, Value> =
        (0..255).map(|i| (format!("s{i}"), Value::Null)).collect();
    let body = json!({
        "state": {"customer": "Ada", "message": "My parcel never came and I want a refund.", "_id": 7},
        "questions": {
            "refund": {"type": "noul", "instructions": "Does Ada want a refund?",
                       "criteria": {"true": "she asks for money back"}},
            "team": {"type": "choice", "instructions": "Which team handles this?",
                     "criteria": {"billing": "payments and refunds", "shipping": null, "legal": null}},
            "shelf": {"type": "choice", "instructions": "Which shelf held the parcel?",
                      "criteria": many},
            "anger": {"type": "score", "instructions": "How angry is Ada?",
                      "criteria": ["calm", "annoyed", "angry", "furious", "livid"]},
        }
    });
    let every_type = body.clone();
    let ask = |s: &Server| {
        let r = s.post_json("/v1/systemone", &body);
        assert_eq!(r.status, 200, "{base}: {}", r.text());
        r.json()
    };
    let (a, b) = (ask(&mlx), ask(&vllm));
    assert_eq!(a["usage"], b["usage"], "{base}");
    for id in ["refund", "team", "shelf", "anger"] {
        let (x, y) = (&a["answers"][id], &b["answers"][id]);
        assert_eq!(x["type"], body["questions"][id]["type"], "{base} {id}: {x}");
        if id == "refund" {
            let (p, q) = (finite(&x["noul"]), finite(&y["noul"]));
            assert!((p - q).abs() < 1e-5, "{base} {id}: {x} vs {y}");
            continue;
        }
        let (p, q) = (
            x["probabilities"].as_object().unwrap(),
            y["probabilities"].as_object().unwrap(),
        );
        let keys: Vec<String> = match body["questions"][id]["criteria"].as_object() {
            Some(c) => c.keys().cloned().collect(),
            None => (0..5).map(|i| i.to_string()).collect(),
        };
        assert_eq!(p.keys().cloned().collect::<Vec<_>>(), keys, "{base} {id}");
        let total: f64 = p.values().map(finite).sum();
        assert!((total - 1.0).abs() < 1e-6, "{base} {id}: {total}");
        for k in &keys {
            assert!(
                (finite(&p[k]) - finite(&q[k])).abs() < 1e-5,
                "{base} {id} {k}: {x} vs {y}"
            );
        }
        let top = p.values().map(finite).fold(f64::NEG_INFINITY, f64::max);
        if let Some(choice) = x["choice"].as_str() {
            assert_eq!(finite(&p[choice]), top, "{base} {id}: {x}");
            assert_eq!(x["choice"], y["choice"], "{base} {id}");
        }
    }
    // The three orders of the team question, averaged alike on both.
    let orders = json!({"state": body["state"], "x_orders": 3,
                        "questions": {"team": body["questions"]["team"]}});
    let read = |s: &Server| {
        let r = s.post_json("/v1/systemone", &orders);
        assert_eq!(r.status, 200, "{base}: {}", r.text());
        r.json()["answers"]["team"].clone()
    };
    let (x, y) = (read(&mlx), read(&vllm));
    assert_eq!(
        (&x["x_orders"], &y["x_orders"]),
        (&json!(3), &json!(3)),
        "{base}"
    );
    for (k, p) in x["probabilities"].as_object().unwrap() {
        assert!(
            (finite(p) - finite(&y["probabilities"][k])).abs() < 1e-5,
            "{base} orders {k}: {x} vs {y}"
        );
    }
    // /v1/decide takes the same 255 options, lettered up to the 255th code.
    let options: Vec<String> = (0..255).map(|i| format!("s{i}")).collect();
    let asked = json!({"state": body["state"]["message"], "questions": [
        {"text": "Which shelf held the parcel?", "options": options}]});
    let (x, y) = (decide(&mlx, &asked), decide(&vllm, &asked));
    let (x, y) = (&x["answers"][0], &y["answers"][0]);
    assert_eq!(x["probabilities"].as_object().unwrap().len(), 255, "{base}");
    assert_eq!(x["letter"], y["letter"], "{base}");
    for (k, v) in x["probabilities"].as_object().unwrap() {
        assert!(
            (finite(v) - finite(&y["probabilities"][k])).abs() < 1e-5,
            "{base} {k}"
        );
    }
    // A System One task on both backends (the route matrix): the team
    // question registered with its examples in decisio's form, certified
    // and with prediction sets, each example read in its 3 rotations; the
    // same hash split, letter prior and figures on both; the verdict and
    // set on an answer; the vLLM-backend server's export imported again
    // after a delete, answering the same bits.
    let team = &body["questions"]["team"];
    let cases = [
        ("I was charged twice for one order.", "billing"),
        ("Please give me my money back.", "billing"),
        ("My card payment failed at checkout.", "billing"),
        ("The courier left my box at the wrong house.", "shipping"),
        ("Where is my parcel? It is a week late.", "shipping"),
        ("The delivery van never came.", "shipping"),
        ("I will see you in court over this.", "legal"),
        ("Your terms of service break the law.", "legal"),
        ("My lawyer will write to you.", "legal"),
    ];
    let register = |s: &Server| {
        let r = s.post_json(
            "/v1/tasks",
            &json!({
                "name": "team", "systemone": team,
                "examples": cases.iter().map(|(m, l)| json!({"state": {"message": m}, "label": l}))
                    .collect::<Vec<_>>(),
                "x_certify": {"alpha": 0.6, "delta": 0.2}, "x_coverage": 0.75
            }),
        );
        assert_eq!(r.status, 202, "{base}: {}", r.text());
        let t = task_settled(s, r.json()["id"].as_str().unwrap());
        assert_eq!(t["status"], "ready", "{base}: {t}");
        assert_eq!(t["x_rotations"], 3, "{base}: {t}");
        t
    };
    let (ta, tb) = (register(&mlx), register(&vllm));
    let (ra, rb) = (&ta["result"], &tb["result"]);
    assert_eq!(ra["holdout_indices"], rb["holdout_indices"], "{base}");
    assert_eq!(ra["debias"]["rotations"], 3, "{base}: {ra}");
    for (p, q) in ra["debias"]["prior"]
        .as_array()
        .unwrap_or_else(|| panic!("{base}: {ra}"))
        .iter()
        .zip(rb["debias"]["prior"].as_array().unwrap())
    {
        assert!(
            (finite(p) - finite(q)).abs() < 1e-4,
            "{base}: priors {ra} vs {rb}"
        );
    }
    for (r, backend) in [(ra, "MLX"), (rb, "vLLM")] {
        assert_eq!(r["certificate"]["stack"]["backend"], backend, "{base}: {r}");
        assert_eq!(
            r["prediction_sets"]["calibration_examples"],
            r["holdout_examples"]
        );
    }
    let asked = json!({"state": {"message": "My refund never arrived."},
                       "questions": {"team": team}});
    let answer = |s: &Server| {
        let r = s.post_json("/v1/systemone", &asked);
        assert_eq!(r.status, 200, "{base}: {}", r.text());
        r.json()["answers"]["team"].clone()
    };
    let (x, y) = (answer(&mlx), answer(&vllm));
    for (a, t) in [(&x, &ta), (&y, &tb)] {
        assert_eq!(a["x_task"], "team", "{base}: {a}");
        assert_eq!(
            a["x_certificate"], t["result"]["certificate"]["id"],
            "{base}: {a}"
        );
        assert!(a["x_certified"].is_boolean(), "{base}: {a}");
        assert!(a["x_prediction_set"].is_array(), "{base}: {a}");
    }
    let export = vllm
        .request("GET", "/v1/tasks?full=1", &[], None)
        .unwrap()
        .json();
    let r = vllm
        .request(
            "DELETE",
            &format!("/v1/tasks/{}", tb["id"].as_str().unwrap()),
            &[],
            None,
        )
        .unwrap();
    assert_eq!(r.status, 200, "{base}: {}", r.text());
    let r = vllm.post_json("/v1/tasks/import", &export);
    assert_eq!(r.status, 200, "{base}: {}", r.text());
    assert_eq!(
        answer(&vllm),
        y,
        "{base}: imported through the vLLM backend"
    );
    // An abstention task on the same question (the `legal` key declared,
    // its examples unanswerable): fitted alike on both backends, and
    // deciding their answers.
    let abstention = json!({
        "id": "team-unsure", "option": {"key": "legal"},
        "examples": cases.iter().map(|(m, l)| json!({
            "request": {"state": {"message": m}, "questions": {"team": team}},
            "answer": if *l == "legal" { Value::Null } else { json!(l) }
        })).collect::<Vec<_>>()
    });
    let fit = |s: &Server| {
        let r = s.post_json("/v1/abstention/tasks", &abstention);
        assert_eq!(r.status, 200, "{base}: {}", r.text());
        r.json()["config"].clone()
    };
    let (fa, fb) = (fit(&mlx), fit(&vllm));
    assert_eq!(fa["n_unanswerable"], 3, "{base}: {fa}");
    assert_eq!(
        (&fa["applied"], &fa["reason"]),
        (&fb["applied"], &fb["reason"]),
        "{base}: {fa} vs {fb}"
    );
    for s in [&mlx, &vllm] {
        let a = answer(s);
        assert_eq!(a["x_abstention_task"], "team-unsure", "{base}: {a}");
        assert!(a["x_abstained"].is_boolean(), "{base}: {a}");
    }
    // The task registered again in the reference's form (replacing it),
    // certified on a separate list of four messages: on both backends the
    // fit sees the nine cases and the list is the held-out side.
    let reference = |(m, l): &(&str, &str)| json!({"request": {"state": {"message": m}, "questions": {"team": team}}, "answer": l});
    let listed = [
        ("My bank shows a charge I never made.", "billing"),
        ("The parcel arrived crushed.", "shipping"),
        ("I am filing a complaint with the regulator.", "legal"),
        ("Cancel the invoice you sent me.", "billing"),
    ];
    let body = json!({
        "id": "team", "examples": cases.iter().map(reference).collect::<Vec<_>>(),
        "certify": {"alpha": 0.6, "delta": 0.2,
                    "examples": listed.iter().map(reference).collect::<Vec<_>>()}
    });
    let mut held = vec![];
    for (s, backend) in [(&mlx, "MLX"), (&vllm, "vLLM")] {
        let r = s.post_json("/v1/tasks", &body);
        assert_eq!(r.status, 200, "{base}: {}", r.text());
        let t = r.json();
        let cert = &t["certificate"];
        assert_eq!(t["n_examples"], 9, "{base}: {t}");
        assert_eq!(cert["stack"]["backend"], backend, "{base}: {cert}");
        assert_eq!(
            (&cert["split"]["method"], &cert["split"]["holdout"]),
            (&json!("supplied"), &Value::Null),
            "{base}: {cert}"
        );
        assert_eq!(
            (&cert["split"]["fit_examples"], &cert["n"]),
            (&json!(9), &json!(4)),
            "{base}: {cert}"
        );
        assert_eq!(answer(s)["x_certificate"], cert["id"], "{base}");
        held.push(t["x_task"]["result"]["holdout_indices"].clone());
    }
    assert_eq!(held[0], json!([9, 10, 11, 12]), "{base}");
    assert_eq!(held[0], held[1], "{base}");

    think_and_cut_alike(base, &mlx, &vllm, &every_type);

    println!(
        "{base} on {model}: System One answered alike on both backends: team {}, shelf {}, score {:.3}",
        a["answers"]["team"]["choice"], a["answers"]["shelf"]["choice"],
        finite(&a["answers"]["anger"]["score"])
    );
}

/// Think when unsure and a state cut to the ceiling, on a base's two
/// backends: `body` (a request of every type, one choice of 255 options)
/// asked to think: each question thinks, or says why not (the 255 options
/// are too many; a sure one is at its threshold), and both backends write
/// the same reasoning and serve the same mix; a state over the 4,096-token
/// ceiling is cut alike on both, and a cut state does not think.
fn think_and_cut_alike(base: &str, mlx: &Server, vllm: &Server, body: &Value) {
    let ask = |s: &Server, body: &Value| {
        let r = s.post_json_waiting("/v1/systemone", body, std::time::Duration::from_secs(600));
        assert_eq!(r.status, 200, "{base}: {}", r.text());
        r.json()
    };
    let mut thinking = body.clone();
    thinking["think"] = json!(true);
    let (a, b) = (ask(mlx, &thinking), ask(vllm, &thinking));
    assert_eq!(
        a["x_thinking"]["per_question"], b["x_thinking"]["per_question"],
        "{base}"
    );
    assert_eq!(a["usage"], b["usage"], "{base}");
    let thresholds = [("choice", 0.75), ("noul", 0.92), ("score", 0.70)];
    for (id, x) in a["answers"].as_object().unwrap() {
        let y = &b["answers"][id];
        let p: Vec<f64> = match x["type"].as_str().unwrap() {
            "noul" => vec![finite(&x["noul"]), finite(&y["noul"])],
            _ => x["probabilities"]
                .as_object()
                .unwrap()
                .values()
                .map(finite)
                .collect(),
        };
        // A thought answer is read from a longer prompt than a single
        // read: the two engines' sums drift further apart.
        if x["type"] == "noul" {
            assert!((p[0] - p[1]).abs() < 1e-4, "{base} {id}: {x} vs {y}");
        } else {
            for (k, v) in x["probabilities"].as_object().unwrap() {
                assert!(
                    (finite(v) - finite(&y["probabilities"][k])).abs() < 1e-4,
                    "{base} {id} {k}"
                );
            }
        }
        match (id.as_str(), &x["x_thought"]) {
            ("shelf", _) => assert_eq!(x["x_thought_why"], "more than 16 options", "{base}: {x}"),
            // Registered above, with an abstention task beside it.
            ("team", _) => assert_eq!(
                x["x_thought_why"],
                "not combined with two-order averaging, abstention or the image route",
                "{base}: {x}"
            ),
            (_, Value::Bool(true)) => {}
            _ => {
                assert_eq!(x["x_thought_why"], "sure", "{base} {id}: {x}");
                let kind = x["type"].as_str().unwrap();
                let tau = thresholds.iter().find(|(t, _)| *t == kind).unwrap().1;
                let top = match kind {
                    "noul" => p[0].max(1.0 - p[0]),
                    _ => p.iter().copied().fold(0.0, f64::max),
                };
                assert!(top >= tau, "{base} {id}: sure at {top}");
            }
        }
    }
    assert!(
        a["x_thinking"]["questions"].as_u64().unwrap() >= 1,
        "{base}: {a}"
    );
    assert_eq!(
        a["usage"]["output_tokens"].as_u64().unwrap(),
        4 + a["usage"]["x_thinking_tokens"].as_u64().unwrap(),
        "{base}"
    );
    // Over the ceiling: the state cut to its start, alike on both; the
    // cut request does not think.
    let mut long = thinking.clone();
    long["state"]["message"] = json!("My parcel never came. ".repeat(400));
    long["questions"].as_object_mut().unwrap().remove("shelf");
    long["over_limit"] = json!("truncate");
    let (a, b) = (ask(mlx, &long), ask(vllm, &long));
    assert_eq!(a["x_truncated"], b["x_truncated"], "{base}");
    let cut = &a["x_truncated"];
    assert_eq!(cut["limit"], 4096, "{base}: {a}");
    assert!(
        cut["kept_tokens"].as_u64().unwrap() < cut["of_tokens"].as_u64().unwrap(),
        "{base}: {cut}"
    );
    for (id, x) in a["answers"].as_object().unwrap() {
        assert_eq!(
            x["x_thought_why"], "the state was cut to the prompt ceiling",
            "{base} {id}"
        );
        let y = &b["answers"][id];
        assert_eq!(x["type"], y["type"]);
        if let Some(p) = x["probabilities"].as_object() {
            for (k, v) in p {
                assert!(
                    (finite(v) - finite(&y["probabilities"][k])).abs() < 1e-5,
                    "{base} cut {id} {k}"
                );
            }
        } else {
            assert!(
                (finite(&x["noul"]) - finite(&y["noul"])).abs() < 1e-5,
                "{base} cut {id}"
            );
        }
    }
}

#[test]
fn qwen3_6_35b_a3b_answers_system_one_alike_on_both_backends() {
    systemone_matrix("qwen3.6-35b-a3b", "qwen3_5_moe-6bit", "tokenizer-qwen3");
}

#[test]
fn gemma_4_12b_answers_system_one_alike_on_both_backends() {
    systemone_matrix("gemma-4-12b", "gemma4_12b-6bit", "tokenizer-gemma3");
}

#[test]
fn gemma_4_31b_answers_system_one_alike_on_both_backends() {
    systemone_matrix("gemma-4-31b", "gemma4_31b-6bit", "tokenizer-gemma3");
}

/// A server's resident peak (`VmHWM`) and MLX's peak of live arrays
/// (`decisio_mlx_memory_bytes{kind="peak"}`), in MiB.
fn memory_mib(s: &Server) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .expect("VmHWM in /proc/PID/status");
    let metrics = common::http_get(s.port, "/metrics").unwrap().text();
    let peak = metrics
        .lines()
        .find_map(|l| l.strip_prefix("decisio_mlx_memory_bytes{kind=\"peak\"} "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("MLX's peak in /metrics");
    (hwm / 1024.0, peak / (1u64 << 20) as f64)
}

/// The largest questions the limits allow run in bounded memory
/// (docs/limits.md, "Memory of a request"): a question of 255 options is
/// the longest a request may ask, and a pass reads at most `--pass-tokens`
/// of question rows and `--prefill-chunk` of one long question, so MLX's
/// peak of live arrays is the same after one such question as after three
/// read in two orders each (six reads), and the resident peak stays under
/// the weights, that peak, the buffer cache's cap and 256 MiB of the
/// process's own. `runs/2026-12-05_memory` has the figures up to 64
/// questions (`scripts/bench/memory.py`, `make bench-memory`).
fn largest_questions_in_bounded_memory(s: &Server, model: &std::path::Path) {
    let options: Vec<String> = (0..255).map(|i| format!("q{i}")).collect();
    let ask = |n: usize, orders: usize, tag: &str| {
        let mut body = json!({
            "state": format!("Case file {tag}: a customer writes that the parcel never came."),
            "questions": (0..n)
                .map(|i| json!({"text": format!("Which queue handles case {tag}{i}?"), "options": options}))
                .collect::<Vec<_>>()});
        if orders > 1 {
            body["x_orders"] = json!(orders);
        }
        // The longest request of the suite (six reads of a question of 255
        // options); it asserts memory, not time, so it waits as long as a
        // loaded machine needs.
        let r = s.post_json_waiting("/v1/decide", &body, std::time::Duration::from_secs(900));
        assert_eq!(r.status, 200, "{}", r.text());
        let r = r.json();
        for a in r["answers"].as_array().unwrap() {
            let p = a["probabilities"].as_object().unwrap();
            assert_eq!(p.len(), 255);
            let sum: f64 = p.values().map(finite).sum();
            assert!((sum - 1.0).abs() < 1e-3, "{sum}");
        }
        memory_mib(s)
    };
    let (_, one) = ask(1, 1, "a");
    let (hwm, six) = ask(3, 2, "b");
    let weights: u64 = std::fs::read_dir(model)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let bound = weights as f64 / (1u64 << 20) as f64 + six + 1024.0 + 256.0;
    eprintln!(
        "{}: MLX peak {one:.1} MiB after 1 question of 255 options, {six:.1} after 3 in 2 orders; resident peak {hwm:.0} MiB (bound {bound:.0})",
        model.display()
    );
    assert!(
        six <= one * 1.02 + 4.0,
        "MLX's peak grew with the questions: {one:.1} MiB, then {six:.1}"
    );
    assert!(hwm <= bound, "resident peak {hwm:.0} MiB over {bound:.0}");
}

#[test]
fn the_fixture_reads_the_largest_questions_in_bounded_memory() {
    let s = Server::start(&[]);
    largest_questions_in_bounded_memory(&s, &common::model_dir());
}

#[test]
fn qwen3_6_35b_a3b_reads_the_largest_questions_in_bounded_memory() {
    let model = "qwen3_5_moe-6bit";
    let s = serve("qwen3.6-35b-a3b", model, "tokenizer-qwen3", &[]);
    largest_questions_in_bounded_memory(&s, &tiny(model));
}

#[test]
fn gemma_4_12b_reads_the_largest_questions_in_bounded_memory() {
    let model = "gemma4_12b-6bit";
    let s = serve("gemma-4-12b", model, "tokenizer-gemma3", &[]);
    largest_questions_in_bounded_memory(&s, &tiny(model));
}

#[test]
fn gemma_4_31b_reads_the_largest_questions_in_bounded_memory() {
    let model = "gemma4_31b-6bit";
    let s = serve("gemma-4-31b", model, "tokenizer-gemma3", &[]);
    largest_questions_in_bounded_memory(&s, &tiny(model));
}
