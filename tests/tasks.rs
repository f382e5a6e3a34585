//! Task registration on a real server with the fixture model and MMLU: the
//! fitted temperature and the holdout figures checked against decisions
//! served at explicit temperatures, serving by task name, bad
//! registrations, cancellation, and a registration killed midway that
//! resumes after a restart.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{json, Value};

const QUESTION: &str = "Which answer to this question is correct?";

/// `n` MMLU questions (every 37th line), each a state with its four answers
/// lettered, labelled with the correct letter.
fn mmlu_examples(n: usize) -> Vec<Value> {
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    text.lines()
        .step_by(37)
        .take(n)
        .map(|line| {
            let r: Value = serde_json::from_str(line).unwrap();
            json!({"state": common::mmlu_lettered(&r), "label": r["correct_answer"]})
        })
        .collect()
}

fn registration(name: &str, examples: Vec<Value>) -> Value {
    json!({
        "name": name, "kind": "choice", "question": QUESTION,
        "options": ["A", "B", "C", "D"], "examples": examples,
        "holdout": 0.25, "seed": 3, "abstention": {"target_accuracy": 0.3}
    })
}

fn get(s: &Server, path: &str) -> common::Response {
    s.request("GET", path, &[], None).unwrap()
}

fn task(s: &Server, id: &str) -> Value {
    let r = get(s, &format!("/v1/tasks/{id}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Polls the task until `done` says stop; returns the last view. Fails
/// when the task stops moving (neither its status nor its progress
/// changes) for `stall`: a slow machine only makes it wait longer, a hung
/// registration still fails.
fn wait_for(s: &Server, id: &str, stall: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let mut moved = Instant::now();
    let mut last = (Value::Null, Value::Null);
    loop {
        let t = task(s, id);
        if done(&t) {
            return t;
        }
        let now = (t["status"].clone(), t["progress"]["done"].clone());
        if now != last {
            last = now;
            moved = Instant::now();
        }
        assert!(
            moved.elapsed() < stall,
            "the task did not move for {stall:?}: {t}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the task leaves `queued` and `running` (failing when it
/// stops moving for `stall`); the task.
fn settled(s: &Server, id: &str, stall: Duration) -> Value {
    wait_for(s, id, stall, |t| {
        t["status"] != "queued" && t["status"] != "running"
    })
}

fn register(s: &Server, body: &Value) -> String {
    let r = s.post_json("/v1/tasks", body);
    assert_eq!(r.status, 202, "{}", r.text());
    let t = r.json();
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/tasks/{id}").as_str())
    );
    assert_eq!(t["status"], "queued");
    id
}

fn metric(s: &Server, line_start: &str) -> f64 {
    get(s, "/metrics")
        .text()
        .lines()
        .find(|l| l.starts_with(line_start) && l[line_start.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn error_param(r: &common::Response) -> Value {
    let e = r.json();
    assert!(e["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(e["error"]["type"].is_string());
    e["error"]["param"].clone()
}

/// log-softmax of `logits / t`.
fn log_softmax(logits: &[f64], t: f64) -> Vec<f64> {
    let z: Vec<f64> = logits.iter().map(|l| l / t).collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    z.iter().map(|v| v - lse).collect()
}

/// (accuracy, mean NLL, top-label ECE over 15 equal-width bins).
fn figures(logits: &[Vec<f64>], labels: &[usize], t: f64) -> (f64, f64, f64) {
    let n = logits.len() as f64;
    let (mut right, mut nll) = (0.0, 0.0);
    let mut bins = vec![(0.0, 0.0, 0.0); 15];
    for (l, &y) in logits.iter().zip(labels) {
        let lp = log_softmax(l, t);
        let top = (0..lp.len()).fold(0, |b, i| if lp[i] > lp[b] { i } else { b });
        let c = lp[top].exp();
        let ok = if top == y { 1.0 } else { 0.0 };
        right += ok;
        nll -= lp[y];
        let b = ((c * 15.0).ceil() as usize).clamp(1, 15) - 1;
        bins[b].0 += 1.0;
        bins[b].1 += c;
        bins[b].2 += ok;
    }
    let ece = bins
        .iter()
        .filter(|b| b.0 > 0.0)
        .map(|b| b.0 / n * (b.2 / b.0 - b.1 / b.0).abs())
        .sum();
    (right / n, nll / n, ece)
}

#[test]
fn a_choice_task_is_calibrated_and_served() {
    let dir = common::fresh_dir("calibrated");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let examples = mmlu_examples(48);
    let mut body = registration("mmlu", examples.clone());
    body["x_coverage"] = json!(0.9);
    let id = register(&s, &body);

    // While it runs, decisions are served between its examples, and the
    // task itself is not ready: 409 naming the field.
    let running = wait_for(&s, &id, Duration::from_secs(120), |t| {
        t["progress"]["done"].as_u64().unwrap() >= 3
    });
    assert_eq!(running["status"], "running", "{running}");
    let state = examples[0]["state"].clone();
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"text": QUESTION, "options": ["A", "B", "C", "D"]}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let during = task(&s, &id);
    assert_eq!(
        during["status"], "running",
        "a decision waited for the whole registration: {during}"
    );
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"task": "mmlu"}]}),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(error_param(&r), "questions[0].task");
    assert_eq!(r.json()["error"]["code"], "task_not_ready");
    let p = &during["progress"];
    assert!(p["rate"].as_f64().unwrap() > 0.0 && p["eta_seconds"].as_f64().unwrap() >= 0.0);

    let ready = settled(&s, &id, Duration::from_secs(600));
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["progress"]["done"], 48);
    let result = &ready["result"];
    let t_fit = result["temperature"].as_f64().unwrap();
    let held: Vec<usize> = result["holdout_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(held.len(), 12);
    assert_eq!(result["holdout_examples"], 12);
    assert_eq!(result["fit_examples"], 36);

    // Every example's letter logits, read back through /v1/decide (the raw
    // letter log-probabilities differ from the logits by a constant).
    let letters = ["A", "B", "C", "D"];
    let mut logits = Vec::new();
    let mut labels = Vec::new();
    for e in &examples {
        let r = s.post_json(
            "/v1/decide",
            &json!({"state": e["state"], "questions": [{"text": QUESTION, "options": letters}]}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let lp = &r.json()["answers"][0]["letter_logprobs"];
        logits.push(
            letters
                .iter()
                .map(|l| lp[l].as_f64().unwrap())
                .collect::<Vec<f64>>(),
        );
        labels.push(letters.iter().position(|l| e["label"] == *l).unwrap());
    }

    // The letter-bias removal: each fit example was also read in its 3
    // other cyclic rotations; PriDe's prior from those reads, asked here
    // through /v1/decide with the options rotated, is the task's.
    let debias = &result["debias"];
    assert_eq!(debias["rotations"], 4, "{debias}");
    assert_eq!(ready["x_rotations"], 4);
    let mut prior = [0.0f64; 4];
    for (i, e) in examples.iter().enumerate() {
        if held.contains(&i) {
            continue;
        }
        let mut mean = [0.0f64; 4];
        for r in 0..4 {
            let rotated: Vec<&str> = (0..4).map(|p| letters[(p + r) % 4]).collect();
            let row = if r == 0 {
                logits[i].clone()
            } else {
                let d = s.post_json(
                    "/v1/decide",
                    &json!({"state": e["state"], "questions": [{"text": QUESTION, "options": rotated}]}),
                );
                let lp = &d.json()["answers"][0]["letter_logprobs"];
                letters.iter().map(|l| lp[l].as_f64().unwrap()).collect()
            };
            for (m, v) in mean.iter_mut().zip(log_softmax(&row, 1.0)) {
                *m += v / 4.0;
            }
        }
        for (p, v) in prior.iter_mut().zip(log_softmax(&mean, 1.0)) {
            *p += v.exp() / 36.0;
        }
    }
    let told: Vec<f64> = debias["prior"]
        .as_array()
        .unwrap_or_else(|| panic!("{debias}"))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (a, b) in told.iter().zip(&prior) {
        assert!((a - b).abs() < 1e-4, "prior {told:?} vs {prior:?}");
    }
    let bias: Vec<f64> = debias["bias"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(
        debias["kept"].is_null(),
        bias.iter().all(|&b| b == 0.0),
        "{debias}"
    );
    let rates = &result["letter_rates"];
    for key in ["labels", "before", "after"] {
        let sum: f64 = rates[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-9, "{rates}");
    }
    println!("letter bias: {debias}\nletter rates: {rates}");
    // The served logits: less the kept bias.
    let served_logits: Vec<Vec<f64>> = logits
        .iter()
        .map(|l| l.iter().zip(&bias).map(|(v, b)| v - b).collect())
        .collect();
    let pick = |keep: bool, logits: &[Vec<f64>]| -> (Vec<Vec<f64>>, Vec<usize>) {
        (0..examples.len())
            .filter(|i| held.contains(i) == keep)
            .map(|i| (logits[i].clone(), labels[i]))
            .unzip()
    };
    let (fit_l, fit_y) = pick(false, &served_logits);
    let (held_l, held_y) = pick(true, &served_logits);
    let (plain_l, _) = pick(true, &logits);

    // The fitted T minimises the NLL on the fit split (within its range).
    let nll = |t: f64| figures(&fit_l, &fit_y, t).1;
    for t in [t_fit * 1.05, t_fit / 1.05] {
        if (0.01..=100.0).contains(&t) {
            assert!(
                nll(t_fit) <= nll(t) + 1e-6,
                "NLL {} at the fitted T {t_fit} is above {} at {t}",
                nll(t_fit),
                nll(t)
            );
        }
    }
    assert!(nll(t_fit) <= nll(1.0) + 1e-6);

    // The holdout figures before (the plain readout at T = 1) and after
    // (as served: less the bias, at the fitted T).
    for (key, t, rows) in [("before", 1.0, &plain_l), ("after", t_fit, &held_l)] {
        let (acc, nll, ece) = figures(rows, &held_y, t);
        let f = &result[key];
        assert_eq!(f["temperature"].as_f64().unwrap(), t);
        assert!(
            (f["accuracy"].as_f64().unwrap() - acc).abs() < 1e-9,
            "{key} {f}"
        );
        assert!((f["nll"].as_f64().unwrap() - nll).abs() < 1e-4, "{key} {f}");
        assert!((f["ece"].as_f64().unwrap() - ece).abs() < 1e-4, "{key} {f}");
        let bins = f["reliability"].as_array().unwrap();
        assert_eq!(bins.len(), 15);
        let counted: u64 = bins.iter().map(|b| b["count"].as_u64().unwrap()).sum();
        assert_eq!(counted, 12);
    }
    println!(
        "T = {t_fit:.4}; holdout ECE {:.4} -> {:.4}, NLL {:.4} -> {:.4}",
        result["before"]["ece"],
        result["after"]["ece"],
        result["before"]["nll"],
        result["after"]["nll"]
    );

    // The threshold: the smallest holdout confidence whose answered
    // accuracy reaches 0.3, and its coverage.
    let pairs: Vec<(f64, bool)> = held_l
        .iter()
        .zip(&held_y)
        .map(|(l, &y)| {
            let lp = log_softmax(l, t_fit);
            let top = (0..4).fold(0, |b, i| if lp[i] > lp[b] { i } else { b });
            (lp[top].exp(), top == y)
        })
        .collect();
    let a = &result["abstention"];
    let mut want = None;
    let mut candidates: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    candidates.sort_by(f64::total_cmp);
    for c in candidates {
        let answered: Vec<bool> = pairs
            .iter()
            .filter(|p| p.0 >= c - 1e-6)
            .map(|p| p.1)
            .collect();
        let acc = answered.iter().filter(|&&ok| ok).count() as f64 / answered.len() as f64;
        if acc >= 0.3 {
            want = Some((c, answered.len() as f64 / 12.0));
            break;
        }
    }
    match want {
        Some((c, coverage)) => {
            assert!(
                (a["abstain_below"].as_f64().unwrap() - c).abs() < 1e-5,
                "{a}"
            );
            assert!(
                (a["coverage"].as_f64().unwrap() - coverage).abs() < 1e-9,
                "{a}"
            );
        }
        None => assert!(a["abstain_below"].is_null(), "{a}"),
    }

    // Prediction sets: the threshold is the ⌈13 · 0.9⌉ = 12th smallest of
    // the holdout's LAC scores (1 − p of the true option at the fitted T).
    let sets = &result["prediction_sets"];
    let mut scores: Vec<f64> = held_l
        .iter()
        .zip(&held_y)
        .map(|(l, &y)| 1.0 - log_softmax(l, t_fit)[y].exp())
        .collect();
    scores.sort_by(f64::total_cmp);
    let set_threshold = sets["threshold"].as_f64().unwrap();
    assert!(
        (set_threshold - scores[11]).abs() < 1e-5,
        "{sets} vs {scores:?}"
    );
    assert_eq!(
        (
            &sets["coverage"],
            &sets["score"],
            &sets["calibration_examples"]
        ),
        (&json!(0.9), &json!("lac"), &json!(12)),
        "{sets}"
    );
    assert!(sets["holdout_coverage"].as_f64().unwrap() >= 0.9, "{sets}");
    assert_eq!(ready["x_coverage"], 0.9);

    // Served by name: the fitted T, the task's threshold; the request's own
    // temperature and threshold come first.
    let by_task = |extra: Value| {
        let mut q = json!({"id": "t", "task": "mmlu"});
        q.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = s.post_json("/v1/decide", &json!({"state": state, "questions": [q]}));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["answers"][0].clone()
    };
    let served = by_task(json!({}));
    assert_eq!(served["temperature"].as_f64().unwrap() as f32, t_fit as f32);
    // The served set: every letter whose score passes the threshold.
    let check_set = |served: &Value| {
        let set: Vec<&str> = served["x_prediction_set"]
            .as_array()
            .unwrap_or_else(|| panic!("{served}"))
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for (letter, p) in served["probabilities"].as_object().unwrap() {
            let score = 1.0 - p.as_f64().unwrap();
            if (score - set_threshold).abs() > 1e-6 {
                assert_eq!(
                    set.contains(&letter.as_str()),
                    score < set_threshold,
                    "{served}"
                );
            }
        }
    };
    check_set(&served);
    let explicit = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"text": QUESTION, "options": letters, "temperature": t_fit}]}),
    );
    if debias["kept"].is_null() {
        assert_eq!(
            served["probabilities"],
            explicit.json()["answers"][0]["probabilities"]
        );
    }
    let want = log_softmax(&served_logits[0], t_fit);
    for (l, lp) in letters.iter().zip(&want) {
        let p = served["probabilities"][l].as_f64().unwrap();
        assert!((p - lp.exp()).abs() < 1e-5, "{served} vs {want:?}");
    }
    let top = served["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .fold(0.0, f64::max);
    if let Some(threshold) = a["abstain_below"].as_f64() {
        assert_eq!(served["abstained"], top < threshold, "{served}");
    }
    assert_eq!(by_task(json!({"temperature": 1.0}))["temperature"], 1.0);
    assert_eq!(by_task(json!({"abstain_below": 0.01}))["abstained"], false);
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"task": "mmlu", "options": ["x", "y"]}]}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(error_param(&r), "questions[0].options");

    // The chat surface names the task in its decisio object.
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": state}, {"role": "user", "content": QUESTION}],
                "decisio": {"task": "mmlu"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let chat = r.json()["decisio"]["answer"].clone();
    assert_eq!(chat["temperature"].as_f64().unwrap() as f32, t_fit as f32);
    // Its answer carries the task's prediction set, as /v1/decide's does.
    check_set(&chat);

    let list = get(&s, "/v1/tasks").json();
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        metric(
            &s,
            "decisio_task_registration_finished_total{outcome=\"ready\"}"
        ),
        1.0
    );
    assert_eq!(metric(&s, "decisio_task_registration_examples_total"), 48.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_registrations_are_refused_naming_the_field() {
    let dir = common::fresh_dir("bad");
    let s = Server::start(&[
        "--state-dir",
        dir.to_str().unwrap(),
        "--max-task-body-mb",
        "1",
    ]);
    let ex = |state: &str, label: &str| json!({"state": state, "label": label});
    let good = json!({
        "name": "yesno", "question": "Is the sky blue?", "options": ["yes", "no"],
        "examples": [ex("The sky is blue.", "yes"), ex("The sky is green.", "no"), ex("Blue sky.", "yes")]
    });
    let with = |patch: Value| {
        let mut b = good.clone();
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        b
    };
    let bad = |body: Value, param: &str| {
        let r = s.post_json("/v1/tasks", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(error_param(&r), param, "{body}");
    };
    bad(
        with(json!({"examples": [ex("a", "yes"), ex("b", "maybe")]})),
        "examples[1].label",
    );
    bad(
        with(json!({"examples": [ex("a", "yes"), ex("b", "yes")]})),
        "options[1]",
    );
    bad(with(json!({"options": ["yes"]})), "options");
    bad(with(json!({"options": ["yes", "no", "yes"]})), "options[2]");
    bad(with(json!({"options": null})), "options");
    bad(with(json!({"question": " "})), "question");
    bad(with(json!({"name": "no spaces"})), "name");
    // Taken as sent, as a decision names it and the description's pattern
    // has it: surrounding blanks are not trimmed away.
    bad(with(json!({"name": " yesno"})), "name");
    // Blank as the server trims (a lone no-break space), as the
    // description's pattern has it.
    bad(with(json!({"question": "\u{a0}"})), "question");
    bad(with(json!({"kind": "regression"})), "kind");
    bad(with(json!({"holdout": 1.0})), "holdout");
    // Rotations: 1 to the options' number (two here).
    bad(with(json!({"x_rotations": 3})), "x_rotations");
    bad(with(json!({"x_rotations": 0})), "x_rotations");
    bad(
        with(json!({"kind": "intent", "options": null, "labels": ["yes", "no"], "x_rotations": 2})),
        "x_rotations",
    );
    // Prediction sets: a coverage in (0, 1), a known score, and a holdout
    // that can calibrate them (one held-out example of three here; 0.9
    // needs 9).
    bad(with(json!({"x_coverage": 0.9})), "x_coverage");
    bad(with(json!({"x_coverage": 1.0})), "x_coverage");
    bad(
        with(json!({"x_coverage": 0.5, "x_conformal_score": "raps"})),
        "x_conformal_score",
    );
    bad(
        with(json!({"x_conformal_score": "aps"})),
        "x_conformal_score",
    );
    bad(with(json!({"seed": -1})), "seed");
    bad(with(json!({"examples": [ex("a", "yes")]})), "examples");
    bad(
        with(json!({"examples": [ex(" ", "yes"), ex("b", "no")]})),
        "examples[0].state",
    );
    bad(
        with(json!({"examples": [ex("a", "yes"), ex("\u{a0}", "no")]})),
        "examples[1].state",
    );
    bad(
        with(json!({"abstention": {"target_accuracy": 0.9, "abstain_below": 0.5}})),
        "abstention",
    );
    bad(
        with(json!({"abstention": {"target_accuracy": 1.5}})),
        "abstention.target_accuracy",
    );
    bad(with(json!({"surprise": 1})), "surprise");
    bad(with(json!({"head": {"layer": -1}})), "head");
    bad(with(json!({"draws": 2, "shots": 3})), "draws");
    // An oversize body is 413, in the same error shape.
    let big = with(json!({"question": "x".repeat(1_200_000)}));
    let r = s.post_json("/v1/tasks", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "request_too_large");

    // A long registration runs; the next one waits behind it, queued.
    let first = register(&s, &registration("mmlu", mmlu_examples(40)));
    let second = register(&s, &good);
    // A name taken is a conflict with what the server holds: 409.
    let r = s.post_json("/v1/tasks", &good);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "task_exists");
    assert_eq!(error_param(&r), "name");
    let queued = task(&s, &second);
    assert_eq!(queued["status"], "queued", "{queued}");
    let asks = |name: &str| {
        s.post_json(
            "/v1/decide",
            &json!({"state": "The sky is blue.", "questions": [{"task": name}]}),
        )
    };
    let r = asks("yesno");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queued"));
    // A task no registration has is not found, as a model would be.
    let r = asks("unknown");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "task_not_found");
    assert_eq!(error_param(&r), "questions[0].task");

    // DELETE removes a task, cancelling a pending registration first.
    let delete = |id: &str| {
        let r = s
            .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert_eq!(
        delete(&second),
        json!({"id": second, "object": "task.deleted", "deleted": true, "cancelled": true})
    );
    assert_eq!(asks("yesno").status, 404);
    assert_eq!(get(&s, &format!("/v1/tasks/{second}")).status, 404);
    assert!(!dir.join(format!("tasks/{second}.json")).exists());
    // The running one stops between two examples.
    let running = wait_for(&s, &first, Duration::from_secs(120), |t| {
        t["progress"]["done"].as_u64().unwrap() >= 1
    });
    assert_eq!(running["status"], "running");
    let scored = || metric(&s, "decisio_task_registration_examples_total");
    assert_eq!(delete(&first)["cancelled"], true);
    let scored_at_delete = scored();
    assert_eq!(
        metric(
            &s,
            "decisio_task_registration_finished_total{outcome=\"cancelled\"}"
        ),
        2.0
    );
    // An example that does not fit the context fails the registration,
    // which names it.
    let long = "word ".repeat(9000);
    let failing = register(
        &s,
        &with(json!({"name": "toolong", "examples": [ex("short", "yes"), ex(&long, "no")]})),
    );
    let failed = wait_for(&s, &failing, Duration::from_secs(120), |t| {
        t["status"] != "queued" && t["status"] != "running"
    });
    assert_eq!(failed["status"], "failed", "{failed}");
    // Registrations run one at a time: the worker took the next one, so it
    // has left the deleted one, which stopped short of its 40 examples (at
    // most the one in hand when it was deleted was scored after), and left
    // none of its files behind.
    assert_eq!(get(&s, &format!("/v1/tasks/{first}")).status, 404);
    assert!(scored() <= scored_at_delete + 2.0, "{}", scored());
    assert!(scored_at_delete < 40.0);
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("tasks"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(first.as_str()))
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(
        failed["error"].as_str().unwrap().contains("examples[1]"),
        "{failed}"
    );
    let r = asks("toolong");
    assert_eq!(r.status, 409);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("failed"));
    assert_eq!(
        metric(
            &s,
            "decisio_task_registration_finished_total{outcome=\"failed\"}"
        ),
        1.0
    );
    assert_eq!(get(&s, "/v1/tasks/task-none").status, 404);
    let r = s.request("PUT", "/v1/tasks", &[], None).unwrap();
    assert_eq!(r.status, 405);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file of the state folder is whole JSON (a `.jsonl` file, whole
/// lines of JSON), its folders' too.
fn check_files(dir: &Path) {
    check_folder(&dir.join("tasks"));
}

fn check_folder(folder: &Path) {
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            check_folder(&path);
            continue;
        }
        if name.starts_with('.') {
            continue; // a temporary file, removed at the next start
        }
        let bytes = std::fs::read(&path).unwrap();
        let parts: Vec<&[u8]> = if name.ends_with(".jsonl") {
            bytes
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .collect()
        } else {
            vec![&bytes]
        };
        for part in parts {
            serde_json::from_slice::<Value>(part)
                .unwrap_or_else(|e| panic!("{name} is not whole JSON after a kill: {e}"));
        }
    }
}

#[test]
fn a_killed_registration_resumes_after_a_restart() {
    let dir = common::fresh_dir("killed");
    let args = ["--state-dir", dir.to_str().unwrap()];
    let mut s = Server::start(&args);
    let id = register(&s, &registration("mmlu", mmlu_examples(40)));
    // Once the task's file says 8 examples are done (the file and the
    // checkpoint are written together, the checkpoint first), killed.
    let file = dir.join(format!("tasks/{id}.json"));
    let start = Instant::now();
    let saved = loop {
        let record: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let done = record["progress"]["done"].as_u64().unwrap();
        if done >= 8 {
            break done;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{record}");
        std::thread::sleep(Duration::from_millis(50));
    };
    s.kill();
    check_files(&dir);
    assert!(dir.join(format!("tasks/{id}.scores.json")).exists());

    let mut s = Server::start(&args);
    let resumed = task(&s, &id);
    assert!(
        resumed["status"] == "queued" || resumed["status"] == "running",
        "{resumed}"
    );
    assert_eq!(resumed["progress"]["restarts"], 1);
    let ready = wait_for(&s, &id, Duration::from_secs(600), |t| {
        t["status"] == "ready"
    });
    let from = ready["progress"]["resumed_from"].as_u64().unwrap();
    assert!(
        from >= saved,
        "resumed from {from}, not from its checkpoint ({saved} saved): {ready}"
    );
    assert_eq!(ready["progress"]["done"], 40);
    // The record says ready first (a crash between keeps the checkpoint,
    // never loses it), then the checkpoint goes: looked for a while.
    let checkpoint = dir.join(format!("tasks/{id}.scores.json"));
    common::wait_until(
        "the checkpoint goes after the fit",
        Duration::from_secs(30),
        || !checkpoint.exists(),
    );
    s.kill();

    // A ready task survives a restart as it was, and serves.
    let s = Server::start(&args);
    let again = task(&s, &id);
    assert_eq!(again["status"], "ready");
    assert_eq!(again["result"], ready["result"]);
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": "What is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 6", "questions": [{"task": "mmlu"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["answers"][0]["temperature"].as_f64().unwrap() as f32,
        ready["result"]["temperature"].as_f64().unwrap() as f32
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_state_folder_of_another_format_is_refused() {
    let dir = common::fresh_dir("format");
    std::fs::create_dir_all(dir.join("tasks")).unwrap();
    std::fs::write(
        dir.join("tasks/task-old.json"),
        r#"{"format_version": 99, "id": "task-old"}"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--model"])
        .arg(common::model_dir())
        .args(["--port", "1", "--state-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("task format 99") && stderr.contains("reads format 1"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_register_command_shows_progress_and_the_figures() {
    let dir = common::fresh_dir("cli");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let file = dir.join("task.json");
    std::fs::write(&file, registration("cli", mmlu_examples(16)).to_string()).unwrap();
    let url = format!("http://127.0.0.1:{}", s.port);
    let register = |file: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
            .arg("register")
            .arg(file)
            .args(["--server", &url, "--interval", "0.2"])
            .output()
            .unwrap()
    };
    let out = register(&file);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("ready 16/16"), "{stderr}");
    let t = get(&s, "/v1/tasks").json()["data"][0].clone();
    let want = format!("T = {:.4}", t["result"]["temperature"].as_f64().unwrap());
    assert!(stdout.contains(&want), "{stdout}");
    for line in ["before", "after"] {
        assert!(stdout.contains(line), "no `{line}` in {stdout}");
    }
    assert!(
        stdout.contains("abstain below") || stdout.contains("is not reached"),
        "{stdout}"
    );
    // A refused registration (the name is taken: a conflict) fails and
    // says which field.
    let out = register(&file);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("409 (name)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_state_folder_serves_one_server_at_a_time() {
    let dir = common::fresh_dir("locked");
    let mut s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
        .args(["serve", "--model"])
        .arg(common::model_dir())
        .args(["--port", "1", "--state-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("in use by another decisio server"),
        "{stderr}"
    );
    // The lock goes with the process, however it ends.
    s.kill();
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    assert_eq!(get(&s, "/v1/tasks").status, 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MMLU subjects, in order of first appearance, and `per` questions of
/// each (the first ones), each a state labelled with its subject.
fn mmlu_subjects(per: usize) -> (Vec<String>, Vec<Value>) {
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    let mut subjects: Vec<String> = Vec::new();
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    let mut examples = Vec::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let topic = r["topic"].as_str().unwrap().to_string();
        if !subjects.contains(&topic) {
            subjects.push(topic.clone());
        }
        let c = counts.entry(topic.clone()).or_default();
        if *c < per {
            *c += 1;
            examples.push(json!({"state": r["question"], "label": topic}));
        }
    }
    (subjects, examples)
}

const SUBJECT_QUESTION: &str = "Which subject is this question from?";

/// Serves `state` on task `name`; the answer object.
fn ask_task(s: &Server, name: &str, state: &str) -> Value {
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"task": name}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["answers"][0].clone()
}

#[test]
fn an_intent_task_over_mmlu_subjects_is_fitted_persisted_and_served() {
    let dir = common::fresh_dir("intent");
    let args = ["--state-dir", dir.to_str().unwrap()];
    let mut s = Server::start(&args);
    let (subjects, examples) = mmlu_subjects(5);
    assert_eq!(subjects.len(), 57);
    let body = json!({
        "name": "subject", "kind": "intent", "question": SUBJECT_QUESTION,
        "labels": subjects, "examples": examples, "holdout": 0.4, "seed": 5,
        "head": {"layer": -1}, "draws": 2, "shots": 2,
        "abstention": {"abstain_below": 0.05}
    });
    let started = Instant::now();
    let id = register(&s, &body);
    let t = settled(&s, &id, Duration::from_secs(900));
    assert_eq!(t["status"], "ready", "{t}");
    eprintln!(
        "57-subject intent task: {} examples registered in {:.1} s",
        examples.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(t["labels"].as_array().unwrap().len(), 57);
    assert!(t.get("options").is_none());
    assert_eq!(t["head"]["layer"], -1);
    let r = &t["result"];
    assert_eq!(r["fit_examples"], 57 * 3);
    assert_eq!(r["holdout_examples"], 57 * 2);
    assert_eq!(r["head"]["dim"], 576);
    assert_eq!(r["head"]["cross_validation"].as_array().unwrap().len(), 5);
    let after = r["after"]["accuracy"].as_f64().unwrap();
    eprintln!(
        "holdout accuracy {after:.4}, ECE {:.4} -> {:.4}; draws {}",
        r["before"]["ece"], r["after"]["ece"], r["draws"]
    );
    // Chance is 1/57 (0.018).
    assert!(
        after >= 0.15,
        "holdout accuracy {after} is not clearly above chance"
    );
    let d = &r["draws"];
    assert_eq!(d["per_draw"].as_array().unwrap().len(), 2);
    assert!(d["accuracy_mean"].as_f64().unwrap() > 2.0 / 57.0, "{d}");
    assert!(d["accuracy_sd"].as_f64().unwrap() >= 0.0);
    assert!(dir.join(format!("tasks/{id}.head.json")).exists());

    // Served: the head on the decision's own hidden state gives, on the
    // holdout, exactly the registration's accuracy.
    let held: Vec<usize> = r["holdout_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    // The temperature was fitted on one of each subject's 3 fit examples,
    // none of them held out; the head on the other 2 (a draw of 2 shots:
    // 1 and 1).
    let calibration: Vec<usize> = r["head"]["calibration_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(calibration.len(), 57);
    assert_eq!(r["head"]["head_examples"], 57 * 2);
    assert!(calibration.iter().all(|i| !held.contains(i)));
    let mut subjects_seen: Vec<&str> = calibration
        .iter()
        .map(|&i| examples[i]["label"].as_str().unwrap())
        .collect();
    subjects_seen.sort_unstable();
    subjects_seen.dedup();
    assert_eq!(subjects_seen.len(), 57);
    assert!(d["per_draw"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["calibration_examples"] == 57));
    let mut right = 0;
    let mut answers = Vec::new();
    for &i in &held {
        let e = &examples[i];
        let a = ask_task(&s, "subject", e["state"].as_str().unwrap());
        assert!(a["letter"].is_null());
        assert!(a["letter_logprobs"].as_object().unwrap().is_empty());
        let p = a["probabilities"].as_object().unwrap();
        assert_eq!(p.len(), 57);
        let sum: f64 = p.values().map(|v| v.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-3, "{sum}");
        let (best, _) = p
            .iter()
            .max_by(|x, y| x.1.as_f64().unwrap().total_cmp(&y.1.as_f64().unwrap()))
            .unwrap();
        if !a["abstained"].as_bool().unwrap() {
            assert_eq!(a["label"], a["option"]);
            assert_eq!(a["label"].as_str().unwrap(), best);
        }
        if best == e["label"].as_str().unwrap() {
            right += 1;
        }
        answers.push(a);
    }
    assert_eq!(right as f64 / held.len() as f64, after);
    // The chat surface answers with the label.
    let state = examples[held[0]]["state"].as_str().unwrap();
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": state},
                             {"role": "user", "content": "?"}],
                "decisio": {"task": "subject", "abstain_below": 0.001}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let c = r.json();
    assert_eq!(
        c["choices"][0]["message"]["content"],
        c["decisio"]["answer"]["label"]
    );
    let top = &c["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
    assert_eq!(top.as_array().unwrap().len(), 20);

    // A second head on a block's output, in the same folder.
    let ex = |state: &str, label: &str| json!({"state": state, "label": label});
    let small = json!({
        "name": "mood", "kind": "intent", "question": "How does the writer feel?",
        "labels": ["happy", "sad"], "head": {"layer": 10}, "holdout": 0.25,
        "examples": [ex("What a lovely day, I am delighted.", "happy"),
                     ex("I won the prize and I am thrilled!", "happy"),
                     ex("Best news ever, so glad.", "happy"),
                     ex("Great food and great friends tonight.", "happy"),
                     ex("My dog died and I cannot stop crying.", "sad"),
                     ex("I lost my job today; everything is grey.", "sad"),
                     ex("Nobody came to my party.", "sad"),
                     ex("I miss her so much it hurts.", "sad")]
    });
    let mood = register(&s, &small);
    let m = wait_for(&s, &mood, Duration::from_secs(120), |t| {
        t["status"] != "queued" && t["status"] != "running"
    });
    assert_eq!(m["status"], "ready", "{m}");
    assert_eq!(m["result"]["head"]["layer"], 10);
    let a = ask_task(&s, "mood", "I am so happy today!");
    assert_eq!(a["probabilities"].as_object().unwrap().len(), 2);
    // Heads of other layers in one request are refused, naming the question.
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": "Hello.", "questions": [{"task": "subject"}, {"task": "mood"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_param(&r), "questions[1].task");

    // Bad intent registrations name the field.
    let bad = |patch: Value, param: &str| {
        let mut b = small.clone();
        b["name"] = json!("bad");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        let r = s.post_json("/v1/tasks", &b);
        assert_eq!(r.status, 400, "{b}: {}", r.text());
        assert_eq!(error_param(&r), param, "{b}");
    };
    bad(json!({"head": {"layer": 30}}), "head.layer");
    bad(json!({"head": {"layer": -2}}), "head.layer");
    bad(json!({"labels": ["happy"]}), "labels");
    bad(json!({"labels": ["happy", "sad", "happy"]}), "labels[2]");
    bad(json!({"labels": ["happy", "sad", "calm"]}), "labels[2]");
    bad(json!({"labels": null}), "labels");
    bad(json!({"options": ["a", "b"]}), "options");
    bad(json!({"draws": 3}), "shots");
    bad(json!({"draws": 0, "shots": 2}), "draws");
    bad(
        json!({"kind": "choice", "options": ["a", "b"], "labels": null}),
        "head",
    );
    let mut many = small.clone();
    many["name"] = json!("many");
    many["labels"] = json!((0..1001).map(|i| format!("l{i}")).collect::<Vec<_>>());
    let r = s.post_json("/v1/tasks", &many);
    assert_eq!(r.status, 400);
    assert_eq!(error_param(&r), "labels");

    // A restart keeps both heads, and they answer as before.
    s.kill();
    let s = Server::start(&args);
    let again = task(&s, &id);
    assert_eq!(again["status"], "ready");
    assert_eq!(again["result"], t["result"]);
    for (a, &i) in answers.iter().zip(&held).take(5) {
        let b = ask_task(&s, "subject", examples[i]["state"].as_str().unwrap());
        assert_eq!(a["probabilities"], b["probabilities"]);
        assert_eq!(a["label"], b["label"]);
    }
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn intent_data_sets_register_as_published() {
    let dir = common::fresh_dir("formats");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let url = format!("http://127.0.0.1:{}", s.port);
    // BANKING77's CSV: a header, quoted texts with commas.
    let csv = dir.join("banking77.csv");
    std::fs::write(
        &csv,
        "text,label\n\
         I am still waiting on my card?,card_arrival\n\
         \"What can I do if my card still hasn't arrived after 2 weeks?\",card_arrival\n\
         \"My card has not arrived yet, where is it?\",card_arrival\n\
         How long does a card take to arrive?,card_arrival\n\
         What is the exchange rate?,exchange_rate\n\
         \"How are the exchange rates calculated, exactly?\",exchange_rate\n\
         Which exchange rate do you use?,exchange_rate\n\
         \"Is the exchange rate \"\"fair\"\"?\",exchange_rate\n",
    )
    .unwrap();
    // clinc_oos's JSON.
    let clinc = dir.join("data_full.json");
    std::fs::write(
        &clinc,
        json!({
            "train": [["what is the weather like today", "weather"],
                      ["will it rain tomorrow", "weather"],
                      ["is it sunny outside", "weather"],
                      ["set an alarm for 7 am", "alarm"],
                      ["wake me up at six", "alarm"],
                      ["please set my alarm", "alarm"]],
            "val": [["how hot is it", "weather"], ["alarm for noon", "alarm"]],
            "test": [], "oos_train": [["how do i bake bread", "oos"]],
            "oos_val": [], "oos_test": []
        })
        .to_string(),
    )
    .unwrap();
    let register = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_decisio"))
            .arg("register")
            .args(extra)
            .args(["--server", &url, "--interval", "0.2"])
            .output()
            .unwrap()
    };
    let body = register(&[
        csv.to_str().unwrap(),
        "--format",
        "csv",
        "--name",
        "banking",
        "--print-body",
    ]);
    assert!(body.status.success());
    let b: Value = serde_json::from_slice(&body.stdout).unwrap();
    assert_eq!(b["labels"], json!(["card_arrival", "exchange_rate"]));
    assert_eq!(b["examples"].as_array().unwrap().len(), 8);
    assert_eq!(b["examples"][7]["state"], "Is the exchange rate \"fair\"?");
    assert_eq!(
        b["examples"][2]["state"],
        "My card has not arrived yet, where is it?"
    );
    let out = register(&[
        csv.to_str().unwrap(),
        "--format",
        "csv",
        "--name",
        "banking",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("intent head: layer -1"), "{stdout}");
    let out = register(&[
        clinc.to_str().unwrap(),
        "--format",
        "clinc",
        "--split",
        "train,val",
        "--name",
        "clinc",
        "--question",
        "What does the user want?",
        "--layer",
        "-1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = get(&s, "/v1/tasks").json();
    let clinc_task = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "clinc")
        .unwrap()
        .clone();
    assert_eq!(clinc_task["labels"], json!(["weather", "alarm"]));
    assert_eq!(clinc_task["examples"], 8);
    let a = ask_task(&s, "clinc", "wake me at 5");
    assert_eq!(a["probabilities"].as_object().unwrap().len(), 2);
    // A part the file does not have is named.
    let out = register(&[
        clinc.to_str().unwrap(),
        "--format",
        "clinc",
        "--split",
        "dev",
        "--name",
        "x",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no part `dev`"));
    // A CSV without the columns is refused before anything is sent.
    std::fs::write(&csv, "sentence,intent\nhello,greet\n").unwrap();
    let out = register(&[csv.to_str().unwrap(), "--format", "csv", "--name", "y"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`text` and `label`"));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The System One question the wire task below is registered from.
fn wire_question(descriptions: [&str; 4]) -> Value {
    let criteria: serde_json::Map<String, Value> = ["A", "B", "C", "D"]
        .iter()
        .zip(descriptions)
        .map(|(k, d)| (k.to_string(), json!(d)))
        .collect();
    json!({"type": "choice", "instructions": QUESTION, "criteria": criteria})
}

/// Asks `questions` about `state` on `/v1/systemone`; the answers by id.
fn ask_wire(s: &Server, state: &Value, questions: Value) -> Value {
    let r = s.post_json(
        "/v1/systemone",
        &json!({"state": state, "questions": questions}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["answers"].clone()
}

fn probabilities(answer: &Value) -> Vec<f64> {
    answer["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

#[test]
fn a_systemone_task_applies_to_the_wire_questions_of_its_identity() {
    let dir = common::fresh_dir("wire-task");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let examples = mmlu_examples(24);
    let options = ["the first", "the second", "the third", "the fourth"];
    let body = json!({
        "name": "mmlu-wire", "systemone": wire_question(options), "examples": examples,
        "holdout": 0.25, "seed": 3, "abstention": {"abstain_below": 0.4},
        "x_coverage": 0.8, "x_conformal_score": "aps"
    });
    let id = register(&s, &body);
    let t = settled(&s, &id, Duration::from_secs(600));
    assert_eq!(t["status"], "ready", "{t}");
    assert_eq!(t["systemone"], wire_question(options));
    assert_eq!(t["keys"], json!(["A", "B", "C", "D"]));
    assert_eq!(t["options"], json!(options));
    let fitted = t["result"]["temperature"].as_f64().unwrap();

    // The same question matches whatever its id and whatever else the
    // request asks; options in another order, or described otherwise, do
    // not, and keep the base's temperature (1.370 on the fixture).
    let mut reordered = wire_question(options);
    let criteria = reordered["criteria"].as_object().unwrap().clone();
    reordered["criteria"] = Value::Object(criteria.into_iter().rev().collect());
    let questions = json!({
        "asked": wire_question(options),
        "reordered": reordered,
        "described": wire_question(["first", "second", "third", "fourth"]),
    });
    let state = &examples[5]["state"];
    let tasked = ask_wire(&s, state, questions.clone());
    let a = &tasked["asked"];
    assert_eq!(a["x_task"], "mmlu-wire", "{tasked}");
    assert!((a["x_temperature"].as_f64().unwrap() - fitted).abs() < 1e-6 * fitted);
    let p = probabilities(a);
    let top = p.iter().copied().fold(f64::MIN, f64::max);
    assert_eq!(a["x_abstained"], json!(top < 0.4), "{a}");
    // Its prediction set (APS): the options whose mass of options at least
    // as probable passes the threshold fitted on the 6 held-out examples.
    let sets = &t["result"]["prediction_sets"];
    assert_eq!(
        (&sets["score"], &sets["calibration_examples"]),
        (&json!("aps"), &json!(6))
    );
    let threshold = sets["threshold"].as_f64().unwrap();
    let keys: Vec<String> = a["probabilities"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let want: Vec<&String> = (0..p.len())
        .filter(|&j| p.iter().filter(|&&q| q >= p[j]).sum::<f64>() <= threshold)
        .map(|j| &keys[j])
        .collect();
    assert_eq!(a["x_prediction_set"], json!(want), "{a}");
    for other in ["reordered", "described"] {
        let o = &tasked[other];
        assert!(
            o.get("x_task").is_none()
                && o.get("x_abstained").is_none()
                && o.get("x_prediction_set").is_none(),
            "{o}"
        );
        assert_eq!(o["x_temperature"], 1.37, "{o}");
    }
    // Alone, it is answered the same bits.
    let alone = ask_wire(&s, state, json!({"q": wire_question(options)}));
    assert_eq!(alone["q"], *a);

    // Deleted, the question is the base's again: its probabilities are the
    // task's raised to the ratio of the temperatures, renormalised.
    let r = s
        .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let plain = ask_wire(&s, state, json!({"asked": wire_question(options)}));
    let b = &plain["asked"];
    assert!(b.get("x_task").is_none(), "{b}");
    assert_eq!(b["x_temperature"], 1.37);
    let base = probabilities(b);
    let powered: Vec<f64> = base.iter().map(|q| q.powf(1.37 / fitted)).collect();
    let total: f64 = powered.iter().sum();
    for (want, got) in powered.iter().map(|v| v / total).zip(&p) {
        assert!((want - got).abs() < 1e-5, "{base:?} at {fitted} vs {p:?}");
    }

    // A wire task is the wire's: /v1/decide does not ask it by name.
    let body =
        json!({"name": "w2", "systemone": wire_question(options), "examples": mmlu_examples(8)});
    let id = register(&s, &body);
    wait_for(&s, &id, Duration::from_secs(600), |t| {
        t["status"] == "ready"
    });
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": "x", "questions": [{"task": "w2"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("POST /v1/systemone"), "{}", r.text());
}

#[test]
fn a_systemone_task_is_fitted_on_labels_summed_over_their_forms() {
    // Served in the Gemma bases' format (every form of a label read and
    // summed), a wire task is fitted on one logit a label, as its answers
    // read them: the task's probabilities are the base's raised to the
    // ratio of the temperatures, renormalised.
    let dir = common::fresh_dir("wire-task-gemma");
    let s = Server::start(&[
        "--state-dir",
        dir.to_str().unwrap(),
        "--answer-slot",
        "template",
        "--label-variants",
        "summed",
        "--system-prompt",
        "true",
    ]);
    let options = ["the first", "the second", "the third", "the fourth"];
    let examples = mmlu_examples(12);
    let body = json!({"name": "summed", "systemone": wire_question(options),
                      "examples": examples, "holdout": 0.25, "seed": 3});
    let id = register(&s, &body);
    let t = settled(&s, &id, Duration::from_secs(600));
    assert_eq!(t["status"], "ready", "{t}");
    let fitted = t["result"]["temperature"].as_f64().unwrap();
    let state = &examples[5]["state"];
    let tasked = ask_wire(&s, state, json!({"q": wire_question(options)}));
    assert_eq!(tasked["q"]["x_task"], "summed", "{tasked}");
    let p = probabilities(&tasked["q"]);
    let r = s
        .request("DELETE", &format!("/v1/tasks/{id}"), &[], None)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let base = probabilities(&ask_wire(&s, state, json!({"q": wire_question(options)}))["q"]);
    let powered: Vec<f64> = base.iter().map(|q| q.powf(1.37 / fitted)).collect();
    let total: f64 = powered.iter().sum();
    for (want, got) in powered.iter().map(|v| v / total).zip(&p) {
        assert!((want - got).abs() < 1e-5, "{base:?} at {fitted} vs {p:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn systemone_registrations_are_refused_naming_the_field() {
    let dir = common::fresh_dir("wire-bad");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    let q = wire_question(["a", "b", "c", "d"]);
    let two = vec![
        json!({"state": "s", "label": "A"}),
        json!({"state": "t", "label": "B"}),
    ];
    let cases = [
        (
            json!({"name": "x", "systemone": q, "question": "Q?", "examples": two}),
            "question",
        ),
        (
            json!({"name": "x", "systemone": q, "options": ["a", "b"], "examples": two}),
            "options",
        ),
        (
            json!({"name": "x", "systemone": {"type": "choice", "criteria": {"a": "1"}}, "examples": two}),
            "systemone.criteria",
        ),
        (
            json!({"name": "x", "systemone": {"type": "maybe"}, "examples": two}),
            "systemone.type",
        ),
        (
            json!({"name": "x", "systemone": q, "examples": [{"state": "s", "label": "a"}, {"state": "t", "label": "B"}]}),
            "examples[0].label",
        ),
        (
            json!({"name": "x", "systemone": q, "examples": two}),
            "examples",
        ),
        (
            json!({"name": "x", "systemone": q, "examples": [{"state": 3, "label": "A"}, {"state": "t", "label": "B"}]}),
            "examples[0].state",
        ),
        (
            json!({"name": "x", "kind": "intent", "systemone": q, "examples": two}),
            "kind",
        ),
        (json!({"name": "x", "examples": two}), "question"),
    ];
    for (body, param) in cases {
        let r = s.post_json("/v1/tasks", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(error_param(&r), param, "{body}: {}", r.text());
    }
    // A state may be an object, shown as the wire shows it; a yes/no task's
    // answers are `yes` and `no`.
    let body = json!({"name": "refund", "systemone": {"type": "noul", "instructions": "Refund?"},
        "examples": [{"state": {"message": "give my money back"}, "label": "yes"},
                     {"state": {"message": "thanks, all good"}, "label": "no"}]});
    let id = register(&s, &body);
    let t = settled(&s, &id, Duration::from_secs(300));
    assert_eq!(t["status"], "ready", "{t}");
    assert_eq!(t["keys"], json!(["no", "yes"]));
    let answers = ask_wire(
        &s,
        &json!({"message": "refund please"}),
        json!({"r": {"type": "noul", "instructions": "Refund?"}}),
    );
    assert_eq!(answers["r"]["x_task"], "refund", "{answers}");
    assert!(answers["r"]["noul"].as_f64().unwrap() > 0.0);
}

/// `n` MMLU questions, each its own label (`item_0`..): an intent set of
/// `n` labels, each with two wordings of its question.
fn own_labels(n: usize) -> (serde_json::Map<String, Value>, Vec<Value>) {
    let text = std::fs::read_to_string(common::asset("mmlu.jsonl")).unwrap();
    let mut criteria = serde_json::Map::new();
    let mut examples = Vec::new();
    for (i, line) in text.lines().step_by(7).take(n).enumerate() {
        let r: Value = serde_json::from_str(line).unwrap();
        let question = r["question"].as_str().unwrap();
        // Keys alone (no descriptions): each of the 2n examples is read
        // through the whole n-option question, so its lines are kept short.
        let key = format!("item_{i}");
        criteria.insert(key.clone(), Value::Null);
        examples.push(json!({"state": question, "label": key}));
        examples.push(json!({"state": format!("Exam question: {question}"), "label": key}));
    }
    (criteria, examples)
}

#[test]
fn an_intent_task_answers_a_systemone_choice_of_over_a_hundred_options() {
    let dir = common::fresh_dir("wire-intent");
    let s = Server::start(&["--state-dir", dir.to_str().unwrap()]);
    // 101 labels: over a hundred, each example read through all of them.
    let (criteria, examples) = own_labels(101);
    let question = json!({"type": "choice", "instructions": "Which exam item is this?",
                          "criteria": criteria});
    let body = json!({"name": "items", "kind": "intent", "systemone": question,
                      "examples": examples, "holdout": 0.2, "seed": 1});
    let started = Instant::now();
    let id = register(&s, &body);
    let t = settled(&s, &id, Duration::from_secs(900));
    assert_eq!(t["status"], "ready", "{t}");
    eprintln!(
        "101-label wire intent task: {} examples in {:.1} s",
        examples.len(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        t["result"]["head"]["head_examples"].as_u64().unwrap() > 0,
        "{t}"
    );
    // Answered by the head over the 101 keys in the order sent (the
    // head's quality is `an_intent_task_over_mmlu_subjects_...`'s to show:
    // a wire intent task is read as one on /v1/decide is).
    let keys: Vec<&String> = criteria.keys().collect();
    for i in [0usize, 50, 100] {
        let state = &examples[2 * i]["state"];
        let answers = ask_wire(&s, state, json!({"which": question}));
        let a = &answers["which"];
        assert_eq!(a["x_task"], "items", "{a}");
        let p = a["probabilities"].as_object().unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), keys);
        let total: f64 = p.values().map(|v| v.as_f64().unwrap()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        let best = p
            .iter()
            .max_by(|x, y| x.1.as_f64().partial_cmp(&y.1.as_f64()).unwrap())
            .unwrap()
            .0;
        assert_eq!(&a["choice"], best);
    }
}
