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
/// the same bits for every question.
fn prefix_cache_is_bit_for_bit(base: &str, model: &str, tokenizer: &str) {
    let cached = serve(base, model, tokenizer, &[]);
    let off = serve(base, model, tokenizer, &["--prefix-cache-mb", "0"]);
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
