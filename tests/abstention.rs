//! Abstention tasks (`/v1/abstention/tasks`) on a real server with the
//! fixture model: a task registered in the reference decisio's own request
//! form with a declared "can't tell" key, its fit recomputed from the
//! examples' probabilities read back through `/v1/systemone`, the decision
//! on later questions of its option set (and, by keys, of its keys), both
//! sides of the threshold through an import, persistence across a restart,
//! the refusals and the removal.

mod common;

use common::Server;
use decisio::stats::abstain::{self, Scored};
use serde_json::{json, Value};

/// The question every example asks: which city a message is about, with a
/// declared key for a message that names none.
fn question(unsure: &str) -> Value {
    json!({"type": "choice", "instructions": "Which city is the customer writing about?",
           "criteria": {"paris": "Paris, France", "london": "London, England", "unsure": unsure}})
}

const UNSURE: &str = "the message names no city";

/// Twelve labelled messages: four of each city and four that name none.
fn examples() -> Vec<(String, Value)> {
    let cases = [
        ("My hotel in Paris lost my booking.", json!("paris")),
        ("The Eiffel Tower tour was cancelled.", json!("paris")),
        (
            "Our flight to Paris Charles de Gaulle was late.",
            json!("paris"),
        ),
        ("The Louvre tickets never arrived.", json!("paris")),
        ("My London hotel overcharged me.", json!("london")),
        ("The Tower Bridge tour was cancelled.", json!("london")),
        (
            "Our train to London King's Cross was late.",
            json!("london"),
        ),
        ("The British Museum tickets never arrived.", json!("london")),
        ("I want to change my password.", Value::Null),
        ("Your app keeps crashing on my phone.", Value::Null),
        ("Please send me the invoice again.", Value::Null),
        ("How do I cancel my subscription?", json!("unsure")),
    ];
    cases.into_iter().map(|(m, a)| (m.to_string(), a)).collect()
}

fn request(message: &str, q: Value) -> Value {
    json!({"state": {"message": message}, "questions": {"city": q}})
}

fn registration(id: &str) -> Value {
    json!({
        "id": id, "option": {"key": "unsure"}, "match": "option_set",
        "examples": examples().iter().map(|(m, a)| json!({"request": request(m, question(UNSURE)), "answer": a}))
            .collect::<Vec<_>>()
    })
}

fn ask(s: &Server, message: &str, q: Value) -> Value {
    let r = s.post_json("/v1/systemone", &request(message, q));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["answers"]["city"].clone()
}

fn probabilities(a: &Value) -> Vec<f64> {
    ["paris", "london", "unsure"]
        .iter()
        .map(|k| a["probabilities"][k].as_f64().unwrap())
        .collect()
}

