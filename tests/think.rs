//! Think when unsure on `POST /v1/systemone`, on both backends: the
//! fixture's MLX server and a vLLM-backend gateway in front of it. The
//! questions are the reference decisio's own (`make reference`:
//! `target/reference/systemone/fixture.json`, each with its row's token
//! ids as the reference builds them); the oracle recomputes each thought
//! answer from the upstream's own completions ([`common::think_oracle`]):
//! the row read, the reasoning written greedily, the row read again after
//! it, the two mixed as the reference mixes them.

mod common;

use std::time::Duration;

use common::think::{check_thinking, requests};
use common::Server;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(600);
#[test]
fn unsure_questions_think_on_both_backends_as_the_reference_mixes_them() {
    // A factor of 1.5 puts every threshold above 1: every question is
    // unsure.
    let budget = common::think::BUDGET.to_string();
    let think = ["--think-factor", "1.5", "--think-budget", &budget];
    let mlx = Server::start(&think);
    let url = mlx.url();
    let mut args = common::gateway_args(&url);
    args.extend(think);
    let gateway = Server::start(&args);
    let entries = requests(2);
    // The two servers are checked side by side.
    let thought: usize = std::thread::scope(|scope| {
        let checks: Vec<_> = [&mlx, &gateway]
            .map(|s| scope.spawn(|| check_thinking(s, mlx.port, &entries, 0.0)))
            .into_iter()
            .collect();
        checks.into_iter().map(|c| c.join().unwrap()).sum()
    });
    let asked: usize = entries
        .iter()
        .map(|e| e["questions"].as_object().unwrap().len())
        .sum();
    assert_eq!(thought, 2 * asked, "{thought} questions thought");
    // The MLX server's own requests, each sent twice: as many as both
    // servers' requests sent once.
    assert_eq!(
        mlx.metric("decisio_think_questions_total", "outcome=\"thought\""),
        thought as f64
    );
    assert!(mlx.metric("decisio_think_tokens_total", "") > 0.0);

    // Off by default: a request that does not ask reads once, and says
    // nothing of thinking.
    let entry = &entries[0];
    let plain = mlx
        .post_json_waiting("/v1/systemone", &entry["request"], WAIT)
        .json();
    assert!(plain.get("x_thinking").is_none(), "{plain}");
    for answer in plain["answers"].as_object().unwrap().values() {
        assert!(answer.get("x_thought").is_none(), "{answer}");
    }
    assert_eq!(
        plain["usage"]["output_tokens"],
        entry["questions"].as_object().unwrap().len()
    );
}

#[test]
fn a_sure_question_and_what_cannot_think_say_why_and_keep_the_single_read() {
    // The server thinks by default, but nothing is unsure below a factor
    // of 0.1 (thresholds under 0.1); yes/no questions may not think.
    let s = Server::start(&[
        "--think",
        "--think-factor",
        "0.1",
        "--think-types",
        "choice,score",
    ]);
    let entries = requests(2);
    for entry in &entries {
        let thinking = s.post_json_waiting("/v1/systemone", &entry["request"], WAIT);
        assert_eq!(thinking.status, 200, "{}", thinking.text());
        let thinking = thinking.json();
        let mut off = entry["request"].clone();
        off["think"] = json!(false);
        let once = s.post_json_waiting("/v1/systemone", &off, WAIT).json();
        for (id, q) in entry["questions"].as_object().unwrap() {
            let a = &thinking["answers"][id];
            assert_eq!(a["x_thought"], false, "{a}");
            let why = match q["kind"].as_str().unwrap() {
                "noul" => "its type is not one this server thinks on",
                _ => "sure",
            };
            assert_eq!(a["x_thought_why"], why, "{a}");
            // The single read's answer, bit for bit.
            let mut a = a.clone();
            let o = a.as_object_mut().unwrap();
            o.remove("x_thought");
            o.remove("x_thought_why");
            assert_eq!(a, once["answers"][id]);
        }
        assert_eq!(thinking["x_thinking"]["questions"], 0);
        assert_eq!(thinking["x_thinking"]["types"], json!(["choice", "score"]));
        assert_eq!(thinking["usage"]["x_thinking_tokens"], 0);
    }

    // Two orders and a cut state do not think; `think` must be a boolean;
    // a task's example may not ask to think.
    let mut body = entries[0]["request"].clone();
    body["x_orders"] = json!(2);
    let v = s.post_json_waiting("/v1/systemone", &body, WAIT).json();
    for a in v["answers"].as_object().unwrap().values() {
        assert_eq!(
            a["x_thought_why"],
            "not combined with two-order averaging, abstention or the image route"
        );
    }
    let mut body = entries[0]["request"].clone();
    body["think"] = json!("yes");
    let r = s.post_json("/v1/systemone", &body);
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        r.json()["detail"][0]["loc"],
        json!(["body", "think"]),
        "{}",
        r.text()
    );
    let first = entries[0]["questions"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let mut example = entries[0]["request"].clone();
    let question = example["questions"][&first].clone();
    example["questions"] = json!({ first.clone(): question });
    example["think"] = json!(true);
    let answer = match entries[0]["questions"][&first]["kind"].as_str().unwrap() {
        "noul" => json!(true),
        "score" => json!(0),
        _ => entries[0]["questions"][&first]["keys"][0].clone(),
    };
    let examples: Vec<Value> = (0..4)
        .map(|_| json!({"request": example, "answer": answer}))
        .collect();
    let r = s.post_json(
        "/v1/tasks",
        &json!({"id": "thinking-example", "examples": examples}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("`think` is not accepted"), "{}", r.text());
}

#[test]
fn a_registered_task_s_question_never_thinks() {
    // Every question unsure, and one of them answered by a registered
    // task: that one keeps its single read.
    let s = Server::start(&["--think", "--think-factor", "1.5", "--think-budget", "16"]);
    let criteria =
        json!({"refund": "The customer wants money back", "delivery": "A parcel is late"});
    let ask = |i: usize| {
        json!({"state": format!("Ticket {i}: the parcel arrived broken and the customer wants a refund."),
               "questions": {"topic": {"type": "choice", "instructions": "What is the ticket about?",
                                       "criteria": criteria}}})
    };
    let examples: Vec<Value> = (0..24)
        .map(|i| json!({"request": ask(i), "answer": if i % 3 == 0 { "delivery" } else { "refund" }}))
        .collect();
    let r = s.post_json_waiting(
        "/v1/tasks",
        &json!({"id": "topics", "examples": examples}),
        WAIT,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut body = ask(99);
    body["questions"]["other"] = json!({"type": "noul", "instructions": "Is the customer calm?"});
    let v = s.post_json_waiting("/v1/systemone", &body, WAIT).json();
    let task = &v["answers"]["topic"];
    assert_eq!(task["x_task"], "topics", "{v}");
    assert_eq!(task["x_thought"], false, "{v}");
    assert_eq!(
        task["x_thought_why"],
        "a registered task answers this question"
    );
    assert_eq!(v["answers"]["other"]["x_thought"], true, "{v}");
    assert_eq!(v["x_thinking"]["questions"], 1);
}
