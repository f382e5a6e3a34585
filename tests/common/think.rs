//! Think when unsure checked from outside: the reference decisio's
//! System One requests with their rows (`make reference`), and each thought
//! answer recomputed from a completions server's own reads.

use std::time::Duration;

use serde_json::{json, Value};

use super::{reference_file, Server};

const WAIT: Duration = Duration::from_secs(600);

/// The reasoning budget the checks serve with (`--think-budget`).
pub const BUDGET: usize = 16;

/// Reference requests of at most three questions of at most 16 options.
pub fn requests(n: usize) -> Vec<Value> {
    let file = reference_file("systemone/fixture.json");
    let all: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    all.into_iter()
        .filter(|e| {
            let qs = e["questions"].as_object().unwrap();
            qs.len() <= 3
                && qs
                    .values()
                    .all(|q| q["labels"].as_array().unwrap().len() <= 16)
        })
        .take(n)
        .collect()
}

/// A served answer's probabilities in the order of `keys` (a yes/no
/// answer's from its P(yes)).
fn served(answer: &Value, keys: &[Value]) -> Vec<f64> {
    match answer["type"].as_str().unwrap() {
        "noul" => {
            let yes = answer["noul"].as_f64().unwrap();
            keys.iter()
                .map(|k| if k == "yes" { yes } else { 1.0 - yes })
                .collect()
        }
        _ => keys
            .iter()
            .map(|k| {
                answer["probabilities"][k.as_str().unwrap()]
                    .as_f64()
                    .unwrap()
            })
            .collect(),
    }
}

/// The served temperature of a question type (the reference's served
/// defaults, which the fixture takes).
fn temperature(kind: &str) -> f64 {
    if kind == "choice" {
        1.370
    } else {
        1.506
    }
}

/// Checks every answer of `entries` on `s` against the oracle computed on
/// the completions server at `upstream`, and that the same request gives
/// the same answers again: the same bits where `again_within` is 0 (MLX),
/// else every number within it (a real vLLM, whose float32 sums depend on
/// what it batches together).
pub fn check_thinking(s: &Server, upstream: u16, entries: &[Value], again_within: f64) -> usize {
    let mut thought = 0;
    for (n, entry) in entries.iter().enumerate() {
        let mut body = entry["request"].clone();
        body["think"] = json!(true);
        let r = s.post_json_waiting("/v1/systemone", &body, WAIT);
        assert_eq!(r.status, 200, "#{n}: {}", r.text());
        let v = r.json();
        let questions = entry["questions"].as_object().unwrap();
        let mut tokens = 0;
        for (id, q) in questions {
            let answer = &v["answers"][id];
            assert_eq!(answer["x_thought"], true, "#{n} {id}: {v}");
            assert!(answer.get("x_thought_why").is_none(), "{answer}");
            let ids: Vec<u64> = serde_json::from_value(q["ids"].clone()).unwrap();
            let labels: Vec<u64> = serde_json::from_value(q["labels"].clone()).unwrap();
            let kind = q["kind"].as_str().unwrap();
            let (expected, written) =
                think_oracle(upstream, &ids, &labels, BUDGET, temperature(kind));
            let keys = q["keys"].as_array().unwrap();
            let got = served(answer, keys);
            for (g, e) in got.iter().zip(&expected) {
                assert!(
                    (g - e).abs() < 2e-4,
                    "#{n} {id}: served {got:?}, recomputed {expected:?}"
                );
            }
            assert_eq!(
                v["x_thinking"]["per_question"][id],
                json!({"thought": true, "tokens": written}),
                "#{n} {id}"
            );
            tokens += written;
            thought += 1;
        }
        assert_eq!(v["x_thinking"]["tokens"], tokens, "{v}");
        assert_eq!(v["x_thinking"]["questions"], questions.len());
        assert_eq!(v["usage"]["x_thinking_tokens"], tokens);
        assert_eq!(v["usage"]["output_tokens"], questions.len() + tokens);
        assert_eq!(
            r.header("x-decisio-think-tokens"),
            Some(tokens.to_string().as_str())
        );
        assert!(r.header("x-decisio-think-ms").is_some());
        // Greedy: the same request, the same bits.
        let again = s.post_json_waiting("/v1/systemone", &body, WAIT).json();
        if again_within == 0.0 {
            assert_eq!(again["answers"], v["answers"], "#{n}");
        } else {
            assert_within(
                &again["answers"],
                &v["answers"],
                again_within,
                &format!("#{n}"),
            );
        }
        assert_eq!(again["usage"], v["usage"], "#{n}");
    }
    thought
}

/// `a` and `b` alike but for numbers, which differ by at most `tolerance`.
fn assert_within(a: &Value, b: &Value, tolerance: f64, at: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= tolerance, "{at}: {x} and {y}");
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                assert_within(v, &y[k], tolerance, &format!("{at}.{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                assert_within(v, w, tolerance, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// Think when unsure recomputed from a completions server's own reads
/// (vLLM's API: token-id prompts, `logprob_token_ids`,
/// `return_tokens_as_token_ids`), the reference decisio's arithmetic
/// (`decisio/serve/think.py`): the row read once; the row, the prefix and
/// the model's greedy reasoning of up to `budget` tokens, the suffix, read
/// again; the two reads' log-probabilities over the labels averaged and
/// served at `temperature`. The probabilities in the labels' order, and
/// the reasoning's tokens.
pub fn think_oracle(
    port: u16,
    row: &[u64],
    labels: &[u64],
    budget: usize,
    temperature: f64,
) -> (Vec<f64>, usize) {
    let tokenizer =
        tokenizers::Tokenizer::from_file(super::model_dir().join("tokenizer.json")).unwrap();
    let ids = |text: &str| -> Vec<u64> {
        let e = tokenizer.encode(text, false).unwrap();
        e.get_ids().iter().map(|&i| u64::from(i)).collect()
    };
    let pre = ids("Let me check the deciding facts first.\n");
    let suf = ids("\n\nFinal answer:");
    let token_ids = |choice: &serde_json::Value| -> Vec<u64> {
        choice["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let t = t.as_str().unwrap();
                t.strip_prefix("token_id:").unwrap().parse().unwrap()
            })
            .collect()
    };
    let read = |prompt: Vec<u64>| -> Vec<f64> {
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 1, "temperature": 0,
            "logprobs": labels.len(), "logprob_token_ids": labels,
            "return_tokens_as_token_ids": true});
        let r = super::post_json(port, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let top = &r.json()["choices"][0]["logprobs"]["top_logprobs"][0];
        let lp: Vec<f64> = labels
            .iter()
            .map(|l| top[format!("token_id:{l}")].as_f64().unwrap())
            .collect();
        let z = lp.iter().map(|v| v.exp()).sum::<f64>().ln();
        lp.iter().map(|v| v - z).collect()
    };
    let first = read(row.to_vec());
    let prompt: Vec<u64> = [row, &pre].concat();
    let body = serde_json::json!({"prompt": prompt, "max_tokens": budget, "temperature": 0,
        "logprobs": 0, "return_tokens_as_token_ids": true});
    let r = super::post_json(port, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let reasoning = token_ids(&r.json()["choices"][0]);
    let second = read([row, &pre, &reasoning, &suf].concat());
    let mixed: Vec<f64> = first
        .iter()
        .zip(&second)
        .map(|(a, b)| (a + b) / 2.0 / temperature)
        .collect();
    let z = mixed.iter().map(|v| v.exp()).sum::<f64>();
    (mixed.iter().map(|v| v.exp() / z).collect(), reasoning.len())
}