fn param(r: &common::Response) -> String {
    r.json()["error"]["param"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// What the task decides on an answer, from its probabilities.
fn expected(a: &Value, threshold: Option<f64>) -> (bool, &'static str) {
    let keys = ["paris", "london", "unsure"];
    let (abstained, best) = abstain::decide(&probabilities(a), 2, threshold);
    (abstained, if abstained { "unsure" } else { keys[best] })
}

#[test]
fn an_abstention_task_is_fitted_served_kept_and_removed() {
    let dir = common::fresh_dir("abstention");
    let state_dir = dir.to_str().unwrap().to_string();
    let s = Server::start(&["--state-dir", &state_dir]);

    // Before any task, a question of the option set is answered plainly.
    let plain = ask(&s, "Is my parcel in Paris yet?", question(UNSURE));
    assert!(plain.get("x_abstention_task").is_none(), "{plain}");

    // Registered in the reference's form; answered once fitted. Its 12
    // examples are read as serving reads them, but unobserved: no serving
    // metric and no prefix-cache entry moves.
    let serving = || {
        [
            ("decisio_question_seconds_count", ""),
            ("decisio_systemone_questions_total", ""),
            ("decisio_systemone_question_seconds_count", ""),
            ("decisio_abstentions_total", ""),
            ("decisio_prefix_cache_hits_total", ""),
            ("decisio_prefix_cache_misses_total", ""),
            ("decisio_prefix_cache_entries", ""),
        ]
        .map(|(name, labels)| (name, s.metric(name, labels)))
    };
    let before = serving();
    assert!(
        before[0].1 >= 1.0,
        "the plain question was counted: {before:?}"
    );
    let r = s.post_json("/v1/abstention/tasks", &registration("city-unsure"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(serving(), before, "a registration moved serving's figures");
    let task = r.json();
    assert_eq!(task["id"], "city-unsure");
    assert_eq!(task["option"], json!({"key": "unsure"}));
    assert!(task["match"]["option_set"].is_string(), "{task}");
    let config = &task["config"];
    assert_eq!(config["n"], 12, "{config}");
    assert_eq!(config["n_unanswerable"], 4, "{config}");

    // The fit, recomputed from the examples' probabilities as served.
    let scored: Vec<Scored> = examples()
        .iter()
        .map(|(m, a)| {
            let p = probabilities(&ask(&s, m, question(UNSURE)));
            let gold = match a.as_str() {
                Some("paris") => Some(0),
                Some("london") => Some(1),
                _ => None,
            };
            let (plain_abstains, best) = abstain::decide(&p, 2, None);
            let unanswerable = gold.is_none();
            Scored {
                p_abstain: p[2],
                unanswerable,
                answer_ok: gold == Some(best),
                plain_right: if unanswerable {
                    plain_abstains
                } else {
                    !plain_abstains && gold == Some(best)
                },
                plain_false: !unanswerable && plain_abstains,
            }
        })
        .collect();
    let want = abstain::fit(&scored);
    assert_eq!(
        serde_json::to_value(&want).unwrap(),
        task["config"],
        "the fit differs from the one recomputed from the answers"
    );
    println!("abstention fit: {}", task["config"]);

    // A later question of the option set (its options in another order,
    // other instructions) is decided by the task; its probabilities are
    // the plain ones.
    let mut reordered = question(UNSURE);
    reordered["instructions"] = json!("Where is this about?");
    reordered["criteria"] =
        json!({"unsure": UNSURE, "london": "London, England", "paris": "Paris, France"});
    for (message, q) in [
        ("Is my parcel in Paris yet?", question(UNSURE)),
        ("Can I get a refund?", reordered),
    ] {
        let a = ask(&s, message, q);
        assert_eq!(a["x_abstention_task"], "city-unsure", "{a}");
        let threshold = want.threshold.filter(|_| want.applied);
        let (abstained, choice) = expected(&a, threshold);
        assert_eq!(a["x_abstained"], abstained, "{a}");
        assert_eq!(a["choice"], choice, "{a}");
    }
    let again = ask(&s, "Is my parcel in Paris yet?", question(UNSURE));
    assert_eq!(again["probabilities"], plain["probabilities"]);
    // Other descriptions are another option set: not decided by it.
    let other = ask(&s, "Is my parcel in Paris yet?", question("no city at all"));
    assert!(other.get("x_abstention_task").is_none(), "{other}");

    // Both sides of a threshold, through an import of the listing with
    // the threshold moved: at 0 every question abstains, at 1 none does.
    let listing = s
        .request("GET", "/v1/abstention/tasks", &[], None)
        .unwrap()
        .json();
    assert_eq!(
        listing["store"],
        json!({"loaded": 1, "applied": 1, "other_stack": 0})
    );
    for (t, abstains) in [(0.0, true), (1.0, false)] {
        let mut tasks = listing["tasks"].clone();
        tasks[0]["config"]["applied"] = json!(true);
        tasks[0]["config"]["threshold"] = json!(t);
        let r = s.post_json("/v1/abstention/tasks/import", &json!({"tasks": tasks}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["loaded"], json!(["city-unsure"]));
        let a = ask(&s, "My hotel in Paris lost my booking.", question(UNSURE));
        assert_eq!(a["x_abstained"], abstains, "{a}");
        assert_eq!(a["choice"], expected(&a, Some(t)).1, "{a}");
    }
    // Fitted under another layout: refused, nothing stored.
    let mut foreign = listing["tasks"].clone();
    foreign[0]["layout"] = json!("another");
    let r = s.post_json("/v1/abstention/tasks/import", &json!({"tasks": foreign}));
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "serving_stack_changed");
    // The listing as GET gave it puts the fitted task back; an unknown
    // field is refused.
    let r = s.post_json(
        "/v1/abstention/tasks/import",
        &json!({"tasks": [], "extra": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post_json("/v1/abstention/tasks/import", &listing);
    assert_eq!(r.status, 200, "{}", r.text());

    // Matched by keys: the same keys described otherwise.
    let mut by_keys = registration("city-keys");
    by_keys["match"] = json!("option_keys");
    for (i, e) in by_keys["examples"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        let described = if i % 2 == 0 { UNSURE } else { "no city named" };
        e["request"]["questions"]["city"] = question(described);
    }
    let r = s.post_json("/v1/abstention/tasks", &by_keys);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["match"]["option_keys"].is_string());
    let a = ask(&s, "Is my parcel in Paris yet?", question("no city at all"));
    assert_eq!(a["x_abstention_task"], "city-keys", "{a}");
    // The option set's task comes first where both match.
    let a = ask(&s, "Is my parcel in Paris yet?", question(UNSURE));
    assert_eq!(a["x_abstention_task"], "city-unsure", "{a}");

    // The refusals, each a 400 naming the field.
    let bad = |body: Value, want: &str| {
        let r = s.post_json("/v1/abstention/tasks", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(param(&r), want, "{}", r.text());
    };
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = registration("bad");
        f(&mut b);
        b
    };
    bad(
        with(&|b| b["option"] = json!({"append": "can't tell"})),
        "option.append",
    );
    bad(with(&|b| b["option"] = json!({})), "option");
    bad(with(&|b| b["match"] = json!("imajev_extension")), "match");
    bad(
        with(&|b| b["option"] = json!({"key": "berlin"})),
        "examples[0].request",
    );
    bad(
        with(&|b| b["examples"][3]["answer"] = json!("berlin")),
        "examples[3].answer",
    );
    bad(
        with(&|b| b["examples"][1]["request"]["questions"]["other"] = question(UNSURE)),
        "examples[1].request",
    );
    bad(
        with(&|b| b["examples"][2]["request"]["questions"]["city"] = question("elsewhere")),
        "examples",
    );
    bad(with(&|b| b["id"] = json!("no spaces")), "id");
    bad(with(&|b| b["examples"] = json!([])), "examples");

    // Kept across a restart.
    drop(s);
    let s = Server::start(&["--state-dir", &state_dir]);
    let listed = s
        .request("GET", "/v1/abstention/tasks", &[], None)
        .unwrap()
        .json();
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["city-keys", "city-unsure"], "{listed}");
    let a = ask(&s, "Is my parcel in Paris yet?", question(UNSURE));
    assert_eq!(a["x_abstention_task"], "city-unsure", "{a}");

    // Removed: its questions are answered plainly again.
    for id in ["city-unsure", "city-keys"] {
        let r = s
            .request("DELETE", &format!("/v1/abstention/tasks/{id}"), &[], None)
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json(), json!({"removed": id}));
    }
    let r = s
        .request("DELETE", "/v1/abstention/tasks/city-unsure", &[], None)
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let a = ask(&s, "Is my parcel in Paris yet?", question(UNSURE));
    assert!(a.get("x_abstention_task").is_none(), "{a}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The examples, `rounds` times over, each message made new (so that no
/// answer is remembered from another).
fn many(id: &str, rounds: usize) -> Value {
    let examples: Vec<Value> = (0..rounds)
        .flat_map(|n| {
            examples().into_iter().map(move |(m, a)| {
                json!({"request": request(&format!("{m} (case {n})"), question(UNSURE)), "answer": a})
            })
        })
        .collect();
    json!({"id": id, "option": {"key": "unsure"}, "examples": examples})
}

fn get(s: &Server, path: &str) -> common::Response {
    s.request("GET", path, &[], None).unwrap()
}

/// Polls `GET /v1/abstention/tasks/{id}` until `done` holds.
fn poll(s: &Server, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = std::time::Instant::now();
    loop {
        let r = get(s, &format!("/v1/abstention/tasks/{id}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if done(&v) {
            return v;
        }
        assert!(start.elapsed().as_secs() < 600, "{v}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn an_abstention_registration_runs_on_the_worker_and_resumes_after_a_kill() {
    let dir = common::fresh_dir("abstention-worker");
    let state_dir = dir.to_str().unwrap().to_string();
    let mut s = Server::start(&["--state-dir", &state_dir]);
    let async_ = [("Prefer", "respond-async")];
    let post = |s: &Server, body: &Value| {
        s.request(
            "POST",
            "/v1/abstention/tasks",
            &async_,
            Some(body.to_string().as_bytes()),
        )
        .unwrap()
    };

    // Answered at once: 202, its place and its status.
    let body = many("city-many", 6);
    let r = post(&s, &body);
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.header("location"), Some("/v1/abstention/tasks/city-many"));
    let accepted = r.json();
    assert_eq!(accepted["object"], "abstention.registration");
    assert_eq!(accepted["progress"]["total"], 72, "{accepted}");
    // The same id again while it runs: 409.
    let again = post(&s, &body);
    assert_eq!(again.status, 409, "{}", again.text());

    // Killed once its state folder holds 8 scored examples.
    let scored = dir.join("tasks/abstention/city-many.scored.jsonl");
    let start = std::time::Instant::now();
    let saved = loop {
        let lines = std::fs::read_to_string(&scored)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines >= 8 {
            break lines;
        }
        assert!(start.elapsed().as_secs() < 300, "{lines} scored");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let running = get(&s, "/v1/abstention/tasks/city-many").json();
    assert_eq!(running["status"], "running", "{running}");
    s.kill();

    // Resumed after a restart from what it had scored, then fitted on
    // every example.
    let s = Server::start(&["--state-dir", &state_dir]);
    let resumed = poll(&s, "city-many", |v| v["status"] != "queued");
    assert_eq!(resumed["status"], "running", "{resumed}");
    assert_eq!(resumed["progress"]["restarts"], 1, "{resumed}");
    let from = resumed["progress"]["resumed_from"].as_u64().unwrap() as usize;
    assert!(from >= saved - 1, "resumed from {from}, {saved} saved");
    let ready = poll(&s, "city-many", |v| v["status"] == "ready");
    assert_eq!(ready["config"]["n"], 72, "{ready}");
    // The registration's files go just after the task is stored.
    common::wait_until(
        "the scorings go after the fit",
        std::time::Duration::from_secs(30),
        || !scored.exists(),
    );

    // The same examples registered in one go (the reference's form,
    // answered once fitted) give the same fit.
    // Its fit scores 72 examples before the answer: on a busy machine
    // that is minutes, more than a plain request waits.
    let whole = s.post_json_waiting(
        "/v1/abstention/tasks",
        &many("city-whole", 6),
        std::time::Duration::from_secs(900),
    );
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert_eq!(whole.json()["config"], ready["config"]);

    // A registration deleted while it runs leaves nothing behind.
    let r = post(&s, &many("city-gone", 2));
    assert_eq!(r.status, 202, "{}", r.text());
    let r = s
        .request("DELETE", "/v1/abstention/tasks/city-gone", &[], None)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(&s, "/v1/abstention/tasks/city-gone").status, 404);
    let left: Vec<String> = std::fs::read_dir(dir.join("tasks/abstention"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("city-gone"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
