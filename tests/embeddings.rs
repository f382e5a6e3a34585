//! `POST /v1/embeddings` on the MLX backend: the OpenAI shape, float and
//! base64 encodings of the same bits, text and token-id inputs, vectors that
//! are hidden states (not normalised), the continuation of a kept prompt
//! giving the bits of a prompt computed on its own path, and refusals that
//! name the field.

mod common;

use common::{Response, Server};
use serde_json::{json, Value};

fn error_of(r: &Response, status: u16) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json();
    assert!(e["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(e["error"]["type"].is_string());
    e["error"].clone()
}

fn embed(s: &Server, body: &Value) -> Value {
    let r = s.post_json("/v1/embeddings", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The vectors of an answer, as f32 bits; base64 is decoded as
/// little-endian float32, numbers narrowed from their f64 reading.
fn vectors(answer: &Value) -> Vec<Vec<u32>> {
    answer["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            match &d["embedding"] {
                Value::String(b) => decisio::base64::decode_f32(b)
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect(),
                Value::Array(v) => v
                    .iter()
                    .map(|x| (x.as_f64().unwrap() as f32).to_bits())
                    .collect(),
                other => panic!("not an embedding: {other}"),
            }
        })
        .collect()
}

fn tokenize(s: &Server, text: &str) -> Vec<u64> {
    let r = s.post_json("/tokenize", &json!({"prompt": text}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn embeddings_are_hidden_states_in_openai_shape() {
    let s = Server::start(&[]);
    let texts = [
        "The mitochondria is the powerhouse of the cell.",
        "Which planet is closest to the sun?",
    ];
    let ids: Vec<Vec<u64>> = texts.iter().map(|t| tokenize(&s, t)).collect();

    // Text and token ids, floats and base64: the same bits.
    let by_text = embed(&s, &json!({"model": "smollm2", "input": texts}));
    assert_eq!(by_text["object"], "list");
    assert_eq!(by_text["model"], "smollm2");
    let n: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(by_text["usage"]["prompt_tokens"], n);
    assert_eq!(by_text["usage"]["total_tokens"], n);
    let floats = vectors(&by_text);
    assert_eq!(floats.len(), 2);
    assert_eq!(floats[0].len(), 576, "the fixture's hidden size");
    let by_ids = embed(
        &s,
        &json!({"input": ids, "encoding_format": "base64", "user": "u", "dimensions": 576}),
    );
    assert!(by_ids["data"][0]["embedding"].is_string());
    assert_eq!(vectors(&by_ids), floats);
    let one = embed(&s, &json!({"input": ids[1], "encoding_format": "float"}));
    assert_eq!(vectors(&one), vec![floats[1].clone()]);

    // A hidden state, not a unit vector.
    let v: Vec<f64> = floats[0]
        .iter()
        .map(|&b| f64::from(f32::from_bits(b)))
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(v.iter().all(|x| x.is_finite()));
    assert!((norm - 1.0).abs() > 0.1, "norm {norm}");

    // A prompt that extends a kept prompt continues from it (as a
    // decision's question continues its state); the continuation of a
    // prefix embedded first gives what the decision path gives, and
    // differs from the whole prompt's own prefill by float rounding only.
    let mut longer = ids[0].clone();
    longer.extend_from_slice(&ids[1]);
    let continued = vectors(&embed(&s, &json!({"input": longer})));
    let fresh = Server::start(&[]);
    let whole = vectors(&embed(&fresh, &json!({"input": longer})));
    let worst = continued[0]
        .iter()
        .zip(&whole[0])
        .map(|(&a, &b)| (f32::from_bits(a) - f32::from_bits(b)).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-2, "{worst}");
    drop(fresh);

    // Refusals name the field.
    let bad = |body: Value, status: u16| error_of(&s.post_json("/v1/embeddings", &body), status);
    assert_eq!(
        bad(json!({"input": "x", "extra": 1}), 400)["type"],
        "invalid_request_error"
    );
    assert_eq!(bad(json!({"input": []}), 400)["param"], "input");
    assert_eq!(bad(json!({"input": [[]]}), 400)["param"], "input");
    let many: Vec<Value> = (0..257).map(|_| json!("x")).collect();
    assert_eq!(bad(json!({"input": many}), 400)["param"], "input");
    assert_eq!(
        bad(json!({"input": "x", "encoding_format": "int8"}), 400)["param"],
        "encoding_format"
    );
    assert_eq!(
        bad(json!({"input": "x", "dimensions": 64}), 400)["param"],
        "dimensions"
    );
    assert_eq!(
        bad(json!({"input": "x", "dimensions": 0}), 400)["param"],
        "dimensions"
    );
    assert_eq!(bad(json!({"input": [-1]}), 400)["param"], "input");
    assert_eq!(
        bad(json!({"input": [[1], [999999]]}), 400)["param"],
        "input[1]"
    );
    let long: Vec<u32> = vec![1; 8193];
    let e = bad(json!({"input": [long]}), 400);
    assert_eq!(e["code"], "context_length_exceeded");
    let big: Vec<Vec<u32>> = (0..9).map(|_| vec![1u32; 8000]).collect();
    let e = bad(json!({"input": big}), 400);
    assert!(e["message"].as_str().unwrap().contains("65536"), "{e}");
    assert_eq!(
        bad(json!({"model": "other", "input": "x"}), 404)["param"],
        "model"
    );
}
