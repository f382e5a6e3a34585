//! Certified answers on a real server with the fixture model and MMLU: a
//! task (which of ten subjects a question is from: an intent head, as the
//! reference registers it) registered in the reference decisio's own
//! request form with a `certify` block, its certificate checked against the held-out answers
//! read back through `/v1/systemone`, the verdicts under the `x_` names and
//! (after a restart with `--reference-field-names`) the reference's own,
//! suspension when the serving stack changes or the traffic does, and the
//! refusals; decisio's own form with `x_certify` on `/v1/decide`.

mod common;

use common::Server;
use decisio::stats::certify;
use serde_json::{json, Value};

const QUESTION: &str = "Which answer to this question is correct?";

/// Ten MMLU subjects, far apart.
const SUBJECTS: [&str; 10] = [
    "professional law",
    "moral scenarios",
    "elementary mathematics",
    "high school biology",
    "high school macroeconomics",
    "prehistory",
    "nutrition",
    "high school chemistry",
    "world religions",
    "astronomy",
];

/// The question every example asks: which of the ten subjects an MMLU
/// question is from, each subject an option key.
fn question() -> Value {
    let criteria: serde_json::Map<String, Value> = SUBJECTS
        .iter()
        .map(|s| (s.replace(' ', "_"), Value::Null))
        .collect();
    json!({"type": "choice", "instructions": "Which subject is this exam question from?",
           "criteria": criteria})
}

/// `per` MMLU questions of each subject as the reference's examples: a
/// `/v1/systemone` request with one question, and its answer.
fn reference_examples(per: usize) -> Vec<Value> {
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    SUBJECTS
        .iter()
        .flat_map(|subject| {
            rows.iter()
                .filter(move |r| r["topic"] == *subject)
                .take(per)
                .map(move |r| {
                    json!({
                        "request": {"state": r["question"], "questions": {"q": question()}},
                        "answer": subject.replace(' ', "_"),
                    })
                })
        })
        .collect()
}

/// `examples` with the fourth asking another question.
fn mixed_question(examples: &[Value]) -> Vec<Value> {
    let mut mixed = examples.to_vec();
    mixed[3]["request"]["questions"]["q"]["instructions"] = json!("Another question?");
    mixed
}

/// The answer to one example's request.
fn ask(s: &Server, request: &Value) -> Value {
    let r = s.post_json("/v1/systemone", request);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["answers"]["q"].clone()
}

/// An answer's top probability and chosen key.
fn top(answer: &Value) -> (f64, String) {
    answer["probabilities"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (v.as_f64().unwrap(), k.clone()))
        .fold(
            (f64::MIN, String::new()),
            |a, b| if b.0 > a.0 { b } else { a },
        )
}

