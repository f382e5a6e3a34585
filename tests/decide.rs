//! The decision route on a real server with the fixture model and MMLU:
//! rendering and the prefix split, agreement with mlx-lm, the prefix cache's
//! bit-for-bit guarantee, abstention, temperatures and bad input.

mod common;

use common::Server;
use decisio::prompt::{ChatTemplate, TextTokenizer};
use decisio::text_route::decide::{render, LETTERS};
use decisio::text_route::{Question, State};
use serde_json::{json, Value};

/// States and questions built from MMLU by scripts/reference/decisions.py.
fn reference() -> Value {
    let text = std::fs::read_to_string(common::reference_file("decisions.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn question(q: &Value) -> Value {
    json!({"text": q["text"], "options": q["options"]})
}

fn decide(s: &Server, body: &Value) -> Value {
    let r = s.post_json("/v1/decide", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Each answer's probabilities as f32 bits, in letter order.
fn bits(answer: &Value) -> Vec<u32> {
    let p = answer["probabilities"].as_object().unwrap();
    p.values()
        .map(|v| (v.as_f64().unwrap() as f32).to_bits())
        .collect()
}

fn metric(s: &Server, name: &str) -> f64 {
    let text = s.request("GET", "/metrics", &[], None).unwrap().text();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn prompts_split_at_the_state_and_tokenize_as_a_whole() {
    let dir = common::model_dir();
    let template = ChatTemplate::from_tokenizer_config(dir.join("tokenizer_config.json")).unwrap();
    let tokenizer = TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let reference = reference();
    let (mut checked, mut merged) = (0, Vec::new());
    for st in reference["states"].as_array().unwrap() {
        let state = State::Text(st["state"].as_str().unwrap().to_string());
        for q in st["questions"].as_array().unwrap() {
            let question = Question {
                id: None,
                text: q["text"].as_str().unwrap().into(),
                options: q["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_str().unwrap().into())
                    .collect(),
                abstain_below: None,
                temperature: None,
                head: None,
                wire: None,
                bias: None,
                listed: true,
            };
            let codes: Vec<String> = LETTERS.iter().map(|l| l.to_string()).collect();
            let r = render(&template, &state, &question, &codes).unwrap();
            assert!(r.prefix.ends_with(st["state"].as_str().unwrap().trim_end()));
            let mut ids = tokenizer.encode(&r.prefix, false).unwrap();
            ids.extend(tokenizer.encode(&r.suffix, false).unwrap());
            let whole = tokenizer
                .encode(&format!("{}{}", r.prefix, r.suffix), false)
                .unwrap();
            if ids != whole {
                merged.push(q["text"].clone());
            }
            // Python's rendering and tokenization of the whole prompt.
            let python: Vec<u32> = q["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(
                whole, python,
                "the rendering differs from Python's for {}",
                q["text"]
            );
            checked += 1;
        }
    }
    println!(
        "{checked} prompts; the tokenizer merged across the state boundary in {}",
        merged.len()
    );
    assert!(merged.is_empty(), "merges across the boundary: {merged:?}");
    assert!(checked >= 200, "{checked} prompts");
}

#[test]
fn probabilities_match_mlx_lm_on_mmlu() {
    let s = Server::start(&[]);
    let reference = reference();
    let mut compared = 0;
    let mut worst = 0f64;
    for st in reference["states"].as_array().unwrap() {
        for q in st["questions"].as_array().unwrap() {
            let Some(want) = q["probabilities"].as_array() else {
                continue;
            };
            let got = decide(
                &s,
                &json!({"state": st["state"], "questions": [question(q)]}),
            );
            let probs = got["answers"][0]["probabilities"].as_object().unwrap();
            assert!(
                got["state"]["tokens"].as_u64().unwrap()
                    < q["ids"].as_array().unwrap().len() as u64
            );
            for (p, w) in probs.values().zip(want) {
                let d = (p.as_f64().unwrap() - w.as_f64().unwrap()).abs();
                worst = worst.max(d);
                assert!(d <= 1e-4, "{}: {p} against {w}", q["text"]);
            }
            compared += 1;
        }
    }
    println!("{compared} MMLU questions, worst |difference| {worst:.2e}");
    assert!(compared >= 50, "{compared} questions with a reference");
}

/// A miss computes the state and the first half of the questions; the hit
/// that follows reads the state from the cache, recalls those answers and
/// computes the other half from the cached state; a third request recalls
/// all of them; a server without a cache computes everything. Every
/// probability has the same f32 bits in all of them.
#[test]
fn answers_are_the_same_bits_on_a_miss_a_hit_and_with_the_cache_off() {
    let cached = Server::start(&[]);
    let uncached = Server::start(&["--prefix-cache-mb", "0"]);
    let reference = reference();
    let states = reference["states"].as_array().unwrap();
    assert!(states.len() >= 20, "{} states", states.len());
    let (mut questions, mut hits) = (0, 0);
    // Six of the states (60 questions): each is read three times over on
    // the fixture, and probabilities_match_mlx_lm_on_mmlu reads all 20.
    for st in states.iter().take(6) {
        let qs: Vec<Value> = st["questions"]
            .as_array()
            .unwrap()
            .iter()
            .map(question)
            .collect();
        let half = qs.len() / 2;
        let body = json!({"state": st["state"], "questions": qs});
        let miss = decide(
            &cached,
            &json!({"state": st["state"], "questions": qs[..half]}),
        );
        let hit = decide(&cached, &body);
        let again = decide(&cached, &body);
        let off = decide(&uncached, &body);
        assert_eq!(miss["state"]["cached"], false);
        assert_eq!(hit["state"]["cached"], true);
        assert_eq!(off["state"]["cached"], false);
        assert_eq!(miss["state"]["hash"], hit["state"]["hash"]);
        // The hit reads the state and the recalled questions from the cache.
        let tokens = |r: &Value, k: &str| r["usage"][k].as_u64().unwrap();
        let recalled = tokens(&miss, "prompt_tokens") - miss["state"]["tokens"].as_u64().unwrap();
        assert_eq!(
            tokens(&hit, "cached_tokens"),
            hit["state"]["tokens"].as_u64().unwrap() + recalled
        );
        assert_eq!(
            tokens(&again, "cached_tokens"),
            tokens(&again, "prompt_tokens")
        );
        for i in 0..qs.len() {
            let (b, c, d) = (&hit["answers"][i], &again["answers"][i], &off["answers"][i]);
            if i < half {
                assert_eq!(
                    bits(&miss["answers"][i]),
                    bits(d),
                    "miss and cache off differ"
                );
            }
            assert_eq!(bits(b), bits(d), "hit and cache off differ");
            assert_eq!(bits(c), bits(d), "recalled answer and cache off differ");
            questions += 1;
        }
        hits += 1;
        // A question asked alone is the same prompt as inside the request.
        let alone = decide(
            &uncached,
            &json!({"state": st["state"], "questions": [qs[3]]}),
        );
        assert_eq!(bits(&alone["answers"][0]), bits(&off["answers"][3]));
    }
    println!(
        "{questions} questions on {hits} states: miss, hit, recall and cache off agree bit for bit"
    );
    assert!(questions >= 60);
}

#[test]
fn concurrent_requests_on_a_new_state_compute_it_once() {
    let s = Server::start(&[]);
    let body = json!({"state": "A brand new state about owls and their habits.",
                      "questions": [{"text": "Do owls hunt at night?", "options": ["yes", "no"]}]});
    let before = (
        metric(&s, "decisio_prefix_cache_misses_total"),
        metric(&s, "decisio_prefix_cache_hits_total"),
    );
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..4).map(|_| scope.spawn(|| decide(&s, &body))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let misses = metric(&s, "decisio_prefix_cache_misses_total") - before.0;
    let hits = metric(&s, "decisio_prefix_cache_hits_total") - before.1;
    assert_eq!((misses, hits), (1.0, 3.0));
    assert_eq!(
        answers
            .iter()
            .filter(|a| a["state"]["cached"] == false)
            .count(),
        1
    );
    for a in &answers {
        assert_eq!(bits(&a["answers"][0]), bits(&answers[0]["answers"][0]));
    }
    assert_eq!(metric(&s, "decisio_prefix_cache_entries"), 1.0);
    assert!(metric(&s, "decisio_prefix_cache_bytes") > 0.0);
}

#[test]
fn abstention_temperature_ties_and_bad_input() {
    let s = Server::start(&[]);
    let state = "The sky on a clear day is blue.";
    let q = |extra: Value| {
        let mut q = json!({"id": "sky", "text": "What colour is the sky on a clear day?",
                           "options": ["green", "blue", "red"]});
        q.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        q
    };
    let base = decide(&s, &json!({"state": state, "questions": [q(json!({}))]}));
    let a = &base["answers"][0];
    assert_eq!(a["id"], "sky");
    assert_eq!(a["temperature"], 1.0);
    let sum: f64 = a["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-5);
    assert_eq!(a["letter_logprobs"].as_object().unwrap().len(), 3);
    // Abstention: probabilities still reported, a reason given.
    let abst = decide(
        &s,
        &json!({"state": state, "questions": [q(json!({"abstain_below": 1.0}))]}),
    );
    let b = &abst["answers"][0];
    assert_eq!(b["abstained"], true);
    assert!(b["letter"].is_null() && b["option"].is_null());
    assert!(b["abstain_reason"]
        .as_str()
        .unwrap()
        .contains("abstain_below"));
    assert_eq!(b["probabilities"], a["probabilities"]);
    // Temperature: the request's overrides the default; higher is flatter.
    let top = |t: f64| {
        let r = decide(
            &s,
            &json!({"state": state, "questions": [q(json!({"temperature": t}))]}),
        );
        let p = r["answers"][0]["probabilities"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(0.0, f64::max);
        (p, r["answers"][0]["temperature"].as_f64().unwrap())
    };
    let (sharp, t1) = top(0.5);
    let (flat, t2) = top(4.0);
    assert!(sharp > flat, "{sharp} <= {flat}");
    assert_eq!((t1, t2), (0.5, 4.0));
    // The largest temperature flattens the options nearly to equal (the
    // earliest wins an exact tie: `decide::top_option`'s unit test).
    let flat = decide(
        &s,
        &json!({"state": state, "questions": [q(json!({"temperature": 1000}))]}),
    );
    let p = flat["answers"][0]["probabilities"].as_object().unwrap();
    let uniform = 1.0 / p.len() as f64;
    assert!(
        p.values()
            .all(|v| (v.as_f64().unwrap() - uniform).abs() < 0.01),
        "{flat}"
    );

    let bad = |body: Value, param: &str| {
        let r = s.post_json("/v1/decide", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    };
    let letters: Vec<String> = (0..256).map(|i| format!("option {i}")).collect();
    bad(
        json!({"state": state, "questions": [{"text": "Which?", "options": letters}]}),
        "questions[0].options",
    );
    bad(
        json!({"state": state, "questions": [{"text": "Which?", "options": ["a", " "]}]}),
        "questions[0].options[1]",
    );
    bad(
        json!({"state": state, "questions": [{"text": "Which?", "options": ["a", "b", "a"]}]}),
        "questions[0].options[2]",
    );
    bad(
        json!({"state": state, "questions": [{"text": "", "options": ["a", "b"]}]}),
        "questions[0].text",
    );
    bad(
        json!({"state": state, "questions": [q(json!({"temperature": 0}))]}),
        "questions[0].temperature",
    );
    // Beyond the temperatures the answer's float32 can carry.
    bad(
        json!({"state": state, "questions": [q(json!({"temperature": 1e30}))]}),
        "questions[0].temperature",
    );
    bad(
        json!({"state": state, "questions": [q(json!({"abstain_below": 0}))]}),
        "questions[0].abstain_below",
    );
    bad(json!({"state": state, "questions": []}), "questions");
    bad(
        json!({"state": state, "questions": vec![q(json!({})); 257]}),
        "questions",
    );
    bad(json!({"state": "", "questions": [q(json!({}))]}), "state");
    bad(
        json!({"state": state, "questions": [q(json!({}))], "multi_question": "warm"}),
        "multi_question",
    );
    bad(
        json!({"state": state, "questions": [q(json!({}))], "multi_question": "packed"}),
        "multi_question",
    );
    // A task no registration has is not found, as a model would be.
    let r = s.post_json(
        "/v1/decide",
        &json!({"state": state, "questions": [{"task": "intents"}]}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "task_not_found");
    assert_eq!(r.json()["error"]["param"], "questions[0].task");
}

/// Beyond 26 options, the options are lettered `AA`, `AB`, ... (each code
/// one token of the fixture's tokenizer), up to 255; the answer keys them
/// so, and an option's answer is read from its own code's token.
#[test]
fn up_to_255_options_are_lettered_with_two_letter_codes() {
    let s = Server::start(&[]);
    let tokenizer = TextTokenizer::from_file(common::model_dir().join("tokenizer.json")).unwrap();
    let codes = decisio::text_route::systemone::one_token_codes(&tokenizer, "");
    assert_eq!(codes.len(), 255);
    assert!(codes.iter().take(26).map(|(c, _)| c.as_str()).eq(LETTERS));
    let mut options: Vec<String> = (1..255).map(|i| format!("a crate of {i} apples")).collect();
    options.push("the blue one".into());
    let state = "The sky on a clear day is blue.";
    let r = decide(
        &s,
        &json!({"state": state, "questions": [{"text": "What colour is the sky?",
                                               "options": options}]}),
    );
    let a = &r["answers"][0];
    let p = a["probabilities"].as_object().unwrap();
    let keys: Vec<&str> = p.keys().map(String::as_str).collect();
    let want: Vec<&str> = codes.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(keys, want);
    assert!(keys[26..].iter().all(|k| k.len() == 2), "{keys:?}");
    let sum: f64 = p.values().map(|v| v.as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 1e-4, "{sum}");
    assert_eq!(a["letter_logprobs"].as_object().unwrap().len(), 255);
    let letter = a["letter"].as_str().unwrap();
    let index = a["index"].as_u64().unwrap() as usize;
    assert_eq!(letter, want[index]);
    assert_eq!(a["option"], options[index]);
    // A question of 27 options is answered over the first 27 codes.
    let r27 = decide(
        &s,
        &json!({"state": state, "questions": [{"text": "What colour is the sky?",
                                               "options": options[..27]}]}),
    );
    let k27: Vec<String> = r27["answers"][0]["probabilities"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(k27.last().map(String::as_str), Some(want[26]));
}

/// As `decide`, waiting up to 15 minutes: requests of many questions,
/// whose time grows with the machine's load.
fn decide_long(s: &Server, body: &Value) -> Value {
    let r = s.post_json_waiting("/v1/decide", body, std::time::Duration::from_secs(900));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// One question's bits whatever else is read in its pass: on servers with
/// the prefix cache off (no answer is read back from a stored state), 30
/// questions on a state asked together, in reverse order, in passes of a
/// few rows (`--pass-tokens 48`), some of them alone, and split between
/// two clients whose requests wait behind a third and are merged into the
/// same passes: every answer is the same f32 bits.
#[test]
fn a_question_gets_the_same_bits_alone_among_others_reordered_and_merged() {
    const N: usize = 30;
    let off = Server::start(&["--prefix-cache-mb", "0"]);
    let narrow = Server::start(&["--prefix-cache-mb", "0", "--pass-tokens", "48"]);
    let reference = reference();
    let states = reference["states"].as_array().unwrap();
    // Thirty different questions: the state's own, then other states'.
    let mut qs: Vec<Value> = Vec::new();
    for st in states.iter().skip(4) {
        for q in st["questions"].as_array().unwrap() {
            let q = question(q);
            if qs.len() < N && !qs.contains(&q) {
                qs.push(q);
            }
        }
    }
    assert_eq!(qs.len(), N);
    let state = &states[4]["state"];
    let ask = |s: &Server, qs: &[Value]| decide_long(s, &json!({"state": state, "questions": qs}));
    let passes_before = metric(&off, "decisio_question_passes_total");
    let together = ask(&off, &qs);
    let passes = metric(&off, "decisio_question_passes_total") - passes_before;
    let want: Vec<Vec<u32>> = (0..N).map(|i| bits(&together["answers"][i])).collect();
    println!("{N} questions read in {passes} passes");
    // MMLU questions of about 170 tokens: 6 or so a pass of 1,024.
    assert!((1.0..=12.0).contains(&passes), "{passes} passes");

    let reversed: Vec<Value> = qs.iter().rev().cloned().collect();
    let back = ask(&off, &reversed);
    for i in 0..N {
        assert_eq!(
            bits(&back["answers"][N - 1 - i]),
            want[i],
            "question {i} reversed"
        );
    }
    let small = ask(&narrow, &qs);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(
            &bits(&small["answers"][i]),
            w,
            "question {i} in small passes"
        );
    }
    assert!(metric(&narrow, "decisio_question_passes_total") >= 10.0);
    for i in [0, 7, 13, 21, N - 1] {
        let alone = ask(&off, &qs[i..=i]);
        assert_eq!(bits(&alone["answers"][0]), want[i], "question {i} alone");
    }

    // Two clients behind a third on another state: both wait in the queue
    // and are read in the same passes.
    let merged_before = metric(&off, "decisio_merged_jobs_total");
    let other = &states[5]["state"];
    let (first, second) = std::thread::scope(|scope| {
        let blocker = scope.spawn(|| decide_long(&off, &json!({"state": other, "questions": qs})));
        std::thread::sleep(std::time::Duration::from_millis(300));
        let a = scope.spawn(|| ask(&off, &qs[..N / 2]));
        let b = scope.spawn(|| ask(&off, &qs[N / 2..]));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        blocker.join().unwrap();
        (a, b)
    });
    let merged = metric(&off, "decisio_merged_jobs_total") - merged_before;
    println!("two clients: {merged} job(s) merged");
    assert!(merged >= 1.0, "the two clients' requests were not merged");
    for i in 0..N {
        let got = if i < N / 2 {
            &first["answers"][i]
        } else {
            &second["answers"][i - N / 2]
        };
        assert_eq!(bits(got), want[i], "question {i} merged across clients");
    }
}

/// Turns between clients: while one client's request of 200 questions is
/// read (many passes), another client's one question on another state is
/// answered after at most a pass of the first's work per turn, not after
/// all of it.
#[test]
fn a_small_request_is_not_held_behind_a_large_one() {
    let s = Server::start(&["--prefix-cache-mb", "0"]);
    let reference = reference();
    let states = reference["states"].as_array().unwrap();
    let many: Vec<Value> = states
        .iter()
        .flat_map(|st| st["questions"].as_array().unwrap().iter().map(question))
        .take(200)
        .collect();
    assert_eq!(many.len(), 200);
    let passes_before = metric(&s, "decisio_question_passes_total");
    let (large, small, passes_then) = std::thread::scope(|scope| {
        let large = scope.spawn(|| {
            decide_long(&s, &json!({"state": states[0]["state"], "questions": many}));
            std::time::Instant::now()
        });
        // The large request's passes have begun.
        let started = std::time::Instant::now();
        while metric(&s, "decisio_question_passes_total") < passes_before + 1.0 {
            assert!(started.elapsed().as_secs() < 300, "no pass was read");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let one = json!({"state": states[1]["state"], "questions": [question(&states[1]["questions"][0])]});
        decide_long(&s, &one);
        let small = std::time::Instant::now();
        let passes_then = metric(&s, "decisio_question_passes_total") - passes_before;
        (large.join().unwrap(), small, passes_then)
    });
    let passes = metric(&s, "decisio_question_passes_total") - passes_before;
    println!("the small request was answered after {passes_then} of {passes} passes");
    assert!(
        small < large,
        "the small request waited for the whole large one"
    );
    assert!(
        passes_then < passes - 5.0,
        "{passes_then} of {passes} passes"
    );
}
