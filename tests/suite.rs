//! `decisio suite run` and `decisio gate` on a real server with the fixture
//! model: a record and its figures, resumption after the runner is killed
//! and after the server restarts, refusals that name what is wrong, and the
//! gates on the committed records (runs/2026-12-02_gates): the fixture
//! passes against the dense reference, the 2-bit conversion fails, the
//! fixture and the vLLM backend answer bit for bit on fresh servers.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::Server;
use serde_json::Value;

/// The committed records of `make gate`.
const RECORDS: &str = "runs/2026-12-02_gates";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn decisio(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_decisio"));
    c.args(args).env("NO_COLOR", "1").env("RUST_BACKTRACE", "0");
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A suite small enough for a test: 12 everyday questions on two states,
/// 4 MMLU subjects as a choice, 6 chat questions on two chats, an intent
/// head over 4 subjects.
fn tiny_suite(dir: &Path) -> PathBuf {
    let everyday = repo("suites/data/everyday.jsonl");
    let chat = repo("suites/data/everyday-chat.jsonl");
    let text = format!(
        "version: 1\nname: tiny\nseed: 5\nconformance: 4\nrecord: [latency, memory]\n\
         choice_sets:\n  - name: everyday\n    format: jsonl\n    file: {}\n    limit: 12\n\
         \x20 - name: which\n    format: mmlu-subject\n    file: mmlu.jsonl\n    per_subject: 1\n    limit: 4\n\
         \x20 - name: chat\n    format: jsonl\n    file: {}\n    limit: 6\n\
         intent_sets:\n  - name: subjects\n    format: mmlu-subjects\n    file: mmlu.jsonl\n\
         \x20   question: Which subject is this question from?\n    labels: 4\n    per_label: 4\n    draws: 2\n    shots: 1\n",
        everyday.display(),
        chat.display()
    );
    let path = dir.join("tiny.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run_args<'a>(suite: &'a Path, out: &'a Path, url: &'a str, assets: &'a Path) -> Vec<&'a str> {
    vec![
        "suite",
        "run",
        "--suite",
        suite.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--server",
        url,
        "--data",
        assets.to_str().unwrap(),
        "--concurrency",
        "1",
        "--questions-per-request",
        "1",
    ]
}

fn journal_answers(out: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(out.join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["kind"] == "answer")
        .map(|l| {
            (
                l["set"].as_str().unwrap().to_string(),
                l["answer"]["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_suite_run_survives_a_killed_runner_and_a_restarted_server() {
    let dir = common::fresh_dir("suite");
    let suite = tiny_suite(&dir);
    let out = dir.join("record");
    let assets = common::asset("mmlu.jsonl").parent().unwrap().to_path_buf();
    let state = dir.join("state");
    let state_arg = state.to_str().unwrap().to_string();
    let mut server = Server::start(&["--state-dir", &state_arg]);
    let url = server.url();

    // The runner is killed (SIGKILL) once a few answers are recorded.
    let mut runner = decisio(&run_args(&suite, &out, &url, &assets))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if journal_answers(&out).len() >= 3 {
            break;
        }
        if let Some(status) = runner.try_wait().unwrap() {
            panic!("the runner ended ({status}) before it was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    runner.kill().unwrap();
    runner.wait().unwrap();
    let before = journal_answers(&out).len();
    assert!(
        (3..22).contains(&before),
        "{before} answers before the kill"
    );

    // The server restarts on its port while the runner resumes: the runner
    // waits for it and goes on.
    let port = server.port;
    server.kill();
    let resumed = decisio(&run_args(&suite, &out, &url, &assets))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let server = Server::spawn_on(port, &["--state-dir", &state_arg]);
    let o = resumed.wait_with_output().unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("resuming the run"), "{stderr}");

    // No question lost or asked twice.
    let answers = journal_answers(&out);
    let unique: HashSet<_> = answers.iter().cloned().collect();
    assert_eq!(answers.len(), 22, "{answers:?}");
    assert_eq!(unique.len(), 22);

    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("record.json")).unwrap()).unwrap();
    assert_eq!(record["format"], "decisio-record/1");
    assert_eq!(record["resumed"], 1);
    assert_eq!(record["server"]["backend"], "MLX");
    let sets = record["choice_sets"].as_array().unwrap();
    assert_eq!(sets[0]["answers"].as_array().unwrap().len(), 12);
    assert_eq!(sets[1]["answers"].as_array().unwrap().len(), 4);
    assert_eq!(sets[2]["answers"].as_array().unwrap().len(), 6);
    for set in sets {
        let f = &set["figures"];
        for key in ["before", "after"] {
            let ece = f[key]["ece"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&ece));
            assert_eq!(f[key]["reliability"].as_array().unwrap().len(), 15);
        }
        // Every answer's probabilities sum to 1 (as float32 values: their
        // bits are checked by the conformance questions below).
        for a in set["answers"].as_array().unwrap() {
            let p: Vec<f32> = serde_json::from_value(a["probabilities"].clone()).unwrap();
            assert!((p.iter().map(|&x| f64::from(x)).sum::<f64>() - 1.0).abs() < 1e-5);
        }
    }
    // Conformance: asked again alone on the restarted server, each sampled
    // question gives the recorded bits, answered before or after the kill.
    // Chat questions are asked again through the chat completions, with
    // the request a client sends.
    let conformance = record["conformance"].as_array().unwrap();
    assert_eq!(conformance.len(), 12);
    assert!(
        conformance.iter().all(|c| c["equal"] == true),
        "{conformance:?}"
    );
    let chat: Vec<&Value> = conformance
        .iter()
        .filter(|c| c["surface"] == "chat")
        .collect();
    assert_eq!(chat.len(), 4);
    assert!(chat.iter().all(|c| c["set"] == "chat"
        && c["request"]["decisio"]["options"].is_array()
        && c["request"]["messages"].as_array().unwrap().len() >= 2));
    let intent = &record["intent_sets"][0];
    assert_eq!(intent["labels"], 4);
    assert_eq!(intent["per_draw"].as_array().unwrap().len(), 2);
    assert!(record["latency"]["new_state"]["n"].as_u64().unwrap() > 0);
    assert!(record["memory"]["decisio_prefix_cache_bytes"].is_number());
    // The intent task was removed from the server once recorded.
    let tasks = server
        .request("GET", "/v1/tasks", &[], None)
        .unwrap()
        .json();
    assert_eq!(tasks["data"].as_array().unwrap().len(), 0, "{tasks}");
    for f in [
        "summary.md",
        "reliability-everyday.png",
        "reliability-pooled.png",
    ] {
        assert!(out.join(f).is_file(), "no {f}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("resumed 1 times") && summary.contains("| everyday | 12 |"),
        "{summary}"
    );

    // The record gates against itself, bit for bit; its chat questions
    // must also be asked again through the OpenAI SDK
    // (scripts/sdk_conformance.py, tests/e2e/test_suite_sdk.py), and the
    // gate fails until they are, unless the gates file turns that off.
    let rec = out.to_str().unwrap();
    let o = decisio(&["gate", "--record", rec, "--against", rec, "--bitwise"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("FAIL  conformance (chat questions again through the OpenAI SDK)")
            && stdout.contains("scripts/sdk_conformance.py"),
        "{stdout}"
    );
    assert!(stdout.contains("pass  bit for bit"), "{stdout}");
    assert!(
        stdout.contains("pass  conformance (asked again alone, POST /v1/chat/completions)"),
        "{stdout}"
    );
    let no_sdk = dir.join("gates.yaml");
    std::fs::write(&no_sdk, "openai_sdk: false\n").unwrap();
    let o = decisio(&[
        "gate",
        "--record",
        rec,
        "--against",
        rec,
        "--bitwise",
        "--gates",
        no_sdk.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");

    // Another suite in the same folder is refused, and so is the same run
    // against another served configuration.
    let other = dir.join("other.yaml");
    std::fs::write(
        &other,
        std::fs::read_to_string(&suite)
            .unwrap()
            .replace("seed: 5", "seed: 6"),
    )
    .unwrap();
    let o = decisio(&run_args(&other, &out, &url, &assets))
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert!(!o.status.success());
    assert!(stderr.contains("another suite file"), "{stderr}");
    drop(server);
    let server = Server::start(&["--letter-temperature", "2"]);
    let url2 = server.url();
    let o = decisio(&run_args(&suite, &out, &url2, &assets))
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert!(!o.status.success());
    assert!(stderr.contains("another served configuration"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_suites_say_which_field_line_or_file() {
    let dir = common::fresh_dir("badsuite");
    let assets = common::asset("mmlu.jsonl").parent().unwrap().to_path_buf();
    let run = |text: &str| {
        let suite = dir.join("s.yaml");
        std::fs::write(&suite, text).unwrap();
        let out = dir.join("out");
        // No server: a suite is checked before anything is asked.
        let o = decisio(&run_args(&suite, &out, "http://127.0.0.1:9", &assets))
            .output()
            .unwrap();
        assert!(!o.status.success());
        text_of(&o)
    };
    fn text_of(o: &Output) -> String {
        String::from_utf8_lossy(&o.stderr).into_owned()
    }
    let base = "version: 1\nname: b\nseed: 1\nchoice_sets:\n  - name: a\n    format: jsonl\n    file: a.jsonl\n";
    let e = run(&base.replace("format: jsonl", "format: csv"));
    assert!(
        e.contains("choice_sets[0].format") && e.contains("line 6"),
        "{e}"
    );
    let e = run(&base.replace("seed: 1", "seed: -1"));
    assert!(e.contains("seed") && e.contains("line 3"), "{e}");
    let e = run(base);
    assert!(
        e.contains("`a.jsonl` is in none of") && e.contains("--data"),
        "{e}"
    );
    std::fs::write(dir.join("a.jsonl"), "{\"state\": \"s\", \"question\": \"q\", \"options\": [\"x\", \"y\"], \"answer\": 1}\n{\"state\": \"s\", \"question\": \"q\", \"options\": [\"x\"], \"answer\": 0}\n").unwrap();
    let e = run(base);
    assert!(
        e.contains("a.jsonl line 2") && e.contains("2 to 26 options"),
        "{e}"
    );
    let e = run(&base.replace(
        "file: a.jsonl",
        "file: a.jsonl\n    subjects: [x]\n    format: mmlu",
    ));
    assert!(e.contains("format"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_committed_records_gate_as_they_should() {
    let rec = |name: &str| repo(&format!("{RECORDS}/{name}"));
    let gate = |cand: &str, reference: &str, extra: &[&str]| {
        let c = rec(cand);
        let r = rec(reference);
        let mut args = vec![
            "gate",
            "--record",
            c.to_str().unwrap(),
            "--against",
            r.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = decisio(&args).output().unwrap();
        let (stdout, stderr) = text(&o);
        (o.status.code(), stdout, stderr)
    };
    // The 4-bit fixture passes against its dense reference.
    let (code, stdout, stderr) = gate("fixture-q4", "reference-dense", &[]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("pass  accuracy everyday"), "{stdout}");
    assert!(
        stdout.contains("pass  intent heads mmlu-subjects"),
        "{stdout}"
    );
    // The 2-bit conversion fails, and says which gates.
    let (code, stdout, _) = gate("degraded-q2", "reference-dense", &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  intent heads") || stdout.contains("FAIL  agreement"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAIL  conformance"), "{stdout}");
    // The fixture on two fresh servers: bit for bit; the vLLM backend in
    // front of an MLX gateway too, and it passes against the MLX record.
    let (code, stdout, _) = gate("fixture-q4-again", "fixture-q4", &["--bitwise"]);
    assert_eq!(code, Some(0), "{stdout}");
    let (code, stdout, _) = gate("vllm-backend-again", "vllm-backend", &["--bitwise"]);
    assert_eq!(code, Some(0), "{stdout}");
    let (code, stdout, _) = gate("vllm-backend", "fixture-q4", &[]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("pass  conformance mmlu-subjects"),
        "{stdout}"
    );
    // A record of another tokenizer is refused, unless forced.
    let dir = common::fresh_dir("gate");
    let mut other: Value = serde_json::from_str(
        &std::fs::read_to_string(rec("fixture-q4").join("record.json")).unwrap(),
    )
    .unwrap();
    other["server"]["tokenizer_identity"] = "another".into();
    std::fs::write(dir.join("record.json"), other.to_string()).unwrap();
    let d = dir.to_str().unwrap();
    let r = rec("reference-dense");
    let o = decisio(&["gate", "--record", d, "--against", r.to_str().unwrap()])
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr.contains("tokenizer identity differs") && stderr.contains("--force"),
        "{stderr}"
    );
    let o = decisio(&[
        "gate",
        "--record",
        d,
        "--against",
        r.to_str().unwrap(),
        "--force",
    ])
    .output()
    .unwrap();
    let (stdout, _) = text(&o);
    assert!(
        stdout.contains("compared anyway (--force): the tokenizer identity differs"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trust_record_beside_a_record_is_gated() {
    // The fixture's trust record (`make bench-trust`) beside copies of the
    // fixture's run record: its gates pass against itself; a candidate
    // whose prediction sets cover 0.1 less and which certifies half as
    // many answers fails them, naming the gates.
    let trust: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("runs/2026-12-04_trust/trust.json")).unwrap(),
    )
    .unwrap();
    let dir = common::fresh_dir("trust-gate");
    let place = |name: &str, trust: &Value| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["record.json", "sdk-conformance.json"] {
            std::fs::copy(repo(&format!("{RECORDS}/fixture-q4/{f}")), d.join(f)).unwrap();
        }
        std::fs::write(d.join("trust.json"), trust.to_string()).unwrap();
        d
    };
    let r = place("reference", &trust);
    let gate = |c: &std::path::Path| {
        let o = decisio(&[
            "gate",
            "--record",
            c.to_str().unwrap(),
            "--against",
            r.to_str().unwrap(),
        ])
        .output()
        .unwrap();
        let (stdout, stderr) = text(&o);
        (o.status.code(), stdout, stderr)
    };
    let (code, stdout, stderr) = gate(&place("same", &trust));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for task in ["subjects", "answer"] {
        for line in [
            format!("pass  coverage {task} (lac)"),
            format!("pass  coverage {task} (aps)"),
            format!("pass  certified promise {task}"),
            format!("pass  certified share {task}"),
        ] {
            assert!(stdout.contains(&line), "{line}: {stdout}");
        }
    }
    let mut worse = trust.clone();
    for t in worse["tasks"].as_array_mut().unwrap() {
        for c in t["coverage"].as_array_mut().unwrap() {
            if c["score"] == "lac" {
                c["coverage_mean"] = (c["coverage_mean"].as_f64().unwrap() - 0.1).into();
            }
        }
        for c in t["certified"].as_array_mut().unwrap() {
            c["certified_share_mean"] = (c["certified_share_mean"].as_f64().unwrap() / 2.0).into();
        }
    }
    let (code, stdout, _) = gate(&place("worse", &worse));
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  coverage subjects (lac)"), "{stdout}");
    assert!(stdout.contains("pass  coverage subjects (aps)"), "{stdout}");
    assert!(
        stdout.contains("FAIL  certified share subjects"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