fn metric(s: &Server, line_start: &str) -> Option<f64> {
    let r = s.request("GET", "/metrics", &[], None).unwrap();
    r.text()
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

const ALPHA: f64 = 0.2;
/// How long a registration in the reference's form (answered once ready)
/// may take: 150 examples at the 0.4 a second seen with two other test
/// binaries on two cores, twice over.
const WAIT: std::time::Duration = std::time::Duration::from_secs(900);
const DELTA: f64 = 0.1;

#[test]
fn a_reference_client_registers_a_certified_task_and_reads_its_verdicts() {
    let dir = common::fresh_dir("certify");
    let state_dir = dir.to_str().unwrap();
    let examples = reference_examples(15);
    let s = Server::start(&["--state-dir", state_dir]);

    // Refused, naming the field: too few held-out examples for the
    // promise (38 of 75 at alpha 0.05, delta 0.1 need 59), examples of two
    // questions.
    let every_other: Vec<&Value> = examples.iter().step_by(2).collect();
    let r = s.post_json(
        "/v1/tasks",
        &json!({"id": "small", "examples": every_other, "certify": {}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "certify", "{}", r.text());
    assert!(r.text().contains("at least 59"), "{}", r.text());
    // A separate certification list: refused when 5 of its 15 examples
    // are fit examples, beside a held-out share, and asking another
    // question.
    for (certify, says) in [
        (
            json!({"examples": examples[5..20]}),
            "5 of the 15 certification examples",
        ),
        (
            json!({"examples": examples[10..20], "holdout": 0.3}),
            "not both",
        ),
        (
            json!({"examples": mixed_question(&examples[10..20])}),
            "share one question",
        ),
    ] {
        let r = s.post_json(
            "/v1/tasks",
            &json!({"id": "x", "examples": examples[..10], "certify": certify}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(
            r.json()["error"]["param"]
                .as_str()
                .unwrap()
                .starts_with("certify.examples"),
            "{}",
            r.text()
        );
        assert!(r.text().contains(says), "{}", r.text());
    }
    let mixed = mixed_question(&examples[..10]);
    let r = s.post_json("/v1/tasks", &json!({"id": "x", "examples": mixed}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("share one question"), "{}", r.text());
    assert_eq!(
        s.request("GET", "/v1/tasks", &[], None).unwrap().json()["data"],
        json!([]),
        "nothing refused was registered"
    );

    // The reference's request: answered once the task is ready, in the
    // reference's shape; ten options with at least five examples each make
    // an intent task, as in the reference.
    let r = s.post_json_waiting(
        "/v1/tasks",
        &json!({"id": "mmlu-cert", "examples": examples,
                "certify": {"alpha": ALPHA, "delta": DELTA}}),
        WAIT,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json();
    assert_eq!(t["id"], "mmlu-cert");
    assert_eq!(t["type"], "choice");
    assert_eq!(t["x_task"]["kind"], "intent", "{t}");
    assert_eq!(t["options"].as_array().unwrap().len(), 10);
    assert_eq!(
        t["n_examples"], 75,
        "the examples fitted on, as the reference counts"
    );
    assert_eq!(t["status"]["state"], "ok", "{t}");
    let cert = &t["certificate"];
    let held: Vec<usize> = t["x_task"]["result"]["holdout_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(held.len(), 75, "holdout 0.5 by default: {cert}");
    assert_eq!(cert["n"], 75);
    assert_eq!(cert["split"]["method"], "holdout");
    assert_eq!(cert["split"]["fit_examples"], 75);
    assert!(cert["id"].as_str().unwrap().starts_with("mmlu-cert#"));

    // The held-out examples read back as served are what was certified on:
    // the same threshold and counts from their confidences.
    let mut conf = Vec::new();
    let mut correct = Vec::new();
    let mut answers = Vec::new();
    for &i in &held {
        let a = ask(&s, &examples[i]["request"]);
        let (p, key) = top(&a);
        conf.push(p);
        correct.push(key == examples[i]["answer"].as_str().unwrap());
        answers.push(a);
    }
    let want = certify::certify(&conf, &correct, ALPHA, DELTA);
    assert_eq!(cert["certified_n"], want.served, "{cert}");
    assert_eq!(
        cert["accuracy"],
        json!(correct.iter().filter(|&&c| c).count() as f64 / 75.0)
    );
    let threshold = cert["threshold"].as_f64();
    assert_eq!(
        threshold,
        want.threshold.is_finite().then_some(want.threshold),
        "{cert}"
    );
    let threshold = threshold
        .unwrap_or_else(|| panic!("the fixture's subject head certifies at alpha {ALPHA}: {cert}"));
    assert!(want.served > 0 && want.served < 75, "{cert}");
    eprintln!(
        "certified: {} of 75 held-out answers at or above {threshold:.4}, {} wrong (accuracy {})",
        want.served, want.errors, cert["accuracy"]
    );
    for (a, &p) in answers.iter().zip(&conf) {
        assert_eq!(a["x_task"], "mmlu-cert");
        assert_eq!(a["x_certificate"], cert["id"]);
        assert_eq!(a["x_certified"], json!(p >= threshold), "{a}");
        match p >= threshold {
            true => assert!(a.get("x_certified_reason").is_none(), "{a}"),
            false => assert_eq!(a["x_certified_reason"], "below_threshold", "{a}"),
        }
        assert!(a.get("certified").is_none(), "{a}");
    }
    let certified_one = held
        .iter()
        .zip(&conf)
        .find(|(_, &p)| p >= threshold)
        .map(|(&i, _)| i)
        .unwrap();
    assert_eq!(
        metric(
            &s,
            "decisio_certified_task_answers_total{task=\"mmlu-cert\",verdict=\"certified\"}"
        ),
        Some(want.served as f64)
    );

    // Traffic unlike the examples: the least confident example again and
    // again raises the confidence alarm, and a certified answer is not
    // certified while it lasts.
    let (lowest, _) = held
        .iter()
        .zip(&conf)
        .min_by(|a, b| a.1.total_cmp(b.1))
        .unwrap();
    for _ in 0..40 {
        ask(&s, &examples[*lowest]["request"]);
    }
    let a = ask(&s, &examples[certified_one]["request"]);
    assert_eq!(a["x_certified_reason"], "traffic_changed", "{a}");
    let listed = s.request("GET", "/v1/tasks", &[], None).unwrap().json();
    let status = &listed["data"][0]["x_certificate_status"];
    assert_eq!(status["state"], "traffic_changed", "{status}");
    assert_eq!(
        status["monitor"]["signals"],
        json!(["confidence"]),
        "{status}"
    );
    assert_eq!(
        metric(
            &s,
            "decisio_certified_task_traffic_alert{signal=\"confidence\",task=\"mmlu-cert\"}"
        ),
        Some(1.0)
    );

    // An export imports into a fresh server, whose answers are the same
    // bits (its monitor fresh: the answer is certified again).
    let export = s
        .request("GET", "/v1/tasks?full=1", &[], None)
        .unwrap()
        .json();
    assert_eq!(export["object"], "tasks.export", "{export}");
    assert_eq!(export["tasks"].as_array().unwrap().len(), 1);
    let fresh_dir = common::fresh_dir("certify-import");
    let fresh = Server::start(&[
        "--state-dir",
        fresh_dir.to_str().unwrap(),
        "--over-limit-tokens",
        "256",
    ]);
    let r = fresh.post_json("/v1/tasks/import", &export);
    assert_eq!(r.status, 200, "{}", r.text());
    let i = held.iter().position(|&i| i == certified_one).unwrap();
    assert_eq!(ask(&fresh, &examples[certified_one]["request"]), answers[i]);
    // Read from a state cut to the ceiling (`over_limit`), the same
    // question is not certified: the promise is for whole inputs.
    let mut long = examples[certified_one]["request"].clone();
    let state = long["state"].as_str().unwrap().to_string();
    long["state"] = json!(format!("{state} {}", "More of the same. ".repeat(200)));
    long["over_limit"] = json!("truncate");
    let r = fresh.post_json("/v1/systemone", &long);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["x_truncated"]["limit"], 256, "{v}");
    let a = &v["answers"]["q"];
    assert_eq!(a["x_certified"], false, "{a}");
    assert_eq!(a["x_certified_reason"], "state_truncated", "{a}");
    assert_eq!(a["x_certificate"], answers[i]["x_certificate"], "{a}");
    assert_eq!(
        metric(
            &fresh,
            "decisio_certified_task_answers_total{task=\"mmlu-cert\",verdict=\"state_truncated\"}"
        ),
        Some(1.0)
    );
    assert_eq!(ask(&fresh, &examples[certified_one]["request"]), answers[i]);
    let r = fresh.post_json("/v1/tasks/import", &export);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "task_exists", "{}", r.text());
    drop(fresh);

    // Certified again on new examples (the next three of each subject),
    // with another alpha: a new certificate on them; examples the fit saw
    // are refused.
    let more = reference_examples(18);
    let new: Vec<&Value> = more.chunks(18).flat_map(|subject| &subject[15..]).collect();
    let fit_one = (0..examples.len()).find(|i| !held.contains(i)).unwrap();
    let mut seen = new.clone();
    seen.push(&examples[fit_one]);
    let r = s.post_json(
        "/v1/tasks/mmlu-cert/certify",
        &json!({"examples": seen, "alpha": 0.3}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("1 of the 31"), "{}", r.text());
    let r = s.post_json_waiting(
        "/v1/tasks/mmlu-cert/certify",
        &json!({"examples": new, "alpha": 0.3}),
        WAIT,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let again = r.json()["certificate"].clone();
    assert_eq!(again["split"]["method"], "supplied", "{again}");
    assert_eq!((&again["n"], &again["alpha"]), (&json!(30), &json!(0.3)));
    assert_ne!(again["id"], cert["id"]);
    let cert = again;
    drop(s);

    // Restarted with the reference's field names: the task is kept, its
    // monitor starts again, and the verdicts carry the reference's names.
    let s = Server::start(&["--state-dir", state_dir, "--reference-field-names"]);
    let a = ask(&s, &examples[certified_one]["request"]);
    let p = top(&a).0;
    let certified = cert["threshold"].as_f64().is_some_and(|t| p >= t);
    assert_eq!(a["certified"], certified, "{a} {cert}");
    assert_eq!(a["certificate"], cert["id"]);
    assert!(a.get("x_certified").is_none(), "{a}");
    assert_eq!(a.get("certified_reason").is_none(), certified, "{a}");
    drop(s);

    // Another prompt layout (yes/no questions asked otherwise) is another
    // serving stack: the certificate is suspended, its answers served
    // uncertified.
    let s = Server::start(&["--state-dir", state_dir, "--noul-rendering", "words"]);
    let a = ask(&s, &examples[certified_one]["request"]);
    assert_eq!(a["x_certified"], false, "{a}");
    assert_eq!(a["x_certified_reason"], "serving_stack_changed", "{a}");
    let listed = s.request("GET", "/v1/tasks", &[], None).unwrap().json();
    let status = &listed["data"][0]["x_certificate_status"];
    assert_eq!(status["state"], "suspended", "{status}");
    assert_eq!(status["changed"], json!(["layout"]), "{status}");
    // ... and a server of that stack refuses the export.
    let other_dir = common::fresh_dir("certify-other");
    let other = Server::start(&[
        "--state-dir",
        other_dir.to_str().unwrap(),
        "--noul-rendering",
        "words",
    ]);
    let r = other.post_json("/v1/tasks/import", &export);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(
        r.json()["error"]["code"],
        "serving_stack_changed",
        "{}",
        r.text()
    );
    assert!(r.text().contains("layout"), "{}", r.text());
    drop(other);

    // Registering the same id again replaces the task, here certified at
    // alpha 0.3 on a separate list (the next 6 examples of each subject
    // after the 15) and fitted on the first 8 of each: the fit sees every
    // example, the list is the held-out side, and the certificate is what
    // its answers read back give.
    let listed: Vec<Value> = reference_examples(21)
        .chunks(21)
        .flat_map(|subject| subject[15..].to_vec())
        .collect();
    let some: Vec<&Value> = examples.chunks(15).flat_map(|c| &c[..8]).collect();
    let r = s.post_json_waiting(
        "/v1/tasks",
        &json!({"id": "mmlu-cert", "examples": some,
                "certify": {"alpha": 0.3, "delta": DELTA, "examples": listed}}),
        WAIT,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let t = r.json();
    assert_eq!(t["x_task"]["kind"], "intent", "{t}");
    assert_eq!(t["n_examples"], 80, "{t}");
    let cert = &t["certificate"];
    let split = &cert["split"];
    assert_eq!(split["method"], "supplied", "{cert}");
    assert_eq!(split["holdout"], Value::Null, "{cert}");
    assert_eq!(split["fit_examples"], some.len(), "{cert}");
    assert_eq!(
        (&split["certify_examples"], &cert["n"]),
        (&json!(60), &json!(60))
    );
    let (mut conf, mut correct) = (vec![], vec![]);
    for e in &listed {
        let a = ask(&s, &e["request"]);
        assert_eq!(a["x_certificate"], cert["id"], "{a}");
        let (p, key) = top(&a);
        conf.push(p);
        correct.push(key == e["answer"].as_str().unwrap());
    }
    let want = certify::certify(&conf, &correct, 0.3, DELTA);
    assert_eq!(cert["certified_n"], want.served, "{cert}");
    assert!(
        want.served > 0,
        "the subject head certifies at alpha 0.3: {cert}"
    );
    assert_eq!(
        cert["threshold"].as_f64(),
        want.threshold.is_finite().then_some(want.threshold),
        "{cert}"
    );
    eprintln!(
        "certified on a separate list: {} of 60 at {:?} (accuracy {})",
        want.served, cert["threshold"], cert["accuracy"]
    );
    let tasks = s.request("GET", "/v1/tasks", &[], None).unwrap().json();
    assert_eq!(tasks["data"].as_array().unwrap().len(), 1, "{tasks}");
    // Certified again, the list is not the fit's: its examples are taken.
    let r = s.post_json_waiting(
        "/v1/tasks/mmlu-cert/certify",
        &json!({"examples": new, "alpha": 0.3}),
        WAIT,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let split = &r.json()["certificate"]["split"];
    assert!(split["rule"].as_str().unwrap().contains("again"), "{split}");
}

#[test]
fn decisios_own_form_certifies_a_task_asked_by_name() {
    let dir = common::fresh_dir("certify-own");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    let rows: Vec<Value> = text
        .lines()
        .step_by(13)
        .take(40)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let examples: Vec<Value> = rows
        .iter()
        .map(|r| json!({"state": common::mmlu_lettered(r), "label": r["correct_answer"]}))
        .collect();
    let body = json!({
        "name": "own", "question": QUESTION, "options": ["A", "B", "C", "D"],
        "examples": examples, "x_certify": {"alpha": 0.6, "delta": 0.2, "min_examples": 10}
    });
    // A separate certification list in decisio's form: refused when it
    // repeats fit examples, or holds fewer than `min_examples`.
    let other = json!({"state": "A question the fit has not seen.", "label": "A"});
    for (list, says) in [
        (json!(examples[..12]), "12 of the 12 certification examples"),
        (
            json!([other]),
            "1 held-out labelled examples (in `x_certify.examples`)",
        ),
    ] {
        let mut refused = body.clone();
        refused["x_certify"]["examples"] = list;
        let r = s.post_json("/v1/tasks", &refused);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(
            r.json()["error"]["param"],
            "x_certify.examples",
            "{}",
            r.text()
        );
        assert!(r.text().contains(says), "{}", r.text());
    }
    let r = s.post_json("/v1/tasks", &body);
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let t = loop {
        let t = s
            .request("GET", &format!("/v1/tasks/{id}"), &[], None)
            .unwrap()
            .json();
        if t["status"] != "queued" && t["status"] != "running" {
            break t;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(t["status"], "ready", "{t}");
    assert_eq!(
        t["holdout"], 0.5,
        "a certified task holds out half by default"
    );
    let cert = &t["result"]["certificate"];
    assert_eq!(cert["min_examples"], 10);
    assert_eq!(t["x_certificate_status"]["state"], "ok", "{t}");
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": examples[0]["state"], "questions": [{"task": "own"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let a = &r.json()["answers"][0];
    assert_eq!(a["x_certificate"], cert["id"], "{a}");
    let p = a["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .fold(0.0, f64::max);
    let certified = cert["threshold"].as_f64().is_some_and(|t| p >= t - 1e-6);
    assert_eq!(a["x_certified"], json!(certified), "{a} {cert}");
    // The request's own temperature is not what was certified.
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": examples[0]["state"], "questions": [{"task": "own", "temperature": 2.0}]}),
    );
    let a = &r.json()["answers"][0];
    assert_eq!(a["x_certified_reason"], "serving_stack_changed", "{a}");
    // Nor is an answer averaged over two orders of its options.
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": examples[0]["state"], "questions": [{"task": "own"}], "x_orders": 2}),
    );
    let a = &r.json()["answers"][0];
    assert_eq!(a["x_certified_reason"], "serving_stack_changed", "{a}");
    // A bad block names its field.
    let mut bad = body.clone();
    bad["name"] = json!("bad");
    bad["x_certify"] = json!({"alpha": 1.5});
    let r = s.post_json("/v1/tasks", &bad);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["error"]["param"],
        "x_certify.alpha",
        "{}",
        r.text()
    );
}
