//! Asking the server: a state's questions in one `POST /v1/decide`, or a
//! chat question as an OpenAI SDK sends it, each at temperature 1; the
//! answers read back by letter in option order.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::client::Client;
use crate::suite::data::{Item, State};
use crate::suite::record::AnswerRecord;

/// An answer from the server's JSON, its values by letter in option order.
fn answer_of(v: &Value, item: &Item) -> Result<AnswerRecord> {
    let by_letter = |field: &str| -> Result<Vec<f32>> {
        (0..item.options.len())
            .map(|i| {
                let letter = ((b'A' + i as u8) as char).to_string();
                v[field][&letter]
                    .as_f64()
                    .map(|x| x as f32)
                    .with_context(|| format!("the answer to `{}` has no {field}.{letter}", item.id))
            })
            .collect()
    };
    Ok(AnswerRecord {
        id: item.id.clone(),
        gold: item.answer,
        index: v["index"].as_u64().map(|i| i as usize),
        probabilities: by_letter("probabilities")?,
        letter_logprobs: by_letter("letter_logprobs")?,
    })
}

fn question(item: &Item) -> Value {
    json!({"id": item.id, "text": item.question, "options": item.options, "temperature": 1.0})
}

/// A chat question's request: its messages and the question as the last
/// user message, the options in the `decisio` object, as an OpenAI SDK
/// sends it (`extra_body`).
fn chat_body(model: &str, messages: &[Value], item: &Item) -> Value {
    let mut all = messages.to_vec();
    all.push(json!({"role": "user", "content": item.question}));
    json!({
        "model": model,
        "messages": all,
        "decisio": {"options": item.options, "temperature": 1.0},
    })
}

/// The surface a question is asked through, and the request.
pub(super) fn request(model: &str, items: &[&Item]) -> (&'static str, Value) {
    match &items[0].state {
        State::Text(state) => (
            "/v1/decide",
            json!({
                "model": model,
                "state": state,
                "questions": items.iter().map(|i| question(i)).collect::<Vec<_>>(),
            }),
        ),
        State::Chat(messages) => {
            debug_assert_eq!(items.len(), 1, "a chat question is asked alone");
            ("/v1/chat/completions", chat_body(model, messages, items[0]))
        }
    }
}

/// Asks `items` (of one state; a chat question alone) in one request:
/// (answers, ms per question, whether the state was cached).
pub(super) fn ask(
    client: &Client,
    model: &str,
    items: &[&Item],
) -> Result<(Vec<AnswerRecord>, f64, bool)> {
    let (path, body) = request(model, items);
    let t0 = Instant::now();
    let reply = client.post(path, &body)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3 / items.len() as f64;
    if reply.status != 200 {
        bail!(
            "the server refused the question `{}`: {}",
            items[0].id,
            reply.error()
        );
    }
    // `/v1/decide` answers with `answers` and `state`; a chat decision with
    // its `decisio` object's `answer` and `state`.
    let (answers, state) = match &items[0].state {
        State::Text(_) => (reply.body["answers"].clone(), &reply.body["state"]),
        State::Chat(_) => (
            Value::Array(vec![reply.body["decisio"]["answer"].clone()]),
            &reply.body["decisio"]["state"],
        ),
    };
    let answers = answers
        .as_array()
        .filter(|a| a.iter().all(Value::is_object))
        .context("the decision reply has no answers")?;
    if answers.len() != items.len() {
        bail!("{} questions asked, {} answers", items.len(), answers.len());
    }
    let out = answers
        .iter()
        .zip(items)
        .map(|(a, i)| answer_of(a, i))
        .collect::<Result<_>>()?;
    Ok((out, ms, state["cached"].as_bool().unwrap_or(false)))
}
